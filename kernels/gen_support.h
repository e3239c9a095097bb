#pragma once
// Support code for generated CPU kernels (included by every generated translation unit).
// Header-only: the standard library, xsimd and the microkernel templates; nothing from nnfuse's
// libraries, so a compiled artifact loads without them. The SIMD arch is the best one the
// compiler flags allow (-mavx2 -mfma, -mavx512*, aarch64 NEON): xsimd::default_arch.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "exec_ctx.h"
#include "microkernels/conv.h"
#include "microkernels/conv_nchwc.h"
#include "microkernels/conv_winograd.h"
#include "microkernels/conv_int8.h"
#include "microkernels/gemm_int8.h"
#include "microkernels/gemm.h"
#include "microkernels/math.h"
#include "microkernels/reduce.h"

namespace nf {

using A = xsimd::default_arch;
using VF = xsimd::batch<float, A>;
constexpr int64_t L = int64_t(VF::size);

template <class V>
constexpr bool is_vec = !std::is_same_v<V, float>;

// The runtime's parallel-for as the microkernels' ParFor.
struct Par {
  const nnfuse_exec_ctx* ctx;
  int threads() const { return ctx ? ctx->threads : 1; }
  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    if (n <= 0) return;
    if (!ctx || ctx->threads <= 1 || n == 1) {
      fn(int64_t(0), n);
      return;
    }
    using F = std::remove_reference_t<Fn>;
    ctx->parallel_for(
        ctx->pool, n, [](void* a, int64_t b, int64_t e) { (*static_cast<F*>(a))(b, e); }, const_cast<void*>(static_cast<const void*>(&fn)));
  }
};

// Loads: K = 1 contiguous, K = 0 broadcast of one element.
template <class V, int K>
inline V ld(const float* p) {
  if constexpr (!is_vec<V>) return *p;
  else if constexpr (K == 0) return V(*p);
  else return V::load_unaligned(p);
}
template <class V>
inline void st(float* p, const V& v) {
  if constexpr (!is_vec<V>) *p = v;
  else v.store_unaligned(p);
}
template <class V>
inline V cst(float c) { return V(c); }

// Integer and bool buffers: converted to float on load and from float on store (the values a
// lowering lets through are exact: Cast results, comparisons, bools; or the Cast to float itself).
template <class V, int K, class T>
inline V ld(const T* p) {
  if constexpr (!is_vec<V>) return float(*p);
  else if constexpr (K == 0) return V(float(*p));
  else {
    alignas(64) float t[V::size];
    for (size_t l = 0; l < V::size; ++l) t[l] = float(p[l]);
    return V::load_aligned(t);
  }
}
// Part k of a 32/64-bit integer as a float, exactly: bits [22k, 22k + 22), the last (k = 2,
// bits 44 up) signed for signed T. Wide integers compare exactly by their parts
// (lower_data_movement.cpp, wide_int_compare).
template <int Part, class T>
inline float int_part(T x) {
  if constexpr (Part < 2) return float((uint64_t(x) >> (22 * Part)) & 0x3fffffu);
  else if constexpr (std::is_signed_v<T>) return float(int64_t(x) >> 44);
  else return float(uint64_t(x) >> 44);
}
template <class V, int K, int Part, class T>
inline V ld_part(const T* p) {
  if constexpr (!is_vec<V>) return int_part<Part>(*p);
  else if constexpr (K == 0) return V(int_part<Part>(*p));
  else {
    alignas(64) float t[V::size];
    for (size_t l = 0; l < V::size; ++l) t[l] = int_part<Part>(p[l]);
    return V::load_aligned(t);
  }
}
template <class V, class T>
inline void st(T* p, const V& v) {
  if constexpr (!is_vec<V>) *p = T(v);
  else {
    alignas(64) float t[V::size];
    v.store_aligned(t);
    for (size_t l = 0; l < V::size; ++l) p[l] = T(t[l]);
  }
}

// Loads through a column table (a separable index map: kernels/emit_cpp.cpp): element l of the
// vector is p[col[l]], p already offset by the row's part.
template <class V, class T, class I>
inline V ldt(const T* p, const I* col) {
  if constexpr (!is_vec<V>) return float(p[*col]);
  else {
    alignas(64) float t[V::size];
    for (size_t l = 0; l < V::size; ++l) t[l] = float(p[col[l]]);
    return V::load_aligned(t);
  }
}
// Float data and a 32-bit table: the target's gather instruction (AVX2 vgatherdps, AVX-512).
template <class V>
inline V ldt(const float* p, const int32_t* col) {
  if constexpr (!is_vec<V>) return p[*col];
  else return V::gather(p, xsimd::batch<int32_t, A>::load_unaligned(col));
}

// A constant 32-bit column table read by vectors without gathers: the vector at column c (a
// multiple of L) reads L consecutive elements from start[c / L] and permutes them into place,
// when every vector's offsets fit in such a window (nearest/linear resampling, reflect/edge
// padding: neighbouring outputs read neighbouring inputs). Windows stay inside [min, max] of the
// table, so they read only memory the table's own offsets span. ok false: ldw gathers instead.
struct ColWindows {
  bool ok = false;
  std::vector<int64_t> start;  // per vector position
  std::vector<int32_t> lane;   // per column: its lane in its window
};
inline ColWindows col_windows(const int32_t* col, int64_t width) {
  ColWindows w;
  const int64_t nv = width / L;
  if (nv == 0) return w;
  const int64_t lo = *std::min_element(col, col + width), hi = *std::max_element(col, col + width);
  if (hi - lo + 1 < L) return w;
  w.start.resize(size_t(nv));
  w.lane.resize(size_t(nv * L));
  for (int64_t v = 0; v < nv; ++v) {
    const int32_t* c = col + v * L;
    const int64_t mn = *std::min_element(c, c + L), mx = *std::max_element(c, c + L);
    const int64_t s = std::min<int64_t>(mn, hi - L + 1);
    if (mx - s >= L) return ColWindows{};
    w.start[size_t(v)] = s;
    for (int64_t l = 0; l < L; ++l) w.lane[size_t(v * L + l)] = int32_t(c[l] - s);
  }
  w.ok = true;
  return w;
}
// v's lanes reordered: result[l] = v[lane[l]].
// (A template, so that only the branch of the compiled vector width is instantiated.)
template <class V>
inline V permute_lanes(const V& v, const int32_t* lane) {
#if defined(__AVX512F__)
  if constexpr (V::size == 16) return V(_mm512_permutexvar_ps(_mm512_loadu_si512(lane), v));
#endif
#if defined(__AVX2__)
  if constexpr (V::size == 8) return V(_mm256_permutevar8x32_ps(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lane))));
#endif
  alignas(64) float t[V::size], o[V::size];
  v.store_aligned(t);
  for (size_t l = 0; l < V::size; ++l) o[l] = t[lane[l]];
  return V::load_aligned(o);
}
template <class V>
inline V ldw(const float* p, const ColWindows& w, const int32_t* col, int64_t c) {
  if constexpr (!is_vec<V>) return p[*col];
  else if (w.ok) return permute_lanes(V::load_unaligned(p + w.start[size_t(c / L)]), w.lane.data() + c);
  else return ldt<V>(p, col);
}

// A Gather index: negative counts from the end; out of range is reported through the context
// (the runtime turns it into an error naming the stage) and reads element 0 instead.
inline int64_t wrap_index(const nnfuse_exec_ctx* ctx, int64_t i, int64_t n) {
  if (i < 0) i += n;
  if (i < 0 || i >= n) {
    if (ctx && ctx->status) __atomic_store_n(ctx->status, NNFUSE_STATUS_INDEX_OUT_OF_RANGE, __ATOMIC_RELAXED);
    return 0;
  }
  return i;
}

// A kernel compiled for a shape class (mk::ConvClass, mk::GemmClass) was called outside it: reported like a bad
// index, the output is left unwritten.
inline void shape_class_error(const nnfuse_exec_ctx* ctx) {
  if (ctx && ctx->status) __atomic_store_n(ctx->status, NNFUSE_STATUS_SHAPE_CLASS, __ATOMIC_RELAXED);
}

template <class V, class M>
inline V sel(const M& m, const V& a, const V& b) {
  if constexpr (!is_vec<V>) return m ? a : b;
  else return xsimd::select(m, a, b);
}
template <class V> inline V vmax(const V& a, const V& b) {
  if constexpr (!is_vec<V>) return a < b ? b : (a != a ? a : a);  // NaN in a propagates
  else return xsimd::max(a, b);
}
template <class V> inline V vmin(const V& a, const V& b) {
  if constexpr (!is_vec<V>) return b < a ? b : a;
  else return xsimd::min(a, b);
}

// ---- unary ops ----
template <class V> inline V op_Relu(const V& x) { return vmax(x, V(0.f)); }
template <class V> inline V op_Sigmoid(const V& x) { return nnfuse::mk::vsigmoid(x); }
template <class V> inline V op_Tanh(const V& x) { return nnfuse::mk::vtanh(x); }
template <class V> inline V op_Erf(const V& x) { return nnfuse::mk::verf(x); }
template <class V> inline V op_Exp(const V& x) { return nnfuse::mk::vexp(x); }
template <class V> inline V op_Log(const V& x) { return nnfuse::mk::vlog(x); }
template <class V> inline V op_Sqrt(const V& x) { return nnfuse::mk::vsqrt(x); }
template <class V> inline V op_Gelu(const V& x) { return nnfuse::mk::vgelu_erf(x); }
// Gelu approximate="tanh": 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3) is
// x sigmoid(2u) (1 + tanh(u) = 2 sigmoid(2u)): one sigmoid instead of a tanh, and no cancellation
// in 1 + tanh(u) for negative x.
template <class V> inline V op_GeluTanh(const V& x) {
  return x * nnfuse::mk::vsigmoid(V(1.5957691216057308f) * (x + V(0.044715f) * x * x * x));
}
template <class V> inline V op_Neg(const V& x) { return -x; }
template <class V> inline V op_Abs(const V& x) {
  if constexpr (!is_vec<V>) return std::fabs(x);
  else return xsimd::abs(x);
}
template <class V> inline V op_Reciprocal(const V& x) { return V(1.f) / x; }
template <class V> inline V op_Floor(const V& x) {
  if constexpr (!is_vec<V>) return std::floor(x);
  else return xsimd::floor(x);
}
template <class V> inline V op_Ceil(const V& x) {
  if constexpr (!is_vec<V>) return std::ceil(x);
  else return xsimd::ceil(x);
}
template <class V> inline V op_Round(const V& x) {
  if constexpr (!is_vec<V>) return std::nearbyint(x);
  else return xsimd::nearbyint(x);
}
template <class V> inline V op_Sin(const V& x) {
  if constexpr (!is_vec<V>) return std::sin(x);
  else return xsimd::sin(x);
}
template <class V> inline V op_Cos(const V& x) {
  if constexpr (!is_vec<V>) return std::cos(x);
  else return xsimd::cos(x);
}
template <class V> inline V op_LeakyRelu(const V& x, float a, float) { return sel(x < V(0.f), x * V(a), x); }
template <class V> inline V op_Elu(const V& x, float a, float) { return sel(x < V(0.f), V(a) * (nnfuse::mk::vexp(x) - V(1.f)), x); }
template <class V> inline V op_HardSigmoid(const V& x, float a, float b) { return vmin(vmax(V(a) * x + V(b), V(0.f)), V(1.f)); }
// log(1 + e^x) without overflow: max(x, 0) + log(1 + e^-|x|).
template <class V> inline V op_Softplus(const V& x) { return vmax(x, V(0.f)) + nnfuse::mk::vlog(V(1.f) + nnfuse::mk::vexp(-op_Abs(x))); }
template <class V> inline V op_HardSwish(const V& x) { return x * vmin(vmax(x * V(1.f / 6.f) + V(0.5f), V(0.f)), V(1.f)); }
template <class V> inline V op_Clip(const V& x, float lo, float hi) { return vmin(vmax(x, V(lo)), V(hi)); }

// ---- binary ops ----
template <class V> inline V op_Add(const V& a, const V& b) { return a + b; }
template <class V> inline V op_Sub(const V& a, const V& b) { return a - b; }
template <class V> inline V op_Mul(const V& a, const V& b) { return a * b; }
template <class V> inline V op_Div(const V& a, const V& b) { return a / b; }
template <class V> inline V op_Max(const V& a, const V& b) { return vmax(a, b); }
template <class V> inline V op_Min(const V& a, const V& b) { return vmin(a, b); }
template <class V> inline V op_Pow(const V& a, const V& b) {
  if constexpr (!is_vec<V>) return std::pow(a, b);
  else return xsimd::pow(a, b);
}
template <class V> inline V op_PRelu(const V& x, const V& s) { return sel(x < V(0.f), x * s, x); }

// ---- selection, comparisons and logic: bools are float 0 / 1 ----
template <class V> inline V b2f(const V& a, const V& b, bool lt, bool eq, bool gt) {
  V r(0.f);
  if (lt) r = sel(a < b, V(1.f), r);
  if (eq) r = sel(a == b, V(1.f), r);
  if (gt) r = sel(a > b, V(1.f), r);
  return r;
}
template <class V> inline V op_Where(const V& c, const V& x, const V& y) { return sel(c != V(0.f), x, y); }
template <class V> inline V op_Equal(const V& a, const V& b) { return b2f(a, b, false, true, false); }
template <class V> inline V op_Less(const V& a, const V& b) { return b2f(a, b, true, false, false); }
template <class V> inline V op_LessOrEqual(const V& a, const V& b) { return b2f(a, b, true, true, false); }
template <class V> inline V op_Greater(const V& a, const V& b) { return b2f(a, b, false, false, true); }
template <class V> inline V op_GreaterOrEqual(const V& a, const V& b) { return b2f(a, b, false, true, true); }
template <class V> inline V op_And(const V& a, const V& b) { return sel(a != V(0.f), sel(b != V(0.f), V(1.f), V(0.f)), V(0.f)); }
template <class V> inline V op_Or(const V& a, const V& b) { return sel(a != V(0.f), V(1.f), sel(b != V(0.f), V(1.f), V(0.f))); }
// Mask inequality, not operator^: xsimd 8.1's batch_bool ^ on AVX-512 masks computes OR (1^1 gave 1;
// the ONNX node tests test_xor* caught it on host).
template <class V> inline V op_Xor(const V& a, const V& b) { return sel((a != V(0.f)) != (b != V(0.f)), V(1.f), V(0.f)); }
template <class V> inline V op_Not(const V& a) { return sel(a != V(0.f), V(0.f), V(1.f)); }
template <class V> inline V op_NotZero(const V& a) { return sel(a != V(0.f), V(1.f), V(0.f)); }  // Cast to bool
// IsNaN / IsInf as 0/1 (generated code is built without -ffinite-math-only, so x != x holds for NaN).
template <class V> inline V op_IsNaN(const V& a) { return sel(a != a, V(1.f), V(0.f)); }
template <class V> inline V op_IsPosInf(const V& a) { return sel(a == V(std::numeric_limits<float>::infinity()), V(1.f), V(0.f)); }
template <class V> inline V op_IsNegInf(const V& a) { return sel(a == V(-std::numeric_limits<float>::infinity()), V(1.f), V(0.f)); }
template <class V> inline V op_IsInf(const V& a) { return sel(a == V(std::numeric_limits<float>::infinity()), V(1.f), op_IsNegInf(a)); }
template <class V> inline V op_Trunc(const V& x) {  // Cast float -> integer (toward zero)
  if constexpr (!is_vec<V>) return std::trunc(x);
  else return xsimd::trunc(x);
}

// ---- loops ----
// body(tag, r, c) computes elements (r, c..c+L-1) for tag = VF, (r, c) for tag = float.
template <bool Vec, class Body>
inline void run_row(int64_t r, int64_t c0, int64_t c1, const Body& body) {
  int64_t c = c0;
  if constexpr (Vec)
    for (; c + L <= c1; c += L) body(VF{}, r, c);
  for (; c < c1; ++c) body(float{}, r, c);
}

// An elementwise stage over rows x width: parallel over rows, or over column chunks of one row.
// row_fn(r, c0, c1) computes elements (r, c0..c1-1).
template <class RowFn>
inline void elementwise_rows(const nnfuse_exec_ctx* ctx, int64_t rows, int64_t width, const RowFn& row_fn) {
  Par par{ctx};
  const int64_t total = rows * width;
  if (total <= 0) return;
  const int64_t grain = 16384;  // elements per task, at least
  if (rows == 1 || width >= grain) {
    int64_t chunk = std::max<int64_t>(grain, (width + 63) / 64);
    chunk = (chunk + L - 1) / L * L;
    int64_t per_row = (width + chunk - 1) / chunk;
    int64_t tasks = rows * per_row;
    if (total < 2 * grain) tasks = 1, per_row = 0;
    if (tasks == 1) {
      for (int64_t r = 0; r < rows; ++r) row_fn(r, int64_t(0), width);
      return;
    }
    par(tasks, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t r = t / per_row, k = t % per_row;
        row_fn(r, k * chunk, std::min(width, (k + 1) * chunk));
      }
    });
    return;
  }
  int64_t rows_per_task = std::max<int64_t>(1, grain / std::max<int64_t>(width, 1));
  int64_t tasks = (rows + rows_per_task - 1) / rows_per_task;
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t r = t * rows_per_task; r < std::min(rows, (t + 1) * rows_per_task); ++r) row_fn(r, int64_t(0), width);
  };
  if (tasks == 1) run(0, 1);
  else par(tasks, run);
}

template <bool Vec, class Body>
inline void elementwise(const nnfuse_exec_ctx* ctx, int64_t rows, int64_t width, const Body& body) {
  if constexpr (!Vec) {
    // A stage that runs on scalars reads some operand with a stride along the row (a Transpose:
    // [seq, heads, d] -> [heads, d, seq] reads a new cache line per element). Rows of a task go
    // in column blocks, so that the lines one row read are still in L1 when the next rows (the
    // neighbouring d) read them: a whole row at a time left 1500 lines between two uses.
    // A single group of rows (16 rows of 8-16k columns) is cut into column ranges instead, so
    // that it still makes a task per thread.
    constexpr int64_t kColBlock = 64, kRowGroup = 16, kGrain = 16384;
    if (rows > 1 && width < kGrain && width > kColBlock) {
      const int64_t rows_per_task = std::max<int64_t>(kRowGroup, (kGrain / width + kRowGroup - 1) / kRowGroup * kRowGroup);
      const int64_t row_tasks = (rows + rows_per_task - 1) / rows_per_task;
      const int64_t blocks = (width + kColBlock - 1) / kColBlock;
      const int64_t parts = row_tasks == 1 ? std::min(blocks, std::max<int64_t>(1, rows * width / kGrain)) : 1;
      const int64_t part_blocks = (blocks + parts - 1) / parts;
      const int64_t tasks = row_tasks * parts;
      auto run = [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t r0 = (t / parts) * rows_per_task, r1 = std::min(rows, r0 + rows_per_task);
          const int64_t c_begin = (t % parts) * part_blocks * kColBlock, c_end = std::min(width, c_begin + part_blocks * kColBlock);
          for (int64_t c0 = c_begin; c0 < c_end; c0 += kColBlock)
            for (int64_t r = r0; r < r1; ++r) run_row<false>(r, c0, std::min(c_end, c0 + kColBlock), body);
        }
      };
      if (tasks == 1) run(0, 1);
      else Par{ctx}(tasks, run);
      return;
    }
  }
  elementwise_rows(ctx, rows, width, [&](int64_t r, int64_t c0, int64_t c1) { run_row<Vec>(r, c0, c1, body); });
}

// The same with per-row state: row_init(r) is computed once per row (a separable index map's row
// parts) and passed to body(tag, r, c, state).
template <bool Vec, class RowInit, class Body>
inline void elementwise_split(const nnfuse_exec_ctx* ctx, int64_t rows, int64_t width, const RowInit& row_init, const Body& body) {
  elementwise_rows(ctx, rows, width, [&](int64_t r, int64_t c0, int64_t c1) {
    const auto state = row_init(r);
    run_row<Vec>(r, c0, c1, [&](auto tag, int64_t rr, int64_t c) { body(tag, rr, c, state); });
  });
}

// An epilogue that is only valid on scalars: batches are split into lanes.
template <class Body>
struct LaneSplit {
  const Body& body;
  template <class V>
  V operator()(const V& v, int64_t r, int64_t c) const {
    if constexpr (!is_vec<V>) return body(v, r, c);
    else {
      alignas(64) float t[V::size];
      v.store_aligned(t);
      for (size_t l = 0; l < V::size; ++l) t[l] = body(t[l], r, c + int64_t(l));
      return V::load_aligned(t);
    }
  }
};

// ---- anchors not covered by the GEMM/conv microkernels (row-wise, vectorised) ----
// Applies ep to a computed row and stores it: y[c] = ep(t[c], r, c).
template <class Ep>
inline void store_row(float* y, const float* t, int64_t n, int64_t r, const Ep& ep) {
  int64_t c = 0;
  for (; c + L <= n; c += L) ep(VF::load_unaligned(t + c), r, c).store_unaligned(y + c);
  for (; c < n; ++c) y[c] = ep(t[c], r, c);
}

// Softmax over rows of n contiguous elements.
template <class Ep>
inline void softmax(const nnfuse_exec_ctx* ctx, const float* x, float* y, int64_t rows, int64_t n, const Ep& ep) {
  Par{ctx}(rows, [&](int64_t b, int64_t e) {
    std::vector<float> t(size_t(std::max<int64_t>(n, 1)));
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * n;
      float mx = -std::numeric_limits<float>::infinity();
      int64_t c = 0;
      VF vm(mx);
      for (; c + L <= n; c += L) vm = xsimd::max(vm, VF::load_unaligned(xr + c));
      {
        alignas(64) float t8[VF::size];
        vm.store_aligned(t8);
        for (size_t l = 0; l < VF::size; ++l) mx = std::max(mx, t8[l]);
      }
      for (; c < n; ++c) mx = std::max(mx, xr[c]);
      VF vs(0.f);
      float s = 0;
      c = 0;
      for (; c + L <= n; c += L) {
        VF ev = nnfuse::mk::vexp(VF::load_unaligned(xr + c) - VF(mx));
        ev.store_unaligned(t.data() + c);
        vs += ev;
      }
      s = xsimd::hadd(vs);
      for (; c < n; ++c) {
        t[size_t(c)] = std::exp(xr[c] - mx);
        s += t[size_t(c)];
      }
      float inv = 1.f / s;
      for (c = 0; c + L <= n; c += L) (VF::load_unaligned(t.data() + c) * VF(inv)).store_unaligned(t.data() + c);
      for (; c < n; ++c) t[size_t(c)] *= inv;
      store_row(y + r * n, t.data(), n, r, ep);
    }
  });
}

// Softmax of x viewed as [outer, n, inner] over n (a non-last axis), vectorised along inner.
// ep rows: o * n + k, cols: i (the output viewed as [outer * n, inner]).
template <class Ep>
inline void softmax_axis(const nnfuse_exec_ctx* ctx, const float* x, float* y, int64_t outer, int64_t n, int64_t inner, const Ep& ep) {
  const int64_t chunks = (inner + L - 1) / L;
  Par{ctx}(outer * chunks, [&](int64_t b, int64_t e) {
    std::vector<float> t(size_t(n * L));
    for (int64_t task = b; task < e; ++task) {
      const int64_t o = task / chunks, i0 = (task % chunks) * L;
      const float* xo = x + o * n * inner;
      float* yo = y + o * n * inner;
      auto run = [&](auto tag, int64_t i) {
        using V = decltype(tag);
        constexpr int64_t W = is_vec<V> ? L : 1;
        V mx(-std::numeric_limits<float>::infinity());
        for (int64_t k = 0; k < n; ++k) mx = vmax(ld<V, 1>(xo + k * inner + i), mx);
        V s(0.f);
        for (int64_t k = 0; k < n; ++k) {
          V ev = nnfuse::mk::vexp(ld<V, 1>(xo + k * inner + i) - mx);
          st<V>(t.data() + k * W, ev);
          s += ev;
        }
        V inv = V(1.f) / s;
        for (int64_t k = 0; k < n; ++k) st<V>(yo + k * inner + i, ep(ld<V, 1>(t.data() + k * W) * inv, o * n + k, i));
      };
      if (i0 + L <= inner) run(VF{}, i0);
      else
        for (int64_t i = i0; i < inner; ++i) run(float{}, i);
    }
  });
}

// (x - mean) / sqrt(var + eps) over rows of n contiguous elements (scale/bias are epilogue): the
// vectorized microkernel (reduce.h). A scalar loop summing in double took 1.45 ms for a
// 1500 x 384 LayerNormalization (Whisper-tiny's encoder), ORT's 0.37.
template <class Ep>
inline void layernorm(const nnfuse_exec_ctx* ctx, const float* x, float* y, int64_t rows, int64_t n, float eps, const Ep& ep) {
  nnfuse::mk::layernorm<A>(rows, n, x, n, nullptr, nullptr, eps, y, n, ep, Par{ctx});
}

// Reduction of x viewed as [outer, red, inner] over red; mode 0 sum, 1 mean, 2 max.
// ep rows: o, cols: i (the output viewed as [outer, inner]).
template <class Ep>
inline void reduce(const nnfuse_exec_ctx* ctx, const float* x, float* y, int64_t outer, int64_t red, int64_t inner, int mode, const Ep& ep) {
  Par{ctx}(outer, [&](int64_t b, int64_t e) {
    std::vector<float> acc(size_t(std::max<int64_t>(inner, 1)));
    for (int64_t o = b; o < e; ++o) {
      const float* xo = x + o * red * inner;
      if (inner == 1) {
        float v;
        if (mode == 2) {
          v = -std::numeric_limits<float>::infinity();
          for (int64_t k = 0; k < red; ++k) v = std::max(v, xo[k]);
        } else {
          VF vs(0.f);
          int64_t k = 0;
          for (; k + L <= red; k += L) vs += VF::load_unaligned(xo + k);
          double s = double(xsimd::hadd(vs));
          for (; k < red; ++k) s += xo[k];
          v = float(mode == 1 ? s / double(red) : s);
        }
        y[o] = ep(v, o, 0);
        continue;
      }
      for (int64_t i = 0; i < inner; ++i) acc[size_t(i)] = mode == 2 ? -std::numeric_limits<float>::infinity() : 0.f;
      for (int64_t k = 0; k < red; ++k)
        for (int64_t i = 0; i < inner; ++i) {
          float v = xo[k * inner + i];
          acc[size_t(i)] = mode == 2 ? std::max(acc[size_t(i)], v) : acc[size_t(i)] + v;
        }
      if (mode == 1)
        for (auto& a : acc) a /= float(red);
      store_row(y + o * inner, acc.data(), inner, o, ep);
    }
  });
}

// 2-D pooling, NCHW. ep rows: n*C + c, cols: oh*OW + ow.
template <class Ep>
inline void pool2d(const nnfuse_exec_ctx* ctx, const float* x, float* y, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH,
                   int64_t OW, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t PH1, int64_t PW1,
                   int64_t DH, int64_t DW, bool is_max, bool count_include_pad, const Ep& ep) {
  Par{ctx}(N * C, [&](int64_t b, int64_t e) {
    std::vector<float> t(size_t(OH * OW));
    for (int64_t rc = b; rc < e; ++rc) {
      const float* xp = x + rc * H * W;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          float acc = is_max ? -std::numeric_limits<float>::infinity() : 0.f;
          int64_t cnt = 0;
          for (int64_t kh = 0; kh < KH; ++kh) {
            int64_t ih = oh * SH - PH + kh * DH;
            if (ih < 0 || ih >= H) continue;
            for (int64_t kw = 0; kw < KW; ++kw) {
              int64_t iw = ow * SW - PW + kw * DW;
              if (iw < 0 || iw >= W) continue;
              float v = xp[ih * W + iw];
              acc = is_max ? std::max(acc, v) : acc + v;
              ++cnt;
            }
          }
          if (!is_max) {
            if (count_include_pad) {
              int64_t h0 = oh * SH - PH, w0 = ow * SW - PW;
              int64_t h1 = std::min(h0 + (KH - 1) * DH + 1, H + PH1), w1 = std::min(w0 + (KW - 1) * DW + 1, W + PW1);
              int64_t hc = 0, wc = 0;
              for (int64_t h = h0; h < h1; h += DH) ++hc;
              for (int64_t w = w0; w < w1; w += DW) ++wc;
              cnt = hc * wc;
            }
            acc = cnt ? acc / float(cnt) : 0.f;
          }
          t[size_t(oh * OW + ow)] = acc;
        }
      store_row(y + rc * OH * OW, t.data(), OH * OW, rc, ep);
    }
  });
}

}  // namespace nf
