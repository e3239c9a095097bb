#pragma once
// Int8 GEMM of a quantized model, on AVX-512 VNNI; contract in microkernels.h (section 2).
//
// C = ep(A B) for a MatMul / Gemm whose A (row-major, M x K) holds quantized values and whose B is
// a constant on an int8 grid per column (int8_common.h states both). A is requantized once per call
// into a uint8 copy [M][Kq*4] (K padded to a multiple of 4 with B's offset, a zero input); B is
// packed at load time to [Nb][Kq][16][4]: one 64-byte vector holds 4 k of 16 columns, what
// vpdpbusd multiplies by a broadcast of 4 bytes of one row of A. The register tile is 6 rows x 4
// vectors (64 columns) of int32 sums, exact, scaled per column into float for ep on the output's
// (row, col) view, as gemm's.
#include <cstring>
#include <vector>

#include "int8_common.h"

namespace nnfuse::mk {

struct GemmInt8Args {
  int64_t M = 0, N = 0, K = 0;  // rows: every batch element's rows, contiguous in A and C
  const float* A = nullptr;     // A(m, k) = A[m * K + k]
  float* C = nullptr;           // C(m, n) = C[m * N + n]
  float x_scale = 1.f;          // A's s_x
  int32_t x_offset = 0;         // A's B (int8_common.h)
};

struct PackedGemmInt8 {
  static constexpr int64_t L = 16;
  int64_t Kq = 0;
  AlignedVector<int8_t> w;      // [Nb][Kq][L][4]
  std::vector<int32_t> comp;  // [Nb * L]: B * the column's sum of integer weights
  std::vector<float> scale;   // [Nb * L]: scale * s_w[n] (scale: s_x times Gemm's alpha)
  // B(k, n) = src[k * b_rs + n * b_cs]; mult[n]: column n's weights are integers times max|B(:, n)| / mult[n].
  void pack(const float* src, int64_t K, int64_t N, int64_t b_rs, int64_t b_cs, float scale_x, int32_t x_offset, const int32_t* mult) {
    const int64_t Nb = (N + L - 1) / L;
    Kq = (K + 3) / 4;
    w.assign(size_t(Nb * Kq * L * 4), 0);
    comp.assign(size_t(Nb * L), 0);
    scale.assign(size_t(Nb * L), 0.f);
    for (int64_t n = 0; n < N; ++n) {
      const float* col = src + n * b_cs;
      const float s = int8_weight_scale(col, K, b_rs, mult[n]);
      scale[size_t(n)] = scale_x * s;
      int32_t sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t q = int8_weight_value(col[k * b_rs], s);
        sum += q;
        w[size_t(((n / L * Kq + k / 4) * L + n % L) * 4 + k % 4)] = int8_t(q);
      }
      comp[size_t(n)] = x_offset * sum;
    }
  }
};

#if defined(__AVX512VNNI__)
namespace detail {

constexpr int kGemmInt8Mr = 6, kGemmInt8Nv = 4;

// Rows [r0, r1) of A into the uint8 copy (rows of ld bytes, the padding past K holding the offset).
inline void gemm_int8_requantize(const GemmInt8Args& a, int64_t ld, uint8_t* u, int64_t r0, int64_t r1) {
  const float inv = 1.f / a.x_scale;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i voff = _mm512_set1_epi32(a.x_offset);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.A + r * a.K;
    uint8_t* ur = u + r * ld;
    int64_t k = 0;
    for (; k + 16 <= a.K; k += 16) _mm_storeu_si128(reinterpret_cast<__m128i*>(ur + k), int8_requantize16(_mm512_loadu_ps(x + k), vinv, voff));
    for (; k < a.K; ++k) ur[k] = int8_requantize(x[k], inv, a.x_offset);
    for (; k < ld; ++k) ur[k] = uint8_t(a.x_offset);
  }
}

// Rows [m0, m0 + mr) (mr <= kGemmInt8Mr; the tile computes MR rows, reading the copy's padding
// rows past M, and stores mr) x NV column vectors from block nb0.
template <class Arch, int NV, class Ep>
NNFUSE_MK_TILE void gemm_int8_tile(const GemmInt8Args& a, const PackedGemmInt8& p, const uint8_t* u, int64_t ld, int64_t m0, int64_t mr,
                                   int64_t nb0, const Ep& ep) {
  using V = vfloat<Arch>;
  static_assert(V::size == 16, "the int8 GEMM kernel is for AVX-512 (16 lanes)");
  constexpr int MR = kGemmInt8Mr;
  // Rows past M are the copy's padding rows (computed, never stored): row r is r * ld on.
  const uint8_t* row0 = u + m0 * ld;
  __m512i acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_si512();
  const int64_t vstride = p.Kq * 64;
  const int8_t* wp = p.w.data() + nb0 * vstride;
  for (int64_t kq = 0; kq < p.Kq; ++kq) {
    __m512i wv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_si512(wp + v * vstride + kq * 64);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) int8_dot_step(acc[r], row0 + r * ld + kq * 4, wv);
  }
  alignas(64) int32_t sums[MR][NV][16];
  int8_store_sums(sums, acc);
  for (int v = 0; v < NV; ++v) {
    const int64_t col = (nb0 + v) * 16, nvalid = std::min<int64_t>(16, a.N - col);
    const __m512i comp = _mm512_loadu_si512(p.comp.data() + col);
    const __m512 sc = _mm512_loadu_ps(p.scale.data() + col);
    for (int r = 0; r < mr; ++r) {
      const V f(int8_dequantize16(sums[r][v], comp, sc));
      float* c = a.C + (m0 + r) * a.N + col;
      if (nvalid == 16) {
        ep(f, m0 + r, col).store_unaligned(c);
      } else {
        alignas(64) float t[16];
        f.store_aligned(t);
        store_row_with_epilogue<Arch>(c, t, nvalid, m0 + r, col, ep);
      }
    }
  }
}

}  // namespace detail

// C = ep(A B) as described at the top; `p` packed with a.x_offset (and s_x). Nb: the column
// blocks when the caller knows them at compile time (0: any); only the panel widths they need are
// compiled. Returns false, computing nothing, when N does not have Nb blocks.
template <class Arch, int64_t Nb = 0, class Ep = IdentityEpilogue, class ParFor = SerialFor>
bool gemm_int8(const GemmInt8Args& a, const PackedGemmInt8& p, const Ep& ep = {}, const ParFor& par = {}) {
  constexpr int NV = detail::kGemmInt8Nv, MR = detail::kGemmInt8Mr;
  const int64_t nb = (a.N + 15) / 16;
  if (Nb != 0 && nb != Nb) return false;
  if (a.M <= 0 || a.N <= 0) return true;
  const int64_t ld = p.Kq * 4;
  // MR - 1 padding rows past M, so that a short row tile reads rows without a clamp.
  uint8_t* u = reinterpret_cast<uint8_t*>(thread_scratch(ScratchSlot::Int8Copy, ((a.M + MR) * ld + 3) / 4));
  std::memset(u + a.M * ld, a.x_offset, size_t(MR * ld));
  par(a.M, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK { detail::gemm_int8_requantize(a, ld, u, lo, hi); });
  // Tasks: a panel of NV column vectors x a band of about 8 row tiles, panels outermost (a band's
  // tiles reuse the panel from L1/L2).
  const int64_t panels = (nb + NV - 1) / NV, bands = std::max<int64_t>(1, (a.M + 8 * MR - 1) / (8 * MR));
  const int64_t band = ((a.M + bands - 1) / bands + MR - 1) / MR * MR;
  auto used = [](int h) constexpr { return Nb == 0 || (h == NV && Nb >= NV) || h == Nb % NV; };
  par(panels * bands, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t nb0 = t / bands * NV, m0 = t % bands * band, m1 = std::min(a.M, m0 + band);
      for (int64_t m = m0; m < m1; m += MR) {
        const int64_t mr = std::min<int64_t>(MR, m1 - m);
        switch (std::min<int64_t>(NV, nb - nb0)) {
          case 4: if constexpr (used(4)) detail::gemm_int8_tile<Arch, 4>(a, p, u, ld, m, mr, nb0, ep); break;
          case 3: if constexpr (used(3)) detail::gemm_int8_tile<Arch, 3>(a, p, u, ld, m, mr, nb0, ep); break;
          case 2: if constexpr (used(2)) detail::gemm_int8_tile<Arch, 2>(a, p, u, ld, m, mr, nb0, ep); break;
          default: if constexpr (used(1)) detail::gemm_int8_tile<Arch, 1>(a, p, u, ld, m, mr, nb0, ep); break;
        }
      }
    }
  });
  return true;
}
#endif

}  // namespace nnfuse::mk
