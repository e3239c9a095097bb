#pragma once
// The device kernel form: kernel-IR stages (lowering/kernel_ir.h, lowered in NCHW) printed as
// kernels over a 1-D range of work-groups, in one C dialect that OpenCL C and CUDA C both read
// once a backend's prelude (DeviceApi::prelude) spells its macros:
//   NF_KERNEL          a kernel entry point            (__kernel / extern "C" __global__)
//   NF_FN              a helper function               (static inline / __device__ static inline)
//   NF_GLOBAL          the address space of buffers    (__global / nothing)
//   NF_LOCAL_ARRAY     a work-group array              (__local / __shared__)
//   NF_GID, NF_LID, NF_GROUP, NF_LSIZE   global id, id in the group, group id, group size
//   NF_SYNC()          a work-group barrier            (barrier(CLK_LOCAL_MEM_FENCE) / __syncthreads())
//   NF_INF, NF_NAN     float constants; i8 u8 i16 u16 i32 u32 i64 u64 integer typedefs
// and, for tensor-core tiles only (DeviceProgramOptions::tensor_cores; CUDA's prelude has them):
//   NF_ALIGN32         32-byte alignment of a work-group array
//   NF_TC_BOUNDS       launch bounds of a tensor-core kernel (between `void` and its name)
//   nf_f2h(x)          float -> fp16 bits (u16), round to nearest even
//   nf_frag_ab, nf_frag_c   a warp's 16 x 16 fp16 operand / fp32 accumulator fragment
//   nf_mma_zero(&c), nf_mma_load_a(&f, p, ld), nf_mma_load_b(&f, p, ld), nf_mma(&c, &a, &b),
//   nf_mma_store(p, &c, ld)   warp-collective m16n16k16 loads (row-major), c += a b, store (row-major)
// Math is the overloaded float names both dialects have (exp, tanh, erf, fmax, ...).
//
// Every kernel takes its buffers as (NF_GLOBAL u8* p, i64 o) pairs, pointer and byte offset, so a
// memory plan maps onto one device arena without sub-buffers, then the run's status words (two
// i32: a NNFUSE_STATUS_* code a kernel sets on bad data, e.g. a Gather index out of range, and the
// first failing stage) and last the stage's index (kernels are shared by stages).
//
// Per stage kind:
//   Elementwise                       one work-item per element of the rows x width view
//   MatMul / Gemm, Conv (Kg >= 8)     tiled GEMM: a work-group per 16Rx16R output tile (R x R per item), operands
//                                     staged through work-group memory (Conv as implicit GEMM);
//                                     too few tiles for the device: K split, then a sum kernel
//   Conv (depthwise, small groups), pooling   one work-item per output element
//   Softmax, LayerNorm, Reduce over the last axis   a work-group per row, tree reductions
//   Softmax / Reduce over an inner axis             one work-item per (outer, inner) column
// and the epilogue (the block's members after the anchor) runs on the anchor value in registers.
// Stages with no device form (Fallback stages, LSTM, NonMaxSuppression, ConvTranspose) run on the
// host between launches with the reference kernels; a stage that cannot (its members read values
// only the fused block holds) makes the compile fail naming it.
#include <string>
#include <vector>

#include "lowering/kernel_ir.h"

namespace nnfuse::device {

struct DeviceKernel {
  std::string name;          // entry point, "nf_<stage>"
  int stage = -1;
  std::string form;          // "elementwise", "tiled_gemm", "implicit_gemm_conv", "direct_conv", ...
  std::vector<int> buffers;  // the buffer arguments in order (the status word follows them)
  int64_t groups = 0;        // work-groups (thread blocks)
  int64_t scratch_bytes = 0; // > 0: a scratch argument of this size follows the buffers (split-K
                             // partial sums; shared by every kernel, which run one at a time)
  int local = 0;             // work-items per group
  int register_block = 0;    // tiled forms: outputs per work-item along each axis (tile 16R x 16R)
  bool tensor_cores = false; // tiled forms: fp16 products on tensor cores (DeviceProgramOptions)
};

struct DeviceProgram {
  std::string source;                    // kernels without the prelude
  std::vector<DeviceKernel> kernels;
  std::vector<std::vector<int>> stage_kernels;  // per stage: its kernels in launch order, or none:
                                               // it runs on the host
  std::vector<std::string> host_reason;  // per stage: why it runs on the host ("" for kernels)
};

struct DeviceProgramOptions {
  // Split-K: a tiled GEMM or conv whose grid has fewer work-groups than this splits its K so that
  // the device has this many in flight (0: never). 512 fills a 132-SM GPU about four groups deep;
  // $NNFUSE_DEVICE_SPLIT_K overrides it in DeviceModel.
  int64_t split_k_groups = 512;
  // Tiled GEMM/conv register blocking: R x R outputs per work-item (1, 2 or 4); 0 chooses by
  // shape (the largest R whose grid keeps enough groups). $NNFUSE_DEVICE_REGISTER_BLOCK overrides.
  int register_block = 0;
  // Tiled GEMM/conv: the k extent staged through work-group memory per step (8, 16 or 32);
  // $NNFUSE_DEVICE_K_TILE overrides.
  int k_tile = 16;
  // Tiled GEMM/conv products on tensor cores: operands rounded to fp16, products accumulated in
  // fp32, 64 x 64 tiles of eight warps each holding two 16 x 16 accumulators, staging
  // max(32, 2 k_tile) k at a time (register_block does not apply). Needs a prelude that defines the NF_ALIGN32, nf_f2h and nf_mma_*
  // helpers (CUDA's, for sm_70 and later); OpenCL has none. Off: fp32 throughout.
  bool tensor_cores = false;
  // With tensor_cores: the least work-groups of 64 x 64 tiles (after split-K) a product needs to
  // take them; smaller grids stay on fp32 tiles by shape. 0: every tiled product.
  // $NNFUSE_DEVICE_TENSOR_CORE_GROUPS overrides.
  // 64: on an H200, a sweep of 0, 64, 128, 256 was fastest or level at 64 on ResNet-50,
  // MobileNetV2, EfficientNet-B0 and BERT-base (0 cost MobileNetV2 31%, 256 ResNet-50 17%).
  int64_t tensor_core_min_groups = 64;
};

// Whether a precision setting ("fp32" or "fp16", from --precision, CompileOptions::precision or
// NNFUSE_DEVICE_PRECISION) asks for tensor cores; anything else is an Invalid error naming it.
bool tensor_cores_for_precision(const std::string& precision);

// Prints every stage of `m` (lowered with layout_block 0). Throws Unsupported naming the stage and
// its ops when a stage has neither a device form nor a host path.
DeviceProgram print_device_program(const KernelModule& m, const DeviceProgramOptions& opt = {});

// The buffers a stage writes when its members run on the host: every member output the stage
// stores (not the row counts of capacity buffers, which are written with them).
std::vector<int> stage_written_buffers(const KernelModule& m, const Stage& st);

}  // namespace nnfuse::device
