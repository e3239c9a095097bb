// The fusion planner on graphs built to exercise one behaviour each: chains, diamonds, residual
// joins, shared producers, a pair that would close a cycle, budgets, the profile cache.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "fusion/plan_report.h"
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

int count_recomputed(const FusionBlock& blk) {
  int n = 0;
  for (auto& r : blk.reasons) n += r.decision == "recomputed";
  return n;
}

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

TEST_CASE("a cheap op read by several anchors is recomputed as each one's prologue", "[fusion][planner][recompute]") {
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
  // convA (more FLOPs) takes the Relu as a prologue; convB computes it again instead of reading
  // it back, so no block writes the Relu's output.
  std::vector<int> holders = plan.blocks_of(by_name(m.graph, "shared_relu"));
  REQUIRE(holders.size() == 2);
  REQUIRE(holders[0] == plan.block_of(by_name(m.graph, "convA")));
  REQUIRE(holders[1] == plan.block_of(by_name(m.graph, "convB")));
  REQUIRE(count_recomputed(plan.blocks[size_t(holders[0])]) == 0);
  REQUIRE(count_recomputed(plan.blocks[size_t(holders[1])]) == 1);
  for (auto& blk : plan.blocks) REQUIRE(std::find(blk.outputs.begin(), blk.outputs.end(), r) == blk.outputs.end());
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

// ---------------------------------------------------------------- recompute (fusion/recompute.h)
namespace {
// An attention-mask-like chain `(1 - mask) * -10000` (`extra` more scalar ops appended to make it
// costlier) whose output is added to the scores of `layers` MatMul anchors.
Model mask_model(int layers, int extra = 0, DType mask_dtype = DType::Float32) {
  GraphBuilder b("mask");
  auto mask = b.input("mask", mask_dtype, {1, 1, 16});
  std::string m = mask;
  if (mask_dtype != DType::Float32) m = b.op("Cast", {mask}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Float32))}}), "cast");
  auto e = b.op("Mul", {b.op("Sub", {b.scalar("one", 1.0f), m}, {}, "sub"), b.scalar("big", -10000.0f)}, {}, "mask_mul");
  for (int i = 0; i < extra; ++i) e = b.op("Add", {e, b.scalar("c" + std::to_string(i), 0.5f)}, {}, "extra" + std::to_string(i));
  auto x = b.input("x", DType::Float32, {1, 16, 8});
  for (int l = 0; l < layers; ++l) {
    auto s = b.op("MatMul", {x, b.weight("k" + std::to_string(l), {8, 16})}, {}, "scores" + std::to_string(l));
    b.output(b.op("Add", {s, e}, {}, "masked" + std::to_string(l)));
  }
  return b.finish();
}
}  // namespace

TEST_CASE("a cheap chain read by several blocks is recomputed in each of them", "[fusion][planner][recompute]") {
  Model m = mask_model(2);
  const Graph& g = m.graph;
  FusionPlan plan = plan_fusion(g, avx512(), offline());
  check_plan(g, plan);
  // Without recompute the chain is a third kernel; now each attention block computes it.
  REQUIRE(plan.kernels() == 2);
  REQUIRE(plan.stats.recomputed_chains == 1);
  REQUIRE(plan.stats.recomputed_copies == 2);
  for (const char* n : {"sub", "mask_mul"}) {
    std::vector<int> holders = plan.blocks_of(by_name(g, n));
    REQUIRE(holders.size() == 2);
    REQUIRE(holders[0] != holders[1]);
  }
  for (auto& blk : plan.blocks) {
    REQUIRE(count_recomputed(blk) == 2);
    REQUIRE(blk.type == MappingType::ManyToMany);
    // The mask is read where it is needed, never written out.
    REQUIRE(std::find(blk.inputs.begin(), blk.inputs.end(), "mask") != blk.inputs.end());
    REQUIRE(blk.outputs.size() == 1);
    for (auto& r : blk.reasons)
      if (r.node == by_name(g, "mask_mul")) REQUIRE(g.node(r.partner).name.rfind("masked", 0) == 0);
  }
  // Block by block through the reference interpreter: every block must compute the mask itself.
  require_same_outputs(g, plan);
  // --no-profile stays deterministic.
  FusionPlan again = plan_fusion(g, avx512(), offline());
  REQUIRE(again.kernels() == plan.kernels());
  for (size_t i = 0; i < plan.blocks.size(); ++i) REQUIRE(again.blocks[i].members == plan.blocks[i].members);
}

TEST_CASE("an expensive chain or a Many-to-Many op is materialised, not recomputed", "[fusion][planner][recompute]") {
  SECTION("too many FLOPs per element") {
    Model m = mask_model(2, 4);  // 6 ops per element: more than kRecomputeMaxFlopsPerElement
    FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
    check_plan(m.graph, plan);
    REQUIRE(plan.kernels() == 3);
    REQUIRE(plan.stats.recomputed_chains == 0);
    REQUIRE(plan.blocks_of(by_name(m.graph, "mask_mul")).size() == 1);
    // Materialised: the chain's kernel writes its output, which both anchors' blocks read.
    const FusionBlock& chain = plan.blocks[size_t(plan.block_of(by_name(m.graph, "extra3")))];
    REQUIRE(chain.outputs == std::vector<std::string>{m.graph.node(by_name(m.graph, "extra3")).outputs[0]});
    require_same_outputs(m.graph, plan);
  }
  SECTION("a single reader block (fusion's business, not recompute's)") {
    Model m = mask_model(1);
    FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
    check_plan(m.graph, plan);
    REQUIRE(plan.kernels() == 2);
    REQUIRE(plan.stats.recomputed_chains == 0);
    for (auto& blk : plan.blocks) REQUIRE_FALSE(blk.outputs.empty());
    require_same_outputs(m.graph, plan);
  }
  SECTION("a Many-to-Many producer") {
    GraphBuilder b("shared_softmax");
    auto x = b.input("x", DType::Float32, {4, 16});
    auto sm = b.op("Softmax", {x}, GraphBuilder::attrs({{"axis", A::i(-1)}}), "sm");
    b.output(b.op("MatMul", {sm, b.weight("w1", {16, 8})}, {}, "mm1"));
    b.output(b.op("MatMul", {sm, b.weight("w2", {16, 8})}, {}, "mm2"));
    Model m = b.finish();
    FusionPlan plan = plan_fusion(m.graph, avx512(), offline());
    check_plan(m.graph, plan);
    REQUIRE(plan.kernels() == 3);
    REQUIRE(plan.blocks_of(by_name(m.graph, "sm")).size() == 1);
    require_same_outputs(m.graph, plan);
  }
  SECTION("integer arithmetic stays a kernel where generated kernels compute in float32 only") {
    // An int64 mask that is only cast to float is loaded as float: recomputed (BERT's mask).
    Model cast_only = mask_model(2, 0, DType::Int64);
    FusionPlan p = plan_fusion(cast_only.graph, avx512(), offline());
    check_plan(cast_only.graph, p);
    REQUIRE(p.kernels() == 2);
    REQUIRE(p.blocks_of(by_name(cast_only.graph, "cast")).size() == 2);
    require_same_outputs(cast_only.graph, p);
    // Negating it in int64 first needs integer arithmetic in the kernel: not on a CPU target.
    GraphBuilder b("int_mask");
    auto mask = b.input("mask", DType::Int64, {1, 1, 16});
    auto f = b.op("Cast", {b.op("Neg", {mask}, {}, "neg")}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Float32))}}), "cast");
    auto e = b.op("Mul", {f, b.scalar("big", 10000.0f)}, {}, "mask_mul");
    auto x = b.input("x", DType::Float32, {1, 16, 8});
    for (int l = 0; l < 2; ++l)
      b.output(b.op("Add", {b.op("MatMul", {x, b.weight("k" + std::to_string(l), {8, 16})}), e}));
    Model m = b.finish();
    FusionPlan on_cpu = plan_fusion(m.graph, avx512(), offline());
    check_plan(m.graph, on_cpu);
    REQUIRE(on_cpu.kernels() == 3);
    REQUIRE(on_cpu.blocks_of(by_name(m.graph, "neg")).size() == 1);
    FusionPlan on_ref = plan_fusion(m.graph, target_by_name("reference"), offline());
    check_plan(m.graph, on_ref);
    REQUIRE(on_ref.kernels() == 2);
    REQUIRE(on_ref.blocks_of(by_name(m.graph, "neg")).size() == 2);
    require_same_outputs(m.graph, on_ref);
  }
}

TEST_CASE("a chain whose input is much bigger than its output is not recomputed", "[fusion][planner][recompute]") {
  // Slice keeps 16 of 4096 columns: re-reading the input in every consumer would cost more than
  // reading the small output back, unless the input is small enough to stay in L1.
  auto build = [](int64_t cols) {
    GraphBuilder b("slice_chain");
    auto big = b.input("big", DType::Float32, {4, cols});
    auto sl = b.op("Slice", {big, b.ints("starts", {0}), b.ints("ends", {16}), b.ints("axes", {1})}, {}, "slice");
    auto r = b.op("Relu", {sl}, {}, "relu");
    auto x = b.input("x", DType::Float32, {4, 8});
    for (int l = 0; l < 2; ++l) {
      auto s = b.op("MatMul", {x, b.weight("w" + std::to_string(l), {8, 16})}, {}, "mm" + std::to_string(l));
      b.output(b.op("Add", {s, r}, {}, "add" + std::to_string(l)));
    }
    return b.finish();
  };
  Model wide = build(4096);  // 64 KiB in, 256 B out
  FusionPlan p1 = plan_fusion(wide.graph, avx512(), offline());
  check_plan(wide.graph, p1);
  REQUIRE(p1.blocks_of(by_name(wide.graph, "slice")).size() == 1);
  REQUIRE(p1.stats.recomputed_chains == 0);
  require_same_outputs(wide.graph, p1);
  // 320 B in, 256 B out: in L1, and re-reading it costs less than writing the output and
  // reading it back. mm0's block keeps the chain as a side input, mm1's block recomputes it.
  Model narrow = build(20);
  FusionPlan p2 = plan_fusion(narrow.graph, avx512(), offline());
  check_plan(narrow.graph, p2);
  REQUIRE(p2.blocks_of(by_name(narrow.graph, "slice")).size() == 2);
  REQUIRE(p2.stats.recomputed_chains == 1);
  REQUIRE(p2.kernels() == p1.kernels());
  for (auto& blk : p2.blocks) REQUIRE(blk.outputs.size() == 1);
  require_same_outputs(narrow.graph, p2);
}

TEST_CASE("recompute on a diamond keeps the block order acyclic", "[fusion][planner][recompute][cycle]") {
  // The chain feeds block A and block B, and B also reads A's output: after the copies, both
  // blocks read `mask` and B still comes after A.
  GraphBuilder b("diamond_recompute");
  auto mask = b.input("mask", DType::Float32, {1, 16});
  auto e = b.op("Mul", {b.op("Sub", {b.scalar("one", 1.0f), mask}, {}, "sub"), b.scalar("big", -4.0f)}, {}, "mask_mul");
  auto x = b.input("x", DType::Float32, {4, 16});
  auto a = b.op("Add", {b.op("MatMul", {x, b.weight("w1", {16, 16})}, {}, "mmA"), e}, {}, "addA");
  auto c = b.op("Add", {b.op("MatMul", {a, b.weight("w2", {16, 16})}, {}, "mmB"), e}, {}, "addB");
  b.output(c);
  Model m = b.finish();
  const Graph& g = m.graph;
  FusionPlan plan = plan_fusion(g, avx512(), offline());
  check_plan(g, plan);  // throws on a block reading a value before a block writes it out
  REQUIRE(plan.kernels() == 2);
  int ba = plan.block_of(by_name(g, "mmA")), bb = plan.block_of(by_name(g, "mmB"));
  REQUIRE(ba < bb);
  REQUIRE(plan.blocks_of(by_name(g, "sub")) == std::vector<int>{ba, bb});
  REQUIRE(plan.blocks[size_t(ba)].outputs == std::vector<std::string>{a});
  require_same_outputs(g, plan);

  // check_plan rejects a copy that is not marked as recomputed, and a recomputed anchor.
  FusionPlan bad = plan;
  for (auto& blk : bad.blocks)
    for (auto& r : blk.reasons)
      if (r.decision == "recomputed") r.decision = "profitable";
  REQUIRE_THROWS_AS(check_plan(g, bad), Error);
  bad = plan;
  bad.blocks[size_t(bb)].members.insert(bad.blocks[size_t(bb)].members.begin(), by_name(g, "mmA"));
  REQUIRE_THROWS_AS(check_plan(g, bad), Error);
}

TEST_CASE("a One-to-One op between two anchors is the producer's epilogue", "[fusion][planner]") {
  // conv2 has far more FLOPs and seeds first; the Relu still joins conv1 as its epilogue rather
  // than conv2 as a prologue (computed once per element, not once per reuse).
  GraphBuilder b("epilogue_first");
  auto x = b.input("x", DType::Float32, {1, 4, 16, 16});
  auto c1 = b.op("Conv", {x, b.weight("w1", {4, 4, 1, 1})}, GraphBuilder::attrs({{"kernel_shape", A::is({1, 1})}}), "conv1");
  auto r = b.op("Relu", {c1}, {}, "relu");
  b.output(b.op("Conv", {r, b.weight("w2", {32, 4, 3, 3})}, conv_attrs(), "conv2"));
  Model m = b.finish();
  const Graph& g = m.graph;
  REQUIRE(node_flops(g, by_name(g, "conv2")) > node_flops(g, by_name(g, "conv1")));
  FusionPlan plan = plan_fusion(g, avx512(), offline());
  check_plan(g, plan);
  REQUIRE(plan.kernels() == 2);
  int owner = plan.block_of(by_name(g, "relu"));
  REQUIRE(owner == plan.block_of(by_name(g, "conv1")));
  const FusionBlock& blk = plan.blocks[size_t(owner)];
  REQUIRE(blk.reasons[1].node == by_name(g, "relu"));
  REQUIRE(blk.reasons[1].cell == "Many-to-Many+One-to-One");
  require_same_outputs(g, plan);
}

TEST_CASE("plan reports list a recomputed node in every block holding it", "[fusion][planner][recompute][report]") {
  Model m = mask_model(2);
  const Graph& g = m.graph;
  FusionPlan plan = plan_fusion(g, avx512(), offline());
  REQUIRE(plan.kernels() == 2);
  nlohmann::json j = plan_to_json(g, plan);
  REQUIRE(j["fusion_stats"]["recomputed_chains"] == 1);
  REQUIRE(j["fusion_stats"]["recomputed_copies"] == 2);
  for (auto& blk : j["blocks"]) {
    int copies = 0;
    for (auto& mem : blk["members"])
      if (mem["decision"] == "recomputed") {
        ++copies;
        REQUIRE(mem.contains("with"));
      }
    REQUIRE(copies == 2);
  }
  // DOT: one dashed node per copy, each with its own id, and an edge from the copy in the block.
  std::string dot = plan_to_dot(g, plan);
  std::string sub = "n" + std::to_string(by_name(g, "sub"));
  std::string mul = "n" + std::to_string(by_name(g, "mask_mul"));
  for (int b = 0; b < 2; ++b) {
    std::string tag = "_b" + std::to_string(b);
    REQUIRE(dot.find("    " + sub + tag + " [") != std::string::npos);
    REQUIRE(dot.find(sub + tag + " -> " + mul + tag + ";") != std::string::npos);
  }
  REQUIRE(dot.find("dashed\"]") != std::string::npos);
  // The fused model: each block's function body computes the mask itself.
  Model fused = fused_model(m, plan);
  REQUIRE(fused.functions.size() == 2);
  for (auto& fn : fused.functions) {
    REQUIRE(fn.body.find_node("sub") != kNoNode);
    REQUIRE(std::find(fn.inputs.begin(), fn.inputs.end(), "mask") != fn.inputs.end());
  }
}

namespace {
// An If whose branches read `outer` by name (not as a node input): then Identity, else Neg.
std::string if_reading(GraphBuilder& b, const std::string& cond, const std::string& outer, const Shape& shape) {
  auto make_body = [&](const std::string& op, const std::string& out) {
    auto body = std::make_shared<Graph>();
    body->is_subgraph = true;
    body->opset_imports[""] = 17;
    body->declare_value(outer, TensorType::of(DType::Float32, shape));  // an outer reference
    body->add_node(op, {outer}, {out});
    body->set_type(out, TensorType::of(DType::Float32, shape));
    body->add_output(out);
    return body;
  };
  return b.op("If", {cond}, GraphBuilder::attrs({{"then_branch", Attribute::make_graph(make_body("Identity", "then_out"))},
                                                 {"else_branch", Attribute::make_graph(make_body("Neg", "else_out"))}}),
              "if");
}
}  // namespace

// The expanded AffineGrid tests: a CastLike whose value an If body reads grew into an
// elementwise block that also consumes the If's output, so the block came after the If and the
// If read the value before any block wrote it. A body read is an edge like a node input.
TEST_CASE("a block producing a value an If body reads runs before the If's block", "[fusion][planner][subgraph]") {
  GraphBuilder b("body-read", 17, 1);
  auto x = b.input("x", DType::Float32, {4});
  auto cond = b.input("cond", DType::Bool, {});
  auto a = b.op("Relu", {x}, {}, "relu");  // read only by the If's bodies and the Sigmoid
  auto y = if_reading(b, cond, a, {4});
  auto s = b.op("Sigmoid", {a}, {}, "sigmoid");
  b.output(b.op("Add", {s, y}, {}, "add"));  // joins the If's output with the Relu's chain
  Model m = b.finish();
  const Graph& g = m.graph;
  for (const TargetDesc& t : {avx512(), target_by_name("reference")}) {
    FusionPlan plan = plan_fusion(g, t, offline());
    REQUIRE_NOTHROW(check_plan(g, plan));
    int relu = plan.block_of(by_name(g, "relu")), iff = plan.block_of(by_name(g, "if")), add = plan.block_of(by_name(g, "add"));
    CHECK(relu < iff);
    CHECK(iff < add);
    CHECK(relu != add);  // fusing them would put the Relu after the If that reads it
    const FusionBlock& rb = plan.blocks[size_t(relu)];
    CHECK(std::find(rb.outputs.begin(), rb.outputs.end(), a) != rb.outputs.end());
    const FusionBlock& ib = plan.blocks[size_t(iff)];
    CHECK(std::find(ib.inputs.begin(), ib.inputs.end(), a) != ib.inputs.end());
    for (bool c : {true, false}) {
      TensorMap feeds = random_feeds(g, 7);
      feeds["cond"] = Tensor::scalar<bool>(c);
      TensorMap want = run_reference(g, feeds), got = run_plan_reference(g, plan, feeds);
      REQUIRE(want.begin()->second.to_float_vector() == got.at(want.begin()->first).to_float_vector());
    }
  }
}

TEST_CASE("the planner orders a body read's producer first even when its node id is higher", "[fusion][planner][subgraph]") {
  // Rewrites add nodes with new ids: here the Relu an If body reads is added after the If, so
  // the graph's own topological order (node inputs only, ties by id) puts the If first.
  GraphBuilder b("late-producer", 17, 1);
  auto x = b.input("x", DType::Float32, {4});
  auto cond = b.input("cond", DType::Bool, {});
  const std::string a = "late_relu_out";
  b.graph().declare_value(a, TensorType::of(DType::Float32, {4}));
  auto y = if_reading(b, cond, a, {4});
  b.graph().add_node("Relu", {x}, {a}, {}, "relu");
  b.output(b.op("Add", {b.op("Sigmoid", {a}, {}, "sigmoid"), y}, {}, "add"));
  Graph& g = b.graph();
  REQUIRE(by_name(g, "relu") > by_name(g, "if"));
  FusionPlan plan = plan_fusion(g, avx512(), offline());
  REQUIRE_NOTHROW(check_plan(g, plan));
  CHECK(plan.block_of(by_name(g, "relu")) < plan.block_of(by_name(g, "if")));
  CHECK(plan.block_of(by_name(g, "if")) < plan.block_of(by_name(g, "add")));
}

TEST_CASE("a cheap chain an If body reads keeps its own kernel instead of being recomputed", "[fusion][planner][recompute][subgraph]") {
  // The mask chain of mask_model is recomputed in both attention blocks when they are its only
  // readers. An If body reading it too needs a block that writes it out.
  GraphBuilder b("mask-if", 17, 1);
  auto mask = b.input("mask", DType::Float32, {1, 1, 16});
  auto e = b.op("Mul", {b.op("Sub", {b.scalar("one", 1.0f), mask}, {}, "sub"), b.scalar("big", -10000.0f)}, {}, "mask_mul");
  auto x = b.input("x", DType::Float32, {1, 16, 8});
  for (int l = 0; l < 2; ++l) {
    auto s = b.op("MatMul", {x, b.weight("k" + std::to_string(l), {8, 16})}, {}, "scores" + std::to_string(l));
    b.output(b.op("Add", {s, e}, {}, "masked" + std::to_string(l)));
  }
  auto cond = b.input("cond", DType::Bool, {});
  b.output(if_reading(b, cond, e, {1, 1, 16}));
  Model m = b.finish();
  const Graph& g = m.graph;
  FusionPlan plan = plan_fusion(g, avx512(), offline());
  REQUIRE_NOTHROW(check_plan(g, plan));
  CHECK(plan.stats.recomputed_chains == 0);
  std::vector<int> holders = plan.blocks_of(by_name(g, "mask_mul"));
  REQUIRE(holders.size() == 1);
  const FusionBlock& mb = plan.blocks[size_t(holders[0])];
  CHECK(std::find(mb.outputs.begin(), mb.outputs.end(), e) != mb.outputs.end());
  CHECK(holders[0] < plan.block_of(by_name(g, "if")));
  for (bool c : {true, false}) {
    TensorMap feeds = random_feeds(g, 7);
    feeds["cond"] = Tensor::scalar<bool>(c);
    TensorMap want = run_reference(g, feeds), got = run_plan_reference(g, plan, feeds);
    for (auto& [name, t] : want) REQUIRE(t.to_float_vector() == got.at(name).to_float_vector());
  }
}
