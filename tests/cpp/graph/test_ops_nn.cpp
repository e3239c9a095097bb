// Tests of the nn op family: hand-computed small cases, and larger cases against naive loops
// written here independently of the kernels.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <random>

#include "graph/builder.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"

using namespace nnfuse;

namespace {

Node make_node(const std::string& op, size_t n_in, size_t n_out, Attributes attrs = {}) {
  Node n;
  n.id = 0;
  n.name = "node_" + op;
  n.op_type = op;
  for (size_t i = 0; i < n_in; ++i) n.inputs.push_back("in" + std::to_string(i));
  for (size_t i = 0; i < n_out; ++i) n.outputs.push_back("out" + std::to_string(i));
  n.attrs = std::move(attrs);
  return n;
}

// Runs one node; an empty (dtype Undefined) tensor marks an absent optional input.
std::vector<Tensor> run(const std::string& op, const std::vector<Tensor>& ins, Attributes attrs = {}, int64_t opset = 17,
                        size_t n_out = 1) {
  Node n = make_node(op, ins.size(), n_out, std::move(attrs));
  std::vector<const Tensor*> p;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (ins[i].dtype() == DType::Undefined) {
      p.push_back(nullptr);
      n.inputs[i] = "";
    } else {
      p.push_back(&ins[i]);
    }
  }
  return run_node(n, opset, p);
}

Tensor f32(Shape s, std::vector<float> v) { return Tensor::from_vector<float>(std::move(s), v); }
Tensor i64(Shape s, std::vector<int64_t> v) { return Tensor::from_vector<int64_t>(std::move(s), v); }

Tensor random_f32(Shape s, uint64_t seed) {
  Tensor t(DType::Float32, s);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

void require_close(const Tensor& got, const Tensor& want, double tol = 1e-4) {
  REQUIRE(got.shape() == want.shape());
  auto g = got.to_float_vector(), w = want.to_float_vector();
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << " of " << shape_str(got.shape()));
    REQUIRE(std::fabs(double(g[i]) - double(w[i])) <= tol * (1.0 + std::fabs(double(w[i]))));
  }
}

void require_values(const Tensor& got, Shape shape, std::vector<float> want, double tol = 1e-5) {
  require_close(got, f32(std::move(shape), std::move(want)), tol);
}

Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) { return GraphBuilder::attrs(kv); }

// Naive 2-D convolution (NCHW), groups, strides, pads, dilations.
Tensor naive_conv2d(const Tensor& x, const Tensor& w, const Tensor* b, int64_t group, std::array<int64_t, 2> s,
                    std::array<int64_t, 4> p, std::array<int64_t, 2> d) {
  int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  int64_t M = w.dim(0), Cg = w.dim(1), KH = w.dim(2), KW = w.dim(3);
  int64_t OH = (H + p[0] + p[2] - ((KH - 1) * d[0] + 1)) / s[0] + 1;
  int64_t OW = (W + p[1] + p[3] - ((KW - 1) * d[1] + 1)) / s[1] + 1;
  Tensor y(DType::Float32, {N, M, OH, OW});
  auto X = [&](int64_t n, int64_t c, int64_t h, int64_t ww) { return double(x.data<float>()[((n * C + c) * H + h) * W + ww]); };
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = b ? double(b->data<float>()[m]) : 0.0;
          int64_t g = m / (M / group);
          for (int64_t cg = 0; cg < Cg; ++cg)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                int64_t ih = oh * s[0] - p[0] + kh * d[0], iw = ow * s[1] - p[1] + kw * d[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += X(n, g * Cg + cg, ih, iw) * double(w.data<float>()[((m * Cg + cg) * KH + kh) * KW + kw]);
              }
          y.data<float>()[((n * M + m) * OH + oh) * OW + ow] = float(acc);
        }
  return y;
}

Tensor naive_matmul(const Tensor& a, const Tensor& b) {  // 2-D only
  int64_t M = a.dim(0), K = a.dim(1), N = b.dim(1);
  Tensor y(DType::Float32, {M, N});
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(a.data<float>()[i * K + k]) * double(b.data<float>()[k * N + j]);
      y.data<float>()[i * N + j] = float(acc);
    }
  return y;
}

}  // namespace

// ------------------------------------------------------------------------------------ MatMul / Gemm
TEST_CASE("MatMul 2-D by hand", "[ops][nn]") {
  auto y = run("MatMul", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3, 2}, {7, 8, 9, 10, 11, 12})})[0];
  require_values(y, {2, 2}, {58, 64, 139, 154});
}

TEST_CASE("MatMul with 1-D operands", "[ops][nn]") {
  Tensor m = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  require_values(run("MatMul", {f32({2}, {1, 1}), m})[0], {3}, {5, 7, 9});
  require_values(run("MatMul", {m, f32({3}, {1, 0, -1})})[0], {2}, {-2, -2});
  require_values(run("MatMul", {f32({3}, {1, 2, 3}), f32({3}, {4, 5, 6})})[0], {}, {32});
}

TEST_CASE("MatMul batched broadcasting against a naive loop", "[ops][nn]") {
  Tensor a = random_f32({2, 1, 5, 7}, 1), b = random_f32({3, 7, 4}, 2);
  Tensor y = run("MatMul", {a, b})[0];
  REQUIRE(y.shape() == Shape{2, 3, 5, 4});
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      Tensor ai(DType::Float32, {5, 7}), bj(DType::Float32, {7, 4}), yij(DType::Float32, {5, 4});
      std::copy_n(a.data<float>() + i * 35, 35, ai.data<float>());
      std::copy_n(b.data<float>() + j * 28, 28, bj.data<float>());
      std::copy_n(y.data<float>() + (i * 3 + j) * 20, 20, yij.data<float>());
      require_close(yij, naive_matmul(ai, bj));
    }
  // int64 goes through the generic path.
  auto yi = run("MatMul", {i64({2, 2}, {1, 2, 3, 4}), i64({2, 1}, {5, 6})})[0];
  REQUIRE(yi.to_int_vector() == std::vector<int64_t>{17, 39});
}

TEST_CASE("MatMul odd sizes match a naive loop (blocking edges)", "[ops][nn]") {
  for (auto [M, K, N] : {std::array<int64_t, 3>{1, 1, 1}, {7, 17, 9}, {33, 300, 65}, {130, 260, 2100}}) {
    Tensor a = random_f32({M, K}, uint64_t(M * 7 + K)), b = random_f32({K, N}, uint64_t(N));
    require_close(run("MatMul", {a, b})[0], naive_matmul(a, b), 1e-4);
  }
}

TEST_CASE("MatMul 512x512x512 float32 throughput", "[ops][nn][perf]") {
  Tensor a = random_f32({512, 512}, 3), b = random_f32({512, 512}, 4);
  run("MatMul", {a, b});  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  const int reps = 3;
  for (int i = 0; i < reps; ++i) run("MatMul", {a, b});
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  double gflops = 2.0 * 512 * 512 * 512 / s / 1e9;
  WARN("MatMul 512^3: " << gflops << " GFLOP/s");
  // The target is > 2 GFLOP/s single-threaded; the bound is loose because test machines are shared.
  REQUIRE(gflops > 0.5);
}

TEST_CASE("Gemm with transposes, alpha, beta and broadcast C", "[ops][nn]") {
  Tensor at = f32({3, 2}, {1, 4, 2, 5, 3, 6});  // A^T of [[1,2,3],[4,5,6]]
  Tensor bt = f32({2, 3}, {7, 9, 11, 8, 10, 12});  // B^T of [[7,8],[9,10],[11,12]]
  Tensor c = f32({2}, {1, 2});
  auto y = run("Gemm", {at, bt, c}, attrs({{"transA", A::i(1)}, {"transB", A::i(1)}, {"alpha", A::f(0.5f)}, {"beta", A::f(2.f)}}))[0];
  // 0.5 * [[58,64],[139,154]] + 2 * [1,2]
  require_values(y, {2, 2}, {31, 36, 71.5f, 81});
  // C absent (allowed from opset 11), scalar C.
  require_values(run("Gemm", {f32({1, 2}, {1, 2}), f32({2, 1}, {3, 4})}, {}, 13)[0], {1, 1}, {11});
  require_values(run("Gemm", {f32({1, 2}, {1, 2}), f32({2, 1}, {3, 4}), Tensor::scalar<float>(1.f)})[0], {1, 1}, {12});
}

TEST_CASE("Gemm inner dimension mismatch names the node", "[ops][nn]") {
  try {
    run("Gemm", {f32({2, 3}, std::vector<float>(6)), f32({2, 2}, std::vector<float>(4))});
    FAIL("expected an error");
  } catch (const Error& e) {
    REQUIRE(e.context().node == "node_Gemm");
    REQUIRE(std::string(e.what()).find("K=3") != std::string::npos);
  }
}

TEST_CASE("MatMulInteger with zero points", "[ops][nn]") {
  Tensor a = Tensor::from_vector<uint8_t>({2, 2}, {11, 12, 13, 14});
  Tensor b = Tensor::from_vector<int8_t>({2, 1}, {1, -2});
  Tensor az = Tensor::scalar<uint8_t>(10);
  auto y = run("MatMulInteger", {a, b, az}, {}, 13)[0];
  REQUIRE(y.dtype() == DType::Int32);
  // [[1,2],[3,4]] x [[1],[-2]] = [[-3],[-5]]
  REQUIRE(y.to_int_vector() == std::vector<int64_t>{-3, -5});
}

// ------------------------------------------------------------------------------------ Conv
TEST_CASE("Conv 2-D by hand", "[ops][nn]") {
  Tensor x = f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = f32({1, 1, 2, 2}, {1, 1, 1, 1});
  require_values(run("Conv", {x, w})[0], {1, 1, 2, 2}, {12, 16, 24, 28});
  // pads 1, stride 2, bias 1: windows centred on corners.
  auto y = run("Conv", {x, w, f32({1}, {1})}, attrs({{"pads", A::is({1, 1, 1, 1})}, {"strides", A::is({2, 2})}}))[0];
  require_values(y, {1, 1, 2, 2}, {2, 6, 12, 29});
}

TEST_CASE("Conv 1-D by hand, kernel_shape optional", "[ops][nn]") {
  Tensor x = f32({1, 1, 5}, {1, 2, 3, 4, 5});
  Tensor w = f32({1, 1, 3}, {1, 0, -1});
  require_values(run("Conv", {x, w})[0], {1, 1, 3}, {-2, -2, -2});
  require_values(run("Conv", {x, w}, attrs({{"kernel_shape", A::is({3})}, {"dilations", A::is({2})}}))[0], {1, 1, 1}, {-4});
}

TEST_CASE("Conv matches a naive loop: sizes, strides, pads, groups, depthwise, dilation", "[ops][nn]") {
  struct Case {
    int64_t N, C, H, W, M, K, group, stride, pad, dil;
  };
  std::vector<Case> cases = {
      {1, 3, 7, 7, 4, 3, 1, 1, 1, 1},    {2, 4, 17, 17, 6, 3, 2, 2, 1, 1},  {1, 1, 1, 1, 2, 1, 1, 1, 0, 1},
      {1, 5, 17, 7, 5, 3, 5, 1, 1, 1},   {1, 6, 17, 17, 12, 3, 6, 2, 1, 1}, {1, 3, 17, 17, 4, 3, 1, 1, 2, 2},
      {1, 8, 7, 7, 16, 1, 1, 1, 0, 1},   {1, 3, 17, 17, 8, 7, 1, 2, 3, 1},  {1, 4, 9, 9, 4, 3, 4, 2, 0, 2},
  };
  for (auto& k : cases) {
    INFO("N=" << k.N << " C=" << k.C << " H=" << k.H << " W=" << k.W << " M=" << k.M << " K=" << k.K << " group=" << k.group
              << " stride=" << k.stride << " pad=" << k.pad << " dil=" << k.dil);
    Tensor x = random_f32({k.N, k.C, k.H, k.W}, uint64_t(k.C * 31 + k.H));
    Tensor w = random_f32({k.M, k.C / k.group, k.K, k.K}, uint64_t(k.M * 7 + k.K));
    Tensor b = random_f32({k.M}, 99);
    auto y = run("Conv", {x, w, b},
                 attrs({{"group", A::i(k.group)}, {"strides", A::is({k.stride, k.stride})}, {"pads", A::is({k.pad, k.pad, k.pad, k.pad})},
                        {"dilations", A::is({k.dil, k.dil})}}))[0];
    require_close(y, naive_conv2d(x, w, &b, k.group, {k.stride, k.stride}, {k.pad, k.pad, k.pad, k.pad}, {k.dil, k.dil}));
  }
}

TEST_CASE("Conv auto_pad SAME_UPPER and SAME_LOWER", "[ops][nn]") {
  Tensor x = random_f32({1, 2, 7, 7}, 5), w = random_f32({3, 2, 4, 4}, 6);
  // SAME with stride 2 on 7: out 4, total pad (4-1)*2+4-7 = 3: UPPER puts 1 before, 2 after.
  auto up = run("Conv", {x, w}, attrs({{"auto_pad", A::s("SAME_UPPER")}, {"strides", A::is({2, 2})}}))[0];
  require_close(up, naive_conv2d(x, w, nullptr, 1, {2, 2}, {1, 1, 2, 2}, {1, 1}));
  auto lo = run("Conv", {x, w}, attrs({{"auto_pad", A::s("SAME_LOWER")}, {"strides", A::is({2, 2})}}))[0];
  require_close(lo, naive_conv2d(x, w, nullptr, 1, {2, 2}, {2, 2, 1, 1}, {1, 1}));
  auto valid = run("Conv", {x, w}, attrs({{"auto_pad", A::s("VALID")}}))[0];
  REQUIRE(valid.shape() == Shape{1, 3, 4, 4});
}

TEST_CASE("Conv 3-D with a depth-1 kernel equals 2-D conv per depth slice", "[ops][nn]") {
  Tensor x = random_f32({1, 2, 3, 5, 5}, 8), w = random_f32({2, 2, 1, 3, 3}, 9);
  auto y = run("Conv", {x, w}, attrs({{"pads", A::is({0, 1, 1, 0, 1, 1})}}))[0];
  REQUIRE(y.shape() == Shape{1, 2, 3, 5, 5});
  Tensor w2 = w.reshaped({2, 2, 3, 3});
  for (int64_t d = 0; d < 3; ++d) {
    Tensor xs(DType::Float32, {1, 2, 5, 5});
    for (int64_t c = 0; c < 2; ++c) std::copy_n(x.data<float>() + (c * 3 + d) * 25, 25, xs.data<float>() + c * 25);
    Tensor want = naive_conv2d(xs, w2, nullptr, 1, {1, 1}, {1, 1, 1, 1}, {1, 1});
    for (int64_t m = 0; m < 2; ++m)
      for (int64_t i = 0; i < 25; ++i)
        REQUIRE(y.data<float>()[(m * 3 + d) * 25 + i] == Approx(want.data<float>()[m * 25 + i]).margin(1e-5));
  }
}

TEST_CASE("Conv channel mismatch names the node and the channel counts", "[ops][nn]") {
  GraphBuilder b("bad_conv", 17);
  auto x = b.input("x", DType::Float32, {Dim::sym("N"), 64, 8, 8});
  auto w = b.weight("w", {16, 32, 3, 3});
  auto y = b.op("Conv", {x, w}, {}, "my_conv");
  b.output(y);
  try {
    b.finish();
    FAIL("expected a shape error");
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::Shape);
    REQUIRE(e.context().node == "my_conv");
    REQUIRE(std::string(e.what()).find("input has 64 channels but weight expects 32 (group=1)") != std::string::npos);
  }
}

TEST_CASE("Conv shape inference keeps a symbolic batch", "[ops][nn]") {
  GraphBuilder b("conv_sym", 17);
  auto x = b.input("x", DType::Float32, {Dim::sym("batch"), 3, 224, 224});
  auto w = b.weight("w", {64, 3, 7, 7});
  auto y = b.op("Conv", {x, w}, attrs({{"strides", A::is({2, 2})}, {"pads", A::is({3, 3, 3, 3})}}));
  auto p = b.op("MaxPool", {y}, attrs({{"kernel_shape", A::is({3, 3})}, {"strides", A::is({2, 2})}, {"pads", A::is({1, 1, 1, 1})}}));
  b.output(p);
  Model m = b.finish();
  const TensorType& t = m.graph.type(p);
  REQUIRE(t.str() == "float32[batch,64,56,56]");
  REQUIRE(node_flops(m.graph, m.graph.producer(y).value()) == 0.0);  // batch unknown: no count
}

TEST_CASE("Conv rejects an unsupported dtype naming it", "[ops][nn]") {
  Tensor x = Tensor::from_vector<int32_t>({1, 1, 2, 2}, {1, 2, 3, 4});
  try {
    run("Conv", {x, x});
    FAIL("expected Unsupported");
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::Unsupported);
    REQUIRE(std::string(e.what()).find("int32") != std::string::npos);
  }
}

TEST_CASE("Conv float16 computes in float", "[ops][nn]") {
  Tensor x = f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}).cast(DType::Float16);
  Tensor w = f32({1, 1, 2, 2}, {1, 1, 1, 1}).cast(DType::Float16);
  auto y = run("Conv", {x, w})[0];
  REQUIRE(y.dtype() == DType::Float16);
  require_values(y.cast(DType::Float32), {1, 1, 2, 2}, {12, 16, 24, 28});
}

TEST_CASE("ConvTranspose stride 2 with output_padding by hand", "[ops][nn]") {
  Tensor x = f32({1, 1, 2}, {1, 2}), w = f32({1, 1, 3}, {1, 1, 1});
  require_values(run("ConvTranspose", {x, w}, attrs({{"strides", A::is({2})}}))[0], {1, 1, 5}, {1, 1, 3, 2, 2});
  require_values(run("ConvTranspose", {x, w}, attrs({{"strides", A::is({2})}, {"output_padding", A::is({1})}}))[0], {1, 1, 6},
                 {1, 1, 3, 2, 2, 0});
  require_values(run("ConvTranspose", {x, w}, attrs({{"strides", A::is({2})}, {"pads", A::is({1, 1})}}))[0], {1, 1, 3}, {1, 3, 2});
  // output_shape: total padding 5 - 4 = 1 goes to the end for NOTSET... (begin = total - total/2 = 1)
  require_values(run("ConvTranspose", {x, w}, attrs({{"strides", A::is({2})}, {"output_shape", A::is({4})}}))[0], {1, 1, 4},
                 {1, 3, 2, 2});
}

TEST_CASE("ConvTranspose 2-D with groups equals the adjoint of Conv", "[ops][nn]") {
  // <ConvTranspose(y), x> == <y, Conv(x)> for the same weight: checks the scatter against the gather.
  int64_t group = 2;
  Tensor w = random_f32({4, 3, 3, 3}, 11);  // ConvTranspose weight [Cin=4, Cout/g=3, k, k]; Conv weight [M=4, C/g=3, k, k]
  Tensor x = random_f32({1, 6, 9, 9}, 12);    // Conv input (6 = 3*group channels)
  Attributes a = attrs({{"group", A::i(group)}, {"strides", A::is({2, 2})}, {"pads", A::is({1, 1, 1, 1})}});
  Tensor cx = run("Conv", {x, w}, a)[0];  // [1,4,5,5]
  Tensor y = random_f32(cx.shape(), 13);
  Attributes at = a;
  at.set("output_padding", A::is({0, 0}));
  Tensor ty = run("ConvTranspose", {y, w}, at)[0];
  REQUIRE(ty.shape() == x.shape());
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < x.numel(); ++i) lhs += double(ty.data<float>()[i]) * double(x.data<float>()[i]);
  for (int64_t i = 0; i < y.numel(); ++i) rhs += double(y.data<float>()[i]) * double(cx.data<float>()[i]);
  REQUIRE(lhs == Approx(rhs).epsilon(1e-4));
}

TEST_CASE("ConvTranspose with group 0 or past its input channels is an error naming the group (fuzz finding)", "[ops][nn]") {
  // group=0 divided by zero (SIGFPE); a group past the channels could overflow Cout_g * group.
  Tensor w = random_f32({4, 3, 3, 3}, 11);
  Tensor y = random_f32({1, 4, 5, 5}, 13);
  REQUIRE_THROWS_WITH(run("ConvTranspose", {y, w}, attrs({{"group", A::i(0)}})),
                      Catch::Contains("group=0 must be between 1 and the 4 input channels"));
  REQUIRE_THROWS_WITH(run("ConvTranspose", {y, w}, attrs({{"group", A::i(int64_t(1) << 61)}})),
                      Catch::Contains("must be between 1 and the 4 input channels"));
  // Shape inference says so too, naming the node.
  GraphBuilder b("bad_convtranspose", 17);
  auto x = b.input("x", DType::Float32, {1, 4, 5, 5});
  b.output(b.op("ConvTranspose", {x, b.weight("w", {4, 3, 3, 3})}, GraphBuilder::attrs({{"group", A::i(0)}}), "my_deconv"));
  try {
    b.finish();
    FAIL("expected a shape error");
  } catch (const Error& e) {
    CHECK(e.context().node == "my_deconv");
    CHECK(std::string(e.what()).find("ConvTranspose: group must be >= 1") != std::string::npos);
  }
}

// ------------------------------------------------------------------------------------ pooling
TEST_CASE("MaxPool by hand, with Indices and ceil_mode", "[ops][nn]") {
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[size_t(i)] = float((i * 7) % 16);
  Tensor x = f32({1, 1, 4, 4}, v);  // rows: [0 7 14 5] [12 3 10 1] [8 15 6 13] [4 11 2 9]
  auto out = run("MaxPool", {x}, attrs({{"kernel_shape", A::is({2, 2})}, {"strides", A::is({2, 2})}}), 17, 2);
  require_values(out[0], {1, 1, 2, 2}, {12, 14, 15, 13});
  REQUIRE(out[1].to_int_vector() == std::vector<int64_t>{4, 2, 9, 11});
  auto cm = run("MaxPool", {x}, attrs({{"kernel_shape", A::is({2, 2})}, {"strides", A::is({2, 2})}, {"storage_order", A::i(1)}}), 17, 2);
  REQUIRE(cm[1].to_int_vector() == std::vector<int64_t>{1, 8, 6, 14});  // h + w*H
  // 3x3 input, k2 s2: floor -> 1x1, ceil -> 2x2 (the last window is partial).
  Tensor x3 = f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  REQUIRE(run("MaxPool", {x3}, attrs({{"kernel_shape", A::is({2, 2})}, {"strides", A::is({2, 2})}}))[0].shape() == Shape{1, 1, 1, 1});
  require_values(run("MaxPool", {x3}, attrs({{"kernel_shape", A::is({2, 2})}, {"strides", A::is({2, 2})}, {"ceil_mode", A::i(1)}}))[0],
                 {1, 1, 2, 2}, {5, 6, 8, 9});
  // dilation 2: the window {0,2} x {0,2}.
  require_values(run("MaxPool", {x3}, attrs({{"kernel_shape", A::is({2, 2})}, {"dilations", A::is({2, 2})}}))[0], {1, 1, 1, 1}, {9});
}

TEST_CASE("AveragePool count_include_pad and ceil_mode", "[ops][nn]") {
  Tensor x = f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Attributes a = attrs({{"kernel_shape", A::is({2, 2})}, {"pads", A::is({1, 1, 0, 0})}, {"strides", A::is({2, 2})}});
  // windows: {1}, {2,3}, {4,7}, {5,6,8,9}
  require_values(run("AveragePool", {x}, a)[0], {1, 1, 2, 2}, {1, 2.5f, 5.5f, 7});
  a.set("count_include_pad", A::i(1));
  require_values(run("AveragePool", {x}, a)[0], {1, 1, 2, 2}, {0.25f, 1.25f, 2.75f, 7});
  Attributes c = attrs({{"kernel_shape", A::is({2, 2})}, {"strides", A::is({2, 2})}, {"ceil_mode", A::i(1)}});
  // windows {1,2,4,5}, {3,6}, {7,8}, {9}
  require_values(run("AveragePool", {x}, c)[0], {1, 1, 2, 2}, {3, 4.5f, 7.5f, 9});
}

TEST_CASE("Global pools and LpPool", "[ops][nn]") {
  Tensor x = f32({1, 2, 2, 2}, {1, 2, 3, 4, -1, -2, -3, -4});
  require_values(run("GlobalAveragePool", {x})[0], {1, 2, 1, 1}, {2.5f, -2.5f});
  require_values(run("GlobalMaxPool", {x})[0], {1, 2, 1, 1}, {4, -1});
  require_values(run("GlobalLpPool", {x})[0], {1, 2, 1, 1}, {std::sqrt(30.f), std::sqrt(30.f)});
  require_values(run("LpPool", {x}, attrs({{"kernel_shape", A::is({2, 1})}, {"p", A::i(1)}}))[0], {1, 2, 1, 2}, {4, 6, 4, 6});
}

// ------------------------------------------------------------------------------------ normalisation
TEST_CASE("BatchNormalization inference and training mode", "[ops][nn]") {
  Tensor x = f32({1, 2, 1, 2}, {1, 2, 3, 4});
  Tensor s = f32({2}, {1, 2}), b = f32({2}, {0, 1}), m = f32({2}, {1, 3}), v = f32({2}, {4, 1});
  auto y = run("BatchNormalization", {x, s, b, m, v}, attrs({{"epsilon", A::f(0.f)}}), 15)[0];
  // ch0: (x-1)/2 ; ch1: 2*(x-3)+1
  require_values(y, {1, 2, 1, 2}, {0, 0.5f, 1, 3});
  // Training mode normalises with the batch's statistics over N and the spatial axes: x [2, 2, 1, 2]
  // holds ch0 {1, 2 | 3, 6} (mean 3, biased variance 3.5) and ch1 {3, 4 | 5, 8} (mean 5, 3.5); with
  // epsilon 0.5 the deviation is 2, so Y = (x - 3) / 2 and 2 (x - 5) / 2 + 1 = x - 4.
  Tensor xb = f32({2, 2, 1, 2}, {1, 2, 3, 4, 3, 6, 5, 8});
  Attributes train = attrs({{"training_mode", A::i(1)}, {"epsilon", A::f(0.5f)}, {"momentum", A::f(0.75f)}});
  auto t = run("BatchNormalization", {xb, s, b, m, v}, train, 15, 3);
  require_values(t[0], {2, 2, 1, 2}, {-1, -0.5f, -1, 0, 0, 1.5f, 1, 4});
  // The running statistics keep `momentum` of the inputs: 0.75 * {1, 3} + 0.25 * {3, 5} and
  // 0.75 * {4, 1} + 0.25 * {3.5, 3.5}.
  require_values(t[1], {2}, {1.5f, 3.5f});
  require_values(t[2], {2}, {3.875f, 1.625f});
  // The default momentum is 0.9: 0.9 * {1, 3} + 0.1 * {3, 5}.
  auto d = run("BatchNormalization", {xb, s, b, m, v}, attrs({{"training_mode", A::i(1)}}), 15, 3);
  require_values(d[1], {2}, {1.2f, 3.2f});
  // Y alone in training mode is the same normalisation.
  require_values(run("BatchNormalization", {xb, s, b, m, v}, train, 15, 1)[0], {2, 2, 1, 2}, {-1, -0.5f, -1, 0, 0, 1.5f, 1, 4});
  // Float16 data with float32 statistics (opset 15's T and T2): the statistics stay float32.
  auto h = run("BatchNormalization", {xb.cast(DType::Float16), s, b, m, v}, train, 15, 3);
  CHECK(h[0].dtype() == DType::Float16);
  REQUIRE(h[1].dtype() == DType::Float32);
  require_values(h[2], {2}, {3.875f, 1.625f});
  // Refused: statistics outputs without training mode (opset 15, and opset 9's training outputs),
  // and training_mode before opset 14, where it does not exist.
  auto unsupported = [&](const Attributes& a, int64_t opset, size_t outputs) {
    try {
      run("BatchNormalization", {x, s, b, m, v}, a, opset, outputs);
    } catch (const Error& e) {
      return e.kind() == ErrorKind::Unsupported;
    }
    return false;
  };
  CHECK(unsupported(attrs({}), 15, 3));
  CHECK(unsupported(attrs({}), 9, 3));
  CHECK(unsupported(attrs({{"training_mode", A::i(1)}}), 13, 1));
  GraphBuilder gb("bn", 15);
  auto in = gb.input("x", DType::Float32, {1, 2, 1, 2});
  std::vector<std::string> params{in, gb.constant("s", s), gb.constant("b", b), gb.constant("m", m), gb.constant("v", v)};
  auto o = gb.op("BatchNormalization", params);
  auto ot = gb.op_n("BatchNormalization", params, 3, GraphBuilder::attrs({{"training_mode", A::i(1)}}));
  auto x16 = gb.input("x16", DType::Float16, {1, 2, 1, 2});
  auto ot16 = gb.op_n("BatchNormalization", {x16, params[1], params[2], params[3], params[4]}, 3,
                      GraphBuilder::attrs({{"training_mode", A::i(1)}}));
  gb.output(o);
  for (auto& name : ot) gb.output(name);
  for (auto& name : ot16) gb.output(name);
  Model md = gb.finish();
  CHECK(md.graph.type(ot16[0]).dtype == DType::Float16);
  CHECK(md.graph.type(ot16[1]).dtype == DType::Float32);  // input_mean's type
  // Opset 14 dropped the saved statistics outputs: a fourth output is a malformed model.
  {
    GraphBuilder g4("bn4", 15);
    auto i4 = g4.input("x", DType::Float32, {1, 2, 1, 2});
    auto o4 = g4.op_n("BatchNormalization", {i4, g4.constant("s", s), g4.constant("b", b), g4.constant("m", m), g4.constant("v", v)}, 4,
                      GraphBuilder::attrs({{"training_mode", A::i(1)}}));
    g4.output(o4[0]);
    bool model_error = false;
    try {
      g4.finish();
    } catch (const Error& e) {
      model_error = e.kind() == ErrorKind::Model && std::string(e.what()).find("at most 3 outputs") != std::string::npos;
    }
    CHECK(model_error);
  }
  REQUIRE(node_mapping_type(md.graph, md.graph.producer(o).value()) == MappingType::OneToOne);
  // Training mode reduces over the batch before it scales.
  REQUIRE(node_mapping_type(md.graph, md.graph.producer(ot[0]).value()) == MappingType::ManyToMany);
  CHECK(md.graph.type(ot[1]).str() == md.graph.type(ot[2]).str());
  CHECK(md.graph.type(ot[1]).rank() == 1);
}

TEST_CASE("LayerNormalization against hand-computed mean and variance", "[ops][nn]") {
  Tensor x = f32({2, 3}, {1, 2, 3, 2, 4, 9});
  Tensor s = f32({3}, {1, 2, 1}), b = f32({3}, {0, 0, 1});
  auto out = run("LayerNormalization", {x, s, b}, attrs({{"epsilon", A::f(0.f)}}), 17, 3);
  // row 0: mean 2, var 2/3; row 1: mean 5, var (9+1+16)/3 = 26/3
  double i0 = 1 / std::sqrt(2.0 / 3), i1 = 1 / std::sqrt(26.0 / 3);
  require_values(out[0], {2, 3}, {float(-i0), 0, float(i0 + 1), float(-3 * i1), float(-2 * i1), float(4 * i1 + 1)});
  require_values(out[1], {2, 1}, {2, 5});
  require_values(out[2], {2, 1}, {float(i0), float(i1)});
  // axis 0 normalises over everything.
  auto all = run("LayerNormalization", {x, f32({1}, {1})}, attrs({{"axis", A::i(0)}}), 17)[0];
  double mean = 21.0 / 6, var = 0;
  for (float v : x.to_float_vector()) var += (v - mean) * (v - mean) / 6;
  REQUIRE(all.data<float>()[5] == Approx((9 - mean) / std::sqrt(var + 1e-5)));
}

TEST_CASE("InstanceNormalization and GroupNormalization 18 vs 21", "[ops][nn]") {
  Tensor x = f32({1, 2, 2}, {1, 3, 10, 20});
  auto in = run("InstanceNormalization", {x, f32({2}, {1, 2}), f32({2}, {0, 1})}, attrs({{"epsilon", A::f(0.f)}}))[0];
  require_values(in, {1, 2, 2}, {-1, 1, -1, 3});
  Tensor g = f32({1, 4, 1}, {1, 3, 10, 20});
  // 2 groups: {1,3} mean 2 std 1; {10,20} mean 15 std 5.
  auto g18 = run("GroupNormalization", {g, f32({2}, {1, 2}), f32({2}, {0, 1})}, attrs({{"num_groups", A::i(2)}, {"epsilon", A::f(0.f)}}), 18)[0];
  require_values(g18, {1, 4, 1}, {-1, 1, -1, 3});
  auto g21 = run("GroupNormalization", {g, f32({4}, {1, 2, 3, 4}), f32({4}, {0, 0, 0, 1})},
                 attrs({{"num_groups", A::i(2)}, {"epsilon", A::f(0.f)}}), 21)[0];
  require_values(g21, {1, 4, 1}, {-1, 2, -3, 5});
  REQUIRE_THROWS_AS(run("GroupNormalization", {g, f32({2}, {1, 2}), f32({2}, {0, 1})}, attrs({{"num_groups", A::i(2)}}), 21), Error);
}

TEST_CASE("LRN and MeanVarianceNormalization by hand", "[ops][nn]") {
  Tensor x = f32({1, 3, 1, 1}, {1, 2, 3});
  auto y = run("LRN", {x}, attrs({{"size", A::i(3)}, {"alpha", A::f(3.f)}, {"beta", A::f(1.f)}, {"bias", A::f(1.f)}}))[0];
  // sums of squares over neighbours: ch0 {1,2}=5, ch1 {1,2,3}=14, ch2 {2,3}=13; denom 1 + 3/3 * sq
  require_values(y, {1, 3, 1, 1}, {1.f / 6, 2.f / 15, 3.f / 14});
  Tensor m = f32({1, 1, 1, 2}, {1, 3});
  require_values(run("MeanVarianceNormalization", {m})[0], {1, 1, 1, 2}, {-1, 1}, 1e-6);
}

// ------------------------------------------------------------------------------------ softmax family
TEST_CASE("Softmax opset 11 coerces to 2-D, opset 13 works along the axis", "[ops][nn]") {
  Tensor x = f32({1, 2, 2}, {0, 0, 0, std::log(3.f)});
  // opset 11, axis 1: one row of 4: exp = {1,1,1,3} / 6
  require_values(run("Softmax", {x}, {}, 11)[0], {1, 2, 2}, {1.f / 6, 1.f / 6, 1.f / 6, 0.5f});
  // opset 13, axis -1: rows {0,0} and {0, log 3}
  require_values(run("Softmax", {x}, {}, 13)[0], {1, 2, 2}, {0.5f, 0.5f, 0.25f, 0.75f});
  // opset 13 axis 1: columns {0,0} and {0, log 3}
  require_values(run("Softmax", {x}, attrs({{"axis", A::i(1)}}), 13)[0], {1, 2, 2}, {0.5f, 0.25f, 0.5f, 0.75f});
  require_values(run("LogSoftmax", {x}, {}, 13)[0], {1, 2, 2}, {std::log(0.5f), std::log(0.5f), std::log(0.25f), std::log(0.75f)});
  require_values(run("Hardmax", {f32({2, 3}, {1, 3, 3, 5, 4, 0})}, {}, 13)[0], {2, 3}, {0, 1, 0, 1, 0, 0});
}

// ------------------------------------------------------------------------------------ reductions
TEST_CASE("Reductions: axes attribute vs input, keepdims, noop_with_empty_axes", "[ops][nn]") {
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  require_values(run("ReduceSum", {x}, attrs({{"axes", A::is({1})}}), 11)[0], {2, 1}, {6, 15});
  require_values(run("ReduceSum", {x, i64({1}, {0})}, attrs({{"keepdims", A::i(0)}}), 13)[0], {3}, {5, 7, 9});
  require_values(run("ReduceSum", {x}, attrs({{"keepdims", A::i(0)}}), 13)[0], {}, {21});
  require_values(run("ReduceSum", {x, i64({0}, {})}, attrs({{"noop_with_empty_axes", A::i(1)}}), 13)[0], {2, 3}, {1, 2, 3, 4, 5, 6});
  require_values(run("ReduceMean", {x}, attrs({{"axes", A::is({-1})}, {"keepdims", A::i(0)}}), 17)[0], {2}, {2, 5});
  require_values(run("ReduceMean", {x, i64({1}, {-1})}, attrs({{"keepdims", A::i(0)}}), 18)[0], {2}, {2, 5});
  require_values(run("ReduceMax", {x, i64({1}, {0})}, {}, 18)[0], {1, 3}, {4, 5, 6});
  require_values(run("ReduceMin", {x}, attrs({{"axes", A::is({0, 1})}}), 13)[0], {1, 1}, {1});
  require_values(run("ReduceProd", {x}, attrs({{"axes", A::is({1})}}), 13)[0], {2, 1}, {6, 120});
  require_values(run("ReduceL1", {f32({2}, {-1, 2})})[0], {1}, {3});
  require_values(run("ReduceL2", {f32({2}, {3, -4})})[0], {1}, {5});
  require_values(run("ReduceSumSquare", {f32({2}, {3, -4})})[0], {1}, {25});
  require_values(run("ReduceLogSum", {f32({2}, {1, 2})})[0], {1}, {std::log(3.f)});
  require_values(run("ReduceLogSumExp", {f32({2}, {1000, 1000})})[0], {1}, {1000 + std::log(2.f)});
  auto yi = run("ReduceSum", {i64({2, 2}, {1, 2, 3, 4}), i64({1}, {1})}, {}, 13)[0];
  REQUIRE(yi.dtype() == DType::Int64);
  REQUIRE(yi.to_int_vector() == std::vector<int64_t>{3, 7});
}

TEST_CASE("Reduction shape inference with constant and unknown axes", "[ops][nn]") {
  GraphBuilder b("red", 18);
  auto x = b.input("x", DType::Float32, {Dim::sym("B"), 4, 5});
  auto y = b.op("ReduceMean", {x, b.ints("axes", {-1})}, attrs({{"keepdims", A::i(1)}}));
  auto ax = b.input("ax", DType::Int64, {1});
  auto z = b.op("ReduceSum", {x, ax}, attrs({{"keepdims", A::i(0)}}));
  b.output(y);
  b.output(z);
  Model m = b.finish();
  REQUIRE(m.graph.type(y).str() == "float32[B,4,1]");
  REQUIRE_FALSE(m.graph.type(z).has_shape);
}

TEST_CASE("ArgMax/ArgMin with select_last_index, CumSum", "[ops][nn]") {
  Tensor x = f32({2, 3}, {1, 5, 5, 2, 0, 0});
  REQUIRE(run("ArgMax", {x}, attrs({{"axis", A::i(1)}}))[0].to_int_vector() == std::vector<int64_t>{1, 0});
  REQUIRE(run("ArgMax", {x}, attrs({{"axis", A::i(1)}, {"select_last_index", A::i(1)}}))[0].to_int_vector() == std::vector<int64_t>{2, 0});
  auto am = run("ArgMin", {x}, attrs({{"axis", A::i(1)}, {"keepdims", A::i(0)}, {"select_last_index", A::i(1)}}))[0];
  REQUIRE(am.shape() == Shape{2});
  REQUIRE(am.to_int_vector() == std::vector<int64_t>{0, 2});
  Tensor c = f32({4}, {1, 2, 3, 4});
  Tensor ax = Tensor::scalar<int64_t>(0);
  require_values(run("CumSum", {c, ax})[0], {4}, {1, 3, 6, 10});
  require_values(run("CumSum", {c, ax}, attrs({{"exclusive", A::i(1)}}))[0], {4}, {0, 1, 3, 6});
  require_values(run("CumSum", {c, ax}, attrs({{"reverse", A::i(1)}}))[0], {4}, {10, 9, 7, 4});
  require_values(run("CumSum", {c, ax}, attrs({{"reverse", A::i(1)}, {"exclusive", A::i(1)}}))[0], {4}, {9, 7, 4, 0});
}

// ------------------------------------------------------------------------------------ Einsum
TEST_CASE("Einsum: batched matmul, attention scores, transpose, diagonal, sums", "[ops][nn]") {
  Tensor a = random_f32({2, 3, 4}, 21), b = random_f32({2, 4, 5}, 22);
  require_close(run("Einsum", {a, b}, attrs({{"equation", A::s("bij,bjk->bik")}}), 12)[0], run("MatMul", {a, b})[0]);
  Tensor q = random_f32({1, 2, 3, 4}, 23), k = random_f32({1, 2, 5, 4}, 24);
  Tensor s = run("Einsum", {q, k}, attrs({{"equation", A::s("bhid,bhjd->bhij")}}), 12)[0];
  REQUIRE(s.shape() == Shape{1, 2, 3, 5});
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < 4; ++d) acc += double(q.data<float>()[(h * 3 + i) * 4 + d]) * double(k.data<float>()[(h * 5 + j) * 4 + d]);
        REQUIRE(s.data<float>()[(h * 3 + i) * 5 + j] == Approx(acc).margin(1e-5));
      }
  Tensor m = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  require_values(run("Einsum", {m}, attrs({{"equation", A::s("ij->ji")}}), 12)[0], {3, 2}, {1, 4, 2, 5, 3, 6});
  require_values(run("Einsum", {m}, attrs({{"equation", A::s("ij->")}}), 12)[0], {}, {21});
  require_values(run("Einsum", {m}, attrs({{"equation", A::s("ij")}}), 12)[0], {2, 3}, {1, 2, 3, 4, 5, 6});
  require_values(run("Einsum", {m}, attrs({{"equation", A::s("ji")}}), 12)[0], {3, 2}, {1, 4, 2, 5, 3, 6});  // implicit: sorted labels
  require_values(run("Einsum", {f32({2, 2}, {1, 2, 3, 4})}, attrs({{"equation", A::s("ii->i")}}), 12)[0], {2}, {1, 4});
  require_values(run("Einsum", {f32({3}, {1, 2, 3}), f32({3}, {4, 5, 6})}, attrs({{"equation", A::s("i,i")}}), 12)[0], {}, {32});
  require_values(run("Einsum", {f32({2}, {1, 2}), f32({2}, {3, 4})}, attrs({{"equation", A::s("i,j->ij")}}), 12)[0], {2, 2}, {3, 4, 6, 8});
  Tensor e = random_f32({2, 3, 4}, 25);
  require_close(run("Einsum", {e, b}, attrs({{"equation", A::s("...ij,...jk->...ik")}}), 12)[0], run("MatMul", {e, b})[0]);
}

// ------------------------------------------------------------------------------------ quantization
TEST_CASE("QuantizeLinear / DequantizeLinear per tensor and per axis", "[ops][nn]") {
  Tensor x = f32({2, 3}, {0, 1, 2.5f, -1, 300, 3.5f});
  auto q = run("QuantizeLinear", {x, Tensor::scalar<float>(0.5f), Tensor::scalar<uint8_t>(10)}, {}, 13)[0];
  REQUIRE(q.dtype() == DType::UInt8);
  // x/0.5 = {0,2,5,-2,600,7}, rounded half-even is exact; +10, saturate to 255.
  REQUIRE(q.to_int_vector() == std::vector<int64_t>{10, 12, 15, 8, 255, 17});
  auto qi = run("QuantizeLinear", {f32({4}, {0.5f, 1.5f, 2.5f, -2.5f}), Tensor::scalar<float>(1.f), Tensor::scalar<int8_t>(0)}, {}, 13)[0];
  REQUIRE(qi.to_int_vector() == std::vector<int64_t>{0, 2, 2, -2});  // half to even
  auto qa = run("QuantizeLinear", {x, f32({3}, {1, 2, 4}), Tensor::from_vector<int8_t>({3}, {0, 1, -1})}, {}, 13)[0];
  REQUIRE(qa.to_int_vector() == std::vector<int64_t>{0, 1, 0, -1, 127, 0});
  auto d = run("DequantizeLinear", {Tensor::from_vector<uint8_t>({3}, {10, 12, 0}), Tensor::scalar<float>(0.5f), Tensor::scalar<uint8_t>(10)}, {}, 13)[0];
  require_values(d, {3}, {0, 1, -5});
  auto da = run("DequantizeLinear", {Tensor::from_vector<int8_t>({2, 2}, {1, 2, 3, 4}), f32({2}, {1, 10})}, attrs({{"axis", A::i(0)}}), 13)[0];
  require_values(da, {2, 2}, {1, 2, 30, 40});
}

// ------------------------------------------------------------------------------------ registry facts
TEST_CASE("nn ops: mapping types and FLOP counts", "[ops][nn]") {
  GraphBuilder b("flops", 17);
  auto x = b.input("x", DType::Float32, {1, 8, 10, 10});
  auto w = b.weight("w", {16, 4, 3, 3});
  auto y = b.op("Conv", {x, w}, attrs({{"group", A::i(2)}, {"pads", A::is({1, 1, 1, 1})}}));
  auto m = b.input("m", DType::Float32, {3, 5, 7});
  auto n = b.input("n", DType::Float32, {7, 2});
  auto mm = b.op("MatMul", {m, n});
  auto sm = b.op("Softmax", {mm});
  auto q = b.op("QuantizeLinear", {sm, b.scalar("s", 0.1f)});
  b.output(y);
  b.output(q);
  Model md = b.finish();
  const Graph& g = md.graph;
  REQUIRE(node_flops(g, g.producer(y).value()) == 2.0 * (16 * 10 * 10) * (4 * 9));
  REQUIRE(node_flops(g, g.producer(mm).value()) == 2.0 * 3 * 5 * 2 * 7);
  REQUIRE(node_flops(g, g.producer(sm).value()) == 5.0 * 30);
  REQUIRE(node_mapping_type(g, g.producer(y).value()) == MappingType::ManyToMany);
  REQUIRE(node_mapping_type(g, g.producer(q).value()) == MappingType::OneToOne);
  REQUIRE(g.type(q).dtype == DType::UInt8);
}

TEST_CASE("Blocked quantization (opset 21)", "[ops][nn]") {
  // x [1,4] with block_size 2 along axis 1: scales {1, 10} cover columns {0,1} and {2,3}.
  Tensor x = f32({1, 4}, {1, 2, 30, 40});
  Tensor s = f32({1, 2}, {1, 10});
  auto q = run("QuantizeLinear", {x, s, Tensor::from_vector<int8_t>({1, 2}, {0, 0})}, attrs({{"axis", A::i(1)}, {"block_size", A::i(2)}}), 21)[0];
  REQUIRE(q.to_int_vector() == std::vector<int64_t>{1, 2, 3, 4});
  auto d = run("DequantizeLinear", {q, s}, attrs({{"axis", A::i(1)}, {"block_size", A::i(2)}}), 21)[0];
  require_values(d, {1, 4}, {1, 2, 30, 40});
}

TEST_CASE("ReduceMax/ReduceMin on bool from opset 20", "[ops][nn]") {
  Tensor b = Tensor::from_vector<bool>({2, 2}, {true, false, false, false});
  auto mx = run("ReduceMax", {b, i64({1}, {1})}, attrs({{"keepdims", A::i(0)}}), 20)[0];
  REQUIRE(mx.dtype() == DType::Bool);
  REQUIRE(mx.to_int_vector() == std::vector<int64_t>{1, 0});
  auto mn = run("ReduceMin", {b, i64({1}, {0})}, attrs({{"keepdims", A::i(0)}}), 20)[0];
  REQUIRE(mn.to_int_vector() == std::vector<int64_t>{0, 0});
  REQUIRE_THROWS_AS(run("ReduceSum", {b}, {}, 20), Error);
}

TEST_CASE("ConvInteger, QLinearConv and QLinearMatMul by hand", "[ops][nn]") {
  Tensor x = Tensor::from_vector<uint8_t>({1, 1, 2, 2}, {2, 3, 4, 5});
  Tensor w = Tensor::from_vector<uint8_t>({1, 1, 2, 2}, {1, 1, 1, 1});
  // (x - 1) summed: 1+2+3+4 = 10
  auto ci = run("ConvInteger", {x, w, Tensor::scalar<uint8_t>(1)}, {}, 10)[0];
  REQUIRE(ci.dtype() == DType::Int32);
  REQUIRE(ci.to_int_vector() == std::vector<int64_t>{10});
  // QLinearConv: acc 10 (+ bias 2) * 0.5 * 1 / 2 = 3, + y_zp 100.
  auto qc = run("QLinearConv", {x, Tensor::scalar<float>(0.5f), Tensor::scalar<uint8_t>(1), w, Tensor::scalar<float>(1.f),
                                Tensor::scalar<uint8_t>(0), Tensor::scalar<float>(2.f), Tensor::scalar<uint8_t>(100),
                                Tensor::from_vector<int32_t>({1}, {2})},
                {}, 10)[0];
  REQUIRE(qc.dtype() == DType::UInt8);
  REQUIRE(qc.to_int_vector() == std::vector<int64_t>{103});
  // QLinearMatMul: [1,2]x[[3],[4]] = 11, * 1 * 2 / 4 = 5.5 -> 6 (half to even), + zp -1 = 5.
  auto qm = run("QLinearMatMul", {Tensor::from_vector<int8_t>({1, 2}, {1, 2}), Tensor::scalar<float>(1.f), Tensor::scalar<int8_t>(0),
                                  Tensor::from_vector<int8_t>({2, 1}, {3, 4}), Tensor::scalar<float>(2.f), Tensor::scalar<int8_t>(0),
                                  Tensor::scalar<float>(4.f), Tensor::scalar<int8_t>(-1)},
                {}, 10)[0];
  REQUIRE(qm.dtype() == DType::Int8);
  REQUIRE(qm.to_int_vector() == std::vector<int64_t>{5});
}

TEST_CASE("MatMul is bitwise independent of how the output is split", "[ops][nn]") {
  // The big product is large enough to be split over threads (rows); each single row is computed
  // alone, unsplit. Every element must come out bit for bit the same.
  Tensor a = random_f32({40, 300}, 31), b = random_f32({300, 700}, 32);
  Tensor y = run("MatMul", {a, b})[0];
  for (int64_t i = 0; i < 40; i += 13) {
    Tensor row(DType::Float32, {1, 300});
    std::copy_n(a.data<float>() + i * 300, 300, row.data<float>());
    Tensor yr = run("MatMul", {row, b})[0];
    for (int64_t j = 0; j < 700; ++j) REQUIRE(yr.data<float>()[j] == y.data<float>()[i * 700 + j]);
  }
  // Few rows: the split is over columns.
  Tensor a2 = random_f32({3, 1000}, 33), b2 = random_f32({1000, 900}, 34);
  Tensor y2 = run("MatMul", {a2, b2})[0];
  Tensor b2c(DType::Float32, {1000, 1});
  for (int64_t k = 0; k < 1000; ++k) b2c.data<float>()[k] = b2.data<float>()[k * 900 + 450];
  Tensor col = run("MatMul", {a2, b2c})[0];
  for (int64_t i = 0; i < 3; ++i) REQUIRE(col.data<float>()[i] == y2.data<float>()[i * 900 + 450]);
}

TEST_CASE("MatMul and Gemm shape inference with symbolic dims and mismatches", "[ops][nn]") {
  GraphBuilder b("mm_sym", 17);
  auto x = b.input("x", DType::Float32, {Dim::sym("B"), Dim::sym("S"), 768});
  auto w = b.weight("w", {768, 64});
  auto y = b.op("MatMul", {x, w});
  auto g = b.op("Gemm", {b.input("a", DType::Float32, {Dim::sym("N"), 16}), b.weight("gw", {8, 16})}, attrs({{"transB", A::i(1)}}));
  b.output(y);
  b.output(g);
  Model m = b.finish();
  REQUIRE(m.graph.type(y).str() == "float32[B,S,64]");
  REQUIRE(m.graph.type(g).str() == "float32[N,8]");

  GraphBuilder bad("mm_bad", 17);
  auto p = bad.input("p", DType::Float32, {2, 3});
  auto q = bad.op("MatMul", {p, bad.weight("q", {4, 5})}, {}, "proj");
  bad.output(q);
  try {
    bad.finish();
    FAIL("expected a shape error");
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::Shape);
    REQUIRE(e.context().node == "proj");
    REQUIRE(std::string(e.what()).find("has 3 columns but B float32[4,5] has 4 rows") != std::string::npos);
  }
}

// ------------------------------------------------------------------------------ Col2Im / MaxUnpool
// Col2Im of the im2col columns of x (written here, naively) is x times the number of patches
// covering each pixel: 2-D with strides, pads and dilations, and 1-D.
TEST_CASE("Col2Im inverts im2col up to the patch count per pixel", "[ops][nn]") {
  struct Case { Shape image, block, dil, pads, strides; };
  for (const Case& k : {Case{{5, 7}, {2, 3}, {1, 2}, {1, 0, 0, 2}, {2, 1}}, Case{{9}, {3}, {2}, {1, 1}, {3}}, Case{{4, 4}, {1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}}}) {
    const size_t n = k.image.size();
    const int64_t N = 2, C = 3;
    Shape xs = {N, C};
    xs.insert(xs.end(), k.image.begin(), k.image.end());
    const Tensor x = random_f32(xs, 7);
    std::vector<int64_t> grid;
    int64_t B = 1, Lc = 1, P = 1;
    for (size_t d = 0; d < n; ++d) {
      grid.push_back((k.image[d] + k.pads[d] + k.pads[d + n] - k.dil[d] * (k.block[d] - 1) - 1) / k.strides[d] + 1);
      B *= k.block[d], Lc *= grid[d], P *= k.image[d];
    }
    Tensor cols(DType::Float32, {N, C * B, Lc});
    std::vector<float> want(size_t(N * C * P), 0.f);
    for (int64_t nc = 0; nc < N * C; ++nc)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t l = 0; l < Lc; ++l) {
          int64_t off = 0, rb = b, rl = l, stride = 1;
          bool inside = true;
          for (size_t d = n; d-- > 0;) {
            const int64_t at = (rl % grid[d]) * k.strides[d] - k.pads[d] + (rb % k.block[d]) * k.dil[d];
            inside = inside && at >= 0 && at < k.image[d];
            off += at * stride, stride *= k.image[d], rl /= grid[d], rb /= k.block[d];
          }
          const float v = inside ? x.data<float>()[nc * P + off] : 0.f;
          cols.data<float>()[(nc * B + b) * Lc + l] = v;
          if (inside) want[size_t(nc * P + off)] += v;
        }
    const auto y = run("Col2Im", {cols, i64({int64_t(n)}, k.image), i64({int64_t(n)}, k.block)},
                       attrs({{"dilations", A::is(k.dil)}, {"pads", A::is(k.pads)}, {"strides", A::is(k.strides)}}), 18)[0];
    require_values(y, xs, want);
  }
}

TEST_CASE("Col2Im and MaxUnpool errors name the node and the sizes", "[ops][nn]") {
  // 4x4 image, 2x2 blocks: a 3x3 grid of 9 columns, not 8.
  REQUIRE_THROWS_WITH(run("Col2Im", {random_f32({1, 4, 8}, 1), i64({2}, {4, 4}), i64({2}, {2, 2})}, {}, 18),
                      Catch::Contains("node_Col2Im") && Catch::Contains("8 columns") && Catch::Contains("has 9"));
  REQUIRE_THROWS_WITH(run("Col2Im", {random_f32({1, 6, 9}, 1), i64({2}, {4, 4}), i64({2}, {2, 2})}, {}, 18),
                      Catch::Contains("multiple of prod(block_shape) = 4"));
  const Attributes pool = attrs({{"kernel_shape", A::is({2, 2})}, {"strides", A::is({2, 2})}});
  REQUIRE_THROWS_WITH(run("MaxUnpool", {random_f32({1, 1, 2, 2}, 1), i64({1, 1, 2, 2}, {0, 3, 16, 5})}, pool, 11),
                      Catch::Contains("node_MaxUnpool") && Catch::Contains("index 16 at I[2]"));
  REQUIRE_THROWS_WITH(run("MaxUnpool", {random_f32({1, 1, 2, 2}, 1), i64({1, 1, 2, 2}, {0, 3, 9, 5}), i64({4}, {1, 1, 3, 4})}, pool, 11),
                      Catch::Contains("smaller than the unpooled shape [1,1,4,4]"));
}

// MaxUnpool(MaxPool(x)) keeps each window's maximum where MaxPool found it and zeros elsewhere;
// with output_shape, the unpooled image sits at the origin of a larger zero tensor.
TEST_CASE("MaxUnpool puts MaxPool's maxima back at their indices", "[ops][nn]") {
  const Tensor x = random_f32({2, 3, 6, 4}, 11);
  const Attributes pool = attrs({{"kernel_shape", A::is({2, 2})}, {"strides", A::is({2, 2})}});
  const auto p = run("MaxPool", {x}, pool, 11, 2);
  const Tensor y = run("MaxUnpool", {p[0], p[1]}, pool, 11)[0];
  REQUIRE(y.shape() == x.shape());
  std::vector<float> want(size_t(x.numel()), 0.f);
  for (int64_t i = 0; i < p[1].numel(); ++i) want[size_t(p[1].data<int64_t>()[i])] = x.data<float>()[p[1].data<int64_t>()[i]];
  require_values(y, x.shape(), want);
  const Tensor big = run("MaxUnpool", {p[0], p[1], i64({4}, {2, 3, 7, 5})}, pool, 11)[0];
  REQUIRE(big.shape() == Shape{2, 3, 7, 5});
  for (int64_t nc = 0; nc < 6; ++nc)
    for (int64_t h = 0; h < 7; ++h)
      for (int64_t w = 0; w < 5; ++w) {
        const float got = big.data<float>()[(nc * 7 + h) * 5 + w];
        REQUIRE(got == (h < 6 && w < 4 ? want[size_t((nc * 6 + h) * 4 + w)] : 0.f));
      }
}

// On a plane linear in h and w, bilinear samples are exact, so an average bin is the plane at the
// bin's centre: region [1, 1, 5, 5] with half_pixel starts at 0.5 and has 2x2 bins of 2 pixels.
TEST_CASE("RoiAlign averages bins of a linear plane to its value at their centres", "[ops][nn]") {
  Tensor x(DType::Float32, {2, 1, 8, 8});
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t h = 0; h < 8; ++h)
      for (int64_t w = 0; w < 8; ++w) x.data<float>()[(n * 8 + h) * 8 + w] = float(n * 100 + h * 10 + w);
  const Attributes a = attrs({{"output_height", A::i(2)}, {"output_width", A::i(2)}, {"sampling_ratio", A::i(2)}});
  const Tensor y = run("RoiAlign", {x, f32({2, 4}, {1, 1, 5, 5, 1, 1, 5, 5}), i64({2}, {0, 1})}, a, 16)[0];
  require_values(y, {2, 1, 2, 2}, {16.5f, 18.5f, 36.5f, 38.5f, 116.5f, 118.5f, 136.5f, 138.5f});
  // output_half_pixel (opset 10's behaviour): no half-pixel shift, so every centre moves by +0.5.
  const Tensor y10 = run("RoiAlign", {x, f32({1, 4}, {1, 1, 5, 5}), i64({1}, {0})}, a, 10)[0];
  require_values(y10, {1, 1, 2, 2}, {22.f, 24.f, 42.f, 44.f});
  REQUIRE_THROWS_WITH(run("RoiAlign", {x, f32({1, 4}, {1, 1, 5, 5}), i64({1}, {2})}, a, 16),
                      Catch::Contains("node_RoiAlign") && Catch::Contains("batch_indices[0] = 2 is outside the batch of 2"));
  REQUIRE_THROWS_WITH(run("RoiAlign", {x, f32({1, 4}, {1, 1, 5, 5}), i64({1}, {0})}, attrs({{"mode", A::s("sum")}}), 16),
                      Catch::Contains("mode must be avg or max"));
  // A NaN or huge coordinate with an adaptive grid is an error, not a cast of NaN to an integer;
  // with a fixed grid, NaN samples count as outside the image (0).
  REQUIRE_THROWS_WITH(run("RoiAlign", {x, f32({1, 4}, {1, 1, 5, std::nanf("")}), i64({1}, {0})}, {}, 16),
                      Catch::Contains("region 0 needs"));
  REQUIRE_THROWS_WITH(run("RoiAlign", {x, f32({1, 4}, {0, 0, 1e30f, 5}), i64({1}, {0})}, {}, 16), Catch::Contains("region 0 needs"));
  require_values(run("RoiAlign", {x, f32({1, 4}, {1, 1, 5, std::nanf("")}), i64({1}, {0})}, a, 16)[0], {1, 1, 2, 2}, {0, 0, 0, 0});
}

// DeformConv with zero offsets is Conv (groups, strides, pads, dilations); a mask of 0.5 halves
// everything but the bias; an offset of exactly +1 row reads the next row (zeros past the edge).
TEST_CASE("DeformConv against Conv: zero offsets, a constant mask, whole-pixel offsets", "[ops][nn]") {
  const Tensor x = random_f32({2, 4, 7, 6}, 21), w = random_f32({6, 2, 3, 3}, 22), b = random_f32({6}, 23);
  const Attributes a = attrs({{"group", A::i(2)}, {"strides", A::is({2, 1})}, {"pads", A::is({1, 2, 1, 0})}, {"dilations", A::is({1, 2})}});
  const Tensor conv = naive_conv2d(x, w, &b, 2, {2, 1}, {1, 2, 1, 0}, {1, 2});
  const int64_t OH = conv.dim(2), OW = conv.dim(3);
  Tensor off(DType::Float32, {2, 2 * 9 * 2, OH, OW});  // offset_group 2
  for (int64_t i = 0; i < off.numel(); ++i) off.data<float>()[i] = 0.f;
  Attributes ag = a;
  ag.set("offset_group", A::i(2));
  require_close(run("DeformConv", {x, w, off, b}, ag, 19)[0], conv);
  Tensor mask(DType::Float32, {2, 2 * 9, OH, OW});
  for (int64_t i = 0; i < mask.numel(); ++i) mask.data<float>()[i] = 0.5f;
  const Tensor half = run("DeformConv", {x, w, off, b, mask}, ag, 19)[0];
  for (int64_t i = 0; i < half.numel(); ++i) {
    const float bias = b.data<float>()[(i / (OH * OW)) % 6];
    REQUIRE(std::fabs(half.data<float>()[i] - (bias + 0.5f * (conv.data<float>()[i] - bias))) <= 1e-4f * (1.f + std::fabs(conv.data<float>()[i])));
  }
  // dy = +1 on every tap: the input shifted up by a row, its last row zero (no top padding, which
  // the shifted conv would read as zeros where the deformable one reads row 0).
  const Attributes a0 = attrs({{"group", A::i(2)}, {"strides", A::is({2, 1})}, {"pads", A::is({0, 2, 1, 0})}, {"dilations", A::is({1, 2})}});
  Tensor x_up(DType::Float32, x.shape());
  for (int64_t nc = 0; nc < 8; ++nc)
    for (int64_t h = 0; h < 7; ++h)
      for (int64_t ww = 0; ww < 6; ++ww) x_up.data<float>()[(nc * 7 + h) * 6 + ww] = h + 1 < 7 ? x.data<float>()[(nc * 7 + h + 1) * 6 + ww] : 0.f;
  const Tensor shifted = naive_conv2d(x_up, w, &b, 2, {2, 1}, {0, 2, 1, 0}, {1, 2});
  const int64_t OH0 = shifted.dim(2), OW0 = shifted.dim(3);
  Tensor up(DType::Float32, {2, 9 * 2, OH0, OW0});  // offset_group 1: per tap dy, dx
  for (int64_t i = 0; i < up.numel(); ++i) up.data<float>()[i] = (i / (OH0 * OW0)) % 2 == 0 ? 1.f : 0.f;
  require_close(run("DeformConv", {x, w, up, b}, a0, 19)[0], shifted);
  REQUIRE_THROWS_WITH(run("DeformConv", {x, w, random_f32({2, 9, OH, OW}, 1)}, a, 19),
                      Catch::Contains("node_DeformConv") && Catch::Contains("offset [2,9,"));
}

// Fuzz finding (deform-conv-scalar-x): with a symbolic offset, shape inference read X's first dim
// from a scalar X's empty dim list. A known rank other than 4 is an error naming the node.
TEST_CASE("DeformConv shape inference refuses a known rank other than 4 with symbolic dims (fuzz finding)", "[ops][nn]") {
  for (int bad = 0; bad < 3; ++bad) {
    GraphBuilder b("bad_deform", 19);
    auto x = b.input("x", DType::Float32, bad == 0 ? std::vector<Dim>{} : std::vector<Dim>{1, 4, 7, 6});
    auto off = b.input("off", DType::Float32, bad == 2 ? std::vector<Dim>{Dim::sym("n"), 18} : std::vector<Dim>{Dim::sym("n"), 18, 5, 4});
    auto w = bad == 1 ? b.weight("w", {6, 4, 9}) : b.weight("w", {6, 4, 3, 3});
    b.output(b.op("DeformConv", {x, w, off}, {}, "my_deform"));
    try {
      b.finish();
      FAIL("expected a shape error");
    } catch (const Error& e) {
      CHECK(e.context().node == "my_deform");
      const std::string want = std::string(bad == 0 ? "X" : bad == 1 ? "W" : "offset") + " has rank " + (bad == 0 ? "0" : bad == 1 ? "3" : "2");
      CHECK(std::string(e.what()).find(want) != std::string::npos);
    }
  }
}

// LinearAttention on scalar heads (dk = dv = 1), where the recurrence is arithmetic by hand:
// linear S_t = S_{t-1} + k v, o = scale q S; gated multiplies S by exp(g) first; delta writes
// beta (v - S k) instead of v. Two query heads share one KV head (GQA).
TEST_CASE("LinearAttention: linear, gated and delta recurrences, GQA, past state", "[ops][nn]") {
  const Tensor q = f32({1, 2, 2}, {1, 2, 3, 4}), k = f32({1, 2, 1}, {0.5f, 2}), v = f32({1, 2, 1}, {4, -1});
  const Tensor past = f32({1, 1, 1, 1}, {1});
  auto a = [](const char* rule) {
    return attrs({{"update_rule", A::s(rule)}, {"q_num_heads", A::i(2)}, {"kv_num_heads", A::i(1)}, {"scale", A::f(0.5f)}});
  };
  // linear: S1 = 1 + 2 = 3, S2 = 3 - 2 = 1; o = 0.5 q S.
  auto r = run("LinearAttention", {q, k, v, past}, a("linear"), 27, 2);
  require_values(r[0], {1, 2, 2}, {1.5f, 3, 1.5f, 2});
  require_values(r[1], {1, 1, 1, 1}, {1});
  // gated, g = ln 2 then 0: S1 = 2 * 1 + 2 = 4, S2 = 4 - 2 = 2.
  auto g = run("LinearAttention", {q, k, v, past, f32({1, 2, 1}, {std::log(2.f), 0})}, a("gated"), 27, 2);
  require_values(g[0], {1, 2, 2}, {2, 4, 3, 4}, 1e-5);
  // delta, beta = 0.5: v1' = 0.5 (4 - 1 * 0.5) = 1.75, S1 = 1 + 0.875 = 1.875;
  // v2' = 0.5 (-1 - 1.875 * 2) = -2.375, S2 = 1.875 - 4.75 = -2.875.
  auto d = run("LinearAttention", {q, k, v, past, Tensor(), f32({1, 2, 1}, {0.5f, 0.5f})}, a("delta"), 27, 2);
  require_values(d[0], {1, 2, 2}, {0.9375f, 1.875f, -4.3125f, -5.75f});
  require_values(d[1], {1, 1, 1, 1}, {-2.875f});
  REQUIRE_THROWS_WITH(run("LinearAttention", {q, k, v, past}, a("delta"), 27, 2), Catch::Contains("needs beta input"));
  REQUIRE_THROWS_WITH(run("LinearAttention", {q, k, v, past}, a("fast"), 27, 2), Catch::Contains("update_rule 'fast'"));
}

TEST_CASE("CausalConvWithState: depthwise causal conv over past ++ input, SiLU, carried state", "[ops][nn]") {
  const Tensor x = f32({1, 2, 3}, {1, 2, 3, -1, 0, 1}), w = f32({2, 1, 3}, {1, 1, 1, 0, 0, 2}), b = f32({2}, {0, 1});
  const Tensor past = f32({1, 2, 2}, {10, 20, 5, 6});
  auto r = run("CausalConvWithState", {x, w, b, past}, {}, 27, 2);
  // channel 0: sums of 3 over [10, 20, 1, 2, 3]; channel 1: 1 + 2 x over [5, 6, -1, 0, 1].
  require_values(r[0], {1, 2, 3}, {31, 23, 6, -1, 1, 3});
  require_values(r[1], {1, 2, 2}, {2, 3, 0, 1});
  // Without a past state the padding is zeros; SiLU after the bias.
  auto s = run("CausalConvWithState", {x, w}, attrs({{"activation", A::s("silu")}}), 27, 2);
  const float c0 = 1.f, c2 = 6.f;
  CHECK(s[0].data<float>()[0] == Approx(c0 / (1 + std::exp(-c0))));
  CHECK(s[0].data<float>()[2] == Approx(c2 / (1 + std::exp(-c2))));
  const Tensor wrong_past = f32({1, 2, 3}, std::vector<float>(6));
  REQUIRE_THROWS_WITH(run("CausalConvWithState", {x, w, Tensor(), wrong_past}, {}, 27, 2), Catch::Contains("past_state must be [1,2,2]"));
}
