#pragma once
// 2-D max/average pooling and global pooling (NCHW); contract in microkernels.h.
// Per output row, each kernel tap (kh, kw) updates the whole row at once (vectorised when
// stride_w == 1), so windows are never gathered element by element.
#include "common.h"

namespace nnfuse::mk {

enum class PoolKind { Max, Avg };

struct Pool2dArgs {
  int64_t N = 1, C = 0, H = 0, W = 0;
  int64_t OH = 0, OW = 0;  // caller computes (ceil_mode included)
  int64_t KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t dil_h = 1, dil_w = 1;
  bool count_include_pad = false;
  const float* x = nullptr;
  int64_t x_sn = 0, x_sc = 0, x_sh = 0;  // W contiguous
  float* y = nullptr;
  int64_t y_sn = 0, y_sc = 0, y_sh = 0;  // OW contiguous

  void set_contiguous() {
    x_sh = W, x_sc = H * W, x_sn = C * H * W;
    y_sh = OW, y_sc = OH * OW, y_sn = C * OH * OW;
  }
};

namespace detail {

// Taps of window `o` along one dim: positions inside the input, and inside input + padding.
inline void pool_tap_counts(int64_t o, int64_t stride, int64_t pad_b, int64_t pad_e, int64_t dil, int64_t k, int64_t in,
                            int64_t& valid, int64_t& with_pad) {
  valid = with_pad = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = o * stride - pad_b + j * dil;
    valid += p >= 0 && p < in;
    with_pad += p >= -pad_b && p < in + pad_e;
  }
}

}  // namespace detail

template <class Arch, PoolKind Kind, class Ep = IdentityEpilogue, class ParFor = SerialFor, class Pro = IdentityPrologue>
void pool2d(const Pool2dArgs& a, const Ep& ep = {}, const ParFor& par = {}, const Pro& pro = {}) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  constexpr bool is_max = Kind == PoolKind::Max;
  constexpr bool identity_pro = std::is_same_v<std::decay_t<Pro>, IdentityEpilogue>;
  if (a.N <= 0 || a.C <= 0 || a.OH <= 0 || a.OW <= 0) return;
  // Per output column: 1 / (horizontal tap count) pieces for the average divisor.
  std::vector<int64_t> wcount(size_t(a.OW)), hcount(size_t(a.OH));
  for (int64_t o = 0; o < a.OW; ++o) {
    int64_t v, wp;
    detail::pool_tap_counts(o, a.stride_w, a.pad_left, a.pad_right, a.dil_w, a.KW, a.W, v, wp);
    wcount[size_t(o)] = a.count_include_pad ? wp : v;
  }
  for (int64_t o = 0; o < a.OH; ++o) {
    int64_t v, wp;
    detail::pool_tap_counts(o, a.stride_h, a.pad_top, a.pad_bottom, a.dil_h, a.KH, a.H, v, wp);
    hcount[size_t(o)] = a.count_include_pad ? wp : v;
  }
  // Per kw: the output columns [lo, hi) whose input column ow*sw + off lies inside [0, W).
  std::vector<int64_t> kw_lo(size_t(a.KW)), kw_hi(size_t(a.KW)), kw_off(size_t(a.KW));
  for (int64_t kw = 0; kw < a.KW; ++kw) {
    const int64_t off = kw * a.dil_w - a.pad_left;
    int64_t lo = off >= 0 ? 0 : ceil_div(-off, a.stride_w);
    int64_t hi = a.W - off <= 0 ? 0 : ceil_div(a.W - off, a.stride_w);
    lo = std::min(lo, a.OW);
    kw_lo[size_t(kw)] = lo, kw_hi[size_t(kw)] = std::clamp(hi, lo, a.OW), kw_off[size_t(kw)] = off;
  }
  const float init = is_max ? -std::numeric_limits<float>::infinity() : 0.f;
  par(a.N * a.C, [&](int64_t lo_p, int64_t hi_p) NNFUSE_MK_CHUNK {
    float* acc = thread_scratch(ScratchSlot::Rows, a.OW);
    for (int64_t p = lo_p; p < hi_p; ++p) {
      const int64_t n = p / a.C, c = p % a.C;
      const float* xc = a.x + n * a.x_sn + c * a.x_sc;
      float* yc = a.y + n * a.y_sn + c * a.y_sc;
      for (int64_t oh = 0; oh < a.OH; ++oh) {
        std::fill(acc, acc + a.OW, init);
        for (int64_t kh = 0; kh < a.KH; ++kh) {
          const int64_t ih = oh * a.stride_h - a.pad_top + kh * a.dil_h;
          if (ih < 0 || ih >= a.H) continue;
          const float* xr = xc + ih * a.x_sh;
          for (int64_t kw = 0; kw < a.KW; ++kw) {
            const int64_t off = kw_off[size_t(kw)], sw = a.stride_w, hi = kw_hi[size_t(kw)];
            int64_t o = kw_lo[size_t(kw)];
            if (identity_pro && sw == 1) {
              for (; o + L <= hi; o += L) {
                V v = V::load_unaligned(xr + o + off), s = V::load_unaligned(acc + o);
                (is_max ? xsimd::max(s, v) : s + v).store_unaligned(acc + o);
              }
            }
            for (; o < hi; ++o) {
              const int64_t iw = o * sw + off;
              float v = xr[iw];
              if constexpr (!identity_pro) v = pro(v, p, ih * a.W + iw);
              acc[o] = is_max ? (v > acc[o] ? v : acc[o]) : acc[o] + v;
            }
          }
        }
        if constexpr (!is_max) {
          const int64_t hc = hcount[size_t(oh)];
          for (int64_t o = 0; o < a.OW; ++o) {
            const int64_t cnt = hc * wcount[size_t(o)];
            acc[o] = cnt > 0 ? acc[o] / float(cnt) : 0.f;
          }
        }
        store_row_with_epilogue<Arch>(yc + oh * a.y_sh, acc, a.OW, p, oh * a.OW, ep);
      }
    }
  });
}

}  // namespace nnfuse::mk
