#pragma once
// Internals shared by the elementwise op files (ops_elementwise*.cpp): the dtype classes an op
// accepts, the compute type of narrow floats, a broadcast loop that hands kernels contiguous runs,
// and the inference helpers (broadcast shapes, dtype checks, symbolic dim values).
// Not a public header: only the ops_elementwise*.cpp files include it.
#include <array>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "graph/ops_common.h"

namespace nnfuse::ew {

// ---- dtype classes -------------------------------------------------------------------------
// A bit mask of the element classes an op accepts. Kernels test it at compile time so that an op
// is only instantiated for the C++ types it makes sense for (no std::sin(bool)).
enum : unsigned {
  kFloat = 1u,     // float16, bfloat16, float32, float64
  kSigned = 2u,    // int8..int64
  kUnsigned = 4u,  // uint8..uint64
  kBool = 8u,
  kInt = kSigned | kUnsigned,
  kNum = kFloat | kInt,
  kSignedNum = kFloat | kSigned,
  kAny = kNum | kBool,
};

template <class T>
constexpr unsigned class_of() {
  if constexpr (std::is_same_v<T, bool>) return kBool;
  else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16> || std::is_floating_point_v<T>) return kFloat;
  else if constexpr (std::is_signed_v<T>) return kSigned;
  else return kUnsigned;
}
template <unsigned Mask, class T>
constexpr bool accepts() { return (Mask & class_of<T>()) != 0; }

inline unsigned class_of(DType t) {
  if (t == DType::Bool) return kBool;
  if (dtype_is_float(t)) return kFloat;
  if (dtype_is_integer(t)) return dtype_is_signed(t) ? kSigned : kUnsigned;
  return 0;
}
inline bool accepts(unsigned mask, DType t) { return (mask & class_of(t)) != 0; }
std::string mask_str(unsigned mask);  // "float, signed int" (for error messages)

// ---- compute types -------------------------------------------------------------------------
// float16 and bfloat16 are computed in float; every other type in itself.
template <class T> struct ComputeOf { using type = T; };
template <> struct ComputeOf<Half> { using type = float; };
template <> struct ComputeOf<BFloat16> { using type = float; };
template <class T> using compute_t = typename ComputeOf<T>::type;

template <class T>
inline compute_t<T> load(T v) {
  if constexpr (std::is_same_v<T, Half>) return half_to_float(v.bits);
  else if constexpr (std::is_same_v<T, BFloat16>) return bf16_to_float(v.bits);
  else return v;
}
template <class T, class C>
inline T store(C v) {
  if constexpr (std::is_same_v<T, Half>) return Half{float_to_half(float(v))};
  else if constexpr (std::is_same_v<T, BFloat16>) return BFloat16{float_to_bf16(float(v))};
  else if constexpr (std::is_same_v<T, bool>) return v != C(0);
  else return static_cast<T>(v);
}

// ---- errors naming the node ----------------------------------------------------------------
inline ErrorContext node_ctx(const Node& n, int64_t opset) { return {"", 0, 0, n.label(), n.op_type, int(opset)}; }
[[noreturn]] void unsupported_dtype(const Node& n, int64_t opset, DType t, const std::string& role, unsigned mask);

// ---- broadcast loop ------------------------------------------------------------------------
// Calls f(out_offset, in_offsets, in_strides, n) for runs of n consecutive output elements, where
// input k's elements are at in_offsets[k] + i * in_strides[k] (i < n). Adjacent dims that every
// input walks contiguously (or all broadcast) are merged first, so an equal-shape op is a single
// run and a bias add over [N,C,H,W] + [C,1,1] is runs of H*W. Inner strides are 0 or 1.
template <size_t K, class F>
void for_each_run(const Shape& out, const std::array<const Shape*, K>& ins, F&& f) {
  const int64_t total = shape_numel(out);
  if (total == 0) return;
  const size_t r = out.size();
  std::array<std::vector<int64_t>, K> st;
  for (size_t k = 0; k < K; ++k) st[k] = broadcast_strides(*ins[k], r);
  std::vector<int64_t> dims;
  std::array<std::vector<int64_t>, K> rst;
  for (size_t d = 0; d < r; ++d) {
    if (out[d] == 1) continue;
    if (!dims.empty()) {
      bool merge = true;
      for (size_t k = 0; k < K; ++k) merge &= rst[k].back() == st[k][d] * out[d];
      if (merge) {
        dims.back() *= out[d];
        for (size_t k = 0; k < K; ++k) rst[k].back() = st[k][d];
        continue;
      }
    }
    dims.push_back(out[d]);
    for (size_t k = 0; k < K; ++k) rst[k].push_back(st[k][d]);
  }
  if (dims.empty()) {
    dims.push_back(1);
    for (size_t k = 0; k < K; ++k) rst[k].push_back(0);
  }
  const size_t m = dims.size() - 1;
  const int64_t inner = dims[m];
  std::array<int64_t, K> inner_stride{}, off{};
  for (size_t k = 0; k < K; ++k) inner_stride[k] = rst[k][m];
  std::vector<int64_t> idx(m, 0);
  const int64_t outer = total / inner;
  for (int64_t o = 0; o < outer; ++o) {
    f(o * inner, off, inner_stride, inner);
    for (size_t d = m; d-- > 0;) {
      ++idx[d];
      for (size_t k = 0; k < K; ++k) off[k] += rst[k][d];
      if (idx[d] < dims[d]) break;
      for (size_t k = 0; k < K; ++k) off[k] -= rst[k][d] * dims[d];
      idx[d] = 0;
    }
  }
}

// z = f(x, y) elementwise with broadcasting into `out` (already shaped as the broadcast result).
// f takes the stored element types and returns the stored output type. `out` may alias `a` when
// a has the output's shape (used by the variadic folds).
template <class TA, class TB, class TO, class F>
void apply2(const Tensor& a, const Tensor& b, Tensor& out, F&& f) {
  const TA* pa = a.data<TA>();
  const TB* pb = b.data<TB>();
  TO* po = out.data<TO>();
  for_each_run<2>(out.shape(), {&a.shape(), &b.shape()},
                  [&](int64_t o, const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& st, int64_t n) {
                    const TA* x = pa + off[0];
                    const TB* y = pb + off[1];
                    TO* z = po + o;
                    if (st[0] == 1 && st[1] == 1) {
                      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], y[i]);
                    } else if (st[0] == 1 && st[1] == 0) {
                      const TB yv = *y;
                      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], yv);
                    } else if (st[0] == 0 && st[1] == 1) {
                      const TA xv = *x;
                      for (int64_t i = 0; i < n; ++i) z[i] = f(xv, y[i]);
                    } else {
                      for (int64_t i = 0; i < n; ++i) z[i] = f(x[i * st[0]], y[i * st[1]]);
                    }
                  });
}

// The broadcast output shape of kernel inputs; a mismatch is a Shape error naming the node.
Shape kernel_broadcast(const KernelContext& c, const std::vector<const Tensor*>& ins);

// ---- inference helpers ---------------------------------------------------------------------
// The broadcast type of the present inputs (unknown rank if any input's rank is unknown).
TensorType broadcast_type(const InferContext& c, DType out_dtype);
// All present inputs in [first, last) must share one dtype (Undefined ones are skipped); returns it.
DType common_dtype(const InferContext& c, size_t first = 0, size_t last = size_t(-1));
// Unsupported error naming the node unless `t` (when known) is in `mask`.
void check_dtype(const InferContext& c, DType t, unsigned mask, const std::string& role = "input");

// One-to-One when every present input has the output's shape (or shapes are unknown), else
// One-to-Many (an input is broadcast).
MappingType broadcast_mapping(const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs);

// An element of a small int tensor during shape inference: an exact value (possibly negative,
// from a constant) or a dim (known size, or a symbol).
struct SymInt {
  std::optional<int64_t> value;
  std::string symbol;  // when value is empty: a named dim, or "" if nothing is known
  static SymInt of(int64_t v) { SymInt s; s.value = v; return s; }
  static SymInt of(const Dim& d) {
    SymInt s;
    if (d.known()) s.value = d.value;
    else s.symbol = d.symbol;
    return s;
  }
  bool same_symbol(const SymInt& o) const { return !value && !o.value && !symbol.empty() && symbol == o.symbol; }
  Dim dim() const { return value ? (*value >= 0 ? Dim(*value) : Dim()) : (symbol.empty() ? Dim() : Dim::sym(symbol)); }
};
// The elements of input i when it is a 0-D/1-D int or bool tensor with known data or dim values.
std::optional<std::vector<SymInt>> sym_elements(const InferContext& c, size_t i);
// Applies f elementwise to the sym elements of inputs (0-D/1-D broadcasting); nullopt when some
// input's elements are not known or the lengths do not broadcast.
template <class F>
std::optional<std::vector<Dim>> sym_map(const InferContext& c, const std::vector<size_t>& inputs, F&& f) {
  std::vector<std::vector<SymInt>> els;
  size_t n = 1;
  for (size_t i : inputs) {
    auto e = sym_elements(c, i);
    if (!e) return std::nullopt;
    if (e->size() != 1) {
      if (n != 1 && n != e->size()) return std::nullopt;
      n = e->size();
    }
    els.push_back(std::move(*e));
  }
  std::vector<Dim> out;
  std::vector<SymInt> args(els.size());
  for (size_t j = 0; j < n; ++j) {
    for (size_t k = 0; k < els.size(); ++k) args[k] = els[k].size() == 1 ? els[k][0] : els[k][j];
    out.push_back(f(args).dim());
  }
  return out;
}

// ---- unary ops -----------------------------------------------------------------------------
// Attribute values an activation reads once per call (alpha, beta, ...).
struct Params {
  double a = 0, b = 0, c = 0;
};
using ParamFn = Params (*)(const Node&, int64_t opset);

// A One-to-One unary op over the dtype classes in Mask. f(v, params) gets the compute-type value
// (float for float16/bfloat16) and returns the result; with Predicate it returns a bool and the
// output is bool (IsNaN, IsInf).
template <unsigned Mask, bool Predicate = false, class F>
OpSchema unary_schema(const char* name, int since, F f, ParamFn params = nullptr) {
  OpSchema s;
  s.name = name;
  s.since = since;
  s.family = "elementwise";
  s.mapping = MappingType::OneToOne;
  s.infer = [params](const InferContext& c) {
    TensorType t = c.input(0);
    check_dtype(c, t.dtype, Mask);
    if (params) params(c.node, c.opset);  // rejects bad attributes (Gelu approximate) at import
    if (Predicate) t.dtype = DType::Bool;
    return infer_one(t);
  };
  s.kernel = [f, params](const KernelContext& c) -> std::vector<Tensor> {
    const Tensor& x = c.input(0);
    const Params p = params ? params(c.node, c.opset) : Params{};
    Tensor out = Tensor::uninitialized(Predicate ? DType::Bool : x.dtype(), x.shape());  // all n written below
    const int64_t n = x.numel();
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (accepts<Mask, T>()) {
        using C = compute_t<T>;
        const T* in = x.data<T>();
        if constexpr (Predicate) {
          bool* o = out.data<bool>();
          for (int64_t i = 0; i < n; ++i) o[i] = f(load(in[i]), p);
        } else {
          T* o = out.data<T>();
          for (int64_t i = 0; i < n; ++i) o[i] = store<T>(C(f(load(in[i]), p)));
        }
      } else {
        unsupported_dtype(c.node, c.opset, x.dtype(), "input", Mask);
      }
    });
    return {out};
  };
  return s;
}

// Registration of the parts (one file each).
void register_unary_ops(OpRegistry& r);
void register_activation_ops(OpRegistry& r);
void register_binary_ops(OpRegistry& r);
void register_misc_ops(OpRegistry& r);

}  // namespace nnfuse::ew
