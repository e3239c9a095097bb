// Index-driven ops: Gather, GatherElements, GatherND, ScatterND, ScatterElements (and the
// deprecated Scatter), TopK, NonZero, OneHot, NonMaxSuppression. Indices may be int32 or int64;
// negative indices count from the end where ONNX allows them, and out-of-range ones are errors
// naming the node (never a read outside the buffer).
#include <algorithm>
#include <numeric>

#include "graph/ops_tensor_util.h"

namespace nnfuse::tensor_ops {

namespace {

int64_t checked_index(const KernelContext& c, int64_t v, int64_t n, const char* what) {
  int64_t w = v < 0 ? v + n : v;
  if (w < 0 || w >= n)
    c.error(std::string(what) + ": index " + std::to_string(v) + " is out of range for a dimension of " + std::to_string(n));
  return w;
}

// ---------------------------------------------------------------- Gather
InferResult infer_gather(const InferContext& c) {
  const TensorType &data = c.input(0), &ind = c.input(1);
  require_index_dtype(c, 1, "Gather: indices");
  if (!data.has_shape || !ind.has_shape) return unknown_rank(data.dtype);
  if (data.rank() == 0) c.error("Gather: data must have rank >= 1");
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 0), data.rank(), c.node);
  std::vector<Dim> out(data.dims.begin(), data.dims.begin() + axis);
  out.insert(out.end(), ind.dims.begin(), ind.dims.end());
  out.insert(out.end(), data.dims.begin() + axis + 1, data.dims.end());
  InferResult r = infer_one(TensorType(data.dtype, out));
  // Symbolic shape data: picking entries of a Shape output keeps their symbols.
  if (data.rank() == 1 && ind.rank() <= 1)
    if (auto dv = const_dims(c, 0))
      if (auto idx = const_ints(c, 1)) {
        std::vector<Dim> v;
        int64_t n = int64_t(dv->size());
        for (int64_t i : *idx) {
          int64_t w = i < 0 ? i + n : i;
          if (w < 0 || w >= n) c.error("Gather: index " + std::to_string(i) + " is out of range for " + dims_str(*dv));
          v.push_back((*dv)[size_t(w)]);
        }
        r.dim_values.push_back(v);
      }
  return r;
}

std::vector<Tensor> kernel_gather(const KernelContext& c) {
  const Tensor &x = c.input(0), &ind = c.input(1);
  if (x.rank() == 0) c.error("Gather: data must have rank >= 1");
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 0), x.rank(), c.node);
  Shape out(x.shape().begin(), x.shape().begin() + axis);
  out.insert(out.end(), ind.shape().begin(), ind.shape().end());
  out.insert(out.end(), x.shape().begin() + axis + 1, x.shape().end());
  Tensor y(x.dtype(), out);
  size_t esz = elem_size(c, x);
  int64_t outer = 1, inner = 1, n = x.dim(axis), k = ind.numel();
  for (int64_t d = 0; d < axis; ++d) outer *= x.dim(d);
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dim(d);
  std::vector<int64_t> idx(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) idx[size_t(i)] = checked_index(c, index_at(ind, i), n, "Gather");
  const size_t row = size_t(inner) * esz;
  auto* dst = static_cast<char*>(y.raw());
  auto* src = static_cast<const char*>(x.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < k; ++i) {
      std::memcpy(dst, src + (o * n + idx[size_t(i)]) * int64_t(row), row);
      dst += row;
    }
  return {y};
}

// ---------------------------------------------------------------- GatherElements / ScatterElements
// Calls f(position in indices, offset into data) for every element of the indices tensor.
template <class F>
void for_each_element_index(const KernelContext& c, const Shape& data, const Tensor& ind, int64_t axis, const char* what, F&& f) {
  const Shape& is = ind.shape();
  if (is.size() != data.size()) c.error(std::string(what) + ": indices " + shape_str(is) + " and data " + shape_str(data) + " differ in rank");
  auto st = shape_strides(data);
  const size_t r = is.size();
  int64_t n = shape_numel(is);
  std::vector<int64_t> pos(r, 0);
  int64_t base = 0;  // offset of pos without the axis term
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = checked_index(c, index_at(ind, i), data[size_t(axis)], what);
    f(i, base + v * st[size_t(axis)]);
    for (size_t d = r; d-- > 0;) {
      ++pos[d];
      if (d != size_t(axis)) base += st[d];
      if (pos[d] < is[d]) break;
      if (d != size_t(axis)) base -= st[d] * pos[d];
      pos[d] = 0;
    }
  }
  for (size_t d = 0; d < r; ++d)
    if (d != size_t(axis) && is[d] > data[d])
      c.error(std::string(what) + ": indices " + shape_str(is) + " exceed data " + shape_str(data) + " on axis " + std::to_string(d));
}

InferResult infer_gather_elements(const InferContext& c) {
  require_index_dtype(c, 1, "GatherElements: indices");
  TensorType t = c.input(1);
  t.dtype = c.input(0).dtype;
  return infer_one(t);
}

std::vector<Tensor> kernel_gather_elements(const KernelContext& c) {
  const Tensor &x = c.input(0), &ind = c.input(1);
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 0), x.rank(), c.node);
  for (int64_t d = 0; d < x.rank() && d < ind.rank(); ++d)
    if (d != axis && ind.dim(d) > x.dim(d))
      c.error("GatherElements: indices " + shape_str(ind.shape()) + " exceed data " + shape_str(x.shape()));
  Tensor y(x.dtype(), ind.shape());
  size_t esz = elem_size(c, x);
  auto* dst = static_cast<char*>(y.raw());
  auto* src = static_cast<const char*>(x.raw());
  for_each_element_index(c, x.shape(), ind, axis, "GatherElements", [&](int64_t i, int64_t off) {
    copy_elem(dst + i * int64_t(esz), src + off * int64_t(esz), esz);
  });
  return {y};
}

// Native arithmetic for reductions; float16/bfloat16 go through double.
template <class T> auto arith(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return to_double(v);
  else return v;
}

template <class T>
T reduce_value(const std::string& red, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    if (red == "add" || red == "max") return a || b;
    if (red == "mul" || red == "min") return a && b;
    return b;
  } else {
    auto x = arith(a), y = arith(b);
    decltype(x) r = y;
    if (red == "add") r = x + y;
    else if (red == "mul") r = x * y;
    else if (red == "max") r = std::max(x, y);
    else if (red == "min") r = std::min(x, y);
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return from_double<T>(r);
    else return T(r);
  }
}

std::string reduction_of(const KernelContext& c, int64_t since_max_min) {
  std::string red = c.opset >= 16 ? c.node.attrs.get_string("reduction", "none") : "none";
  bool ok = red == "none" || red == "add" || red == "mul" || ((red == "max" || red == "min") && c.opset >= since_max_min);
  if (!ok) c.unsupported("reduction '" + red + "' is not supported at opset " + std::to_string(c.opset));
  return red;
}

std::vector<Tensor> kernel_scatter_elements(const KernelContext& c) {
  const Tensor &x = c.input(0), &ind = c.input(1), &upd = c.input(2);
  if (upd.shape() != ind.shape())
    c.error("ScatterElements: updates " + shape_str(upd.shape()) + " and indices " + shape_str(ind.shape()) + " differ");
  if (upd.dtype() != x.dtype()) c.error("ScatterElements: updates and data differ in dtype");
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 0), x.rank(), c.node);
  std::string red = c.node.op_type == "Scatter" ? "none" : reduction_of(c, 18);
  Tensor y = x.clone();
  size_t esz = elem_size(c, x);
  if (red == "none") {
    auto* dst = static_cast<char*>(y.raw());
    auto* src = static_cast<const char*>(upd.raw());
    for_each_element_index(c, x.shape(), ind, axis, "ScatterElements", [&](int64_t i, int64_t off) {
      copy_elem(dst + off * int64_t(esz), src + i * int64_t(esz), esz);
    });
  } else {
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* dst = y.data<T>();
      const T* src = upd.data<T>();
      for_each_element_index(c, x.shape(), ind, axis, "ScatterElements",
                             [&](int64_t i, int64_t off) { dst[off] = reduce_value<T>(red, dst[off], src[i]); });
    });
  }
  return {y};
}

// ---------------------------------------------------------------- GatherND / ScatterND
InferResult infer_gather_nd(const InferContext& c) {
  const TensorType &data = c.input(0), &ind = c.input(1);
  require_index_dtype(c, 1, "GatherND: indices");
  int64_t b = c.node.attrs.get_int("batch_dims", 0);
  if (!data.has_shape || !ind.has_shape) return unknown_rank(data.dtype);
  if (ind.rank() < 1) c.error("GatherND: indices must have rank >= 1");
  const Dim& last = ind.dims.back();
  if (!last.known()) return unknown_rank(data.dtype);
  int64_t k = last.value;
  if (b + k > data.rank()) c.error("GatherND: batch_dims + indices.shape[-1] exceeds the data rank");
  std::vector<Dim> out(ind.dims.begin(), ind.dims.end() - 1);
  out.insert(out.end(), data.dims.begin() + b + k, data.dims.end());
  return infer_one(TensorType(data.dtype, out));
}

struct NDPlan {
  int64_t batches = 1, tuples = 0, k = 0, slice = 1, data_batch = 1;
  std::vector<int64_t> strides;  // data strides of the k indexed dims
  Shape dims;                    // their sizes
};

NDPlan nd_plan(const KernelContext& c, const Shape& data, const Shape& ind, int64_t b, const char* what) {
  NDPlan p;
  if (ind.empty()) c.error(std::string(what) + ": indices must have rank >= 1");
  p.k = ind.back();
  if (b < 0 || b + p.k > int64_t(data.size()) || b >= int64_t(ind.size()))
    c.error(std::string(what) + ": indices " + shape_str(ind) + " do not fit data " + shape_str(data) + " with batch_dims " + std::to_string(b));
  for (int64_t i = 0; i < b; ++i) {
    if (data[size_t(i)] != ind[size_t(i)]) c.error(std::string(what) + ": batch dims of data and indices differ");
    p.batches *= data[size_t(i)];
  }
  p.tuples = 1;
  for (size_t i = size_t(b); i + 1 < ind.size(); ++i) p.tuples *= ind[i];
  auto st = shape_strides(data);
  for (int64_t j = 0; j < p.k; ++j) {
    p.strides.push_back(st[size_t(b + j)]);
    p.dims.push_back(data[size_t(b + j)]);
  }
  for (size_t i = size_t(b + p.k); i < data.size(); ++i) p.slice *= data[i];
  for (size_t i = size_t(b); i < data.size(); ++i) p.data_batch *= data[i];
  return p;
}

// Offset (elements) into data of tuple t of batch bt.
int64_t nd_offset(const KernelContext& c, const NDPlan& p, const Tensor& ind, int64_t bt, int64_t t, const char* what) {
  int64_t off = bt * p.data_batch;
  int64_t base = (bt * p.tuples + t) * p.k;
  for (int64_t j = 0; j < p.k; ++j) off += checked_index(c, index_at(ind, base + j), p.dims[size_t(j)], what) * p.strides[size_t(j)];
  return off;
}

std::vector<Tensor> kernel_gather_nd(const KernelContext& c) {
  const Tensor &x = c.input(0), &ind = c.input(1);
  int64_t b = c.node.attrs.get_int("batch_dims", 0);
  NDPlan p = nd_plan(c, x.shape(), ind.shape(), b, "GatherND");
  Shape out(ind.shape().begin(), ind.shape().end() - 1);
  out.insert(out.end(), x.shape().begin() + b + p.k, x.shape().end());
  Tensor y(x.dtype(), out);
  size_t esz = elem_size(c, x);
  const size_t row = size_t(p.slice) * esz;
  auto* dst = static_cast<char*>(y.raw());
  auto* src = static_cast<const char*>(x.raw());
  for (int64_t bt = 0; bt < p.batches; ++bt)
    for (int64_t t = 0; t < p.tuples; ++t) {
      std::memcpy(dst, src + nd_offset(c, p, ind, bt, t, "GatherND") * int64_t(esz), row);
      dst += row;
    }
  return {y};
}

std::vector<Tensor> kernel_scatter_nd(const KernelContext& c) {
  const Tensor &x = c.input(0), &ind = c.input(1), &upd = c.input(2);
  NDPlan p = nd_plan(c, x.shape(), ind.shape(), 0, "ScatterND");
  Shape want(ind.shape().begin(), ind.shape().end() - 1);
  want.insert(want.end(), x.shape().begin() + p.k, x.shape().end());
  if (upd.shape() != want) c.error("ScatterND: updates are " + shape_str(upd.shape()) + ", expected " + shape_str(want));
  if (upd.dtype() != x.dtype()) c.error("ScatterND: updates and data differ in dtype");
  std::string red = reduction_of(c, 18);
  Tensor y = x.clone();
  size_t esz = elem_size(c, x);
  if (red == "none") {
    auto* dst = static_cast<char*>(y.raw());
    auto* src = static_cast<const char*>(upd.raw());
    const size_t row = size_t(p.slice) * esz;
    for (int64_t t = 0; t < p.tuples; ++t) std::memcpy(dst + nd_offset(c, p, ind, 0, t, "ScatterND") * int64_t(esz), src + t * int64_t(row), row);
  } else {
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* dst = y.data<T>();
      const T* src = upd.data<T>();
      for (int64_t t = 0; t < p.tuples; ++t) {
        int64_t off = nd_offset(c, p, ind, 0, t, "ScatterND");
        for (int64_t e = 0; e < p.slice; ++e) dst[off + e] = reduce_value<T>(red, dst[off + e], src[t * p.slice + e]);
      }
    });
  }
  return {y};
}

// ---------------------------------------------------------------- TopK
std::optional<int64_t> topk_k(const Node& n, int64_t opset, const Tensor* k_input) {
  if (opset < 10) return n.attrs.get_int("k", 0);
  if (!k_input) return std::nullopt;
  return k_input->as_int(0);
}

InferResult infer_topk(const InferContext& c) {
  const TensorType& x = c.input(0);
  InferResult r;
  if (!x.has_shape) {
    r.outputs = {TensorType::unknown_shape(x.dtype), TensorType::unknown_shape(DType::Int64)};
    return r;
  }
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", -1), x.rank(), c.node);
  std::optional<int64_t> k;
  if (c.opset < 10) k = c.node.attrs.get_int("k", 0);
  else if (auto v = const_ints(c, 1); v && !v->empty()) k = (*v)[0];
  std::vector<Dim> out = x.dims;
  if (k) {
    const Dim& d = x.dims[size_t(axis)];
    if (*k < 0 || (d.known() && *k > d.value)) c.error("TopK: k = " + std::to_string(*k) + " is out of range for " + x.str());
    out[size_t(axis)] = Dim(*k);
  } else {
    out[size_t(axis)] = Dim{};
  }
  r.outputs = {TensorType(x.dtype, out), TensorType(DType::Int64, out)};
  return r;
}

std::vector<Tensor> kernel_topk(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", -1), x.rank(), c.node);
  int64_t k = *topk_k(c.node, c.opset, c.opset >= 10 ? &c.input(1) : nullptr);
  int64_t n = x.dim(axis);
  if (k < 0 || k > n) c.error("TopK: k = " + std::to_string(k) + " is out of range for " + shape_str(x.shape()));
  bool largest = c.opset < 11 || c.node.attrs.get_int("largest", 1) != 0;
  Shape out = x.shape();
  out[size_t(axis)] = k;
  Tensor values(x.dtype(), out), indices(DType::Int64, out);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dim(d);
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dim(d);
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.data<T>();
    T* vo = values.data<T>();
    int64_t* io = indices.data<int64_t>();
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const T* row = src + o * n * inner + in;
        std::iota(order.begin(), order.end(), int64_t(0));
        // Ties keep the lower index first (ONNX: sorted, stable on index).
        auto cmp = [&](int64_t a, int64_t b) {
          auto va = arith(row[a * inner]), vb = arith(row[b * inner]);
          if (va == vb) return a < b;
          return largest ? va > vb : va < vb;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), cmp);
        for (int64_t j = 0; j < k; ++j) {
          int64_t dst = (o * k + j) * inner + in;
          vo[dst] = row[order[size_t(j)] * inner];
          io[dst] = order[size_t(j)];
        }
      }
  });
  return {values, indices};
}

// ---------------------------------------------------------------- NonZero
InferResult infer_nonzero(const InferContext& c) {
  const TensorType& x = c.input(0);
  return infer_one(TensorType(DType::Int64, {x.has_shape ? Dim(x.rank()) : Dim{}, Dim{}}));
}

std::vector<Tensor> kernel_nonzero(const KernelContext& c) {
  const Tensor& x = c.input(0);
  std::vector<int64_t> hits;
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i)
      if (to_double(p[i]) != 0) hits.push_back(i);
  });
  int64_t r = x.rank(), nnz = int64_t(hits.size());
  Tensor y(DType::Int64, {r, nnz});
  int64_t* o = y.data<int64_t>();
  auto st = shape_strides(x.shape());
  for (int64_t j = 0; j < nnz; ++j) {
    int64_t rem = hits[size_t(j)];
    for (int64_t d = 0; d < r; ++d) {
      o[d * nnz + j] = rem / st[size_t(d)];
      rem %= st[size_t(d)];
    }
  }
  return {y};
}

// ---------------------------------------------------------------- OneHot
InferResult infer_onehot(const InferContext& c) {
  const TensorType &ind = c.input(0), &vals = c.input(2);
  if (!ind.has_shape) return unknown_rank(vals.dtype);
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", -1), ind.rank() + 1, c.node);
  Dim depth;
  if (const Tensor* d = c.value(1)) depth = Dim(int64_t(d->as_double()));
  std::vector<Dim> out = ind.dims;
  out.insert(out.begin() + axis, depth);
  return infer_one(TensorType(vals.dtype, out));
}

std::vector<Tensor> kernel_onehot(const KernelContext& c) {
  const Tensor &ind = c.input(0), &dep = c.input(1), &vals = c.input(2);
  if (vals.numel() != 2) c.error("OneHot: values must have 2 elements (off, on), got " + shape_str(vals.shape()));
  int64_t depth = int64_t(dep.as_double());
  if (depth < 1) c.error("OneHot: depth must be positive, got " + std::to_string(depth));
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", -1), ind.rank() + 1, c.node);
  Shape out = ind.shape();
  out.insert(out.begin() + axis, depth);
  Tensor y(vals.dtype(), out);
  size_t esz = elem_size(c, vals);
  auto* dst = static_cast<char*>(y.raw());
  auto* v = static_cast<const char*>(vals.raw());
  for (int64_t i = 0; i < y.numel(); ++i) copy_elem(dst + i * int64_t(esz), v, esz);
  int64_t inner = 1;
  for (int64_t d = axis; d < ind.rank(); ++d) inner *= ind.dim(d);
  for (int64_t i = 0; i < ind.numel(); ++i) {
    int64_t idx = dtype_is_float(ind.dtype()) ? int64_t(ind.as_double(i)) : index_at(ind, i);
    if (idx < 0) idx += depth;
    if (idx < 0 || idx >= depth) continue;  // out-of-range indices give an all-off row
    int64_t o = i / inner, in = i % inner;
    copy_elem(dst + ((o * depth + idx) * inner + in) * int64_t(esz), v + esz, esz);
  }
  return {y};
}

// ---------------------------------------------------------------- NonMaxSuppression
struct Box {
  float y1, x1, y2, x2;
};

bool suppressed_by(const Box& a, const Box& b, float iou_threshold) {
  float ix1 = std::max(std::min(a.x1, a.x2), std::min(b.x1, b.x2));
  float ix2 = std::min(std::max(a.x1, a.x2), std::max(b.x1, b.x2));
  float iy1 = std::max(std::min(a.y1, a.y2), std::min(b.y1, b.y2));
  float iy2 = std::min(std::max(a.y1, a.y2), std::max(b.y1, b.y2));
  float inter = std::max(0.0f, ix2 - ix1) * std::max(0.0f, iy2 - iy1);
  if (inter <= 0) return false;
  float area_a = std::abs((a.x2 - a.x1) * (a.y2 - a.y1)), area_b = std::abs((b.x2 - b.x1) * (b.y2 - b.y1));
  float uni = area_a + area_b - inter;
  if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

InferResult infer_nms(const InferContext& c) {
  (void)c;
  return infer_one(TensorType(DType::Int64, {Dim{}, Dim(3)}));
}

std::vector<Tensor> kernel_nms(const KernelContext& c) {
  const Tensor &boxes = c.input(0), &scores = c.input(1);
  if (boxes.rank() != 3 || boxes.dim(2) != 4 || scores.rank() != 3 || scores.dim(0) != boxes.dim(0) || scores.dim(2) != boxes.dim(1))
    c.error("NonMaxSuppression: boxes " + shape_str(boxes.shape()) + " and scores " + shape_str(scores.shape()) +
            " must be [B,N,4] and [B,C,N]");
  int64_t max_out = c.has_input(2) && c.input(2).numel() > 0 ? c.input(2).as_int(0) : 0;
  float iou_th = c.has_input(3) && c.input(3).numel() > 0 ? float(c.input(3).as_double(0)) : 0.0f;
  bool has_score_th = c.has_input(4) && c.input(4).numel() > 0;
  float score_th = has_score_th ? float(c.input(4).as_double(0)) : 0.0f;
  bool center = c.node.attrs.get_int("center_point_box", 0) != 0;
  int64_t B = boxes.dim(0), N = boxes.dim(1), C = scores.dim(1);
  auto bv = boxes.to_float_vector();
  auto sv = scores.to_float_vector();
  std::vector<int64_t> sel;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<Box> bx(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) {
      const float* p = &bv[size_t((b * N + i) * 4)];
      if (center) bx[size_t(i)] = {p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
      else bx[size_t(i)] = {p[0], p[1], p[2], p[3]};
    }
    for (int64_t cl = 0; cl < C && max_out > 0; ++cl) {
      const float* s = &sv[size_t((b * C + cl) * N)];
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < N; ++i)
        if (!has_score_th || s[i] > score_th) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t d) { return s[a] > s[d]; });
      std::vector<int64_t> kept;
      for (int64_t i : cand) {
        if (int64_t(kept.size()) >= max_out) break;
        bool drop = false;
        for (int64_t j : kept)
          if (suppressed_by(bx[size_t(i)], bx[size_t(j)], iou_th)) { drop = true; break; }
        if (drop) continue;
        kept.push_back(i);
        sel.insert(sel.end(), {b, cl, i});
      }
    }
  }
  return {Tensor::from_vector<int64_t>({int64_t(sel.size() / 3), 3}, sel)};
}

}  // namespace

void register_tensor_index_ops(OpRegistry& r) {
  auto same = [](const InferContext& c) { return infer_same_as(c); };
  {
    OpSchema s = data_movement_schema("Gather", 1, MappingType::OneToMany, 2, 2, infer_gather, kernel_gather);
    // A single index selects one slice: the elements keep their order (Reorganize). Several
    // indices may repeat a slice (One-to-Many).
    s.mapping_fn = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
      if (ins.size() > 1 && ins[1].has_shape) {
        auto n = ins[1].numel();
        if (ins[1].rank() == 0 || (n && *n == 1)) return MappingType::Reorganize;
      }
      return MappingType::OneToMany;
    };
    r.add(std::move(s));
  }
  r.add(data_movement_schema("GatherElements", 11, MappingType::ManyToMany, 2, 2, infer_gather_elements, kernel_gather_elements));
  r.add(data_movement_schema("GatherND", 11, MappingType::ManyToMany, 2, 2, infer_gather_nd, kernel_gather_nd));
  r.add(data_movement_schema("ScatterND", 11, MappingType::ManyToMany, 3, 3, same, kernel_scatter_nd));
  r.add(data_movement_schema("ScatterElements", 11, MappingType::ManyToMany, 3, 3, same, kernel_scatter_elements));
  {
    OpSchema s = data_movement_schema("Scatter", 9, MappingType::ManyToMany, 3, 3, same, kernel_scatter_elements);
    s.until = 10;  // deprecated at opset 11 in favour of ScatterElements
    r.add(std::move(s));
  }
  r.add(data_movement_schema("TopK", 1, MappingType::ManyToMany, 1, 2, infer_topk, kernel_topk, 2, 2));
  r.add(data_movement_schema("NonZero", 9, MappingType::ManyToMany, 1, 1, infer_nonzero, kernel_nonzero));
  r.add(data_movement_schema("OneHot", 9, MappingType::ManyToMany, 3, 3, infer_onehot, kernel_onehot));
  r.add(data_movement_schema("NonMaxSuppression", 10, MappingType::ManyToMany, 2, 5, infer_nms, kernel_nms));
}

}  // namespace nnfuse::tensor_ops
