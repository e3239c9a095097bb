// The tensor / data-movement / shape op family. The ops live in ops_tensor_*.cpp by theme; this
// file holds the helpers they share (strided copies on raw bytes, constant-or-symbolic input
// access for shape inference) and the family's registration entry point.
#include "graph/ops_tensor_util.h"

#include <algorithm>

namespace nnfuse {
namespace tensor_ops {

std::string dims_str(const std::vector<Dim>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + d[i].str();
  return s + "]";
}

std::vector<Dim> dims_of(const Shape& s) { return std::vector<Dim>(s.begin(), s.end()); }

Dim dims_product(const std::vector<Dim>& d, size_t begin, size_t end) {
  int64_t p = 1;
  const Dim* sym = nullptr;
  for (size_t i = begin; i < end && i < d.size(); ++i) {
    if (d[i].known()) { p *= d[i].value; continue; }
    if (sym || d[i].symbol.empty()) return Dim{};
    sym = &d[i];
  }
  if (sym) return p == 1 ? *sym : Dim{};
  return Dim(p);
}

std::optional<std::vector<int64_t>> const_ints(const InferContext& c, size_t i) {
  if (!c.has_input(i)) return std::nullopt;
  if (const Tensor* t = c.value(i)) return t->to_int_vector();
  if (auto& dv = c.dims_of_value(i)) {
    std::vector<int64_t> r;
    for (auto& d : *dv) {
      if (!d.known()) return std::nullopt;
      r.push_back(d.value);
    }
    return r;
  }
  return std::nullopt;
}

std::optional<std::vector<Dim>> const_dims(const InferContext& c, size_t i) {
  if (!c.has_input(i)) return std::nullopt;
  if (auto& dv = c.dims_of_value(i)) return *dv;
  if (const Tensor* t = c.value(i)) return dims_of(t->to_int_vector());
  return std::nullopt;
}

std::optional<int64_t> static_length(const InferContext& c, size_t i) {
  if (!c.has_input(i)) return std::nullopt;
  const TensorType& t = c.inputs[i];
  if (t.has_shape && t.dims.size() == 1 && t.dims[0].known()) {
    // The length of a shape input is the output's rank: a declared [2^40] is refused here, not
    // allocated as a rank.
    if (t.dims[0].value > kMaxRank)
      c.error("input " + std::to_string(i) + " is a shape of " + std::to_string(t.dims[0].value) + " dims; a tensor has at most " +
              std::to_string(kMaxRank));
    return t.dims[0].value;
  }
  if (t.has_shape && t.dims.empty()) return 1;
  return std::nullopt;
}

std::optional<std::vector<int64_t>> axes_attr_or_input(const InferContext& c, const char* attr, size_t input,
                                                       int64_t input_since, bool* present) {
  *present = true;
  if (c.opset < input_since) {
    if (auto a = c.node.attrs.opt_ints(attr)) return a;
    *present = false;
    return std::vector<int64_t>{};
  }
  if (!c.has_input(input)) {
    *present = false;
    return std::vector<int64_t>{};
  }
  return const_ints(c, input);
}

std::optional<std::vector<int64_t>> kernel_ints_attr_or_input(const KernelContext& c, const char* attr, size_t input,
                                                              int64_t input_since, bool* present) {
  *present = true;
  if (c.opset < input_since) {
    if (auto a = c.node.attrs.opt_ints(attr)) return a;
    *present = false;
    return std::vector<int64_t>{};
  }
  if (!c.has_input(input)) {
    *present = false;
    return std::vector<int64_t>{};
  }
  return c.input(input).to_int_vector();
}

InferResult unknown_rank(DType t) { return infer_one(TensorType::unknown_shape(t)); }

namespace {
// copy_strided for dims n (strides ds/ss, in elements of E bytes) where dim k is contiguous in
// the source and the last dim in the destination: tiles of k x last.
template <size_t E>
void tiled_copy(char* out, const char* in, const std::vector<int64_t>& n, const std::vector<int64_t>& ds,
                const std::vector<int64_t>& ss, size_t k) {
  constexpr int64_t kTile = 32;
  const size_t r = n.size(), l = r - 1;
  std::vector<size_t> others;
  for (size_t d = 0; d < l; ++d)
    if (d != k) others.push_back(d);
  int64_t outer = 1;
  for (size_t d : others) outer *= n[d];
  const int64_t rows = n[k], cols = n[l], dsk = ds[k], ssl = ss[l];
  std::vector<int64_t> idx(others.size(), 0);
  int64_t doff = 0, soff = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i0 = 0; i0 < rows; i0 += kTile)
      for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
        const int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
        for (int64_t i = i0; i < i1; ++i) {
          char* dp = out + (doff + i * dsk) * int64_t(E);
          const char* sp = in + (soff + i) * int64_t(E);
          for (int64_t j = j0; j < j1; ++j) std::memcpy(dp + j * int64_t(E), sp + j * ssl * int64_t(E), E);
        }
      }
    for (size_t q = others.size(); q-- > 0;) {
      size_t d = others[q];
      ++idx[q];
      doff += ds[d];
      soff += ss[d];
      if (idx[q] < n[d]) break;
      doff -= ds[d] * n[d];
      soff -= ss[d] * n[d];
      idx[q] = 0;
    }
  }
}
}  // namespace

void copy_strided(void* dst, const std::vector<int64_t>& dst_strides, const void* src,
                  const std::vector<int64_t>& src_strides, const Shape& shape, size_t esz) {
  // Drop size-1 dims, then merge dims that are contiguous in both source and destination.
  std::vector<int64_t> n, ds, ss;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    n.push_back(shape[d]);
    ds.push_back(dst_strides[d]);
    ss.push_back(src_strides[d]);
  }
  for (size_t d = n.size(); d-- > 1;) {
    if (ds[d - 1] == ds[d] * n[d] && ss[d - 1] == ss[d] * n[d]) {
      n[d - 1] *= n[d];
      ds[d - 1] = ds[d];
      ss[d - 1] = ss[d];
      n.erase(n.begin() + long(d));
      ds.erase(ds.begin() + long(d));
      ss.erase(ss.begin() + long(d));
    }
  }
  auto* out = static_cast<char*>(dst);
  auto* in = static_cast<const char*>(src);
  if (n.empty()) {
    copy_elem(out, in, esz);
    return;
  }
  const size_t r = n.size();
  if (r >= 2 && ss[r - 1] != 1 && ds[r - 1] == 1) {
    // A transpose-like copy: the destination runs along a strided source dim while another dim
    // is contiguous in the source. Copy in square tiles so both sides stay in cache.
    for (size_t k = r - 1; k-- > 0;)
      if (ss[k] == 1) {
        switch (esz) {
          case 1: tiled_copy<1>(out, in, n, ds, ss, k); return;
          case 2: tiled_copy<2>(out, in, n, ds, ss, k); return;
          case 4: tiled_copy<4>(out, in, n, ds, ss, k); return;
          case 8: tiled_copy<8>(out, in, n, ds, ss, k); return;
          default: break;
        }
        break;
      }
  }
  const int64_t inner = n[r - 1], dsi = ds[r - 1] * int64_t(esz), ssi = ss[r - 1] * int64_t(esz);
  const bool contiguous = ds[r - 1] == 1 && ss[r - 1] == 1;
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < r; ++d) outer *= n[d];
  std::vector<int64_t> idx(r, 0);
  int64_t doff = 0, soff = 0;  // in elements
  for (int64_t o = 0; o < outer; ++o) {
    char* dp = out + doff * int64_t(esz);
    const char* sp = in + soff * int64_t(esz);
    if (contiguous) {
      std::memcpy(dp, sp, size_t(inner) * esz);
    } else {
      switch (esz) {
        case 1: for (int64_t i = 0; i < inner; ++i, dp += dsi, sp += ssi) std::memcpy(dp, sp, 1); break;
        case 2: for (int64_t i = 0; i < inner; ++i, dp += dsi, sp += ssi) std::memcpy(dp, sp, 2); break;
        case 4: for (int64_t i = 0; i < inner; ++i, dp += dsi, sp += ssi) std::memcpy(dp, sp, 4); break;
        case 8: for (int64_t i = 0; i < inner; ++i, dp += dsi, sp += ssi) std::memcpy(dp, sp, 8); break;
        default: for (int64_t i = 0; i < inner; ++i, dp += dsi, sp += ssi) std::memcpy(dp, sp, esz);
      }
    }
    for (size_t d = r - 1; d-- > 0;) {
      ++idx[d];
      doff += ds[d];
      soff += ss[d];
      if (idx[d] < n[d]) break;
      doff -= ds[d] * n[d];
      soff -= ss[d] * n[d];
      idx[d] = 0;
    }
  }
}

void gather_by_dim_maps(void* dst, const void* src, const Shape& out, const std::vector<std::vector<int64_t>>& maps,
                        size_t esz, const void* fill) {
  const int64_t total = shape_numel(out);
  if (total == 0) return;
  auto* o = static_cast<char*>(dst);
  auto* in = static_cast<const char*>(src);
  const size_t r = out.size();
  if (r == 0) {
    copy_elem(o, in, esz);
    return;
  }
  const int64_t inner = out[r - 1];
  const std::vector<int64_t>& last = maps[r - 1];
  std::vector<int64_t> idx(r, 0);
  int64_t outer = total / inner;
  for (int64_t k = 0; k < outer; ++k) {
    int64_t base = 0;
    bool filled = false;
    for (size_t d = 0; d + 1 < r; ++d) {
      int64_t m = maps[d][size_t(idx[d])];
      if (m < 0) { filled = true; break; }
      base += m;
    }
    char* op = o + k * inner * int64_t(esz);
    if (filled) {
      for (int64_t i = 0; i < inner; ++i) copy_elem(op + i * int64_t(esz), fill, esz);
    } else {
      for (int64_t i = 0; i < inner; ++i) {
        int64_t m = last[size_t(i)];
        copy_elem(op + i * int64_t(esz), m < 0 ? fill : in + (base + m) * int64_t(esz), esz);
      }
    }
    for (size_t d = r - 1; d-- > 0;) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
}

size_t elem_size(const KernelContext& c, const Tensor& t) {
  size_t s = dtype_size(t.dtype());
  if (s == 0) c.unsupported(std::string("dtype ") + dtype_name(t.dtype()) + " is not supported");
  return s;
}

int64_t index_at(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::Int64) return t.data<int64_t>()[i];
  if (t.dtype() == DType::Int32) return t.data<int32_t>()[i];
  return t.as_int(i);
}

void require_index_dtype(const InferContext& c, size_t i, const char* what) {
  if (!c.has_input(i)) return;
  DType t = c.inputs[i].dtype;
  if (t != DType::Undefined && t != DType::Int32 && t != DType::Int64)
    c.error(std::string(what) + " must be int32 or int64, not " + dtype_name(t));
}

}  // namespace tensor_ops

void register_tensor_ops(OpRegistry& r) {
  tensor_ops::register_tensor_shape_ops(r);
  tensor_ops::register_tensor_move_ops(r);
  tensor_ops::register_tensor_index_ops(r);
  tensor_ops::register_tensor_resize_ops(r);
  tensor_ops::register_tensor_grid_sample_ops(r);
  tensor_ops::register_tensor_signal_ops(r);
  tensor_ops::register_tensor_ml_ops(r);
  tensor_ops::register_tensor_unique_ops(r);
}

}  // namespace nnfuse
