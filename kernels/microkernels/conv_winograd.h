#pragma once
// Winograd F(4x4, 3x3) convolution in the blocked NCHW<L>c layout (contract in microkernels.h,
// section 6; layout in conv_nchwc.h).
//
// Why: a 3x3 stride-1 convolution spends 9 multiply-adds per output per input channel; Winograd's
// minimal filtering computes a 4x4 output tile from a 6x6 input tile with 36 products per input
// channel instead of 144, so the dominant work shrinks 4x at the cost of two cheap transforms.
// On this project's CPUs the direct NCHWc kernel already runs at ~90% of the FMA peak, so only a
// cheaper algorithm makes 3x3 layers (half of ResNet-50's FLOPs) faster.
//
// Points 0, 1, -1, 2, -2, inf (Lavin & Gray): Y = A^T [(G g G^T) . (B^T d B)] A with
//   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
//   G   = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
//   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
// Rounding: the transforms add terms of mixed sign and magnitude (up to 8x in A^T), so results
// differ from the direct kernel's by a few 1e-6 relative to the output's scale per layer (the
// tests bound it); results never depend on the thread count.
//
// Three phases, each a parallel loop over independent pieces:
//   1. input transform: per (image, channel block, tile) the 6x6 input vectors (zeros outside the
//      input) -> 36 vectors V[xi][cb][t] (t = the tile's index over all images);
//   2. 36 independent products M[xi] = U[xi] V[xi]: each is a 1x1 convolution over T "pixels"
//      (the tiles), run by the register-blocked NCHWc 1x1 tile (conv_nchwc.h) with U[xi] in the
//      1x1 packed-weight layout;
//   3. output transform: per (image, output block, tile) the 36 vectors M[.][kb][t] -> 4x4 output
//      vectors, each passed through the epilogue at the direct kernel's (row, col) and stored
//      when inside the output.
// V and M live in the calling thread's scratch (the workers write them while the caller waits in
// the par-for).
#include "conv_nchwc.h"

namespace nnfuse::mk {

// Whether Winograd F(4x4,3x3) computes this convolution: dense (group 1), 3x3, stride 1, no dilation.
inline bool conv_winograd_applicable(const ConvNchwcArgs& a) {
  return !a.depthwise && a.group == 1 && a.KH == 3 && a.KW == 3 && a.stride_h == 1 && a.stride_w == 1 && a.dil_h == 1 && a.dil_w == 1 &&
         a.OH > 0 && a.OW > 0;
}

// Output tile M x M (4: F(4x4,3x3); 2: F(2x2,3x3)), input tile T = M + 2, T*T products.
template <int M>
struct WinogradTile {
  static_assert(M == 2 || M == 4, "Winograd F(2x2,3x3) or F(4x4,3x3)");
  static constexpr int T = M + 2, P = T * T;
};

// Transformed weights: T*T slices of Kb*C*L, each in the 1x1 NCHWc packed layout (conv_nchwc.h,
// pack_conv_nchwc_weights: a dense task's output blocks interleaved per channel), computed
// in double from [K, C, 3, 3].
template <int M>
struct PackedConvWinogradM {
  AlignedVector<float> u;
  int64_t K = 0, C = 0, L = 0;
  int64_t slice() const { return nchwc_blocks(K, L) * C * L; }
  void pack(const float* w, int64_t k_out, int64_t c_in, int64_t lanes) {
    constexpr int T = WinogradTile<M>::T;
    K = k_out, C = c_in, L = lanes;
    static constexpr double G4[6][3] = {{1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                        {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
    static constexpr double G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    auto G = [](int i, int j) { return M == 4 ? G4[i][j] : G2[i][j]; };
    const int64_t sl = slice();
    const ConvPackedLayout lay = ConvPackedLayout::dense(nchwc_blocks(K, L), C, 1, L);
    u.assign(size_t(T * T * sl), 0.f);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t c = 0; c < C; ++c) {
        const float* g = w + (k * C + c) * 9;
        double t[T][3];  // G g
        for (int i = 0; i < T; ++i)
          for (int j = 0; j < 3; ++j) t[i][j] = G(i, 0) * g[0 * 3 + j] + G(i, 1) * g[1 * 3 + j] + G(i, 2) * g[2 * 3 + j];
        for (int i = 0; i < T; ++i)
          for (int j = 0; j < T; ++j) {
            const double v = t[i][0] * G(j, 0) + t[i][1] * G(j, 1) + t[i][2] * G(j, 2);
            u[size_t((i * T + j) * sl + lay.offset(k / L, c, 0) + k % L)] = float(v);
          }
      }
  }
};
using PackedConvWinograd = PackedConvWinogradM<4>;
using PackedConvWinograd2 = PackedConvWinogradM<2>;

namespace detail {

// 1-D input transform of six vectors (a row or a column of the 6x6 tile), in place order t0..t5.
template <class V>
inline void wino_in_1d(const V& d0, const V& d1, const V& d2, const V& d3, const V& d4, const V& d5, V* t, int64_t ts) {
  const V four(4.f), five(5.f), two(2.f);
  const V a = d4 - four * d2;  // shared by t1, t2
  const V b = d3 - four * d1;
  const V c = d4 - d2;         // shared by t3, t4
  const V e = two * (d3 - d1);
  t[0 * ts] = xsimd::fma(four, d0, d4) - five * d2;
  t[1 * ts] = a + b;
  t[2 * ts] = a - b;
  t[3 * ts] = c + e;
  t[4 * ts] = c - e;
  t[5 * ts] = xsimd::fma(four, d1, d5) - five * d3;
}

// 1-D output transform of six vectors into four.
template <class V>
inline void wino_out_1d(const V& m0, const V& m1, const V& m2, const V& m3, const V& m4, const V& m5, V* y, int64_t ys) {
  const V s12 = m1 + m2, d12 = m1 - m2, s34 = m3 + m4, d34 = m3 - m4;
  y[0 * ys] = m0 + s12 + s34;
  y[1 * ys] = xsimd::fma(V(2.f), d34, d12);
  y[2 * ys] = xsimd::fma(V(4.f), s34, s12);
  y[3 * ys] = xsimd::fma(V(8.f), d34, d12) + m5;
}

// F(2x2,3x3): B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], A^T = [1 1 1 0; 0 1 -1 -1].
template <class V>
inline void wino2_in_1d(const V& d0, const V& d1, const V& d2, const V& d3, V* t, int64_t ts) {
  t[0 * ts] = d0 - d2;
  t[1 * ts] = d1 + d2;
  t[2 * ts] = d2 - d1;
  t[3 * ts] = d1 - d3;
}
template <class V>
inline void wino2_out_1d(const V& m0, const V& m1, const V& m2, const V& m3, V* y, int64_t ys) {
  y[0 * ys] = m0 + m1 + m2;
  y[1 * ys] = m1 - m2 - m3;
}

// The 1-D transforms of a tile size: in(d[0..T), t, stride), out(m[0..T), y, stride).
template <int M>
struct WinogradTransforms;
template <>
struct WinogradTransforms<4> {
  template <class V>
  static void in(const V* d, V* t, int64_t ts) { wino_in_1d(d[0], d[1], d[2], d[3], d[4], d[5], t, ts); }
  template <class V>
  static void out(const V* m, V* y, int64_t ys) { wino_out_1d(m[0], m[1], m[2], m[3], m[4], m[5], y, ys); }
};
template <>
struct WinogradTransforms<2> {
  template <class V>
  static void in(const V* d, V* t, int64_t ts) { wino2_in_1d(d[0], d[1], d[2], d[3], t, ts); }
  template <class V>
  static void out(const V* m, V* y, int64_t ys) { wino2_out_1d(m[0], m[1], m[2], m[3], y, ys); }
};

struct WinogradGeom {
  int64_t TH, TW, T;  // tiles per column and row of one image, tiles of all images
};

inline WinogradGeom winograd_geom(const ConvNchwcArgs& a, int64_t m) {
  WinogradGeom g;
  g.TH = ceil_div(a.OH, m), g.TW = ceil_div(a.OW, m);
  g.T = a.N * g.TH * g.TW;
  return g;
}

// Phase 1 for tile row th of image n, channel block cb: V[xi][cb][t][L].
template <class Arch, int M>
inline void wino_input_row(const ConvNchwcArgs& a, const WinogradGeom& wg, const NchwcInput& in, int64_t n, int64_t cb, int64_t th,
                           float* V_, int64_t vslice) {
  using V = vfloat<Arch>;
  using Tr = WinogradTransforms<M>;
  constexpr int64_t L = int64_t(V::size);
  constexpr int T = WinogradTile<M>::T;
  const int64_t valid = std::min<int64_t>(L, a.C - cb * L);  // lanes holding channels
  const int64_t ih0 = th * M - a.pad_top;
  for (int64_t tw = 0; tw < wg.TW; ++tw) {
    const int64_t iw0 = tw * M - a.pad_left;
    const bool interior = ih0 >= 0 && ih0 + T <= a.H && iw0 >= 0 && iw0 + T <= a.W;
    V d[T][T];
    for (int i = 0; i < T; ++i)
      for (int j = 0; j < T; ++j) {
        const int64_t ih = ih0 + i, iw = iw0 + j;
        if (interior || (uint64_t(ih) < uint64_t(a.H) && uint64_t(iw) < uint64_t(a.W))) {
          if (in.blocked) {
            d[i][j] = V::load_unaligned(in.chan<L>(n, cb * L) + ih * in.sh + iw * in.sw);
          } else {  // plain NCHW input (first conv of a blocked chain): gather the block's channels
            alignas(64) float tmp[L];
            const float* p = in.chan<L>(n, cb * L) + ih * in.sh + iw;
            for (int64_t l = 0; l < L; ++l) tmp[l] = l < valid ? p[l * in.cstride] : 0.f;
            d[i][j] = V::load_aligned(tmp);
          }
        } else {
          d[i][j] = V(0.f);
        }
      }
    V t[T][T];
    for (int j = 0; j < T; ++j) {
      V col[T];
      for (int i = 0; i < T; ++i) col[i] = d[i][j];
      Tr::in(col, &t[0][j], T);
    }
    const int64_t tile = (n * wg.TH + th) * wg.TW + tw;
    float* dst = V_ + (cb * wg.T + tile) * L;
    for (int i = 0; i < T; ++i) {
      V r[T];
      Tr::in(t[i], r, 1);
      for (int j = 0; j < T; ++j) r[j].store_aligned(dst + (i * T + j) * vslice);
    }
  }
}

// Phase 3 for tile row th of image n, output block kb.
template <class Arch, int M, class Ep>
inline void wino_output_row(const ConvNchwcArgs& a, const WinogradGeom& wg, int64_t n, int64_t kb, int64_t th, const float* Mt,
                            int64_t mslice, const Ep& ep) {
  using V = vfloat<Arch>;
  using Tr = WinogradTransforms<M>;
  constexpr int64_t L = int64_t(V::size);
  constexpr int T = WinogradTile<M>::T;
  const int64_t Kb = nchwc_blocks(a.K, L);
  float* yb = a.y + (n * Kb + kb) * a.OH * a.OW * L;
  const int64_t row = n * Kb + kb;
  for (int64_t tw = 0; tw < wg.TW; ++tw) {
    const int64_t tile = (n * wg.TH + th) * wg.TW + tw;
    const float* src = Mt + (kb * wg.T + tile) * L;
    V t[M][T];
    for (int j = 0; j < T; ++j) {
      V m[T];
      for (int i = 0; i < T; ++i) m[i] = V::load_aligned(src + (i * T + j) * mslice);
      Tr::out(m, &t[0][j], T);
    }
    const int64_t oh0 = th * M, ow0 = tw * M;
    const int64_t nh = std::min<int64_t>(M, a.OH - oh0), nw = std::min<int64_t>(M, a.OW - ow0);
    for (int64_t i = 0; i < nh; ++i) {
      V y[M];
      Tr::out(t[i], y, 1);
      for (int64_t j = 0; j < nw; ++j) {
        const int64_t p = (oh0 + i) * a.OW + ow0 + j;
        ep(y[j], row, p * L).store_unaligned(yb + p * L);
      }
    }
  }
}

}  // namespace detail

// y = ep(conv(x, w)) for a convolution conv_winograd_applicable() accepts, w packed by
// PackedConvWinogradM<M> (same K, C, L). Same (row, col) epilogue space as conv2d_nchwc. Of the
// class, CC.K matters (the products are pointwise convolutions with K output channels; returns
// false, computing nothing, for a K outside it) and whether its maps are narrow
// (conv_class_narrow_map): a narrow map's products take the dense conv's narrow-map tile, AVX-512's
// 4 x 7, as its direct kernel does. The width itself is not checked: it picks the tile only.
template <class Arch, ConvClass CC = ConvClass{}, int M, class Ep = IdentityEpilogue, class ParFor = SerialFor>
bool conv2d_nchwc_winograd(const ConvNchwcArgs& a, const PackedConvWinogradM<M>& pw, const Ep& ep = {}, const ParFor& par = {}) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  constexpr int P = WinogradTile<M>::P;
  if (CC.K != 0 && CC.K != a.K) return false;
  if (a.N <= 0 || a.K <= 0 || a.OH <= 0 || a.OW <= 0) return true;
  const detail::WinogradGeom wg = detail::winograd_geom(a, M);
  const int64_t Cb = nchwc_blocks(a.C, L), Kb = nchwc_blocks(a.K, L);
  const int64_t vslice = Cb * wg.T * L, mslice = Kb * wg.T * L;
  float* Vt = thread_scratch(ScratchSlot::WinogradV, P * vslice);
  float* Mt = thread_scratch(ScratchSlot::WinogradM, P * mslice);
  const detail::NchwcInput in(a.x, a.x_blocked, a.N, a.C, a.H, a.W, L);

  // 1. input transform
  par(a.N * Cb * wg.TH, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t th = t % wg.TH, cb = (t / wg.TH) % Cb, n = t / (wg.TH * Cb);
      detail::wino_input_row<Arch, M>(a, wg, in, n, cb, th, Vt, vslice);
    }
  });

  // 2. P products, each a 1x1 NCHWc convolution over the T tiles (one image, one row of T).
  constexpr int OCBMAX = detail::conv_nchwc_ocbmax<Arch>();
  constexpr bool narrow = conv_class_narrow_map(CC);
  constexpr int64_t UR = detail::conv_nchwc_ur<Arch>(OCBMAX, true, narrow);  // the tile of the products class
  const int64_t kgroups = ceil_div(Kb, int64_t(OCBMAX));
  const detail::ConvGeom g1{1, wg.T, 1, wg.T, 1, 1, 1, 1, 0, 0, 1, 1};
  const int64_t cchunk = std::max<int64_t>(1, 32768 / (OCBMAX * L));
  const int64_t qmax = std::max<int64_t>(UR, 16384 / (OCBMAX * L) / UR * UR);
  const int64_t want = 4 * std::max<int64_t>(1, par_threads(par));
  const int64_t nseg_want = std::max<int64_t>(1, ceil_div(want, P * kgroups));
  const int64_t qseg = std::min(qmax, ceil_div(ceil_div(wg.T, nseg_want), UR) * UR), nseg = ceil_div(wg.T, qseg);
  par(P * kgroups * nseg, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t s = t % nseg, kg = (t / nseg) % kgroups, xi = t / (nseg * kgroups);
      ConvNchwcArgs b;
      b.N = 1, b.C = a.C, b.H = 1, b.W = wg.T, b.K = a.K, b.OH = 1, b.OW = wg.T;
      b.w = pw.u.data() + xi * pw.slice();
      b.y = Mt + xi * mslice;
      const detail::NchwcInput vin(Vt + xi * vslice, true, 1, a.C, 1, wg.T, L);
      const int64_t kb0 = kg * OCBMAX, q0 = s * qseg, q1 = std::min(wg.T, q0 + qseg);
      const IdentityEpilogue id;
      // Dense; a narrow map's products keep the class's width, which picks the tile (T tiles of a
      // 14x14 map: 49 for F(2x2), 7 tiles of 7 pixels where 6 took 9, the last of one pixel).
      constexpr ConvClass products{ConvKind::Pointwise, CC.K, 0, 0, 0, narrow ? CC.w : 0, 1};
      detail::conv_nchwc_task_of<Arch, products>(std::min<int64_t>(OCBMAX, Kb - kb0), b, g1, vin, a.C, a.C, cchunk, 0, kb0, q0, q1, id);
    }
  });

  // 3. output transform + epilogue
  par(a.N * Kb * wg.TH, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t th = t % wg.TH, kb = (t / wg.TH) % Kb, n = t / (wg.TH * Kb);
      detail::wino_output_row<Arch, M>(a, wg, n, kb, th, Mt, mslice, ep);
    }
  });
  return true;
}

}  // namespace nnfuse::mk
