// Unique (opset 11): the distinct elements of X (flattened) or distinct slices along `axis`,
// sorted ascending (sorted=1, the default) or in order of first occurrence, with the index of
// each one's first occurrence, each input element's (slice's) position in Y, and the counts.
// NaNs compare equal to each other and sort last, as numpy.unique does.
#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "graph/ops_tensor_util.h"

namespace nnfuse::tensor_ops {

namespace {

// The value compared: itself (integers keep every bit), half and bfloat16 as float.
template <class T>
auto key_of(T v) {
  if constexpr (std::is_same_v<T, Half>) return half_to_float(v.bits);
  else if constexpr (std::is_same_v<T, BFloat16>) return std::bit_cast<float>(uint32_t(v.bits) << 16);
  else return v;
}

template <class K>
bool is_nan_key(K v) {
  if constexpr (std::is_floating_point_v<K>) return std::isnan(v);
  else return false;
}

template <class T>
std::vector<Tensor> unique_typed(const KernelContext& c, const Tensor& X) {
  const auto axis_attr = c.node.attrs.opt_int("axis");
  const bool sorted = c.node.attrs.get_int("sorted", 1) != 0;
  Shape xs = X.shape();
  int64_t axis = 0;
  if (axis_attr) axis = normalize_axis(*axis_attr, X.rank(), c.node);
  else xs = {X.numel()};
  // X as outer x n x inner: slice s of the axis is {outer, inner} elements.
  int64_t outer = 1, n = xs[size_t(axis)], inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= xs[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < xs.size(); ++i) inner *= xs[i];
  const T* x = X.data<T>();
  auto at = [&](int64_t s, int64_t e) { return x[(e / inner * n + s) * inner + e % inner]; };
  const int64_t len = outer * inner;
  // Three-way compare of slices a and b, element by element (NaN equal to NaN, after numbers).
  auto cmp = [&](int64_t a, int64_t b) {
    for (int64_t e = 0; e < len; ++e) {
      const auto u = key_of(at(a, e)), v = key_of(at(b, e));
      const bool un = is_nan_key(u), vn = is_nan_key(v);
      if (un || vn) {
        if (un && vn) continue;
        return un ? 1 : -1;
      }
      if (u < v) return -1;
      if (u > v) return 1;
    }
    return 0;
  };
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cmp(a, b) < 0; });
  // Groups of equal slices in sorted order; each group's first occurrence is its smallest index.
  std::vector<int64_t> group_of(static_cast<size_t>(n)), first, count;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || cmp(order[i - 1], order[i]) != 0) first.push_back(order[i]), count.push_back(0);
    group_of[size_t(order[i])] = int64_t(first.size()) - 1;
    ++count.back();
  }
  const int64_t U = int64_t(first.size());
  std::vector<int64_t> out_order(static_cast<size_t>(U));  // output position -> group
  std::iota(out_order.begin(), out_order.end(), 0);
  if (!sorted) std::sort(out_order.begin(), out_order.end(), [&](int64_t a, int64_t b) { return first[size_t(a)] < first[size_t(b)]; });
  std::vector<int64_t> pos_of(static_cast<size_t>(U));
  for (int64_t p = 0; p < U; ++p) pos_of[size_t(out_order[size_t(p)])] = p;
  Shape ys = xs;
  ys[size_t(axis)] = U;
  Tensor Y(X.dtype(), ys), I(DType::Int64, {U}), Inv(DType::Int64, {n}), Cnt(DType::Int64, {U});
  T* y = Y.data<T>();
  for (int64_t p = 0; p < U; ++p) {
    const int64_t g = out_order[size_t(p)], s = first[size_t(g)];
    for (int64_t e = 0; e < len; ++e) y[(e / inner * U + p) * inner + e % inner] = at(s, e);
    I.data<int64_t>()[p] = s;
    Cnt.data<int64_t>()[p] = count[size_t(g)];
  }
  for (int64_t s = 0; s < n; ++s) Inv.data<int64_t>()[s] = pos_of[size_t(group_of[size_t(s)])];
  return {Y, I, Inv, Cnt};
}

std::vector<Tensor> kernel_unique(const KernelContext& c) {
  const Tensor& X = c.input(0);
  if (X.dtype() == DType::Bool) c.unsupported("Unique on bool is not supported");
  return dispatch_dtype(X.dtype(), [&](auto tag) -> std::vector<Tensor> {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) return {};
    else return unique_typed<T>(c, X);
  });
}

InferResult infer_unique(const InferContext& c) {
  const TensorType& x = c.input(0);
  InferResult r;
  const auto axis = c.node.attrs.opt_int("axis");
  if (axis && x.has_shape) {
    std::vector<Dim> d = x.dims;
    d[size_t(normalize_axis(*axis, x.rank(), c.node))] = Dim{};
    r.outputs.push_back(TensorType(x.dtype, d));
  } else {
    r.outputs.push_back(TensorType(x.dtype, {Dim{}}));
  }
  r.outputs.push_back(TensorType(DType::Int64, {Dim{}}));
  Dim n;
  if (x.has_shape) {
    if (axis) n = x.dims[size_t(normalize_axis(*axis, x.rank(), c.node))];
    else if (auto e = x.numel()) n = Dim(*e);
  }
  r.outputs.push_back(TensorType(DType::Int64, {n}));
  r.outputs.push_back(TensorType(DType::Int64, {Dim{}}));
  r.outputs.resize(c.node.outputs.size());
  return r;
}

}  // namespace

void register_tensor_unique_ops(OpRegistry& r) {
  OpSchema s = data_movement_schema("Unique", 11, MappingType::ManyToMany, 1, 1, infer_unique, kernel_unique, 1, 4);
  r.add(std::move(s));
}

}  // namespace nnfuse::tensor_ops
