#pragma once
// Shared pieces of the nnfuse CPU microkernels: arch aliases, the parallel-for hook, identity
// prologue/epilogue, aligned scratch buffers and partial-batch load/store helpers.
// Header-only; includes only the C++ standard library and xsimd 8.1 (generated code is compiled
// standalone, without nnfuse's libraries).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include <xsimd/xsimd.hpp>

namespace nnfuse::mk {

// xsimd arch tags per nnfuse target. Only the one matching the compiler's ISA flags can be
// instantiated. On x86 prefer fma3<avx2> over plain avx2: with the latter xsimd::fma is a
// separate multiply and add (the compiler may or may not contract them).
namespace arch {
#if defined(__x86_64__) || defined(_M_X64)
using x86_avx2 = xsimd::fma3<xsimd::avx2>;  // -mavx2 -mfma
using x86_avx512 = xsimd::avx512bw;          // -mavx512f -mavx512bw -mavx512dq -mavx512vl
#endif
#if defined(__aarch64__)
using arm_neon = xsimd::neon64;
#endif
using native = xsimd::default_arch;  // the best arch the compiler flags allow
}  // namespace arch

template <class Arch>
using vfloat = xsimd::batch<float, Arch>;

// Marks the chunk bodies kernels pass to a ParFor. Kept out of line so that there is exactly one
// compiled copy of each body: inlined separately into a serial and a threaded par-for, the
// compiler may contract a*b+c into an FMA in one copy and not in the other (measured: LayerNorm
// rows differing in the last bit between SerialFor and a 2-thread par-for at -O3), which would
// break "any par-for gives bitwise-identical results". One call per chunk costs nothing.
#if defined(__GNUC__)
#define NNFUSE_MK_CHUNK __attribute__((noinline))
#else
#define NNFUSE_MK_CHUNK
#endif

// Register-blocked tiles that must inline into their loop: called once per few hundred FMAs, a
// real call (saving registers, passing a dozen arguments) costs ~10% of the tile.
#if defined(__GNUC__)
#define NNFUSE_MK_TILE inline __attribute__((always_inline))
#else
#define NNFUSE_MK_TILE inline
#endif

// Runs fn(begin, end) once over [0, n) on the calling thread. The runtime's thread-pool par-for
// has the same shape: par(n, fn) calls fn(begin, end) over disjoint chunks covering [0, n) and
// returns when all are done. Kernels never split a reduction across chunks, so the result does
// not depend on the par-for used.
struct SerialFor {
  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    if (n > 0) fn(int64_t(0), n);
  }
};

// The threads a ParFor runs on where it says (the runtime's nf::Par: threads(); a `threads`
// field), else 1. Kernels may balance their task counts by it; results never depend on it.
template <class ParFor>
inline int64_t par_threads(const ParFor& par) {
  if constexpr (requires { par.threads(); }) return int64_t(par.threads());
  else if constexpr (requires { par.threads; }) return int64_t(par.threads);
  else return 1;
}

// Identity prologue/epilogue: ep(v, row, col) -> v for SIMD batches and scalars.
struct IdentityEpilogue {
  template <class V>
  V operator()(const V& v, int64_t, int64_t) const { return v; }
};
using IdentityPrologue = IdentityEpilogue;

// An epilogue that a GEMM tile applies after storing its sums, one vector at a time from L1,
// rather than to each accumulator while the others are still live in registers. For epilogues
// with constants and temporaries of their own (GELU's erf, sigmoid, tanh) the latter spilled the
// accumulators: bias + GELU after a 197 x 3072 x 768 product cost 0.9-1.4 ms there, 0.3-0.7 ms so
// (a harness, 1 Zen 3 core; in ViT-B/16 and BERT-base the GELU blocks gained 1%: bench/RESULTS.md,
// session 30). Light epilogues (a bias, a residual) stay in registers,
// where the extra pass would cost ~1%. The code generator wraps the heavy ones (emit_cpp.cpp).
template <class Ep>
struct AfterStoresEpilogue {
  const Ep& ep;
  static constexpr bool after_stores = true;
  template <class V>
  V operator()(const V& v, int64_t r, int64_t c) const { return ep(v, r, c); }
};
template <class Ep, class = void>
struct runs_after_stores : std::false_type {};
template <class Ep>
struct runs_after_stores<Ep, std::void_t<decltype(Ep::after_stores)>> : std::bool_constant<Ep::after_stores> {};
template <class Ep>
inline constexpr bool runs_after_stores_v = runs_after_stores<Ep>::value;

// Wraps an epilogue so that a kernel can call it in its local (row, col) space while the user
// functor sees the caller's space: row + row_off, col + col_off.
template <class Ep>
struct OffsetEpilogue {
  const Ep& ep;
  int64_t row_off, col_off;
  static constexpr bool after_stores = runs_after_stores_v<Ep>;
  template <class V>
  V operator()(const V& v, int64_t r, int64_t c) const { return ep(v, r + row_off, c + col_off); }
};

// 64-byte aligned scratch memory that grows on demand and is reused across calls (per thread:
// see thread_scratch).
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { release(); }
  float* get(int64_t nfloats) {
    size_t need = size_t(std::max<int64_t>(nfloats, 1)) * sizeof(float);
    if (need > bytes_) {
      release();
      size_t rounded = (need + 63) / 64 * 64;
      data_ = static_cast<float*>(::operator new(rounded, std::align_val_t(64)));
      bytes_ = rounded;
    }
    return data_;
  }

 private:
  void release() {
    if (data_) ::operator delete(data_, std::align_val_t(64));
    data_ = nullptr;
    bytes_ = 0;
  }
  float* data_ = nullptr;
  size_t bytes_ = 0;
};

// Allocator for packed weights: 64-byte (cache line, AVX-512 vector) aligned. std::vector's
// default gives 16 bytes from glibc, so every vector load of a packed weight panel straddled two
// cache lines: a ResNet-50 3x3 conv ran 10-13% faster on the same panel copied to an aligned
// buffer (bench/RESULTS.md, session 23).
template <class T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(std::max<size_t>(n, 1) * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
};
template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

// Per-thread scratch shared by every kernel instantiation in a program (or shared object): one
// buffer per slot, so a model with many GEMM/conv blocks keeps one set of packing buffers per
// thread instead of one per instantiation. A kernel uses its slots only while it runs and never
// calls another kernel meanwhile, so slots are not shared by two live users.
// ConvPadded and Int8Copy are the calling thread's: the workers of its parallel loop read them while it waits.
enum class ScratchSlot { GemmA = 0, GemmB = 1, Rows = 2, WinogradV = 3, WinogradM = 4, DepthwiseRows = 5, ConvPadded = 6, Attention = 7, Int8Copy = 8, Count = 9 };
inline float* thread_scratch(ScratchSlot slot, int64_t nfloats) {
  thread_local ScratchBuffer buffers[int(ScratchSlot::Count)];
  return buffers[int(slot)].get(nfloats);
}

// Loads n (< batch size) floats, filling the rest with `fill`.
template <class Arch>
inline vfloat<Arch> load_partial(const float* p, int64_t n, float fill = 0.f) {
  alignas(64) float tmp[vfloat<Arch>::size];
  for (size_t i = 0; i < vfloat<Arch>::size; ++i) tmp[i] = int64_t(i) < n ? p[i] : fill;
  return vfloat<Arch>::load_aligned(tmp);
}
template <class Arch>
inline void store_partial(float* p, const vfloat<Arch>& v, int64_t n) {
  alignas(64) float tmp[vfloat<Arch>::size];
  v.store_aligned(tmp);
  for (int64_t i = 0; i < n; ++i) p[i] = tmp[i];
}

// y[c] = ep(x[c], row, c) for c in [0, n): full batches through the batch overload, the tail
// through the scalar one.
template <class Arch, class Ep>
inline void store_row_with_epilogue(float* y, const float* x, int64_t n, int64_t row, int64_t col0, const Ep& ep) {
  constexpr int64_t L = int64_t(vfloat<Arch>::size);
  int64_t c = 0;
  for (; c + L <= n; c += L) ep(vfloat<Arch>::load_unaligned(x + c), row, col0 + c).store_unaligned(y + c);
  for (; c < n; ++c) y[c] = ep(x[c], row, col0 + c);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace nnfuse::mk
