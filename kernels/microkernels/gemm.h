#pragma once
// GEMM: C = ep(alpha * A B), packed and register-blocked (contract in microkernels.h).
//
// Structure (BLIS-like, row-major C): C is cut into MC x NT tiles (per batch) that run in
// parallel. A tile loops over K blocks of at most KC; per K block it packs its A block into
// MR-row panels ([k][MR], zero-padded) and its B strip into NR-column panels ([k][NR],
// zero-padded), then walks the NR panels (a B panel kc x NR stays in L1) and for each the MR
// panels of its A block (kc x MC stays in L2). The MR x NR microkernel keeps its
// accumulators in registers: C += A_panel B_panel over kc. The first K block stores, later ones
// add; the last applies alpha and the epilogue. Each C element's sum runs over the same K blocks
// in the same order whatever the tiles, so any tiling and thread count gives bitwise identical
// results (the column split is balanced over the par-for's threads).
#include "common.h"

namespace nnfuse::mk {

// Register and cache blocking per arch (by SIMD width: 16 = AVX-512, 8 = AVX2, 4 = NEON).
template <class Arch>
struct GemmTile {
  static constexpr int L = int(vfloat<Arch>::size);
  // Accumulators: MR * NB vector registers (AVX2 6x16: 12 of 16; AVX-512 8x32: 16 of 32;
  // NEON 8x12: 24 of 32). AVX-512 uses MR = 8 rather than 12 or 14: as fast on square GEMMs and
  // no padded rows for the multiple-of-8 channel counts of CNN convolutions (measured: ResNet
  // 3x3 conv 101 vs 90 GFLOP/s).
  static constexpr int MR = L == 16 ? 8 : L == 8 ? 6 : 8;
  static constexpr int NB = L == 16 ? 2 : L == 8 ? 2 : 3;
  static constexpr int NR = NB * L;
  // B panel KC x NR in L1: AVX2 384 x 16 floats = 24 KiB, AVX-512 256 x 32 = 32 KiB, NEON 12 KiB.
  static constexpr int64_t KC = L == 8 ? 384 : 256;
  static constexpr int64_t MC = MR * (L == 16 ? 18 : L == 8 ? 24 : 16);  // A block MC x KC in L2
  // Up to this many rows, all of M is one row tile (an A block of at most 288 x KC in L2), so
  // each B strip is read from memory once, not once per row tile: ViT's 197-row GEMMs against
  // weights streamed from memory ran 5-10% faster so (bench/kernels_bench.cpp, B from memory).
  static constexpr int64_t MC_WHOLE = 2 * MC;
  static constexpr int64_t NT = NR * (L == 16 ? 8 : 16);                 // columns per parallel tile
};

// K blocking: K split into equal blocks of at most KC (balanced, so no tiny last block).
template <class Arch>
struct KBlocking {
  int64_t nblocks, kc;
  explicit KBlocking(int64_t K) {
    nblocks = K <= 0 ? 1 : ceil_div(K, GemmTile<Arch>::KC);
    kc = K <= 0 ? 0 : ceil_div(K, nblocks);
  }
  int64_t begin(int64_t kb) const { return kb * kc; }
  int64_t size(int64_t kb, int64_t K) const { return std::max<int64_t>(0, std::min(K - kb * kc, kc)); }
};

// What the code generator knows about a GEMM when it emits the call: its rows M and batch (0 =
// any). An instantiation compiles only the microkernel row counts that M (and M x batch, once
// batches fold into rows) leave for the full and the last row tile, and the matrix-vector path only
// where M can be 1; compiling all of them for every fused epilogue was most of a transformer's
// build time. gemm() and gemm_packed() return false, computing nothing, for arguments outside the
// class; the generator only emits classes that its static shapes satisfy.
struct GemmClass {
  int64_t M = 0, batch = 0;
};

struct GemmArgs {
  int64_t M = 0, N = 0, K = 0;
  const float* A = nullptr;
  int64_t a_rs = 0, a_cs = 1;  // A(m,k) = A[m*a_rs + k*a_cs]
  const float* B = nullptr;
  int64_t b_rs = 0, b_cs = 1;  // B(k,n) = B[k*b_rs + n*b_cs]
  float* C = nullptr;
  int64_t ldc = 0;             // C(m,n) = C[m*ldc + n]
  float alpha = 1.f;
  int64_t batch = 1;
  int64_t a_bs = 0, b_bs = 0, c_bs = 0;  // per-batch element offsets (0 = broadcast)

  // Row-major contiguous C[M,N] = op(A) op(B), with op = transpose when trans_*.
  static GemmArgs matmul(int64_t M, int64_t N, int64_t K, const float* A, bool trans_a, const float* B, bool trans_b,
                         float* C) {
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.A = A, g.a_rs = trans_a ? 1 : K, g.a_cs = trans_a ? M : 1;
    g.B = B, g.b_rs = trans_b ? 1 : N, g.b_cs = trans_b ? K : 1;
    g.C = C, g.ldc = N;
    return g;
  }
};

namespace detail {

// Products under this many FLOPs (a step of a small recurrent cell: 2 x 72 x 24) run on the
// calling thread: handing a few microseconds of work to another thread costs more than it
// saves (a 7-step GRU of 24 units took 26 us at 2 threads, 10 us at 1). Generated GEMM stages
// below it are serial already (kernels/emit_cpp.cpp, serial_anchor); this covers the products
// that kernels such as the GRU and LSTM make per step.
constexpr double kSerialGemmFlops = 2.5e5;
inline bool gemm_runs_serial(int64_t batch, int64_t M, int64_t N, int64_t K) {
  return 2.0 * double(batch) * double(M) * double(N) * double(std::max<int64_t>(K, 1)) < kSerialGemmFlops;
}
// par(n, fn), or fn(0, n) here when `serial`.
template <class ParFor, class Fn>
inline void par_unless(bool serial, const ParFor& par, int64_t n, const Fn& fn) {
  if (n <= 0) return;
  if (serial) fn(int64_t(0), n);
  else par(n, fn);
}

template <class Pro>
inline constexpr bool is_identity_v = std::is_same_v<std::decay_t<Pro>, IdentityEpilogue>;

// Packs rows [m0, m0+mv) x k in [k0, k0+kc) of a strided matrix into dst[kk*MR + r], zero rows
// beyond mv. pro sees (row_base + m, k).
template <int MR, class Pro>
inline void pack_a_panel(const float* A, int64_t a_rs, int64_t a_cs, int64_t m0, int64_t mv, int64_t k0, int64_t kc,
                         float* dst, const Pro& pro, int64_t row_base) {
  if (mv < MR)
    for (int64_t kk = 0; kk < kc; ++kk)
      for (int64_t r = mv; r < MR; ++r) dst[kk * MR + r] = 0.f;
  if (a_cs == 1 || a_rs != 1) {
    for (int64_t r = 0; r < mv; ++r) {
      const float* src = A + (m0 + r) * a_rs + k0 * a_cs;
      if constexpr (is_identity_v<Pro>) {
        if (a_cs == 1)
          for (int64_t kk = 0; kk < kc; ++kk) dst[kk * MR + r] = src[kk];
        else
          for (int64_t kk = 0; kk < kc; ++kk) dst[kk * MR + r] = src[kk * a_cs];
      } else {
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * MR + r] = pro(src[kk * a_cs], row_base + m0 + r, k0 + kk);
      }
    }
  } else {  // a_rs == 1: columns of A are contiguous (A transposed)
    for (int64_t kk = 0; kk < kc; ++kk) {
      const float* src = A + m0 + (k0 + kk) * a_cs;
      float* d = dst + kk * MR;
      for (int64_t r = 0; r < mv; ++r) {
        if constexpr (is_identity_v<Pro>)
          d[r] = src[r];
        else
          d[r] = pro(src[r], row_base + m0 + r, k0 + kk);
      }
    }
  }
}

// Packs k in [k0, k0+kc) x columns [n0, n0+nv) of a strided matrix into consecutive NR-column
// panels: column n0 + p*NR + c, row kk goes to dst[p*NR*kc + kk*NR + c] (zero-padded to whole
// panels). nv may span several panels: B rows are then read contiguously across all of them,
// which matters when B's rows are long (one panel at a time would touch one cache line per row).
template <int NR, class Pro>
inline void pack_b_panel(const float* B, int64_t b_rs, int64_t b_cs, int64_t k0, int64_t kc, int64_t n0, int64_t nv,
                         float* dst, const Pro& pro, int64_t row_base) {
  const int64_t npanels = ceil_div(nv, NR), pstride = NR * kc;
  if (b_cs == 1 || b_rs != 1) {
    for (int64_t kk = 0; kk < kc; ++kk) {
      const float* src = B + (k0 + kk) * b_rs + n0 * b_cs;
      for (int64_t p = 0; p < npanels; ++p) {
        float* d = dst + p * pstride + kk * NR;
        const float* s = src + p * NR * b_cs;
        const int64_t w = std::min<int64_t>(NR, nv - p * NR);
        if constexpr (is_identity_v<Pro>) {
          if (b_cs == 1)
            for (int64_t c = 0; c < w; ++c) d[c] = s[c];
          else
            for (int64_t c = 0; c < w; ++c) d[c] = s[c * b_cs];
        } else {
          for (int64_t c = 0; c < w; ++c) d[c] = pro(s[c * b_cs], row_base + k0 + kk, n0 + p * NR + c);
        }
        for (int64_t c = w; c < NR; ++c) d[c] = 0.f;
      }
    }
  } else {  // b_rs == 1: B transposed, columns contiguous along k
    for (int64_t p = 0; p < npanels; ++p) {
      float* d = dst + p * pstride;
      const int64_t w = std::min<int64_t>(NR, nv - p * NR);
      for (int64_t kk = 0; kk < kc; ++kk)
        for (int64_t c = w; c < NR; ++c) d[kk * NR + c] = 0.f;
      for (int64_t c = 0; c < w; ++c) {
        const float* src = B + k0 + (n0 + p * NR + c) * b_cs;
        for (int64_t kk = 0; kk < kc; ++kk) {
          if constexpr (is_identity_v<Pro>)
            d[kk * NR + c] = src[kk];
          else
            d[kk * NR + c] = pro(src[kk], row_base + k0 + kk, n0 + p * NR + c);
        }
      }
    }
  }
}

// The MR x NR microkernel: acc = Ap^T Bp over kc, then C (+)= acc, epilogue on the last K block.
// ROWS <= MR rows of the MR-row A panel are computed: a panel with few valid rows (batch-1
// matrix-vector products, the last rows of M) takes a kernel of 1, 2 or 4 rows, whose FMAs per
// B vector no longer hide the B stream (an 8-row kernel on one row spends 8x the FMAs, which on
// a 1-FMA-per-cycle core caps a GEMV at 8 bytes of B per cycle). Each row's sum runs in the same
// order in every variant, so the result of a row does not depend on which one computed it.
//
// A(r, k) is read at Ap[r * a_rs + k * a_ks]: a packed panel (a_rs = 1, a_ks = MR) or A in place
// (a_rs = its row stride, a_ks = 1). Rows r >= mr read row mr - 1 again (in place there is no
// zero padding to read), and their sums are never stored.
// Bpf, when not null, is memory to prefetch into L2 alongside (see kloop): part or all of the
// next B panel.
// Prefetch: whether Bpf can be non-null (B prepacked); without, only the plain k loop is compiled.
template <class Arch, int MR, int NB, class Ep, int ROWS = MR, bool Prefetch = true>
inline void gemm_micro(int64_t kc, const float* Ap, int64_t a_rs, int64_t a_ks, const float* __restrict Bp,
                       const float* Bpf, int64_t npf, float* C, int64_t ldc, int64_t mr, int64_t nr, bool first, bool last,
                       float alpha, int64_t row0, int64_t col0, const Ep& ep) {
  using V = vfloat<Arch>;
  constexpr int L = int(V::size);
  constexpr int NR = NB * L;
  static_assert(ROWS >= 1 && ROWS <= MR, "gemm_micro: 1 <= ROWS <= MR");
  const float* arow[ROWS];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) arow[r] = Ap + std::min<int64_t>(r, mr - 1) * a_rs;
  V acc[MR][NB];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[r][j] = V(0.f);
  // Prefetch: npf 64-byte lines from Bpf, one per k step (a slice of the next B panel), or with
  // npf < 0 the whole next panel, its row k at step k (a call with no other row tiles to share
  // the work).
  auto kloop = [&](auto pf) {
    constexpr int PF = decltype(pf)::value;
    for (int64_t k = 0, ko = 0; k < kc; ++k, ko += a_ks) {
      if constexpr (PF == 1) {
        if (k < npf) __builtin_prefetch(Bpf + k * 16, 0, 2);
      } else if constexpr (PF == 2) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; j += 16) __builtin_prefetch(Bpf + k * NR + j, 0, 2);
      }
      V b[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) b[j] = V::load_aligned(Bp + k * NR + j * L);
#pragma GCC unroll 16
      for (int r = 0; r < ROWS; ++r) {
        V a(arow[r][ko]);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) acc[r][j] = xsimd::fma(a, b[j], acc[r][j]);
      }
    }
  };
  if (!Prefetch || !Bpf || npf == 0)
    kloop(std::integral_constant<int, 0>{});
  else if (npf > 0)
    kloop(std::integral_constant<int, 1>{});
  else
    kloop(std::integral_constant<int, 2>{});
  if (ROWS == MR && mr == MR && nr == NR) {
    // An AfterStoresEpilogue runs once the tile is stored (the same operations, so the same bits).
    constexpr bool after_stores = runs_after_stores_v<Ep>;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        float* p = C + r * ldc + j * L;
        V v = acc[r][j];
        if (!first) v += V::load_unaligned(p);
        if (last) {
          if (alpha != 1.f) v *= V(alpha);
          if constexpr (!after_stores) v = ep(v, row0 + r, col0 + j * L);
        }
        v.store_unaligned(p);
      }
    if constexpr (after_stores)
      if (last)
        for (int r = 0; r < MR; ++r)
          for (int j = 0; j < NB; ++j) {
            float* p = C + r * ldc + j * L;
            ep(V::load_unaligned(p), row0 + r, col0 + j * L).store_unaligned(p);
          }
    return;
  }
  alignas(64) float tmp[MR * NR];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[r][j].store_aligned(tmp + r * NR + j * L);
  for (int64_t r = 0; r < mr; ++r) {
    float* p = C + r * ldc;
    float* t = tmp + r * NR;
    if (!first)
      for (int64_t c = 0; c < nr; ++c) t[c] += p[c];
    if (last) {
      if (alpha != 1.f)
        for (int64_t c = 0; c < nr; ++c) t[c] *= alpha;
      store_row_with_epilogue<Arch>(p, t, nr, row0 + r, col0, ep);
    } else {
      for (int64_t c = 0; c < nr; ++c) p[c] = t[c];
    }
  }
}

// A of a strided GEMM (or a convolution's weights): packed per K block into MR-row panels, or,
// when its rows are contiguous along k and no prologue applies, read in place by the
// microkernel. In place saves the packing pass, which the driver would repeat for every column
// tile of C (measured: M=128 K=N=768, A packed 8 times, a tenth of the GEMM's time).
// Batch b reads A_(b % bmod) (a grouped convolution's batch n*G + g uses group g's weights).
template <int MR, class Pro>
struct StridedASource {
  const float* A;
  int64_t a_rs, a_cs, a_bs;
  int64_t row_base;  // epilogue/prologue rows of batch b start at b * row_base
  const Pro& pro;
  int64_t bmod = INT64_MAX;
  bool in_place() const { return is_identity_v<Pro> && a_cs == 1; }
  const float* at(int64_t b, int64_t m, int64_t k) const { return A + (b % bmod) * a_bs + m * a_rs + k; }
  int64_t row_stride() const { return a_rs; }
  void pack(int64_t b, int64_t k0, int64_t kc, int64_t m0, int64_t mv, float* dst) const {
    pack_a_panel<MR>(A + (b % bmod) * a_bs, a_rs, a_cs, m0, mv, k0, kc, dst, pro, b * row_base);
  }
};

// The driver shared by GEMM and implicit-im2col convolution.
//   asrc: a StridedASource (packs an MR panel of A_b, or hands out A_b in place).
//   bsrc: either bsrc.pack(b, k0, kc, n0, nv, dst) (packs columns [n0, n0+nv) of B_b as
//         consecutive NR panels of kc x NR floats each, see pack_b_panel), or, when
//         Bsrc::prepacked, bsrc.panel(kb, panel) -> const float* (B packed ahead of time).
//   cptr(b) -> float*: C_b; ldc its row stride. Epilogue rows are b*M + m.
// One parallel task per (batch, MC x NT tile of C), all of K inside the task: the task packs its
// A block and B strip per K block into thread-local buffers that stay in L2 (packing everything
// up front into shared buffers spilled them to L3 for large N and halved the speed).
// The microkernel row count (ROWS) that a row tile of mr rows runs with.
template <int MR>
constexpr int gemm_micro_rows(int64_t mr) {
  return mr == 1 ? 1 : mr == 2 ? 2 : (mr <= 4 && MR > 4) ? 4 : MR;
}

// Whether class GC has a row tile that runs with `rows` (see GemmClass).
template <class Arch, GemmClass GC>
constexpr bool gemm_rows_used(int rows) {
  constexpr int MR = GemmTile<Arch>::MR;
  if (GC.M == 0) return true;
  auto used_by = [&](int64_t m) { return (m >= MR && rows == MR) || (m % MR != 0 && gemm_micro_rows<MR>(m % MR) == rows); };
  return used_by(GC.M) || (GC.batch > 1 && used_by(GC.M * GC.batch));
}

template <GemmClass GC>
constexpr bool gemm_may_gemv() {
  return GC.M == 0 || GC.M == 1;
}

template <GemmClass GC>
inline bool gemm_class_admits(const GemmArgs& g) {
  return GC.M == 0 || (g.M == GC.M && g.batch == GC.batch);
}

template <class Arch, class ASrc, class BSrc, class CPtr, class Ep, class ParFor, GemmClass GC = GemmClass{}>
void gemm_driver(int64_t batch, int64_t M, int64_t N, int64_t K, const ASrc& asrc, const BSrc& bsrc,
                 const CPtr& cptr, int64_t ldc, float alpha, const Ep& ep, const ParFor& par) {
  using T = GemmTile<Arch>;
  constexpr int MR = T::MR, NR = T::NR;
  constexpr bool b_prepacked = BSrc::prepacked;
  if (batch <= 0 || M <= 0 || N <= 0) return;
  const bool serial = gemm_runs_serial(batch, M, N, K);
  const bool a_in_place = asrc.in_place();
  const KBlocking<Arch> kb_(K);
  const int64_t kcmax = std::max<int64_t>(kb_.kc, 1);
  // Tiles: MC x NT, shrunk (to multiples of MR / NR) when the problem would give fewer than
  // kMinTasks tasks, so that a thread pool has work to balance (e.g. 128x768 MatMuls).
  constexpr int64_t kMinTasks = 8;
  int64_t mc = M <= T::MC_WHOLE ? ceil_div(M, int64_t(MR)) * MR : T::MC, nt_cols = T::NT;
  int64_t mtiles = ceil_div(M, mc), ntiles = ceil_div(N, nt_cols);
  if (!serial && batch * mtiles * ntiles < kMinTasks) {
    const int64_t per = ceil_div(kMinTasks, batch * mtiles);
    nt_cols = std::max<int64_t>(2 * NR, ceil_div(ceil_div(N, per), NR) * NR);
    ntiles = ceil_div(N, nt_cols);
    if (batch * mtiles * ntiles < kMinTasks) {
      const int64_t per_m = ceil_div(kMinTasks, batch * ntiles);
      mc = std::max<int64_t>(MR, ceil_div(ceil_div(M, per_m), MR) * MR);
      mtiles = ceil_div(M, mc);
    }
  }
  // Few tasks, not a multiple of the threads: the pool hands each thread a contiguous share, so
  // one of them gets a tile more (ViT's 197 x 2304 QKV projection: 9 tasks, 5 and 4 on 2 threads;
  // it scaled 1.79x against 1.94x for the 12-task 197 x 3072 one). Narrower column tiles even the
  // count out.
  if (const int64_t threads = serial ? 1 : par_threads(par); threads > 1 && (batch * mtiles * ntiles) % threads != 0 &&
                                                batch * mtiles * ntiles < 8 * threads) {
    const int64_t panels = ceil_div(N, int64_t(NR));
    for (int64_t want = ntiles + 1; want <= panels; ++want) {
      const int64_t cols = ceil_div(panels, want) * NR, n_tiles = ceil_div(N, cols);
      if ((batch * mtiles * n_tiles) % threads == 0) {
        nt_cols = cols, ntiles = n_tiles;
        break;
      }
    }
  }
  par_unless(serial, par, batch * mtiles * ntiles, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    float* Apk = a_in_place ? nullptr : thread_scratch(ScratchSlot::GemmA, mc * kcmax);
    float* Bpk = b_prepacked ? nullptr : thread_scratch(ScratchSlot::GemmB, nt_cols * kcmax);
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t b = t / (mtiles * ntiles), mt = (t / ntiles) % mtiles, nt = t % ntiles;
      float* Cb = cptr(b);
      const int64_t m_begin = mt * mc, m_end = std::min(M, m_begin + mc);
      const int64_t n_begin = nt * nt_cols, n_end = std::min(N, n_begin + nt_cols);
      for (int64_t kb = 0; kb < kb_.nblocks; ++kb) {
        const int64_t k0 = kb_.begin(kb), kc = kb_.size(kb, K);
        const bool first = kb == 0, last = kb == kb_.nblocks - 1;
        if (!a_in_place)
          for (int64_t m0 = m_begin; m0 < m_end; m0 += MR)
            asrc.pack(b, k0, kc, m0, std::min<int64_t>(MR, M - m0), Apk + (m0 - m_begin) * kc);
        const int64_t a_rs = a_in_place ? asrc.row_stride() : 1, a_ks = a_in_place ? 1 : MR;
        if constexpr (!b_prepacked) bsrc.pack(b, k0, kc, n_begin, n_end - n_begin, Bpk);
        for (int64_t n0 = n_begin; n0 < n_end; n0 += NR) {
          const float* Bp;
          if constexpr (b_prepacked)
            Bp = bsrc.panel(kb, n0 / NR);
          else
            Bp = Bpk + (n0 - n_begin) * kc;
          const int64_t nr = std::min<int64_t>(NR, N - n0);
          // Prepacked B (weights) comes from memory on every call of a model's GEMM: the next
          // panel is prefetched while this one is used, spread as one line per k step over the
          // row tiles (a burst of the whole panel in the first tile left part of it late), or,
          // with one row tile, all of it in that tile (bench/kernels_bench.cpp, B from memory:
          // +10-14% for the burst, +3-16% more for the spread, on a Xeon).
          const float* Bnext = nullptr;
          if constexpr (b_prepacked) {
            if (n0 + NR < n_end)
              Bnext = bsrc.panel(kb, n0 / NR + 1);
            else if (kb + 1 < kb_.nblocks)
              Bnext = bsrc.panel(kb + 1, n_begin / NR);
          }
          const int64_t mtiles_here = ceil_div(m_end - m_begin, int64_t(MR));
          const int64_t pf_lines = ceil_div(kc * NR, int64_t(16));
          const int64_t pf_per = mtiles_here > 1 ? std::min(kc, ceil_div(pf_lines, mtiles_here)) : -1;
          for (int64_t m0 = m_begin; m0 < m_end; m0 += MR) {
            const int64_t mr = std::min<int64_t>(MR, M - m0);
            const int64_t mi = (m0 - m_begin) / MR;
            const float* Bpf = pf_per < 0 ? Bnext : Bnext ? Bnext + std::min(pf_lines, mi * pf_per) * 16 : nullptr;
            const int64_t npf = pf_per < 0 ? -1 : std::max<int64_t>(0, std::min(pf_per, pf_lines - mi * pf_per));
            const float* Ap = a_in_place ? asrc.at(b, m0, k0) : Apk + (m0 - m_begin) * kc;
            float* Cp = Cb + m0 * ldc + n0;
            const int64_t row0 = b * M + m0;
            auto micro = [&](auto rows) {
              constexpr int R = decltype(rows)::value;
              if constexpr (gemm_rows_used<Arch, GC>(R))
                gemm_micro<Arch, MR, T::NB, Ep, R, b_prepacked>(kc, Ap, a_rs, a_ks, Bp, Bpf, npf, Cp, ldc, mr, nr, first, last, alpha,
                                                                row0, n0, ep);
            };
            switch (gemm_micro_rows<MR>(mr)) {
              case 1: micro(std::integral_constant<int, 1>{}); break;
              case 2: micro(std::integral_constant<int, 2>{}); break;
              case 4: micro(std::integral_constant<int, (MR > 4 ? 4 : MR)>{}); break;
              default: micro(std::integral_constant<int, MR>{}); break;
            }
          }
        }
      }
    }
  });
}

// B of a plain strided GEMM, packed per call.
template <class Arch, class ProB>
struct StridedBSource {
  static constexpr bool prepacked = false;
  const float* B;
  int64_t b_rs, b_cs, b_bs, K;
  const ProB& pro;
  void pack(int64_t b, int64_t k0, int64_t kc, int64_t n0, int64_t nv, float* dst) const {
    pack_b_panel<GemmTile<Arch>::NR>(B + b * b_bs, b_rs, b_cs, k0, kc, n0, nv, dst, pro, b * K);
  }
};

}  // namespace detail

// B packed once for all K blocks (constant weights), reusable across gemm_packed calls and
// threads (read-only after pack). Layout: [k block][NR panel][kc][NR].
template <class Arch>
class PackedB {
 public:
  PackedB() = default;
  template <class Pro = IdentityPrologue>
  void pack(int64_t K, int64_t N, const float* B, int64_t b_rs, int64_t b_cs, const Pro& pro = {}) {
    using T = GemmTile<Arch>;
    K_ = K, N_ = N;
    KBlocking<Arch> kb_(K);
    npanels_ = ceil_div(N, T::NR);
    kc_ = kb_.kc;
    nblocks_ = kb_.nblocks;
    float* d = data_ = buf_.get(nblocks_ * npanels_ * T::NR * std::max<int64_t>(kc_, 1));
    for (int64_t kb = 0; kb < nblocks_; ++kb)
      for (int64_t p = 0; p < npanels_; ++p)
        detail::pack_b_panel<T::NR>(B, b_rs, b_cs, kb_.begin(kb), kb_.size(kb, K), p * T::NR,
                                    std::min<int64_t>(T::NR, N - p * T::NR), d + block_offset(kb, p), pro, 0);
  }
  int64_t K() const { return K_; }
  int64_t N() const { return N_; }
  // Panel p of K block kb (kc rows of NR floats, where kc is that block's size).
  const float* panel(int64_t kb, int64_t p) const { return data_ + block_offset(kb, p); }

  PackedB(const PackedB&) = delete;
  PackedB& operator=(const PackedB&) = delete;

  static constexpr bool prepacked = true;

 private:
  int64_t block_offset(int64_t kb, int64_t p) const {
    // Every block is laid out with the full kc; the last one may use fewer rows.
    return (kb * npanels_ + p) * GemmTile<Arch>::NR * std::max<int64_t>(kc_, 1);
  }
  ScratchBuffer buf_;
  float* data_ = nullptr;
  int64_t K_ = 0, N_ = 0, npanels_ = 0, kc_ = 0, nblocks_ = 0;
};

namespace detail {

// M == 1 (batch-1 classifier heads, Linear layers): a matrix-vector product is bound by reading B
// once, so packing B (a second pass over it) and a 1-of-MR-rows microkernel would only waste time.
// Parallel over column chunks; the sum over k runs in one fixed order per output.
template <class Arch, class Ep, class ParFor, class ProA, class ProB>
void gemv_row(const GemmArgs& g, const Ep& ep, const ParFor& par, const ProA& pro_a, const ProB& pro_b) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  constexpr int64_t NC = 64 * L;  // output columns per task
  const int64_t chunks = ceil_div(g.N, NC);
  par_unless(gemm_runs_serial(g.batch, g.M, g.N, g.K), par, g.batch * chunks, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    alignas(64) float acc[NC];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t b = t / chunks, n0 = (t % chunks) * NC, nn = std::min(NC, g.N - n0);
      const float* A = g.A + b * g.a_bs;
      const float* B = g.B + b * g.b_bs;
      if (g.b_cs == 1) {  // rows of B contiguous: acc += a_k * B[k, n0 : n0+nn)
        std::fill(acc, acc + nn, 0.f);
        for (int64_t k = 0; k < g.K; ++k) {
          const float ak = pro_a(A[k * g.a_cs], b, k);
          const V av(ak);
          const float* br = B + k * g.b_rs + n0;
          int64_t c = 0;
          for (; c + L <= nn; c += L) {
            V bv = V::load_unaligned(br + c);
            if constexpr (!is_identity_v<ProB>) bv = pro_b(bv, b * g.K + k, n0 + c);
            xsimd::fma(av, bv, V::load_aligned(acc + c)).store_aligned(acc + c);
          }
          for (; c < nn; ++c) acc[c] += ak * pro_b(br[c], b * g.K + k, n0 + c);
        }
      } else {  // columns of B contiguous along k (B transposed): one dot product per output
        for (int64_t c = 0; c < nn; ++c) {
          const float* bc = B + (n0 + c) * g.b_cs;
          V s0(0.f), s1(0.f);
          int64_t k = 0;
          if constexpr (is_identity_v<ProA> && is_identity_v<ProB>) {  // else all scalar below
            if (g.a_cs == 1)
              for (; k + 2 * L <= g.K; k += 2 * L) {
                s0 = xsimd::fma(V::load_unaligned(A + k), V::load_unaligned(bc + k), s0);
                s1 = xsimd::fma(V::load_unaligned(A + k + L), V::load_unaligned(bc + k + L), s1);
              }
          }
          float sum = xsimd::hadd(s0 + s1);
          for (; k < g.K; ++k) sum += pro_a(A[k * g.a_cs], b, k) * pro_b(bc[k], b * g.K + k, n0 + c);
          acc[c] = sum;
        }
      }
      float* C = g.C + b * g.c_bs + n0;
      if (g.alpha != 1.f)
        for (int64_t c = 0; c < nn; ++c) acc[c] *= g.alpha;
      store_row_with_epilogue<Arch>(C, acc, nn, b, n0, ep);
    }
  });
}

// M == 1 against a prepacked B (a recurrent cell's step, batch-1 Linear layers): the product
// streams B once, from L3 or memory (an LSTM's R of 4H x H = 16 MiB at H = 1024). A task owns a
// run of consecutive panels, walks them K block by K block (so it reads one contiguous stretch
// of the packing per block, with a software prefetch 64 rows ahead) and keeps its partial sums
// in L1 until the last block; a generic MR x NR tile wrote C back per K block through a
// temporary row. Each output's sum runs in gemm_micro's order (per K block from zero, then added
// to the earlier blocks' sum), so a row gives the same bits here as in an M > 1 product.
template <class Arch, class Ep, class ParFor, class ProA>
void gemv_packed(const GemmArgs& g, const PackedB<Arch>& pb, const Ep& ep, const ParFor& par, const ProA& pro_a) {
  using T = GemmTile<Arch>;
  using V = vfloat<Arch>;
  constexpr int L = T::L, NB = T::NB, NR = T::NR;
  constexpr int64_t G = 8;    // panels per task (AVX-512: 256 columns)
  constexpr int64_t PF = 64;  // prefetch distance in rows of a panel
  const KBlocking<Arch> kb_(g.K);
  const int64_t np = ceil_div(g.N, int64_t(NR)), groups = ceil_div(np, G);
  par_unless(gemm_runs_serial(g.batch, g.M, g.N, g.K), par, g.batch * groups, [&](int64_t lo, int64_t hi) NNFUSE_MK_CHUNK {
    alignas(64) float acc[G * NR];
    alignas(64) float ablk[T::KC];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t b = t / groups, p0 = (t % groups) * G, pn = std::min(G, np - p0);
      const float* A = g.A + b * g.a_bs;
      for (int64_t kb = 0; kb < kb_.nblocks; ++kb) {
        const int64_t k0 = kb_.begin(kb), kc = kb_.size(kb, g.K);
        const float* a = A + k0;
        if (!is_identity_v<ProA> || g.a_cs != 1) {
          for (int64_t k = 0; k < kc; ++k) ablk[k] = pro_a(A[(k0 + k) * g.a_cs], b, k0 + k);
          a = ablk;
        }
        for (int64_t p = p0; p < p0 + pn; ++p) {
          const float* bp = pb.panel(kb, p);
          V s[NB];
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) s[j] = V(0.f);
          for (int64_t k = 0; k < kc; ++k) {
#pragma GCC unroll 4
            for (int j = 0; j < NR; j += 16) __builtin_prefetch(bp + (k + PF) * NR + j, 0, 1);
            const V ak(a[k]);
#pragma GCC unroll 4
            for (int j = 0; j < NB; ++j) s[j] = xsimd::fma(ak, V::load_aligned(bp + k * NR + j * L), s[j]);
          }
          float* d = acc + (p - p0) * NR;
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) (kb == 0 ? s[j] : s[j] + V::load_aligned(d + j * L)).store_aligned(d + j * L);
        }
      }
      float* C = g.C + b * g.c_bs;
      for (int64_t p = p0; p < p0 + pn; ++p) {
        float* d = acc + (p - p0) * NR;
        const int64_t col0 = p * NR, nr = std::min<int64_t>(NR, g.N - col0);
        if (nr == NR) {
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) {
            V v = V::load_aligned(d + j * L);
            if (g.alpha != 1.f) v *= V(g.alpha);
            ep(v, b, col0 + j * L).store_unaligned(C + col0 + j * L);
          }
        } else {
          if (g.alpha != 1.f)
            for (int64_t c = 0; c < nr; ++c) d[c] *= g.alpha;
          store_row_with_epilogue<Arch>(C + col0, d, nr, b, col0, ep);
        }
      }
    }
  });
}

// Batches that share B and whose A and C rows continue evenly from one batch to the next are one
// GEMM of batch x M rows (a [S, 1, K] x [K, N] MatMul is an S x N product, not S matrix-vector
// products that each stream all of B). Epilogue and prologue rows (b*M + m) are unchanged.
inline GemmArgs fold_batch_into_rows(GemmArgs g) {
  if (g.batch <= 1 || g.b_bs != 0 || g.c_bs == 0) return g;
  const int64_t a_rs = g.M == 1 ? g.a_bs : g.a_rs, ldc = g.M == 1 ? g.c_bs : g.ldc;
  if (g.a_bs != g.M * a_rs || g.c_bs != g.M * ldc) return g;
  g.a_rs = a_rs, g.ldc = ldc;
  g.M *= g.batch;
  g.batch = 1, g.a_bs = 0, g.c_bs = 0;
  return g;
}

}  // namespace detail

// Compiles the paths of class GC only (see GemmClass); returns false, computing nothing, for
// arguments outside it.
template <class Arch, GemmClass GC = GemmClass{}, class Ep = IdentityEpilogue, class ParFor = SerialFor,
          class ProA = IdentityPrologue, class ProB = IdentityPrologue>
bool gemm(const GemmArgs& g_in, const Ep& ep = {}, const ParFor& par = {}, const ProA& pro_a = {}, const ProB& pro_b = {}) {
  using T = GemmTile<Arch>;
  if (!detail::gemm_class_admits<GC>(g_in)) return false;
  // B's prologue sees (b*K + k, n): only an identity one allows folding batches into rows.
  const GemmArgs g = detail::is_identity_v<ProB> ? detail::fold_batch_into_rows(g_in) : g_in;
  if constexpr (detail::gemm_may_gemv<GC>())
    if (g.M == 1 && g.N > 0 && (g.b_cs == 1 || g.b_rs == 1)) return detail::gemv_row<Arch>(g, ep, par, pro_a, pro_b), true;
  detail::StridedASource<T::MR, ProA> apack{g.A, g.a_rs, g.a_cs, g.a_bs, g.M, pro_a};
  detail::StridedBSource<Arch, ProB> bsrc{g.B, g.b_rs, g.b_cs, g.b_bs, g.K, pro_b};
  auto cptr = [&](int64_t b) { return g.C + b * g.c_bs; };
  detail::gemm_driver<Arch, decltype(apack), decltype(bsrc), decltype(cptr), Ep, ParFor, GC>(g.batch, g.M, g.N, g.K, apack, bsrc, cptr,
                                                                                            g.ldc, g.alpha, ep, par);
  return true;
}

// As gemm() with B taken from a PackedB (g.B, b_rs, b_cs, b_bs ignored; pb.K() == g.K and
// pb.N() == g.N required); the same B for every batch.
template <class Arch, GemmClass GC = GemmClass{}, class Ep = IdentityEpilogue, class ParFor = SerialFor,
          class ProA = IdentityPrologue>
bool gemm_packed(const GemmArgs& g_in, const PackedB<Arch>& pb, const Ep& ep = {}, const ParFor& par = {}, const ProA& pro_a = {}) {
  using T = GemmTile<Arch>;
  if (!detail::gemm_class_admits<GC>(g_in)) return false;
  GemmArgs g0 = g_in;
  g0.b_bs = 0;  // one PackedB serves every batch
  const GemmArgs g = detail::fold_batch_into_rows(g0);
  if constexpr (detail::gemm_may_gemv<GC>())
    if (g.M == 1 && g.N > 0 && g.K > 0) return detail::gemv_packed<Arch>(g, pb, ep, par, pro_a), true;
  detail::StridedASource<T::MR, ProA> apack{g.A, g.a_rs, g.a_cs, g.a_bs, g.M, pro_a};
  auto cptr = [&](int64_t b) { return g.C + b * g.c_bs; };
  detail::gemm_driver<Arch, decltype(apack), PackedB<Arch>, decltype(cptr), Ep, ParFor, GC>(g.batch, g.M, g.N, g.K, apack, pb, cptr,
                                                                                            g.ldc, g.alpha, ep, par);
  return true;
}

}  // namespace nnfuse::mk
