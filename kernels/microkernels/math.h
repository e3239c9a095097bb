#pragma once
// Vectorised elementwise math for generated loops. xsimd 8.1's log/erfc were measured
// against double-precision std:: functions (README: worst relative error <= 2e-7 over the ranges
// that matter), so they are used directly; exp, erf and tanh are our own (below), about as
// accurate (tanh: 1.8e-7 against xsimd's 1.4e-7) and cheaper.
// Each function has a batch and a scalar overload so that generated code can call the same name
// in its SIMD body and its scalar tail.
#include <cmath>
#include <type_traits>

#include "common.h"

namespace nnfuse::mk {

namespace detail {
// p * 2^fn for an integral fn in [-127, 129] (what the clamped arguments below give): one AVX-512
// scalef, or elsewhere two exponent factors 2^(n/2) (one factor would overflow at n = 128).
template <class Arch> inline vfloat<Arch> times_pow2(const vfloat<Arch>& p, const vfloat<Arch>& fn) {
  using V = vfloat<Arch>;
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) return V(_mm512_scalef_ps(p, fn));
  else
#endif
  {
    using I = xsimd::batch<int32_t, Arch>;
    const I n = xsimd::to_int(fn), h = n >> 1;
    const V s1 = xsimd::bitwise_cast<V>((h + I(127)) << 23);
    const V s2 = xsimd::bitwise_cast<V>((n - h + I(127)) << 23);
    return p * s1 * s2;
  }
}
// p * 2^fn for an integral fn in [-126, 128], where 128 may give infinity (a caller for which
// any result past 2^127 means infinity: sigmoid's e^-v): one exponent factor, 3 integer
// operations and a multiply where times_pow2 takes 7 and two (AVX-512: the same scalef).
// fn = 128 makes the factor's bits 0x7f800000, +infinity.
template <class Arch> inline vfloat<Arch> times_pow2_saturating(const vfloat<Arch>& p, const vfloat<Arch>& fn) {
  using V = vfloat<Arch>;
  if constexpr (V::size == 16) return times_pow2<Arch>(p, fn);  // AVX-512: its one scalef
  else return p * xsimd::bitwise_cast<V>((xsimd::to_int(fn) + xsimd::batch<int32_t, Arch>(127)) << 23);
}
// c[0] x^(n-1) + ... + c[n-1] (highest power first), by Horner's rule with FMAs.
template <class V, size_t N>
inline V horner(const V& x, const float (&c)[N]) {
  V p(c[0]);
  for (size_t i = 1; i < N; ++i) p = xsimd::fma(p, x, V(c[i]));
  return p;
}
// e^-y for y in [-89, 87.3] (the callers' clamps or bounds), as vexp reduces it but run on y
// without negating it: s = y + n ln2 with n = round(-y log2 e) is -r, so e^r = e^-s is vexp's
// Taylor series with alternating signs; n lies in [-126, 128] and 2^128 saturates to infinity
// (times_pow2_saturating), where e^-y > FLT_MAX anyway. vsigmoid and verf share it.
template <class Arch> inline vfloat<Arch> exp_neg_saturating(const vfloat<Arch>& y) {
  using V = vfloat<Arch>;
  const V fn = xsimd::nearbyint(y * V(-1.44269504088896341f));
  V s = xsimd::fma(fn, V(0.693359375f), y);
  s = xsimd::fma(fn, V(-2.12194440e-4f), s);
  return times_pow2_saturating(horner(s, {1.f / 720.f, -1.f / 120.f, 1.f / 24.f, -1.f / 6.f, 0.5f, -1.f, 1.f}), fn);
}
}  // namespace detail

// e^v = 2^n e^r with n = round(v log2 e) and |r| <= ln2 / 2 (ln2 split in two so that r is exact
// to float precision), e^r by its Taylor series to r^6 (truncation error < 1.3e-7 relative at
// |r| = ln2 / 2). 2^n is applied as one AVX-512 scalef, or elsewhere as two exponent factors
// 2^(n/2), so every n the clamped range gives (-126 to 129) needs no special case: overflow
// gives inf, and NaN passes through the clamps; below e^-87.3 = 1.2e-38 (the denormals) it
// returns 0. About 20% cheaper than xsimd::exp, in which sigmoid (SiLU, Swish) and softmax
// epilogues spend most of their time.
template <class Arch> inline vfloat<Arch> vexp(const vfloat<Arch>& v) {
  using V = vfloat<Arch>;
  // min/max(bound, v): on x86 the second operand is returned when either is NaN, so NaN passes.
  // Below -87.3 the result is set to 0 at the end and never computed: a denormal or underflowing
  // result costs a microcode assist per instruction on Intel cores (a softmax row padded with
  // -inf ran 40% slower).
  const V x = xsimd::min(V(89.f), xsimd::max(V(-87.3f), v));
  const V fn = xsimd::nearbyint(x * V(1.44269504088896341f));
  V r = xsimd::fnma(fn, V(0.693359375f), x);
  r = xsimd::fnma(fn, V(-2.12194440e-4f), r);
  const V p = detail::horner(r, {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f});
  return xsimd::select(v < V(-87.3f), V(0.f), detail::times_pow2(p, fn));
}
template <class Arch> inline vfloat<Arch> vlog(const vfloat<Arch>& v) { return xsimd::log(v); }
// tanh without branches (xsimd::tanh tests its lanes' range and, when they straddle 0.625, runs
// both a polynomial and its own exp; GPT-2's tanh GELU and every LSTM/GRU/RNN cell call this per
// element). With a = |v| clamped to 9 (1 - tanh is under an ulp of 1 from 8.7 on, and tanh rounds to 1
// from 9.02):
//   a < 0.625:  tanh(a) = a + a^3 Q(a^2), Q of degree 4, a least-squares fit made for nnfuse
//               (relative weight, Chebyshev nodes);
//   otherwise:  (1 - e) / (1 + e) with e = e^(-2a) <= 0.29, so 1 - e does not cancel;
// then the sign of v. NaN stays NaN (the clamp keeps v's NaN, the polynomial's compare is false
// and e^-NaN is NaN), +-inf give +-1 and -0 gives -0.
template <class Arch> inline vfloat<Arch> vtanh(const vfloat<Arch>& v) {
  using V = vfloat<Arch>;
  const V a = xsimd::min(V(9.f), xsimd::abs(v)), z = a * a;
  const V q = detail::horner(z, {-0.0057189628f, 0.020653125f, -0.053744659f, 0.13331513f, -0.33333287f});
  const V e = detail::exp_neg_saturating(a + a), one(1.f);
  return xsimd::copysign(xsimd::select(a < V(0.625f), xsimd::fma(a * z, q, a), (one - e) / (one + e)), v);
}
// erf without branches or a division (xsimd::erf branches on the lanes' range and divides: a
// GELU written as x (erf(x / sqrt 2) + 1) / 2 over 197 x 3072 floats took 1.0-1.3 ms with it,
// 0.7-0.9 ms with this, on a Zen 3 core). With a = |v| clamped to 3.92 (erf rounds to 1 in float
// from there on):
//   a < 0.875:  erf(a) = a P(a^2), P of degree 5;
//   otherwise:  erf(a) = 1 - e^(-a^2) R(a), R of degree 7 standing for erfc(a) e^(a^2),
// then the sign of v. The coefficients are least-squares fits made for nnfuse on Chebyshev
// nodes (R weighted by e^(-a^2), the size of its error in erf). Worst error over the floats,
// against a 30-digit erf: 1.2e-7 absolute, 1.6e-7 relative (2 ulp). NaN stays NaN (the clamp
// keeps its second operand, v, when either is NaN), and +-inf give +-1.
template <class Arch> inline vfloat<Arch> verf(const vfloat<Arch>& v) {
  using V = vfloat<Arch>;
  const V a = xsimd::min(V(3.92f), xsimd::abs(v)), a2 = a * a;
  const V p = detail::horner(a2, {-0.00062541245f, 0.0050423206f, -0.026798654f, 0.1128267f, -0.37612575f, 1.1283791f});
  const V r = detail::horner(a, {-0.0004945919f, 0.0073130606f, -0.047772396f, 0.18317659f, -0.4630695f, 0.82295054f,
                                 -1.0641669f, 0.98964673f});
  // e^(-a^2) without vexp's clamps and select, which a^2 <= 15.4 never needs: the same bits as
  // vexp(-a^2), 10 vector operations fewer.
  const V e = xsimd::select(a < V(0.875f), a * p, xsimd::fnma(detail::exp_neg_saturating(a2), r, V(1.f)));
  return xsimd::copysign(e, v);
}
template <class Arch> inline vfloat<Arch> vsqrt(const vfloat<Arch>& v) { return xsimd::sqrt(v); }
// 1 / (1 + e^-v). e^-v is vexp's reduction run on -v without forming -v: s = v + n ln2 with
// n = round(-v log2 e) is -r, and e^r = e^-s is the same Taylor series with alternating signs.
// v is clamped to [-89, 87.3], so e^-v lies between 2^-126 (1 plus that is 1: the result is
// exactly 1 and no denormal is formed) and infinity (the result is 0, the correct limit). So no
// select is needed. n = round(-v log2 e) lies in [-126, 128], and 2^128 may as well be infinity
// (n = 128 from v <= -88.37 on, where the result is under FLT_MIN: 0 here): one exponent factor
// suffices, 18 vector operations where two factors took 23 (SiLU and Swish run this once per
// element: a 16 -> 96 1x1 conv at 112x112 with Swish, 1.30 -> 1.18 ms on a Zen 3 core,
// bench/RESULTS.md, session 26). An approximate reciprocal and a Newton step instead of the
// division measured no faster on a Xeon or on that Zen 3.
template <class Arch> inline vfloat<Arch> vsigmoid(const vfloat<Arch>& v) {
  using V = vfloat<Arch>;
  const V x = xsimd::min(V(87.3f), xsimd::max(V(-89.f), v));  // NaN passes (see vexp)
  const V one(1.f);
  return one / (one + detail::exp_neg_saturating(x));
}
// GELU (erf form): 0.5 v (1 + erf(v / sqrt 2)) = 0.5 v erfc(-v / sqrt 2); the erfc form keeps
// its relative accuracy for negative v, where 1 + erf cancels.
template <class Arch> inline vfloat<Arch> verfc(const vfloat<Arch>& v) { return xsimd::erfc(v); }
template <class Arch> inline vfloat<Arch> vgelu_erf(const vfloat<Arch>& v) {
  return vfloat<Arch>(0.5f) * v * xsimd::erfc(v * vfloat<Arch>(-0.70710678118654752f));
}

inline float vexp(float v) { return std::exp(v); }
inline float vlog(float v) { return std::log(v); }
inline float vtanh(float v) { return std::tanh(v); }
inline float verf(float v) { return std::erf(v); }
inline float vsqrt(float v) { return std::sqrt(v); }
inline float vsigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }
inline float verfc(float v) { return std::erfc(v); }
inline float vgelu_erf(float v) { return 0.5f * v * std::erfc(v * -0.70710678118654752f); }

// y[i] = f(x[i]) for i in [0, n); f is called with vfloat<Arch> and with float (a generic lambda).
// x and y may alias exactly (in place). Parallel over chunks of whole batches.
template <class Arch, class F, class ParFor = SerialFor>
void unary_map(int64_t n, const float* x, float* y, const F& f, const ParFor& par = {}) {
  constexpr int64_t L = int64_t(vfloat<Arch>::size);
  constexpr int64_t chunk = 64 * L;
  par(ceil_div(n, chunk), [&](int64_t b, int64_t e) NNFUSE_MK_CHUNK {
    const int64_t begin = b * chunk, count = std::min(n, e * chunk) - begin, nvec = count / L;
    const float* xs = x + begin;
    float* ys = y + begin;
    for (int64_t v = 0; v < nvec; ++v) f(vfloat<Arch>::load_unaligned(xs + v * L)).store_unaligned(ys + v * L);
    for (int64_t i = nvec * L; i < count; ++i) ys[i] = f(xs[i]);
  });
}

}  // namespace nnfuse::mk
