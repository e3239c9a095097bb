#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <random>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"
#include "node_maker.h"

using namespace nnfuse;

namespace {

double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

using test::make_node;

std::vector<Tensor> run1(const Node& n, const std::vector<const Tensor*>& ins, int64_t opset = 14) {
  return run_node(n, opset, ins);
}

Tensor f32(Shape s, std::vector<float> v) { return Tensor::from_vector<float>(std::move(s), v); }

void require_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-5) {
  REQUIRE(got.numel() == int64_t(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << " of " << shape_str(got.shape()));
    REQUIRE(got.as_double(int64_t(i)) == Approx(want[i]).margin(tol));
  }
}

// ---- independent naive recurrent cells, written from the ONNX equations -------------------
struct RnnCase {
  int S = 4, B = 3, I = 4, H = 5, D = 2;
  std::vector<int> lens{4, 2, 3};
  std::vector<float> X, W, R, Bias, P, h0, c0;
};

float rnd(std::mt19937& g) { return std::uniform_real_distribution<float>(-1, 1)(g); }

RnnCase random_case(int gates, bool lstm, unsigned seed) {
  std::mt19937 g(seed);
  RnnCase c;
  auto fill = [&](std::vector<float>& v, size_t n) {
    v.resize(n);
    for (auto& x : v) x = rnd(g);
  };
  fill(c.X, size_t(c.S * c.B * c.I));
  fill(c.W, size_t(c.D * gates * c.H * c.I));
  fill(c.R, size_t(c.D * gates * c.H * c.H));
  fill(c.Bias, size_t(c.D * 2 * gates * c.H));
  fill(c.h0, size_t(c.D * c.B * c.H));
  if (lstm) {
    fill(c.P, size_t(c.D * 3 * c.H));
    fill(c.c0, size_t(c.D * c.B * c.H));
  }
  return c;
}

// Returns {Y [S,D,B,H], Y_h [D,B,H], Y_c [D,B,H]} for LSTM (gates i,o,f,c) or GRU (z,r,h).
std::vector<std::vector<double>> naive(const RnnCase& c, bool lstm, bool linear_before_reset) {
  const int S = c.S, B = c.B, I = c.I, H = c.H, D = c.D, G = lstm ? 4 : 3;
  std::vector<double> Y(size_t(S * D * B * H), 0.0), Yh(size_t(D * B * H)), Yc(size_t(D * B * H));
  auto Wat = [&](int d, int row, int i) { return double(c.W[size_t((d * G * H + row) * I + i)]); };
  auto Rat = [&](int d, int row, int m) { return double(c.R[size_t((d * G * H + row) * H + m)]); };
  auto Wb = [&](int d, int row) { return double(c.Bias[size_t(d * 2 * G * H + row)]); };
  auto Rb = [&](int d, int row) { return double(c.Bias[size_t(d * 2 * G * H + G * H + row)]); };
  for (int d = 0; d < D; ++d)
    for (int b = 0; b < B; ++b) {
      std::vector<double> h(static_cast<size_t>(H)), cell(static_cast<size_t>(H));
      for (int j = 0; j < H; ++j) {
        h[size_t(j)] = c.h0[size_t((d * B + b) * H + j)];
        if (lstm) cell[size_t(j)] = c.c0[size_t((d * B + b) * H + j)];
      }
      int len = c.lens[size_t(b)];
      for (int step = 0; step < len; ++step) {
        int t = d == 0 ? step : len - 1 - step;
        auto xw = [&](int row) {
          double s = Wb(d, row);
          for (int i = 0; i < I; ++i) s += Wat(d, row, i) * c.X[size_t((t * B + b) * I + i)];
          return s;
        };
        auto hr = [&](int row, const std::vector<double>& v) {
          double s = 0;
          for (int m = 0; m < H; ++m) s += Rat(d, row, m) * v[size_t(m)];
          return s;
        };
        std::vector<double> hn(static_cast<size_t>(H)), cn(static_cast<size_t>(H));
        for (int j = 0; j < H; ++j) {
          if (lstm) {
            const double pi = c.P[size_t(d * 3 * H + j)], po = c.P[size_t(d * 3 * H + H + j)], pf = c.P[size_t(d * 3 * H + 2 * H + j)];
            double it = sigm(xw(j) + hr(j, h) + Rb(d, j) + pi * cell[size_t(j)]);
            double ft = sigm(xw(2 * H + j) + hr(2 * H + j, h) + Rb(d, 2 * H + j) + pf * cell[size_t(j)]);
            double ct = std::tanh(xw(3 * H + j) + hr(3 * H + j, h) + Rb(d, 3 * H + j));
            cn[size_t(j)] = ft * cell[size_t(j)] + it * ct;
            double ot = sigm(xw(H + j) + hr(H + j, h) + Rb(d, H + j) + po * cn[size_t(j)]);
            hn[size_t(j)] = ot * std::tanh(cn[size_t(j)]);
          } else {
            double z = sigm(xw(j) + hr(j, h) + Rb(d, j));
            std::vector<double> rh(static_cast<size_t>(H));
            for (int m = 0; m < H; ++m) rh[size_t(m)] = sigm(xw(H + m) + hr(H + m, h) + Rb(d, H + m)) * h[size_t(m)];
            double r_j = sigm(xw(H + j) + hr(H + j, h) + Rb(d, H + j));
            double ht = linear_before_reset ? std::tanh(xw(2 * H + j) + r_j * (hr(2 * H + j, h) + Rb(d, 2 * H + j)))
                                            : std::tanh(xw(2 * H + j) + hr(2 * H + j, rh) + Rb(d, 2 * H + j));
            hn[size_t(j)] = (1 - z) * ht + z * h[size_t(j)];
          }
        }
        h = hn;
        if (lstm) cell = cn;
        for (int j = 0; j < H; ++j) Y[size_t(((t * D + d) * B + b) * H + j)] = h[size_t(j)];
      }
      for (int j = 0; j < H; ++j) {
        Yh[size_t((d * B + b) * H + j)] = h[size_t(j)];
        Yc[size_t((d * B + b) * H + j)] = cell[size_t(j)];
      }
    }
  return {Y, Yh, Yc};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST_CASE("LSTM: hand-checked hidden-1 cell", "[ops][control]") {
  // Only the cell gate sees X (weight 1); i, o, f are sigmoid(0) = 0.5 throughout.
  Tensor X = f32({2, 1, 1}, {1, 2});
  Tensor W = f32({1, 4, 1}, {0, 0, 0, 1});  // i, o, f, c
  Tensor R = f32({1, 4, 1}, {0, 0, 0, 0});
  Attributes a;
  a.set("hidden_size", A::i(1));
  auto outs = run1(make_node("LSTM", {"X", "W", "R"}, {"Y", "Y_h", "Y_c"}, a), {&X, &W, &R});
  double c1 = 0.5 * std::tanh(1.0), h1 = 0.5 * std::tanh(c1);
  double c2 = 0.5 * c1 + 0.5 * std::tanh(2.0), h2 = 0.5 * std::tanh(c2);
  REQUIRE(outs[0].shape() == Shape{2, 1, 1, 1});
  require_close(outs[0], {h1, h2});
  require_close(outs[1], {h2});
  require_close(outs[2], {c2});

  // initial_c = 1 and nothing else: the cell halves each step.
  Tensor Z = f32({2, 1, 1}, {0, 0});
  Tensor c0 = f32({1, 1, 1}, {1});
  outs = run1(make_node("LSTM", {"Z", "W", "R", "", "", "", "c0"}, {"Y", "Y_h", "Y_c"}, a), {&Z, &W, &R, nullptr, nullptr, nullptr, &c0});
  require_close(outs[0], {0.5 * std::tanh(0.5), 0.5 * std::tanh(0.25)});
  require_close(outs[2], {0.25});
}

TEST_CASE("LSTM: input_forget, clip and custom activations", "[ops][control]") {
  Tensor X = f32({1, 1, 1}, {3});
  Tensor W = f32({1, 4, 1}, {1, 0, 2, 1});
  Tensor R = f32({1, 4, 1}, {0, 0, 0, 0});
  Tensor c0 = f32({1, 1, 1}, {1});
  std::vector<const Tensor*> ins{&X, &W, &R, nullptr, nullptr, nullptr, &c0};
  {
    Attributes a;
    a.set("input_forget", A::i(1));
    auto outs = run1(make_node("LSTM", {"X", "W", "R", "", "", "", "c0"}, {"Y", "Y_h", "Y_c"}, a), ins);
    double i = sigm(3), f = 1 - i, c = f * 1 + i * std::tanh(3.0), h = 0.5 * std::tanh(c);
    require_close(outs[2], {c});
    require_close(outs[1], {h});
  }
  {
    Attributes a;
    a.set("clip", A::f(1.0f));  // every pre-activation clipped to [-1, 1]
    auto outs = run1(make_node("LSTM", {"X", "W", "R", "", "", "", "c0"}, {"Y", "Y_h", "Y_c"}, a), ins);
    double i = sigm(1), f = sigm(1), c = f * 1 + i * std::tanh(1.0), h = 0.5 * std::tanh(c);
    require_close(outs[2], {c});
    require_close(outs[1], {h});
  }
  {
    Attributes a;
    a.set("activations", Attribute::make_strings({"HardSigmoid", "Affine", "LeakyRelu"}));
    a.set("activation_alpha", A::fs({0.1f, 2.0f, 0.5f}));  // HardSigmoid, Affine, LeakyRelu
    a.set("activation_beta", A::fs({0.6f, -1.0f}));        // HardSigmoid, Affine
    auto outs = run1(make_node("LSTM", {"X", "W", "R", "", "", "", "c0"}, {"Y", "Y_h", "Y_c"}, a), ins);
    auto hs = [](double x) { return std::max(0.0, std::min(1.0, 0.1 * x + 0.6)); };
    double i = hs(3), f = hs(6), o = hs(0), g = 2.0 * 3 - 1.0;
    double c = f * 1 + i * g;
    double h = o * (c >= 0 ? c : 0.5 * c);
    require_close(outs[2], {c});
    require_close(outs[1], {h});
  }
}

TEST_CASE("GRU: hand-checked hidden-1 cell, both linear_before_reset", "[ops][control]") {
  Tensor X = f32({2, 1, 1}, {1, 2});
  Tensor W = f32({1, 3, 1}, {0, 0, 1});            // z, r, h
  Tensor R = f32({1, 3, 1}, {0, 0, 1});
  Tensor Bv = f32({1, 6}, {0, 0, 0, 0, 0, 1});     // Rbh = 1
  for (int lbr : {0, 1}) {
    Attributes a;
    a.set("linear_before_reset", A::i(lbr));
    auto outs = run1(make_node("GRU", {"X", "W", "R", "B"}, {"Y", "Y_h"}, a), {&X, &W, &R, &Bv});
    // z = r = 0.5 at every step.
    auto cand = [&](double x, double h) { return lbr ? std::tanh(x + 0.5 * (h + 1)) : std::tanh(x + 0.5 * h + 1); };
    double h1 = 0.5 * cand(1, 0) + 0.5 * 0;
    double h2 = 0.5 * cand(2, h1) + 0.5 * h1;
    INFO("linear_before_reset " << lbr);
    require_close(outs[0], {h1, h2});
    require_close(outs[1], {h2});
  }
}

TEST_CASE("RNN: forward, reverse, Relu", "[ops][control]") {
  Tensor X = f32({2, 1, 1}, {1, 2});
  Tensor W = f32({1, 1, 1}, {1});
  Tensor R = f32({1, 1, 1}, {0.5f});
  auto outs = run1(make_node("RNN", {"X", "W", "R"}, {"Y", "Y_h"}), {&X, &W, &R});
  double h1 = std::tanh(1.0), h2 = std::tanh(2 + 0.5 * h1);
  require_close(outs[0], {h1, h2});
  require_close(outs[1], {h2});

  Attributes rev;
  rev.set("direction", A::s("reverse"));
  outs = run1(make_node("RNN", {"X", "W", "R"}, {"Y", "Y_h"}, rev), {&X, &W, &R});
  double r1 = std::tanh(2.0), r0 = std::tanh(1 + 0.5 * r1);
  require_close(outs[0], {r0, r1});
  require_close(outs[1], {r0});

  Attributes relu;
  relu.set("activations", Attribute::make_strings({"Relu"}));
  Tensor Xn = f32({2, 1, 1}, {1, -3});
  outs = run1(make_node("RNN", {"X", "W", "R"}, {"Y", "Y_h"}, relu), {&Xn, &W, &R});
  require_close(outs[0], {1, 0});

  // Y_h only (Y absent) is allowed.
  outs = run1(make_node("RNN", {"X", "W", "R"}, {"", "Y_h"}), {&X, &W, &R});
  require_close(outs[1], {h2});
}

TEST_CASE("LSTM/GRU: random bidirectional with sequence_lens against a naive implementation", "[ops][control]") {
  for (bool lstm : {true, false})
    for (int lbr : {0, 1}) {
      if (lstm && lbr) continue;
      RnnCase c = random_case(lstm ? 4 : 3, lstm, lstm ? 7u : 11u + unsigned(lbr));
      const int G = lstm ? 4 : 3;
      Tensor X = f32({c.S, c.B, c.I}, c.X);
      Tensor W = f32({c.D, G * c.H, c.I}, c.W);
      Tensor R = f32({c.D, G * c.H, c.H}, c.R);
      Tensor Bv = f32({c.D, 2 * G * c.H}, c.Bias);
      Tensor L = Tensor::from_vector<int32_t>({c.B}, {c.lens[0], c.lens[1], c.lens[2]});
      Tensor h0 = f32({c.D, c.B, c.H}, c.h0);
      Attributes a;
      a.set("direction", A::s("bidirectional"));
      a.set("hidden_size", A::i(c.H));
      if (!lstm) a.set("linear_before_reset", A::i(lbr));
      std::vector<Tensor> outs;
      if (lstm) {
        Tensor c0 = f32({c.D, c.B, c.H}, c.c0);
        Tensor P = f32({c.D, 3 * c.H}, c.P);
        outs = run1(make_node("LSTM", {"X", "W", "R", "B", "L", "h0", "c0", "P"}, {"Y", "Y_h", "Y_c"}, a),
                    {&X, &W, &R, &Bv, &L, &h0, &c0, &P});
      } else {
        outs = run1(make_node("GRU", {"X", "W", "R", "B", "L", "h0"}, {"Y", "Y_h"}, a), {&X, &W, &R, &Bv, &L, &h0});
      }
      auto want = naive(c, lstm, lbr != 0);
      INFO((lstm ? "LSTM" : "GRU") << " lbr " << lbr);
      REQUIRE(outs[0].shape() == Shape{c.S, c.D, c.B, c.H});
      require_close(outs[0], want[0], 1e-5);
      require_close(outs[1], want[1], 1e-5);
      if (lstm) require_close(outs[2], want[2], 1e-5);

      // layout = 1 (opset 14): batch first everywhere, same numbers.
      Attributes a1 = a;
      a1.set("layout", A::i(1));
      auto to_bf = [](const Tensor& t) {  // [A, B, C] -> [B, A, C]
        Tensor o(t.dtype(), {t.dim(1), t.dim(0), t.dim(2)});
        for (int64_t i = 0; i < t.dim(0); ++i)
          for (int64_t j = 0; j < t.dim(1); ++j)
            for (int64_t k = 0; k < t.dim(2); ++k)
              o.data<float>()[(j * t.dim(0) + i) * t.dim(2) + k] = t.data<float>()[(i * t.dim(1) + j) * t.dim(2) + k];
        return o;
      };
      Tensor Xb = to_bf(X), h0b = to_bf(h0);
      std::vector<Tensor> outs1;
      if (lstm) {
        Tensor c0b = to_bf(f32({c.D, c.B, c.H}, c.c0));
        Tensor P = f32({c.D, 3 * c.H}, c.P);
        outs1 = run1(make_node("LSTM", {"X", "W", "R", "B", "L", "h0", "c0", "P"}, {"Y", "Y_h", "Y_c"}, a1),
                     {&Xb, &W, &R, &Bv, &L, &h0b, &c0b, &P});
      } else {
        outs1 = run1(make_node("GRU", {"X", "W", "R", "B", "L", "h0"}, {"Y", "Y_h"}, a1), {&Xb, &W, &R, &Bv, &L, &h0b});
      }
      REQUIRE(outs1[0].shape() == Shape{c.B, c.S, c.D, c.H});
      REQUIRE(outs1[1].shape() == Shape{c.B, c.D, c.H});
      for (int t = 0; t < c.S; ++t)
        for (int d = 0; d < c.D; ++d)
          for (int b = 0; b < c.B; ++b)
            for (int j = 0; j < c.H; ++j)
              REQUIRE(outs1[0].data<float>()[((b * c.S + t) * c.D + d) * c.H + j] ==
                      Approx(want[0][size_t(((t * c.D + d) * c.B + b) * c.H + j)]).margin(1e-5));
    }
}

TEST_CASE("LSTM: shape inference with symbolic seq and batch", "[ops][control]") {
  GraphBuilder gb("lstm_shapes", 14);
  auto x = gb.input("x", DType::Float32, {Dim::sym("seq"), Dim::sym("batch"), 3});
  auto w = gb.weight("w", {2, 16, 3});
  auto r = gb.weight("r", {2, 16, 4});
  Attributes a;
  a.set("direction", A::s("bidirectional"));
  auto outs = gb.op_n("LSTM", {x, w, r}, 3, a);
  for (auto& o : outs) gb.output(o);
  Model m = gb.finish();
  const Graph& g = m.graph;
  REQUIRE(g.type(outs[0]) == TensorType(DType::Float32, {Dim::sym("seq"), 2, Dim::sym("batch"), 4}));
  REQUIRE(g.type(outs[1]) == TensorType(DType::Float32, {2, Dim::sym("batch"), 4}));
  REQUIRE(g.type(outs[2]) == TensorType(DType::Float32, {2, Dim::sym("batch"), 4}));
  NodeId id = g.producer(outs[0]).value();
  REQUIRE(node_mapping_type(g, id) == MappingType::ManyToMany);

  // W's gate dimension must agree with the hidden size.
  GraphBuilder bad("lstm_bad", 14);
  auto xb = bad.input("x", DType::Float32, {5, 1, 3});
  auto wb = bad.weight("w", {1, 12, 3});
  auto rb = bad.weight("r", {1, 16, 4});
  bad.output(bad.op_n("LSTM", {xb, wb, rb}, 2)[0]);
  REQUIRE_THROWS_AS(bad.finish(), Error);
}

TEST_CASE("LSTM: FLOP count", "[ops][control]") {
  GraphBuilder gb("lstm_flops", 14);
  auto x = gb.input("x", DType::Float32, {32, 1, 8});
  auto w = gb.weight("w", {1, 64, 8});
  auto r = gb.weight("r", {1, 64, 16});
  auto y = gb.op_n("LSTM", {x, w, r}, 1)[0];
  gb.output(y);
  Model m = gb.finish();
  NodeId id = m.graph.producer(y).value();
  REQUIRE(node_flops(m.graph, id) == Approx(2.0 * 32 * 1 * 4 * 16 * (8 + 16)));
}

TEST_CASE("LSTM: hidden 1024, seq 32 runs in reasonable time", "[ops][control]") {
  const int64_t S = 32, I = 1024, H = 1024;
  Tensor X(DType::Float32, {S, 1, I}), W(DType::Float32, {1, 4 * H, I}), R(DType::Float32, {1, 4 * H, H});
  std::mt19937 g(3);
  for (Tensor* t : {&X, &W, &R})
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = rnd(g) * 0.03f;
  auto start = std::chrono::steady_clock::now();
  auto outs = run1(make_node("LSTM", {"X", "W", "R"}, {"Y", "Y_h", "Y_c"}), {&X, &W, &R});
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  WARN("LSTM 32x1024x1024 layer: " << ms << " ms");
  REQUIRE(outs[0].shape() == Shape{S, 1, 1, H});
  // One layer is 2 * 32 * 4 * 1024 * 2048 = 0.54 GFLOP; a naive triple loop takes seconds.
  REQUIRE(ms < 3000);
}

// ---------------------------------------------------------------------------------------------
TEST_CASE("If: selects each branch", "[ops][control]") {
  // Branch bodies output an outer-scope value directly: no other op is needed.
  auto branch = [](const std::string& name, const std::string& outer) {
    auto b = std::make_shared<Graph>();
    b->name = name;
    b->is_subgraph = true;
    b->declare_value(outer, TensorType(DType::Float32, {2}));
    b->add_output(outer);
    return b;
  };
  GraphBuilder gb("if_test", 17);
  auto cond = gb.input("cond", DType::Bool, {});
  auto a = gb.input("a", DType::Float32, {2});
  auto b = gb.input("b", DType::Float32, {2});
  Attributes at;
  at.set("then_branch", Attribute::make_graph(branch("then", a)));
  at.set("else_branch", Attribute::make_graph(branch("else", b)));
  auto y = gb.op("If", {cond}, at);
  gb.output(y);
  Model m = gb.finish();
  REQUIRE(m.graph.type(y) == TensorType(DType::Float32, {2}));
  TensorMap feeds{{"a", f32({2}, {1, 2})}, {"b", f32({2}, {3, 4})}};
  feeds["cond"] = Tensor::scalar<bool>(true);
  require_close(run_reference(m.graph, feeds).at(y), {1, 2});
  feeds["cond"] = Tensor::scalar<bool>(false);
  require_close(run_reference(m.graph, feeds).at(y), {3, 4});
}

TEST_CASE("If: branches with different shapes merge to unknown dims", "[ops][control]") {
  auto branch = [](const std::string& outer, std::vector<Dim> dims) {
    auto b = std::make_shared<Graph>();
    b->is_subgraph = true;
    b->declare_value(outer, TensorType(DType::Float32, dims));
    b->add_output(outer);
    return b;
  };
  GraphBuilder gb("if_merge", 17);
  auto cond = gb.input("cond", DType::Bool, {});
  auto a = gb.input("a", DType::Float32, {2, 3});
  auto b = gb.input("b", DType::Float32, {2, 5});
  Attributes at;
  at.set("then_branch", Attribute::make_graph(branch(a, {2, 3})));
  at.set("else_branch", Attribute::make_graph(branch(b, {2, 5})));
  auto y = gb.op("If", {cond}, at);
  gb.output(y);
  Model m = gb.finish();
  const TensorType& t = m.graph.type(y);
  REQUIRE(t.rank() == 2);
  REQUIRE(t.dims[0] == Dim(2));
  REQUIRE(!t.dims[1].known());
}

TEST_CASE("Loop: running sum with a scan output", "[ops][control]") {
  // body(i, cond, sum) -> (cond, sum + x[i-th step value], sum + ...): carried sum, scan of sums.
  auto body = std::make_shared<Graph>();
  body->name = "loop_body";
  body->is_subgraph = true;
  body->add_input("i", TensorType(DType::Int64, {}));
  body->add_input("cond_in", TensorType(DType::Bool, {}));
  body->add_input("sum_in", TensorType(DType::Float32, {2}));
  body->declare_value("step", TensorType(DType::Float32, {2}));  // outer-scope value
  body->add_node("Add", {"sum_in", "step"}, {"sum_out"});
  body->add_node("Identity", {"sum_out"}, {"scan_out"});
  body->set_outputs({"cond_in", "sum_out", "scan_out"});

  GraphBuilder gb("loop_test", 17);
  auto step = gb.input("step", DType::Float32, {2});
  auto m_trip = gb.constant("M", Tensor::scalar<int64_t>(3));
  auto init = gb.constant("init", f32({2}, {10, 20}));
  Attributes at;
  at.set("body", Attribute::make_graph(body));
  auto outs = gb.op_n("Loop", {m_trip, "", init}, 2, at);
  REQUIRE(step == "step");
  gb.output(outs[0]);
  gb.output(outs[1]);
  Model m = gb.finish();
  REQUIRE(m.graph.type(outs[0]) == TensorType(DType::Float32, {2}));
  REQUIRE(m.graph.type(outs[1]) == TensorType(DType::Float32, {3, 2}));
  auto res = run_reference(m.graph, {{"step", f32({2}, {1, 2})}});
  require_close(res.at(outs[0]), {13, 26});
  require_close(res.at(outs[1]), {11, 22, 12, 24, 13, 26});
}

TEST_CASE("Loop: stops when the body's cond goes false", "[ops][control]") {
  // cond_out = i < 1 (with Less): iterations 0 and 1 run (cond is checked before each one).
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->add_input("i", TensorType(DType::Int64, {}));
  body->add_input("cond_in", TensorType(DType::Bool, {}));
  body->add_input("acc_in", TensorType(DType::Int64, {}));
  body->set_initializer("one", Tensor::scalar<int64_t>(1));
  body->add_node("Less", {"i", "one"}, {"cond_out"});
  body->add_node("Add", {"acc_in", "i"}, {"acc_out"});
  body->set_outputs({"cond_out", "acc_out"});
  GraphBuilder gb("loop_cond", 17);
  auto m_trip = gb.constant("M", Tensor::scalar<int64_t>(10));
  auto c0 = gb.constant("c0", Tensor::scalar<bool>(true));
  auto acc = gb.input("acc", DType::Int64, {});
  Attributes at;
  at.set("body", Attribute::make_graph(body));
  auto y = gb.op("Loop", {m_trip, c0, acc}, at);
  gb.output(y);
  Model m = gb.finish();
  auto res = run_reference(m.graph, {{"acc", Tensor::scalar<int64_t>(100)}});
  REQUIRE(res.at(y).as_int(0) == 100 + 0 + 1);
}

TEST_CASE("Scan: sums rows, forward and reverse scan output", "[ops][control]") {
  // state s, scan input row r: s' = s + r, scan output s'.
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->add_input("s_in", TensorType(DType::Float32, {2}));
  body->add_input("row", TensorType(DType::Float32, {2}));
  body->add_node("Add", {"s_in", "row"}, {"s_out"});
  body->add_node("Identity", {"s_out"}, {"y"});
  body->set_outputs({"s_out", "y"});
  for (int reverse_out : {0, 1}) {
    GraphBuilder gb("scan_test", 17);
    auto init = gb.input("init", DType::Float32, {2});
    auto x = gb.input("x", DType::Float32, {3, 2});
    Attributes at;
    at.set("body", Attribute::make_graph(body));
    at.set("num_scan_inputs", A::i(1));
    at.set("scan_output_directions", A::is({reverse_out}));
    auto outs = gb.op_n("Scan", {init, x}, 2, at);
    gb.output(outs[0]);
    gb.output(outs[1]);
    Model m = gb.finish();
    REQUIRE(m.graph.type(outs[1]) == TensorType(DType::Float32, {3, 2}));
    auto res = run_reference(m.graph, {{"init", f32({2}, {0, 0})}, {"x", f32({3, 2}, {1, 2, 3, 4, 5, 6})}});
    require_close(res.at(outs[0]), {9, 12});
    if (!reverse_out) require_close(res.at(outs[1]), {1, 2, 4, 6, 9, 12});
    else require_close(res.at(outs[1]), {9, 12, 4, 6, 1, 2});
  }
}

TEST_CASE("Scan: scanning along axis 1", "[ops][control]") {
  // Sums columns: x [2, 3] scanned on axis 1 gives 3 slices of shape [2].
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->add_input("s_in", TensorType(DType::Float32, {2}));
  body->add_input("col", TensorType(DType::Float32, {2}));
  body->add_node("Add", {"s_in", "col"}, {"s_out"});
  body->add_node("Identity", {"col"}, {"y"});
  body->set_outputs({"s_out", "y"});
  GraphBuilder gb("scan_axis", 17);
  auto init = gb.input("init", DType::Float32, {2});
  auto x = gb.input("x", DType::Float32, {2, 3});
  Attributes at;
  at.set("body", Attribute::make_graph(body));
  at.set("num_scan_inputs", A::i(1));
  at.set("scan_input_axes", A::is({1}));
  at.set("scan_output_axes", A::is({1}));
  auto outs = gb.op_n("Scan", {init, x}, 2, at);
  gb.output(outs[0]);
  gb.output(outs[1]);
  Model m = gb.finish();
  REQUIRE(m.graph.type(outs[1]) == TensorType(DType::Float32, {2, 3}));
  auto res = run_reference(m.graph, {{"init", f32({2}, {0, 0})}, {"x", f32({2, 3}, {1, 2, 3, 4, 5, 6})}});
  require_close(res.at(outs[0]), {6, 15});
  require_close(res.at(outs[1]), {1, 2, 3, 4, 5, 6});  // columns put back where they came from
}

TEST_CASE("Scan (opset 8): batch axis, sequence_lens and a reverse direction", "[ops][control]") {
  // Per batch entry: state s, scan element x: s' = s + x, scan output s'. Entry 1 stops after 2 steps.
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->add_input("s_in", TensorType(DType::Float32, {1}));
  body->add_input("x", TensorType(DType::Float32, {1}));
  body->add_node("Add", {"s_in", "x"}, {"s_out"});
  body->add_node("Identity", {"s_out"}, {"y"});
  body->set_outputs({"s_out", "y"});
  GraphBuilder gb("scan8", 8);
  auto lens = gb.input("lens", DType::Int64, {2});
  auto init = gb.input("init", DType::Float32, {2, 1});
  auto x = gb.input("x", DType::Float32, {2, 3, 1});
  Attributes at;
  at.set("body", Attribute::make_graph(body));
  at.set("num_scan_inputs", A::i(1));
  at.set("directions", A::is({1}));
  auto outs = gb.op_n("Scan", {lens, init, x}, 2, at);
  gb.output(outs[0]);
  gb.output(outs[1]);
  Model m = gb.finish();
  REQUIRE(m.graph.type(outs[1]) == TensorType(DType::Float32, {2, 3, 1}));
  auto res = run_reference(m.graph, {{"lens", Tensor::from_vector<int64_t>({2}, {3, 2})},
                                     {"init", f32({2, 1}, {0, 100})},
                                     {"x", f32({2, 3, 1}, {1, 2, 3, 10, 20, 30})}});
  // Entry 0 reads 3, 2, 1; entry 1 reads its first two elements reversed: 20, 10 (30 is padding).
  require_close(res.at(outs[0]), {6, 130});
  require_close(res.at(outs[1]), {3, 5, 6, 120, 130, 0});
}

TEST_CASE("recurrent and control ops report malformed nodes clearly", "[ops][control]") {
  Tensor X = f32({2, 1, 1}, {1, 2});
  Tensor W = f32({1, 4, 1}, {0, 0, 0, 1});
  Tensor R = f32({1, 4, 1}, {0, 0, 0, 0});
  Attributes bad_dir;
  bad_dir.set("direction", A::s("sideways"));
  REQUIRE_THROWS_WITH(run1(make_node("LSTM", {"X", "W", "R"}, {"Y"}, bad_dir), {&X, &W, &R}), Catch::Contains("sideways"));
  Attributes bad_act;
  bad_act.set("activations", Attribute::make_strings({"Sigmoid", "Gelu", "Tanh"}));
  REQUIRE_THROWS_WITH(run1(make_node("LSTM", {"X", "W", "R"}, {"Y"}, bad_act), {&X, &W, &R}), Catch::Contains("Gelu"));
  Tensor Rbad = f32({1, 4, 2}, {0, 0, 0, 0, 0, 0, 0, 0});
  REQUIRE_THROWS_WITH(run1(make_node("LSTM", {"X", "W", "R"}, {"Y"}), {&X, &W, &Rbad}), Catch::Contains("R must be"));
  Tensor L = Tensor::from_vector<int32_t>({1}, {5});
  REQUIRE_THROWS_WITH(run1(make_node("LSTM", {"X", "W", "R", "", "L"}, {"Y"}), {&X, &W, &R, nullptr, &L}),
                      Catch::Contains("sequence_lens[0] = 5"));
}

TEST_CASE("Loop: carried values are typed as their initial values when the body says less", "[ops][control]") {
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->add_input("i", TensorType(DType::Int64, {}));
  body->add_input("cond_in", TensorType(DType::Bool, {}));
  body->add_input("v_in", TensorType::unknown_shape(DType::Float32));  // as exporters often leave it
  body->add_node("Identity", {"v_in"}, {"v_out"});
  body->set_outputs({"cond_in", "v_out"});
  GraphBuilder gb("loop_types", 17);
  auto m_trip = gb.constant("M", Tensor::scalar<int64_t>(2));
  auto v = gb.input("v", DType::Float32, {Dim::sym("n"), 4});
  Attributes at;
  at.set("body", Attribute::make_graph(body));
  auto y = gb.op("Loop", {m_trip, "", v}, at);
  gb.output(y);
  Model m = gb.finish();
  REQUIRE(m.graph.type(y) == TensorType(DType::Float32, {Dim::sym("n"), 4}));
}

TEST_CASE("LSTM: float64 and float16 inputs give the float32 numbers", "[ops][control]") {
  // The hand-checked hidden-1 cell of the first test, in the other float types.
  double c1 = 0.5 * std::tanh(1.0), h1 = 0.5 * std::tanh(c1);
  double c2 = 0.5 * c1 + 0.5 * std::tanh(2.0), h2 = 0.5 * std::tanh(c2);
  Node n = make_node("LSTM", {"X", "W", "R"}, {"Y", "Y_h", "Y_c"});
  {
    Tensor X = Tensor::from_vector<double>({2, 1, 1}, {1, 2});
    Tensor W = Tensor::from_vector<double>({1, 4, 1}, {0, 0, 0, 1});
    Tensor R = Tensor::from_vector<double>({1, 4, 1}, {0, 0, 0, 0});
    auto outs = run1(n, {&X, &W, &R});
    REQUIRE(outs[0].dtype() == DType::Float64);
    require_close(outs[0], {h1, h2}, 1e-12);
    require_close(outs[2], {c2}, 1e-12);
  }
  {
    Tensor X = f32({2, 1, 1}, {1, 2}).cast(DType::Float16);
    Tensor W = f32({1, 4, 1}, {0, 0, 0, 1}).cast(DType::Float16);
    Tensor R = f32({1, 4, 1}, {0, 0, 0, 0}).cast(DType::Float16);
    auto outs = run1(n, {&X, &W, &R});
    REQUIRE(outs[0].dtype() == DType::Float16);
    require_close(outs[0], {h1, h2}, 2e-3);
  }
}
