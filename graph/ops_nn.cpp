// The neural-network op family: registration, and the float GEMM every heavy kernel runs on.
// The ops themselves live in ops_nn_matmul.cpp, ops_nn_conv.cpp, ops_nn_norm.cpp, ops_nn_reduce.cpp.
#include <algorithm>
#include <cstring>
#include <thread>

#include "graph/ops_nn_internal.h"

namespace nnfuse {

namespace nn {
namespace {

// Register-blocked micro-kernel: MR rows x NR columns of C kept in vector registers. GCC/Clang
// vector extensions keep it portable (SSE2 on x86-64 baseline, NEON on aarch64) without relying
// on the auto-vectoriser, which at -O2 would not touch a loop with a runtime trip count. On
// x86-64 an AVX2 clone is picked at load time; it performs the same multiplies and adds in the
// same order (no FMA contraction in ISO C++ mode), so results are bitwise the same on either.
typedef float v8f __attribute__((vector_size(32)));
constexpr int64_t MR = 6, NR = 8;
constexpr int64_t KC = 256, MC = 120, NC = 2048;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NNFUSE_GEMM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define NNFUSE_GEMM_CLONES
#endif

// a: kc x MR (packed), b: kc x NR (packed); out: MR x NR, row-major.
NNFUSE_GEMM_CLONES void micro_kernel(int64_t kc, const float* a, const float* b, float* out) {
  v8f c0 = {0, 0, 0, 0, 0, 0, 0, 0}, c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  for (int64_t k = 0; k < kc; ++k) {
    v8f bv;
    std::memcpy(&bv, b, sizeof bv);
    c0 += a[0] * bv;
    c1 += a[1] * bv;
    c2 += a[2] * bv;
    c3 += a[3] * bv;
    c4 += a[4] * bv;
    c5 += a[5] * bv;
    a += MR;
    b += NR;
  }
  std::memcpy(out + 0 * NR, &c0, sizeof c0);
  std::memcpy(out + 1 * NR, &c1, sizeof c1);
  std::memcpy(out + 2 * NR, &c2, sizeof c2);
  std::memcpy(out + 3 * NR, &c3, sizeof c3);
  std::memcpy(out + 4 * NR, &c4, sizeof c4);
  std::memcpy(out + 5 * NR, &c5, sizeof c5);
}

void pack_a(int64_t mc, int64_t kc, const float* A, int64_t a_rs, int64_t a_cs, float* out) {
  for (int64_t i0 = 0; i0 < mc; i0 += MR) {
    int64_t rows = std::min(MR, mc - i0);
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t r = 0; r < rows; ++r) out[r] = A[(i0 + r) * a_rs + k * a_cs];
      for (int64_t r = rows; r < MR; ++r) out[r] = 0.f;
      out += MR;
    }
  }
}

void pack_b(int64_t kc, int64_t nc, const float* B, int64_t b_rs, int64_t b_cs, float* out) {
  for (int64_t j0 = 0; j0 < nc; j0 += NR) {
    int64_t cols = std::min(NR, nc - j0);
    for (int64_t k = 0; k < kc; ++k) {
      const float* src = B + k * b_rs + j0 * b_cs;
      if (cols == NR && b_cs == 1) {
        std::memcpy(out, src, NR * sizeof(float));
      } else {
        for (int64_t c = 0; c < cols; ++c) out[c] = src[c * b_cs];
        for (int64_t c = cols; c < NR; ++c) out[c] = 0.f;
      }
      out += NR;
    }
  }
}

void sgemm_serial(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                  int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
    return;
  }
  std::vector<float> pa(size_t(MC * KC)), pb(size_t(std::min(NC, (N + NR - 1) / NR * NR) * KC));
  alignas(32) float tile[MR * NR];
  for (int64_t jc = 0; jc < N; jc += NC) {
    int64_t nc = std::min(NC, N - jc);
    for (int64_t pc = 0; pc < K; pc += KC) {
      int64_t kc = std::min(KC, K - pc);
      bool add = accumulate || pc > 0;
      pack_b(kc, nc, B + pc * b_rs + jc * b_cs, b_rs, b_cs, pb.data());
      for (int64_t ic = 0; ic < M; ic += MC) {
        int64_t mc = std::min(MC, M - ic);
        pack_a(mc, kc, A + ic * a_rs + pc * a_cs, a_rs, a_cs, pa.data());
        for (int64_t jr = 0; jr < nc; jr += NR) {
          int64_t cols = std::min(NR, nc - jr);
          const float* bp = pb.data() + (jr / NR) * NR * kc;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            int64_t rows = std::min(MR, mc - ir);
            micro_kernel(kc, pa.data() + (ir / MR) * MR * kc, bp, tile);
            for (int64_t r = 0; r < rows; ++r) {
              float* c = C + (ic + ir + r) * ldc + jc + jr;
              const float* t = tile + r * NR;
              if (add)
                for (int64_t q = 0; q < cols; ++q) c[q] += t[q];
              else
                for (int64_t q = 0; q < cols; ++q) c[q] = t[q];
            }
          }
        }
      }
    }
  }
}

unsigned gemm_threads() {
  static unsigned n = std::max(1u, std::min(2u, std::thread::hardware_concurrency()));
  return n;
}

}  // namespace

void sgemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t b_rs,
           int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  double work = 2.0 * double(M) * double(N) * double(K);
  if (gemm_threads() < 2 || work < 4e6) {
    sgemm_serial(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate);
    return;
  }
  // Two halves of the output (rows, or columns when there are few rows). Every element is still
  // computed by the same sequence of operations, so the result is independent of the split.
  if (M >= 2 * MR) {
    int64_t m0 = (M / 2 + MR - 1) / MR * MR;
    std::thread t([&] { sgemm_serial(m0, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate); });
    sgemm_serial(M - m0, N, K, A + m0 * a_rs, a_rs, a_cs, B, b_rs, b_cs, C + m0 * ldc, ldc, accumulate);
    t.join();
  } else if (N >= 2 * NR) {
    int64_t n0 = (N / 2 + NR - 1) / NR * NR;
    std::thread t([&] { sgemm_serial(M, n0, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate); });
    sgemm_serial(M, N - n0, K, A, a_rs, a_cs, B + n0 * b_cs, b_rs, b_cs, C + n0, ldc, accumulate);
    t.join();
  } else {
    sgemm_serial(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate);
  }
}

}  // namespace nn

void register_nn_ops(OpRegistry& r) {
  nn::register_nn_matmul_ops(r);
  nn::register_nn_quantize_ops(r);
  nn::register_nn_conv_ops(r);
  nn::register_nn_norm_ops(r);
  nn::register_nn_reduce_ops(r);
  nn::register_nn_rotary_ops(r);
  nn::register_nn_attention_ops(r);
  nn::register_nn_loss_ops(r);
  nn::register_nn_fold_ops(r);
  nn::register_nn_roi_ops(r);
  nn::register_nn_deform_conv_ops(r);
  nn::register_nn_linear_attention_ops(r);
}

}  // namespace nnfuse
