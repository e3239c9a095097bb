#pragma once
// Fused attention (contract in microkernels.h, section "Attention"): per batch element b,
//   Y_b = softmax_rows(score(Q_b Kt_b)) V_b
// without materialising the Sq x Sk score matrix. Queries go in blocks of AttnTile::QB rows (the
// unit of parallel work), keys in equal tiles of at most kAttnKeyTile columns; for each key tile,
// every register tile of AttnTile::R query rows computes its scores, applies the generated score
// transform (scale, masks: the block's members between the two MatMuls), and folds them into a
// running softmax (flash-attention style: a running max m and sum l per row, the partial output
// rescaled by e^(m_old - m_new) when the max grows). A key tile of Kt and V stays in L2 while the
// query block's rows pass over it, R rows at a time. A 1500-token encoder needs 16 KB of scratch
// per thread instead of 9 MB of scores per head.
#include <cmath>
#include <cstdint>
#include <limits>

#include "common.h"
#include "math.h"
#include "reduce.h"

namespace nnfuse::mk {

struct AttentionArgs {
  int64_t batch = 1, Sq = 0, Sk = 0, D = 0, Dv = 0;
  // Q_b(i, d) = q[q_off[b] + i*D + d], Kt_b(d, j) = k[k_off[b] + d*Sk + j],
  // V_b(j, e) = v[v_off[b] + j*Dv + e]: row-major operands, one offset per batch element (a
  // broadcast batch dim repeats an offset).
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const int64_t* q_off = nullptr;
  const int64_t* k_off = nullptr;
  const int64_t* v_off = nullptr;
  float* y = nullptr;  // Y_b(i, e) = y[(b*Sq + i)*Dv + e]
  // The exported NaN guard Where(IsNaN(p), 0, p) after the softmax: a row whose softmax is NaN
  // (every key masked with -inf, or a NaN score) gives zeros instead of NaN.
  bool nan_to_zero = false;
};

namespace detail {

// Register tiles as the GEMM's (gemm.h GemmTile): rows x vectors of accumulators, the vectors of
// the key (or V) row loaded once per step and each row's scalar broadcast. With 4 rows x 4
// vectors GCC folded the key loads into the FMAs (a load per FMA) and ran at half the speed.
template <class Arch>
struct AttnTile {
  static constexpr int64_t L = int64_t(vfloat<Arch>::size);
  static constexpr int64_t R = L == 8 ? 6 : 8;   // query rows per register tile
  static constexpr int64_t NV = L == 4 ? 3 : 2;  // vectors per register tile
  static constexpr int64_t QB = 4 * R;           // query rows per task (share each key tile in L1)
};
// Keys per tile at most (Kt and V tiles of 64 KB each at d = 64, in L2 and reused by R rows at a
// time): 256 ran a 197-key ViT attention 10% faster than 64 (fewer partial tiles and rescales).
constexpr int64_t kAttnKeyTile = 256;

// S[r][0 .. n) = Q rows (i0 + r) . Kt[:, j0 .. j0 + n), for r < R (rows past the block's end
// repeat its last row; their results are not used). S rows are `ls` floats apart.
template <class Arch>
NNFUSE_MK_TILE void attn_scores(const float* const* qr, const float* kt, int64_t Sk, int64_t D, int64_t j0, int64_t n, float* S, int64_t ls) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size), R = AttnTile<Arch>::R, NJ = AttnTile<Arch>::NV;
  for (int64_t j = 0; j < n; j += NJ * L) {
    V acc[R][NJ];
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int64_t u = 0; u < NJ; ++u) acc[r][u] = V(0.f);
    const float* kp = kt + j0 + j;
    // Columns past the tile (or past Sk: the next row of Kt) are computed and never used; only
    // the last row of Kt may not be read past its end.
    const int64_t full_rows = j0 + j + NJ * L <= Sk ? D : D - 1;
    for (int64_t d = 0; d < full_rows; ++d, kp += Sk) {
      V kv[NJ];
#pragma GCC unroll 4
      for (int64_t u = 0; u < NJ; ++u) kv[u] = V::load_unaligned(kp + u * L);
#pragma GCC unroll 8
      for (int64_t r = 0; r < R; ++r) {
        const V qv(qr[r][d]);
#pragma GCC unroll 4
        for (int64_t u = 0; u < NJ; ++u) acc[r][u] = xsimd::fma(qv, kv[u], acc[r][u]);
      }
    }
    if (full_rows < D) {  // the last row of Kt at its end: partial loads
      const int64_t wl = std::min<int64_t>(NJ * L, Sk - j0 - j);
      for (int64_t d = full_rows; d < D; ++d, kp += Sk) {
        V kv[NJ];
        for (int64_t u = 0; u < NJ; ++u) kv[u] = u * L < wl ? load_partial<Arch>(kp + u * L, std::min<int64_t>(L, wl - u * L)) : V(0.f);
        for (int64_t r = 0; r < R; ++r) {
          const V qv(qr[r][d]);
          for (int64_t u = 0; u < NJ; ++u) acc[r][u] = xsimd::fma(qv, kv[u], acc[r][u]);
        }
      }
    }
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int64_t u = 0; u < NJ; ++u)
        if (j + u * L < ls) acc[r][u].store_aligned(S + r * ls + j + u * L);
  }
}

// O[r][0 .. Dv) += P[r][0 .. n) V[j0 .. j0 + n, :] for r < R (O rows `lo` floats apart, padded
// to whole vectors).
template <class Arch>
NNFUSE_MK_TILE void attn_pv(const float* P, int64_t ls, const float* v, int64_t Dv, int64_t j0, int64_t n, float* O, int64_t lo) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size), R = AttnTile<Arch>::R, NE = AttnTile<Arch>::NV;
  for (int64_t e = 0; e < Dv; e += NE * L) {
    const int64_t w = std::min<int64_t>(NE * L, Dv - e);
    V acc[R][NE];
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int64_t u = 0; u < NE; ++u) acc[r][u] = e + u * L < lo ? V::load_aligned(O + r * lo + e + u * L) : V(0.f);
    const float* vp = v + j0 * Dv + e;
    if (w == NE * L) {
      for (int64_t j = 0; j < n; ++j, vp += Dv) {
        V vv[NE];
#pragma GCC unroll 4
        for (int64_t u = 0; u < NE; ++u) vv[u] = V::load_unaligned(vp + u * L);
#pragma GCC unroll 8
        for (int64_t r = 0; r < R; ++r) {
          const V p(P[r * ls + j]);
#pragma GCC unroll 4
          for (int64_t u = 0; u < NE; ++u) acc[r][u] = xsimd::fma(p, vv[u], acc[r][u]);
        }
      }
    } else {
      for (int64_t j = 0; j < n; ++j, vp += Dv) {
        V vv[NE];
        for (int64_t u = 0; u < NE; ++u) vv[u] = u * L < w ? load_partial<Arch>(vp + u * L, std::min<int64_t>(L, w - u * L)) : V(0.f);
        for (int64_t r = 0; r < R; ++r) {
          const V p(P[r * ls + j]);
          for (int64_t u = 0; u < NE; ++u) acc[r][u] = xsimd::fma(p, vv[u], acc[r][u]);
        }
      }
    }
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int64_t u = 0; u < NE; ++u)
        if (e + u * L < lo) acc[r][u].store_aligned(O + r * lo + e + u * L);
  }
}

}  // namespace detail

template <class Arch, class Score, class Ep, class ParFor>
void attention(const AttentionArgs& a, const Score& score, const Ep& ep, const ParFor& par) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  constexpr int64_t R = detail::AttnTile<Arch>::R, QB = detail::AttnTile<Arch>::QB;
  const int64_t Sq = a.Sq, Sk = a.Sk, D = a.D, Dv = a.Dv;
  if (a.batch <= 0 || Sq <= 0 || Dv <= 0) return;
  // Tiles of equal size (1500 keys: six of 250), so that no tile is a short remainder.
  const int64_t tiles = ceil_div(std::max<int64_t>(Sk, 1), detail::kAttnKeyTile);
  const int64_t Tk = ceil_div(std::max<int64_t>(Sk, 1), tiles);
  const int64_t ls = ceil_div(Tk, L) * L, lo = ceil_div(Dv, L) * L;
  const int64_t qblocks = ceil_div(Sq, QB);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  par(a.batch * qblocks, [&](int64_t lo_task, int64_t hi_task) NNFUSE_MK_CHUNK {
    // Scratch: the block's partial outputs O [QB][lo], running max and sum, one score tile.
    float* scratch = thread_scratch(ScratchSlot::Attention, QB * lo + 2 * QB + R * ls);
    float* O = scratch;
    float* m = O + QB * lo;
    float* l = m + QB;
    float* S = l + QB;
    for (int64_t t = lo_task; t < hi_task; ++t) {
      const int64_t b = t / qblocks, i0 = (t % qblocks) * QB, nq = std::min<int64_t>(QB, Sq - i0);
      const float* qb = a.q + a.q_off[b];
      const float* kt = a.k + a.k_off[b];
      const float* vb = a.v + a.v_off[b];
      std::fill(O, O + QB * lo, 0.f);
      std::fill(m, m + nq, kNegInf);
      std::fill(l, l + nq, 0.f);
      for (int64_t j0 = 0; j0 < Sk; j0 += Tk) {
        const int64_t n = std::min<int64_t>(Tk, Sk - j0);
        for (int64_t g = 0; g < nq; g += R) {
          const int64_t nr = std::min<int64_t>(R, nq - g);
          const float* qr[R];
          for (int64_t r = 0; r < R; ++r) qr[r] = qb + (i0 + g + std::min(r, nr - 1)) * D;
          detail::attn_scores<Arch>(qr, kt, Sk, D, j0, n, S, ls);
          for (int64_t r = 0; r < nr; ++r) {
            float* s = S + r * ls;
            const int64_t row = b * Sq + i0 + g + r;
            // The generated score transform, then the tile's max (padding lanes are -inf).
            V mx(kNegInf);
            int64_t c = 0;
            for (; c + L <= n; c += L) {
              const V x = score(V::load_aligned(s + c), row, j0 + c);
              x.store_aligned(s + c);
              mx = xsimd::max(mx, x);
            }
            for (; c < n; ++c) s[c] = score(s[c], row, j0 + c);
            std::fill(s + n, s + ls, kNegInf);
            float tmax = detail::ReduceOp<ReduceKind::Max>::horizontal<Arch>(mx);
            for (int64_t p = n - n % L; p < n; ++p) tmax = std::max(tmax, s[p]);
            // NaN scores: max() may skip them; e^(NaN - m) below makes the row's sum NaN.
            const float mold = m[g + r], mnew = std::max(mold, tmax);
            // A row masked so far (max -inf) takes exponents against 0: e^-inf = 0, never NaN.
            const float base = mnew == kNegInf ? 0.f : mnew;
            const V bv(base);
            V sum(0.f);
            for (c = 0; c < ls; c += L) {
              const V p = vexp<Arch>(V::load_aligned(s + c) - bv);
              p.store_aligned(s + c);
              sum += p;
            }
            const float corr = std::exp(mold - base);
            l[g + r] = l[g + r] * corr + xsimd::hadd(sum);
            m[g + r] = mnew;
            if (corr != 1.f) {
              float* o = O + (g + r) * lo;
              const V cv(corr);
              for (int64_t e = 0; e < lo; e += L) (V::load_aligned(o + e) * cv).store_aligned(o + e);
            }
          }
          for (int64_t r = nr; r < R; ++r) std::fill(S + r * ls, S + r * ls + ls, 0.f);
          // Rows past nr accumulate zeros into O rows that exist (QB is a multiple of R) and are
          // never stored.
          detail::attn_pv<Arch>(S, ls, vb, Dv, j0, n, O + g * lo, lo);
        }
      }
      for (int64_t r = 0; r < nq; ++r) {
        float* o = O + r * lo;
        const float sum = l[r];
        if (a.nan_to_zero && !(sum > 0.f)) std::fill(o, o + lo, 0.f);
        else {
          const V inv(1.f / sum);
          for (int64_t e = 0; e < lo; e += L) (V::load_aligned(o + e) * inv).store_aligned(o + e);
        }
        const int64_t row = b * Sq + i0 + r;
        store_row_with_epilogue<Arch>(a.y + row * Dv, o, Dv, row, 0, ep);
      }
    }
  });
}

}  // namespace nnfuse::mk
