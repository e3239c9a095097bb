#pragma once
// nnfuse CPU microkernel templates: the anchors of fused blocks. The kernel generator emits one
// C++ file per fused block that includes this header and instantiates these templates with the
// block's prologue/epilogue functors inlined. Header-only; needs only the C++ standard library and
// xsimd 8.1; compiles with -std=c++20 for x86-avx2, x86-avx512 and aarch64 (NEON).
//
// ============================== Common contract ==============================
// namespace nnfuse::mk. All data is float32.
//
// Arch: an xsimd arch tag. Use mk::arch::x86_avx2 (= xsimd::fma3<xsimd::avx2>, -mavx2 -mfma),
//   mk::arch::x86_avx512 (= xsimd::avx512bw), mk::arch::arm_neon (= xsimd::neon64), or
//   mk::arch::native (xsimd::default_arch). vfloat<Arch> = xsimd::batch<float, Arch>.
//
// ParFor: par(int64_t n, fn) calls fn(int64_t begin, int64_t end) over disjoint chunks covering
//   [0, n) and returns when all are done (chunks may run concurrently). mk::SerialFor is the serial
//   one. Kernels never split a reduction (GEMM K, a reduced axis) across chunks, so results are
//   bitwise identical for any ParFor. Kernels call par from the calling thread only (no nesting).
//
// Epilogue ep: a functor with two overloads (a generic lambda `[&](auto v, int64_t r, int64_t c)`
//   covers both):
//     vfloat<Arch> ep(vfloat<Arch> v, int64_t row, int64_t col)  // lanes are (row, col..col+L-1)
//     float        ep(float v,        int64_t row, int64_t col)
//   applied exactly once to every output element, before it is stored. (row, col) index the
//   kernel's OUTPUT viewed as a 2-D matrix, given per family below; a batch always covers L
//   consecutive columns of one row. mk::IdentityEpilogue returns v.
// Prologue pro: same signature, applied once to every INPUT element the kernel reads (of the input
//   named per family), in that input's 2-D view; padding values (conv/pool) are not passed
//   through it (the ONNX padding is applied after the producer ran). mk::IdentityPrologue.
//   Kernels may call pro on the same element more than once (e.g. overlapping windows), so it
//   must be a pure function of (v, row, col).
// Determinism: the partition of work depends on shapes only and each chunk body is compiled
//   once (NNFUSE_MK_CHUNK), so results are bitwise identical for any ParFor / thread count.
//
// ============================== 1. GEMM (gemm.h) ==============================
// struct GemmArgs { M, N, K; A, a_rs, a_cs; B, b_rs, b_cs; C, ldc; alpha;
//                   batch, a_bs, b_bs, c_bs; }
//   A(m,k) = A[m*a_rs + k*a_cs]   (row-major: a_rs=lda, a_cs=1; transposed: a_rs=1, a_cs=lda)
//   B(k,n) = B[k*b_rs + n*b_cs]   (row-major: b_rs=ldb, b_cs=1; transposed: b_rs=1, b_cs=ldb)
//   C(m,n) = C[m*ldc + n]         (rows contiguous)
//   for b in [0,batch): C_b = ep(alpha * A_b B_b), X_b = X + b*x_bs (a stride of 0 broadcasts).
//   Batched MatMul with several leading dims: flatten them into one batch dim when the strides
//   allow, else call gemm per outer index (then offset rows in the epilogue yourself).
// template <class Arch, class Ep = IdentityEpilogue, class ParFor = SerialFor,
//           class ProA = IdentityPrologue, class ProB = IdentityPrologue>
// void gemm(const GemmArgs&, const Ep& = {}, const ParFor& = {}, const ProA& = {}, const ProB& = {});
//   ep rows: b*M + m, cols: n.  pro_a: (b*M + m, k) of A.  pro_b: (b*K + k, n) of B.
//   Packs A (MR-row panels) and B (NR-col panels) into aligned buffers, register-blocked
//   microkernel GemmTile<Arch>::MR x NR (AVX2 6x16, AVX-512 8x32, NEON 8x12), blocked over K (KC)
//   and the tile for L1/L2; parallel over (batch, M-block, N-block) tiles, never over K.
//   M == 1 (with b_cs == 1 or b_rs == 1) takes an unpacked matrix-vector path.
// PackedB (gemm.h): B packed once (constant weights) and reused across calls:
//   PackedB<Arch> pb; pb.pack(K, N, B, b_rs, b_cs);  gemm_packed<Arch>(args_without_B, pb, ep, par, pro_a).
// gemm_int8<Arch[, Nb]>(GemmInt8Args, PackedGemmInt8, ep, par)  (gemm_int8.h; AVX-512 VNNI builds
//   only): C = ep(A B) for a quantized A (values (q - z) * s_x, requantized to a uint8 copy) and a
//   B on an int8 grid per column (int8_common.h), packed by PackedGemmInt8::pack(B, K, N, b_rs,
//   b_cs, s_x * alpha, offset, m) to [Nb][K/4][16][4]; vpdpbusd sums exact in int32, 6 rows x 64
//   columns per register tile; same (row, col) ep space as gemm.
//
// ========================== 2. Convolution 2-D (conv.h) ==========================
// struct Conv2dArgs { N, C, H, W; K (= output channels), OH, OW (computed by the caller);
//   KH, KW, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, group;
//   x, x_sn, x_sc, x_sh (input strides; W contiguous); w ([K, C/group, KH, KW] contiguous);
//   y, y_sn, y_sc, y_sh (output strides; OW contiguous) }  -- set_contiguous() fills default strides.
//   No bias input: bias is an epilogue.  ep rows: n*K + k (output channel), cols: oh*OW + ow.
//   pro: on x, rows n*C + c, cols ih*W + iw.
// conv2d<Arch>(args, ep, par, pro)            dispatches: depthwise when group == C (K a multiple
//                                             of C); direct when y_sh != OW (planes not dense) or
//                                             the per-group GEMM is tiny; else implicit-im2col GEMM
//                                             (1x1 / stride 1 / no pad reads x as a plain matrix)
// conv2d_gemm<Arch>(args, ep, par, pro)       im2col packed directly into GEMM B panels (no im2col
//                                             buffer); weights are the GEMM A matrix, per group.
//                                             Needs y_sh == OW.
// conv2d_depthwise<Arch>(args, ep, par, pro)  group == C, K == C * multiplier; input plane copied
//                                             to a zero-padded, stride-phase-split buffer, then
//                                             every tap is a contiguous vector load
// conv2d_direct<Arch>(args, ep, par, pro)     direct loops vectorised over ow (any strides; slow,
//                                             for tiny problems)
//
// ============================== 3. Pooling (pool.h) ==============================
// struct Pool2dArgs { N, C, H, W, OH, OW, KH, KW, stride_h, stride_w, pad_top, pad_left,
//   pad_bottom, pad_right, dil_h, dil_w, count_include_pad; x, x_sn, x_sc, x_sh; y, y_sn, y_sc, y_sh }
// pool2d<Arch, PoolKind::Max | PoolKind::Avg>(args, ep, par, pro)
//   ep rows: n*C + c, cols: oh*OW + ow.  pro: on x, rows n*C + c, cols ih*W + iw.
//   Max of an all-padding window is -inf; Avg divides by the taps inside the input, or with
//   count_include_pad by the taps inside [-pad, size + pad_end) (ONNX/ORT semantics).
// global_pool2d<Arch, PoolKind>(rows = N*C, HW, x, x_rs, y, ep, par, pro)  (in reduce.h)
//   y[row] = ep(max|mean over x[row*x_rs + 0..HW), row, 0); pro rows: row, cols: spatial index.
//
// ====================== 4. Reductions, Softmax, LayerNorm (reduce.h) ======================
// reduce<Arch, ReduceKind::{Sum,Mean,Max,Min,SumSquare}>(ReduceArgs, ep, par, pro)
//   ReduceArgs { outer, R, inner; x, x_so, x_sr (inner contiguous); y, y_so (inner contiguous) }
//   y(o,i) = ep(red_r pro(x(o,r,i)), o, i); pro rows o, cols r*inner + i.  inner == 1: last axis.
// softmax<Arch, bool Log = false>(rows, L, x, x_rs, y, y_rs, ep, par, pro)
//   y(r,c) = ep(softmax_c(pro(x(r,c))), r, c)   (LogSoftmax with Log = true)
// layernorm<Arch>(rows, L, x, x_rs, gamma, beta, eps, y, y_rs, ep, par, pro)
//   y = ep((pro(x) - mean) / sqrt(var + eps) * gamma[c] + beta[c]); gamma/beta may be nullptr
//   (1 / 0). Rows are the flattened leading dims (LayerNorm axis = -1 over L).
//
// ==================== 5. Elementwise math (math.h) ====================
// vexp, vlog, vtanh, verf, verfc, vsqrt, vsigmoid, vgelu_erf: overloads for vfloat<Arch> and float, within
// 1e-5 relative (plus 1e-7 absolute near zero) of the std:: functions; see README for measured
// errors. unary_map<Arch>(n, x, y, f, par): y[i] = f(x[i]) with f a generic lambda.
// ==================== 6. Blocked-channel layout NCHW<L>c (conv_nchwc.h) ====================
// [N, C, H, W] stored as [N, ceil(C/L), H, W, L], L = vfloat<Arch>::size; padding channels hold
// anything and are never read as data. ep rows: n*Cb + cb, cols: (oh*OW + ow)*L (the physical
// [N*Cb, OH*OW*L] view: a batch is L channels of one pixel).
// conv2d_nchwc<Arch>(ConvNchwcArgs, ep, par)  group 1 (input NCHW<L>c or plain NCHW), depthwise
//   (group == C == K, blocked input), or grouped by whole blocks (conv_nchwc_windows; any other
//   grouping returns false); weights packed by pack_conv_nchwc_weights (its depthwise flag set
//   for a depthwise conv): each task's run of up to 4 output blocks as [Cg, KH, KW, blocks, L]
//   (grouped: Cg the window's span; depthwise: [Kb, KH, KW, L]);
//   register-blocked over up to 4 output blocks x UR pixels; a 1x1/stride-1/unpadded conv walks the
//   plane as one row. conv2d_nchwc<Arch, ConvClass{kind, K, kw, sw, dw, w, g}> compiles only the
//   paths of that class (Pointwise / Spatial / Depthwise, output channels K, kernel width, column
//   stride, dilation, input width, groups)
//   and returns false for arguments outside it.
// conv2d_nchwc_winograd<Arch[, ConvClass]>(ConvNchwcArgs, PackedConvWinograd, ep, par)  (conv_winograd.h)
//   Winograd F(4x4, 3x3) for dense 3x3 stride-1 undilated convs (conv_winograd_applicable), any
//   padding, blocked or plain input; weights transformed by PackedConvWinograd::pack to
//   [36][Kb][C][L]; same ep space as conv2d_nchwc; within ~1e-5 of the direct result relative to
//   the output's magnitude.
// conv2d_int8_nchwc<Arch>(ConvInt8Args, PackedConvInt8, ep, par)  (conv_int8.h; AVX-512 VNNI builds only)
//   dense conv of a quantized model: input values (q - z) * s_x for 8-bit integers q, weights
//   per output channel integers times max|w_k| / m_k; the input requantized to a bordered uint8
//   copy, vpdpbusd products summed exactly in int32, scaled back to float for ep (same ep space as
//   conv2d_nchwc); PackedConvInt8::pack(w, K, C, KH, KW, s_x, B, m) makes the int8 weights.
// pool2d_nchwc<Arch>(PoolNchwcArgs, ep, par)  max/average, lane-wise (pool2d semantics).
// nchw_to_nchwc / nchwc_to_nchw: plain conversions (reference for tests).
// ============================== 7. Attention (attention.h) ==============================
// attention<Arch>(AttentionArgs, score, ep, par): per batch element b,
//   Y_b = softmax_rows(score(Q_b Kt_b)) V_b,  Q_b [Sq, D], Kt_b [D, Sk], V_b [Sk, Dv] row-major at
//   per-batch offsets (broadcast batch dims repeat one); the Sq x Sk scores are never stored.
//   score: an epilogue-shaped functor on the scores' [batch*Sq, Sk] view, applied once to every
//   raw score; ep: on the output's [batch*Sq, Dv] view. nan_to_zero: a row whose softmax is NaN
//   (every key -inf, or a NaN score) gives zeros (the exporters' Where(IsNaN(p), 0, p) guard).
//   Online softmax over key tiles: within ~1e-6 relative of the two-pass softmax.
#include "common.h"
#include "math.h"
#include "gemm.h"
#include "conv.h"
#include "conv_nchwc.h"
#include "conv_winograd.h"
#include "conv_int8.h"
#include "gemm_int8.h"
#include "pool.h"
#include "reduce.h"
#include "attention.h"
