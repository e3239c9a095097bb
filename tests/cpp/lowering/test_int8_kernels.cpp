// Int8 kernels of quantized models (lowering/int8_kernels.cpp; kernels/microkernels/conv_int8.h,
// gemm_int8.h): which convs and MatMul/Gemm take them, and that the generated code computes what
// the reference interpreter computes on the QDQ graph. Where the host lacks AVX-512 VNNI the same
// graphs run on the float kernels and the counts say so.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "fusion/planner.h"
#include "fusion/target.h"
#include "graph/builder.h"
#include "graph/error.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"
#include "lowering_test_util.h"
#include "rewrite/pass.h"
#include "rewrite/passes.h"

using namespace nnfuse;
using namespace nnfuse::testing;

namespace {

// x -> QuantizeLinear -> DequantizeLinear, per tensor (qdq-to-float makes this the float chain
// the int8 kernel recognises).
std::string qdq(GraphBuilder& b, const std::string& x, float scale, const Tensor& zero_point) {
  auto s = b.scalar("s", scale);
  auto z = b.constant("z", zero_point);
  return b.op("DequantizeLinear", {b.op("QuantizeLinear", {x, s, z}), s, z});
}

// Random int8 values in [-peak, peak] with one +-peak, as a tensor of `shape`.
std::vector<int8_t> int8_values(size_t n, int peak, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-peak, peak);
  std::vector<int8_t> q(n);
  for (auto& v : q) v = int8_t(d(rng));
  q[n / 2] = int8_t(peak);
  return q;
}

// An int8 weight [K, C, KH, KW] and its DequantizeLinear: per output channel (scale [K], axis 0)
// with each channel's largest magnitude 127, or per tensor (one scale; channels peak lower).
std::string int8_weight(GraphBuilder& b, int64_t K, int64_t C, int64_t KH, int64_t KW, bool per_channel, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> q(static_cast<size_t>(K * C * KH * KW));
  for (auto& v : q) v = int8_t(d(rng));
  const int64_t per_k = C * KH * KW;
  for (int64_t k = 0; k < K; ++k) {
    // Per channel: some weight of each channel is +-127 (what a symmetric per-channel quantizer
    // gives). Per tensor: channel k peaks at 127 - 3k.
    int8_t peak = int8_t(per_channel ? 127 : std::max<int64_t>(20, 127 - 3 * k));
    for (int64_t i = 0; i < per_k; ++i) q[size_t(k * per_k + i)] = int8_t(std::clamp<int>(q[size_t(k * per_k + i)], -peak, peak));
    q[size_t(k * per_k + (k % per_k))] = int8_t(k % 2 ? -peak : peak);
  }
  auto wq = b.constant("wq", Tensor::from_vector<int8_t>({K, C, KH, KW}, q));
  if (!per_channel) return b.op("DequantizeLinear", {wq, b.scalar("ws", 0.004f)});
  std::vector<float> s(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) s[size_t(k)] = 0.002f + 0.0005f * float(k % 7);
  return b.op("DequantizeLinear", {wq, b.constant("ws", Tensor::from_vector<float>({K}, s))}, GraphBuilder::attrs({{"axis", A::i(0)}}));
}

// Convs whose outputs are graph outputs and whose inputs are quantized graph inputs, so that the
// comparison sees each conv's own rounding (in a chain, the reference's float rounding moves the
// next QuantizeLinear's result by a step now and then):
//   a: uint8 input (zero point 128), 3x3 pad 1, 20 -> 24 channels (a partial input and output
//      block), bias, batch 2, read by two convs
//   b: the same input, 7x7 stride 2 pad 3, 8 channels (one partial block), per-tensor weights
//   c: a Relu and a QDQ pair (zero point 3) before it: 3x3 dilation 2, 40 channels
//   e: 1x1 stride 2 over 40 -> 36 channels (three blocks: a task of 3)
//   d: int8 input (zero point -3), asymmetric pads (1, 0, 2, 1), 33 channels
//   near misses: a conv on the float input, and one whose weights are not on an int8 grid
Model quantized_model() {
  GraphBuilder b("conv_int8", 17, 13);
  auto x = b.input("x", DType::Float32, {2, 20, 13, 11});
  auto xq = qdq(b, x, 0.05f, Tensor::from_vector<uint8_t>({}, {128}));
  b.output(b.op("Conv", {xq, int8_weight(b, 24, 20, 3, 3, true, 1), b.weight("ba", {24}, 0.1f)},
                GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}})));
  b.output(b.op("Conv", {xq, int8_weight(b, 8, 20, 7, 7, false, 2)}, GraphBuilder::attrs({{"strides", A::is({2, 2})}, {"pads", A::is({3, 3, 3, 3})}})));
  auto z = b.input("relu_in", DType::Float32, {1, 24, 12, 12});
  auto zq = qdq(b, b.op("Relu", {z}), 0.02f, Tensor::from_vector<uint8_t>({}, {3}));
  b.output(b.op("Conv", {zq, int8_weight(b, 40, 24, 3, 3, true, 3)}, GraphBuilder::attrs({{"dilations", A::is({2, 2})}, {"pads", A::is({2, 2, 2, 2})}})));
  auto e = b.input("pointwise_in", DType::Float32, {1, 40, 9, 9});
  auto eq = qdq(b, e, 0.03f, Tensor::from_vector<uint8_t>({}, {100}));
  b.output(b.op("Conv", {eq, int8_weight(b, 36, 40, 1, 1, true, 4)}, GraphBuilder::attrs({{"strides", A::is({2, 2})}})));
  auto y = b.input("int8_in", DType::Float32, {1, 32, 9, 9});
  auto yq = qdq(b, y, 0.04f, Tensor::from_vector<int8_t>({}, {-3}));
  b.output(b.op("Conv", {yq, int8_weight(b, 33, 32, 3, 3, true, 5)}, GraphBuilder::attrs({{"pads", A::is({1, 0, 2, 1})}})));
  b.output(b.op("Conv", {y, int8_weight(b, 16, 32, 3, 3, true, 6)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}})));
  b.output(b.op("Conv", {yq, b.weight("wf", {16, 32, 3, 3}, 0.2f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}})));
  return b.finish();
}

// A quantized model as the lowering sees it (the QDQ pairs in float, the weights'
// DequantizeLinear folded: what the pipelines do first), its fusion plan, and the reference
// interpreter's outputs on the original graph.
struct QuantizedCase {
  Model rewritten;
  FusionPlan plan;
  TensorMap feeds, want;
  QuantizedCase(const Model& m, uint64_t seed) : rewritten(m) {
    feeds = random_feeds(m.graph, seed);
    want = run_reference(m.graph, feeds);
    register_structural_passes();
    PassContext ctx;
    ctx.model = &rewritten;
    PassManager().run(parse_pipeline("pipeline int8\npass constant-folding\npass qdq-to-float\npass dce\npass infer-shapes\n"), ctx);
    PlanOptions po;
    po.profile = false;
    plan = plan_fusion(rewritten.graph, target_by_name("host"), po);
  }
};

int int8_convs(const KernelModule& km) {
  int n = 0;
  for (auto& s : km.stages) n += conv_algorithm_name(s) == "int8_vnni_nchwc";
  return n;
}

}  // namespace

TEST_CASE("conv int8: quantized convs run on VNNI int8 kernels and match the reference", "[conv_algorithm][codegen][int8]") {
  const QuantizedCase q(quantized_model(), 7);
  const Graph& rg = q.rewritten.graph;
  const TensorMap& feeds = q.feeds;
  const TensorMap& want = q.want;
  const bool vnni = target_by_name("host").int8_dot;
  CpuCompileOptions o = test_compile_options("conv_int8");
  o.measure = false;
  auto cm = CpuModel::build(rg, &q.plan, o);
  // a, b, c, the 1x1 and d; not the conv on the float input nor the one with float weights.
  CHECK(int8_convs(cm->module()) == (vnni ? 5 : 0));
  CHECK(cm->info()["memory"]["conv_algorithms"]["counts"].value("int8_vnni_nchwc", 0) == (vnni ? 5 : 0));
  // Integer sums are exact; what differs from the reference is the float rounding of its own
  // sums, before the next QuantizeLinear: compared with the tolerance of the float kernels.
  check_close(cm->run(feeds), want, 1e-4, 1e-4);
  SECTION("one thread, and NNFUSE_INT8-style opt-out: the float kernels, the same outputs") {
    CpuCompileOptions f = o;
    f.int8 = false;
    f.threads = 1;
    auto cf = CpuModel::build(rg, &q.plan, f);
    CHECK(int8_convs(cf->module()) == 0);
    check_close(cf->run(feeds), want, 1e-4, 1e-4);
  }
  SECTION("an artifact keeps the int8 kernels; a plan naming them on a CPU without VNNI is refused") {
    const std::string art = test_cache_dir("conv_int8_art") + "/artifact";
    cm->save(art);
    auto loaded = CpuModel::load(art, 2);
    CHECK(int8_convs(loaded->module()) == int8_convs(cm->module()));
    check_close(loaded->run(feeds), want, 1e-4, 1e-4);
    nlohmann::json pj;
    std::ifstream(art + "/plan.json") >> pj;
    CHECK(pj.value("int8_dot", false) == vnni);
    if (!vnni) {
      pj["int8_dot"] = true;
      std::ofstream(art + "/plan.json") << pj.dump();
      CHECK_THROWS_WITH(CpuModel::load(art, 2), Catch::Contains("AVX-512 VNNI"));
    } else {
      // Without the key the lowering chooses float kernels: the code no longer matches.
      pj.erase("int8_dot");
      std::ofstream(art + "/plan.json") << pj.dump();
      CHECK_THROWS_WITH(CpuModel::load(art, 2), Catch::Contains("stale"));
    }
  }
}

namespace {

// Quantized MatMul / Gemm:
//   MatMul [2, 5, 40] x [40, 37] (batch rows flattened, a partial column block), per-column
//     weights, then a bias Add and a Relu in the epilogue
//   MatMul [7, 30] x [30, 70]: K not a multiple of 4, per-tensor weights, int8 input
//   Gemm transB = 1, alpha 0.5, beta 2 and a bias, on [7, 30] x [20, 30]^T
//   near misses: Gemm transA = 1, and MatMul on the float input
Model quantized_gemm_model() {
  GraphBuilder b("gemm_int8", 17, 13);
  auto x = b.input("x", DType::Float32, {2, 5, 40});
  auto xq = qdq(b, x, 0.05f, Tensor::from_vector<uint8_t>({}, {128}));
  std::vector<float> cs(37);
  for (size_t n = 0; n < cs.size(); ++n) cs[n] = 0.003f + 0.0004f * float(n % 5);
  std::vector<int8_t> w1 = int8_values(40 * 37, 127, 11);
  for (int64_t n = 0; n < 37; ++n) w1[size_t((n % 40) * 37 + n)] = int8_t(n % 2 ? -127 : 127);  // each column's peak
  auto b1 = b.op("DequantizeLinear", {b.constant("w1", Tensor::from_vector<int8_t>({40, 37}, w1)), b.constant("s1", Tensor::from_vector<float>({37}, cs))},
                 GraphBuilder::attrs({{"axis", A::i(1)}}));
  b.output(b.op("Relu", {b.op("Add", {b.op("MatMul", {xq, b1}), b.weight("bias1", {37}, 0.2f)})}));
  auto y = b.input("y", DType::Float32, {7, 30});
  auto yq = qdq(b, y, 0.04f, Tensor::from_vector<int8_t>({}, {-3}));
  auto b2 = b.op("DequantizeLinear", {b.constant("w2", Tensor::from_vector<int8_t>({30, 70}, int8_values(30 * 70, 90, 12))), b.scalar("s2", 0.01f)});
  b.output(b.op("MatMul", {yq, b2}));
  auto b3 = b.op("DequantizeLinear", {b.constant("w3", Tensor::from_vector<int8_t>({20, 30}, int8_values(20 * 30, 127, 13))), b.scalar("s3", 0.02f)});
  b.output(b.op("Gemm", {yq, b3, b.weight("c3", {20}, 0.3f)}, GraphBuilder::attrs({{"transB", A::i(1)}, {"alpha", A::f(0.5f)}, {"beta", A::f(2.f)}})));
  auto t = b.input("t", DType::Float32, {30, 7});
  auto tq = qdq(b, t, 0.04f, Tensor::from_vector<uint8_t>({}, {10}));
  b.output(b.op("Gemm", {tq, b3}, GraphBuilder::attrs({{"transA", A::i(1)}, {"transB", A::i(1)}})));
  b.output(b.op("MatMul", {y, b2}));
  return b.finish();
}

int int8_gemms(const KernelModule& km) {
  int n = 0;
  for (auto& s : km.stages) n += s.iparams.count("INT8") > 0;
  return n;
}

}  // namespace

TEST_CASE("gemm int8: quantized MatMul and Gemm run on VNNI int8 kernels and match the reference", "[codegen][int8]") {
  const QuantizedCase q(quantized_gemm_model(), 9);
  const bool vnni = target_by_name("host").int8_dot;
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    CpuCompileOptions o = test_compile_options("gemm_int8");
    o.measure = false;
    o.threads = threads;
    auto cm = CpuModel::build(q.rewritten.graph, &q.plan, o);
    // The two MatMuls and the Gemm on quantized inputs; not transA, not the float input.
    CHECK(int8_gemms(cm->module()) == (vnni ? 3 : 0));
    const auto report = cm->info()["memory"]["int8_kernels"];
    CHECK(report["enabled"] == vnni);
    CHECK(report["gemms"] == (vnni ? 3 : 0));
    CHECK(report["blocks"].size() == (vnni ? 3u : 0u));
    check_close(cm->run(q.feeds), q.want, 1e-4, 1e-4);
  }
}
