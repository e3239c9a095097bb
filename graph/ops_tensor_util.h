#pragma once
// Internal helpers of the tensor / data-movement op family (graph/ops_tensor*.cpp).
// Data movement is done on raw bytes by element size, so every dtype (bool, float16, ...) works
// without a per-type instantiation; only ops that compare or compute dispatch on the dtype.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "graph/ops_common.h"

namespace nnfuse::tensor_ops {

// "[2,N,?]" for error messages.
std::string dims_str(const std::vector<Dim>& d);
std::vector<Dim> dims_of(const Shape& s);
// Product of dims: known value, or unknown when any dim is unknown (a single symbolic factor
// times known 1s keeps its symbol).
Dim dims_product(const std::vector<Dim>& d, size_t begin, size_t end);

// Integer contents of an index-like input (int32 / int64 / any integer), or nullopt when unknown.
std::optional<std::vector<int64_t>> const_ints(const InferContext& c, size_t i);
// Symbolic contents of a 1-D (or 0-D) int input: constant data or dim_values. nullopt if unknown.
std::optional<std::vector<Dim>> const_dims(const InferContext& c, size_t i);
// Length of a 1-D input from its static shape (the rank of a Reshape/Expand target), or nullopt.
std::optional<int64_t> static_length(const InferContext& c, size_t i);

// Axes given either as an attribute (older opsets) or as an input (newer): the opset at which the
// op moved them to an input decides. Returns nullopt when the input is present but not constant.
// `present` is set to false when neither form is given.
std::optional<std::vector<int64_t>> axes_attr_or_input(const InferContext& c, const char* attr, size_t input,
                                                       int64_t input_since, bool* present);
std::optional<std::vector<int64_t>> kernel_ints_attr_or_input(const KernelContext& c, const char* attr, size_t input,
                                                              int64_t input_since, bool* present);

InferResult unknown_rank(DType t);

// Row-major strided copy over `shape`: dst[idx.dst_strides] = src[idx.src_strides] (strides in
// elements, may be 0 or negative). Adjacent dims that stay contiguous are merged so that the inner
// loop is one memcpy wherever the source run is contiguous.
void copy_strided(void* dst, const std::vector<int64_t>& dst_strides, const void* src,
                  const std::vector<int64_t>& src_strides, const Shape& shape, size_t esz);
// Contiguous output of shape out where, per dim d, output index o reads source element offset
// maps[d][o] (already multiplied by the source stride); a negative entry in any dim means the
// element is filled with `fill` (esz bytes) instead.
void gather_by_dim_maps(void* dst, const void* src, const Shape& out, const std::vector<std::vector<int64_t>>& maps,
                        size_t esz, const void* fill);

inline void copy_elem(void* dst, const void* src, size_t esz) {
  switch (esz) {
    case 1: std::memcpy(dst, src, 1); break;
    case 2: std::memcpy(dst, src, 2); break;
    case 4: std::memcpy(dst, src, 4); break;
    case 8: std::memcpy(dst, src, 8); break;
    default: std::memcpy(dst, src, esz);
  }
}

// Requires a data-movement-capable dtype (any with a byte size), erroring through the kernel.
size_t elem_size(const KernelContext& c, const Tensor& t);
// Concat's kernel on a list of tensors (Concat, ConcatFromSequence): one dtype, equal dims off
// `axis` (already normalized), else c.error naming the shapes.
Tensor concat_along(const KernelContext& c, const std::vector<Tensor>& parts, int64_t axis);
// Split's kernel: x cut along `axis` into parts of `sizes` (Split, SplitToSequence).
std::vector<Tensor> split_along(const KernelContext& c, const Tensor& x, int64_t axis, const std::vector<int64_t>& sizes);
// Index value i of an int32/int64 tensor.
int64_t index_at(const Tensor& t, int64_t i);
void require_index_dtype(const InferContext& c, size_t i, const char* what);

// Family registrations (one per file).
void register_tensor_shape_ops(OpRegistry& r);
void register_tensor_move_ops(OpRegistry& r);
void register_tensor_index_ops(OpRegistry& r);
void register_tensor_resize_ops(OpRegistry& r);
void register_tensor_grid_sample_ops(OpRegistry& r);
void register_tensor_signal_ops(OpRegistry& r);
void register_tensor_unique_ops(OpRegistry& r);
void register_tensor_ml_ops(OpRegistry& r);

// Flop function for pure data movement: 0 (no arithmetic).
inline double zero_flops(const Node&, const std::vector<TensorType>&, const std::vector<TensorType>&) { return 0; }

// The schema of a data-movement or indexing op of this family: no arithmetic worth counting.
inline OpSchema data_movement_schema(const char* name, int since, MappingType m, int min_in, int max_in, InferFn inf,
                                     KernelFn k, int min_out = 1, int max_out = 1) {
  OpSchema s;
  s.name = name;
  s.since = since;
  s.mapping = m;
  s.min_inputs = min_in;
  s.max_inputs = max_in;
  s.min_outputs = min_out;
  s.max_outputs = max_out;
  s.infer = std::move(inf);
  s.kernel = std::move(k);
  s.flops = zero_flops;
  s.family = "tensor";
  return s;
}

}  // namespace nnfuse::tensor_ops
