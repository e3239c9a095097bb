// GEMM microkernel (kernels/microkernels/gemm.h) against the reference interpreter's MatMul/Gemm.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <tuple>

#include "test_microkernels_util.h"

using namespace mktest;

TEST_CASE("gemm matches MatMul over odd sizes, transposes, epilogue and threads", "[microkernels][gemm]") {
  const std::vector<int64_t> mn_sizes{1, 7, 17, 129};
  const std::vector<int64_t> k_sizes{1, 17, 300};
  int variant = 0;
  for (int64_t M : mn_sizes)
    for (int64_t N : mn_sizes)
      for (int64_t K : k_sizes) {
        ++variant;
        const bool ta = variant % 4 == 1 || variant % 4 == 3, tb = variant % 4 >= 2;
        const bool with_ep = variant % 3 != 0;
        INFO("M=" << M << " N=" << N << " K=" << K << " trans_a=" << ta << " trans_b=" << tb << " epilogue=" << with_ep);
        Tensor A = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 100 + variant);
        Tensor B = random_tensor(tb ? Shape{N, K} : Shape{K, N}, 200 + variant);
        Tensor bias = random_tensor({N}, 300 + variant);
        Tensor want = reference({{"a", A}, {"b", B}, {"bias", bias}}, [&](nnfuse::GraphBuilder& gb, auto& in) {
          std::string a = ta ? gb.op("Transpose", {in[0]}) : in[0];
          std::string b = tb ? gb.op("Transpose", {in[1]}) : in[1];
          std::string y = gb.op("MatMul", {a, b});
          return with_ep ? gb.op("Relu", {gb.op("Add", {y, in[2]})}) : y;
        });
        auto got = run_serial_and_parallel(size_t(M * N), [&](float* C, auto par) {
          auto g = mk::GemmArgs::matmul(M, N, K, A.data<float>(), ta, B.data<float>(), tb, C);
          if (with_ep)
            mk::gemm<Arch>(g, ColBiasRelu{bias.data<float>()}, par);
          else
            mk::gemm<Arch>(g, mk::IdentityEpilogue{}, par);
        });
        require_close(got.data(), want);
      }
}

TEST_CASE("gemm alpha and strided (ldc, lda) views match Gemm", "[microkernels][gemm]") {
  const int64_t M = 19, N = 33, K = 45, lda = 50, ldb = 40, ldc = 37;
  Tensor A = random_tensor({M, lda}, 1), B = random_tensor({K, ldb}, 2), C0 = random_tensor({N}, 3);
  // The oracle sees the dense sub-matrices.
  Tensor Ad(DType::Float32, {M, K}), Bd(DType::Float32, {K, N});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) Ad.data<float>()[m * K + k] = A.data<float>()[m * lda + k];
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) Bd.data<float>()[k * N + n] = B.data<float>()[k * ldb + n];
  Tensor want = reference({{"a", Ad}, {"b", Bd}, {"c", C0}}, [&](nnfuse::GraphBuilder& gb, auto& in) {
    return gb.op("Gemm", {in[0], in[1], in[2]}, nnfuse::GraphBuilder::attrs({{"alpha", nnfuse::A::f(0.75f)}, {"beta", nnfuse::A::f(1.f)}}));
  });
  std::vector<float> C(size_t(M * ldc), 123.f);
  mk::GemmArgs g;
  g.M = M, g.N = N, g.K = K, g.A = A.data<float>(), g.a_rs = lda, g.a_cs = 1, g.B = B.data<float>(), g.b_rs = ldb,
  g.b_cs = 1, g.C = C.data(), g.ldc = ldc, g.alpha = 0.75f;
  const float* c0 = C0.data<float>();
  mk::gemm<Arch>(g, [&](auto v, int64_t, int64_t c) {
    if constexpr (std::is_same_v<decltype(v), float>)
      return v + c0[c];
    else
      return v + V::load_unaligned(c0 + c);
  });
  std::vector<float> dense(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) dense[size_t(m * N + n)] = C[size_t(m * ldc + n)];
  require_close(dense.data(), want);
  // Columns past N in each row are untouched.
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = N; n < ldc; ++n) REQUIRE(C[size_t(m * ldc + n)] == 123.f);
}

TEST_CASE("batched gemm matches batched MatMul, with and without a broadcast operand", "[microkernels][gemm]") {
  for (bool broadcast_b : {false, true}) {
    const int64_t Bn = 5, M = 17, N = 23, K = 129;
    INFO("broadcast_b=" << broadcast_b);
    std::atomic<bool> row_out_of_range{false};
    Tensor A = random_tensor({Bn, M, K}, 11);
    Tensor B = random_tensor(broadcast_b ? Shape{K, N} : Shape{Bn, K, N}, 12);
    Tensor want = reference({{"a", A}, {"b", B}}, [&](nnfuse::GraphBuilder& gb, auto& in) {
      return gb.op("Relu", {gb.op("MatMul", {in[0], in[1]})});
    });
    auto got = run_serial_and_parallel(size_t(Bn * M * N), [&](float* C, auto par) {
      auto g = mk::GemmArgs::matmul(M, N, K, A.data<float>(), false, B.data<float>(), false, C);
      g.batch = Bn, g.a_bs = M * K, g.b_bs = broadcast_b ? 0 : K * N, g.c_bs = M * N;
      // Rows of the epilogue run over batch*M: check that the row index is global.
      mk::gemm<Arch>(g, [&](auto v, int64_t r, int64_t) {
        if (r >= Bn * M) row_out_of_range = true;
        return relu(v);
      }, par);
    });
    REQUIRE_FALSE(row_out_of_range);
    require_close(got.data(), want);
  }
}

TEST_CASE("gemm_packed: panels of 1 to 7 valid rows (the small-row kernels) and batches folded into rows", "[microkernels][gemm]") {
  // M = 1..4 run the 1-, 2- and 4-row kernels alone; 10 and 12 end with a 2- and a 4-row panel
  // after a full one; K spans two K blocks, N a partial last panel.
  const int64_t N = 45, K = 300;
  Tensor B = random_tensor({K, N}, 31), bias = random_tensor({N}, 32);
  mk::PackedB<Arch> pb;
  pb.pack(K, N, B.data<float>(), N, 1);
  for (int64_t M : {1, 2, 3, 4, 5, 7, 10, 12}) {
    INFO("M=" << M);
    Tensor A = random_tensor({M, K}, 33 + uint64_t(M));
    Tensor want = reference({{"a", A}, {"b", B}, {"bias", bias}}, [&](nnfuse::GraphBuilder& gb, auto& in) {
      return gb.op("Relu", {gb.op("Add", {gb.op("MatMul", {in[0], in[1]}), in[2]})});
    });
    auto got = run_serial_and_parallel(size_t(M * N), [&](float* C, auto par) {
      auto g = mk::GemmArgs::matmul(M, N, K, A.data<float>(), false, nullptr, false, C);
      mk::gemm_packed<Arch>(g, pb, ColBiasRelu{bias.data<float>()}, par);
    });
    require_close(got.data(), want);
  }
  // A [S, M, K] MatMul with the packed [K, N]: batches folded into S*M rows (one pass over B),
  // and a batch stride with a gap between batches (not foldable); the epilogue's rows stay b*M + m.
  for (auto [S_, M_, gap] : {std::tuple<int64_t, int64_t, int64_t>{6, 1, 0}, {4, 3, 0}, {3, 2, 5}, {3, 1, 7}}) {
    const int64_t S = S_, M = M_;  // lambdas below capture them (clang 14 cannot capture bindings)
    INFO("S=" << S << " M=" << M << " gap=" << gap);
    const int64_t a_bs = M * K + gap;
    Tensor Ag = random_tensor({S * a_bs}, 40 + uint64_t(S));
    Tensor A(DType::Float32, {S, M, K});
    for (int64_t b = 0; b < S; ++b)
      std::copy(Ag.data<float>() + b * a_bs, Ag.data<float>() + b * a_bs + M * K, A.data<float>() + b * M * K);
    Tensor want = reference({{"a", A}, {"b", B}}, [&](nnfuse::GraphBuilder& gb, auto& in) { return gb.op("MatMul", {in[0], in[1]}); });
    std::vector<std::atomic<int>> seen(size_t(S * M));
    std::atomic<bool> bad_row{false};
    auto got = run_serial_and_parallel(size_t(S * M * N), [&](float* C, auto par) {
      auto g = mk::GemmArgs::matmul(M, N, K, Ag.data<float>(), false, nullptr, false, C);
      g.batch = S, g.a_bs = a_bs, g.c_bs = M * N;
      mk::gemm_packed<Arch>(g, pb, [&](auto v, int64_t r, int64_t c) {
        if (r < 0 || r >= S * M) bad_row = true;
        else if (c == 0) seen[size_t(r)].store(1);
        return v;
      }, par);
    });
    REQUIRE_FALSE(bad_row);
    for (auto& x : seen) REQUIRE(x.load() == 1);
    require_close(got.data(), want);
  }
}

TEST_CASE("gemm_packed: a row gives the same bits alone (the matrix-vector path) as among others", "[microkernels][gemm]") {
  // A recurrent step runs M = the batch rows still running: a row's result must not depend on how
  // many others run beside it. N spans whole task groups and a partial last panel, K three blocks.
  const int64_t M = 9, N = 300, K = 700;
  Tensor A = random_tensor({M, K}, 51), B = random_tensor({K, N}, 52), bias = random_tensor({N}, 53);
  mk::PackedB<Arch> pb;
  pb.pack(K, N, B.data<float>(), N, 1);
  std::vector<float> all(size_t(M * N)), one(static_cast<size_t>(N));
  auto g = mk::GemmArgs::matmul(M, N, K, A.data<float>(), false, nullptr, false, all.data());
  mk::gemm_packed<Arch>(g, pb, ColBiasRelu{bias.data<float>()}, TwoThreadFor{});
  for (int64_t m : {int64_t(0), int64_t(4), M - 1}) {
    INFO("row " << m);
    auto g1 = mk::GemmArgs::matmul(1, N, K, A.data<float>() + m * K, false, nullptr, false, one.data());
    mk::gemm_packed<Arch>(g1, pb, ColBiasRelu{bias.data<float>()}, TwoThreadFor{});
    for (int64_t n = 0; n < N; ++n) REQUIRE(one[size_t(n)] == all[size_t(m * N + n)]);
  }
  // With a prologue on A, a strided A row (a_cs > 1) and alpha.
  Tensor At = random_tensor({K, 3}, 54);
  Tensor want = reference({{"a", At}, {"b", B}}, [&](nnfuse::GraphBuilder& gb, auto& in) {
    auto col = gb.op("Slice", {in[0], gb.ints("s", {1}), gb.ints("e", {2}), gb.ints("ax", {1})});
    auto y = gb.op("MatMul", {gb.op("Transpose", {gb.op("Relu", {col})}), in[1]});
    return gb.op("Mul", {y, gb.scalar("alpha", 0.5f)});
  });
  auto g2 = mk::GemmArgs::matmul(1, N, K, At.data<float>() + 1, false, nullptr, false, one.data());
  g2.a_cs = 3, g2.alpha = 0.5f;
  mk::gemm_packed<Arch>(g2, pb, mk::IdentityEpilogue{}, TwoThreadFor{}, ReluPrologue{});
  require_close(one.data(), want);
}

TEST_CASE("gemm applies prologues to A and B, and gemm_packed matches gemm", "[microkernels][gemm]") {
  const int64_t M = 31, N = 70, K = 600;  // K spans three K blocks
  Tensor A = random_tensor({M, K}, 21), B = random_tensor({K, N}, 22);
  Tensor want = reference({{"a", A}, {"b", B}}, [&](nnfuse::GraphBuilder& gb, auto& in) {
    return gb.op("MatMul", {gb.op("Relu", {in[0]}), gb.op("Relu", {in[1]})});
  });
  std::vector<float> C(size_t(M * N));
  auto g = mk::GemmArgs::matmul(M, N, K, A.data<float>(), false, B.data<float>(), false, C.data());
  mk::gemm<Arch>(g, mk::IdentityEpilogue{}, mk::SerialFor{}, ReluPrologue{}, ReluPrologue{});
  require_close(C.data(), want);

  mk::PackedB<Arch> pb;
  pb.pack(K, N, B.data<float>(), N, 1, ReluPrologue{});
  std::vector<float> C2(size_t(M * N));
  g.C = C2.data();
  mk::gemm_packed<Arch>(g, pb, mk::IdentityEpilogue{}, TwoThreadFor{}, ReluPrologue{});
  require_identical(C, C2);
}

namespace {
// Serial, but reports `t` threads and records the task counts it is given.
struct CountingFor {
  int t;
  std::vector<int64_t>* seen;
  int threads() const { return t; }
  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    seen->push_back(n);
    if (n > 0) fn(int64_t(0), n);
  }
};
}  // namespace

TEST_CASE("gemm balances its column tiles over the threads, bitwise equal to one thread", "[microkernels][gemm]") {
  // ViT's QKV shape (197 x 2304) gives 9 column tiles by size: on 2 threads the split takes 12.
  // The task counts a 2- and a 3-thread par-for see are multiples of their threads, and every
  // element equals the one-thread result bit for bit (K = 300: two K blocks).
  const int64_t M = 197, N = 2304, K = 300;
  Tensor A = random_tensor({M, K}, 31), B = random_tensor({K, N}, 32);
  mk::PackedB<Arch> pb;
  pb.pack(K, N, B.data<float>(), N, 1);
  std::vector<float> C1(size_t(M * N)), C2(C1.size()), C3(C1.size());
  auto g = mk::GemmArgs::matmul(M, N, K, A.data<float>(), false, nullptr, false, C1.data());
  mk::gemm_packed<Arch>(g, pb, mk::IdentityEpilogue{}, mk::SerialFor{});
  for (int t : {2, 3}) {
    INFO(t << " threads");
    std::vector<int64_t> seen;
    g.C = (t == 2 ? C2 : C3).data();
    mk::gemm_packed<Arch>(g, pb, mk::IdentityEpilogue{}, CountingFor{t, &seen});
    REQUIRE(seen.size() == 1);
    CHECK(seen[0] % t == 0);
    CHECK(seen[0] >= 9);
    require_identical(C1, t == 2 ? C2 : C3);
  }
  g.C = C2.data();
  mk::gemm_packed<Arch>(g, pb, mk::IdentityEpilogue{}, TwoThreadFor{});
  require_identical(C1, C2);
  // And the values themselves, on a sample of elements (a double-precision dot product).
  const float* a = A.data<float>();
  const float* b = B.data<float>();
  for (int64_t i = 0; i < M * N; i += 997) {
    const int64_t m = i / N, n = i % N;
    double want = 0;
    for (int64_t k = 0; k < K; ++k) want += double(a[m * K + k]) * double(b[k * N + n]);
    CHECK(std::fabs(double(C1[size_t(i)]) - want) <= 1e-4 * (1 + std::fabs(want)));
  }
}

TEST_CASE("gemm runs products too small to hand off on the calling thread, with the same bits", "[microkernels][gemm]") {
  // A step of a small GRU (2 rows x 72 x 24; and its batch-1 form, the matrix-vector path) never
  // reaches the par-for; 2 x 768 x 768 does. Results equal a serial run's either way.
  for (auto [M, N, K, handed_off] : {std::tuple<int64_t, int64_t, int64_t, bool>{2, 72, 24, false}, {1, 72, 24, false}, {2, 768, 768, true}}) {
    INFO(M << " x " << N << " x " << K);
    Tensor A = random_tensor({M, K}, 41), B = random_tensor({K, N}, 42);
    mk::PackedB<Arch> pb;
    pb.pack(K, N, B.data<float>(), N, 1);
    std::vector<float> C1(size_t(M * N)), C2(C1.size()), C3(C1.size());
    auto g = mk::GemmArgs::matmul(M, N, K, A.data<float>(), false, B.data<float>(), false, C1.data());
    mk::gemm_packed<Arch>(g, pb, mk::IdentityEpilogue{}, mk::SerialFor{});
    std::vector<int64_t> seen;
    g.C = C2.data();
    mk::gemm_packed<Arch>(g, pb, mk::IdentityEpilogue{}, CountingFor{2, &seen});
    CHECK(seen.empty() == !handed_off);
    require_identical(C1, C2);
    seen.clear();
    g.C = C3.data();
    mk::gemm<Arch>(g, mk::IdentityEpilogue{}, CountingFor{2, &seen});  // B unpacked
    CHECK(seen.empty() == !handed_off);
    require_identical(C1, C3);
  }
}

TEST_CASE("gemm applies an AfterStoresEpilogue to each element once, with the same bits as in registers", "[microkernels][gemm]") {
  // Whole tiles store their sums first and then run the epilogue from memory; edge tiles go
  // through the row buffer as before. Several K blocks (K = 1000), alpha, odd M and N, and a
  // counting epilogue: every element sees it exactly once, at its own (row, col).
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{37, 53, 1000}, {12, 32, 100}, {1, 40, 30}}) {
    INFO(M << " x " << N << " x " << K);
    Tensor A = random_tensor({M, K}, 51), B = random_tensor({K, N}, 52), bias = random_tensor({N}, 53);
    std::vector<float> C1(size_t(M * N)), C2(C1.size());
    auto g = mk::GemmArgs::matmul(M, N, K, A.data<float>(), false, B.data<float>(), false, C1.data());
    g.alpha = 0.5f;
    const ColBiasRelu ep{bias.data<float>()};
    mk::gemm<Arch>(g, ep, mk::SerialFor{});
    std::vector<int> calls(C1.size(), 0);
    const int64_t cols = N;  // a structured binding cannot be captured before C++20 (clang 14)
    auto counting = [&](auto v, int64_t r, int64_t c) {
      const int64_t lanes = std::is_same_v<decltype(v), float> ? 1 : int64_t(V::size);
      for (int64_t l = 0; l < lanes && c + l < cols; ++l) ++calls[size_t(r * cols + c + l)];
      return ep(v, r, c);
    };
    static_assert(mk::runs_after_stores_v<mk::AfterStoresEpilogue<decltype(counting)>>);
    static_assert(!mk::runs_after_stores_v<ColBiasRelu>);
    g.C = C2.data();
    mk::gemm<Arch>(g, mk::AfterStoresEpilogue<decltype(counting)>{counting}, mk::SerialFor{});
    require_identical(C1, C2);
    for (int n : calls) REQUIRE(n == 1);
  }
}

TEST_CASE("gemm with K = 0 writes the epilogue of zero", "[microkernels][gemm]") {
  std::vector<float> C(6, 5.f);
  auto g = mk::GemmArgs::matmul(2, 3, 0, nullptr, false, nullptr, false, C.data());
  mk::gemm<Arch>(g, [](auto v, int64_t, int64_t) { return v + 1.f; });
  for (float c : C) REQUIRE(c == 1.f);
}

TEST_CASE("gemm single-thread GFLOP/s at 512^3 (printed, not asserted)", "[microkernels][gemm][perf]") {
  const int64_t n = 512;
  Tensor A = random_tensor({n, n}, 1), B = random_tensor({n, n}, 2);
  std::vector<float> C(size_t(n * n));
  auto g = mk::GemmArgs::matmul(n, n, n, A.data<float>(), false, B.data<float>(), false, C.data());
  mk::gemm<Arch>(g);
  double best = 1e30;
  for (int rep = 0; rep < 10; ++rep) {
    const double t0 = thread_seconds();
    mk::gemm<Arch>(g);
    best = std::min(best, thread_seconds() - t0);
  }
  std::printf("[microkernels] gemm 512x512x512 (%s, 1 thread): %.1f GFLOP/s (best of 10: %.3f ms thread CPU time)\n", Arch::name(),
              2.0 * n * n * n / best * 1e-9, best * 1e3);
  // A spot check so the timed code is also a correct one.
  double s = 0;
  for (int64_t k = 0; k < n; ++k) s += double(A.data<float>()[k]) * B.data<float>()[k * n + 5];
  REQUIRE(std::fabs(C[5] - s) < 1e-3);
}
