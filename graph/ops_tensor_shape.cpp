// Shape-level ops: Constant, Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, ConstantOfShape,
// Range, EyeLike, Trilu. Their inference propagates symbolic shape data (dim_values) so that the
// Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains framework exporters emit resolve with a
// symbolic batch dim.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "graph/ops_tensor_util.h"

namespace nnfuse::tensor_ops {

namespace {

// ---------------------------------------------------------------- Constant
Tensor constant_tensor(const Node& n, int64_t opset) {
  ErrorContext ec{"", 0, 0, n.label(), n.op_type, int(opset)};
  const Attributes& a = n.attrs;
  if (auto* v = a.find("value")) {
    if (v->kind != Attribute::Kind::Tensor) fail(ErrorKind::Model, "attribute 'value' must be a tensor", ec);
    return v->t;
  }
  if (auto* v = a.find("value_float")) return Tensor::scalar<float>(v->f);
  if (auto* v = a.find("value_floats")) return Tensor::from_vector<float>({int64_t(v->floats.size())}, v->floats);
  if (auto* v = a.find("value_int")) return Tensor::scalar<int64_t>(v->i);
  if (auto* v = a.find("value_ints")) return Tensor::from_vector<int64_t>({int64_t(v->ints.size())}, v->ints);
  if (a.has("value_string") || a.has("value_strings"))
    fail(ErrorKind::Unsupported, "string constants are not supported", ec);
  if (a.has("sparse_value")) fail(ErrorKind::Unsupported, "sparse constants are not supported", ec);
  fail(ErrorKind::Model, "Constant has none of the attributes value, value_float(s), value_int(s)", ec);
}

InferResult infer_constant(const InferContext& c) {
  Tensor t = constant_tensor(c.node, c.opset);
  InferResult r = infer_one(TensorType::of(t.dtype(), t.shape()));
  if (dtype_is_integer(t.dtype()) && t.rank() <= 1 && t.numel() <= 64) r.dim_values.push_back(dims_of(t.to_int_vector()));
  return r;
}

// ---------------------------------------------------------------- Shape / Size
std::pair<int64_t, int64_t> shape_range(const Node& n, int64_t opset, int64_t rank) {
  int64_t start = 0, end = rank;
  if (opset >= 15) {
    start = n.attrs.get_int("start", 0);
    end = n.attrs.get_int("end", rank);
  }
  auto clampi = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t(0), rank); };
  start = clampi(start);
  end = clampi(end);
  return {start, std::max(start, end)};
}

InferResult infer_shape(const InferContext& c) {
  const TensorType& in = c.input(0);
  if (!in.has_shape) return infer_one(TensorType(DType::Int64, {Dim{}}));
  auto [s, e] = shape_range(c.node, c.opset, in.rank());
  std::vector<Dim> dims(in.dims.begin() + s, in.dims.begin() + e);
  InferResult r = infer_one(TensorType(DType::Int64, {Dim(e - s)}));
  r.dim_values.push_back(dims);
  return r;
}

std::vector<Tensor> kernel_shape(const KernelContext& c) {
  const Tensor& x = c.input(0);
  auto [s, e] = shape_range(c.node, c.opset, x.rank());
  std::vector<int64_t> v(x.shape().begin() + s, x.shape().begin() + e);
  return {Tensor::from_vector<int64_t>({int64_t(v.size())}, v)};
}

InferResult infer_size(const InferContext& c) {
  const TensorType& in = c.input(0);
  InferResult r = infer_one(TensorType(DType::Int64, {}));
  if (in.has_shape) r.dim_values.push_back(std::vector<Dim>{dims_product(in.dims, 0, in.dims.size())});
  return r;
}

// ---------------------------------------------------------------- Reshape
InferResult infer_reshape(const InferContext& c) {
  const TensorType& in = c.input(0);
  bool allowzero = c.opset >= 14 && c.node.attrs.get_int("allowzero", 0) != 0;
  std::vector<Dim> target;
  std::vector<bool> minus_one;  // literal -1 entries (to be inferred)
  if (auto v = c.value(1)) {
    for (int64_t x : v->to_int_vector()) {
      if (x < -1) c.error("Reshape: invalid target dimension " + std::to_string(x));
      target.push_back(x == -1 ? Dim{} : Dim(x));
      minus_one.push_back(x == -1);
    }
  } else if (auto& dv = c.dims_of_value(1)) {
    target = *dv;
    // Symbolic data cannot tell a literal -1 (Concat of a batch symbol and a constant -1) from an
    // unknown dim: both read as an anonymous unknown. When there is exactly one, solving it from
    // the element count is right either way, since the product of the target must match.
    minus_one.assign(target.size(), false);
    size_t anon = 0, at = 0;
    for (size_t i = 0; i < target.size(); ++i)
      if (!target[i].known() && target[i].symbol.empty()) { ++anon; at = i; }
    if (anon == 1) minus_one[at] = true;
  } else if (auto len = static_length(c, 1)) {
    return infer_one(TensorType(c.input(0).dtype, std::vector<Dim>(size_t(*len), Dim{})));
  } else {
    return unknown_rank(in.dtype);
  }
  if (std::count(minus_one.begin(), minus_one.end(), true) > 1) c.error("Reshape: target has more than one -1");
  // 0 copies the input dim.
  for (size_t i = 0; i < target.size(); ++i) {
    if (minus_one[i] || !target[i].known() || target[i].value != 0 || allowzero) continue;
    if (!in.has_shape) { target[i] = Dim{}; continue; }
    if (i >= in.dims.size())
      c.error("Reshape: target dimension " + std::to_string(i) + " is 0 (copy) but the input " + dims_str(in.dims) +
              " has rank " + std::to_string(in.dims.size()));
    target[i] = in.dims[i];
  }
  // A fuzzed target of rank 32769 made a 64 KB message: past 32 dims, the first 32 and the count.
  auto target_str = [&] {
    constexpr size_t kShown = 32;
    std::string s = "[";
    for (size_t i = 0; i < std::min(target.size(), kShown); ++i)
      s += (i ? "," : "") + (minus_one[i] ? std::string("-1") : target[i].str());
    if (target.size() > kShown) s += ",... (" + std::to_string(target.size()) + " dims)";
    return s + "]";
  };
  if (!in.has_shape) return infer_one(TensorType(in.dtype, target));
  // Cancel: input = Pin * syms_in, output (without the -1) = Pout * syms_out.
  int64_t pin = 1, pout = 1;
  bool anon = false;
  std::multiset<std::string> sin, sout;
  // Products of static dims past 2^63 are no shape (a fuzzed file had [805306365, 68719476735]).
  // The message is built only on overflow: built per dim, a fuzzed target of rank 32769 spent
  // minutes formatting it (rank^2 characters).
  auto times = [&](int64_t& acc, int64_t v, const auto& what) {
    if (__builtin_mul_overflow(acc, v, &acc)) c.error("Reshape: " + what() + " has more than 2^63 elements");
  };
  for (auto& d : in.dims) {
    if (d.known()) times(pin, d.value, [&] { return "the input " + dims_str(in.dims); });
    else if (d.symbol.empty()) anon = true;
    else sin.insert(d.symbol);
  }
  for (size_t i = 0; i < target.size(); ++i) {
    if (minus_one[i]) continue;
    auto& d = target[i];
    if (d.known()) times(pout, d.value, [&] { return "the target shape " + target_str(); });
    else if (d.symbol.empty()) anon = true;
    else sout.insert(d.symbol);
  }
  for (auto it = sout.begin(); it != sout.end();) {
    auto f = sin.find(*it);
    if (f != sin.end()) { sin.erase(f); it = sout.erase(it); }
    else ++it;
  }
  auto in_numel = [&] { return std::to_string(pin); };
  auto mi = std::find(minus_one.begin(), minus_one.end(), true);
  if (mi != minus_one.end()) {
    size_t at = size_t(mi - minus_one.begin());
    Dim solved;
    if (!anon && sout.empty()) {
      if (sin.empty()) {
        if (pout == 0) {
          if (pin != 0) c.error("Reshape: cannot reshape " + dims_str(in.dims) + " (" + in_numel() + " elements) to " + target_str());
          solved = Dim(0);
        } else {
          if (pin % pout != 0)
            c.error("Reshape: cannot reshape " + dims_str(in.dims) + " (" + in_numel() + " elements) to " + target_str());
          solved = Dim(pin / pout);
        }
      } else if (sin.size() == 1 && pin == pout) {
        solved = Dim::sym(*sin.begin());
      }
    }
    target[at] = solved;
  } else if (!anon && sin.empty() && sout.empty() && pin != pout) {
    c.error("Reshape: cannot reshape " + dims_str(in.dims) + " (" + in_numel() + " elements) to " + target_str());
  }
  return infer_one(TensorType(in.dtype, target));
}

Shape reshape_target(const KernelContext& c, const Shape& in, const std::vector<int64_t>& t, bool allowzero) {
  Shape out(t.begin(), t.end());
  int at = -1;
  int64_t p = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0 && !allowzero) {
      if (i >= in.size()) c.error("Reshape: target copies dimension " + std::to_string(i) + " of " + shape_str(in));
      out[i] = in[i];
    }
    if (out[i] == -1) {
      if (at >= 0) c.error("Reshape: target " + shape_str(t) + " has more than one -1");
      at = int(i);
      continue;
    }
    if (out[i] < 0) c.error("Reshape: invalid target " + shape_str(t));
    p *= out[i];
  }
  int64_t n = shape_numel(in);
  if (at >= 0) {
    if (p == 0 || n % p != 0)
      c.error("Reshape: cannot reshape " + shape_str(in) + " (" + std::to_string(n) + " elements) to " + shape_str(t));
    out[size_t(at)] = n / p;
  } else if (p != n) {
    c.error("Reshape: cannot reshape " + shape_str(in) + " (" + std::to_string(n) + " elements) to " + shape_str(t));
  }
  return out;
}

std::vector<Tensor> kernel_reshape(const KernelContext& c) {
  const Tensor& x = c.input(0);
  bool allowzero = c.opset >= 14 && c.node.attrs.get_int("allowzero", 0) != 0;
  return {x.reshaped(reshape_target(c, x.shape(), c.input(1).to_int_vector(), allowzero))};
}

// ---------------------------------------------------------------- Flatten
int64_t flatten_axis(const Node& n, int64_t rank) {
  int64_t a = n.attrs.get_int("axis", 1);
  int64_t r = a < 0 ? a + rank : a;
  if (r < 0 || r > rank)
    fail(ErrorKind::Shape, "Flatten: axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank),
         {"", 0, 0, n.label(), n.op_type});
  return r;
}

InferResult infer_flatten(const InferContext& c) {
  const TensorType& in = c.input(0);
  if (!in.has_shape) return infer_one(TensorType(in.dtype, {Dim{}, Dim{}}));
  int64_t a = flatten_axis(c.node, in.rank());
  return infer_one(TensorType(in.dtype, {dims_product(in.dims, 0, size_t(a)), dims_product(in.dims, size_t(a), in.dims.size())}));
}

std::vector<Tensor> kernel_flatten(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t a = flatten_axis(c.node, x.rank());
  int64_t outer = 1;
  for (int64_t i = 0; i < a; ++i) outer *= x.dim(i);
  int64_t inner = 1;
  for (int64_t i = a; i < x.rank(); ++i) inner *= x.dim(i);
  return {x.reshaped({outer, inner})};
}

// ---------------------------------------------------------------- Squeeze / Unsqueeze
std::vector<int64_t> norm_axes(std::vector<int64_t> axes, int64_t rank, const Node& n) {
  for (auto& a : axes) a = normalize_axis(a, rank, n);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    fail(ErrorKind::Shape, "axes contain a repeated axis", {"", 0, 0, n.label(), n.op_type});
  return axes;
}

InferResult infer_squeeze(const InferContext& c) {
  const TensorType& in = c.input(0);
  bool present = false;
  auto axes = axes_attr_or_input(c, "axes", 1, 13, &present);
  if (!in.has_shape) return unknown_rank(in.dtype);
  std::vector<Dim> out;
  if (!axes) {
    // Axes not known: dims known to be > 1 stay; the rank is unknown unless the axes count is.
    if (auto len = static_length(c, 1)) {
      return infer_one(TensorType(in.dtype, std::vector<Dim>(size_t(std::max<int64_t>(0, in.rank() - *len)), Dim{})));
    }
    return unknown_rank(in.dtype);
  }
  if (!present) {
    for (auto& d : in.dims) {
      if (!d.known()) return unknown_rank(in.dtype);  // might be 1
      if (d.value != 1) out.push_back(d);
    }
  } else {
    auto ax = norm_axes(*axes, in.rank(), c.node);
    for (int64_t i = 0; i < in.rank(); ++i) {
      if (std::binary_search(ax.begin(), ax.end(), i)) {
        const Dim& d = in.dims[size_t(i)];
        if (d.known() && d.value != 1)
          c.error("Squeeze: axis " + std::to_string(i) + " of " + dims_str(in.dims) + " has size " + std::to_string(d.value) + ", not 1");
        continue;
      }
      out.push_back(in.dims[size_t(i)]);
    }
  }
  InferResult r = infer_one(TensorType(in.dtype, out));
  if (out.size() <= 1 && in.rank() <= 1)
    if (auto& dv = c.dims_of_value(0)) r.dim_values.push_back(*dv);
  return r;
}

std::vector<Tensor> kernel_squeeze(const KernelContext& c) {
  const Tensor& x = c.input(0);
  bool present = false;
  auto axes = *kernel_ints_attr_or_input(c, "axes", 1, 13, &present);
  Shape out;
  if (!present) {
    for (auto d : x.shape())
      if (d != 1) out.push_back(d);
  } else {
    auto ax = norm_axes(axes, x.rank(), c.node);
    for (int64_t i = 0; i < x.rank(); ++i) {
      if (std::binary_search(ax.begin(), ax.end(), i)) {
        if (x.dim(i) != 1) c.error("Squeeze: axis " + std::to_string(i) + " of " + shape_str(x.shape()) + " is not 1");
        continue;
      }
      out.push_back(x.dim(i));
    }
  }
  return {x.reshaped(out)};
}

InferResult infer_unsqueeze(const InferContext& c) {
  const TensorType& in = c.input(0);
  bool present = false;
  auto axes = axes_attr_or_input(c, "axes", 1, 13, &present);
  if (!present) c.error("Unsqueeze: axes are required");
  if (!in.has_shape) return unknown_rank(in.dtype);
  if (!axes) {
    if (auto len = static_length(c, 1)) return infer_one(TensorType(in.dtype, std::vector<Dim>(size_t(in.rank() + *len), Dim{})));
    return unknown_rank(in.dtype);
  }
  int64_t rank = in.rank() + int64_t(axes->size());
  auto ax = norm_axes(*axes, rank, c.node);
  std::vector<Dim> out;
  size_t k = 0;
  for (int64_t i = 0; i < rank; ++i) {
    if (std::binary_search(ax.begin(), ax.end(), i)) out.push_back(Dim(1));
    else out.push_back(in.dims[k++]);
  }
  InferResult r = infer_one(TensorType(in.dtype, out));
  if (out.size() <= 1)
    if (auto& dv = c.dims_of_value(0)) r.dim_values.push_back(*dv);
  return r;
}

std::vector<Tensor> kernel_unsqueeze(const KernelContext& c) {
  const Tensor& x = c.input(0);
  bool present = false;
  auto axes = *kernel_ints_attr_or_input(c, "axes", 1, 13, &present);
  int64_t rank = x.rank() + int64_t(axes.size());
  auto ax = norm_axes(axes, rank, c.node);
  Shape out;
  size_t k = 0;
  for (int64_t i = 0; i < rank; ++i) out.push_back(std::binary_search(ax.begin(), ax.end(), i) ? 1 : x.shape()[k++]);
  return {x.reshaped(out)};
}

// ---------------------------------------------------------------- ConstantOfShape
Tensor cos_value(const Node& n) {
  if (auto* a = n.attrs.find("value")) {
    if (a->kind != Attribute::Kind::Tensor || a->t.numel() != 1)
      fail(ErrorKind::Model, "ConstantOfShape: 'value' must be a one-element tensor", {"", 0, 0, n.label(), n.op_type});
    return a->t;
  }
  return Tensor::scalar<float>(0.0f);
}

InferResult infer_cos(const InferContext& c) {
  DType t = cos_value(c.node).dtype();
  if (auto dims = const_dims(c, 0)) {
    for (auto& d : *dims)
      if (d.known() && d.value < 0) c.error("ConstantOfShape: negative dimension in " + dims_str(*dims));
    return infer_one(TensorType(t, *dims));
  }
  if (auto len = static_length(c, 0)) return infer_one(TensorType(t, std::vector<Dim>(size_t(*len), Dim{})));
  return unknown_rank(t);
}

std::vector<Tensor> kernel_cos(const KernelContext& c) {
  Tensor v = cos_value(c.node);
  Shape s = c.input(0).to_int_vector();
  for (auto d : s)
    if (d < 0) c.error("ConstantOfShape: negative dimension in " + shape_str(s));
  Tensor out(v.dtype(), s);
  size_t esz = elem_size(c, v);
  auto* p = static_cast<char*>(out.raw());
  bool zero = true;
  for (size_t b = 0; b < esz; ++b) zero &= static_cast<const char*>(v.raw())[b] == 0;
  if (!zero)
    for (int64_t i = 0; i < out.numel(); ++i) copy_elem(p + i * int64_t(esz), v.raw(), esz);
  return {out};
}

// ---------------------------------------------------------------- Range
InferResult infer_range(const InferContext& c) {
  DType t = c.input(0).dtype;
  for (size_t i = 0; i < 3; ++i) {
    const TensorType& in = c.input(i);
    // Scalars by the spec; a one-element tensor (or one whose size is not known here, as an If
    // merging branches may leave it) is accepted, as the kernel reads element 0.
    auto n = in.numel();
    if (in.has_shape && n && *n != 1) c.error("Range: input " + std::to_string(i) + " must be a scalar, got " + in.str());
  }
  const Tensor *s = c.value(0), *l = c.value(1), *d = c.value(2);
  if (s && l && d) {
    double delta = d->as_double();
    if (delta == 0) c.error("Range: delta is 0");
    double n = std::ceil((l->as_double() - s->as_double()) / delta);
    return infer_one(TensorType(t, {Dim(std::max<int64_t>(0, int64_t(n)))}));
  }
  // Range(0, N, 1) over a symbolic N (a Shape entry) has length N.
  auto start = const_ints(c, 0), delta = const_ints(c, 2);
  auto limit = const_dims(c, 1);
  if (dtype_is_integer(t) && start && delta && limit && start->size() == 1 && delta->size() == 1 && limit->size() == 1 &&
      (*start)[0] == 0 && (*delta)[0] == 1)
    return infer_one(TensorType(t, {(*limit)[0]}));
  return infer_one(TensorType(t, {Dim{}}));
}

std::vector<Tensor> kernel_range(const KernelContext& c) {
  const Tensor &s = c.input(0), &l = c.input(1), &d = c.input(2);
  for (size_t i = 0; i < 3; ++i)
    if (c.input(i).numel() != 1) c.error("Range: input " + std::to_string(i) + " must be a scalar, got " + shape_str(c.input(i).shape()));
  return dispatch_dtype(s.dtype(), [&](auto tag) -> std::vector<Tensor> {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      c.unsupported("Range on bool");
    } else {
      double start = s.as_double(), limit = l.as_double(), delta = d.as_double();
      if (delta == 0) c.error("Range: delta is 0");
      // The count in double first: a NaN or a count past int64 (float inputs of 1e32) has no
      // integer value (converting it was undefined behaviour: found by fuzz_model).
      const double count = std::ceil((limit - start) / delta);
      if (std::isnan(count)) c.error("Range: the element count (" + std::to_string(limit) + " - " + std::to_string(start) + ") / " + std::to_string(delta) + " is not a number");
      if (count >= 9223372036854775808.0) c.error("Range: " + std::to_string(count) + " elements is more than 2^63");
      int64_t n = std::max<int64_t>(0, int64_t(count));
      Tensor out(s.dtype(), {n});
      T* p = out.data<T>();
      if constexpr (std::is_integral_v<T>) {
        int64_t st = s.as_int(), de = d.as_int();
        for (int64_t i = 0; i < n; ++i) p[i] = T(st + i * de);
      } else {
        for (int64_t i = 0; i < n; ++i) p[i] = from_double<T>(start + double(i) * delta);
      }
      return {out};
    }
  });
}

// ---------------------------------------------------------------- EyeLike / Trilu
DType eyelike_dtype(const Node& n, DType in) {
  if (auto d = n.attrs.opt_int("dtype")) return DType(*d);
  return in;
}

InferResult infer_eyelike(const InferContext& c) {
  const TensorType& in = c.input(0);
  if (in.has_shape && in.rank() != 2) c.error("EyeLike: input must be 2-D, got " + in.str());
  TensorType t = in;
  t.dtype = eyelike_dtype(c.node, in.dtype);
  if (!t.has_shape) t = TensorType(t.dtype, {Dim{}, Dim{}});
  return infer_one(t);
}

std::vector<Tensor> kernel_eyelike(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (x.rank() != 2) c.error("EyeLike: input must be 2-D, got " + shape_str(x.shape()));
  DType t = eyelike_dtype(c.node, x.dtype());
  int64_t k = c.node.attrs.get_int("k", 0);
  Tensor out(t, x.shape());
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = out.data<T>();
    int64_t rows = x.dim(0), cols = x.dim(1);
    for (int64_t i = 0; i < rows; ++i) {
      int64_t j = i + k;
      if (j >= 0 && j < cols) p[i * cols + j] = from_double<T>(1.0);
    }
  });
  return {out};
}

InferResult infer_trilu(const InferContext& c) {
  const TensorType& in = c.input(0);
  if (in.has_shape && in.rank() < 2) c.error("Trilu: input must have rank >= 2, got " + in.str());
  return infer_same_as(c);
}

std::vector<Tensor> kernel_trilu(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (x.rank() < 2) c.error("Trilu: input must have rank >= 2, got " + shape_str(x.shape()));
  int64_t k = c.has_input(1) ? c.input(1).as_int() : 0;
  bool upper = c.node.attrs.get_int("upper", 1) != 0;
  Tensor out(x.dtype(), x.shape());  // zero-initialised
  size_t esz = elem_size(c, x);
  int64_t rows = x.dim(-2), cols = x.dim(-1), mats = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
  auto* dst = static_cast<char*>(out.raw());
  auto* src = static_cast<const char*>(x.raw());
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t i = 0; i < rows; ++i) {
      // upper keeps j >= i + k, lower keeps j <= i + k: one contiguous run per row.
      int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, cols) : 0;
      int64_t hi = upper ? cols : std::clamp<int64_t>(i + k + 1, 0, cols);
      if (hi <= lo) continue;
      int64_t off = (m * rows + i) * cols + lo;
      std::memcpy(dst + off * int64_t(esz), src + off * int64_t(esz), size_t(hi - lo) * esz);
    }
  return {out};
}

}  // namespace

void register_tensor_shape_ops(OpRegistry& r) {
  auto base = [](const char* name, int since, MappingType m) {
    OpSchema s;
    s.name = name;
    s.since = since;
    s.mapping = m;
    s.family = "tensor";
    return s;
  };
  {
    auto s = base("Constant", 1, MappingType::ManyToMany);
    s.min_inputs = s.max_inputs = 0;
    s.infer = infer_constant;
    s.kernel = [](const KernelContext& c) { return std::vector<Tensor>{constant_tensor(c.node, c.opset)}; };
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("Shape", 1, MappingType::ManyToMany);
    s.infer = infer_shape;
    s.kernel = kernel_shape;
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("Size", 1, MappingType::ManyToMany);
    s.infer = infer_size;
    s.kernel = [](const KernelContext& c) { return std::vector<Tensor>{Tensor::scalar<int64_t>(c.input(0).numel())}; };
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("Reshape", 5, MappingType::Reorganize);
    s.min_inputs = s.max_inputs = 2;
    s.infer = infer_reshape;
    s.kernel = kernel_reshape;
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("Flatten", 1, MappingType::Reorganize);
    s.infer = infer_flatten;
    s.kernel = kernel_flatten;
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("Squeeze", 1, MappingType::Reorganize);
    s.max_inputs = 2;
    s.infer = infer_squeeze;
    s.kernel = kernel_squeeze;
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("Unsqueeze", 1, MappingType::Reorganize);
    s.max_inputs = 2;
    s.infer = infer_unsqueeze;
    s.kernel = kernel_unsqueeze;
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("ConstantOfShape", 9, MappingType::ManyToMany);
    s.infer = infer_cos;
    s.kernel = kernel_cos;
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("Range", 11, MappingType::ManyToMany);
    s.min_inputs = s.max_inputs = 3;
    s.infer = infer_range;
    s.kernel = kernel_range;
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("EyeLike", 9, MappingType::ManyToMany);
    s.infer = infer_eyelike;
    s.kernel = kernel_eyelike;
    s.flops = zero_flops;
    r.add(std::move(s));
  }
  {
    auto s = base("Trilu", 14, MappingType::OneToOne);
    s.max_inputs = 2;
    s.infer = infer_trilu;
    s.kernel = kernel_trilu;
    s.flops = zero_flops;
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::tensor_ops
