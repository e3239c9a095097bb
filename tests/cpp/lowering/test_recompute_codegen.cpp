// Lowering and host code generation of a plan with recomputed members (fusion/recompute.h): each
// block computes its copy of a cheap chain as part of its own expressions, the chain's value
// is never written to a buffer when no block writes it out, and the compiled model matches the
// reference interpreter.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "fusion/planner.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"
#include "lowering_test_util.h"

using namespace nnfuse;

TEST_CASE("codegen: recomputed mask chain and shared prologue", "[codegen][recompute]") {
  GraphBuilder gb("recompute");
  auto mask = gb.input("mask", DType::Int64, {1, 24});
  auto x = gb.input("x", DType::Float32, {1, 9, 20});
  // BERT's `(1 - float(mask[:, None, :])) * -10000` added to two anchors' outputs (an epilogue
  // side input); the int64 mask is loaded as float by each copy.
  auto mf = gb.op("Cast", {gb.op("Unsqueeze", {mask, gb.ints("axes", {1})}, {}, "unsq")},
                  GraphBuilder::attrs({{"to", A::i(int64_t(DType::Float32))}}), "cast");
  auto ext = gb.op("Mul", {gb.op("Sub", {gb.scalar("one", 1.0f), mf}, {}, "sub"), gb.scalar("big", -10000.0f)}, {}, "ext");
  // A Relu of the input read by both MatMuls (prologue of each).
  auto rl = gb.op("Relu", {x}, {}, "relu");
  for (int l = 0; l < 2; ++l) {
    auto mm = gb.op("MatMul", {rl, gb.weight("w" + std::to_string(l), {20, 24}, 0.3f)}, {}, "mm" + std::to_string(l));
    gb.output(gb.op("Add", {mm, ext}, {}, "masked" + std::to_string(l)));
  }
  Model m = gb.finish();
  const Graph& g = m.graph;
  PlanOptions po;
  po.profile = false;
  FusionPlan plan = plan_fusion(g, target_by_name("host"), po);
  check_plan(g, plan);
  REQUIRE(plan.kernels() == 2);
  REQUIRE(plan.stats.recomputed_chains == 2);
  REQUIRE(plan.blocks_of(g.find_node("ext")).size() == 2);
  REQUIRE(plan.blocks_of(g.find_node("unsq")).size() == 2);
  REQUIRE(plan.blocks_of(g.find_node("relu")).size() == 2);

  CpuCompileOptions o;
  o.cache_dir = nnfuse::testing::test_cache_dir("recompute");
  o.threads = 2;
  auto cm = CpuModel::build(g, &plan, o);
  REQUIRE(cm->module().fallback_blocks == 0);
  // The mask chain lives in the epilogue expressions only: no buffer holds its value.
  REQUIRE(cm->module().buffer_id(ext) == -1);
  TensorMap feeds = random_feeds(g, 3);
  TensorMap want = run_reference(g, feeds), got = cm->run(feeds);
  for (auto& [name, w] : want) {
    INFO("output " << name);
    auto a = got.at(name).to_float_vector(), b = w.to_float_vector();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(std::fabs(a[i] - b[i]) <= 1e-3f + 1e-4f * std::fabs(b[i]));
  }
  std::filesystem::remove_all(o.cache_dir);
}
