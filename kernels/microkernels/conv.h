#pragma once
// 2-D convolution (NCHW, weights [K, C/group, KH, KW]); contract in microkernels.h.
//   conv2d_gemm:      implicit im2col. Per (image, group) it is the GEMM
//                     Y_g[Kg, OH*OW] = W_g[Kg, Cg*KH*KW] * X_col[Cg*KH*KW, OH*OW]
//                     where the X_col panels are gathered from the input straight into the packed
//                     B panels (no im2col buffer). A 1x1, stride-1, unpadded conv reads the input
//                     as a plain strided B matrix.
//   conv2d_depthwise: group == C, vectorised along the output row.
//   conv2d_direct:    plain loops vectorised along the output row; for tiny problems and as a
//                     layout-agnostic fallback (any output strides).
#include "gemm.h"

namespace nnfuse::mk {

struct Conv2dArgs {
  int64_t N = 1, C = 0, H = 0, W = 0;  // input
  int64_t K = 0, OH = 0, OW = 0;       // output channels and spatial size (caller computes)
  int64_t KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;   // bottom/right padding is implied by OH/OW
  int64_t dil_h = 1, dil_w = 1;
  int64_t group = 1;
  const float* x = nullptr;
  int64_t x_sn = 0, x_sc = 0, x_sh = 0;  // input strides (W contiguous)
  const float* w = nullptr;              // [K, C/group, KH, KW] contiguous
  float* y = nullptr;
  int64_t y_sn = 0, y_sc = 0, y_sh = 0;  // output strides (OW contiguous)

  // Dense NCHW strides for x and y.
  void set_contiguous() {
    x_sh = W, x_sc = H * W, x_sn = C * H * W;
    y_sh = OW, y_sc = OH * OW, y_sn = K * OH * OW;
  }
  int64_t cin_per_group() const { return C / group; }
  int64_t cout_per_group() const { return K / group; }
};

namespace detail {

// Writes im2col values for output columns [ow, ow+len) of one row (input row xr, or nullptr when
// the input row lies in the padding) to d[0..len).
// [valid_lo, valid_hi): the output columns whose input column lies inside [0, W) for this kw.
template <class Pro>
inline void im2col_segment(const Conv2dArgs& a, const float* xr, int64_t ow, int64_t len, int64_t kw_off,
                           int64_t valid_lo, int64_t valid_hi, float* d, const Pro& pro, int64_t prow, int64_t ih) {
  if (!xr) {
    for (int64_t t = 0; t < len; ++t) d[t] = 0.f;
    return;
  }
  const int64_t sw = a.stride_w;
  const int64_t lo = std::clamp(valid_lo, ow, ow + len);
  const int64_t hi = std::clamp(valid_hi, lo, ow + len);
  int64_t o = ow;
  for (; o < lo; ++o) d[o - ow] = 0.f;
  if constexpr (is_identity_v<Pro>) {
    if (sw == 1) {
      const float* src = xr + kw_off;
      for (; o < hi; ++o) d[o - ow] = src[o];
    } else {
      for (; o < hi; ++o) d[o - ow] = xr[o * sw + kw_off];
    }
  } else {
    for (; o < hi; ++o) {
      const int64_t iw = o * sw + kw_off;
      d[o - ow] = pro(xr[iw], prow, ih * a.W + iw);
    }
  }
  for (; o < ow + len; ++o) d[o - ow] = 0.f;
}

// Gathers im2col rows k in [k0, k0+kc) x output positions [n0, n0+nv) of one (image, group)
// into consecutive NR panels (layout of pack_b_panel). Row k = (ci*KH + kh)*KW + kw; column
// n = oh*OW + ow. Each row is produced for all panels at once (contiguous input reads).
template <int NR, class Pro>
inline void pack_im2col_panel(const Conv2dArgs& a, const float* xg, int64_t row_base, int64_t k0, int64_t kc, int64_t n0,
                              int64_t nv, float* dst, const Pro& pro) {
  const int64_t khw = a.KH * a.KW, pstride = NR * kc, npanels = ceil_div(nv, NR);
  int64_t ci = k0 / khw, kh = (k0 % khw) / a.KW, kw = k0 % a.KW;
  const int64_t oh0 = n0 / a.OW, ow0 = n0 % a.OW;
  for (int64_t kk = 0; kk < kc; ++kk) {
    const float* xc = xg + ci * a.x_sc;
    const int64_t kh_off = kh * a.dil_h - a.pad_top, kw_off = kw * a.dil_w - a.pad_left;
    const int64_t valid_lo = kw_off >= 0 ? 0 : ceil_div(-kw_off, a.stride_w);
    const int64_t valid_hi = a.W - kw_off <= 0 ? 0 : ceil_div(a.W - kw_off, a.stride_w);
    int64_t c = 0, oh = oh0, ow = ow0;
    while (c < nv) {
      int64_t run = std::min(nv - c, a.OW - ow);
      const int64_t ih = oh * a.stride_h + kh_off;
      const float* xr = (ih < 0 || ih >= a.H) ? nullptr : xc + ih * a.x_sh;
      while (run > 0) {
        const int64_t in_panel = c % NR, len = std::min<int64_t>(run, NR - in_panel);
        im2col_segment(a, xr, ow, len, kw_off, valid_lo, valid_hi, dst + (c / NR) * pstride + kk * NR + in_panel, pro,
                       row_base + ci, ih);
        c += len, ow += len, run -= len;
      }
      ow = 0;
      ++oh;
    }
    for (int64_t t = nv; t < npanels * NR; ++t) dst[(t / NR) * pstride + kk * NR + t % NR] = 0.f;
    if (++kw == a.KW) {
      kw = 0;
      if (++kh == a.KH) kh = 0, ++ci;
    }
  }
}

template <class Arch, class Pro>
struct Im2colBSource {
  static constexpr bool prepacked = false;
  const Conv2dArgs& a;
  const Pro& pro;
  // Batch index b = n*group + g.
  void pack(int64_t b, int64_t k0, int64_t kc, int64_t n0, int64_t nv, float* dst) const {
    const int64_t n = b / a.group, g = b % a.group, cg = a.cin_per_group();
    const float* xg = a.x + n * a.x_sn + g * cg * a.x_sc;
    pack_im2col_panel<GemmTile<Arch>::NR>(a, xg, n * a.C + g * cg, k0, kc, n0, nv, dst, pro);
  }
};

// 1x1 / stride 1 / no padding: B_b is the input plane block [Cg, H*W] (rows strided by x_sc).
template <class Arch, class Pro>
struct Pointwise1x1BSource {
  static constexpr bool prepacked = false;
  const Conv2dArgs& a;
  const Pro& pro;
  void pack(int64_t b, int64_t k0, int64_t kc, int64_t n0, int64_t nv, float* dst) const {
    const int64_t n = b / a.group, g = b % a.group, cg = a.cin_per_group();
    const float* xg = a.x + n * a.x_sn + g * cg * a.x_sc;
    pack_b_panel<GemmTile<Arch>::NR>(xg, a.x_sc, 1, k0, kc, n0, nv, dst, pro, n * a.C + g * cg);
  }
};

}  // namespace detail

// Implicit-im2col GEMM convolution. Needs each output channel plane dense (y_sh == OW).
template <class Arch, class Ep = IdentityEpilogue, class ParFor = SerialFor, class Pro = IdentityPrologue>
void conv2d_gemm(const Conv2dArgs& a, const Ep& ep = {}, const ParFor& par = {}, const Pro& pro = {}) {
  using T = GemmTile<Arch>;
  const int64_t G = a.group, Kg = a.cout_per_group(), Cg = a.cin_per_group();
  const int64_t Kdim = Cg * a.KH * a.KW, Nsp = a.OH * a.OW;
  // Weights [G][Kg][Kdim]: batch b = n*G + g reads group g's; read in place (rows contiguous).
  const IdentityPrologue no_pro;
  detail::StridedASource<T::MR, IdentityPrologue> apack{a.w, Kdim, 1, Kg * Kdim, 0, no_pro, G};
  auto cptr = [&](int64_t b) { return a.y + (b / G) * a.y_sn + (b % G) * Kg * a.y_sc; };
  // GEMM rows are b*Kg + m = n*K + g*Kg + m: the output row of the contract.
  const bool pointwise = a.KH == 1 && a.KW == 1 && a.stride_h == 1 && a.stride_w == 1 && a.pad_top == 0 &&
                         a.pad_left == 0 && a.OH == a.H && a.OW == a.W && a.x_sh == a.W;
  if (pointwise) {
    detail::Pointwise1x1BSource<Arch, Pro> bsrc{a, pro};
    detail::gemm_driver<Arch>(a.N * G, Kg, Nsp, Kdim, apack, bsrc, cptr, a.y_sc, 1.f, ep, par);
  } else {
    detail::Im2colBSource<Arch, Pro> bsrc{a, pro};
    detail::gemm_driver<Arch>(a.N * G, Kg, Nsp, Kdim, apack, bsrc, cptr, a.y_sc, 1.f, ep, par);
  }
}

namespace detail {

// Output columns ow in [lo, hi) whose input column ow*sw + off lies inside [0, W).
inline void valid_out_range(int64_t OW, int64_t W, int64_t sw, int64_t off, int64_t& lo, int64_t& hi) {
  lo = off >= 0 ? 0 : ceil_div(-off, sw);
  hi = W - off <= 0 ? 0 : ceil_div(W - off, sw);
  lo = std::min(lo, OW);
  hi = std::clamp(hi, lo, OW);
}

// Per kw: the valid output column range (computed once per call, not per row).
struct KwRanges {
  std::vector<int64_t> lo, hi, off;
  KwRanges(const Conv2dArgs& a) : lo(size_t(a.KW)), hi(size_t(a.KW)), off(size_t(a.KW)) {
    for (int64_t kw = 0; kw < a.KW; ++kw) {
      off[size_t(kw)] = kw * a.dil_w - a.pad_left;
      valid_out_range(a.OW, a.W, a.stride_w, off[size_t(kw)], lo[size_t(kw)], hi[size_t(kw)]);
    }
  }
};

// acc[ow] += wv * x[ih, ow*sw + off] over ow in [lo, hi) (the columns outside the padding).
// Vectorised when sw == 1.
template <class Arch, class Pro>
inline void conv_row_accumulate(float* acc, const float* xr, int64_t lo, int64_t hi, int64_t sw, int64_t off, float wv,
                                const Pro& pro, int64_t prow, int64_t pcol_base) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  if constexpr (is_identity_v<Pro>) {
    if (sw == 1) {
      const V wb(wv);
      int64_t o = lo;
      const float* src = xr + off;
      for (; o + L <= hi; o += L)
        xsimd::fma(wb, V::load_unaligned(src + o), V::load_unaligned(acc + o)).store_unaligned(acc + o);
      for (; o < hi; ++o) acc[o] += wv * src[o];
      return;
    }
    for (int64_t o = lo; o < hi; ++o) acc[o] += wv * xr[o * sw + off];
  } else {
    for (int64_t o = lo; o < hi; ++o) {
      const int64_t iw = o * sw + off;
      acc[o] += wv * pro(xr[iw], prow, pcol_base + iw);
    }
  }
}

}  // namespace detail

// Depthwise: group == C, K = C * multiplier; output channel k reads input channel k / multiplier.
// Parallel over (image, output channel) planes. Per plane, the input is first copied into a
// zero-padded buffer split into stride_w phases (phase ph holds padded columns ph, ph + sw, ...),
// with the prologue applied on the way; then every tap of every output vector is one contiguous
// load from the buffer, for any stride, dilation and border (no scalar border columns).
template <class Arch, class Ep = IdentityEpilogue, class ParFor = SerialFor, class Pro = IdentityPrologue>
void conv2d_depthwise(const Conv2dArgs& a, const Ep& ep = {}, const ParFor& par = {}, const Pro& pro = {}) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  const int64_t mult = a.K / a.C, sw = a.stride_w;
  const int64_t ow_vec = ceil_div(a.OW, L) * L;  // output columns computed (the tail vector is partial)
  // Padded input columns read: up to (ow_vec - 1) * sw + (KW - 1) * dil_w; phase rows of length pw.
  const int64_t pw = ceil_div((ow_vec - 1) * sw + (a.KW - 1) * a.dil_w + 1, sw) + 1;
  const int64_t plane = a.H * sw * pw;
  // Buffer offset of tap kw for output column 0: padded column kw*dil_w is in phase
  // (kw*dil_w) % sw at index (kw*dil_w) / sw.
  std::vector<int64_t> tap_off(size_t(a.KW));
  for (int64_t kw = 0; kw < a.KW; ++kw) tap_off[size_t(kw)] = (kw * a.dil_w % sw) * pw + kw * a.dil_w / sw;
  par(a.N * a.K, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    float* buf = thread_scratch(ScratchSlot::Rows, plane + L);
    std::vector<const float*> tap_row(size_t(a.KH)), tap_w(size_t(a.KH));
    int64_t built = -1;  // the (n, c) plane currently in buf
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t n = p / a.K, k = p % a.K, c = k / mult;
      if (built != n * a.C + c) {
        built = n * a.C + c;
        const float* xc = a.x + n * a.x_sn + c * a.x_sc;
        for (int64_t ih = 0; ih < a.H; ++ih) {
          const float* xr = xc + ih * a.x_sh;
          if constexpr (detail::is_identity_v<Pro>) {
            // Stride 2 (MobileNet/EfficientNet downsampling): both phases in one pass, which the
            // compiler vectorises with shuffles; the general loop below would be scalar.
            if (sw == 2) {
              float* d0 = buf + (ih * 2) * pw;
              float* d1 = d0 + pw;
              const int64_t pl = a.pad_left;
              // Padded column i = 2j + ph reads input column i - pl; the fully inside j range:
              const int64_t jlo = std::min(ceil_div(pl, 2), pw);
              const int64_t jhi = std::clamp((a.W + pl - 1) / 2, jlo, pw);  // 2j + 1 - pl < W
              for (int64_t j = 0; j < jlo; ++j) {
                const int64_t i0 = 2 * j - pl, i1 = i0 + 1;
                d0[j] = i0 >= 0 && i0 < a.W ? xr[i0] : 0.f;
                d1[j] = i1 >= 0 && i1 < a.W ? xr[i1] : 0.f;
              }
              const float* src = xr - pl;
              for (int64_t j = jlo; j < jhi; ++j) {
                d0[j] = src[2 * j];
                d1[j] = src[2 * j + 1];
              }
              for (int64_t j = jhi; j < pw; ++j) {
                const int64_t i0 = 2 * j - pl, i1 = i0 + 1;
                d0[j] = i0 >= 0 && i0 < a.W ? xr[i0] : 0.f;
                d1[j] = i1 >= 0 && i1 < a.W ? xr[i1] : 0.f;
              }
              continue;
            }
          }
          for (int64_t ph = 0; ph < sw; ++ph) {
            float* d = buf + (ih * sw + ph) * pw;
            // j in [jlo, jhi) reads input column j*sw + ph - pad_left inside [0, W).
            int64_t jlo, jhi;
            detail::valid_out_range(pw, a.W, sw, ph - a.pad_left, jlo, jhi);
            std::fill(d, d + jlo, 0.f);
            const float* src = xr + ph - a.pad_left;
            if constexpr (detail::is_identity_v<Pro>) {
              if (sw == 1)
                std::copy(src + jlo, src + jhi, d + jlo);
              else
                for (int64_t j = jlo; j < jhi; ++j) d[j] = src[j * sw];
            } else {
              for (int64_t j = jlo; j < jhi; ++j) d[j] = pro(src[j * sw], built, ih * a.W + j * sw + ph - a.pad_left);
            }
            std::fill(d + jhi, d + pw, 0.f);
          }
        }
      }
      const float* wk = a.w + k * a.KH * a.KW;
      float* yk = a.y + n * a.y_sn + k * a.y_sc;
      for (int64_t oh = 0; oh < a.OH; ++oh) {
        float* yr = yk + oh * a.y_sh;
        // The kernel rows inside the input: their buffer rows and weights.
        int64_t nkh = 0;
        for (int64_t kh = 0; kh < a.KH; ++kh) {
          const int64_t ih = oh * a.stride_h - a.pad_top + kh * a.dil_h;
          if (ih >= 0 && ih < a.H) tap_row[nkh] = buf + ih * sw * pw, tap_w[nkh++] = wk + kh * a.KW;
        }
        // Up to 4 independent accumulators hide the FMA latency (a tap chain is KH*KW long); the
        // last block may hold fewer vectors, the last vector fewer columns (the buffer has slack
        // up to ow_vec, so its loads stay inside).
        auto block = [&](int64_t ow, auto u_count) {
          constexpr int64_t U = decltype(u_count)::value;
          V acc[U];
          for (int64_t u = 0; u < U; ++u) acc[u] = V(0.f);
          for (int64_t i = 0; i < nkh; ++i)
            for (int64_t kw = 0; kw < a.KW; ++kw) {
              const V wv(tap_w[i][kw]);
              const float* src = tap_row[i] + tap_off[kw] + ow;
              for (int64_t u = 0; u < U; ++u) acc[u] = xsimd::fma(wv, V::load_unaligned(src + u * L), acc[u]);
            }
          for (int64_t u = 0; u < U; ++u) {
            const int64_t o = ow + u * L;
            if (o + L <= a.OW) {
              ep(acc[u], p, oh * a.OW + o).store_unaligned(yr + o);
            } else {
              alignas(64) float t[L];
              acc[u].store_aligned(t);
              for (int64_t j = 0; o + j < a.OW; ++j) yr[o + j] = ep(t[j], p, oh * a.OW + o + j);
            }
          }
        };
        for (int64_t ow = 0; ow < a.OW; ow += 4 * L) {
          switch (std::min<int64_t>(4, ceil_div(a.OW - ow, L))) {
            case 4: block(ow, std::integral_constant<int64_t, 4>{}); break;
            case 3: block(ow, std::integral_constant<int64_t, 3>{}); break;
            case 2: block(ow, std::integral_constant<int64_t, 2>{}); break;
            default: block(ow, std::integral_constant<int64_t, 1>{}); break;
          }
        }
      }
    }
  });
}

// Direct convolution: per output row, accumulate over (ci, kh, kw) with the row vectorised.
// Handles any group count and output strides. Parallel over (image, output channel) planes.
template <class Arch, class Ep = IdentityEpilogue, class ParFor = SerialFor, class Pro = IdentityPrologue>
void conv2d_direct(const Conv2dArgs& a, const Ep& ep = {}, const ParFor& par = {}, const Pro& pro = {}) {
  const int64_t Kg = a.cout_per_group(), Cg = a.cin_per_group();
  const detail::KwRanges kr(a);
  par(a.N * a.K, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    float* acc = thread_scratch(ScratchSlot::Rows, a.OW);
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t n = p / a.K, k = p % a.K, g = k / Kg;
      float* yk = a.y + n * a.y_sn + k * a.y_sc;
      for (int64_t oh = 0; oh < a.OH; ++oh) {
        std::fill(acc, acc + a.OW, 0.f);
        for (int64_t ci = 0; ci < Cg; ++ci) {
          const int64_t c = g * Cg + ci;
          const float* xc = a.x + n * a.x_sn + c * a.x_sc;
          const float* wk = a.w + (k * Cg + ci) * a.KH * a.KW;
          for (int64_t kh = 0; kh < a.KH; ++kh) {
            const int64_t ih = oh * a.stride_h - a.pad_top + kh * a.dil_h;
            if (ih < 0 || ih >= a.H) continue;
            for (int64_t kw = 0; kw < a.KW; ++kw)
              detail::conv_row_accumulate<Arch>(acc, xc + ih * a.x_sh, kr.lo[size_t(kw)], kr.hi[size_t(kw)], a.stride_w,
                                                kr.off[size_t(kw)], wk[kh * a.KW + kw], pro, n * a.C + c, ih * a.W);
          }
        }
        store_row_with_epilogue<Arch>(yk + oh * a.y_sh, acc, a.OW, p, oh * a.OW, ep);
      }
    }
  });
}

// Picks the algorithm: depthwise for group == C (and K a multiple of C); the direct loops when the
// output planes are not dense or the GEMM would be tiny; otherwise implicit-im2col GEMM.
template <class Arch, class Ep = IdentityEpilogue, class ParFor = SerialFor, class Pro = IdentityPrologue>
void conv2d(const Conv2dArgs& a, const Ep& ep = {}, const ParFor& par = {}, const Pro& pro = {}) {
  if (a.N <= 0 || a.K <= 0 || a.OH <= 0 || a.OW <= 0) return;
  if (a.group == a.C && a.group > 1 && a.K % a.C == 0) return conv2d_depthwise<Arch>(a, ep, par, pro);
  const int64_t Kg = a.cout_per_group(), Kdim = a.cin_per_group() * a.KH * a.KW;
  if (a.y_sh != a.OW || Kg * Kdim < 64) return conv2d_direct<Arch>(a, ep, par, pro);
  conv2d_gemm<Arch>(a, ep, par, pro);
}

}  // namespace nnfuse::mk
