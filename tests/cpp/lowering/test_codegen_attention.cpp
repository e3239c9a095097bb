// Fused attention (fusion/attention_pattern.h, kernels/microkernels/attention.h): the planner
// makes one block of MatMul -> score transform -> Softmax -> MatMul, the lowering one
// "Attention" stage, and the generated kernel matches the reference interpreter over odd sizes,
// several key tiles and query blocks, additive, causal and boolean masks, the NaN guard of
// fully masked rows, broadcast (grouped-query) K/V and a head-merging epilogue.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "fusion/attention_pattern.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"
#include "kernels/emit_cpp.h"
#include "lowering_test_util.h"

using namespace nnfuse;
using namespace nnfuse::testing;

namespace {

enum class Mask { None, Additive, Causal, DynamoGuard };

struct AttnCase {
  int64_t B = 2, H = 3, Sq = 7, Sk = 13, D = 12, Dv = 20;
  Mask mask = Mask::None;
  bool kv_broadcast = false;    // K and V have one head shared by every query head
  bool merge_heads = true;      // Transpose + Reshape after MatMul(p, V) (the epilogue)
  bool probs_output = false;    // the softmax output is a graph output too: no fusion
  bool pass_through = false;    // float Casts around the softmax and an inference Dropout after it
};

Model attention_model(const AttnCase& c) {
  GraphBuilder gb("attention", c.mask == Mask::DynamoGuard ? 18 : 13, 7);
  const int64_t Hk = c.kv_broadcast ? 1 : c.H;
  auto q = gb.input("q", DType::Float32, {c.B, c.H, c.Sq, c.D});
  auto k = gb.input("k", DType::Float32, {c.B, Hk, c.Sk, c.D});
  auto v = gb.input("v", DType::Float32, {c.B, Hk, c.Sk, c.Dv});
  auto kt = gb.op("Transpose", {k}, GraphBuilder::attrs({{"perm", A::is({0, 1, 3, 2})}}));
  std::string s = gb.op("Div", {gb.op("MatMul", {q, kt}), gb.scalar("sqrt_d", std::sqrt(float(c.D)))});
  if (c.mask == Mask::Additive || c.mask == Mask::DynamoGuard) {
    // A padding mask from int64 [B, Sk]: (1 - m) * -10000 (legacy) or Where(m, 0, -inf) (dynamo).
    auto m = gb.input("mask", DType::Int64, {c.B, c.Sk});
    auto m4 = gb.op("Unsqueeze", {gb.op("Unsqueeze", {m, gb.ints("ax1", {1})}), gb.ints("ax2", {2})});
    std::string add;
    if (c.mask == Mask::Additive) {
      auto mf = gb.op("Cast", {m4}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Float32))}}));
      add = gb.op("Mul", {gb.op("Sub", {gb.scalar("one", 1.f), mf}), gb.scalar("big", -10000.f)});
    } else {
      auto mb = gb.op("Cast", {m4}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Bool))}}));
      add = gb.op("Where", {mb, gb.scalar("zero", 0.f), gb.scalar("ninf", -std::numeric_limits<float>::infinity())});
    }
    s = gb.op("Add", {s, add});
  }
  if (c.mask == Mask::Causal) {
    Tensor tri(DType::Bool, {1, 1, c.Sq, c.Sk});
    for (int64_t i = 0; i < c.Sq; ++i)
      for (int64_t j = 0; j < c.Sk; ++j) tri.data<bool>()[i * c.Sk + j] = j <= i + (c.Sk - c.Sq);
    s = gb.op("Where", {gb.constant("causal", tri), s, gb.scalar("fill", -10000.f)});
  }
  if (c.pass_through) s = gb.op("Cast", {s}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Float32))}}));
  std::string p = gb.op("Softmax", {s}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
  if (c.probs_output) gb.output(p);
  if (c.pass_through) p = gb.op("Dropout", {gb.op("Cast", {p}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Float32))}}))});
  if (c.mask == Mask::DynamoGuard) p = gb.op("Where", {gb.op("IsNaN", {p}), gb.scalar("z", 0.f), p});
  std::string o = gb.op("MatMul", {p, v});
  if (c.merge_heads) {
    o = gb.op("Transpose", {o}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1, 3})}}));
    o = gb.op("Reshape", {o, gb.ints("merged", {c.B, c.Sq, c.H * c.Dv})});
  }
  gb.output(o);
  return gb.finish();
}

TensorMap attention_feeds(const Model& m, const AttnCase& c) {
  TensorMap f = random_feeds(m.graph, 11);
  for (const char* n : {"q", "k"}) {  // scores of a few units: the softmax is neither flat nor one-hot
    float* x = f[n].data<float>();
    for (int64_t i = 0; i < f[n].numel(); ++i) x[i] *= 2.f;
  }
  if (c.mask == Mask::Additive || c.mask == Mask::DynamoGuard) {
    Tensor mk(DType::Int64, {c.B, c.Sk});
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = 0; j < c.Sk; ++j) mk.data<int64_t>()[b * c.Sk + j] = j < c.Sk - 3 * b ? 1 : 0;
    // The guard's case: the last batch row masks every key, so every softmax row of it is NaN.
    if (c.mask == Mask::DynamoGuard)
      for (int64_t j = 0; j < c.Sk; ++j) mk.data<int64_t>()[(c.B - 1) * c.Sk + j] = 0;
    f["mask"] = mk;
  }
  return f;
}

int attention_stages(const KernelModule& km) {
  int n = 0;
  for (auto& s : km.stages) n += s.kind == StageKind::Anchor && s.anchor_op == "Attention";
  return n;
}

void check_attention_case(const AttnCase& c, int want_stages = 1) {
  Model m = attention_model(c);
  PlanOptions po;
  po.profile = false;
  FusionPlan plan = plan_fusion(m.graph, target_by_name("host"), po);
  auto cm = CpuModel::build(m.graph, &plan, test_compile_options("attention"));
  const KernelModule& km = cm->module();
  CHECK(km.fallback_blocks == 0);
  CHECK(attention_stages(km) == want_stages);
  // The score transform runs on vectors, the masks' bool and int64 loads converted per vector
  // (lane by lane, a causal mask read through its map made short attentions scalar).
  if (want_stages > 0) {
    std::string code;
    for (auto& u : emit_cpp(km, 1)) code += u.code;
    CHECK(code.find("const auto& score = score_body;") != std::string::npos);
    CHECK(code.find("LaneSplit<decltype(score_body)>") == std::string::npos);
  }
  TensorMap feeds = attention_feeds(m, c);
  check_close(cm->run(feeds), run_reference(m.graph, feeds), 1e-4, 2e-5);
}

}  // namespace

TEST_CASE("attention pattern: legacy and dynamo chains are found; a used softmax output is not", "[attention][fusion]") {
  AttnCase c;
  c.mask = Mask::Additive;
  Model m = attention_model(c);
  auto chains = find_attention_chains(m.graph);
  REQUIRE(chains.size() == 1);
  CHECK(!chains[0].nan_guard);
  CHECK(m.graph.node(chains[0].qk).op_type == "MatMul");
  CHECK(chains[0].members.size() == 5);  // MatMul, Div, Add, Softmax, MatMul
  c.mask = Mask::DynamoGuard;
  Model d = attention_model(c);
  auto dc = find_attention_chains(d.graph);
  REQUIRE(dc.size() == 1);
  CHECK(dc[0].nan_guard);
  c.probs_output = true;
  c.mask = Mask::None;
  CHECK(find_attention_chains(attention_model(c).graph).empty());
}

TEST_CASE("codegen: fused attention matches the reference (odd sizes and masks)", "[codegen][attention]") {
  AttnCase c;
  SECTION("plain, odd sizes") {}
  SECTION("additive padding mask") { c.mask = Mask::Additive; }
  SECTION("causal mask through Where") { c.mask = Mask::Causal; }
  SECTION("dynamo mask with the NaN guard and a fully masked batch row") { c.mask = Mask::DynamoGuard; }
  SECTION("K and V broadcast over the heads") { c.kv_broadcast = true; }
  SECTION("no head merge after the product with V") { c.merge_heads = false; }
  SECTION("float Casts and an inference Dropout around the softmax") {
    c.pass_through = true;
    c.mask = Mask::Causal;
  }
  check_attention_case(c);
}

TEST_CASE("codegen: fused attention over several key tiles and query blocks", "[codegen][attention]") {
  // 300 keys: five 64-key tiles, the running max and sum rescaled between them; 70 queries: three
  // query blocks, the last a partial register tile.
  AttnCase c;
  c.B = 1;
  c.H = 2;
  c.Sq = 70;
  c.Sk = 300;
  c.D = 64;
  c.Dv = 64;
  SECTION("additive mask") { c.mask = Mask::Additive; }
  SECTION("causal, queries the last Sq of the keys") { c.mask = Mask::Causal; }
  check_attention_case(c);
}

TEST_CASE("codegen: a softmax output used elsewhere keeps the three-kernel form", "[codegen][attention]") {
  AttnCase c;
  c.probs_output = true;
  check_attention_case(c, 0);
}

TEST_CASE("fusion: attention blocks are planned for CPU targets only, and can be turned off", "[attention][fusion]") {
  AttnCase c;
  Model m = attention_model(c);
  auto count = [&](const std::string& target, bool on) {
    PlanOptions po;
    po.profile = false;
    po.fuse_attention = on;
    FusionPlan p = plan_fusion(m.graph, target_by_name(target), po);
    check_plan(m.graph, p);
    int n = 0;
    for (auto& b : p.blocks) n += b.pattern == "attention";
    return n;
  };
  CHECK(count("host", true) == 1);
  CHECK(count("host", false) == 0);
  CHECK(count("mali-opencl", true) == 0);
  CHECK(count("reference", true) == 0);
}
