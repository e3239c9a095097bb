// Convolution microkernels (kernels/microkernels/conv.h) against the reference interpreter's Conv.
#include <chrono>
#include <cstdio>

#include "test_microkernels_util.h"

using namespace mktest;

namespace {

struct ConvCase {
  int64_t N, C, H, W, K, KH, KW, sh, sw, pt, pl, pb, pr, dh, dw, group;
};

std::string describe(const ConvCase& c) {
  std::ostringstream os;
  os << "N" << c.N << " C" << c.C << " H" << c.H << " W" << c.W << " K" << c.K << " k" << c.KH << "x" << c.KW << " s"
     << c.sh << "," << c.sw << " p" << c.pt << "," << c.pl << "," << c.pb << "," << c.pr << " d" << c.dh << "," << c.dw
     << " g" << c.group;
  return os.str();
}

enum class Algo { Dispatch, Gemm, Direct, Depthwise };

void check_conv(const ConvCase& c, uint64_t seed, bool with_ep, bool with_pro, Algo algo) {
  INFO(describe(c) << " epilogue=" << with_ep << " prologue=" << with_pro << " algo=" << int(algo));
  Tensor X = random_tensor({c.N, c.C, c.H, c.W}, seed);
  Tensor Wt = random_tensor({c.K, c.C / c.group, c.KH, c.KW}, seed + 1);
  Tensor bias = random_tensor({c.K}, seed + 2);
  Tensor want = reference({{"x", X}, {"w", Wt}, {"b", bias}}, [&](GraphBuilder& gb, auto& in) {
    std::string x = with_pro ? gb.op("Relu", {in[0]}) : in[0];
    auto attrs = GraphBuilder::attrs({{"kernel_shape", A::is({c.KH, c.KW})},
                                      {"strides", A::is({c.sh, c.sw})},
                                      {"pads", A::is({c.pt, c.pl, c.pb, c.pr})},
                                      {"dilations", A::is({c.dh, c.dw})},
                                      {"group", A::i(c.group)}});
    std::string y = with_ep ? gb.op("Conv", {x, in[1], in[2]}, attrs) : gb.op("Conv", {x, in[1]}, attrs);
    return with_ep ? gb.op("Relu", {y}) : y;
  });
  mk::Conv2dArgs a;
  a.N = c.N, a.C = c.C, a.H = c.H, a.W = c.W, a.K = c.K, a.OH = want.dim(2), a.OW = want.dim(3);
  a.KH = c.KH, a.KW = c.KW, a.stride_h = c.sh, a.stride_w = c.sw, a.pad_top = c.pt, a.pad_left = c.pl;
  a.dil_h = c.dh, a.dil_w = c.dw, a.group = c.group;
  a.set_contiguous();
  a.x = X.data<float>(), a.w = Wt.data<float>();
  auto run = [&](float* y, auto par) {
    a.y = y;
    auto go = [&](const auto& ep) {
      auto pro_go = [&](const auto& pro) {
        switch (algo) {
          case Algo::Dispatch: mk::conv2d<Arch>(a, ep, par, pro); break;
          case Algo::Gemm: mk::conv2d_gemm<Arch>(a, ep, par, pro); break;
          case Algo::Direct: mk::conv2d_direct<Arch>(a, ep, par, pro); break;
          case Algo::Depthwise: mk::conv2d_depthwise<Arch>(a, ep, par, pro); break;
        }
      };
      if (with_pro) pro_go(ReluPrologue{}); else pro_go(mk::IdentityPrologue{});
    };
    if (with_ep) go(RowBiasRelu{bias.data<float>(), c.K}); else go(mk::IdentityEpilogue{});
  };
  std::vector<float> serial(size_t(want.numel()), -3.f), parallel(size_t(want.numel()), -5.f);
  run(serial.data(), mk::SerialFor{});
  run(parallel.data(), TwoThreadFor{});
  require_identical(serial, parallel);
  require_close(serial.data(), want);
}

const std::vector<ConvCase> kCases = {
    // N  C   H   W   K  KH KW sh sw pt pl pb pr dh dw g
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},
    {1, 3, 7, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 5, 17, 13, 17, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1},
    {1, 16, 9, 11, 33, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},      // pointwise GEMM path
    {1, 8, 10, 10, 8, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1},       // strided 1x1
    {1, 3, 29, 31, 17, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1, 1},      // stem-like 7x7/2
    {1, 6, 15, 16, 9, 3, 5, 1, 2, 2, 1, 0, 3, 2, 1, 3},       // asymmetric pads, dilation, groups
    {1, 12, 9, 9, 12, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 12},      // depthwise
    {2, 7, 17, 17, 14, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 7},      // depthwise stride 2, multiplier 2
    {1, 8, 12, 12, 8, 5, 5, 1, 1, 4, 4, 4, 4, 2, 2, 8},       // depthwise dilated
    {1, 32, 14, 14, 129, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},    // many output channels (M tail)
    {1, 20, 6, 40, 10, 2, 3, 3, 1, 0, 2, 1, 2, 1, 3, 2},      // kernel larger than stride, dil 3 wide
    {1, 4, 5, 5, 4, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1},         // tiny: direct via dispatch
};

}  // namespace

TEST_CASE("packed conv weights interleave a dense task's output blocks per channel and tap", "[microkernels][conv]") {
  // The NCHWc kernel reads the (up to 4, AVX2: 2) output blocks of its task for one input channel
  // and tap from one pointer: vector o of (channel ci, tap t) at ((ci * taps + t) * nb + o) * L in
  // the task's panel. K = 72 on 16 lanes is 5 blocks (the last half full): a run of 4 and a last
  // run of 1; on 8 lanes 9 blocks: 4 runs of 2 and one of 1.
  for (int64_t L : {int64_t(16), int64_t(8)}) {
    const int64_t K = 72, C = 5, KH = 3, KW = 2, taps = KH * KW, Kb = mk::nchwc_blocks(K, L);
    std::vector<float> w(size_t(K * C * taps));
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(i + 1);
    mk::PackedConvNchwc p;
    p.pack(w.data(), K, C, KH, KW, L);
    REQUIRE(int64_t(p.w.size()) == Kb * C * taps * L);
    const int64_t run = mk::conv_nchwc_task_blocks(L);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t ci = 0; ci < C; ++ci)
        for (int64_t t = 0; t < taps; ++t) {
          const int64_t kb = k / L, kb0 = kb / run * run, nb = std::min(run, Kb - kb0);
          const int64_t at = kb0 * C * taps * L + ((ci * taps + t) * nb + (kb - kb0)) * L + k % L;
          INFO("L " << L << " k " << k << " ci " << ci << " t " << t);
          CHECK(mk::ConvPackedLayout::dense(Kb, C, taps, L).offset(kb, ci, t) + k % L == at);
          CHECK(p.w[size_t(at)] == w[size_t((k * C + ci) * taps + t)]);
        }
    // Depthwise keeps one block per run: [Kb, KH, KW, L].
    mk::PackedConvNchwc d;
    d.pack(w.data(), K, 1, KH, KW, L, 1, true);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t t = 0; t < taps; ++t) CHECK(d.w[size_t(((k / L) * taps + t) * L + k % L)] == w[size_t(k * taps + t)]);
  }
}

TEST_CASE("packed conv weights start on a 64-byte boundary", "[microkernels][conv]") {
  // The kernels read packed weight panels as whole vectors; from std::vector's 16-byte alignment
  // each AVX-512 load straddled two cache lines (a ResNet-50 3x3 conv 10-13% slower). Sizes that
  // malloc serves from its small bins and from mmap both.
  for (int64_t K : {3, 64, 512}) {
    INFO("K " << K);
    const int64_t C = 64;
    std::vector<float> w(size_t(K * C * 9), 0.5f);
    mk::PackedConvNchwc dense;
    dense.pack(w.data(), K, C, 3, 3, 16);
    CHECK(reinterpret_cast<uintptr_t>(dense.w.data()) % 64 == 0);
    mk::PackedConvWinogradM<4> wino;
    wino.pack(w.data(), K, C, 16);
    CHECK(reinterpret_cast<uintptr_t>(wino.u.data()) % 64 == 0);
    std::vector<int32_t> mult(size_t(K), 127);
    mk::PackedConvInt8 q;
    q.pack(w.data(), K, C, 3, 3, 0.1f, 128, mult.data());
    CHECK(reinterpret_cast<uintptr_t>(q.w.data()) % 64 == 0);
    mk::PackedGemmInt8 g;
    g.pack(w.data(), C, K, K, 1, 0.1f, 128, mult.data());
    CHECK(reinterpret_cast<uintptr_t>(g.w.data()) % 64 == 0);
  }
}

TEST_CASE("conv2d dispatch matches Conv over shapes, pads, strides, dilations, groups", "[microkernels][conv]") {
  uint64_t seed = 1000;
  for (const auto& c : kCases)
    for (int v = 0; v < 3; ++v) check_conv(c, seed += 10, v >= 1, v == 2, Algo::Dispatch);
}

TEST_CASE("conv2d_gemm (implicit im2col) matches Conv, groups included", "[microkernels][conv]") {
  uint64_t seed = 2000;
  for (const auto& c : kCases)
    for (int v = 0; v < 2; ++v) check_conv(c, seed += 10, v == 1, v == 1, Algo::Gemm);
}

TEST_CASE("conv2d_direct matches Conv", "[microkernels][conv]") {
  uint64_t seed = 3000;
  for (const auto& c : kCases)
    for (int v = 0; v < 2; ++v) check_conv(c, seed += 10, v == 1, v == 1, Algo::Direct);
}

TEST_CASE("conv2d_depthwise matches Conv with group == C", "[microkernels][conv]") {
  uint64_t seed = 4000;
  for (const auto& c : kCases)
    if (c.group == c.C)
      for (int v = 0; v < 3; ++v) check_conv(c, seed += 10, v >= 1, v == 2, Algo::Depthwise);
}

TEST_CASE("conv2d writes into strided output planes", "[microkernels][conv]") {
  // Output channel planes padded to a row stride of OW + 3 (the direct path handles any strides).
  const int64_t C = 4, H = 9, W = 8, K = 6;
  Tensor X = random_tensor({1, C, H, W}, 5), Wt = random_tensor({K, C, 3, 3}, 6);
  Tensor want = reference({{"x", X}, {"w", Wt}}, [&](GraphBuilder& gb, auto& in) {
    return gb.op("Conv", {in[0], in[1]}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  });
  mk::Conv2dArgs a;
  a.C = C, a.H = H, a.W = W, a.K = K, a.OH = H, a.OW = W, a.KH = a.KW = 3, a.pad_top = a.pad_left = 1;
  a.set_contiguous();
  a.y_sh = W + 3, a.y_sc = H * (W + 3), a.y_sn = K * a.y_sc;
  std::vector<float> y(size_t(K * a.y_sc), 42.f);
  a.x = X.data<float>(), a.w = Wt.data<float>(), a.y = y.data();
  mk::conv2d<Arch>(a);
  std::vector<float> dense;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W + 3; ++w) {
        const float v = y[size_t(k * a.y_sc + h * a.y_sh + w)];
        if (w < W) dense.push_back(v); else REQUIRE(v == 42.f);
      }
  require_close(dense.data(), want);
}

TEST_CASE("conv2d single-thread GFLOP/s, ResNet-50 3x3 layer 64x56x56 (printed)", "[microkernels][conv][perf]") {
  const int64_t C = 64, H = 56, W = 56, K = 64;
  Tensor X = random_tensor({1, C, H, W}, 1), Wt = random_tensor({K, C, 3, 3}, 2), bias = random_tensor({K}, 3);
  std::vector<float> y(size_t(K * H * W));
  mk::Conv2dArgs a;
  a.C = C, a.H = H, a.W = W, a.K = K, a.OH = H, a.OW = W, a.KH = a.KW = 3, a.pad_top = a.pad_left = 1;
  a.set_contiguous();
  a.x = X.data<float>(), a.w = Wt.data<float>(), a.y = y.data();
  const double flops = 2.0 * K * H * W * C * 9;
  auto time_it = [&](auto&& fn) {
    fn();
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const double t0 = thread_seconds();
      fn();
      best = std::min(best, thread_seconds() - t0);
    }
    return best;
  };
  double t_gemm = time_it([&] { mk::conv2d_gemm<Arch>(a, RowBiasRelu{bias.data<float>(), K}); });
  double t_direct = time_it([&] { mk::conv2d_direct<Arch>(a, RowBiasRelu{bias.data<float>(), K}); });
  std::printf("[microkernels] conv 3x3 64->64 56x56 (%s, 1 thread, bias+relu epilogue): implicit-GEMM %.1f GFLOP/s "
              "(%.3f ms), direct %.1f GFLOP/s (%.3f ms)\n",
              Arch::name(), flops / t_gemm * 1e-9, t_gemm * 1e3, flops / t_direct * 1e-9, t_direct * 1e3);
  // Depthwise 3x3 on MobileNet-sized planes, for the record.
  mk::Conv2dArgs d = a;
  d.C = d.K = d.group = 144;
  d.set_contiguous();
  Tensor Xd = random_tensor({1, 144, H, W}, 4), Wd = random_tensor({144, 1, 3, 3}, 5);
  std::vector<float> yd(size_t(144 * H * W));
  d.x = Xd.data<float>(), d.w = Wd.data<float>(), d.y = yd.data();
  double t_dw = time_it([&] { mk::conv2d_depthwise<Arch>(d); });
  std::printf("[microkernels] depthwise 3x3 144ch 56x56 (%s, 1 thread): %.1f GFLOP/s (%.3f ms)\n", Arch::name(),
              2.0 * 144 * H * W * 9 / t_dw * 1e-9, t_dw * 1e3);
  REQUIRE(std::isfinite(y[0]));
}
