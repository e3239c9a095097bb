#pragma once
// Target descriptions: what the fusion planner and its cost model know about a machine.
// Names are the contract's targets: host, x86-avx2, x86-avx512, arm-neon, mali-opencl,
// volta-cuda, reference.
#include <set>
#include <string>
#include <vector>

namespace nnfuse {

struct TargetDesc {
  std::string name;
  std::string family;          // "cpu", "opencl", "cuda", "reference"
  int vector_bytes = 32;       // SIMD width (CPU) or the natural vector access (GPU)
  int vector_registers = 16;   // architectural vector registers (the register budget)
  int64_t l1_bytes = 32 << 10;
  int64_t l2_bytes = 1 << 20;
  int64_t l3_bytes = 16 << 20;
  int cores = 1;
  double peak_gflops = 50;     // per-core (CPU) or device peak, float32
  double mem_gbps = 20;        // sustained memory bandwidth
  // Fusion budgets: a block may read at most this many distinct tensors (each needs registers
  // or a pointer and a stream), and hold at most this many members.
  int max_block_inputs = 12;
  int max_block_members = 48;
  // Ops that this target runs as standalone library calls (no lowering into a fused kernel).
  std::set<std::string> unfusable_ops;
  // Generated kernels compute in float32 (integers and bools enter as loads cast to float): the
  // planner never recomputes a chain doing integer arithmetic into another block, which would send
  // a well-lowered block to the fallback kernels. The reference target runs any dtype.
  bool float32_kernels_only = true;
  // The CPU multiplies unsigned by signed bytes into int32 lanes (AVX-512 VNNI; "host" only, where
  // it is detected): quantized convs and MatMul/Gemm get int8 kernels (lowering/int8_kernels.cpp).
  bool int8_dot = false;

  bool can_fuse_op(const std::string& op_type) const { return !unfusable_ops.count(op_type); }
};

// A target by contract name ("host" detects the running CPU). Throws Invalid naming the known
// targets on an unknown name.
TargetDesc target_by_name(const std::string& name);
std::vector<std::string> target_names();

}  // namespace nnfuse
