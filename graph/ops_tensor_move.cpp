// Data-movement ops: Transpose, Concat, Split, Slice, Expand, Tile, Pad, DepthToSpace,
// SpaceToDepth, Compress, CenterCropPad, ReverseSequence. Kernels move bytes by element size (every dtype) with
// strided copies whose contiguous runs are single memcpy calls.
#include <algorithm>
#include <climits>
#include <numeric>

#include "graph/ops_tensor_util.h"
#include "graph/resampling.h"

namespace nnfuse::tensor_ops {

namespace {

std::vector<int64_t> contiguous_strides(const Shape& s) { return shape_strides(s); }

// ---------------------------------------------------------------- Transpose
std::vector<int64_t> transpose_perm(const Node& n, int64_t rank) {
  std::vector<int64_t> perm = n.attrs.get_ints("perm");
  if (perm.empty()) {
    perm.resize(size_t(rank));
    for (int64_t i = 0; i < rank; ++i) perm[size_t(i)] = rank - 1 - i;
    return perm;
  }
  std::vector<bool> seen(size_t(rank), false);
  bool ok = int64_t(perm.size()) == rank;
  for (auto& p : perm) {
    if (!ok) break;
    if (p < 0) p += rank;
    if (p < 0 || p >= rank || seen[size_t(p)]) ok = false;
    else seen[size_t(p)] = true;
  }
  if (!ok) {
    std::string s;
    for (auto p : n.attrs.get_ints("perm")) s += (s.empty() ? "" : ",") + std::to_string(p);
    fail(ErrorKind::Shape, "Transpose: perm [" + s + "] is not a permutation of rank " + std::to_string(rank),
         {"", 0, 0, n.label(), n.op_type});
  }
  return perm;
}

InferResult infer_transpose(const InferContext& c) {
  const TensorType& in = c.input(0);
  if (!in.has_shape) {
    auto perm = c.node.attrs.get_ints("perm");
    if (!perm.empty()) return infer_one(TensorType(in.dtype, std::vector<Dim>(perm.size(), Dim{})));
    return unknown_rank(in.dtype);
  }
  auto perm = transpose_perm(c.node, in.rank());
  std::vector<Dim> out;
  for (auto p : perm) out.push_back(in.dims[size_t(p)]);
  return infer_one(TensorType(in.dtype, out));
}

std::vector<Tensor> kernel_transpose(const KernelContext& c) {
  const Tensor& x = c.input(0);
  auto perm = transpose_perm(c.node, x.rank());
  Shape out;
  auto in_st = contiguous_strides(x.shape());
  std::vector<int64_t> src_st;
  for (auto p : perm) {
    out.push_back(x.dim(p));
    src_st.push_back(in_st[size_t(p)]);
  }
  Tensor y(x.dtype(), out);
  copy_strided(y.raw(), contiguous_strides(out), x.raw(), src_st, out, elem_size(c, x));
  return {y};
}

// ---------------------------------------------------------------- Concat
InferResult infer_concat(const InferContext& c) {
  const TensorType* first = nullptr;
  DType dt = DType::Undefined;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const TensorType& t = c.input(i);
    if (dt == DType::Undefined) dt = t.dtype;
    else if (t.dtype != DType::Undefined && t.dtype != dt)
      c.error(std::string("Concat: inputs mix ") + dtype_name(dt) + " and " + dtype_name(t.dtype));
    if (t.has_shape && !first) first = &t;
  }
  if (!first) return unknown_rank(dt);
  int64_t rank = first->rank();
  if (rank == 0) c.error("Concat: inputs must have rank >= 1");
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 1), rank, c.node);
  std::vector<Dim> out(size_t(rank), Dim{});
  bool all_shaped = true;
  int64_t sum = 0;
  std::vector<Dim> unknown_axis;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const TensorType& t = c.inputs[i];
    if (!t.has_shape) { all_shaped = false; continue; }
    if (t.rank() != rank) c.error("Concat: inputs have ranks " + std::to_string(rank) + " and " + std::to_string(t.rank()));
    for (int64_t d = 0; d < rank; ++d) {
      const Dim& x = t.dims[size_t(d)];
      if (d == axis) {
        if (x.known()) sum += x.value;
        else unknown_axis.push_back(x);
        continue;
      }
      Dim& o = out[size_t(d)];
      if (x.known() && o.known() && x.value != o.value)
        c.error("Concat: dimension " + std::to_string(d) + " differs between inputs (" + std::to_string(o.value) + " vs " +
                std::to_string(x.value) + ")");
      if (!o.known() && (x.known() || o.symbol.empty())) o = x;
    }
  }
  if (all_shaped && unknown_axis.empty()) out[size_t(axis)] = Dim(sum);
  else if (all_shaped && unknown_axis.size() == 1 && sum == 0) out[size_t(axis)] = unknown_axis[0];
  InferResult r = infer_one(TensorType(dt, out));
  if (rank == 1) {
    std::vector<Dim> all;
    bool ok = true;
    for (size_t i = 0; i < c.num_inputs() && ok; ++i) {
      auto d = const_dims(c, i);
      if (!d) ok = false;
      else all.insert(all.end(), d->begin(), d->end());
    }
    if (ok) r.dim_values.push_back(all);
  }
  return r;
}

std::vector<Tensor> kernel_concat(const KernelContext& c) {
  const int64_t rank = c.input(0).rank();
  if (rank == 0) c.error("Concat: inputs must have rank >= 1");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < c.num_inputs(); ++i) parts.push_back(c.input(i));
  return {concat_along(c, parts, normalize_axis(c.node.attrs.get_int("axis", 1), rank, c.node))};
}

}  // namespace

Tensor concat_along(const KernelContext& c, const std::vector<Tensor>& parts, int64_t axis) {
  const Tensor* first = &parts[0];
  const int64_t rank = first->rank();
  Shape out = first->shape();
  out[size_t(axis)] = 0;
  for (const Tensor& t : parts) {
    if (t.dtype() != first->dtype()) c.error("Concat: inputs mix dtypes");
    bool ok = t.rank() == rank;
    for (int64_t d = 0; ok && d < rank; ++d) ok = d == axis || t.dim(d) == first->dim(d);
    if (!ok) c.error("Concat: cannot concatenate " + shape_str(first->shape()) + " and " + shape_str(t.shape()) + " on axis " + std::to_string(axis));
    out[size_t(axis)] += t.dim(axis);
  }
  Tensor y(first->dtype(), out);
  size_t esz = elem_size(c, *first);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= out[size_t(d)];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= out[size_t(d)];
  const int64_t out_row = out[size_t(axis)] * inner * int64_t(esz);
  int64_t col = 0;
  auto* dst = static_cast<char*>(y.raw());
  for (const Tensor& t : parts) {
    const int64_t row = t.dim(axis) * inner * int64_t(esz);
    auto* src = static_cast<const char*>(t.raw());
    if (row > 0)
      for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + o * out_row + col, src + o * row, size_t(row));
    col += row;
  }
  return y;
}

std::vector<Tensor> split_along(const KernelContext& c, const Tensor& x, int64_t axis, const std::vector<int64_t>& sizes) {
  size_t esz = elem_size(c, x);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dim(d);
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dim(d);
  const int64_t in_row = x.dim(axis) * inner * int64_t(esz);
  std::vector<Tensor> outs;
  int64_t col = 0;
  auto* src = static_cast<const char*>(x.raw());
  for (int64_t s : sizes) {
    Shape o = x.shape();
    o[size_t(axis)] = s;
    Tensor y(x.dtype(), o);
    const int64_t row = s * inner * int64_t(esz);
    auto* dst = static_cast<char*>(y.raw());
    if (row > 0)
      for (int64_t k = 0; k < outer; ++k) std::memcpy(dst + k * row, src + k * in_row + col, size_t(row));
    col += row;
    outs.push_back(y);
  }
  return outs;
}

namespace {

// ---------------------------------------------------------------- Split
// Sizes of the parts along the axis; nullopt when they depend on unknown data.
std::optional<std::vector<int64_t>> split_sizes(const Node& n, int64_t opset, std::optional<int64_t> dim,
                                                const std::optional<std::vector<int64_t>>& split_input, bool input_present,
                                                const std::function<void(const std::string&)>& err) {
  size_t parts = n.outputs.size();
  std::vector<int64_t> split;
  if (opset < 13) split = n.attrs.get_ints("split");
  else if (input_present) {
    if (!split_input) return std::nullopt;
    split = *split_input;
  }
  if (!split.empty()) {
    if (split.size() != parts)
      err("Split: 'split' has " + std::to_string(split.size()) + " entries for " + std::to_string(parts) + " outputs");
    if (dim) {
      int64_t s = std::accumulate(split.begin(), split.end(), int64_t(0));
      if (s != *dim) err("Split: sizes sum to " + std::to_string(s) + " but the dimension is " + std::to_string(*dim));
    }
    return split;
  }
  if (!dim) return std::nullopt;
  if (opset >= 18 && n.attrs.has("num_outputs")) {
    int64_t k = n.attrs.get_int("num_outputs", 1);
    if (k != int64_t(parts)) err("Split: num_outputs is " + std::to_string(k) + " but the node has " + std::to_string(parts) + " outputs");
    int64_t chunk = (*dim + k - 1) / k;
    std::vector<int64_t> r;
    int64_t left = *dim;
    for (int64_t i = 0; i < k; ++i) {
      r.push_back(std::min(chunk, left));
      left -= r.back();
    }
    return r;
  }
  if (*dim % int64_t(parts) != 0)
    err("Split: dimension " + std::to_string(*dim) + " does not split evenly into " + std::to_string(parts) + " outputs");
  return std::vector<int64_t>(parts, *dim / int64_t(parts));
}

InferResult infer_split(const InferContext& c) {
  const TensorType& in = c.input(0);
  size_t parts = c.node.outputs.size();
  InferResult r;
  if (!in.has_shape) {
    r.outputs.assign(parts, TensorType::unknown_shape(in.dtype));
    return r;
  }
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 0), in.rank(), c.node);
  const Dim& d = in.dims[size_t(axis)];
  std::optional<int64_t> dim;
  if (d.known()) dim = d.value;
  auto sizes = split_sizes(c.node, c.opset, dim, const_ints(c, 1), c.opset >= 13 && c.has_input(1),
                           [&](const std::string& m) { c.error(m); });
  auto dv = const_dims(c, 0);
  int64_t off = 0;
  for (size_t k = 0; k < parts; ++k) {
    std::vector<Dim> o = in.dims;
    o[size_t(axis)] = sizes ? Dim((*sizes)[k]) : Dim{};
    r.outputs.emplace_back(in.dtype, o);
    if (sizes && dv && in.rank() == 1 && int64_t(dv->size()) >= off + (*sizes)[k])
      r.dim_values.emplace_back(std::vector<Dim>(dv->begin() + off, dv->begin() + off + (*sizes)[k]));
    else r.dim_values.emplace_back();
    if (sizes) off += (*sizes)[k];
  }
  return r;
}

std::vector<Tensor> kernel_split(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (x.rank() == 0) c.error("Split: input must have rank >= 1");
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 0), x.rank(), c.node);
  std::optional<std::vector<int64_t>> split_in;
  bool present = c.opset >= 13 && c.has_input(1);
  if (present) split_in = c.input(1).to_int_vector();
  auto sizes = *split_sizes(c.node, c.opset, x.dim(axis), split_in, present, [&](const std::string& m) { c.error(m); });
  return split_along(c, x, axis, sizes);
}

// ---------------------------------------------------------------- Slice
struct SliceAxis {
  int64_t start = 0, step = 1, len = 0;
};

SliceAxis slice_axis(int64_t d, int64_t start, int64_t end, int64_t step) {
  SliceAxis r;
  r.step = step;
  if (start < 0) start += d;
  if (end < 0) end += d;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, d);
    end = std::clamp<int64_t>(end, 0, d);
    r.len = end > start ? (end - start + step - 1) / step : 0;
  } else {
    start = std::clamp<int64_t>(start, 0, d - 1);
    end = std::clamp<int64_t>(end, -1, d - 1);
    r.len = start > end ? (start - end + (-step) - 1) / (-step) : 0;
  }
  r.start = start;
  return r;
}

struct SliceParams {
  std::vector<int64_t> starts, ends, axes, steps;
};

// Starts/ends/axes/steps from attributes (opset < 10) or inputs; nullopt when not constant.
template <class GetInts>
std::optional<SliceParams> slice_params(const Node& n, int64_t opset, int64_t rank, GetInts get) {
  SliceParams p;
  if (opset < 10) {
    p.starts = n.attrs.get_ints("starts");
    p.ends = n.attrs.get_ints("ends");
    p.axes = n.attrs.get_ints("axes");
  } else {
    auto s = get(1), e = get(2);
    if (!s || !e) return std::nullopt;
    p.starts = *s;
    p.ends = *e;
    bool has_axes = n.inputs.size() > 3 && !n.inputs[3].empty();
    bool has_steps = n.inputs.size() > 4 && !n.inputs[4].empty();
    if (has_axes) {
      auto a = get(3);
      if (!a) return std::nullopt;
      p.axes = *a;
    }
    if (has_steps) {
      auto st = get(4);
      if (!st) return std::nullopt;
      p.steps = *st;
    }
  }
  ErrorContext ec{"", 0, 0, n.label(), n.op_type, int(opset)};
  if (p.starts.size() != p.ends.size()) fail(ErrorKind::Shape, "Slice: starts and ends differ in length", ec);
  if (p.axes.empty())
    for (size_t i = 0; i < p.starts.size(); ++i) p.axes.push_back(int64_t(i));
  if (p.steps.empty()) p.steps.assign(p.starts.size(), 1);
  if (p.axes.size() != p.starts.size() || p.steps.size() != p.starts.size())
    fail(ErrorKind::Shape, "Slice: starts, ends, axes and steps differ in length", ec);
  for (auto& a : p.axes) a = normalize_axis(a, rank, n);
  for (auto s : p.steps)
    if (s == 0) fail(ErrorKind::Shape, "Slice: step 0", ec);
  return p;
}

// Bounds known only symbolically, as dynamic-axes exports slice a position table by the sequence
// length: `position_ids[:, 0:Gather(Shape(input_ids), 1)]`. A slice from 0 with step 1 to a
// symbolic end `s` is taken to have length `s`, i.e. the end is assumed to lie within the dim (ONNX
// would clamp it; a longer sequence than the table would make the model fail at its next
// broadcast anyway). This keeps the symbol through the graph (as ONNX Runtime's symbolic shape
// inference does); once dims are bound, shapes are recomputed exactly with clamping.
std::optional<std::vector<Dim>> infer_slice_symbolic(const InferContext& c, const TensorType& in) {
  if (c.opset < 10) return std::nullopt;
  auto starts = const_ints(c, 1);
  auto ends = const_dims(c, 2);
  if (!starts || !ends || starts->size() != ends->size()) return std::nullopt;
  std::vector<int64_t> axes, steps(starts->size(), 1);
  if (c.has_input(3)) {
    auto a = const_ints(c, 3);
    if (!a) return std::nullopt;
    axes = *a;
  } else {
    for (size_t i = 0; i < starts->size(); ++i) axes.push_back(int64_t(i));
  }
  if (c.has_input(4)) {
    auto st = const_ints(c, 4);
    if (!st) return std::nullopt;
    steps = *st;
  }
  if (axes.size() != starts->size() || steps.size() != starts->size()) return std::nullopt;
  std::vector<Dim> out = in.dims;
  for (size_t i = 0; i < axes.size(); ++i) {
    size_t a = size_t(normalize_axis(axes[i], in.rank(), c.node));
    const Dim& d = in.dims[a];
    const Dim& e = (*ends)[i];
    if (steps[i] == 0) return std::nullopt;  // the kernel reports it
    if (e.known() && d.known())
      out[a] = Dim(slice_axis(d.value, (*starts)[i], e.value, steps[i]).len);
    else if (e.known() && (*starts)[i] == 0 && steps[i] == 1 && e.value >= INT32_MAX)
      ;  // the whole of the dim
    else if (!e.known() && !e.symbol.empty() && (*starts)[i] == 0 && steps[i] == 1)
      out[a] = e;
    else
      out[a] = Dim{};
  }
  return out;
}

InferResult infer_slice(const InferContext& c) {
  const TensorType& in = c.input(0);
  if (!in.has_shape) return unknown_rank(in.dtype);
  auto p = slice_params(c.node, c.opset, in.rank(), [&](size_t i) { return const_ints(c, i); });
  std::vector<Dim> out = in.dims;
  if (!p) {
    if (auto sym = infer_slice_symbolic(c, in)) return infer_one(TensorType(in.dtype, *sym));
    // Unknown bounds: the sliced axes are unknown; all axes when the axes are unknown too.
    auto axes = c.opset >= 10 && c.has_input(3) ? const_ints(c, 3) : std::nullopt;
    if (axes && !axes->empty()) {
      for (auto a : *axes) out[size_t(normalize_axis(a, in.rank(), c.node))] = Dim{};
    } else {
      for (auto& d : out) d = Dim{};
    }
    return infer_one(TensorType(in.dtype, out));
  }
  std::vector<SliceAxis> sa(size_t(in.rank()));
  bool all_known = true;
  for (size_t i = 0; i < p->axes.size(); ++i) {
    size_t a = size_t(p->axes[i]);
    const Dim& d = in.dims[a];
    if (d.known()) {
      sa[a] = slice_axis(d.value, p->starts[i], p->ends[i], p->steps[i]);
      out[a] = Dim(sa[a].len);
    } else if (p->starts[i] == 0 && p->steps[i] == 1 && p->ends[i] >= INT32_MAX) {
      // The whole of a symbolic dim: the symbol survives.
    } else {
      out[a] = Dim{};
      all_known = false;
    }
  }
  InferResult r = infer_one(TensorType(in.dtype, out));
  if (in.rank() == 1 && all_known)
    if (auto dv = const_dims(c, 0); dv && int64_t(dv->size()) == (in.dims[0].known() ? in.dims[0].value : -2)) {
      SliceAxis s = p->axes.empty() ? SliceAxis{0, 1, int64_t(dv->size())} : sa[0];
      std::vector<Dim> v;
      for (int64_t k = 0; k < s.len; ++k) v.push_back((*dv)[size_t(s.start + k * s.step)]);
      r.dim_values.push_back(v);
    }
  return r;
}

std::vector<Tensor> kernel_slice(const KernelContext& c) {
  const Tensor& x = c.input(0);
  auto p = *slice_params(c.node, c.opset, x.rank(), [&](size_t i) -> std::optional<std::vector<int64_t>> {
    return c.input(i).to_int_vector();
  });
  Shape out = x.shape();
  auto st = contiguous_strides(x.shape());
  std::vector<int64_t> src_st = st;
  int64_t base = 0;
  std::vector<bool> seen(size_t(x.rank()), false);
  for (size_t i = 0; i < p.axes.size(); ++i) {
    size_t a = size_t(p.axes[i]);
    if (seen[a]) c.error("Slice: axis " + std::to_string(a) + " is repeated");
    seen[a] = true;
    SliceAxis s = slice_axis(x.dim(int64_t(a)), p.starts[i], p.ends[i], p.steps[i]);
    out[a] = s.len;
    if (s.len > 0) base += s.start * st[a];
    src_st[a] = st[a] * s.step;
  }
  Tensor y(x.dtype(), out);
  size_t esz = elem_size(c, x);
  if (y.numel() > 0)
    copy_strided(y.raw(), contiguous_strides(out), static_cast<const char*>(x.raw()) + base * int64_t(esz), src_st, out, esz);
  return {y};
}

// ---------------------------------------------------------------- Expand
InferResult infer_expand(const InferContext& c) {
  const TensorType& in = c.input(0);
  if (auto target = const_dims(c, 1)) {
    if (!in.has_shape) return infer_one(TensorType::unknown_shape(in.dtype));
    // An unknown target entry against a known input dim d != 1 is d (it must be 1 or d).
    return infer_one(TensorType(in.dtype, broadcast_dims({in.dims, *target}, c)));
  }
  if (auto len = static_length(c, 1); len && in.has_shape) {
    std::vector<Dim> out(size_t(std::max<int64_t>(*len, in.rank())), Dim{});
    for (size_t i = 0; i < in.dims.size(); ++i) {
      const Dim& d = in.dims[i];
      if (d.known() && d.value != 1) out[out.size() - in.dims.size() + i] = d;
    }
    return infer_one(TensorType(in.dtype, out));
  }
  return unknown_rank(in.dtype);
}

std::vector<Tensor> kernel_expand(const KernelContext& c) {
  const Tensor& x = c.input(0);
  Shape target = c.input(1).to_int_vector();
  Shape out;
  try {
    out = broadcast_shapes({x.shape(), target});
  } catch (const Error&) {
    c.error("Expand: cannot expand " + shape_str(x.shape()) + " to " + shape_str(target));
  }
  Tensor y(x.dtype(), out);
  copy_strided(y.raw(), contiguous_strides(out), x.raw(), broadcast_strides(x.shape(), out.size()), out, elem_size(c, x));
  return {y};
}

// ---------------------------------------------------------------- Tile
InferResult infer_tile(const InferContext& c) {
  const TensorType& in = c.input(0);
  if (!in.has_shape) return unknown_rank(in.dtype);
  auto reps = const_dims(c, 1);
  std::vector<Dim> out(in.dims.size(), Dim{});
  if (reps) {
    if (reps->size() != in.dims.size())
      c.error("Tile: repeats has " + std::to_string(reps->size()) + " entries for input " + dims_str(in.dims));
    for (size_t i = 0; i < out.size(); ++i) {
      const Dim &d = in.dims[i], &k = (*reps)[i];
      if (k.known() && k.value == 1) out[i] = d;
      else if (k.known() && k.value == 0) out[i] = Dim(0);
      else if (k.known() && d.known()) out[i] = Dim(d.value * k.value);
      else if (d.known() && d.value == 1) out[i] = k;
    }
  }
  return infer_one(TensorType(in.dtype, out));
}

std::vector<Tensor> kernel_tile(const KernelContext& c) {
  const Tensor& x = c.input(0);
  auto reps = c.input(1).to_int_vector();
  if (int64_t(reps.size()) != x.rank())
    c.error("Tile: repeats has " + std::to_string(reps.size()) + " entries for input " + shape_str(x.shape()));
  // Output [r0*d0, r1*d1, ...] is, row-major, the 2r-D array [r0, d0, r1, d1, ...] whose repeat
  // dims have source stride 0.
  Shape out, view;
  std::vector<int64_t> src_st;
  auto st = contiguous_strides(x.shape());
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (reps[size_t(d)] < 0) c.error("Tile: negative repeat");
    out.push_back(x.dim(d) * reps[size_t(d)]);
    view.push_back(reps[size_t(d)]);
    view.push_back(x.dim(d));
    src_st.push_back(0);
    src_st.push_back(st[size_t(d)]);
  }
  Tensor y(x.dtype(), out);
  copy_strided(y.raw(), contiguous_strides(view), x.raw(), src_st, view, elem_size(c, x));
  return {y};
}

// ---------------------------------------------------------------- Pad
struct PadSpec {
  std::vector<int64_t> begin, end;  // per dim of the input
  std::string mode;
};

template <class GetInts>
std::optional<PadSpec> pad_spec(const Node& n, int64_t opset, int64_t rank, GetInts get) {
  ErrorContext ec{"", 0, 0, n.label(), n.op_type, int(opset)};
  PadSpec p;
  p.mode = n.attrs.get_string("mode", "constant");
  if (p.mode != "constant" && p.mode != "reflect" && p.mode != "edge" && !(p.mode == "wrap" && opset >= 19))
    fail(ErrorKind::Unsupported, "Pad: mode '" + p.mode + "' is not supported at opset " + std::to_string(opset), ec);
  std::vector<int64_t> pads, axes;
  if (opset < 11) {
    pads = n.attrs.get_ints("pads");
  } else {
    auto v = get(1);
    if (!v) return std::nullopt;
    pads = *v;
    if (opset >= 18 && n.inputs.size() > 3 && !n.inputs[3].empty()) {
      auto a = get(3);
      if (!a) return std::nullopt;
      axes = *a;
    }
  }
  if (axes.empty())
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  if (pads.size() != 2 * axes.size())
    fail(ErrorKind::Shape, "Pad: pads has " + std::to_string(pads.size()) + " entries, expected " + std::to_string(2 * axes.size()), ec);
  p.begin.assign(size_t(rank), 0);
  p.end.assign(size_t(rank), 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    size_t a = size_t(normalize_axis(axes[i], rank, n));
    p.begin[a] = pads[i];
    p.end[a] = pads[i + axes.size()];
  }
  return p;
}

InferResult infer_pad(const InferContext& c) {
  const TensorType& in = c.input(0);
  if (!in.has_shape) return unknown_rank(in.dtype);
  auto p = pad_spec(c.node, c.opset, in.rank(), [&](size_t i) { return const_ints(c, i); });
  std::vector<Dim> out = in.dims;
  for (size_t d = 0; d < out.size(); ++d) {
    if (!p) { out[d] = Dim{}; continue; }
    int64_t add = p->begin[d] + p->end[d];
    if (add == 0) continue;
    if (out[d].known()) {
      out[d] = Dim(out[d].value + add);
      if (out[d].value < 0) c.error("Pad: pads make dimension " + std::to_string(d) + " of " + dims_str(in.dims) + " negative");
    } else {
      out[d] = Dim{};
    }
  }
  return infer_one(TensorType(in.dtype, out));
}

}  // namespace

PadSources pad_sources(const Node& n, int64_t opset, const Shape& in, const Tensor* pads, const Tensor* axes) {
  ErrorContext ec{"", 0, 0, n.label(), n.op_type, int(opset)};
  auto p = *pad_spec(n, opset, int64_t(in.size()), [&](size_t i) -> std::optional<std::vector<int64_t>> {
    const Tensor* t = i == 1 ? pads : i == 3 ? axes : nullptr;
    if (!t) fail(ErrorKind::Invalid, "Pad: input " + std::to_string(i) + " is not given", ec);
    return t->to_int_vector();
  });
  PadSources r;
  r.mode = p.mode;
  for (size_t d = 0; d < in.size(); ++d) {
    int64_t n_in = in[d], b = p.begin[d], n_out = n_in + b + p.end[d];
    if (n_out < 0) fail(ErrorKind::Shape, "Pad: pads make dimension " + std::to_string(d) + " of " + shape_str(in) + " negative", ec);
    auto& m = r.src.emplace_back(size_t(n_out));
    for (int64_t o = 0; o < n_out; ++o) {
      int64_t i = o - b;
      if (i < 0 || i >= n_in) {
        if (p.mode == "constant") { m[size_t(o)] = -1; continue; }
        if (n_in == 0) fail(ErrorKind::Shape, "Pad: mode '" + p.mode + "' cannot pad an empty dimension", ec);
        if (p.mode == "edge") i = std::clamp<int64_t>(i, 0, n_in - 1);
        else if (p.mode == "wrap") i = ((i % n_in) + n_in) % n_in;
        else if (n_in == 1) i = 0;
        else {
          // Reflect without repeating the edge, folding as often as the pad needs.
          int64_t period = 2 * (n_in - 1);
          i = ((i % period) + period) % period;
          if (i >= n_in) i = period - i;
        }
      }
      m[size_t(o)] = i;
    }
  }
  return r;
}

namespace {

std::vector<Tensor> kernel_pad(const KernelContext& c) {
  const Tensor& x = c.input(0);
  auto input = [&](size_t i) -> const Tensor* { return c.opset >= 11 && c.has_input(i) ? &c.input(i) : nullptr; };
  PadSources ps = pad_sources(c.node, c.opset, x.shape(), input(1), input(3));
  Tensor fill;
  if (c.opset < 11) fill = Tensor::scalar<float>(c.node.attrs.get_float("value", 0.0f)).cast(x.dtype());
  else if (c.has_input(2) && c.input(2).numel() > 0) fill = c.input(2).dtype() == x.dtype() ? c.input(2) : c.input(2).cast(x.dtype());
  else fill = Tensor(x.dtype(), {});
  Shape out = x.shape();
  auto st = contiguous_strides(x.shape());
  std::vector<std::vector<int64_t>> maps(size_t(x.rank()));
  for (int64_t d = 0; d < x.rank(); ++d) {
    out[size_t(d)] = int64_t(ps.src[size_t(d)].size());
    for (int64_t i : ps.src[size_t(d)]) maps[size_t(d)].push_back(i < 0 ? -1 : i * st[size_t(d)]);
  }
  Tensor y(x.dtype(), out);
  gather_by_dim_maps(y.raw(), x.raw(), out, maps, elem_size(c, x), fill.raw());
  return {y};
}

// ---------------------------------------------------------------- DepthToSpace / SpaceToDepth
int64_t blocksize(const Node& n) {
  int64_t b = n.attrs.get_int("blocksize", 0);
  if (b <= 0) fail(ErrorKind::Model, "blocksize must be positive", {"", 0, 0, n.label(), n.op_type});
  return b;
}

InferResult infer_d2s(const InferContext& c) {
  const TensorType& in = c.input(0);
  int64_t b = blocksize(c.node);
  if (!in.has_shape) return infer_one(TensorType(in.dtype, {Dim{}, Dim{}, Dim{}, Dim{}}));
  if (in.rank() != 4) c.error("DepthToSpace: input must be 4-D, got " + in.str());
  auto& d = in.dims;
  Dim ch;
  if (d[1].known()) {
    if (d[1].value % (b * b)) c.error("DepthToSpace: channels " + std::to_string(d[1].value) + " not divisible by blocksize^2 = " + std::to_string(b * b));
    ch = Dim(d[1].value / (b * b));
  }
  return infer_one(TensorType(in.dtype, {d[0], ch, d[2].known() ? Dim(d[2].value * b) : Dim{}, d[3].known() ? Dim(d[3].value * b) : Dim{}}));
}

std::vector<Tensor> kernel_d2s(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t b = blocksize(c.node);
  if (x.rank() != 4 || x.dim(1) % (b * b)) c.error("DepthToSpace: bad input " + shape_str(x.shape()));
  int64_t N = x.dim(0), C = x.dim(1) / (b * b), H = x.dim(2), W = x.dim(3);
  bool crd = c.opset >= 11 && c.node.attrs.get_string("mode", "DCR") == "CRD";
  // Input viewed as 6-D; output [N, C, H, b1, W, b2] reads it through permuted strides.
  Shape view = crd ? Shape{N, C, b, b, H, W} : Shape{N, b, b, C, H, W};
  auto st = contiguous_strides(view);
  int64_t sN = st[0], sC = crd ? st[1] : st[3], sb1 = crd ? st[2] : st[1], sb2 = crd ? st[3] : st[2], sH = st[4], sW = st[5];
  Shape out6{N, C, H, b, W, b};
  Tensor y(x.dtype(), {N, C, H * b, W * b});
  copy_strided(y.raw(), contiguous_strides(out6), x.raw(), {sN, sC, sH, sb1, sW, sb2}, out6, elem_size(c, x));
  return {y};
}

InferResult infer_s2d(const InferContext& c) {
  const TensorType& in = c.input(0);
  int64_t b = blocksize(c.node);
  if (!in.has_shape) return infer_one(TensorType(in.dtype, {Dim{}, Dim{}, Dim{}, Dim{}}));
  if (in.rank() != 4) c.error("SpaceToDepth: input must be 4-D, got " + in.str());
  auto& d = in.dims;
  for (int k = 2; k < 4; ++k)
    if (d[size_t(k)].known() && d[size_t(k)].value % b)
      c.error("SpaceToDepth: spatial dims of " + in.str() + " not divisible by blocksize " + std::to_string(b));
  return infer_one(TensorType(in.dtype, {d[0], d[1].known() ? Dim(d[1].value * b * b) : Dim{},
                                         d[2].known() ? Dim(d[2].value / b) : Dim{}, d[3].known() ? Dim(d[3].value / b) : Dim{}}));
}

std::vector<Tensor> kernel_s2d(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t b = blocksize(c.node);
  if (x.rank() != 4 || x.dim(2) % b || x.dim(3) % b) c.error("SpaceToDepth: bad input " + shape_str(x.shape()));
  int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2) / b, W = x.dim(3) / b;
  auto st = contiguous_strides({N, C, H, b, W, b});
  Tensor y(x.dtype(), {N, C * b * b, H, W});
  if (c.node.attrs.get_string("mode", "DCR") == "CRD") {
    // The inverse of DepthToSpace CRD (a mode newer opsets added): channel c*b*b + b1*b + b2.
    Shape out6{N, C, b, b, H, W};
    copy_strided(y.raw(), contiguous_strides(out6), x.raw(), {st[0], st[1], st[3], st[5], st[2], st[4]}, out6, elem_size(c, x));
    return {y};
  }
  Shape out6{N, b, b, C, H, W};
  copy_strided(y.raw(), contiguous_strides(out6), x.raw(), {st[0], st[3], st[5], st[1], st[2], st[4]}, out6, elem_size(c, x));
  return {y};
}

// ---------------------------------------------------------------- CenterCropPad
// Each axis of `axes` (all without it) to the size in `shape`: a larger input is cropped around
// its centre (the window starts at floor((in - out) / 2)), a smaller one padded with zeros
// (floor((out - in) / 2) before, the rest after).
std::vector<int64_t> ccp_axes(const Node& n, int64_t rank, size_t count) {
  std::vector<int64_t> axes = n.attrs.get_ints("axes");
  if (axes.empty())
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  if (axes.size() != count)
    fail(ErrorKind::Model, "CenterCropPad: shape has " + std::to_string(count) + " values for " + std::to_string(axes.size()) + " axes",
         {"", 0, 0, n.label(), n.op_type});
  for (auto& a : axes) a = normalize_axis(a, rank, n);
  return axes;
}

InferResult infer_ccp(const InferContext& c) {
  const TensorType& in = c.input(0);
  const Tensor* sh = c.value(1);
  if (!in.has_shape) return infer_one(TensorType::unknown_shape(in.dtype));
  std::vector<Dim> d = in.dims;
  if (!sh) {
    for (int64_t a : c.node.attrs.get_ints("axes")) d[size_t(normalize_axis(a, in.rank(), c.node))] = Dim{};
    if (c.node.attrs.get_ints("axes").empty()) d.assign(d.size(), Dim{});
    return infer_one(TensorType(in.dtype, d));
  }
  const std::vector<int64_t> axes = ccp_axes(c.node, in.rank(), size_t(sh->numel()));
  for (size_t i = 0; i < axes.size(); ++i) {
    if (sh->as_int(int64_t(i)) < 0) c.error("shape values must be non-negative");
    d[size_t(axes[i])] = Dim(sh->as_int(int64_t(i)));
  }
  return infer_one(TensorType(in.dtype, d));
}

std::vector<Tensor> kernel_ccp(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& sh = c.input(1);
  const std::vector<int64_t> axes = ccp_axes(c.node, x.rank(), size_t(sh.numel()));
  Shape out = x.shape();
  std::vector<int64_t> shift(size_t(x.rank()), 0);  // input index = output index + shift
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t want = sh.as_int(int64_t(i)), have = x.dim(axes[i]);
    if (want < 0) c.error("shape values must be non-negative");
    out[size_t(axes[i])] = want;
    shift[size_t(axes[i])] = have >= want ? (have - want) / 2 : -((want - have) / 2);
  }
  Tensor y(x.dtype(), out);  // zero-filled: the padding
  const size_t es = elem_size(c, x);
  const auto xs = contiguous_strides(x.shape()), ys = contiguous_strides(out);
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(y.raw());
  for (int64_t i = 0, n = y.numel(); i < n; ++i) {
    int64_t off = 0, rest = i;
    bool inside = true;
    for (int64_t k = 0; k < x.rank(); ++k) {
      const int64_t at = rest / ys[size_t(k)] + shift[size_t(k)];
      rest %= ys[size_t(k)];
      if (at < 0 || at >= x.dim(k)) inside = false;
      off += at * xs[size_t(k)];
    }
    if (inside) std::memcpy(dst + size_t(i) * es, src + size_t(off) * es, es);
  }
  return {y};
}

// ---------------------------------------------------------------- Compress
InferResult infer_compress(const InferContext& c) {
  const TensorType& in = c.input(0);
  auto axis = c.node.attrs.opt_int("axis");
  std::optional<int64_t> count;
  if (const Tensor* cond = c.value(1)) {
    int64_t k = 0;
    for (int64_t i = 0; i < cond->numel(); ++i) k += cond->as_double(i) != 0;
    count = k;
  }
  Dim n = count ? Dim(*count) : Dim{};
  if (!axis) return infer_one(TensorType(in.dtype, {n}));
  if (!in.has_shape) return unknown_rank(in.dtype);
  std::vector<Dim> out = in.dims;
  out[size_t(normalize_axis(*axis, in.rank(), c.node))] = n;
  return infer_one(TensorType(in.dtype, out));
}

std::vector<Tensor> kernel_compress(const KernelContext& c) {
  Tensor x = c.input(0);
  const Tensor& cond = c.input(1);
  auto axis_attr = c.node.attrs.opt_int("axis");
  if (!axis_attr) x = x.reshaped({x.numel()});
  int64_t axis = normalize_axis(axis_attr.value_or(0), x.rank(), c.node);
  int64_t n = x.dim(axis);
  if (cond.numel() > n) c.error("Compress: condition has " + std::to_string(cond.numel()) + " entries for a dimension of " + std::to_string(n));
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < cond.numel(); ++i)
    if (cond.as_double(i) != 0) keep.push_back(i);
  Shape out = x.shape();
  out[size_t(axis)] = int64_t(keep.size());
  Tensor y(x.dtype(), out);
  size_t esz = elem_size(c, x);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dim(d);
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dim(d);
  const size_t row = size_t(inner) * esz;
  auto* dst = static_cast<char*>(y.raw());
  auto* src = static_cast<const char*>(x.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k : keep) {
      std::memcpy(dst, src + (o * n + k) * int64_t(row), row);
      dst += row;
    }
  return {y};
}

// ---------------------------------------------------------------- ReverseSequence
std::vector<Tensor> kernel_revseq(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& lens = c.input(1);
  int64_t batch_axis = c.node.attrs.get_int("batch_axis", 1), time_axis = c.node.attrs.get_int("time_axis", 0);
  if (x.rank() < 2 || !((batch_axis == 0 && time_axis == 1) || (batch_axis == 1 && time_axis == 0)))
    c.error("ReverseSequence: needs rank >= 2 and batch/time axes 0 and 1");
  int64_t B = x.dim(batch_axis), T = x.dim(time_axis);
  if (lens.numel() != B) c.error("ReverseSequence: sequence_lens has " + std::to_string(lens.numel()) + " entries for batch " + std::to_string(B));
  auto st = contiguous_strides(x.shape());
  int64_t sb = st[size_t(batch_axis)], stt = st[size_t(time_axis)];
  size_t esz = elem_size(c, x);
  const size_t block = size_t(st[1]) * esz;  // elements after the first two dims
  Tensor y(x.dtype(), x.shape());
  auto* dst = static_cast<char*>(y.raw());
  auto* src = static_cast<const char*>(x.raw());
  for (int64_t b = 0; b < B; ++b) {
    int64_t len = index_at(lens, b);
    if (len < 0 || len > T) c.error("ReverseSequence: sequence length " + std::to_string(len) + " out of range [0, " + std::to_string(T) + "]");
    for (int64_t t = 0; t < T; ++t) {
      int64_t from = t < len ? len - 1 - t : t;
      std::memcpy(dst + (b * sb + t * stt) * int64_t(esz), src + (b * sb + from * stt) * int64_t(esz), block);
    }
  }
  return {y};
}

}  // namespace

void register_tensor_move_ops(OpRegistry& r) {
  auto add = [&](const char* name, int since, MappingType m, int min_in, int max_in, InferFn inf, KernelFn k,
                 int min_out = 1, int max_out = 1) {
    r.add(data_movement_schema(name, since, m, min_in, max_in, std::move(inf), std::move(k), min_out, max_out));
  };
  add("Transpose", 1, MappingType::Shuffle, 1, 1, infer_transpose, kernel_transpose);
  add("Concat", 1, MappingType::Reorganize, 1, -1, infer_concat, kernel_concat);
  add("Split", 2, MappingType::Reorganize, 1, 2, infer_split, kernel_split, 1, -1);
  add("Slice", 1, MappingType::Reorganize, 1, 5, infer_slice, kernel_slice);
  add("Expand", 8, MappingType::OneToMany, 2, 2, infer_expand, kernel_expand);
  add("Tile", 6, MappingType::OneToMany, 2, 2, infer_tile, kernel_tile);
  add("Pad", 2, MappingType::Reorganize, 1, 4, infer_pad, kernel_pad);
  add("DepthToSpace", 1, MappingType::Shuffle, 1, 1, infer_d2s, kernel_d2s);
  add("SpaceToDepth", 1, MappingType::Shuffle, 1, 1, infer_s2d, kernel_s2d);
  add("Compress", 9, MappingType::ManyToMany, 2, 2, infer_compress, kernel_compress);
  add("CenterCropPad", 18, MappingType::Reorganize, 2, 2, infer_ccp, kernel_ccp);
  add("ReverseSequence", 10, MappingType::ManyToMany, 2, 2, [](const InferContext& c) { return infer_same_as(c); }, kernel_revseq);
}

}  // namespace nnfuse::tensor_ops
