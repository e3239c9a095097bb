#pragma once
// Reductions over a contiguous or strided axis, Softmax/LogSoftmax and LayerNorm over the last
// axis, and global pooling; contract in microkernels.h. Every output element's reduction runs in
// one chunk in a fixed order, so results do not depend on the par-for.
#include <cmath>
#include <limits>

#include "math.h"
#include "pool.h"

namespace nnfuse::mk {

enum class ReduceKind { Sum, Mean, Max, Min, SumSquare };

struct ReduceArgs {
  int64_t outer = 1, R = 0, inner = 1;  // input viewed as [outer, R, inner], reduce over R
  const float* x = nullptr;
  int64_t x_so = 0, x_sr = 1;           // strides of outer and R (inner contiguous)
  float* y = nullptr;
  int64_t y_so = 1;                     // output [outer, inner], inner contiguous

  // Dense input [outer, R, inner] and output [outer, inner].
  static ReduceArgs contiguous(int64_t outer, int64_t R, int64_t inner, const float* x, float* y) {
    ReduceArgs a;
    a.outer = outer, a.R = R, a.inner = inner;
    a.x = x, a.x_so = R * inner, a.x_sr = inner;
    a.y = y, a.y_so = inner;
    return a;
  }
};

namespace detail {

template <ReduceKind K>
struct ReduceOp {
  static constexpr float init() {
    if constexpr (K == ReduceKind::Max) return -std::numeric_limits<float>::infinity();
    if constexpr (K == ReduceKind::Min) return std::numeric_limits<float>::infinity();
    return 0.f;
  }
  template <class V>
  static V step(const V& acc, const V& v) {
    if constexpr (K == ReduceKind::Max) return xsimd::max(acc, v);
    else if constexpr (K == ReduceKind::Min) return xsimd::min(acc, v);
    else if constexpr (K == ReduceKind::SumSquare) return xsimd::fma(v, v, acc);
    else return acc + v;
  }
  static float step(float acc, float v) {
    if constexpr (K == ReduceKind::Max) return v > acc ? v : acc;
    else if constexpr (K == ReduceKind::Min) return v < acc ? v : acc;
    else if constexpr (K == ReduceKind::SumSquare) return acc + v * v;
    else return acc + v;
  }
  template <class V>
  static V combine(const V& a, const V& b) {
    if constexpr (K == ReduceKind::Max) return xsimd::max(a, b);
    else if constexpr (K == ReduceKind::Min) return xsimd::min(a, b);
    else return a + b;
  }
  static float combine(float a, float b) {
    if constexpr (K == ReduceKind::Max) return b > a ? b : a;
    else if constexpr (K == ReduceKind::Min) return b < a ? b : a;
    else return a + b;
  }
  template <class Arch>
  static float horizontal(const vfloat<Arch>& v) {
    if constexpr (K == ReduceKind::Max || K == ReduceKind::Min) {
      alignas(64) float t[vfloat<Arch>::size];
      v.store_aligned(t);
      float r = t[0];
      for (size_t i = 1; i < vfloat<Arch>::size; ++i) r = combine(r, t[i]);
      return r;
    } else {
      return xsimd::hadd(v);
    }
  }
  static float finish(float acc, int64_t R) {
    if constexpr (K == ReduceKind::Mean) return acc / float(R);
    return acc;
  }
};

// Reduces n contiguous values (after the prologue, called with (row, col0 + i)) with four
// independent vector accumulators.
template <class Arch, ReduceKind K, class Pro>
inline float reduce_contiguous(const float* x, int64_t n, const Pro& pro, int64_t row, int64_t col0) {
  using V = vfloat<Arch>;
  using Op = ReduceOp<K>;
  constexpr int64_t L = int64_t(V::size);
  V a0(Op::init()), a1(Op::init()), a2(Op::init()), a3(Op::init());
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    a0 = Op::step(a0, pro(V::load_unaligned(x + i), row, col0 + i));
    a1 = Op::step(a1, pro(V::load_unaligned(x + i + L), row, col0 + i + L));
    a2 = Op::step(a2, pro(V::load_unaligned(x + i + 2 * L), row, col0 + i + 2 * L));
    a3 = Op::step(a3, pro(V::load_unaligned(x + i + 3 * L), row, col0 + i + 3 * L));
  }
  for (; i + L <= n; i += L) a0 = Op::step(a0, pro(V::load_unaligned(x + i), row, col0 + i));
  float r = Op::template horizontal<Arch>(Op::combine(Op::combine(a0, a1), Op::combine(a2, a3)));
  for (; i < n; ++i) r = Op::step(r, pro(x[i], row, col0 + i));
  return r;
}

}  // namespace detail

template <class Arch, ReduceKind K, class Ep = IdentityEpilogue, class ParFor = SerialFor, class Pro = IdentityPrologue>
void reduce(const ReduceArgs& a, const Ep& ep = {}, const ParFor& par = {}, const Pro& pro = {}) {
  using V = vfloat<Arch>;
  using Op = detail::ReduceOp<K>;
  constexpr int64_t L = int64_t(V::size);
  if (a.outer <= 0 || a.inner <= 0) return;
  if (a.inner == 1) {
    par(a.outer, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
      for (int64_t o = lo; o < hi; ++o) {
        const float* xo = a.x + o * a.x_so;
        float r;
        if (a.x_sr == 1) {
          r = detail::reduce_contiguous<Arch, K>(xo, a.R, pro, o, 0);
        } else {
          r = Op::init();
          for (int64_t j = 0; j < a.R; ++j) r = Op::step(r, pro(xo[j * a.x_sr], o, j));
        }
        a.y[o * a.y_so] = ep(Op::finish(r, a.R), o, 0);
      }
    });
    return;
  }
  // Inner > 1: accumulate whole inner chunks, one input row of the chunk at a time.
  constexpr int64_t IC = 32 * L;
  const int64_t chunks = ceil_div(a.inner, IC);
  par(a.outer * chunks, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    alignas(64) float acc[IC];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t o = t / chunks, i0 = (t % chunks) * IC, n = std::min(IC, a.inner - i0);
      std::fill(acc, acc + n, Op::init());
      for (int64_t j = 0; j < a.R; ++j) {
        const float* xr = a.x + o * a.x_so + j * a.x_sr + i0;
        const int64_t col0 = j * a.inner + i0;
        int64_t i = 0;
        for (; i + L <= n; i += L)
          Op::step(V::load_aligned(acc + i), pro(V::load_unaligned(xr + i), o, col0 + i)).store_aligned(acc + i);
        for (; i < n; ++i) acc[i] = Op::step(acc[i], pro(xr[i], o, col0 + i));
      }
      for (int64_t i = 0; i < n; ++i) acc[i] = Op::finish(acc[i], a.R);
      store_row_with_epilogue<Arch>(a.y + o * a.y_so + i0, acc, n, o, i0, ep);
    }
  });
}

// Global pooling: y[r] = ep(max or mean of x[r*x_rs + 0 .. HW), r, 0) for r in [0, rows).
template <class Arch, PoolKind Kind, class Ep = IdentityEpilogue, class ParFor = SerialFor, class Pro = IdentityPrologue>
void global_pool2d(int64_t rows, int64_t HW, const float* x, int64_t x_rs, float* y, const Ep& ep = {},
                   const ParFor& par = {}, const Pro& pro = {}) {
  ReduceArgs a;
  a.outer = rows, a.R = HW, a.inner = 1, a.x = x, a.x_so = x_rs, a.x_sr = 1, a.y = y, a.y_so = 1;
  if constexpr (Kind == PoolKind::Max)
    reduce<Arch, ReduceKind::Max>(a, ep, par, pro);
  else
    reduce<Arch, ReduceKind::Mean>(a, ep, par, pro);
}

// Softmax (Log = false) or LogSoftmax (Log = true) over rows of length L.
// y may equal x (in place).
template <class Arch, bool Log = false, class Ep = IdentityEpilogue, class ParFor = SerialFor,
          class Pro = IdentityPrologue>
void softmax(int64_t rows, int64_t len, const float* x, int64_t x_rs, float* y, int64_t y_rs, const Ep& ep = {},
             const ParFor& par = {}, const Pro& pro = {}) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  par(rows, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * x_rs;
      float* yr = y + r * y_rs;
      const float mx = detail::reduce_contiguous<Arch, ReduceKind::Max>(xr, len, pro, r, 0);
      const V mxv(mx);
      // Sum of exp(x - max); plain softmax keeps the exponentials in y for the final scaling.
      V s0(0.f), s1(0.f);
      int64_t c = 0;
      for (; c + 2 * L <= len; c += 2 * L) {
        V e0 = vexp<Arch>(pro(V::load_unaligned(xr + c), r, c) - mxv);
        V e1 = vexp<Arch>(pro(V::load_unaligned(xr + c + L), r, c + L) - mxv);
        if constexpr (!Log) e0.store_unaligned(yr + c), e1.store_unaligned(yr + c + L);
        s0 += e0, s1 += e1;
      }
      for (; c + L <= len; c += L) {
        V e0 = vexp<Arch>(pro(V::load_unaligned(xr + c), r, c) - mxv);
        if constexpr (!Log) e0.store_unaligned(yr + c);
        s0 += e0;
      }
      // The tail as one vector padded with -inf (exp gives 0 there) rather than len % L scalar
      // exps (a 197-wide ViT row: 5 std::exp calls cost as much as its 12 vectors). A prologue
      // may read per column, so with one the tail stays scalar.
      if constexpr (detail::is_identity_v<Pro>)
        if (c < len) {
          const V e = vexp<Arch>(load_partial<Arch>(xr + c, len - c, -std::numeric_limits<float>::infinity()) - mxv);
          if constexpr (!Log) {
            alignas(64) float t[L];
            e.store_aligned(t);
            std::copy(t, t + (len - c), yr + c);
          }
          s0 += e;
          c = len;
        }
      float sum = xsimd::hadd(s0 + s1);
      for (; c < len; ++c) {
        float e = std::exp(pro(xr[c], r, c) - mx);
        if constexpr (!Log) yr[c] = e;
        sum += e;
      }
      if constexpr (Log) {
        const float shift = mx + std::log(sum);
        const V sv(shift);
        c = 0;
        for (; c + L <= len; c += L) ep(pro(V::load_unaligned(xr + c), r, c) - sv, r, c).store_unaligned(yr + c);
        for (; c < len; ++c) yr[c] = ep(pro(xr[c], r, c) - shift, r, c);
      } else {
        const float inv = 1.f / sum;
        const V iv(inv);
        c = 0;
        for (; c + L <= len; c += L) ep(V::load_unaligned(yr + c) * iv, r, c).store_unaligned(yr + c);
        for (; c < len; ++c) yr[c] = ep(yr[c] * inv, r, c);
      }
    }
  });
}

// LayerNorm over rows of length len: y = ep((x - mean) / sqrt(var + eps) * gamma + beta).
// Two passes for the statistics (mean, then the centred sum of squares) for accuracy.
// gamma/beta may be nullptr (1 / 0). y may equal x.
template <class Arch, class Ep = IdentityEpilogue, class ParFor = SerialFor, class Pro = IdentityPrologue>
void layernorm(int64_t rows, int64_t len, const float* x, int64_t x_rs, const float* gamma, const float* beta, float eps,
               float* y, int64_t y_rs, const Ep& ep = {}, const ParFor& par = {}, const Pro& pro = {}) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  par(rows, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * x_rs;
      float* yr = y + r * y_rs;
      const float mean = detail::reduce_contiguous<Arch, ReduceKind::Sum>(xr, len, pro, r, 0) / float(len);
      auto centred = [&](auto v, int64_t c) { return pro(v, r, c) - decltype(v)(mean); };
      V q0(0.f), q1(0.f);
      int64_t c = 0;
      for (; c + 2 * L <= len; c += 2 * L) {
        V d0 = centred(V::load_unaligned(xr + c), c), d1 = centred(V::load_unaligned(xr + c + L), c + L);
        q0 = xsimd::fma(d0, d0, q0), q1 = xsimd::fma(d1, d1, q1);
      }
      for (; c + L <= len; c += L) {
        V d0 = centred(V::load_unaligned(xr + c), c);
        q0 = xsimd::fma(d0, d0, q0);
      }
      float ss = xsimd::hadd(q0 + q1);
      for (; c < len; ++c) {
        float d = centred(xr[c], c);
        ss += d * d;
      }
      const float rstd = 1.f / std::sqrt(ss / float(len) + eps);
      const V rv(rstd);
      c = 0;
      for (; c + L <= len; c += L) {
        V v = centred(V::load_unaligned(xr + c), c) * rv;
        if (gamma) v *= V::load_unaligned(gamma + c);
        if (beta) v += V::load_unaligned(beta + c);
        ep(v, r, c).store_unaligned(yr + c);
      }
      for (; c < len; ++c) {
        float v = centred(xr[c], c) * rstd;
        if (gamma) v *= gamma[c];
        if (beta) v += beta[c];
        yr[c] = ep(v, r, c);
      }
    }
  });
}

}  // namespace nnfuse::mk
