#pragma once
// Int8 convolution of a quantized model, on AVX-512 VNNI; contract in microkernels.h (section 6).
//
// Which convolutions (lowering/int8_kernels.cpp decides, and states the same two rules): a dense
// conv in NCHW16c whose
//   - input values are (q - z) * s_x for integers q of an 8-bit range (what a QuantizeLinear ->
//     DequantizeLinear pair computes; rewrite/passes_qdq_to_float.cpp writes it in float), and
//   - weights of each output channel k are integers in [-127, 127] times s_w[k] = max|w_k| / m_k
//     (an int8 DequantizeLinear folded into a float constant: m_k = 127 for a per-channel
//     symmetric scale, at most 127 for a per-tensor one).
// Then conv(x, w)[k] = s_x * s_w[k] * sum(t * w_q), t = q - z, a sum of integer products that int32
// holds exactly: the float kernel's result up to its own rounding, and bias, activation and the
// next QuantizeLinear run in the fused float epilogue as before.
//
// How: vpdpbusd multiplies 4 unsigned bytes by 4 signed bytes and adds the 4 products into an int32
// lane, 64 multiply-adds per instruction where an fp32 FMA does 16. The input is requantized once
// per call into a uint8 copy u = t + B (B = x_offset shifts t into [0, 255]) with a border of B
// (a zero input) wide enough that no tap is checked, laid out [N][Cb][Hp][Wp][16]: four channels
// of a pixel are one 32-bit broadcast. Weights are packed [Kb][Cb][KH][KW][4][16][4]: one 64-byte
// vector holds four input channels of 16 output channels. sum(u * w_q) - B * sum(w_q) = sum(t * w_q)
// (PackedConvInt8::comp). Channels past C read whatever the copy holds there times a zero weight.
// Same (row, col) epilogue space as conv2d_nchwc.
#include <cstring>
#include <vector>

#include "conv_nchwc.h"
#include "int8_common.h"

namespace nnfuse::mk {

struct ConvInt8Args {
  int64_t N = 1, C = 0, H = 0, W = 0, K = 0, OH = 0, OW = 0, KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, dil_h = 1, dil_w = 1;
  const float* x = nullptr;
  bool x_blocked = true;   // input NCHW16c, or plain NCHW
  float* y = nullptr;      // NCHW16c output
  float x_scale = 1.f;     // s_x
  int32_t x_offset = 0;    // B: round(x / s_x) + B lies in [0, 255] (B = z - the type's lowest)
};

struct PackedConvInt8 {
  static constexpr int64_t L = 16;
  AlignedVector<int8_t> w;      // [Kb][Cb][KH][KW][4][L][4]
  std::vector<int32_t> comp;  // [Kb * L]: B * sum of output channel k's integer weights
  std::vector<float> scale;   // [Kb * L]: s_x * s_w[k]
  // mult[k]: output channel k's weights are integers times max|w_k| / mult[k].
  void pack(const float* src, int64_t K, int64_t C, int64_t KH, int64_t KW, float x_scale, int32_t x_offset, const int32_t* mult) {
    const int64_t Kb = nchwc_blocks(K, L), Cb = nchwc_blocks(C, L), taps = KH * KW, per_k = C * taps;
    w.assign(size_t(Kb * Cb * taps * 4 * L * 4), 0);
    comp.assign(size_t(Kb * L), 0);
    scale.assign(size_t(Kb * L), 0.f);
    for (int64_t k = 0; k < K; ++k) {
      const float* wk = src + k * per_k;
      const float s = int8_weight_scale(wk, per_k, 1, mult[k]);
      scale[size_t(k)] = x_scale * s;
      int32_t sum = 0;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t t = 0; t < taps; ++t) {
          const int32_t q = int8_weight_value(wk[c * taps + t], s);
          sum += q;
          const int64_t i = ((((k / L * Cb + c / L) * taps + t) * 4 + (c % L) / 4) * L + k % L) * 4 + c % 4;
          w[size_t(i)] = int8_t(q);
        }
      comp[size_t(k)] = x_offset * sum;
    }
  }
};

#if defined(__AVX512VNNI__)
namespace detail {

// The uint8 copy's extent: every row and column a tap of some output pixel reads.
struct Int8Plane {
  int64_t Cb, Hp, Wp;
  explicit Int8Plane(const ConvInt8Args& a)
      : Cb(nchwc_blocks(a.C, 16)), Hp((a.OH - 1) * a.stride_h + (a.KH - 1) * a.dil_h + 1), Wp((a.OW - 1) * a.stride_w + (a.KW - 1) * a.dil_w + 1) {}
};

// Rows [r0, r1) of the copy, row r = (n * Cb + cb) * Hp + hp holding input row hp - pad_top.
inline void conv_int8_requantize(const ConvInt8Args& a, const Int8Plane& pl, uint8_t* u, int64_t r0, int64_t r1) {
  const float inv = 1.f / a.x_scale;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i voff = _mm512_set1_epi32(a.x_offset);
  const uint8_t border = uint8_t(a.x_offset);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t hp = r % pl.Hp, cb = (r / pl.Hp) % pl.Cb, n = r / pl.Hp / pl.Cb, ih = hp - a.pad_top;
    uint8_t* ur = u + r * pl.Wp * 16;
    if (ih < 0 || ih >= a.H) {
      std::memset(ur, border, size_t(pl.Wp * 16));
      continue;
    }
    if (!a.x_blocked) {
      // Plain NCHW (an image's few channels): channel by channel along the row; the lanes past C
      // and the border keep B (lanes past C meet zero weights).
      std::memset(ur, border, size_t(pl.Wp * 16));
      const int64_t w0 = std::max<int64_t>(0, a.pad_left), w1 = std::min(pl.Wp, a.W + a.pad_left);
      for (int64_t l = 0; l < 16 && cb * 16 + l < a.C; ++l) {
        const float* xr = a.x + ((n * a.C + cb * 16 + l) * a.H + ih) * a.W - a.pad_left;
        for (int64_t wp = w0; wp < w1; ++wp) ur[wp * 16 + l] = int8_requantize(xr[wp], inv, a.x_offset);
      }
      continue;
    }
    for (int64_t wp = 0; wp < pl.Wp; ++wp) {
      const int64_t iw = wp - a.pad_left;
      if (iw < 0 || iw >= a.W) {
        std::memset(ur + wp * 16, border, 16);
        continue;
      }
      const __m512 v = _mm512_loadu_ps(a.x + (((n * pl.Cb + cb) * a.H + ih) * a.W + iw) * 16);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(ur + wp * 16), int8_requantize16(v, vinv, voff));
    }
  }
}

// OCB output blocks x UR pixels of the flattened output plane from q0 (nu of them real; the rest
// repeat the last and are not stored), over every input channel and tap.
template <class Arch, int OCB, int UR, class Ep>
NNFUSE_MK_TILE void conv_int8_tile(const ConvInt8Args& a, const PackedConvInt8& p, const Int8Plane& pl, const uint8_t* u, int64_t n,
                                   int64_t kb0, int64_t q0, int64_t nu, const Ep& ep) {
  using V = vfloat<Arch>;
  static_assert(V::size == 16, "the int8 conv kernel is for AVX-512 (16 lanes)");
  const int64_t taps = a.KH * a.KW, plane = pl.Hp * pl.Wp * 16, Kb = nchwc_blocks(a.K, 16);
  const int64_t wstride = pl.Cb * taps * 256;
  int64_t off[UR];
#pragma GCC unroll 16
  for (int uu = 0; uu < UR; ++uu) {
    const int64_t q = q0 + std::min<int64_t>(uu, nu - 1), oh = q / a.OW, ow = q % a.OW;
    off[uu] = (oh * a.stride_h * pl.Wp + ow * a.stride_w) * 16;
  }
  __m512i acc[UR][OCB];
#pragma GCC unroll 16
  for (int uu = 0; uu < UR; ++uu)
#pragma GCC unroll 16
    for (int o = 0; o < OCB; ++o) acc[uu][o] = _mm512_setzero_si512();
  const uint8_t* un = u + n * pl.Cb * plane;
  const int8_t* wk = p.w.data() + kb0 * wstride;
  for (int64_t cb = 0; cb < pl.Cb; ++cb) {
    const uint8_t* uc = un + cb * plane;
    // Groups of four channels holding some channel below C (an image's 3 channels: one of four).
    const int jn = int(std::min<int64_t>(4, (a.C - cb * 16 + 3) / 4));
    for (int64_t kh = 0; kh < a.KH; ++kh)
      for (int64_t kw = 0; kw < a.KW; ++kw) {
        const int64_t toff = (kh * a.dil_h * pl.Wp + kw * a.dil_w) * 16;
        const int8_t* wt = wk + (cb * taps + kh * a.KW + kw) * 256;
        for (int j = 0; j < jn; ++j) {
          __m512i wv[OCB];
#pragma GCC unroll 16
          for (int o = 0; o < OCB; ++o) wv[o] = _mm512_loadu_si512(wt + o * wstride + j * 64);
#pragma GCC unroll 16
          for (int uu = 0; uu < UR; ++uu) int8_dot_step(acc[uu], uc + off[uu] + toff + 4 * j, wv);
        }
      }
  }
  alignas(64) int32_t sums[UR][OCB][16];
  int8_store_sums(sums, acc);
  for (int o = 0; o < OCB; ++o) {
    const int64_t kb = kb0 + o, row = n * Kb + kb;
    const __m512i comp = _mm512_loadu_si512(p.comp.data() + kb * 16);
    const __m512 sc = _mm512_loadu_ps(p.scale.data() + kb * 16);
    for (int uu = 0; uu < nu; ++uu) {
      const V v(int8_dequantize16(sums[uu][o], comp, sc));
      ep(v, row, (q0 + uu) * 16).store_unaligned(a.y + (row * a.OH * a.OW + q0 + uu) * 16);
    }
  }
}

// Output blocks per task and pixels per tile: 4 x 6 int32 accumulators, 4 weight vectors and a
// broadcast input in 32 registers.
constexpr int kInt8Ocb = 4, kInt8Ur = 6;

template <class Arch, int OCB, class Ep>
void conv_int8_range(const ConvInt8Args& a, const PackedConvInt8& p, const Int8Plane& pl, const uint8_t* u, int64_t n, int64_t kb0,
                     int64_t q0, int64_t q1, const Ep& ep) {
  for (int64_t q = q0; q < q1; q += kInt8Ur)
    conv_int8_tile<Arch, OCB, kInt8Ur>(a, p, pl, u, n, kb0, q, std::min<int64_t>(kInt8Ur, q1 - q), ep);
}

}  // namespace detail

// y = ep(conv(x, w)) for the convolutions described at the top; `p` packed with a.x_scale and
// a.x_offset. The calling thread's scratch holds the uint8 copy (its workers read it).
// Kb: the output channel blocks, when the caller knows them at compile time (0: any); only the
// task heights they need are compiled (the generated code's build time). Returns false, computing
// nothing, when a.K does not have Kb blocks.
template <class Arch, int64_t Kb = 0, class Ep = IdentityEpilogue, class ParFor = SerialFor>
bool conv2d_int8_nchwc(const ConvInt8Args& a, const PackedConvInt8& p, const Ep& ep = {}, const ParFor& par = {}) {
  constexpr int G = detail::kInt8Ocb;
  const int64_t kb = nchwc_blocks(a.K, 16);
  if (Kb != 0 && kb != Kb) return false;
  if (a.N <= 0 || a.K <= 0 || a.OH <= 0 || a.OW <= 0) return true;
  const detail::Int8Plane pl(a);
  const int64_t rows = a.N * pl.Cb * pl.Hp, bytes = rows * pl.Wp * 16;
  uint8_t* u = reinterpret_cast<uint8_t*>(thread_scratch(ScratchSlot::Int8Copy, (bytes + 3) / 4));
  par(rows, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK { detail::conv_int8_requantize(a, pl, u, lo, hi); });
  // Tasks: image x group of G output blocks x a band of pixels (about 8 tiles; bands split the
  // plane evenly, in whole tiles, so that the last one is not a stub), channel groups outermost.
  const int64_t groups = (kb + G - 1) / G, P = a.OH * a.OW;
  const int64_t bands = std::max<int64_t>(1, (P + 8 * detail::kInt8Ur - 1) / (8 * detail::kInt8Ur));
  const int64_t band = ((P + bands - 1) / bands + detail::kInt8Ur - 1) / detail::kInt8Ur * detail::kInt8Ur;
  // Whether a task of h blocks occurs: G blocks, or the last group's remainder.
  auto used = [](int h) constexpr { return Kb == 0 || (h == G && Kb >= G) || h == Kb % G; };
  par(a.N * groups * bands, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t b = t % bands, g = (t / bands) % groups, n = t / bands / groups;
      const int64_t kb0 = g * G, q0 = b * band, q1 = std::min(P, q0 + band);
      if (q0 >= q1) continue;
      switch (std::min<int64_t>(G, kb - kb0)) {
        case 4: if constexpr (used(4)) detail::conv_int8_range<Arch, 4>(a, p, pl, u, n, kb0, q0, q1, ep); break;
        case 3: if constexpr (used(3)) detail::conv_int8_range<Arch, 3>(a, p, pl, u, n, kb0, q0, q1, ep); break;
        case 2: if constexpr (used(2)) detail::conv_int8_range<Arch, 2>(a, p, pl, u, n, kb0, q0, q1, ep); break;
        default: if constexpr (used(1)) detail::conv_int8_range<Arch, 1>(a, p, pl, u, n, kb0, q0, q1, ep); break;
      }
    }
  });
  return true;
}
#endif

}  // namespace nnfuse::mk
