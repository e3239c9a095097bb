#pragma once
// The C ABI between the runtime and generated kernels. Every generated stage is
//   extern "C" void nf_<stage>(const nnfuse_exec_ctx* ctx, void* const* buffers);
// where buffers[i] is the address of kernel-IR buffer i for this run. The struct is plain C so
// that a generated shared library depends on nothing from nnfuse's own libraries.
#include <stdint.h>

extern "C" {
typedef void (*nnfuse_range_fn)(void* arg, int64_t begin, int64_t end);
struct nnfuse_exec_ctx {
  void* pool;
  // Calls fn(arg, begin, end) over disjoint chunks covering [0, n); returns when all are done.
  void (*parallel_for)(void* pool, int64_t n, nnfuse_range_fn fn, void* arg);
  int threads;
  // Set to non-zero by a stage that met bad data (a Gather index out of range); the runtime
  // reports it after the stage. May be null (then such stages clamp silently).
  int32_t* status;
};
typedef void (*nnfuse_stage_fn)(const nnfuse_exec_ctx* ctx, void* const* buffers);
}
