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
  // Set to a non-zero NNFUSE_STATUS_* code by a stage that cannot compute its output; the
  // runtime reports it after the stage. May be null (then such stages clamp silently).
  int32_t* status;
};
enum {
  NNFUSE_STATUS_OK = 0,
  NNFUSE_STATUS_INDEX_OUT_OF_RANGE = 1,  // a Gather index outside the data it selects from
  NNFUSE_STATUS_SHAPE_CLASS = 2,         // arguments outside the shape class a kernel was compiled for
};
// What a status code means, for the error that names the stage.
static inline const char* nnfuse_status_message(int32_t status) {
  switch (status) {
    case NNFUSE_STATUS_INDEX_OUT_OF_RANGE: return "an index is out of range for the data it selects from";
    case NNFUSE_STATUS_SHAPE_CLASS: return "its arguments fall outside the shape class its kernel was compiled for";
    default: return "it reported an unknown error";
  }
}
typedef void (*nnfuse_stage_fn)(const nnfuse_exec_ctx* ctx, void* const* buffers);
}
