#pragma once
// What the int8 kernels of quantized models share (conv_int8.h, gemm_int8.h): the weights' grid
// and the requantization of a float input whose values are integers times a scale.
//
// Weights: output j's weights (a conv's output channel, a MatMul's column) are integers in
// [-127, 127] times s_j = max|w_j| / m_j, m_j in [1, 127] found by the lowering
// (lowering/int8_kernels.cpp, int8_weight_grid), which restates these two functions' float
// arithmetic: a kernel takes a layer only if every weight is on its grid, so the integers packed
// here are exact.
// Input: values (q - z) * s_x for integers q of an 8-bit type; u = round(x / s_x) + B with
// B = z - (the type's lowest) lies in [0, 255], and sum(u * w) - B * sum(w) = sum((q - z) * w).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"
#if defined(__AVX512VNNI__)
#include <immintrin.h>
#endif

namespace nnfuse::mk {

// max|w| / m over n weights `stride` apart.
inline float int8_weight_scale(const float* w, int64_t n, int64_t stride, int64_t m) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i * stride]));
  return amax > 0.f ? amax / float(m) : 1.f;
}
inline int32_t int8_weight_value(float w, float scale) {
  return int32_t(std::min(127.f, std::max(-128.f, std::nearbyint(w / scale))));
}

// One input value as the kernels' unsigned byte (NaN, which no quantized input holds, gives 0).
inline uint8_t int8_requantize(float x, float inv_scale, int32_t offset) {
  const float q = std::nearbyint(x * inv_scale) + float(offset);
  return uint8_t(std::min(255.f, std::max(0.f, q == q ? q : 0.f)));
}

#if defined(__AVX512VNNI__)
// 16 values at once (rounding half to even, as Round and nearbyint do).
inline __m128i int8_requantize16(__m512 x, __m512 inv_scale, __m512i offset) {
  __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x, inv_scale)), offset);
  q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_setzero_si512()), _mm512_set1_epi32(255));
  return _mm512_cvtepi32_epi8(q);
}

// One step of a register tile: the 4 bytes at x (4 consecutive k of one pixel or row) broadcast
// and dotted into N accumulators with N weight vectors (16 outputs x 4 k each), exactly in int32.
template <int N>
inline __attribute__((always_inline)) void int8_dot_step(__m512i (&acc)[N], const uint8_t* x, const __m512i (&w)[N]) {
  int32_t x4;
  std::memcpy(&x4, x, 4);
  const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], xb, w[i]);
}

// A tile's sums leave the registers once, unrolled, so that the epilogue's loops (not unrolled:
// each pass inlines the block's epilogue) index memory and not the accumulators: indexed at run
// time, GCC kept the accumulators themselves in memory and stored them at every k step.
template <int A, int B>
inline __attribute__((always_inline)) void int8_store_sums(int32_t (&sums)[A][B][16], const __m512i (&acc)[A][B]) {
#pragma GCC unroll 16
  for (int i = 0; i < A; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < B; ++j) _mm512_store_si512(sums[i][j], acc[i][j]);
}

// 16 outputs as floats: (sum - B * sum(w)) * s_x * s_w, comp and scale as packed per output.
inline __m512 int8_dequantize16(const int32_t* sum, __m512i comp, __m512 scale) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(sum), comp)), scale);
}
#endif

}  // namespace nnfuse::mk
