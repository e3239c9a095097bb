// Pooling, reductions, Softmax/LogSoftmax, LayerNorm and elementwise math microkernels against
// the reference interpreter (and the math functions against double-precision std:: functions).
#include <limits>

#include "kernels/stage_timing.h"
#include "test_microkernels_util.h"

using namespace mktest;

namespace {

struct PoolCase {
  int64_t N, C, H, W, KH, KW, sh, sw, pt, pl, pb, pr, dh, dw;
  bool ceil_mode, include_pad;
};

template <mk::PoolKind Kind>
void check_pool(const PoolCase& c, uint64_t seed, bool with_ep, bool with_pro) {
  constexpr bool is_max = Kind == mk::PoolKind::Max;
  INFO((is_max ? "MaxPool" : "AveragePool") << " N" << c.N << " C" << c.C << " H" << c.H << " W" << c.W << " k" << c.KH
                                            << "x" << c.KW << " s" << c.sh << "," << c.sw << " p" << c.pt << "," << c.pl
                                            << "," << c.pb << "," << c.pr << " d" << c.dh << "," << c.dw << " ceil"
                                            << c.ceil_mode << " incl" << c.include_pad << " ep" << with_ep << " pro"
                                            << with_pro);
  Tensor X = random_tensor({c.N, c.C, c.H, c.W}, seed);
  Tensor bias = random_tensor({c.C}, seed + 1);
  Tensor want = reference({{"x", X}, {"b", bias}}, [&](GraphBuilder& gb, auto& in) {
    std::string x = with_pro ? gb.op("Relu", {in[0]}) : in[0];
    auto attrs = GraphBuilder::attrs({{"kernel_shape", A::is({c.KH, c.KW})},
                                      {"strides", A::is({c.sh, c.sw})},
                                      {"pads", A::is({c.pt, c.pl, c.pb, c.pr})},
                                      {"ceil_mode", A::i(c.ceil_mode)}});
    if (is_max) attrs.set("dilations", A::is({c.dh, c.dw}));
    else attrs.set("count_include_pad", A::i(c.include_pad));
    std::string y = gb.op(is_max ? "MaxPool" : "AveragePool", {x}, attrs);
    if (!with_ep) return y;
    std::string b4 = gb.op("Reshape", {in[1], gb.ints("shape", {1, c.C, 1, 1})});
    return gb.op("Relu", {gb.op("Add", {y, b4})});
  }, 19);
  mk::Pool2dArgs a;
  a.N = c.N, a.C = c.C, a.H = c.H, a.W = c.W, a.OH = want.dim(2), a.OW = want.dim(3), a.KH = c.KH, a.KW = c.KW;
  a.stride_h = c.sh, a.stride_w = c.sw, a.pad_top = c.pt, a.pad_left = c.pl, a.pad_bottom = c.pb, a.pad_right = c.pr;
  a.dil_h = is_max ? c.dh : 1, a.dil_w = is_max ? c.dw : 1, a.count_include_pad = c.include_pad;
  a.set_contiguous();
  a.x = X.data<float>();
  auto got = run_serial_and_parallel(size_t(want.numel()), [&](float* y, auto par) {
    a.y = y;
    if (with_ep && with_pro)
      mk::pool2d<Arch, Kind>(a, RowBiasRelu{bias.data<float>(), c.C}, par, ReluPrologue{});
    else if (with_ep)
      mk::pool2d<Arch, Kind>(a, RowBiasRelu{bias.data<float>(), c.C}, par);
    else
      mk::pool2d<Arch, Kind>(a, mk::IdentityEpilogue{}, par);
  });
  require_close(got.data(), want);
}

const std::vector<PoolCase> kPoolCases = {
    // N C  H   W  KH KW sh sw pt pl pb pr dh dw ceil incl
    {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, false, false},
    {1, 3, 7, 7, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, false, false},
    {2, 5, 17, 17, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, true, false},
    {1, 4, 17, 19, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, true, true},
    {1, 2, 129, 33, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, false, false},
    {1, 3, 13, 40, 3, 5, 1, 1, 1, 2, 1, 2, 1, 1, false, true},   // stride 1: vector path
    {1, 3, 13, 40, 3, 5, 1, 1, 0, 2, 2, 0, 1, 1, true, true},    // asymmetric pads
    {1, 2, 16, 16, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, false, false},  // dilation (max only)
    {1, 6, 9, 11, 7, 7, 3, 3, 3, 3, 3, 3, 1, 1, true, true},     // windows mostly in the padding
};

}  // namespace

TEST_CASE("pool2d max and average match MaxPool/AveragePool", "[microkernels][pool]") {
  uint64_t seed = 500;
  for (const auto& c : kPoolCases)
    for (int v = 0; v < 3; ++v) {
      check_pool<mk::PoolKind::Max>(c, seed += 3, v >= 1, v == 2);
      if (c.dh == 1 && c.dw == 1) check_pool<mk::PoolKind::Avg>(c, seed += 3, v >= 1, v == 2);
    }
}

TEST_CASE("global_pool2d matches GlobalAveragePool/GlobalMaxPool", "[microkernels][pool]") {
  for (const auto& d : std::vector<std::array<int64_t, 4>>{{1, 1, 1, 1}, {2, 7, 7, 7}, {1, 17, 3, 43}, {1, 3, 129, 1}}) {
    const int64_t N = d[0], C = d[1], H = d[2], W = d[3];  // captured below: no structured binding (clang 14)
    INFO("N" << N << " C" << C << " H" << H << " W" << W);
    Tensor X = random_tensor({N, C, H, W}, uint64_t(N * 1000 + C * 10 + H));
    for (bool is_max : {false, true}) {
      Tensor want = reference({{"x", X}}, [&](GraphBuilder& gb, auto& in) {
        return gb.op(is_max ? "GlobalMaxPool" : "GlobalAveragePool", {in[0]});
      });
      auto got = run_serial_and_parallel(size_t(N * C), [&](float* y, auto par) {
        if (is_max)
          mk::global_pool2d<Arch, mk::PoolKind::Max>(N * C, H * W, X.data<float>(), H * W, y, mk::IdentityEpilogue{}, par);
        else
          mk::global_pool2d<Arch, mk::PoolKind::Avg>(N * C, H * W, X.data<float>(), H * W, y, mk::IdentityEpilogue{}, par);
      });
      require_close(got.data(), want);
    }
  }
}

namespace {

template <mk::ReduceKind K>
void check_reduce(const char* op, const Shape& shape, int64_t axis, uint64_t seed, bool with_pro) {
  INFO(op << " " << nnfuse::shape_str(shape) << " axis " << axis << " prologue " << with_pro);
  Tensor X = random_tensor(shape, seed);
  Tensor want = reference({{"x", X}}, [&](GraphBuilder& gb, auto& in) {
    std::string x = with_pro ? gb.op("Relu", {in[0]}) : in[0];
    return gb.op(op, {x, gb.ints("axes", {axis})}, GraphBuilder::attrs({{"keepdims", A::i(0)}}));
  }, 18);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[size_t(d)];
  for (size_t d = size_t(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  auto a = mk::ReduceArgs::contiguous(outer, shape[size_t(axis)], inner, X.data<float>(), nullptr);
  // Epilogue: y * 2 + 1, checked against the oracle afterwards.
  auto ep = [](auto v, int64_t, int64_t) { return v * 2.f + 1.f; };
  auto got = run_serial_and_parallel(size_t(outer * inner), [&](float* y, auto par) {
    a.y = y;
    if (with_pro)
      mk::reduce<Arch, K>(a, ep, par, ReluPrologue{});
    else
      mk::reduce<Arch, K>(a, ep, par);
  });
  for (auto& g : got) g = (g - 1.f) / 2.f;
  require_close(got.data(), want);
}

}  // namespace

TEST_CASE("reduce over the last and inner axes matches ReduceSum/Mean/Max/Min/SumSquare", "[microkernels][reduce]") {
  const std::vector<std::pair<Shape, int64_t>> cases = {
      {{1}, 0}, {{7}, 0}, {{3, 129}, 1}, {{5, 17}, 0}, {{2, 7, 17}, 1}, {{4, 300, 3}, 1}, {{2, 33, 129}, 1},
      {{1, 1000}, 1}, {{3, 5, 1}, 1}, {{129, 70}, 0}};
  uint64_t seed = 900;
  for (const auto& [shape, axis] : cases)
    for (bool pro : {false, true}) {
      check_reduce<mk::ReduceKind::Sum>("ReduceSum", shape, axis, ++seed, pro);
      check_reduce<mk::ReduceKind::Mean>("ReduceMean", shape, axis, ++seed, pro);
      check_reduce<mk::ReduceKind::Max>("ReduceMax", shape, axis, ++seed, pro);
      check_reduce<mk::ReduceKind::Min>("ReduceMin", shape, axis, ++seed, pro);
      check_reduce<mk::ReduceKind::SumSquare>("ReduceSumSquare", shape, axis, ++seed, pro);
    }
}

TEST_CASE("reduce reads a strided reduced axis", "[microkernels][reduce]") {
  // Rows of a [5, 12] matrix, reducing every other column pair: x_sr = 2 over R = 6.
  Tensor X = random_tensor({5, 12}, 77);
  std::vector<float> y(5);
  mk::ReduceArgs a;
  a.outer = 5, a.R = 6, a.inner = 1, a.x = X.data<float>(), a.x_so = 12, a.x_sr = 2, a.y = y.data(), a.y_so = 1;
  mk::reduce<Arch, mk::ReduceKind::Max>(a);
  for (int64_t o = 0; o < 5; ++o) {
    float m = -1e30f;
    for (int64_t r = 0; r < 6; ++r) m = std::max(m, X.data<float>()[o * 12 + r * 2]);
    REQUIRE(y[size_t(o)] == m);
  }
}

TEST_CASE("softmax and log-softmax over the last axis match Softmax/LogSoftmax", "[microkernels][softmax]") {
  for (auto [rows_, len_] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 7}, {17, 17}, {5, 129}, {2, 1000}}) {
    const int64_t rows = rows_, len = len_;  // captured below (clang 14 cannot capture bindings)
    for (bool log : {false, true})
      for (bool pro : {false, true}) {
        INFO("rows " << rows << " len " << len << " log " << log << " prologue " << pro);
        Tensor X = random_tensor({rows, len}, uint64_t(rows * 31 + len), -8.f, 8.f);
        Tensor want = reference({{"x", X}}, [&](GraphBuilder& gb, auto& in) {
          std::string x = pro ? gb.op("Relu", {in[0]}) : in[0];
          return gb.op(log ? "LogSoftmax" : "Softmax", {x}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
        });
        auto got = run_serial_and_parallel(size_t(rows * len), [&](float* y, auto par) {
          auto id = mk::IdentityEpilogue{};
          if (log && pro) mk::softmax<Arch, true>(rows, len, X.data<float>(), len, y, len, id, par, ReluPrologue{});
          else if (log) mk::softmax<Arch, true>(rows, len, X.data<float>(), len, y, len, id, par);
          else if (pro) mk::softmax<Arch, false>(rows, len, X.data<float>(), len, y, len, id, par, ReluPrologue{});
          else mk::softmax<Arch, false>(rows, len, X.data<float>(), len, y, len, id, par);
        });
        require_close(got.data(), want);
      }
  }
}

TEST_CASE("softmax runs in place", "[microkernels][softmax]") {
  Tensor X = random_tensor({4, 37}, 3);
  Tensor want = reference({{"x", X}}, [&](GraphBuilder& gb, auto& in) { return gb.op("Softmax", {in[0]}); });
  std::vector<float> buf(X.data<float>(), X.data<float>() + X.numel());
  mk::softmax<Arch>(4, 37, buf.data(), 37, buf.data(), 37);
  require_close(buf.data(), want);
}

TEST_CASE("layernorm over the last axis matches LayerNormalization (with a residual-add prologue)",
          "[microkernels][layernorm]") {
  for (auto [rows_, len_] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 7}, {17, 17}, {5, 129}, {2, 768}}) {
    const int64_t rows = rows_, len = len_;  // captured below (clang 14 cannot capture bindings)
    for (bool pro : {false, true}) {
      INFO("rows " << rows << " len " << len << " residual prologue " << pro);
      Tensor X = random_tensor({rows, len}, uint64_t(rows + len), -3.f, 5.f);
      Tensor Res = random_tensor({rows, len}, uint64_t(rows + len + 1));
      Tensor gamma = random_tensor({len}, 8), beta = random_tensor({len}, 9);
      Tensor want = reference({{"x", X}, {"r", Res}, {"g", gamma}, {"b", beta}}, [&](GraphBuilder& gb, auto& in) {
        std::string x = pro ? gb.op("Add", {in[0], in[1]}) : in[0];
        std::string y = gb.op("LayerNormalization", {x, in[2], in[3]},
                              GraphBuilder::attrs({{"axis", A::i(-1)}, {"epsilon", A::f(1e-5f)}}));
        return gb.op("Relu", {y});
      });
      const float* res = Res.data<float>();
      // Prologue: x + residual[row, col]; epilogue: relu.
      auto add_res = [&](auto v, int64_t r, int64_t c) {
        if constexpr (std::is_same_v<decltype(v), float>)
          return v + res[r * len + c];
        else
          return v + V::load_unaligned(res + r * len + c);
      };
      auto ep = [](auto v, int64_t, int64_t) { return relu(v); };
      auto got = run_serial_and_parallel(size_t(rows * len), [&](float* y, auto par) {
        if (pro)
          mk::layernorm<Arch>(rows, len, X.data<float>(), len, gamma.data<float>(), beta.data<float>(), 1e-5f, y, len, ep,
                              par, add_res);
        else
          mk::layernorm<Arch>(rows, len, X.data<float>(), len, gamma.data<float>(), beta.data<float>(), 1e-5f, y, len, ep,
                              par);
      });
      require_close(got.data(), want);
    }
  }
}

TEST_CASE("layernorm without gamma/beta normalises to mean 0, variance 1", "[microkernels][layernorm]") {
  const int64_t len = 50;
  Tensor X = random_tensor({1, len}, 4, 2.f, 6.f);
  std::vector<float> y(len);
  mk::layernorm<Arch>(1, len, X.data<float>(), len, nullptr, nullptr, 0.f, y.data(), len);
  double s = 0, q = 0;
  for (float v : y) s += v, q += double(v) * v;
  REQUIRE(std::fabs(s / len) < 1e-5);
  REQUIRE(std::fabs(q / len - 1.0) < 1e-4);
}

namespace {

// Worst error of f (batch and scalar overloads) vs the double reference over [lo, hi], relative
// to max(|ref|, floor).
template <class F, class G>
double worst_error(F&& f, G&& ref, double lo, double hi, double floor_abs) {
  constexpr int64_t L = int64_t(V::size);
  const int64_t n = 200000;
  double worst = 0;
  alignas(64) float in[L], out[L];
  for (int64_t i = 0; i < n; i += L) {
    for (int64_t j = 0; j < L; ++j) in[j] = float(lo + (hi - lo) * double(i + j) / double(n - 1));
    f(V::load_aligned(in)).store_aligned(out);
    for (int64_t j = 0; j < L; ++j) {
      const double r = ref(double(in[j]));
      const double e = std::fabs(double(out[j]) - r) / std::max(std::fabs(r), floor_abs);
      const double es = std::fabs(double(f(in[j])) - r) / std::max(std::fabs(r), floor_abs);
      worst = std::max({worst, e, es});
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("vectorised exp/log/tanh/erf/sigmoid/gelu are within 1e-5 relative of std::", "[microkernels][math]") {
  struct Case {
    const char* name;
    double worst;
  };
  std::vector<Case> cases = {
      {"exp", worst_error([](auto v) { return mk::vexp(v); }, [](double x) { return std::exp(x); }, -87, 88, 1e-30)},
      {"log", worst_error([](auto v) { return mk::vlog(v); }, [](double x) { return std::log(x); }, 1e-30, 1e6, 1e-7)},
      {"log near 1", worst_error([](auto v) { return mk::vlog(v); }, [](double x) { return std::log(x); }, 0.5, 2, 1e-7)},
      {"tanh", worst_error([](auto v) { return mk::vtanh(v); }, [](double x) { return std::tanh(x); }, -20, 20, 1e-7)},
      {"erf", worst_error([](auto v) { return mk::verf(v); }, [](double x) { return std::erf(x); }, -6, 6, 1e-7)},
      {"sigmoid", worst_error([](auto v) { return mk::vsigmoid(v); }, [](double x) { return 1 / (1 + std::exp(-x)); },
                              -80, 80, 1e-30)},
      {"gelu", worst_error([](auto v) { return mk::vgelu_erf(v); },
                           [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }, -10, 10, 1e-30)},
      {"erfc", worst_error([](auto v) { return mk::verfc(v); }, [](double x) { return std::erfc(x); }, -3, 3, 1e-7)},
  };
  for (auto& c : cases) {
    std::printf("[microkernels] %s worst relative error %.2e\n", c.name, c.worst);
    INFO(c.name);
    REQUIRE(c.worst < 1e-5);
  }
}

TEST_CASE("vexp, vsigmoid, verf and vtanh at the edges: NaN, infinities, overflow and underflow", "[microkernels][math]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  auto lane0 = [](V v) {
    alignas(64) float o[V::size];
    v.store_aligned(o);
    return o[0];
  };
  CHECK(std::isnan(lane0(mk::vexp(V(nan)))));
  CHECK(lane0(mk::vexp(V(inf))) == inf);
  CHECK(lane0(mk::vexp(V(-inf))) == 0.f);
  CHECK(lane0(mk::vexp(V(88.8f))) == inf);  // past FLT_MAX = e^88.72
  CHECK(lane0(mk::vexp(V(88.7f))) == Approx(std::exp(88.7f)).epsilon(1e-6));
  CHECK(lane0(mk::vexp(V(-87.f))) == Approx(std::exp(-87.f)).epsilon(1e-6));  // near FLT_MIN
  CHECK(lane0(mk::vexp(V(-120.f))) == 0.f);
  CHECK(lane0(mk::vexp(V(0.f))) == 1.f);
  CHECK(std::isnan(lane0(mk::vsigmoid(V(nan)))));
  CHECK(lane0(mk::vsigmoid(V(inf))) == 1.f);
  CHECK(lane0(mk::vsigmoid(V(-inf))) == 0.f);
  CHECK(lane0(mk::vsigmoid(V(-100.f))) == Approx(0.0).margin(1e-38));
  CHECK(lane0(mk::vsigmoid(V(88.f))) == 1.f);   // past the clamp: exactly 1
  CHECK(lane0(mk::vsigmoid(V(17.f))) == Approx(1.0 / (1.0 + std::exp(-17.0))).epsilon(1e-7));
  CHECK(lane0(mk::vsigmoid(V(-87.f))) == Approx(1.0 / (1.0 + std::exp(87.0))).epsilon(1e-6));
  // Around n = round(-v log2 e) = 128, where the exponent factor saturates to infinity: just
  // above, the (denormal) value; from there on, exactly 0.
  CHECK(lane0(mk::vsigmoid(V(-88.3f))) == Approx(1.0 / (1.0 + std::exp(88.3))).epsilon(1e-4));
  CHECK(lane0(mk::vsigmoid(V(-88.4f))) == 0.f);
  CHECK(lane0(mk::vsigmoid(V(-89.5f))) == 0.f);
  CHECK(!std::signbit(lane0(mk::vsigmoid(V(-1e30f)))));  // +0, not the sign bit an exponent of 256 would set
  CHECK(lane0(mk::vsigmoid(V(0.f))) == 0.5f);
  // verf: clamped at 3.92 where it rounds to 1, odd, NaN through, tiny values relative.
  CHECK(std::isnan(lane0(mk::verf(V(nan)))));
  CHECK(lane0(mk::verf(V(inf))) == 1.f);
  CHECK(lane0(mk::verf(V(-inf))) == -1.f);
  CHECK(lane0(mk::verf(V(4.f))) == 1.f);
  CHECK(lane0(mk::verf(V(-30.f))) == -1.f);
  CHECK(std::signbit(lane0(mk::verf(V(-0.f)))));
  CHECK(lane0(mk::verf(V(1e-30f))) == Approx(1.1283791670955126e-30).epsilon(1e-6));
  CHECK(lane0(mk::verf(V(-0.875f))) == Approx(std::erf(-0.875)).epsilon(3e-7));  // where the two forms meet
  CHECK(lane0(mk::verf(V(0.87499994f))) == Approx(std::erf(0.87499994)).epsilon(3e-7));
  // vtanh: clamped at 9 (1 from there on), odd, NaN through, tiny values relative, both forms
  // where they meet at 0.625.
  CHECK(std::isnan(lane0(mk::vtanh(V(nan)))));
  CHECK(lane0(mk::vtanh(V(inf))) == 1.f);
  CHECK(lane0(mk::vtanh(V(-inf))) == -1.f);
  CHECK(lane0(mk::vtanh(V(9.5f))) == 1.f);
  CHECK(lane0(mk::vtanh(V(-1e30f))) == -1.f);
  CHECK(std::signbit(lane0(mk::vtanh(V(-0.f)))));
  CHECK(lane0(mk::vtanh(V(1e-30f))) == Approx(1e-30).epsilon(1e-6));
  CHECK(lane0(mk::vtanh(V(-0.625f))) == Approx(std::tanh(-0.625)).epsilon(3e-7));
  CHECK(lane0(mk::vtanh(V(0.62499994f))) == Approx(std::tanh(0.62499994)).epsilon(3e-7));
  CHECK(lane0(mk::vtanh(V(8.f))) == Approx(std::tanh(8.0)).epsilon(1.2e-7));
}

TEST_CASE("unary_map applies a generic lambda to batches and the tail", "[microkernels][math]") {
  for (int64_t n : {0, 1, 7, 17, 129, 5000}) {
    Tensor X = random_tensor({std::max<int64_t>(n, 1)}, uint64_t(n + 1), -5.f, 5.f);
    std::vector<float> y(size_t(std::max<int64_t>(n, 1)), 0.f);
    auto f = [](auto v) { return mk::vsigmoid(v) * v; };  // SiLU
    mk::unary_map<Arch>(n, X.data<float>(), y.data(), f, TwoThreadFor{});
    for (int64_t i = 0; i < n; ++i) {
      const double x = X.data<float>()[i], want = x / (1 + std::exp(-x));
      REQUIRE(std::fabs(y[size_t(i)] - want) <= 1e-5 + 1e-5 * std::fabs(want));
    }
  }
}

// `nnfuse run --profile` rows: each stage's median over the runs, not one run's time.
TEST_CASE("profile timings are per-stage medians over the runs", "[profile]") {
  const std::vector<std::vector<double>> runs = {{5.0, 1.0, 9.0}, {1.0, 2.0, 3.0}, {3.0, 100.0, 6.0}};
  size_t r = 0;
  auto timed = [&](std::vector<double>* ms) { *ms = runs[r++]; };
  const auto med = nnfuse::median_stage_ms(3, timed);
  CHECK(r == 3);
  CHECK(med == std::vector<double>{3.0, 2.0, 6.0});
  r = 0;
  CHECK(nnfuse::median_stage_ms(2, timed) == std::vector<double>{3.0, 1.5, 6.0});  // even count: mean of the middle two
  r = 0;
  CHECK(nnfuse::median_stage_ms(0, timed) == runs[0]);  // at least one run
}
