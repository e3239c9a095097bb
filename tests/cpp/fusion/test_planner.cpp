// The fusion planner on graphs built to exercise one behaviour each: chains, diamonds, residual
// joins, shared producers, a pair that would close a cycle, budgets, the profile cache.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "fusion/planner.h"
#include "graph/builder.h"
#include "graph/interpreter.h"

using namespace nnfuse;

namespace {
const TargetDesc& avx512() {
  static TargetDesc t = target_by_name("x86-avx512");
  return t;
}
PlanOptions offline() {
  PlanOptions o;
  o.profile = false;
  return o;
}
NodeId by_name(const Graph& g, const std::string& n) {
  NodeId id = g.find_node(n);
  REQUIRE(id != kNoNode);
  return id;
}
Attributes conv_attrs() { return GraphBuilder::attrs({{"kernel_shape", A::is({3, 3})}, {"pads", A::is({1, 1, 1, 1})}}); }

void require_same_outputs(const Graph& g, const FusionPlan& plan) {
  TensorMap feeds = random_feeds(g, 7);
  TensorMap want = run_reference(g, feeds);
  TensorMap got = run_plan_reference(g, plan, feeds);
  REQUIRE(got.size() == want.size());
  for (auto& [name, t] : want) {
    const Tensor& o = got.at(name);
    REQUIRE(o.shape() == t.shape());
    auto a = t.to_float_vector(), b = o.to_float_vector();
    for (size_t i = 0; i < a.size(); ++i) REQUIRE(std::fabs(a[i] - b[i]) <= 1e-5f + 1e-4f * std::fabs(a[i]));
  }
}
}  // namespace

TEST_CASE("a Conv-BN-ReLU chain becomes one block anchored on the Conv", "[fusion][planner]") {
  GraphBuilder b("chain");
  auto x = b.input("x", DType::Float32, {1, 4, 8, 8});
  auto c = b.op("Conv", {x, b.weight("w", {8, 4, 3, 3}), b.weight("bias", {8})}, conv_attrs(), "conv");
  auto bn = b.op("BatchNormalization", {c, b.uniform("s", {8}, 0.5f, 1.5f), b.weight("b2", {8}), b.weight("m", {8}),
                                        b.uniform("v", {8}, 0.5f, 1.5f)}, {}, "bn");
  auto r = b.op("Relu", {bn}, {}, "relu");
  b.output(r);
  Model m = b.finish();
  FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
  check_plan(m.graph, plan);
  REQUIRE(plan.kernels() == 1);
  const FusionBlock& blk = plan.blocks[0];
  REQUIRE(blk.anchor == by_name(m.graph, "conv"));
  REQUIRE(blk.type == MappingType::ManyToMany);
  REQUIRE(blk.members.size() == 3);
  REQUIRE(blk.reasons[0].cell == "seed");
  REQUIRE(blk.reasons[1].cell == "Many-to-Many+One-to-One");
  REQUIRE(blk.reasons[1].decision == "profitable");
  require_same_outputs(m.graph, plan);
}

TEST_CASE("two Many-to-Many ops never share a block", "[fusion][planner]") {
  GraphBuilder b("mm");
  auto x = b.input("x", DType::Float32, {4, 16});
  auto y = b.op("MatMul", {x, b.weight("w1", {16, 16})}, {}, "mm1");
  auto z = b.op("MatMul", {y, b.weight("w2", {16, 8})}, {}, "mm2");
  b.output(b.op("Softmax", {z}, GraphBuilder::attrs({{"axis", A::i(-1)}}), "sm"));
  Model m = b.finish();
  FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
  check_plan(m.graph, plan);
  REQUIRE(plan.kernels() == 3);
  require_same_outputs(m.graph, plan);
}

TEST_CASE("a fusion that would close a cycle through another block is refused", "[fusion][planner][cycle]") {
  // conv1 -> relu -> conv2 -> add, and conv1 -> add. Fusing add into conv1's block would make
  // {conv1, relu, add} -> conv2 -> {conv1, relu, add}.
  GraphBuilder b("tempt");
  auto x = b.input("x", DType::Float32, {1, 4, 8, 8});
  auto c1 = b.op("Conv", {x, b.weight("w1", {4, 4, 3, 3})}, conv_attrs(), "conv1");
  auto r = b.op("Relu", {c1}, {}, "relu");
  auto c2 = b.op("Conv", {r, b.weight("w2", {4, 4, 3, 3})}, conv_attrs(), "conv2");
  b.output(b.op("Add", {c2, c1}, {}, "add"));
  Model m = b.finish();
  FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
  check_plan(m.graph, plan);
  int b_conv1 = plan.block_of(by_name(m.graph, "conv1"));
  int b_add = plan.block_of(by_name(m.graph, "add"));
  REQUIRE(plan.block_of(by_name(m.graph, "relu")) == b_conv1);
  REQUIRE(b_add != b_conv1);
  REQUIRE(b_add == plan.block_of(by_name(m.graph, "conv2")));  // the residual join goes to conv2
  require_same_outputs(m.graph, plan);
}

TEST_CASE("a diamond of cheap ops fuses into one block", "[fusion][planner]") {
  GraphBuilder b("diamond");
  auto x = b.input("x", DType::Float32, {2, 8});
  auto a = b.op("Relu", {x}, {}, "a");
  auto l = b.op("Sigmoid", {a}, {}, "l");
  auto r = b.op("Tanh", {a}, {}, "r");
  b.output(b.op("Add", {l, r}, {}, "join"));
  Model m = b.finish();
  FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
  check_plan(m.graph, plan);
  REQUIRE(plan.kernels() == 1);
  REQUIRE(plan.blocks[0].type == MappingType::OneToOne);
  REQUIRE(plan.blocks[0].outputs == std::vector<std::string>{m.graph.outputs()[0]});
  require_same_outputs(m.graph, plan);
}

TEST_CASE("a residual block fuses its join into the last conv", "[fusion][planner]") {
  GraphBuilder b("residual");
  auto x = b.input("x", DType::Float32, {1, 8, 8, 8});
  auto r0 = b.op("Relu", {x}, {}, "stem");
  auto c1 = b.op("Conv", {r0, b.weight("w1", {8, 8, 3, 3})}, conv_attrs(), "conv1");
  auto r1 = b.op("Relu", {c1}, {}, "relu1");
  auto c2 = b.op("Conv", {r1, b.weight("w2", {8, 8, 3, 3})}, conv_attrs(), "conv2");
  auto add = b.op("Add", {c2, r0}, {}, "add");
  b.output(b.op("Relu", {add}, {}, "relu2"));
  Model m = b.finish();
  FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
  check_plan(m.graph, plan);
  const Graph& g = m.graph;
  int last = plan.block_of(by_name(g, "conv2"));
  REQUIRE(plan.block_of(by_name(g, "add")) == last);
  REQUIRE(plan.block_of(by_name(g, "relu2")) == last);
  REQUIRE(plan.block_of(by_name(g, "relu1")) != last);  // relu1 is conv1's epilogue (or conv2's prologue)
  REQUIRE(plan.kernels() == 2);
  require_same_outputs(g, plan);
}

TEST_CASE("a tensor with several consumers is materialised as a block output", "[fusion][planner]") {
  GraphBuilder b("shared");
  auto x = b.input("x", DType::Float32, {1, 4, 8, 8});
  auto r = b.op("Relu", {x}, {}, "shared_relu");
  auto c1 = b.op("Conv", {r, b.weight("w1", {4, 4, 3, 3})}, conv_attrs(), "convA");
  auto c2 = b.op("Conv", {r, b.weight("w2", {4, 4, 1, 1})}, GraphBuilder::attrs({{"kernel_shape", A::is({1, 1})}}), "convB");
  b.output(c1);
  b.output(c2);
  Model m = b.finish();
  FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
  check_plan(m.graph, plan);
  int owner = plan.block_of(by_name(m.graph, "shared_relu"));
  REQUIRE(owner >= 0);
  const FusionBlock& blk = plan.blocks[size_t(owner)];
  // The relu output is needed by the other conv too, so its block writes it out.
  REQUIRE(std::find(blk.outputs.begin(), blk.outputs.end(), r) != blk.outputs.end());
  REQUIRE(plan.kernels() == 2);
  require_same_outputs(m.graph, plan);
}

TEST_CASE("the input budget splits a long elementwise chain", "[fusion][planner][budget]") {
  GraphBuilder b("wide");
  auto x = b.input("x", DType::Float32, {4, 4});
  std::string cur = x;
  for (int i = 0; i < 10; ++i) cur = b.op("Add", {cur, b.weight("c" + std::to_string(i), {4, 4})});
  b.output(cur);
  Model m = b.finish();
  PlanOptions o = offline();
  o.max_block_inputs = 4;
  FusionPlan plan = plan_fusion(m.graph, avx512(), o);
  check_plan(m.graph, plan);
  REQUIRE(plan.kernels() > 1);
  for (auto& blk : plan.blocks) REQUIRE(int(blk.inputs.size()) <= 4);
  REQUIRE(plan.stats.rejected_for_budget > 0);
  o.max_block_inputs = 64;
  REQUIRE(plan_fusion(m.graph, avx512(), o).kernels() == 1);
  o.max_block_members = 3;
  FusionPlan small = plan_fusion(m.graph, avx512(), o);
  for (auto& blk : small.blocks) REQUIRE(blk.members.size() <= 3);
  require_same_outputs(m.graph, plan);
}

TEST_CASE("ops without a lowering stay alone", "[fusion][planner]") {
  GraphBuilder b("topk");
  auto x = b.input("x", DType::Float32, {2, 16});
  auto r = b.op("Relu", {x}, {}, "relu");
  auto outs = b.op_n("TopK", {r, b.ints("k", {3})}, 2, {}, "topk");
  b.output(b.op("Neg", {outs[0]}, {}, "neg"));
  Model m = b.finish();
  FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
  check_plan(m.graph, plan);
  int t = plan.block_of(by_name(m.graph, "topk"));
  REQUIRE(plan.blocks[size_t(t)].members.size() == 1);
}

TEST_CASE("undecided pairs are measured once and then read from the profile cache", "[fusion][planner][profile]") {
  // Expand then Reshape: One-to-Many + Reorganize is undecided, and the cost model is unsure of
  // it on AVX-512 (index arithmetic vs. a memory round trip of similar cost).
  GraphBuilder b("expand_reshape");
  auto x = b.input("x", DType::Float32, {1, 256});
  auto e = b.op("Expand", {x, b.ints("shape", {512, 256})}, {}, "expand");
  b.output(b.op("Reshape", {e, b.ints("to", {256, 512})}, {}, "reshape"));
  Model m = b.finish();
  auto dir = std::filesystem::temp_directory_path() / ("nnfuse_profile_" + std::to_string(std::random_device{}()));
  PlanOptions o;
  o.profile = true;
  o.profile_cache_path = (dir / "profile.json").string();
  FusionPlan first = plan_fusion(m.graph, avx512(), o);
  REQUIRE(first.stats.undecided_pairs == 1);
  REQUIRE(first.stats.settled_by_profile == 1);
  REQUIRE(std::filesystem::exists(o.profile_cache_path));
  REQUIRE(ProfileCache(o.profile_cache_path).size() == 1);
  FusionPlan second = plan_fusion(m.graph, avx512(), o);
  REQUIRE(second.stats.settled_by_profile == 0);
  REQUIRE(second.stats.settled_from_cache == 1);
  REQUIRE(second.kernels() == first.kernels());

  // A corrupt cache is not trusted: the pair is measured again and the file rewritten.
  { std::ofstream(o.profile_cache_path) << "{not json"; }
  FusionPlan third = plan_fusion(m.graph, avx512(), o);
  REQUIRE(third.stats.settled_by_profile == 1);
  REQUIRE(ProfileCache(o.profile_cache_path).size() == 1);

  // --no-profile never touches the cache and is deterministic.
  std::filesystem::remove_all(dir);
  FusionPlan a = plan_fusion(m.graph, avx512(), offline());
  FusionPlan c = plan_fusion(m.graph, avx512(), offline());
  REQUIRE_FALSE(std::filesystem::exists(dir));
  REQUIRE(a.kernels() == c.kernels());
  REQUIRE(a.stats.settled_by_profile == 0);
}

TEST_CASE("the cost model fuses free index composition and splits costly strided access", "[fusion][cost]") {
  GraphBuilder b("transpose_matmul");
  auto x = b.input("x", DType::Float32, {64, 512});
  auto t = b.op("Transpose", {x}, GraphBuilder::attrs({{"perm", A::is({1, 0})}}), "t");
  b.output(b.op("MatMul", {t, b.weight("w", {64, 32})}, {}, "mm"));
  auto r = b.op("Reshape", {x, b.ints("shape", {512, 64})}, {}, "r");
  b.output(b.op("MatMul", {r, b.weight("w2", {64, 16})}, {}, "mm2"));
  Model m = b.finish();
  const Graph& g = m.graph;
  PairEstimate strided = estimate_pair(g, by_name(g, "t"), by_name(g, "mm"), avx512());
  REQUIRE(strided.access == FusedAccess::Strided);
  REQUIRE(strided.inner_stride == 512);
  PairEstimate free_ = estimate_pair(g, by_name(g, "r"), by_name(g, "mm2"), avx512());
  REQUIRE(free_.access == FusedAccess::Free);
  REQUIRE(judge(free_) == Verdict::Fuse);
  FusionPlan plan = plan_fusion(g, avx512(), offline());
  check_plan(g, plan);
  REQUIRE(plan.block_of(by_name(g, "r")) == plan.block_of(by_name(g, "mm2")));
  require_same_outputs(g, plan);
}
