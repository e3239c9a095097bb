#pragma once
// Blocked-channel (NCHWc) convolution and pooling; contract in microkernels.h (section 6).
//
// Layout NCHW<L>c: a [N, C, H, W] tensor is stored as [N, ceil(C/L), H, W, L] with L = the
// vector width (16 floats AVX-512, 8 AVX2, 4 NEON); element (n, c, h, w) is at
// (((n*Cb + c/L)*H + h)*W + w)*L + c%L. The channels past C in the last block are padding: kernels
// never read them as data (input channels loop to C only; depthwise/pooling lanes are independent,
// so padding lanes only produce padding lanes) and may write anything there.
//
// Why: one vector holds L channels of one pixel, so a convolution is a sum of broadcast(input
// pixel, channel ci) * weight vector(ci, L output channels) FMAs with no horizontal work, no
// im2col, and contiguous stores; depthwise convolution and pooling are lane-wise vector ops for
// any stride. Epilogues see (row = n*Kb + kb, col = (oh*OW + ow)*L), i.e. the output's physical
// [N*Kb, OH*OW*L] view, so a batch is L output channels of one pixel.
#include "common.h"

namespace nnfuse::mk {

inline int64_t nchwc_blocks(int64_t c, int64_t L) { return (c + L - 1) / L; }

struct ConvNchwcArgs {
  int64_t N = 1, C = 0, H = 0, W = 0;  // input (logical)
  int64_t K = 0, OH = 0, OW = 0;       // output channels and spatial size
  int64_t KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, dil_h = 1, dil_w = 1;
  bool depthwise = false;  // group == C == K (needs a blocked input); otherwise dense or grouped
  int64_t group = 1;       // dense (1) or grouped: see conv_nchwc_windows for the groupings taken
  const float* x = nullptr;
  bool x_blocked = true;   // input NCHW<L>c, or plain NCHW (the first conv of a blocked chain)
  const float* w = nullptr;  // packed by pack_conv_nchwc_weights
  float* y = nullptr;        // NCHW<L>c output
};

// What the code generator knows about a convolution when it emits the call. An instantiation
// compiles only the paths its class can take: a dense conv has up to four register-blocked task
// shapes (output channel blocks per task), each with a checked and an unchecked tile, and a
// pointwise or a spatial tile body; compiling every combination for every fused epilogue was most
// of a CNN's build time (docs/codegen.md, "Compile time"). The default (Any, K = 0) compiles them
// all. A call whose arguments fall outside its class computes nothing and returns false
// (conv2d_nchwc); the generator only emits classes that its static shapes satisfy.
enum class ConvKind : int {
  Any,        // every path
  Pointwise,  // dense 1x1, no padding, every output pixel's tap inside the input (any stride)
  Spatial,    // dense, any kernel size and padding (not Pointwise)
  Depthwise,  // group == C == K
};
struct ConvClass {
  ConvKind kind = ConvKind::Any;
  int64_t K = 0;   // output channels, 0 = any
  int64_t kw = 0;  // kernel width, 0 = any (depthwise: which fixed-width row kernel to compile)
  int64_t sw = 0;  // column stride, 0 = any
  int64_t dw = 0;  // column dilation, 0 = any
  int64_t w = 0;   // input width, 0 = any (with kw, sw, dw: which depthwise row path runs; dense: up to
                   // kNarrowMapWidth, AVX-512 takes its 7-pixel tile)
  int64_t g = 0;   // groups of a Pointwise / Spatial conv (1: dense), 0 = any
};

// A grouped (not depthwise) conv in NCHW<L>c runs on the dense kernel by windows: consecutive
// output blocks that read one contiguous range of `span` input channels, `bpw` blocks per window.
//   - Kg a multiple of L (ResNeXt's and RegNet's wider groups, ShuffleNet's): a window is one
//     group, Kg / L blocks over its Cg input channels; no FMA is wasted.
//   - L a multiple of Kg (ResNeXt-50's 4- and 8-wide groups on AVX-512): a window is one block
//     holding L / Kg whole groups, over their (L / Kg) * Cg input channels; each lane's weights
//     are zero outside its own group, so L / Kg of the FMAs do work (not G of them, as a dense
//     conv over block-diagonal weights would).
// The window must start on a block boundary (span a multiple of L) so that it is whole blocks of a
// blocked input. A dense conv is one window of every block over all C channels.
// The lowering (lowering/layout.cpp, grouped_conv_blocks) states the same rule to decide which
// grouped convs run blocked; anything else stays NCHW (im2col per group, conv.h).
struct ConvWindows {
  int64_t bpw = 0, span = 0;  // output blocks and input channels per window; 0: not supported
};
constexpr ConvWindows conv_nchwc_windows(int64_t C, int64_t K, int64_t G, int64_t L) {
  const int64_t Kb = (K + L - 1) / L;
  if (G <= 1) return {Kb, C};
  if (C % G != 0 || K % G != 0) return {};
  const int64_t Cg = C / G, Kg = K / G;
  if (Kg % L == 0 && Cg % L == 0) return {Kg / L, Cg};
  if (L % Kg == 0 && (L / Kg * Cg) % L == 0) return {1, L / Kg * Cg};
  return {};
}

// Whether arguments `a` belong to class `cc`.
inline bool conv_pointwise_geometry(const ConvNchwcArgs& a) {
  return a.KH == 1 && a.KW == 1 && a.pad_top == 0 && a.pad_left == 0 && (a.OH - 1) * a.stride_h < a.H &&
         (a.OW - 1) * a.stride_w < a.W;
}
inline bool conv_class_admits(const ConvClass& cc, const ConvNchwcArgs& a) {
  if ((cc.K != 0 && cc.K != a.K) || (cc.kw != 0 && cc.kw != a.KW) || (cc.sw != 0 && cc.sw != a.stride_w) ||
      (cc.dw != 0 && cc.dw != a.dil_w) || (cc.w != 0 && cc.w != a.W))
    return false;
  const bool dense_groups = !a.depthwise && (cc.g == 0 || cc.g == a.group);
  switch (cc.kind) {
    case ConvKind::Any: return true;
    case ConvKind::Pointwise: return dense_groups && conv_pointwise_geometry(a);
    case ConvKind::Spatial: return dense_groups;
    case ConvKind::Depthwise: return a.depthwise;
  }
  return false;
}

// Whether a class's input maps are narrow (its width known and at most kNarrowMapWidth): picks a
// dense conv's register tile width (conv_nchwc_ur).
inline constexpr int64_t kNarrowMapWidth = 14;
constexpr bool conv_class_narrow_map(const ConvClass& cc) { return cc.w > 0 && cc.w <= kNarrowMapWidth; }

// Output channel blocks per dense task for vectors of L lanes (the register tile's height,
// conv_nchwc_ocbmax): 2 with AVX2's 16 vector registers, 4 with 32 (AVX-512, NEON).
constexpr int64_t conv_nchwc_task_blocks(int64_t L) { return L == 8 ? 2 : 4; }

// Weights [K, Cg, KH, KW] (Cg = C, or 1 for depthwise), zero padded, in output blocks of L
// channels: block kb's weights fill [kb * span * KH * KW * L, (kb + 1) * ...), span its window's
// input channels (below). A dense task's blocks (runs of conv_nchwc_task_blocks(L) from each
// window's start, the last run maybe shorter: nb blocks) are interleaved over that range as
// [span, KH, KW, nb, L], so that the nb vectors of one tap and channel are adjacent: the kernel
// addresses them from one pointer by constant displacements (with a stride per block, the strides
// and the pixel offsets spilled from the registers of the 1x1 loop), and a task's panel is one
// contiguous stream. Depthwise: [Kb, KH, KW, L] (nb = 1).
// Grouped (G > 1, not depthwise; Cg = C / G): span is a window's channels (conv_nchwc_windows),
// a lane's weight zero for a channel outside its group.
// A grouping the kernel does not take (conv_nchwc_windows: span 0) packs nothing.
// Dense and depthwise are the one-group case: one window of every block over all Cg channels.
inline int64_t conv_nchwc_packed_size(int64_t K, int64_t Cg, int64_t KH, int64_t KW, int64_t L, int64_t G = 1) {
  return nchwc_blocks(K, L) * conv_nchwc_windows(Cg * G, K, G, L).span * KH * KW * L;
}
// The packed layout itself: where the vector of output block kb, input channel ci of its window
// and tap t starts. Windows of bpw blocks, runs of `run` blocks from each window's start.
struct ConvPackedLayout {
  int64_t Kb, bpw, run, span, taps, L;
  // A dense (one-window) layout as the kernel's tasks read it; Winograd's products use it too.
  static ConvPackedLayout dense(int64_t Kb, int64_t span, int64_t taps, int64_t L) {
    return {Kb, Kb, conv_nchwc_task_blocks(L), span, taps, L};
  }
  int64_t offset(int64_t kb, int64_t ci, int64_t t) const {
    const int64_t wb0 = kb / bpw * bpw, kb0 = wb0 + (kb - wb0) / run * run;
    const int64_t nb = std::min(run, std::min(Kb, wb0 + bpw) - kb0);
    return kb0 * span * taps * L + ((ci * taps + t) * nb + (kb - kb0)) * L;
  }
};

inline void pack_conv_nchwc_weights(const float* w, int64_t K, int64_t Cg, int64_t KH, int64_t KW, int64_t L, float* dst,
                                    int64_t G = 1, bool depthwise = false) {
  const int64_t ktaps = KH * KW, Kb = nchwc_blocks(K, L);
  const ConvWindows win = conv_nchwc_windows(Cg * G, K, G, L);
  if (win.bpw <= 0) return;  // not taken: conv2d_nchwc refuses it, and its packed size is 0
  const ConvPackedLayout lay{Kb, win.bpw, depthwise ? 1 : conv_nchwc_task_blocks(L), win.span, ktaps, L};
  const int64_t Kg = K / G;
  for (int64_t kb = 0; kb < Kb; ++kb) {
    const int64_t cw0 = kb / win.bpw * win.span;
    for (int64_t cl = 0; cl < win.span; ++cl)
      for (int64_t t = 0; t < ktaps; ++t) {
        float* d = dst + lay.offset(kb, cl, t);
        for (int64_t l = 0; l < L; ++l) {
          const int64_t k = kb * L + l, ci = cw0 + cl, g = k / Kg;
          const bool in_group = k < K && ci >= g * Cg && ci < (g + 1) * Cg;
          d[l] = in_group ? w[(k * Cg + (ci - g * Cg)) * ktaps + t] : 0.f;
        }
      }
  }
}

// Packed weights owned by a prepare entry point.
struct PackedConvNchwc {
  AlignedVector<float> w;
  void pack(const float* src, int64_t K, int64_t Cg, int64_t KH, int64_t KW, int64_t L, int64_t G = 1, bool depthwise = false) {
    w.assign(size_t(conv_nchwc_packed_size(K, Cg, KH, KW, L, G)), 0.f);
    pack_conv_nchwc_weights(src, K, Cg, KH, KW, L, w.data(), G, depthwise);
  }
};

namespace detail {

// What a tap in the padding reads (a broadcast scalar or a vector of up to 16 lanes).
alignas(64) inline constexpr float kZeros[16] = {};

// Rows kh of the kernel whose input row oh*sh - pt + kh*dh lies inside [0, H): [lo, hi).
inline void kh_range(int64_t oh, int64_t sh, int64_t pt, int64_t dh, int64_t KH, int64_t H, int64_t& lo, int64_t& hi) {
  lo = 0, hi = KH;
  while (lo < KH && oh * sh - pt + lo * dh < 0) ++lo;
  while (hi > lo && oh * sh - pt + (hi - 1) * dh >= H) --hi;
}

// Calls tile(ow, nu, interior) over pixels [p0, p1) of one row in steps of at most UR, telling it
// whether every tap of the step lies inside [0, W) (the path without checks). The pixels left of
// the first interior one (the left padding) come first as a short tile of their own, so that the
// full tiles start on the first interior pixel: starting them at 0 put every pixel of a 14- or
// 28-wide padded row on the checked path.
template <int UR, class Tile>
inline void for_row_tiles(int64_t p0, int64_t p1, int64_t W, int64_t sw, int64_t pl, int64_t KW, int64_t dw, const Tile& tile) {
  const int64_t in_lo = pl > 0 ? ceil_div(pl, sw) : 0;
  const int64_t span = (KW - 1) * dw - pl;  // input column of the last tap minus ow*sw
  const int64_t in_hi = W - 1 - span < 0 ? 0 : (W - 1 - span) / sw + 1;
  int64_t ow = p0;
  for (const int64_t border = std::min(in_lo, p1); ow < border;) {
    const int64_t nu = std::min<int64_t>(UR, border - ow);
    tile(ow, nu, false);
    ow += nu;
  }
  for (; ow + UR <= p1; ow += UR) tile(ow, int64_t(UR), ow >= in_lo && ow + UR <= in_hi);
  if (ow < p1) tile(ow, p1 - ow, false);
}

// Where input channel c of image n starts, for a blocked or a plain NCHW input.
struct NchwcInput {
  const float* x;
  int64_t L, sn, cstride, sh, sw;
  bool blocked;
  NchwcInput(const float* px, bool blk, int64_t N, int64_t C, int64_t H, int64_t W, int64_t Lanes)
      : x(px), L(Lanes), blocked(blk) {
    (void)N;
    sw = blk ? Lanes : 1;
    sh = W * sw;
    cstride = H * W * (blk ? Lanes : 1);
    sn = (blk ? nchwc_blocks(C, Lanes) : C) * cstride;
  }
  // Lanes: the block width (== L), given at compile time: the channel loops step to the next
  // block through this, and by the run-time L it was a 64-bit division per block, on the path to
  // the block's first broadcast: ~10% of a 1x1 conv's time with its data in L1.
  template <int64_t Lanes>
  const float* chan(int64_t n, int64_t c) const {
    return x + n * sn + (blocked ? (c / Lanes) * cstride + c % Lanes : c * cstride);
  }
  // The input from channel c0 on (a grouped conv's window; blocked: c0 a multiple of L).
  NchwcInput from_channel(int64_t c0) const {
    NchwcInput r = *this;
    r.x = x + (blocked ? (c0 / L) * cstride : c0 * cstride);
    return r;
  }
};

// A part of the weight panel a dense task reads after the current one (its next input-channel
// chunk, or the next task's first): `lines` cache lines of 64 bytes from w (a panel is
// contiguous, see pack_conv_nchwc_weights). The tiles of a chunk prefetch the next panel into L2
// between them, one line per input channel and tap each, so that the next chunk finds its
// weights in L2 rather than waiting on L3: on 7x7 maps a chunk is only ~9 tiles, and the 1x1
// layers there ran 10% slower with their weights in L3 (where a model's are) than in L2; the
// 512-channel stride-2 3x3 conv, which prefetched nothing, 25% slower. (The first tile issuing
// the whole panel, four lines per channel, stalled on the prefetches themselves: a quarter of
// ResNet-50's stage-4 1x1 time sat on them.)
struct ConvPanelPrefetch {
  const float* w = nullptr;
  int64_t lines = 0;
};

// The geometry a dense conv walks (a 1x1 / stride-1 / unpadded conv is one row of OH*OW pixels
// over an input row of H*W).
struct ConvGeom {
  int64_t H, W, OH, OW, KH, KW, sh, sw, pt, pl, dh, dw;
};

// The 1x1 tile's channel loop: one tap per input channel, so walk the channels with pointer steps
// (within a block: the next lane; between blocks: the next block plane) and keep the loop to the
// FMAs. Pixel u reads at off[u] from a channel's start; OneRow: off[u] = off[0] + u * off-step,
// with Step > 0 the step known at compile time (a blocked stride-1 row: one block of lanes), so
// that the broadcasts address by constant displacements. Holding six pixel offsets and the
// prefetch pointers in registers besides the weight strides spilled them to the stack: 8 more
// loads per 24 FMAs, and ResNet-50's 1x1 layers ran at 62-79% of the FMA peak.
// Prefetch (pf, see ConvPanelPrefetch): this tile's part of the weight panel the task reads next,
// one line per channel prefetched into L2 alongside the channel's FMAs, in its own instantiation,
// so that the tiles with nothing to prefetch carry no prefetch state.
template <class Arch, int OCB, int UR, bool OneRow, int64_t Step, bool Prefetch>
inline void conv_nchwc_1x1_channels(vfloat<Arch> (&acc)[OCB][UR], const NchwcInput& in, int64_t n, int64_t c0, int64_t c1,
                                    const float* wc, const int64_t (&off)[UR], const ConvPanelPrefetch& pf) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  const int64_t step = Step > 0 ? Step : UR > 1 ? off[1] - off[0] : 0;
  // An index into the next panel, not a pointer: pf.w is null when there is none to prefetch, and
  // stepping a null pointer is undefined (UBSan's job flagged it).
  int64_t pfi = 0;
  for (int64_t ci = c0; ci < c1;) {
    const int64_t cend = in.blocked ? std::min(c1, (ci / L + 1) * L) : c1;
    const int64_t cstep = in.blocked ? 1 : in.cstride;
    const float* xp = in.chan<L>(n, ci) + off[0];
    for (; ci < cend; ++ci, xp += cstep, wc += OCB * L) {
      if constexpr (Prefetch) {
        if (pfi < pf.lines) __builtin_prefetch(pf.w + pfi * 16, 0, 2);  // 16 floats: one line
        ++pfi;
      }
      V wv[OCB];
      for (int o = 0; o < OCB; ++o) wv[o] = V::load_unaligned(wc + o * L);
      for (int u = 0; u < UR; ++u) {
        const V xv(OneRow ? xp[u * step] : xp[off[u] - off[0]]);
        for (int o = 0; o < OCB; ++o) acc[o][u] = xsimd::fma(xv, wv[o], acc[o][u]);
      }
    }
  }
}

// The general tile's channel loop: every tap of kernel rows [kh_lo, kh_hi) per input channel.
// Channels are walked with pointer steps as in the 1x1 loop (a division per channel to find its
// block was ~5% of a 3x3 conv). (Unrolling a 3-wide tap row spilled the pixel offsets.)
// Prefetch: this tile's part of the next weight panel (ConvPanelPrefetch), one line per tap.
// Check: taps in the padding read a zero instead of branching, so the accumulators stay in
// registers on the border path too; pixels from nu on do no work.
template <class Arch, int OCB, int UR, bool Check, bool Prefetch>
inline void conv_nchwc_spatial_channels(vfloat<Arch> (&acc)[OCB][UR], const ConvGeom& g, const NchwcInput& in, int64_t n,
                                        int64_t c0, int64_t c1, const float* w, int64_t kh_lo, int64_t kh_hi,
                                        int64_t nu, const int64_t (&ih0)[UR], const int64_t (&iw0)[UR], const int64_t (&off)[UR],
                                        const ConvPanelPrefetch& pf) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  const int64_t KW = g.KW, tapsL = g.KH * KW * OCB * L;
  int64_t pfi = 0;  // an index, not a pointer: pf.w is null when there is nothing to prefetch
  const int64_t rstep = g.dh * in.sh, cstep_tap = g.dw * in.sw;
  for (int64_t ci = c0; ci < c1;) {
    const int64_t cend = in.blocked ? std::min(c1, (ci / L + 1) * L) : c1;
    const int64_t cstep = in.blocked ? 1 : in.cstride;
    const float* xc = in.chan<L>(n, ci);
    const float* wc = w + ci * tapsL;
    for (; ci < cend; ++ci, xc += cstep, wc += tapsL) {
      for (int64_t kh = kh_lo; kh < kh_hi; ++kh) {
        const float* xr = xc + kh * rstep;
        const float* wr = wc + kh * KW * OCB * L;
        for (int64_t kw = 0; kw < KW; ++kw) {
          if constexpr (Prefetch) {
            if (pfi < pf.lines) __builtin_prefetch(pf.w + pfi * 16, 0, 2);
            ++pfi;
          }
          V wv[OCB];
          for (int o = 0; o < OCB; ++o) wv[o] = V::load_unaligned(wr + (kw * OCB + o) * L);
          for (int u = 0; u < UR; ++u) {
            if constexpr (Check)
              if (u >= nu) break;
            const float* xp = xr + off[u] + kw * cstep_tap;
            if constexpr (Check) {
              const int64_t ih = ih0[u] + kh * g.dh, iw = iw0[u] + kw * g.dw;
              xp = (uint64_t(ih) < uint64_t(g.H) && uint64_t(iw) < uint64_t(g.W)) ? xp : kZeros;
            }
            const V xv(*xp);
            for (int o = 0; o < OCB; ++o) acc[o][u] = xsimd::fma(xv, wv[o], acc[o][u]);
          }
        }
      }
    }
  }
}

// OCB output channel blocks x UR consecutive pixels of the flattened output plane, from (oh, ow)
// on (a tile may run on into the next row, so a 7- or 14-pixel row wastes no FMAs on a short
// tile), over input channels [c0, c1).
// Check: some taps of these pixels fall in the padding, or fewer than UR pixels (nu) remain.
// first: start from zero (else from the partial sums in y); last: apply ep.
// A Pointwise class runs every tile on the 1x1 channel loop, short ones too (their missing pixels
// repeat the last one and are not stored), in one instantiation (Check false: a pointwise tile
// has no taps to check, and the pixel count nu is tested at run time), and compiles no general
// tap loop; a Spatial or Depthwise class compiles no 1x1 loop.
template <class Arch, ConvClass CC, int OCB, int UR, bool Check, class Ep>
NNFUSE_MK_TILE void conv_nchwc_tile(const ConvGeom& g, const NchwcInput& in, const float* w, float* y,
                            int64_t ystride, int64_t n, int64_t row0, int64_t oh, int64_t ow, int64_t nu, int64_t c0, int64_t c1,
                            bool first, bool last, const Ep& ep, const ConvPanelPrefetch& pf = {}) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  constexpr bool pointwise = CC.kind == ConvKind::Pointwise, may_pointwise = pointwise || CC.kind == ConvKind::Any;
  constexpr bool short_tile = Check || pointwise;  // nu < UR possible
  const int64_t q0 = oh * g.OW + ow;
  V acc[OCB][UR];
  float* yp = y + q0 * L;
  for (int o = 0; o < OCB; ++o)
    for (int u = 0; u < UR; ++u)
      acc[o][u] = (first || (short_tile && u >= nu)) ? V(0.f) : V::load_unaligned(yp + o * ystride + u * L);
  // Per pixel: the input coordinate of its first tap and that tap's offset from a channel's start
  // (pixels past nu repeat the last one; they are never stored). Only a tile that crosses a row
  // needs the table; within a row, pixel u is u steps on.
  const bool one_row = ow + UR <= g.OW;
  int64_t ih0[UR], iw0[UR], off[UR];
  auto fill = [&] {
    for (int64_t u = 0, h = oh, c = ow; u < UR; ++u) {
      ih0[u] = h * g.sh - g.pt, iw0[u] = c * g.sw - g.pl;
      off[u] = ih0[u] * in.sh + iw0[u] * in.sw;
      if (u + 1 < nu && ++c == g.OW) c = 0, ++h;
    }
  };
  const int64_t taps = g.KH * g.KW;
  if constexpr (may_pointwise) {
    if (pointwise || (!Check && taps == 1)) {
      // 1x1: one tap per input channel, so walk the channels with pointer steps (within a block:
      // the next lane; between blocks: the next block plane) and keep the loop to the FMAs.
      // Within a row pixel u reads u steps on; across a row change, at its own offset.
      const bool prefetch = pf.lines > 0;
      if (one_row && nu == UR) {
        const int64_t base = (oh * g.sh - g.pt) * in.sh + (ow * g.sw - g.pl) * in.sw, step = g.sw * in.sw;
        for (int u = 0; u < UR; ++u) off[u] = base + u * step;
        if (step == L && !prefetch)
          conv_nchwc_1x1_channels<Arch, OCB, UR, true, L, false>(acc, in, n, c0, c1, w + c0 * OCB * L, off, pf);
        else if (step == L)
          conv_nchwc_1x1_channels<Arch, OCB, UR, true, L, true>(acc, in, n, c0, c1, w + c0 * OCB * L, off, pf);
        else
          conv_nchwc_1x1_channels<Arch, OCB, UR, true, 0, true>(acc, in, n, c0, c1, w + c0 * OCB * L, off, pf);
      } else {
        fill();
        conv_nchwc_1x1_channels<Arch, OCB, UR, false, 0, true>(acc, in, n, c0, c1, w + c0 * OCB * L, off, pf);
      }
      c1 = c0;  // done: skip the general loop
    }
  }
  if (!pointwise && c0 < c1) {
    fill();
    // Kernel rows inside the input for at least one pixel: from the last row's first to the first
    // row's last (both bounds fall as the output row grows).
    int64_t kh_lo, kh_hi, unused;
    kh_range(one_row ? oh : (q0 + nu - 1) / g.OW, g.sh, g.pt, g.dh, g.KH, g.H, kh_lo, unused);
    kh_range(oh, g.sh, g.pt, g.dh, g.KH, g.H, unused, kh_hi);
    if (pf.lines > 0)
      conv_nchwc_spatial_channels<Arch, OCB, UR, Check, true>(acc, g, in, n, c0, c1, w, kh_lo, kh_hi, nu, ih0, iw0, off, pf);
    else
      conv_nchwc_spatial_channels<Arch, OCB, UR, Check, false>(acc, g, in, n, c0, c1, w, kh_lo, kh_hi, nu, ih0, iw0, off, pf);
  }
  if (!last || (short_tile && nu < UR)) {
    for (int o = 0; o < OCB; ++o)
      for (int u = 0; u < UR; ++u) {
        if (short_tile && u >= nu) break;
        const V r = last ? ep(acc[o][u], row0 + o, (q0 + u) * L) : acc[o][u];
        r.store_unaligned(yp + o * ystride + u * L);
      }
    return;
  }
  // A whole tile's epilogue: every result first, then every store, unrolled. The epilogue's loads
  // (a bias, a residual) may alias y for all the compiler knows, so with a store between two
  // calls it reloaded the bias of the same output block for every pixel, and the rolled loop with
  // its early exit kept the accumulators on the stack: a bias + Clip epilogue cost 7% of a
  // 96 -> 576 1x1 conv and 17% of a 24 -> 144 one (whose FMAs per output vector are few).
  V r[OCB][UR];
#pragma GCC unroll 4
  for (int o = 0; o < OCB; ++o)
#pragma GCC unroll 16
    for (int u = 0; u < UR; ++u) r[o][u] = ep(acc[o][u], row0 + o, (q0 + u) * L);
#pragma GCC unroll 4
  for (int o = 0; o < OCB; ++o)
#pragma GCC unroll 16
    for (int u = 0; u < UR; ++u) r[o][u].store_unaligned(yp + o * ystride + u * L);
}

// Output channel blocks per dense task (the register tile's height): 2 with AVX2's 16 vector
// registers, 4 with 32 (AVX-512, NEON).
template <class Arch>
constexpr int conv_nchwc_ocbmax() {
  return int(conv_nchwc_task_blocks(int64_t(vfloat<Arch>::size)));
}

// Whether a dense task of `ocb` output blocks occurs in class CC: tasks take conv_nchwc_ocbmax
// blocks, the last one of a channel range what is left.
// A grouped conv's tasks do the same within each window of output blocks (the last one maybe shorter).
template <class Arch, ConvClass CC>
constexpr bool conv_nchwc_task_used(int ocb) {
  constexpr int64_t L = int64_t(vfloat<Arch>::size);
  constexpr int ocbmax = conv_nchwc_ocbmax<Arch>();
  if (CC.K == 0 || CC.g == 0) return ocb <= ocbmax;
  const int64_t Kb = (CC.K + L - 1) / L;
  // Blocks per window depend on K, G and L only (conv_nchwc_windows; C = K stands in for the span).
  const int64_t bpw = conv_nchwc_windows(CC.K, CC.K, CC.g, L).bpw;
  if (bpw <= 0) return ocb <= ocbmax;
  auto window_has = [&](int64_t blocks) { return ocb == ocbmax ? blocks >= ocbmax : ocb == blocks % ocbmax; };
  return window_has(std::min(bpw, Kb)) || window_has(Kb - (Kb - 1) / bpw * bpw);
}

// Accumulators per pixel for OCB output blocks: all vector registers but the weights and the
// broadcast input (16 on AVX2, 32 on AVX-512 and NEON).
// Except AVX2's two-block 1x1 tile (a Pointwise class), which takes 5 pixels, not 6: 10
// accumulators still cover the FMA latency, the 49 pixels of a 7x7 map are 10 tiles of 5
// where they were 9 of 6 (the ninth for one pixel), and the registers left over kept the
// compiler from parking an accumulator on the stack around each block of channels. On a Zen 3
// core the 7x7 1x1 layers of ResNet-50 and MobileNetV2 ran 8-10% faster and the others 0-3%;
// the 3x3 layers on the same tile ran up to 10% slower with 5, so they keep 6
// (bench/kernels_bench.cpp --only conv, session 28).
// And AVX-512 on narrow maps (a class whose input width is known and at most kNarrowMapWidth:
// ResNet-50's stage 4, MobileNet's and EfficientNet's 7x7 and 14x14 tails), where the broadcast's
// register goes to the accumulators too: the four-block tile takes 7 pixels, not 6, so a 7x7 map
// is 7 tiles, not 8 and a one-pixel one (narrower tiles come out as before). The compiler then
// keeps one accumulator on the stack per input channel; on wider maps that costs more than the
// idle pixels it saves (ResNet-50's kernels on a Cascade Lake: 0.88-0.94 on 7x7 maps, 0.92-0.98
// on most 14x14 ones, 1.03-1.13 on 56x56; bench/RESULTS.md, session 32).
template <class Arch>
constexpr int conv_nchwc_ur(int ocb, bool pointwise = false, bool narrow_map = false) {
  const int regs = vfloat<Arch>::size == 8 ? 16 : 32;
  if (pointwise && regs == 16 && ocb == 2) return 5;
  const int ur = (regs - ocb - (narrow_map && vfloat<Arch>::size == 16 ? 0 : 1)) / ocb;
  return ur > 14 ? 14 : ur;
}

// Whether every tap of output pixel (oh, ow) reads inside the input (no padding).
inline bool conv_pixel_interior(const ConvGeom& g, int64_t oh, int64_t ow) {
  const int64_t ih = oh * g.sh - g.pt, iw = ow * g.sw - g.pl;
  return ih >= 0 && ih + (g.KH - 1) * g.dh < g.H && iw >= 0 && iw + (g.KW - 1) * g.dw < g.W;
}

// Which way a conv's tasks are ordered: pixels outermost (each task range of the par-for is a
// band of the image, all output channels) or output channels outermost (a range of channels, all
// pixels). The runtime hands each thread the same part of every par-for (kernels/thread_pool.cpp),
// so with pixels outermost a thread's band of one layer is, but for a halo, the band it reads in
// the next: the activations stay in its own L2. Where the weights are larger than the input
// (K * taps > H * W: the 7x7 and 14x14 layers with hundreds of channels), splitting by pixels
// would have each thread read every weight, so those split by channels. A depthwise conv follows
// the pointwise conv that feeds it (the same test on its channel count). One thread keeps the
// channel-major order: it has no other core to keep data from, and the first layers of
// MobileNetV2 ran 5-18% slower pixels-first.
inline bool conv_pixels_outermost(int64_t threads, int64_t K, int64_t taps, int64_t H, int64_t W) {
  return threads > 1 && K * taps <= H * W;
}

// One task: output blocks [kb0, kb0 + OCB) of image n, pixels [q0, q1) of the flattened plane,
// over the cin input channels of `in` (all C, or a grouped conv's window; the packed weights hold
// wspan channels per block). The input-channel chunk is the outer loop, so its weight panel comes
// from memory once per task and from L2 for every tile after the first.
template <class Arch, ConvClass CC, int OCB, class Ep>
inline void conv_nchwc_task(const ConvNchwcArgs& a, const ConvGeom& g, const NchwcInput& in, int64_t cin, int64_t wspan,
                            int64_t cchunk, int64_t n, int64_t kb0, int64_t q0, int64_t q1, const Ep& ep) {
  constexpr int UR = conv_nchwc_ur<Arch>(OCB, CC.kind == ConvKind::Pointwise, conv_class_narrow_map(CC));
  constexpr int64_t L = int64_t(vfloat<Arch>::size);
  const int64_t Kb = nchwc_blocks(a.K, L), taps = g.KH * g.KW;
  const int64_t ystride = g.OH * g.OW * L;
  const float* w = a.w + kb0 * wspan * taps * L;  // this task's panel: [wspan, taps, OCB, L]
  float* y = a.y + (n * Kb + kb0) * ystride;
  for (int64_t c0 = 0; c0 < cin; c0 += cchunk) {
    const int64_t c1 = std::min(cin, c0 + cchunk);
    const bool first = c0 == 0, last = c1 == cin;
    // The next panel: this task's next chunk, or after the last one the next output blocks' first
    // (its size in lines of 16 floats); tile i prefetches lines [i * share, ...) of it, a line
    // per channel and tap.
    ConvPanelPrefetch next;
    if (c1 < cin) next = {w + c1 * taps * OCB * L, ceil_div((std::min(cin, c1 + cchunk) - c1) * taps * OCB * L, int64_t(16))};
    else if (kb0 + OCB < Kb)
      next = {w + OCB * wspan * taps * L, ceil_div(std::min(cin, cchunk) * taps * std::min<int64_t>(OCB, Kb - kb0 - OCB) * L, int64_t(16))};
    const int64_t share = (c1 - c0) * taps;
    for (int64_t q = q0, oh = q0 / g.OW, ow = q0 % g.OW, ti = 0; q < q1; q += UR, ++ti) {
      const int64_t nu = std::min<int64_t>(UR, q1 - q);
      const int64_t row0 = n * Kb + kb0, done = ti * share;
      const ConvPanelPrefetch pf =
          next.lines > done ? ConvPanelPrefetch{next.w + done * 16, std::min(share, next.lines - done)} : ConvPanelPrefetch{};
      if constexpr (CC.kind == ConvKind::Pointwise) {  // every tap inside: one tile for all
        conv_nchwc_tile<Arch, CC, OCB, UR, false>(g, in, w, y, ystride, n, row0, oh, ow, nu, c0, c1, first, last, ep, pf);
      } else {
        // Interior: UR pixels whose taps all lie inside the input (the first and last pixel
        // decide within a row).
        bool interior = nu == UR;
        if (interior && ow + UR <= g.OW)
          interior = conv_pixel_interior(g, oh, ow) && conv_pixel_interior(g, oh, ow + UR - 1);
        else
          for (int64_t u = 0, h = oh, c = ow; interior && u < UR; ++u, c = c + 1 == g.OW ? 0 : c + 1, h += c == 0)
            interior = conv_pixel_interior(g, h, c);
        if (interior)
          conv_nchwc_tile<Arch, CC, OCB, UR, false>(g, in, w, y, ystride, n, row0, oh, ow, nu, c0, c1, first, last, ep, pf);
        else
          conv_nchwc_tile<Arch, CC, OCB, UR, true>(g, in, w, y, ystride, n, row0, oh, ow, nu, c0, c1, first, last, ep, pf);
      }
      ow += UR;
      if (ow >= g.OW) oh += ow / g.OW, ow %= g.OW;
    }
  }
}

// Runs the task of `ocb` output blocks, where class CC has that task shape (see
// conv_nchwc_task_used; the others are not compiled).
template <class Arch, ConvClass CC, int OCB = conv_nchwc_ocbmax<Arch>(), class Ep>
inline void conv_nchwc_task_of(int64_t ocb, const ConvNchwcArgs& a, const ConvGeom& g, const NchwcInput& in, int64_t cin,
                               int64_t wspan, int64_t cchunk, int64_t n, int64_t kb0, int64_t q0, int64_t q1, const Ep& ep) {
  if constexpr (OCB >= 1) {
    if constexpr (conv_nchwc_task_used<Arch, CC>(OCB))
      if (ocb == OCB) return conv_nchwc_task<Arch, CC, OCB>(a, g, in, cin, wspan, cchunk, n, kb0, q0, q1, ep);
    conv_nchwc_task_of<Arch, CC, OCB - 1>(ocb, a, g, in, cin, wspan, cchunk, n, kb0, q0, q1, ep);
  } else {
    // No compiled task shape matched: conv_nchwc_task_used pruned one that occurs. Never return
    // with the output unwritten; this is a bug in the class logic, not a property of the input.
    __builtin_trap();
  }
}

// Blocks one row of a plain NCHW input: n pixels `step` apart from src (channel c0's first), the
// lanes of channels c0 .. c0 + lanes (planes `plane` apart) into d as n vectors of L, lanes past
// the input's channels zero. Both of the dense conv's input copies use it.
inline void gather_plain_row(float* d, const float* src, int64_t n, int64_t step, int64_t plane, int64_t lanes, int64_t L) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t l = 0; l < L; ++l) d[j * L + l] = l < lanes ? src[l * plane + j * step] : 0.f;
}

template <class Arch, ConvClass CC, class Ep, class ParFor>
void conv_nchwc_dense(const ConvNchwcArgs& a, const Ep& ep, const ParFor& par) {
  constexpr int64_t L = int64_t(vfloat<Arch>::size);
  constexpr int OCBMAX = conv_nchwc_ocbmax<Arch>();
  const int64_t Kb = nchwc_blocks(a.K, L);
  const ConvWindows win = conv_nchwc_windows(a.C, a.K, a.group, L);  // checked by conv2d_nchwc
  ConvGeom g{a.H, a.W, a.OH, a.OW, a.KH, a.KW, a.stride_h, a.stride_w, a.pad_top, a.pad_left, a.dil_h, a.dil_w};
  const bool flat = a.KH == 1 && a.KW == 1 && a.stride_h == 1 && a.stride_w == 1 && a.pad_top == 0 && a.pad_left == 0 &&
                    a.OH == a.H && a.OW == a.W;
  if (flat) g = ConvGeom{1, a.H * a.W, 1, a.OH * a.OW, 1, 1, 1, 1, 0, 0, 1, 1};
  // A padded blocked input is first copied into a zero-bordered scratch image covering every tap
  // (rows -pt .. (OH-1)*sh - pt + (KH-1)*dh), and the conv runs unpadded on it: on 7- to 28-wide
  // maps most UR-pixel tiles touch the border, and the checked tile spends more instructions on
  // bounds than on FMAs (ResNet-50's 3x3 layers on 7x7 and 14x14 outputs ran at ~75-100 GFLOP/s
  // against ~150 for its 1x1 layers). The copy is one pass over the input, from cache; it is
  // skipped where it would cost more than it saves: inputs of under one block of channels (a
  // first layer's 3 channels copy as 16) and convs with little work per input value. A plain NCHW
  // input (the first conv of a blocked chain) is blocked by the same copy, lanes past C zero.
  const float* xsrc = a.x;
  bool x_blocked = a.x_blocked;
  const int64_t Hp = (a.OH - 1) * a.stride_h + (a.KH - 1) * a.dil_h + 1, Wp = (a.OW - 1) * a.stride_w + (a.KW - 1) * a.dil_w + 1;
  const int64_t Cb = nchwc_blocks(a.C, L);
  const double fma_per_copied = double(a.K) * double(a.KH * a.KW) * double(win.span) * double(a.OH * a.OW) / double(Cb * L * Hp * Wp);
  if (!flat && a.C >= L && fma_per_copied >= 32 &&
      (a.pad_top > 0 || a.pad_left > 0 || Hp - a.pad_top > a.H || Wp - a.pad_left > a.W)) {
    float* xp = thread_scratch(ScratchSlot::ConvPadded, a.N * Cb * Hp * Wp * L);
    par(a.N * Cb, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
      for (int64_t t = lo; t < hi; ++t) {
        float* dst = xp + t * Hp * Wp * L;
        const int64_t w0 = std::min(a.pad_left, Wp), wn = std::max<int64_t>(0, std::min(a.W, Wp - w0));
        // Plain input: block t's channels, each a plane of H*W (lanes past C read as zero).
        const int64_t n = t / Cb, c0 = t % Cb * L, lanes = std::min(L, a.C - c0);
        const float* plane = a.x + (n * a.C + c0) * a.H * a.W;
        for (int64_t r = 0; r < Hp; ++r) {
          float* d = dst + r * Wp * L;
          const int64_t ih = r - a.pad_top;
          if (ih < 0 || ih >= a.H) {
            std::memset(d, 0, size_t(Wp * L) * sizeof(float));
            continue;
          }
          std::memset(d, 0, size_t(w0 * L) * sizeof(float));
          if (a.x_blocked) {
            std::memcpy(d + w0 * L, a.x + t * a.H * a.W * L + ih * a.W * L, size_t(wn * L) * sizeof(float));
          } else {
            gather_plain_row(d + w0 * L, plane + ih * a.W, wn, 1, a.H * a.W, lanes, L);
          }
          std::memset(d + (w0 + wn) * L, 0, size_t((Wp - w0 - wn) * L) * sizeof(float));
        }
      }
    });
    xsrc = xp;
    x_blocked = true;
    g.H = Hp, g.W = Wp, g.pt = 0, g.pl = 0;
  } else if (conv_pointwise_geometry(a) && (a.stride_h > 1 || a.stride_w > 1) && a.C >= L &&
             double(a.K) * double(win.span) / double(Cb * L) >= 32) {
    // A strided 1x1 conv (ResNet's downsample projections) reads one pixel in stride_h *
    // stride_w, each a cache line of its own, once per task of output blocks: its tiles broadcast
    // from lines scattered over an input larger than L2. The pixels it reads are first gathered
    // into a compact image (one pass, the same copy slot as the bordered one), which the conv then
    // walks as one row of OH * OW pixels, as a stride-1 1x1 conv: ResNet-50's 256 -> 56x56 -> 512
    // projection went from 1.53 to 1.31-1.37 ms; its 28x28 and 14x14 ones, whose inputs fit in
    // L2, did not change (bench/kernels_bench.cpp --only conv, session 23).
    float* xp = thread_scratch(ScratchSlot::ConvPadded, a.N * Cb * a.OH * a.OW * L);
    par(a.N * Cb * a.OH, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t nb = t / a.OH, oh = t % a.OH, n = nb / Cb, c0 = nb % Cb * L, lanes = std::min(L, a.C - c0);
        float* d = xp + t * a.OW * L;
        if (a.x_blocked) {
          const float* src = a.x + (nb * a.H + oh * a.stride_h) * a.W * L;
          for (int64_t ow = 0; ow < a.OW; ++ow) std::memcpy(d + ow * L, src + ow * a.stride_w * L, size_t(L) * sizeof(float));
        } else {
          gather_plain_row(d, a.x + ((n * a.C + c0) * a.H + oh * a.stride_h) * a.W, a.OW, a.stride_w, a.H * a.W, lanes, L);
        }
      }
    });
    xsrc = xp;
    x_blocked = true;
    g = ConvGeom{1, a.OH * a.OW, 1, a.OH * a.OW, 1, 1, 1, 1, 0, 0, 1, 1};
  }
  const NchwcInput in(xsrc, x_blocked, a.N, a.C, g.H, g.W, L);
  // Input channels per pass: the weight panel (OCB blocks) stays within ~32 KiB (L1; at least one
  // block of channels), partial sums go through y between passes (never split across tasks:
  // results do not depend on par). A 128 KiB (L2) panel measured 5-10% slower on the 1x1 layers
  // with 256-2048 input channels on a Xeon (bench/kernels_bench.cpp --only conv).
  // A 1x1 pass takes 8 blocks of channels: each step of its tiles reads the next pixels of every
  // block plane in the pass, one stream per block, and the hardware prefetchers follow about that
  // many. (AVX-512's 32 KiB panel is 8 blocks anyway; AVX2's was 64 blocks of 8 channels, and on a
  // Zen 3 core ResNet-50's 1x1 convs with 256-2048 input channels ran 1.4-1.8x slower than ONNX
  // Runtime's until they took 8: 25-40% faster in the model, bench/RESULTS.md, session 25.)
  // Where the conv's whole input is in L2 anyway (up to 192 KiB: MobileNet's and EfficientNet's
  // 7x7 and 14x14 maps), the streams matter less than the passes: each pass stores and reloads
  // the partial sums and runs the epilogue's bookkeeping, so a 1x1 pass takes up to 32 blocks
  // (AVX2: a 16 KiB panel). And the blocks are split into equal passes, as many as the nearest
  // multiple of that size gives (a panel never past 32 KiB): 10 blocks ran as 8 + 2, the second
  // pass a fifth of the work for a whole pass's overhead; 18 now run as 9 + 9.
  // (kernels_bench --only conv, Zen 3: MobileNet's 1x1 layers 1-7% faster, ResNet-50's the same;
  // 32 blocks where the input is past L2 made ResNet-50's 1024- and 2048-channel layers 10-20%
  // slower, session 31.)
  const int64_t taps = g.KH * g.KW;
  int64_t cchunk = std::max<int64_t>(L, 8192 / (OCBMAX * L * taps));
  if (taps == 1) {
    const int64_t span_blocks = nchwc_blocks(win.span, L);
    const bool input_in_l2 = span_blocks * L * g.H * g.W * int64_t(sizeof(float)) <= (int64_t(192) << 10);
    const int64_t panel_cap = 32768 / (OCBMAX * L * L * int64_t(sizeof(float)));  // blocks in a 32 KiB panel
    const int64_t most = std::min<int64_t>(input_in_l2 ? 32 : 8, panel_cap);
    const int64_t passes = std::max({int64_t(1), ceil_div(span_blocks, panel_cap), (span_blocks + most / 2) / most});
    cchunk = ceil_div(span_blocks, passes) * L;
  }
  // Tasks along the output channels: each window's blocks in runs of OCBMAX.
  const int64_t tpw = ceil_div(win.bpw, int64_t(OCBMAX)), P = g.OH * g.OW, kgroups = ceil_div(Kb, win.bpw) * tpw;
  // Pixels per task, a multiple of the tile width UR of the usual task (ocb blocks: OCBMAX, or all
  // of a narrower conv's or window's): few enough that the task's partial sums stay within ~64 KiB,
  // where the next chunk finds them; many enough that a task streams its weight panel for as many
  // pixels as it can while every worker still gets ~4 tasks. (Segments in multiples of the
  // 4-block tile's 6 pixels left a 16-channel conv's 14-pixel tiles short at every task end, on
  // the checked path.)
  const int64_t ocb = std::min<int64_t>(OCBMAX, std::min(win.bpw, Kb));
  const int64_t UR = conv_nchwc_ur<Arch>(int(ocb), CC.kind == ConvKind::Pointwise, conv_class_narrow_map(CC));
  const int64_t qmax = std::max<int64_t>(UR, 16384 / (ocb * L) / UR * UR);
  const int64_t threads = par_threads(par);  // how finely to split (results never depend on it)
  const int64_t want = 4 * std::max<int64_t>(1, threads), nseg_want = std::max<int64_t>(1, ceil_div(want, a.N * kgroups));
  const int64_t qseg = std::min(qmax, ceil_div(ceil_div(P, nseg_want), UR) * UR), nseg = ceil_div(P, qseg);
  const int64_t tasks = a.N * kgroups * nseg;
  const bool pixels_outer = conv_pixels_outermost(threads, a.K * win.span / a.C, a.KH * a.KW, a.H, a.W);
  par(tasks, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t n = t / (nseg * kgroups), i = t % (nseg * kgroups);
      const int64_t s = pixels_outer ? i / kgroups : i % nseg, kg = pixels_outer ? i % kgroups : i / nseg;
      const int64_t wi = kg / tpw, kb0 = wi * win.bpw + kg % tpw * OCBMAX, kend = std::min(Kb, (wi + 1) * win.bpw);
      const int64_t q0 = s * qseg, q1 = std::min(P, q0 + qseg), cw0 = wi * win.span;
      conv_nchwc_task_of<Arch, CC>(std::min<int64_t>(OCBMAX, kend - kb0), a, g, win.bpw == Kb ? in : in.from_channel(cw0),
                                   std::min(win.span, a.C - cw0), win.span, cchunk, n, kb0, q0, q1, ep);
    }
  });
}

// Depthwise: UR pixels of one channel block, lane-wise FMAs with vector loads of the input.
template <class Arch, int UR, bool Check, class Ep>
inline void dw_nchwc_tile(const ConvNchwcArgs& a, const float* xb, const float* wb, float* yb, int64_t row, int64_t oh,
                          int64_t ow, int64_t nu, int64_t kh_lo, int64_t kh_hi, const Ep& ep) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  V acc[UR];
  for (int u = 0; u < UR; ++u) acc[u] = V(0.f);
  for (int64_t kh = kh_lo; kh < kh_hi; ++kh) {
    const float* xr = xb + (oh * a.stride_h - a.pad_top + kh * a.dil_h) * a.W * L;
    for (int64_t kw = 0; kw < a.KW; ++kw) {
      const V wv = V::load_unaligned(wb + (kh * a.KW + kw) * L);
      const int64_t iw0 = ow * a.stride_w - a.pad_left + kw * a.dil_w;
      for (int u = 0; u < UR; ++u) {
        if constexpr (Check)
          if (u >= nu) break;  // a short tile does no work for its missing pixels
        const int64_t iw = iw0 + u * a.stride_w;
        const float* xp = xr + iw * L;
        if constexpr (Check) xp = (iw >= 0 && iw < a.W) ? xp : kZeros;
        acc[u] = xsimd::fma(V::load_unaligned(xp), wv, acc[u]);
      }
    }
  }
  for (int u = 0; u < UR; ++u) {
    if (Check && u >= nu) break;
    const int64_t p = oh * a.OW + ow + u;
    ep(acc[u], row, p * L).store_unaligned(yb + p * L);
  }
}

// Depthwise task t of N * Cb * OH: output row oh of channel block cb (row = n * Cb + cb), rows
// outermost or channel blocks outermost (see conv_pixels_outermost).
inline void dw_task(int64_t t, int64_t Cb, int64_t OH, bool rows_outer, int64_t& oh, int64_t& row, int64_t& cb) {
  if (rows_outer) {
    const int64_t n = t / (Cb * OH), i = t % (Cb * OH);
    oh = i / Cb, cb = i % Cb;
    row = n * Cb + cb;
  } else {
    oh = t % OH, row = t / OH, cb = row % Cb;
  }
}

// The register tile of both row kernels: UR output pixels p0.. of output row `row`'s plane from
// kernel rows [kl, kh). Kernel row k reads input row rowp(k) from column iw0 on: per kernel row,
// the (UR - 1) * S + KW input vectors the pixels share are loaded once and every kernel column
// runs from registers. Check: columns outside [0, W) read as zeros (border tiles read in place).
// Stores the first nu pixels through the epilogue.
template <class Arch, int KW, int S, int UR, bool Check, class RowPtr, class Ep>
NNFUSE_MK_TILE void dw_register_tile(int64_t kl, int64_t kh, const RowPtr& rowp, int64_t iw0, int64_t W, const float* wb, float* yb,
                                     int64_t row, int64_t p0, int64_t nu, const Ep& ep) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  constexpr int XN = (UR - 1) * S + KW;
  V acc[UR];
  for (int u = 0; u < UR; ++u) acc[u] = V(0.f);
  for (int64_t k = kl; k < kh; ++k) {
    const float* xr = rowp(k);
    V xin[XN];
    for (int j = 0; j < XN; ++j) {
      const int64_t iw = iw0 + j;
      if constexpr (Check) xin[j] = iw >= 0 && iw < W ? V::load_unaligned(xr + iw * L) : V(0.f);
      else xin[j] = V::load_unaligned(xr + iw * L);
    }
    for (int kw = 0; kw < KW; ++kw) {
      const V wv = V::load_unaligned(wb + (k * KW + kw) * L);
      for (int u = 0; u < UR; ++u) acc[u] = xsimd::fma(xin[u * S + kw], wv, acc[u]);
    }
  }
  if (nu == UR) {  // every result, then every store (see conv_nchwc_tile)
    V r[UR];
#pragma GCC unroll 16
    for (int u = 0; u < UR; ++u) r[u] = ep(acc[u], row, (p0 + u) * L);
#pragma GCC unroll 16
    for (int u = 0; u < UR; ++u) r[u].store_unaligned(yb + (p0 + u) * L);
    return;
  }
  for (int u = 0; u < UR; ++u) {
    if (u >= nu) break;
    const int64_t p = p0 + u;
    ep(acc[u], row, p * L).store_unaligned(yb + p * L);
  }
}

// Depthwise with the kernel width KW and column stride S known at compile time (undilated
// columns), read in place: the rows are wide enough for full tiles inside the input (the narrow
// ones take conv_nchwc_depthwise_fixed, below). Each tile runs on the register tile
// (dw_register_tile), as the padded-plane kernel does, but without copying the rows: interior
// tiles load unchecked, the border tiles (the left padding's pixels, the right end, a short last
// tile) load zeros outside the row. The generic tile below loads one input vector per FMA and ran
// these layers at ~20% of the FMA peak (MobileNetV2's and EfficientNet's 3x3 and 5x5 layers,
// stride 1 and 2: bench/kernels_bench.cpp --only mobile).
// Its row tile: 8 pixels at stride 1, 6 at stride 2 with 32 vector registers (AVX-512, NEON),
// 5 (4 on rows up to 8 wide) and 3 with AVX2's 16. The register budget (UR accumulators, (UR - 1)
// * S + KW inputs and a weight) would allow up to 14, but the compiler then spills in the checked
// tiles: 12 to 14 pixels ran 10-60% slower than 8 and 6 on MobileNetV2's and EfficientNet's layers
// (Xeon, AVX-512). On AVX2 (Zen 3, kernels_bench --only mobile, session 31) 5 pixels at stride 1
// ran the 14- to 112-wide layers 2-12% faster than 4 (a 5x5 kernel row loads 9 inputs for 5
// pixels, not 8 for 4), but 12-15% slower on 7-wide rows, which 5 cover as 5 + 2 (10 pixels'
// work) and 4 as 4 + 3; at stride 2, 4 pixels were 7% faster on a 112-wide row, 7-27% slower on
// the others, so 3 stays. W: the input row's width (0: unknown).
inline constexpr int64_t kDwNarrowRow = 8;  // rows up to this wide take AVX2's 4-pixel stride-1 tile
template <class Arch, int S>
constexpr int dw_direct_ur(int64_t W) {
  constexpr bool wide = vfloat<Arch>::size != 8;  // AVX2: 16 vector registers
  if constexpr (S == 1) return wide ? 8 : (W > 0 && W <= kDwNarrowRow ? 4 : 5);
  return wide ? 6 : 3;
}

// Calls f(std::integral_constant<int, UR>) with the row tile for an input row of width W. Where
// the class CC fixes the width, or the tile does not depend on it (AVX-512, NEON, stride 2), one
// tile is compiled; else both, and W picks.
template <class Arch, ConvClass CC, int S, class F>
void dw_with_direct_ur(int64_t W, F&& f) {
  constexpr int narrow = dw_direct_ur<Arch, S>(kDwNarrowRow), other = dw_direct_ur<Arch, S>(kDwNarrowRow + 1);
  if constexpr (CC.w > 0) {
    f(std::integral_constant<int, dw_direct_ur<Arch, S>(CC.w)>{});
  } else if constexpr (narrow == other) {
    f(std::integral_constant<int, narrow>{});
  } else {
    if (W <= kDwNarrowRow) f(std::integral_constant<int, narrow>{});
    else f(std::integral_constant<int, other>{});
  }
}

template <class Arch, int KW, int S, int UR, class Ep, class ParFor>
void conv_nchwc_depthwise_direct(const ConvNchwcArgs& a, const Ep& ep, const ParFor& par) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  const int64_t Cb = nchwc_blocks(a.C, L);
  const bool rows_outer = conv_pixels_outermost(par_threads(par), a.C, 1, a.H, a.W);
  par(a.N * Cb * a.OH, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t t = lo; t < hi; ++t) {
      int64_t oh, row, cb;
      dw_task(t, Cb, a.OH, rows_outer, oh, row, cb);
      const float* xb = a.x + row * a.H * a.W * L;
      const float* wb = a.w + cb * a.KH * KW * L;
      float* yb = a.y + row * a.OH * a.OW * L;
      int64_t kl, kh;
      kh_range(oh, a.stride_h, a.pad_top, a.dil_h, a.KH, a.H, kl, kh);
      auto rowp = [&](int64_t k) { return xb + (oh * a.stride_h - a.pad_top + k * a.dil_h) * a.W * L; };
      auto tile = [&](int64_t ow, int64_t nu, auto checked) {
        dw_register_tile<Arch, KW, S, UR, decltype(checked)::value>(kl, kh, rowp, ow * S - a.pad_left, a.W, wb, yb, row,
                                                                     oh * a.OW + ow, nu, ep);
      };
      for_row_tiles<UR>(0, a.OW, a.W, S, a.pad_left, KW, 1, [&](int64_t ow, int64_t nu, bool interior) {
        if (interior) tile(ow, nu, std::false_type{});
        else tile(ow, nu, std::true_type{});
      });
    }
  });
}

// Depthwise on rows up to 32 wide (7- to 28-wide maps), KW and S = 1 known at compile time: per
// channel block, the task copies the plane's rows into a scratch plane padded left and right with
// zeros (ScratchSlot::DepthwiseRows), each row once, so that every tile of UR pixels runs without
// bounds checks on the register tile (dw_register_tile). Rows outside the input are skipped
// (kh_range), not padded. A task was one output row, which copied its KH input rows again
// for every output row: 5x the copies of a 5x5 layer, on maps where a row is ~100-200 FMAs.
template <class Arch, int KW, int UR, class Ep, class ParFor>
void conv_nchwc_depthwise_fixed(const ConvNchwcArgs& a, const Ep& ep, const ParFor& par) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  const int64_t Cb = nchwc_blocks(a.C, L), tiles = ceil_div(a.OW, int64_t(UR));
  const int64_t Wp = tiles * UR - 1 + KW;  // padded row: every tile's taps, in pixels
  const int64_t left = std::min(a.pad_left, Wp), mid = std::max<int64_t>(0, std::min(a.W, Wp - left));
  par(a.N * Cb, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    float* xpad = thread_scratch(ScratchSlot::DepthwiseRows, a.H * Wp * L);
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t cb = row % Cb;
      const float* xb = a.x + row * a.H * a.W * L;
      const float* wb = a.w + cb * a.KH * KW * L;
      float* yb = a.y + row * a.OH * a.OW * L;
      for (int64_t ih = 0; ih < a.H; ++ih) {
        float* d = xpad + ih * Wp * L;
        std::memset(d, 0, size_t(left * L) * sizeof(float));
        std::memcpy(d + left * L, xb + ih * a.W * L, size_t(mid * L) * sizeof(float));
        std::memset(d + (left + mid) * L, 0, size_t((Wp - left - mid) * L) * sizeof(float));
      }
      for (int64_t oh = 0; oh < a.OH; ++oh) {
        int64_t kl, kh;
        kh_range(oh, a.stride_h, a.pad_top, a.dil_h, a.KH, a.H, kl, kh);
        const int64_t r0 = oh * a.stride_h - a.pad_top;  // the input row of kernel row 0 (may be < 0)
        auto rowp = [&](int64_t k) { return xpad + (r0 + k * a.dil_h) * Wp * L; };
        for (int64_t ow = 0; ow < a.OW; ow += UR)
          dw_register_tile<Arch, KW, 1, UR, false>(kl, kh, rowp, ow, Wp, wb, yb, row, oh * a.OW + ow, std::min<int64_t>(UR, a.OW - ow), ep);
      }
    }
  });
}

// Row tile of the generic depthwise path.
template <class Arch>
constexpr int dw_ur() {
  return vfloat<Arch>::size == 8 ? 8 : 12;
}

// Whether a depthwise conv takes the padded-plane kernel (stride 1, rows up to 32 wide), else the
// in-place one with the same register blocking (see conv_nchwc_depthwise); the rest run on the
// generic tile. On 14- and 28-wide maps (5x5) copying the plane once cost less than the in-place
// kernel's checked border tiles; on 56- and 112-wide ones the copy cost more (kernels_bench
// --only mobile, Xeon: 14x14 3x3 0.022 against 0.030 ms, 28x28 5x5 0.086 against 0.104, 56x56
// 3x3 0.137 against 0.118).
constexpr bool dw_takes_fixed(int64_t W, int64_t KW, int64_t sw, int64_t dw) {
  return sw == 1 && dw == 1 && W <= 32 && (KW == 3 || KW == 5);
}
constexpr bool dw_takes_direct(int64_t W, int64_t KW, int64_t sw, int64_t dw) {
  return !dw_takes_fixed(W, KW, sw, dw) && dw == 1 && (KW == 3 || KW == 5) && (sw == 1 || sw == 2);
}

// Which depthwise row paths class CC compiles: all, unless its width, kernel width, stride and
// dilation fix the one it takes; the padded-plane and in-place kernels only for its kernel width
// and stride.
template <ConvClass CC>
constexpr bool dw_path_known() {
  return CC.w > 0 && CC.kw > 0 && CC.sw > 0 && CC.dw > 0;
}
template <class Arch, ConvClass CC>
constexpr bool dw_fixed_used(int64_t KW) {
  if (dw_path_known<CC>()) return CC.kw == KW && dw_takes_fixed(CC.w, CC.kw, CC.sw, CC.dw);
  return (CC.kw == 0 || CC.kw == KW) && (CC.sw == 0 || CC.sw == 1) && (CC.dw == 0 || CC.dw == 1);
}
template <class Arch, ConvClass CC>
constexpr bool dw_direct_used(int64_t KW, int64_t S) {
  if (dw_path_known<CC>()) return CC.kw == KW && CC.sw == S && dw_takes_direct(CC.w, CC.kw, CC.sw, CC.dw);
  return (CC.kw == 0 || CC.kw == KW) && (CC.sw == 0 || CC.sw == S) && (CC.dw == 0 || CC.dw == 1);
}
template <class Arch, ConvClass CC>
constexpr bool dw_generic_used() {
  if (dw_path_known<CC>())
    return !dw_takes_fixed(CC.w, CC.kw, CC.sw, CC.dw) && !dw_takes_direct(CC.w, CC.kw, CC.sw, CC.dw);
  // Kernel width 3 or 5, stride 1 or 2, undilated: the padded-plane or the in-place kernel, any width.
  return !((CC.kw == 3 || CC.kw == 5) && (CC.sw == 1 || CC.sw == 2) && CC.dw == 1);
}

template <class Arch, ConvClass CC, class Ep, class ParFor>
void conv_nchwc_depthwise(const ConvNchwcArgs& a, const Ep& ep, const ParFor& par) {
  constexpr int64_t L = int64_t(vfloat<Arch>::size);
  constexpr int UR = dw_ur<Arch>();
  // 3x3 and 5x5, undilated: narrow stride-1 rows on the padded plane, the others in place (see
  // dw_takes_fixed); anything else on the generic tile.
  if (dw_takes_fixed(a.W, a.KW, a.stride_w, a.dil_w)) {
    if constexpr (dw_fixed_used<Arch, CC>(3))
      if (a.KW == 3)
        return dw_with_direct_ur<Arch, CC, 1>(a.W, [&](auto ur) { conv_nchwc_depthwise_fixed<Arch, 3, decltype(ur)::value>(a, ep, par); });
    if constexpr (dw_fixed_used<Arch, CC>(5))
      if (a.KW == 5)
        return dw_with_direct_ur<Arch, CC, 1>(a.W, [&](auto ur) { conv_nchwc_depthwise_fixed<Arch, 5, decltype(ur)::value>(a, ep, par); });
  }
  if (dw_takes_direct(a.W, a.KW, a.stride_w, a.dil_w)) {
    if constexpr (dw_direct_used<Arch, CC>(3, 1))
      if (a.KW == 3 && a.stride_w == 1)
        return dw_with_direct_ur<Arch, CC, 1>(a.W, [&](auto ur) { conv_nchwc_depthwise_direct<Arch, 3, 1, decltype(ur)::value>(a, ep, par); });
    if constexpr (dw_direct_used<Arch, CC>(3, 2))
      if (a.KW == 3 && a.stride_w == 2)
        return dw_with_direct_ur<Arch, CC, 2>(a.W, [&](auto ur) { conv_nchwc_depthwise_direct<Arch, 3, 2, decltype(ur)::value>(a, ep, par); });
    if constexpr (dw_direct_used<Arch, CC>(5, 1))
      if (a.KW == 5 && a.stride_w == 1)
        return dw_with_direct_ur<Arch, CC, 1>(a.W, [&](auto ur) { conv_nchwc_depthwise_direct<Arch, 5, 1, decltype(ur)::value>(a, ep, par); });
    if constexpr (dw_direct_used<Arch, CC>(5, 2))
      if (a.KW == 5 && a.stride_w == 2)
        return dw_with_direct_ur<Arch, CC, 2>(a.W, [&](auto ur) { conv_nchwc_depthwise_direct<Arch, 5, 2, decltype(ur)::value>(a, ep, par); });
  }
  // A class whose width takes the padded-plane or the in-place kernel compiles no generic path (it
  // admits no other width, kernel width or stride, so it never gets here).
  if constexpr (dw_generic_used<Arch, CC>()) {
    const int64_t Cb = nchwc_blocks(a.C, L);
    const bool rows_outer = conv_pixels_outermost(par_threads(par), a.C, 1, a.H, a.W);
    par(a.N * Cb * a.OH, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
      for (int64_t t = lo; t < hi; ++t) {
        int64_t oh, row, cb;
        dw_task(t, Cb, a.OH, rows_outer, oh, row, cb);
        const float* xb = a.x + row * a.H * a.W * L;
        const float* wb = a.w + cb * a.KH * a.KW * L;
        float* yb = a.y + row * a.OH * a.OW * L;
        int64_t kl, kh;
        kh_range(oh, a.stride_h, a.pad_top, a.dil_h, a.KH, a.H, kl, kh);
        for_row_tiles<UR>(0, a.OW, a.W, a.stride_w, a.pad_left, a.KW, a.dil_w, [&](int64_t ow, int64_t nu, bool interior) {
          if (interior) dw_nchwc_tile<Arch, UR, false>(a, xb, wb, yb, row, oh, ow, nu, kl, kh, ep);
          else dw_nchwc_tile<Arch, UR, true>(a, xb, wb, yb, row, oh, ow, nu, kl, kh, ep);
        });
      }
    });
  }
}

}  // namespace detail

// y = ep(conv(x, w)) in NCHW<L>c (L = vfloat<Arch>::size); bias and activations are epilogue.
// Compiles the paths of class CC only; returns false, computing nothing, for arguments outside it.
template <class Arch, ConvClass CC = ConvClass{}, class Ep = IdentityEpilogue, class ParFor = SerialFor>
bool conv2d_nchwc(const ConvNchwcArgs& a, const Ep& ep = {}, const ParFor& par = {}) {
  if (!conv_class_admits(CC, a)) return false;
  if (!a.depthwise && conv_nchwc_windows(a.C, a.K, a.group, vfloat<Arch>::size).bpw <= 0) return false;  // grouping not taken
  if (a.N <= 0 || a.K <= 0 || a.OH <= 0 || a.OW <= 0) return true;
  if constexpr (CC.kind == ConvKind::Depthwise || CC.kind == ConvKind::Any)
    if (a.depthwise) return detail::conv_nchwc_depthwise<Arch, CC>(a, ep, par), true;
  if constexpr (CC.kind != ConvKind::Depthwise) detail::conv_nchwc_dense<Arch, CC>(a, ep, par);
  return true;
}

struct PoolNchwcArgs {
  int64_t N = 1, C = 0, H = 0, W = 0, OH = 0, OW = 0, KH = 1, KW = 1;
  int64_t stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0, dil_h = 1, dil_w = 1;
  bool is_max = true, count_include_pad = false;
  const float* x = nullptr;  // NCHW<L>c
  float* y = nullptr;        // NCHW<L>c
};

namespace detail {
// The max (Max) or the sum of the taps of U pixels ow, ow + 1, ... of output row oh over kernel
// rows [kl, kh): a pixel's n-th tap goes into acc[u][n & 1], two chains per pixel (a global pool
// is one long chain otherwise). Check: taps outside the row are skipped (and not counted);
// without, every tap lies inside. Returns the taps taken per pixel (the average's divisor). One
// walk for the unchecked runs and the checked pixels, so that both give the same bits.
template <class Arch, int U, bool Check, bool Max>
inline int64_t pool_taps(const PoolNchwcArgs& a, const float* xb, int64_t oh, int64_t ow, int64_t kl, int64_t kh,
                         vfloat<Arch> (&acc)[U][2]) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  const int64_t iw0 = ow * a.stride_w - a.pad_left;
  int64_t cnt = 0;
  for (int64_t i = kl; i < kh; ++i) {
    const float* xr = xb + (oh * a.stride_h - a.pad_top + i * a.dil_h) * a.W * L;
    for (int64_t kw = 0; kw < a.KW; ++kw) {
      const int64_t iw = iw0 + kw * a.dil_w;
      if constexpr (Check)
        if (iw < 0 || iw >= a.W) continue;
      const int t = int(cnt & 1);
      for (int u = 0; u < U; ++u) {
        const V v = V::load_unaligned(xr + (iw + u * a.stride_w) * L);
        acc[u][t] = Max ? xsimd::max(acc[u][t], v) : acc[u][t] + v;
      }
      ++cnt;
    }
  }
  return cnt;
}
}  // namespace detail

// Max / average pooling, lane-wise over L channels; same semantics as pool2d (pool.h): max of an
// all-padding window is -inf, average divides by the taps inside the input or, with
// count_include_pad, by the taps inside [-pad, size + pad_end).
template <class Arch, class Ep = IdentityEpilogue, class ParFor = SerialFor>
void pool2d_nchwc(const PoolNchwcArgs& a, const Ep& ep = {}, const ParFor& par = {}) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  const int64_t Cb = nchwc_blocks(a.C, L);
  if (a.N <= 0 || Cb <= 0 || a.OH <= 0 || a.OW <= 0) return;
  // A global pool (one window over the whole unpadded plane: GlobalAveragePool, an SE block's
  // squeeze) is one contiguous run of H * W vectors per block: four independent chains and no
  // tap bookkeeping. Through the windowed walk below it read 13-16 GB/s and ran 1.6-1.8x ONNX
  // Runtime's time on EfficientNet-B0's 112x112 and 56x56 planes (bench/RESULTS.md, session 26).
  if (a.OH == 1 && a.OW == 1 && a.KH == a.H && a.KW == a.W && a.pad_top == 0 && a.pad_left == 0 && a.pad_bottom == 0 &&
      a.pad_right == 0 && a.dil_h == 1 && a.dil_w == 1 && a.H * a.W > 0) {
    const int64_t P = a.H * a.W;
    auto run = [&](auto max_tag) {
      constexpr bool Max = decltype(max_tag)::value;
      auto step = [](const V& acc, const V& v) { return Max ? xsimd::max(acc, v) : acc + v; };
      par(a.N * Cb, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
        for (int64_t row = lo; row < hi; ++row) {
          const float* xb = a.x + row * P * L;
          const V init(Max ? -std::numeric_limits<float>::infinity() : 0.f);
          V acc[4] = {init, init, init, init};
          int64_t p = 0;
          for (; p + 4 <= P; p += 4)
            for (int u = 0; u < 4; ++u) acc[u] = step(acc[u], V::load_unaligned(xb + (p + u) * L));
          for (; p < P; ++p) acc[0] = step(acc[0], V::load_unaligned(xb + p * L));
          V r = step(step(acc[0], acc[1]), step(acc[2], acc[3]));
          if constexpr (!Max) r = r / V(float(P));
          ep(r, row, 0).store_unaligned(a.y + row * L);
        }
      });
    };
    if (a.is_max) run(std::true_type{});
    else run(std::false_type{});
    return;
  }
  par(a.N * Cb * a.OH, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t oh = t % a.OH, row = t / a.OH;
      const float* xb = a.x + row * a.H * a.W * L;
      float* yb = a.y + row * a.OH * a.OW * L;
      int64_t kl, kh;
      detail::kh_range(oh, a.stride_h, a.pad_top, a.dil_h, a.KH, a.H, kl, kh);
      // Max pooling's interior columns (every tap inside the row) in runs of 4 pixels without
      // bounds checks: 4 pixels' chains interleave instead of one pixel's taps waiting on each
      // other. ResNet-50's 3x3 stride-2 pool 0.205 -> 0.157 ms, YOLOv8's SPPF 5x5 on 128x20x20
      // 0.089 -> 0.057 ms (session 23). Both walk the taps with detail::pool_taps.
      int64_t in_lo = a.OW, in_hi = a.OW;
      if (a.is_max && kl < kh) {
        const int64_t span = (a.KW - 1) * a.dil_w;
        in_lo = std::min(a.OW, a.pad_left > 0 ? ceil_div(a.pad_left, a.stride_w) : int64_t(0));
        const int64_t last = a.W - 1 - span + a.pad_left;  // the last interior pixel's first column
        in_hi = last < 0 ? in_lo : std::max(in_lo, std::min(a.OW, last / a.stride_w + 1));
      }
      constexpr int U = 4;
      for (int64_t ow = in_lo; ow + U <= in_hi; ow += U) {
        V acc[U][2];
        for (int u = 0; u < U; ++u) acc[u][0] = acc[u][1] = V(-std::numeric_limits<float>::infinity());
        detail::pool_taps<Arch, U, false, true>(a, xb, oh, ow, kl, kh, acc);
        for (int u = 0; u < U; ++u) {
          const int64_t p = oh * a.OW + ow + u;
          ep(xsimd::max(acc[u][0], acc[u][1]), row, p * L).store_unaligned(yb + p * L);
        }
      }
      const int64_t fast_end = in_lo + (in_hi - in_lo) / U * U;
      for (int64_t ow = 0; ow < a.OW; ++ow) {
        if (ow == in_lo && fast_end > in_lo) ow = fast_end;
        if (ow >= a.OW) break;
        V two[1][2];
        two[0][0] = two[0][1] = V(a.is_max ? -std::numeric_limits<float>::infinity() : 0.f);
        int64_t cnt = a.is_max ? detail::pool_taps<Arch, 1, true, true>(a, xb, oh, ow, kl, kh, two)
                               : detail::pool_taps<Arch, 1, true, false>(a, xb, oh, ow, kl, kh, two);
        V acc = a.is_max ? xsimd::max(two[0][0], two[0][1]) : two[0][0] + two[0][1];
        if (!a.is_max) {
          if (a.count_include_pad) {
            const int64_t h0 = oh * a.stride_h - a.pad_top, w0 = ow * a.stride_w - a.pad_left;
            const int64_t h1 = std::min(h0 + (a.KH - 1) * a.dil_h + 1, a.H + a.pad_bottom);
            const int64_t w1 = std::min(w0 + (a.KW - 1) * a.dil_w + 1, a.W + a.pad_right);
            cnt = (h1 > h0 ? ceil_div(h1 - h0, a.dil_h) : 0) * (w1 > w0 ? ceil_div(w1 - w0, a.dil_w) : 0);
          }
          acc = cnt ? acc / V(float(cnt)) : V(0.f);
        }
        ep(acc, row, (oh * a.OW + ow) * L).store_unaligned(yb + (oh * a.OW + ow) * L);
      }
    }
  });
}

// Element access of a generated stage in the NCHW<L>c view (see lowering/layout.cpp): V is a
// batch of L lanes (lane 0 at a block start) or a float (one lane, `lane`). p points at lane 0;
// lane j is at p[j*LS] (LS = 0: one value broadcast). Lanes >= nvalid are padding channels of a
// plain-layout buffer: not read (zero) and not written.
template <class V, int64_t LS>
inline V nchwc_load(const float* p, int64_t lane, int64_t nvalid) {
  if constexpr (std::is_same_v<V, float>) {
    return lane < nvalid ? p[lane * LS] : 0.f;
  } else {
    constexpr int64_t L = int64_t(V::size);
    if constexpr (LS == 0) {
      if (nvalid >= L) return V(*p);
    }
    if (nvalid >= L) {
      if constexpr (LS == 1) return V::load_unaligned(p);
    }
    alignas(64) float t[L];
    for (int64_t j = 0; j < L; ++j) t[j] = j < nvalid ? p[j * LS] : 0.f;
    return V::load_aligned(t);
  }
}
template <class V, int64_t LS>
inline void nchwc_store(float* p, int64_t lane, int64_t nvalid, const V& v) {
  if constexpr (std::is_same_v<V, float>) {
    if (lane < nvalid) p[lane * LS] = v;
  } else {
    constexpr int64_t L = int64_t(V::size);
    if constexpr (LS == 1) {
      if (nvalid >= L) return v.store_unaligned(p);
    }
    alignas(64) float t[L];
    v.store_aligned(t);
    for (int64_t j = 0; j < std::min(nvalid, L); ++j) p[j * LS] = t[j];
  }
}

// Layout conversions (used by tests and as the reference of what the index maps compute).
inline void nchw_to_nchwc(const float* x, int64_t N, int64_t C, int64_t HW, int64_t L, float* y) {
  const int64_t Cb = nchwc_blocks(C, L);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t cb = 0; cb < Cb; ++cb)
      for (int64_t p = 0; p < HW; ++p)
        for (int64_t l = 0; l < L; ++l) {
          const int64_t c = cb * L + l;
          y[((n * Cb + cb) * HW + p) * L + l] = c < C ? x[(n * C + c) * HW + p] : 0.f;
        }
}
inline void nchwc_to_nchw(const float* x, int64_t N, int64_t C, int64_t HW, int64_t L, float* y) {
  const int64_t Cb = nchwc_blocks(C, L);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p) y[(n * C + c) * HW + p] = x[((n * Cb + c / L) * HW + p) * L + c % L];
}

}  // namespace nnfuse::mk
