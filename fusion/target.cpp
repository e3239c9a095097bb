#include "fusion/target.h"

#include <thread>

#include "graph/error.h"

namespace nnfuse {

namespace {
// Ops no target lowers into fused loop nests: control flow, recurrent cells, data-dependent
// output shapes and host-side shape computations. They run as their own kernels.
std::set<std::string> common_unfusable() {
  return {"If", "Loop", "Scan", "LSTM", "GRU", "RNN", "NonMaxSuppression", "TopK", "NonZero", "Compress",
          "Unique", "Shape", "Size", "ConstantOfShape", "Range", "EyeLike", "OneHot", "ScatterND",
          "ScatterElements", "GatherND", "Einsum", "CumSum", "Constant", "RandomNormal", "RandomUniform",
          "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"};
}

TargetDesc cpu(const std::string& name, int vbytes, int vregs, double gflops) {
  TargetDesc t;
  t.name = name;
  t.family = "cpu";
  t.vector_bytes = vbytes;
  t.vector_registers = vregs;
  t.cores = int(std::max(1u, std::thread::hardware_concurrency()));
  t.peak_gflops = gflops;
  t.mem_gbps = 15;
  // Leave a quarter of the registers for the anchor's accumulators and addresses.
  t.max_block_inputs = vregs * 3 / 4;
  t.unfusable_ops = common_unfusable();
  return t;
}

bool host_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}
bool host_has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}
bool host_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}
}  // namespace

std::vector<std::string> target_names() {
  return {"host", "x86-avx2", "x86-avx512", "arm-neon", "mali-opencl", "volta-cuda", "reference"};
}

TargetDesc target_by_name(const std::string& name) {
  if (name == "x86-avx2") return cpu(name, 32, 16, 2 * 8 * 2 * 3.0);      // 2 FMA ports x 8 lanes x 2 flops x ~3 GHz
  if (name == "x86-avx512") {
    TargetDesc t = cpu(name, 64, 32, 2 * 16 * 2 * 2.5);
    t.l2_bytes = 2 << 20;
    return t;
  }
  if (name == "arm-neon") {
    TargetDesc t = cpu(name, 16, 32, 2 * 4 * 2 * 2.5);
    t.l2_bytes = 512 << 10;
    t.mem_gbps = 10;
    return t;
  }
  if (name == "host") {
    TargetDesc t = target_by_name(host_has_avx512() ? "x86-avx512" : host_has_avx2() ? "x86-avx2"
#if defined(__aarch64__)
                                                                                       : "arm-neon");
#else
                                                                                       : "x86-avx2");
#endif
    t.name = "host:" + t.name;
    t.int8_dot = host_has_avx512_vnni();
    return t;
  }
  if (name == "mali-opencl") {
    TargetDesc t;
    t.name = name;
    t.family = "opencl";
    t.vector_bytes = 16;
    t.vector_registers = 64;  // per-thread register file is large but occupancy drops with use
    t.l1_bytes = 16 << 10;
    t.l2_bytes = 512 << 10;
    t.l3_bytes = 0;
    t.cores = 12;
    t.peak_gflops = 600;
    t.mem_gbps = 25;
    t.max_block_inputs = 8;  // Mali: more live buffers cost occupancy
    t.unfusable_ops = common_unfusable();
    return t;
  }
  if (name == "volta-cuda") {
    TargetDesc t;
    t.name = name;
    t.family = "cuda";
    t.vector_bytes = 16;
    t.vector_registers = 255;
    t.l1_bytes = 128 << 10;
    t.l2_bytes = 6 << 20;
    t.l3_bytes = 0;
    t.cores = 80;
    t.peak_gflops = 14000;
    t.mem_gbps = 900;
    t.max_block_inputs = 16;
    t.max_block_members = 64;
    t.unfusable_ops = common_unfusable();
    return t;
  }
  if (name == "reference") {
    TargetDesc t = cpu(name, 4, 16, 2);
    t.family = "reference";
    t.float32_kernels_only = false;
    return t;
  }
  std::string known;
  for (auto& n : target_names()) known += (known.empty() ? "" : ", ") + n;
  fail(ErrorKind::Invalid, "unknown target '" + name + "' (targets: " + known + ")");
}

}  // namespace nnfuse
