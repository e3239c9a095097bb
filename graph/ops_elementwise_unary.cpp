// Unary math ops: Abs ... BitwiseNot. All One-to-One, output shape = input shape.
// Float ops compute in the input's own precision (float16/bfloat16 in float) with the <cmath>
// functions, which are correctly rounded or within an ulp or two: accurate enough for an oracle.
#include <cmath>

#include "graph/ops_elementwise_impl.h"

namespace nnfuse::ew {

namespace {

template <class C>
constexpr bool is_float_v = std::is_floating_point_v<C>;

Params isinf_params(const Node& n, int64_t) {
  Params p;
  p.a = double(n.attrs.get_int("detect_negative", 1));
  p.b = double(n.attrs.get_int("detect_positive", 1));
  return p;
}

}  // namespace

void register_unary_ops(OpRegistry& r) {
  r.add(unary_schema<kNum>("Abs", 7, [](auto v, const Params&) {
    using C = decltype(v);
    if constexpr (std::is_unsigned_v<C>) return v;
    else if constexpr (is_float_v<C>) return std::fabs(v);
    else return C(v < 0 ? -v : v);  // wraps at the minimum like numpy
  }));
  r.add(unary_schema<kSignedNum>("Neg", 7, [](auto v, const Params&) {
    using C = decltype(v);
    if constexpr (is_float_v<C>) return -v;
    // Through unsigned so that negating the minimum wraps instead of overflowing.
    else return C(std::make_unsigned_t<C>(0) - std::make_unsigned_t<C>(v));
  }));
  r.add(unary_schema<kFloat>("Exp", 7, [](auto v, const Params&) { return std::exp(v); }));
  r.add(unary_schema<kFloat>("Log", 7, [](auto v, const Params&) { return std::log(v); }));
  r.add(unary_schema<kFloat>("Sqrt", 7, [](auto v, const Params&) { return std::sqrt(v); }));
  r.add(unary_schema<kFloat>("Reciprocal", 7, [](auto v, const Params&) { return decltype(v)(1) / v; }));
  r.add(unary_schema<kFloat>("Floor", 7, [](auto v, const Params&) { return std::floor(v); }));
  r.add(unary_schema<kFloat>("Ceil", 7, [](auto v, const Params&) { return std::ceil(v); }));
  // Round half to even, as ONNX and numpy do: nearbyint in the default rounding mode.
  r.add(unary_schema<kFloat>("Round", 11, [](auto v, const Params&) { return std::nearbyint(v); }));
  r.add(unary_schema<kNum>("Sign", 9, [](auto v, const Params&) {
    using C = decltype(v);
    if constexpr (is_float_v<C>) {
      if (v != v) return v;  // NaN stays NaN
    }
    if constexpr (std::is_unsigned_v<C>) return C(v > 0 ? 1 : 0);
    else return C(v > 0 ? 1 : v < 0 ? -1 : 0);
  }));
  r.add(unary_schema<kFloat>("Sin", 7, [](auto v, const Params&) { return std::sin(v); }));
  r.add(unary_schema<kFloat>("Cos", 7, [](auto v, const Params&) { return std::cos(v); }));
  r.add(unary_schema<kFloat>("Tan", 7, [](auto v, const Params&) { return std::tan(v); }));
  r.add(unary_schema<kFloat>("Asin", 7, [](auto v, const Params&) { return std::asin(v); }));
  r.add(unary_schema<kFloat>("Acos", 7, [](auto v, const Params&) { return std::acos(v); }));
  r.add(unary_schema<kFloat>("Atan", 7, [](auto v, const Params&) { return std::atan(v); }));
  r.add(unary_schema<kFloat>("Sinh", 9, [](auto v, const Params&) { return std::sinh(v); }));
  r.add(unary_schema<kFloat>("Cosh", 9, [](auto v, const Params&) { return std::cosh(v); }));
  r.add(unary_schema<kFloat>("Asinh", 9, [](auto v, const Params&) { return std::asinh(v); }));
  r.add(unary_schema<kFloat>("Acosh", 9, [](auto v, const Params&) { return std::acosh(v); }));
  r.add(unary_schema<kFloat>("Atanh", 9, [](auto v, const Params&) { return std::atanh(v); }));
  // ONNX allows Erf on every numeric type; integers are computed in double and truncated.
  r.add(unary_schema<kNum>("Erf", 9, [](auto v, const Params&) {
    using C = decltype(v);
    if constexpr (is_float_v<C>) return std::erf(v);
    else return C(std::erf(double(v)));
  }));
  r.add(unary_schema<kFloat, true>("IsNaN", 9, [](auto v, const Params&) { return v != v; }));
  r.add(unary_schema<kFloat, true>(
      "IsInf", 10,
      [](auto v, const Params& p) { return std::isinf(v) && (v > 0 ? p.b != 0 : p.a != 0); }, isinf_params));
  r.add(unary_schema<kBool>("Not", 7, [](auto v, const Params&) { return !v; }));
  r.add(unary_schema<kInt>("BitwiseNot", 18, [](auto v, const Params&) { return decltype(v)(~v); }));
}

}  // namespace nnfuse::ew
