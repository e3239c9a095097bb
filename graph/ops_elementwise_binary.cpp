// Binary and variadic elementwise ops with numpy broadcasting: arithmetic, Pow, Mod, Max/Min,
// Sum/Mean, bit ops, comparisons, logic, and PRelu. Mapping type: One-to-One when no input is
// broadcast, One-to-Many when one is (see broadcast_mapping).
//
// Integer arithmetic wraps (computed in the unsigned type) as numpy and ONNX Runtime do; integer
// Div truncates toward zero (C semantics, as ONNX Runtime does); a zero integer divisor is a
// Runtime error rather than undefined behaviour.
#include <cmath>
#include <limits>

#include "graph/ops_elementwise_impl.h"

namespace nnfuse::ew {

namespace {

template <class C>
constexpr bool is_float_v = std::is_floating_point_v<C>;

using SymFn = SymInt (*)(const std::vector<SymInt>&);

// ---- wrapping integer arithmetic -----------------------------------------------------------
template <class C>
C wrap_add(C a, C b) {
  if constexpr (std::is_integral_v<C> && !std::is_same_v<C, bool>) {
    using U = std::make_unsigned_t<C>;
    return C(U(U(a) + U(b)));
  } else {
    return a + b;
  }
}
template <class C>
C wrap_sub(C a, C b) {
  if constexpr (std::is_integral_v<C> && !std::is_same_v<C, bool>) {
    using U = std::make_unsigned_t<C>;
    return C(U(U(a) - U(b)));
  } else {
    return a - b;
  }
}
template <class C>
C wrap_mul(C a, C b) {
  if constexpr (std::is_integral_v<C> && !std::is_same_v<C, bool>) {
    using U = std::make_unsigned_t<C>;
    // Promote narrow types to unsigned int first: uint16 * uint16 would promote to signed int.
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return C(U(W(U(a)) * W(U(b))));
  } else {
    return a * b;
  }
}
template <class C>
C int_div(C a, C b) {  // b != 0 (checked before)
  if constexpr (std::is_signed_v<C>) {
    if (b == C(-1)) return wrap_sub(C(0), a);  // the minimum / -1 overflows in C
  }
  return C(a / b);
}

// ---- symbolic dim values -------------------------------------------------------------------
bool is_value(const SymInt& s, int64_t v) { return s.value && *s.value == v; }

SymInt sym_add(const std::vector<SymInt>& a) {
  if (a[0].value && a[1].value) return SymInt::of(*a[0].value + *a[1].value);
  if (is_value(a[1], 0)) return a[0];
  if (is_value(a[0], 0)) return a[1];
  return {};
}
SymInt sym_sub(const std::vector<SymInt>& a) {
  if (a[0].value && a[1].value) return SymInt::of(*a[0].value - *a[1].value);
  if (is_value(a[1], 0)) return a[0];
  if (a[0].same_symbol(a[1])) return SymInt::of(0);
  return {};
}
SymInt sym_mul(const std::vector<SymInt>& a) {
  if (a[0].value && a[1].value) return SymInt::of(*a[0].value * *a[1].value);
  if (is_value(a[1], 1)) return a[0];
  if (is_value(a[0], 1)) return a[1];
  if (is_value(a[0], 0) || is_value(a[1], 0)) return SymInt::of(0);
  return {};
}
SymInt sym_div(const std::vector<SymInt>& a) {
  if (a[0].value && a[1].value && *a[1].value != 0) return SymInt::of(*a[0].value / *a[1].value);
  if (is_value(a[1], 1)) return a[0];
  return {};
}
// Dims are never negative: Max(d, v <= 0) is d and Min(d, v <= 0) is v.
SymInt sym_max(const std::vector<SymInt>& a) {
  SymInt best = a[0];
  for (size_t i = 1; i < a.size(); ++i) {
    const SymInt& x = a[i];
    if (best.value && x.value) best = SymInt::of(std::max(*best.value, *x.value));
    else if (best.same_symbol(x)) continue;
    else if (x.value && *x.value <= 0 && !best.value && !best.symbol.empty()) continue;
    else if (best.value && *best.value <= 0 && !x.value && !x.symbol.empty()) best = x;
    else return {};
  }
  return best;
}
SymInt sym_min(const std::vector<SymInt>& a) {
  SymInt best = a[0];
  for (size_t i = 1; i < a.size(); ++i) {
    const SymInt& x = a[i];
    if (best.value && x.value) best = SymInt::of(std::min(*best.value, *x.value));
    else if (best.same_symbol(x)) continue;
    else if (x.value && *x.value <= 0 && !best.value && !best.symbol.empty()) best = x;
    else if (best.value && *best.value <= 0 && !x.value && !x.symbol.empty()) continue;
    else return {};
  }
  return best;
}
SymInt sym_equal(const std::vector<SymInt>& a) {
  if (a[0].value && a[1].value) return SymInt::of(*a[0].value == *a[1].value ? 1 : 0);
  if (a[0].same_symbol(a[1])) return SymInt::of(1);
  // A dim (known to be a dim because it has a symbol) never equals a negative value such as the
  // -1 of Where(Equal(shape, -1), ...), which PyTorch exporters emit.
  if (a[0].value && *a[0].value < 0 && !a[1].symbol.empty()) return SymInt::of(0);
  if (a[1].value && *a[1].value < 0 && !a[0].symbol.empty()) return SymInt::of(0);
  return {};
}

void add_dim_values(const InferContext& c, InferResult& r, SymFn sym) {
  const TensorType& o = r.outputs[0];
  if (!sym || !(dtype_is_integer(o.dtype) || o.dtype == DType::Bool)) return;
  if (o.has_shape && o.rank() > 1) return;
  std::vector<size_t> ins;
  for (size_t i = 0; i < c.num_inputs(); ++i) ins.push_back(i);
  r.dim_values.push_back(sym_map(c, ins, sym));
}

// ---- kernels -------------------------------------------------------------------------------

const Tensor& same_dtype_input(const KernelContext& c, size_t i) {
  const Tensor& t = c.input(i);
  if (t.dtype() != c.input(0).dtype())
    c.error("inputs 0 and " + std::to_string(i) + " must have the same dtype, got " + dtype_name(c.input(0).dtype()) +
            " and " + dtype_name(t.dtype()));
  return t;
}

template <class T>
void check_nonzero_divisor(const KernelContext& c, const Tensor& b) {
  if constexpr (std::is_integral_v<T>) {
    const T* p = b.data<T>();
    for (int64_t i = 0, n = b.numel(); i < n; ++i)
      if (p[i] == T(0)) c.error("integer division by zero (divisor element " + std::to_string(i) + ")");
  }
}

enum BinaryFlags : unsigned { kCompare = 1, kCommutative = 2, kIntDivisor = 4 };

// A binary op over same-dtype inputs. f(x, y, params) gets compute-type values and returns the
// result (bool for comparisons).
template <unsigned Mask, unsigned Flags, class F>
OpSchema binary_schema(const char* name, int since, F f, SymFn sym = nullptr, ParamFn params = nullptr) {
  OpSchema s;
  s.name = name;
  s.since = since;
  s.min_inputs = s.max_inputs = 2;
  s.family = "elementwise";
  s.commutative = (Flags & kCommutative) != 0;
  s.mapping_fn = broadcast_mapping;
  s.infer = [sym, params](const InferContext& c) {
    DType t = common_dtype(c);
    check_dtype(c, t, Mask);
    if (params) params(c.node, c.opset);  // rejects bad attributes (BitShift direction) at import
    InferResult r = infer_one(broadcast_type(c, (Flags & kCompare) ? DType::Bool : t));
    add_dim_values(c, r, sym);
    return r;
  };
  s.kernel = [f, params](const KernelContext& c) -> std::vector<Tensor> {
    const Tensor& a = c.input(0);
    const Tensor& b = same_dtype_input(c, 1);
    const Params p = params ? params(c.node, c.opset) : Params{};
    // apply2 writes every element (or an unsupported dtype throws): no zero-fill needed.
    Tensor out = Tensor::uninitialized((Flags & kCompare) ? DType::Bool : a.dtype(), kernel_broadcast(c, {&a, &b}));
    dispatch_dtype(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (accepts<Mask, T>()) {
        using C = compute_t<T>;
        if constexpr ((Flags & kIntDivisor) != 0) check_nonzero_divisor<T>(c, b);
        if constexpr ((Flags & kCompare) != 0)
          apply2<T, T, bool>(a, b, out, [&](T x, T y) { return bool(f(load(x), load(y), p)); });
        else
          apply2<T, T, T>(a, b, out, [&](T x, T y) { return store<T>(C(f(load(x), load(y), p))); });
      } else {
        unsupported_dtype(c.node, c.opset, a.dtype(), "inputs", Mask);
      }
    });
    return {out};
  };
  return s;
}

// Sum, Mean, Max, Min: any number of same-dtype inputs, broadcast together, folded pairwise.
template <unsigned Mask, bool IsMean, class F>
OpSchema variadic_schema(const char* name, F f, SymFn sym) {
  OpSchema s;
  s.name = name;
  s.since = 7;
  s.min_inputs = 1;
  s.max_inputs = -1;
  s.family = "elementwise";
  s.commutative = true;
  s.mapping_fn = broadcast_mapping;
  s.infer = [sym](const InferContext& c) {
    DType t = common_dtype(c);
    check_dtype(c, t, Mask);
    InferResult r = infer_one(broadcast_type(c, t));
    add_dim_values(c, r, sym);
    return r;
  };
  s.flops = [](const Node& n, const std::vector<TensorType>&, const std::vector<TensorType>& outs) {
    auto k = outs.empty() ? std::nullopt : outs[0].numel();
    double per = double(n.num_present_inputs()) - (IsMean ? 0 : 1);
    return k ? double(*k) * per : 0.0;
  };
  s.kernel = [f](const KernelContext& c) -> std::vector<Tensor> {
    std::vector<const Tensor*> ins;
    for (size_t i = 0; i < c.num_inputs(); ++i) ins.push_back(&same_dtype_input(c, i));
    const DType dt = ins[0]->dtype();
    if (!accepts(Mask, dt)) unsupported_dtype(c.node, c.opset, dt, "inputs", Mask);
    Shape shape = kernel_broadcast(c, ins);
    if (ins.size() == 1 && !IsMean) return {*ins[0]};
    Tensor out(dt, shape);
    dispatch_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (accepts<Mask, T>()) {
        using C = compute_t<T>;
        auto op = [&](T x, T y) { return store<T>(C(f(load(x), load(y)))); };
        if (ins.size() == 1) {
          apply2<T, T, T>(*ins[0], *ins[0], out, [](T x, T) { return x; });
        } else {
          apply2<T, T, T>(*ins[0], *ins[1], out, op);
          for (size_t k = 2; k < ins.size(); ++k) apply2<T, T, T>(out, *ins[k], out, op);
        }
        if constexpr (IsMean) {
          T* p = out.data<T>();
          const C n = C(ins.size());
          for (int64_t i = 0, e = out.numel(); i < e; ++i) p[i] = store<T>(C(load(p[i]) / n));
        }
      }
    });
    return {out};
  };
  return s;
}

template <class C>
C max_nan(C a, C b) {
  if constexpr (is_float_v<C>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? b : a;
}
template <class C>
C min_nan(C a, C b) {
  if constexpr (is_float_v<C>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b < a ? b : a;
}

// ---- Mod -----------------------------------------------------------------------------------
Params mod_params(const Node& n, int64_t) {
  Params p;
  p.a = double(n.attrs.get_int("fmod", 0));
  return p;
}
template <class C>
C mod_op(C x, C y, const Params& p) {
  if constexpr (is_float_v<C>) {
    C r = std::fmod(x, y);
    if (p.a != 0 || y == C(0)) return r;
    // fmod=0 (numpy.mod, defined for floats from opset 22 on; we accept it at every opset): the
    // result takes the sign of the divisor, a zero result included.
    if (r != C(0)) {
      if ((y < C(0)) != (r < C(0))) r += y;
    } else {
      r = std::copysign(C(0), y);
    }
    return r;
  } else {
    if constexpr (std::is_signed_v<C>) {
      if (y == C(-1)) return C(0);  // the minimum % -1 overflows in C
    }
    C r = C(x % y);  // truncated (C) remainder: the sign of the dividend
    if constexpr (std::is_signed_v<C>) {
      // fmod=0: the sign of the divisor, as Python and numpy.
      if (p.a == 0 && r != 0 && ((r < 0) != (y < 0))) r = C(r + y);
    }
    return r;
  }
}

// ---- BitShift ------------------------------------------------------------------------------
Params shift_params(const Node& n, int64_t opset) {
  std::string d = n.attrs.get_string("direction", "");
  if (d != "LEFT" && d != "RIGHT")
    fail(ErrorKind::Model, "BitShift direction must be \"LEFT\" or \"RIGHT\", got \"" + d + "\"", node_ctx(n, opset));
  Params p;
  p.a = d == "LEFT" ? 1 : 0;
  return p;
}

// Unsigned types from opset 11; signed ones shift too (later ONNX opsets define them). A shift
// count outside [0, width) gives what shifting one bit at a time would: 0, or -1 for a right
// shift of a negative value. Left shifts wrap within the type.
template <class C>
C shift_op(C x, C y, bool left) {
  constexpr int bits = int(sizeof(C) * 8);
  const bool out_of_range = (std::is_signed_v<C> && y < C(0)) || uint64_t(y) >= uint64_t(bits);
  if (left) {
    using U = std::make_unsigned_t<C>;
    return out_of_range ? C(0) : C(U(U(x) << unsigned(y)));
  }
  if (out_of_range) return x < C(0) ? C(-1) : C(0);
  return C(x >> unsigned(y));  // arithmetic for signed types (C++20)
}

// ---- Pow -----------------------------------------------------------------------------------
// From opset 12 the exponent may have another dtype than the base; the output has the base's.
template <class CA, class CB>
CA pow_op(CA x, CB y) {
  if constexpr (std::is_integral_v<CA> && std::is_integral_v<CB>) {
    // Exact integer power by squaring (wrapping like the other integer ops).
    if constexpr (std::is_signed_v<CB>) {
      if (y < 0) {  // 1/x^|y| truncated toward zero
        if (x == CA(1)) return CA(1);
        if constexpr (std::is_signed_v<CA>) {
          if (x == CA(-1)) return CA((y % 2) ? -1 : 1);
        }
        return CA(0);
      }
    }
    CA result = CA(1), base = x;
    for (uint64_t e = uint64_t(y); e; e >>= 1) {
      if (e & 1) result = wrap_mul(result, base);
      base = wrap_mul(base, base);
    }
    return result;
  } else if constexpr (std::is_same_v<CA, float> && std::is_same_v<CB, float>) {
    return std::pow(x, y);
  } else {
    double v = std::pow(double(x), double(y));
    if constexpr (std::is_integral_v<CA>) {
      if (!(v == v)) return CA(0);
      if (v >= double(std::numeric_limits<CA>::max())) return std::numeric_limits<CA>::max();
      if (v <= double(std::numeric_limits<CA>::lowest())) return std::numeric_limits<CA>::lowest();
    }
    return CA(v);
  }
}

InferResult infer_pow(const InferContext& c) {
  DType base = c.input(0).dtype, expo = c.input(1).dtype;
  check_dtype(c, base, kNum, "base");
  check_dtype(c, expo, kNum, "exponent");
  if (c.opset < 12 && base != DType::Undefined && expo != DType::Undefined && base != expo)
    c.error(std::string("base and exponent must have the same dtype before opset 12, got ") + dtype_name(base) + " and " +
            dtype_name(expo));
  return infer_one(broadcast_type(c, base));
}

std::vector<Tensor> kernel_pow(const KernelContext& c) {
  const Tensor& a = c.input(0);
  const Tensor& b = c.input(1);
  Tensor out(a.dtype(), kernel_broadcast(c, {&a, &b}));
  dispatch_dtype(a.dtype(), [&](auto ta) {
    using TA = decltype(ta);
    if constexpr (accepts<kNum, TA>()) {
      dispatch_dtype(b.dtype(), [&](auto tb) {
        using TB = decltype(tb);
        if constexpr (accepts<kNum, TB>()) {
          apply2<TA, TB, TA>(a, b, out, [](TA x, TB y) { return store<TA>(pow_op(load(x), load(y))); });
        } else {
          unsupported_dtype(c.node, c.opset, b.dtype(), "exponent", kNum);
        }
      });
    } else {
      unsupported_dtype(c.node, c.opset, a.dtype(), "base", kNum);
    }
  });
  return {out};
}

// ---- PRelu ---------------------------------------------------------------------------------
// The slope broadcasts to X (unidirectionally): the output has X's shape.
InferResult infer_prelu(const InferContext& c) {
  DType t = common_dtype(c);
  check_dtype(c, t, kNum);
  TensorType out = broadcast_type(c, t);
  const TensorType& x = c.input(0);
  if (out.has_shape && x.has_shape) {
    if (out.rank() != x.rank()) c.error("slope does not broadcast to X");
    for (size_t d = 0; d < x.dims.size(); ++d)
      if (out.dims[d].known() && x.dims[d].known() && out.dims[d].value != x.dims[d].value)
        c.error("slope does not broadcast to X at dimension " + std::to_string(d));
  }
  return infer_one(x.has_shape ? TensorType(t, x.dims) : out);
}

std::vector<Tensor> kernel_prelu(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& slope = same_dtype_input(c, 1);
  Shape shape = kernel_broadcast(c, {&x, &slope});
  if (shape != x.shape())
    fail(ErrorKind::Shape, "slope " + shape_str(slope.shape()) + " does not broadcast to X " + shape_str(x.shape()),
         node_ctx(c.node, c.opset));
  Tensor out(x.dtype(), shape);
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (accepts<kNum, T>()) {
      using C = compute_t<T>;
      apply2<T, T, T>(x, slope, out, [](T xv, T sv) {
        C v = load(xv);
        return store<T>(C(v < C(0) ? wrap_mul(load(sv), v) : v));
      });
    } else {
      unsupported_dtype(c.node, c.opset, x.dtype(), "input", kNum);
    }
  });
  return {out};
}

}  // namespace

void register_binary_ops(OpRegistry& r) {
  r.add(binary_schema<kNum, kCommutative>("Add", 7, [](auto x, auto y, const Params&) { return wrap_add(x, y); }, sym_add));
  r.add(binary_schema<kNum, 0>("Sub", 7, [](auto x, auto y, const Params&) { return wrap_sub(x, y); }, sym_sub));
  r.add(binary_schema<kNum, kCommutative>("Mul", 7, [](auto x, auto y, const Params&) { return wrap_mul(x, y); }, sym_mul));
  r.add(binary_schema<kNum, kIntDivisor>(
      "Div", 7,
      [](auto x, auto y, const Params&) {
        if constexpr (std::is_integral_v<decltype(x)>) return int_div(x, y);
        else return x / y;
      },
      sym_div));
  r.add(binary_schema<kNum, kIntDivisor>(
      "Mod", 10, [](auto x, auto y, const Params& p) { return mod_op(x, y, p); }, nullptr, mod_params));
  r.add(binary_schema<kInt, 0>(
      "BitShift", 11, [](auto x, auto y, const Params& p) { return shift_op(x, y, p.a != 0); }, nullptr, shift_params));
  r.add(binary_schema<kInt, kCommutative>("BitwiseAnd", 18, [](auto x, auto y, const Params&) { return decltype(x)(x & y); }));
  r.add(binary_schema<kInt, kCommutative>("BitwiseOr", 18, [](auto x, auto y, const Params&) { return decltype(x)(x | y); }));
  r.add(binary_schema<kInt, kCommutative>("BitwiseXor", 18, [](auto x, auto y, const Params&) { return decltype(x)(x ^ y); }));

  r.add(binary_schema<kAny, kCompare | kCommutative>("Equal", 7, [](auto x, auto y, const Params&) { return x == y; }, sym_equal));
  r.add(binary_schema<kNum, kCompare>("Less", 7, [](auto x, auto y, const Params&) { return x < y; }));
  r.add(binary_schema<kNum, kCompare>("Greater", 7, [](auto x, auto y, const Params&) { return x > y; }));
  r.add(binary_schema<kNum, kCompare>("LessOrEqual", 12, [](auto x, auto y, const Params&) { return x <= y; }));
  r.add(binary_schema<kNum, kCompare>("GreaterOrEqual", 12, [](auto x, auto y, const Params&) { return x >= y; }));
  r.add(binary_schema<kBool, kCommutative>("And", 7, [](auto x, auto y, const Params&) { return x && y; }));
  r.add(binary_schema<kBool, kCommutative>("Or", 7, [](auto x, auto y, const Params&) { return x || y; }));
  r.add(binary_schema<kBool, kCommutative>("Xor", 7, [](auto x, auto y, const Params&) { return x != y; }));

  r.add(variadic_schema<kNum, false>("Max", [](auto x, auto y) { return max_nan(x, y); }, sym_max));
  r.add(variadic_schema<kNum, false>("Min", [](auto x, auto y) { return min_nan(x, y); }, sym_min));
  r.add(variadic_schema<kNum, false>("Sum", [](auto x, auto y) { return wrap_add(x, y); }, nullptr));
  r.add(variadic_schema<kFloat, true>("Mean", [](auto x, auto y) { return x + y; }, nullptr));

  {
    OpSchema s;
    s.name = "Pow";
    s.since = 7;
    s.min_inputs = s.max_inputs = 2;
    s.mapping_fn = broadcast_mapping;
    s.infer = infer_pow;
    s.kernel = kernel_pow;
    s.family = "elementwise";
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.name = "PRelu";
    s.since = 7;
    s.min_inputs = s.max_inputs = 2;
    s.mapping_fn = broadcast_mapping;
    s.infer = infer_prelu;
    s.kernel = kernel_prelu;
    s.family = "elementwise";
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::ew
