// The pipeline search (rewrite/pipeline_search.h): baseline first, random then greedy trials,
// determinism for a seed, failures never chosen, and on a real tiny zoo model with the rewrite
// passes a pipeline no worse than `full`.
#include <catch2/catch.hpp>

#include <algorithm>
#include <stdexcept>

#include "graph/interpreter.h"
#include "graph/zoo.h"
#include "rewrite/pass.h"
#include "rewrite/passes.h"
#include "rewrite/pipeline_search.h"
#include "rewrite/rule_passes.h"

using namespace nnfuse;

namespace {

size_t index_of(const std::vector<std::string>& v, const std::string& x) {
  return size_t(std::find(v.begin(), v.end(), x) - v.begin());
}

// A made-up objective with a known optimum: 10 kernels, minus 4 when "fold" runs, minus 3 more when
// "simplify" runs before "fold"; "slow" costs 1 unit of estimated cost. The optimum is exactly
// {simplify, fold} in that order (3 kernels, cost 0, two passes).
TrialResult synthetic(const std::vector<std::string>& p) {
  TrialResult r;
  r.ok = true;
  size_t f = index_of(p, "fold"), s = index_of(p, "simplify");
  r.kernels = 10;
  if (f < p.size()) r.kernels -= 4;
  if (f < p.size() && s < f) r.kernels -= 3;
  r.cost = index_of(p, "slow") < p.size() ? 1.0 : 0.0;
  r.ms = double(p.size());
  return r;
}

SearchOptions synthetic_options(uint64_t seed, int budget) {
  SearchOptions o;
  o.candidates = {"fold", "noop1", "slow", "simplify", "noop2"};
  o.seed = seed;
  o.budget = budget;
  o.time_tiebreak = false;
  return o;
}

std::vector<std::vector<std::string>> tried(const SearchResult& r) {
  std::vector<std::vector<std::string>> v;
  for (auto& t : r.trials) v.push_back(t.passes);
  return v;
}

}  // namespace

TEST_CASE("pipeline search: baseline first, finds the known optimum of a synthetic objective", "[pipelines]") {
  SearchResult r = search_pipeline(synthetic, synthetic_options(1, 60));
  REQUIRE(!r.trials.empty());
  CHECK(r.trials[0].phase == "baseline");
  CHECK(r.trials[0].passes == std::vector<std::string>{"fold", "noop1", "slow", "simplify", "noop2"});
  CHECK(r.trials[0].result.kernels == 6);  // fold runs, but before simplify
  CHECK(int(r.trials.size()) <= 60);
  const Trial& b = r.best_trial();
  CHECK(b.result.kernels == 3);
  CHECK(b.result.cost == 0.0);
  CHECK(b.passes == std::vector<std::string>{"simplify", "fold"});
  // The best pipeline ends with the fixed tail.
  REQUIRE(r.best_pipeline.steps.size() == 3);
  CHECK(r.best_pipeline.steps.back().pass == "fusion-plan");
  // Greedy phases were used, and no pass list was evaluated twice.
  bool greedy = false;
  for (auto& t : r.trials) greedy |= t.phase == "drop" || t.phase == "swap" || t.phase == "insert";
  CHECK(greedy);
  auto v = tried(r);
  std::sort(v.begin(), v.end());
  CHECK(std::adjacent_find(v.begin(), v.end()) == v.end());
}

TEST_CASE("pipeline search: deterministic for a seed, different seeds explore differently", "[pipelines]") {
  auto a = search_pipeline(synthetic, synthetic_options(7, 25));
  auto b = search_pipeline(synthetic, synthetic_options(7, 25));
  auto c = search_pipeline(synthetic, synthetic_options(8, 25));
  CHECK(tried(a) == tried(b));
  CHECK(a.best == b.best);
  CHECK(tried(a) != tried(c));
}

TEST_CASE("pipeline search: budget 1 is the baseline; failed trials are recorded, never chosen", "[pipelines]") {
  auto one = search_pipeline(synthetic, synthetic_options(0, 1));
  REQUIRE(one.trials.size() == 1);
  CHECK(one.best == 0);

  // Any pipeline without "noop1" fails (as a pass order whose graph does not validate would):
  // the evaluator throwing is caught and recorded.
  PipelineEvaluator picky = [](const std::vector<std::string>& p) {
    if (index_of(p, "noop1") == p.size()) throw std::runtime_error("graph does not validate");
    return synthetic(p);
  };
  auto r = search_pipeline(picky, synthetic_options(3, 30));
  int failed = 0;
  for (auto& t : r.trials) {
    if (!t.result.ok) {
      ++failed;
      CHECK(t.result.error == "graph does not validate");
      CHECK_FALSE(t.improved);
    }
  }
  CHECK(failed > 0);
  CHECK(index_of(r.best_trial().passes, "noop1") < r.best_trial().passes.size());
  CHECK(r.best_trial().result.ok);

  SearchOptions none = synthetic_options(0, 5);
  none.candidates.clear();
  CHECK_THROWS_AS(search_pipeline(synthetic, none), Error);
  SearchOptions zero = synthetic_options(0, 0);
  CHECK_THROWS_AS(search_pipeline(synthetic, zero), Error);
}

TEST_CASE("pipeline search: pipeline_to_text parses back", "[pipelines]") {
  Pipeline p;
  p.name = "tuned";
  p.network_class = "residual_cnn";
  p.description = "tuned for m.onnx";
  p.steps = {{"cse", {}, 0}, {"fusion-plan", {}, 0}};
  Pipeline q = parse_pipeline(pipeline_to_text(p, {"a comment"}));
  CHECK(q.name == "tuned");
  CHECK(q.network_class == "residual_cnn");
  CHECK(q.description == "tuned for m.onnx");
  REQUIRE(q.steps.size() == 2);
  CHECK(q.steps[0].pass == "cse");
  CHECK(q.steps[1].pass == "fusion-plan");
}

// The real passes on a tiny zoo model. test_rewrite does not link the fusion planner, so the
// evaluator counts operators after rewriting (the kernel count without fusion, an upper bound
// of the fused one) and every trial's graph must validate and compute what the original does.
TEST_CASE("pipeline search: on bert_tiny finds a pipeline with no more operators than full", "[pipelines]") {
  register_structural_passes();
  register_rule_passes();
  ZooOptions zo;
  zo.seed = 3;
  Model original = build_zoo_model("bert_tiny", zo);
  const std::vector<std::string> full = {"constant-folding", "shape-simplification", "rules-data-movement", "rules-algebraic",
                                         "rules-recognition", "fold-batchnorm", "combine-parallel-matmul", "combine-parallel-conv",
                                         "fold-transpose-into-gemm", "rules-user", "cse", "dce"};
  auto operators = [](const Graph& g) {
    size_t n = 0;
    for (NodeId id : g.node_ids()) n += g.node(id).op_type != "Constant";
    return n;
  };
  auto run_passes = [&](const std::vector<std::string>& passes) {
    Model m = original;
    Pipeline p;
    p.name = "trial";
    for (auto& s : passes) p.steps.push_back({s, {}, 0});
    PassContext ctx;
    ctx.model = &m;
    ctx.valid.insert("shapes");
    PassManager().run(p, ctx);
    m.graph.validate();
    return m;
  };
  PipelineEvaluator eval = [&](const std::vector<std::string>& passes) {
    TrialResult r;
    Model m = run_passes(passes);
    r.ok = true;
    r.kernels = operators(m.graph);
    r.cost = double(m.graph.num_nodes());
    r.ms = double(passes.size());
    return r;
  };
  SearchOptions o;
  o.candidates = full;
  o.fixed_tail = {};
  o.budget = 12;
  o.seed = 5;
  o.time_tiebreak = false;
  SearchResult a = search_pipeline(eval, o);
  SearchResult b = search_pipeline(eval, o);
  CHECK(tried(a) == tried(b));
  const Trial& best = a.best_trial();
  CHECK(best.result.kernels <= a.trials[0].result.kernels);  // trial 0 is full
  CHECK(best.passes.size() < full.size());                    // some pass of full changes nothing here

  // The best pipeline's graph computes what the original does (reference interpreter).
  Model tuned = run_passes(best.passes);
  TensorMap feeds;
  for (auto& name : original.graph.inputs()) {
    const TensorType& t = original.graph.type(name);
    Tensor x(t.dtype, t.static_shape());
    if (t.dtype == DType::Int64)
      for (int64_t i = 0; i < x.numel(); ++i) x.data<int64_t>()[i] = i % 7;
    feeds[name] = x;
  }
  TensorMap want = Interpreter(original.graph).run(feeds);
  TensorMap got = Interpreter(tuned.graph).run(feeds);
  REQUIRE(want.size() == got.size());
  for (auto& [name, w] : want) {
    REQUIRE(got.count(name));
    auto wv = w.to_float_vector(), gv = got.at(name).to_float_vector();
    REQUIRE(wv.size() == gv.size());
    for (size_t i = 0; i < wv.size(); ++i) CHECK(gv[i] == Approx(wv[i]).epsilon(1e-4).margin(1e-5));
  }
}
