#pragma once
// 2-D transposed convolution (ONNX ConvTranspose), NCHW: input x [N, C, H, W], weights
// w [C, K/group, KH, KW] contiguous, output y [N, K, OH, OW] contiguous. Output (oh, ow) of
// channel k (group g = k / (K/group)) sums x[n, c, ih, iw] * w[c, k % (K/group), kh, kw] over the
// group's input channels c and the taps with oh = ih*stride_h - pad_top + kh*dil_h and
// ow = iw*stride_w - pad_left + kw*dil_w (output_padding only lengthens OH/OW: the caller sets
// them). No bias input: bias is an epilogue. ep rows: n*K + k, cols: oh*OW + ow.
//
// Per (image, group): one GEMM col = W_g^T X_g ([Kg*KH*KW, Cg] x [Cg, H*W], the weights read
// transposed in place) with the packed, register-blocked GEMM of gemm.h, then col2im: each output
// plane (n, k) is accumulated from its KH*KW rows of col (zero-initialised per plane, taps in a
// fixed order) and stored once through ep. Parallel inside the GEMM and over output channels in
// col2im; no reduction is split across chunks, so results do not depend on the par-for.
#include "common.h"
#include "gemm.h"

namespace nnfuse::mk {

struct ConvTranspose2dArgs {
  int64_t N = 0, C = 0, H = 0, W = 0, K = 0, OH = 0, OW = 0, KH = 0, KW = 0;
  int64_t stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, dil_h = 1, dil_w = 1, group = 1;
  const float* x = nullptr;
  const float* w = nullptr;
  float* y = nullptr;
};

template <class Arch, class Ep = IdentityEpilogue, class ParFor = SerialFor>
void conv_transpose2d(const ConvTranspose2dArgs& a, const Ep& ep = {}, const ParFor& par = {}) {
  if (a.N <= 0 || a.K <= 0 || a.OH <= 0 || a.OW <= 0) return;
  const int64_t Kg = a.K / a.group, Cg = a.C / a.group, taps = a.KH * a.KW, plane_in = a.H * a.W, plane_out = a.OH * a.OW;
  // Per kw: the input columns [lo, hi) whose output column iw*stride_w + off lies in [0, OW).
  std::vector<int64_t> lo(size_t(a.KW)), hi(size_t(a.KW)), off(size_t(a.KW));
  for (int64_t kw = 0; kw < a.KW; ++kw) {
    const int64_t o = kw * a.dil_w - a.pad_left;
    off[size_t(kw)] = o;
    lo[size_t(kw)] = std::clamp<int64_t>(o >= 0 ? 0 : ceil_div(-o, a.stride_w), 0, a.W);
    hi[size_t(kw)] = std::clamp<int64_t>(a.OW - 1 - o < 0 ? 0 : (a.OW - 1 - o) / a.stride_w + 1, lo[size_t(kw)], a.W);
  }
  std::vector<float> col(size_t(Kg * taps * plane_in));
  for (int64_t n = 0; n < a.N; ++n)
    for (int64_t g = 0; g < a.group; ++g) {
      GemmArgs gm;
      gm.M = Kg * taps;
      gm.N = plane_in;
      gm.K = Cg;
      gm.A = a.w + g * Cg * Kg * taps;  // W_g is [Cg, Kg*KH*KW] row-major: A = W_g^T
      gm.a_rs = 1;
      gm.a_cs = Kg * taps;
      gm.B = a.x + (n * a.C + g * Cg) * plane_in;
      gm.b_rs = plane_in;
      gm.b_cs = 1;
      gm.C = col.data();
      gm.ldc = plane_in;
      gemm<Arch>(gm, IdentityEpilogue{}, par);
      par(Kg, [&](int64_t begin, int64_t end) NNFUSE_MK_CHUNK {
        float* acc = thread_scratch(ScratchSlot::Rows, plane_out);
        for (int64_t kl = begin; kl < end; ++kl) {
          std::fill(acc, acc + plane_out, 0.f);
          for (int64_t kh = 0; kh < a.KH; ++kh)
            for (int64_t kw = 0; kw < a.KW; ++kw) {
              const float* cr = col.data() + ((kl * a.KH + kh) * a.KW + kw) * plane_in;
              const int64_t o = off[size_t(kw)], s = a.stride_w;
              for (int64_t ih = 0; ih < a.H; ++ih) {
                const int64_t oh = ih * a.stride_h - a.pad_top + kh * a.dil_h;
                if (oh < 0 || oh >= a.OH) continue;
                float* ar = acc + oh * a.OW + o;
                const float* xr = cr + ih * a.W;
                for (int64_t iw = lo[size_t(kw)]; iw < hi[size_t(kw)]; ++iw) ar[iw * s] += xr[iw];
              }
            }
          const int64_t k = g * Kg + kl;
          store_row_with_epilogue<Arch>(a.y + (n * a.K + k) * plane_out, acc, plane_out, n * a.K + k, 0, ep);
        }
      });
    }
}

}  // namespace nnfuse::mk
