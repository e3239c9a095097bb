#pragma once
// Helpers shared by the ops_*.cpp families: broadcasting, axis handling, common inference shapes.
#include <cmath>
#include <vector>

#include "graph/op_registry.h"

namespace nnfuse {

// Numpy-style multidirectional broadcasting of dims (symbolic dims broadcast with 1 or equal
// symbols; otherwise unknown). Errors through ctx.
std::vector<Dim> broadcast_dims(const std::vector<std::vector<Dim>>& shapes, const InferContext& ctx);
// Static-shape broadcast; throws Shape error on mismatch.
Shape broadcast_shapes(const std::vector<Shape>& shapes);
// Normalises a possibly negative axis into [0, rank); errors name the node.
int64_t normalize_axis(int64_t axis, int64_t rank, const Node& n);

// Strides of `in` as seen from a broadcast output of rank out_rank (0 on broadcast dims).
std::vector<int64_t> broadcast_strides(const Shape& in, size_t out_rank);

// Calls f(out_index, in_offsets) for every element of `out`, where in_offsets[k] is the flat
// offset into input k under broadcasting. Iterates with incremental offsets (no div/mod per element).
template <class F>
void for_each_broadcast(const Shape& out, const std::vector<Shape>& ins, F&& f) {
  const size_t r = out.size(), k = ins.size();
  std::vector<std::vector<int64_t>> st(k);
  for (size_t j = 0; j < k; ++j) st[j] = broadcast_strides(ins[j], r);
  int64_t n = shape_numel(out);
  if (n == 0) return;
  std::vector<int64_t> idx(r, 0), off(k, 0);
  for (int64_t i = 0; i < n; ++i) {
    f(i, off.data());
    for (size_t d = r; d-- > 0;) {
      ++idx[d];
      for (size_t j = 0; j < k; ++j) off[j] += st[j][d];
      if (idx[d] < out[d]) break;
      for (size_t j = 0; j < k; ++j) off[j] -= st[j][d] * idx[d];
      idx[d] = 0;
    }
  }
}

// Element type conversion used by kernels that compute in float/double for narrow types.
template <class T> inline double to_double(T v) { return double(v); }
template <> inline double to_double(Half v) { return half_to_float(v.bits); }
template <> inline double to_double(BFloat16 v) { return bf16_to_float(v.bits); }
template <class T> inline T from_double(double v) { return T(v); }
template <> inline bool from_double(double v) { return v != 0; }
template <> inline Half from_double(double v) { return Half{float_to_half(float(v))}; }
template <> inline BFloat16 from_double(double v) { return BFloat16{float_to_bf16(float(v))}; }

// InferResult with one output of the given type.
inline InferResult infer_one(TensorType t) { InferResult r; r.outputs.push_back(std::move(t)); return r; }
// Output 0 has the type of input i.
inline InferResult infer_same_as(const InferContext& c, size_t i = 0) { return infer_one(c.input(i)); }

}  // namespace nnfuse
