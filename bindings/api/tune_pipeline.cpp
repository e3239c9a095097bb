#include "api/tune_pipeline.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "api/compile.h"
#include "graph/error.h"
#include "graph/op_registry.h"

namespace nnfuse {

namespace {

int64_t value_bytes(const Graph& g, const std::string& name) {
  if (name.empty() || !g.has_value(name)) return 0;
  const TensorType& t = g.type(name);
  auto n = t.numel();
  return n ? *n * int64_t(dtype_size(t.dtype == DType::Undefined ? DType::Float32 : t.dtype)) : 0;
}

// Random inputs for latency trials: floats in [-1,1), integers in [0,10) (valid indices for
// every zoo embedding), from a fixed seed so every trial runs the same data.
TensorMap random_feeds(const Graph& g) {
  TensorMap feeds;
  std::mt19937_64 rng(0);
  for (auto& name : g.inputs()) {
    const TensorType& t = g.type(name);
    if (!t.is_static())
      fail(ErrorKind::Invalid, "objective latency: input '" + name + "' has shape " + t.str() + "; bind its dims with --shape");
    Tensor x(t.dtype, t.static_shape());
    int64_t n = x.numel();
    if (t.dtype == DType::Float32) {
      float* p = x.data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = float(double(rng() >> 11) / double(1ull << 53) * 2 - 1);
    } else if (t.dtype == DType::Int64) {
      int64_t* p = x.data<int64_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = int64_t(rng() % 10);
    } else if (t.dtype == DType::Int32) {
      int32_t* p = x.data<int32_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = int32_t(rng() % 10);
    }  // other dtypes stay zero (masks: all false)
    feeds[name] = x;
  }
  return feeds;
}

}  // namespace

double estimate_plan_cost_us(const Graph& g, const FusionPlan& plan, const TargetDesc& t) {
  double bw = std::max(1e-3, t.mem_gbps) * 1e9;                         // bytes/s
  double peak = std::max(1e-3, t.peak_gflops * std::max(1, t.cores)) * 1e9;  // FLOP/s
  double us = 0;
  for (auto& b : plan.blocks) {
    double bytes = 0, flops = 0;
    for (auto& v : b.inputs) bytes += double(value_bytes(g, v));
    for (auto& v : b.outputs) bytes += double(value_bytes(g, v));
    for (NodeId id : b.members) {
      try {
        flops += node_flops(g, id);
      } catch (const Error&) {
        // symbolic shapes or no FLOP count: the block's memory traffic still counts
      }
    }
    us += (bytes / bw + flops / peak) * 1e6;
  }
  return us;
}

TuneResult tune_pipeline(const Model& original, const TuneOptions& opt) {
  register_all_passes();
  if (opt.objective != "kernels" && opt.objective != "latency")
    fail(ErrorKind::Invalid, "unknown objective '" + opt.objective + "' (objectives: kernels, latency)");
  TargetDesc target = target_by_name(opt.target);
  if (opt.objective == "latency" && (opt.target == "reference" || target.family != "cpu"))
    fail(ErrorKind::Unsupported, "objective latency needs a compiled target with a code generator; target '" + opt.target +
                                     "' has none (CPU targets: host, x86-avx2, x86-avx512, arm-neon; or use --objective kernels)");

  TuneResult tr;
  tr.classification = classify(original.graph);
  Pipeline full = resolve_pipeline("full", "", tr.classification);
  SearchOptions so;
  so.fixed_tail = {"fusion-plan"};
  for (auto& st : full.steps)
    if (st.pass != "fusion-plan" && std::find(so.candidates.begin(), so.candidates.end(), st.pass) == so.candidates.end())
      so.candidates.push_back(st.pass);
  so.budget = opt.budget;
  so.seed = opt.seed;
  so.on_trial = opt.on_trial;
  // Measured latency is noisy too: with that objective only kernels and latency decide.
  so.time_tiebreak = opt.objective == "kernels";

  TensorMap feeds;
  if (opt.objective == "latency") feeds = random_feeds(original.graph);

  PipelineEvaluator eval = [&](const std::vector<std::string>& passes) {
    TrialResult r;
    Model m = original;
    Pipeline p;
    p.name = "trial";
    for (auto& s : passes) p.steps.push_back({s, {}, 0});
    for (auto& s : so.fixed_tail) p.steps.push_back({s, {}, 0});
    PassContext ctx;
    ctx.model = &m;
    ctx.target = opt.target;
    ctx.user_rule_files = opt.rule_files;
    ctx.valid.insert("shapes");  // imported models are inferred on load
    ctx.artifacts["no_profile"] = true;  // deterministic: undecided pairs by the cost model alone
    try {
      auto records = PassManager().run(p, ctx);
      for (auto& rec : records) r.ms += rec.ms;
      // Whatever the order, the result must be a well-formed graph with a consistent plan.
      m.graph.validate();
      auto it = ctx.artifacts.find("fusion_plan");
      if (it == ctx.artifacts.end()) fail(ErrorKind::Invalid, "no fusion plan produced");
      const FusionPlan& plan = std::any_cast<const FusionPlan&>(it->second);
      check_plan(m.graph, plan);
      r.kernels = plan.kernels();
      if (opt.objective == "latency") {
        CompileOptions co;
        co.target = opt.target;
        co.profile = false;  // the pipelines are compared under the same deterministic choices
        auto exe = compile(m, &plan, co);
        exe->run(feeds);  // warm-up
        std::vector<double> ms;
        for (int i = 0; i < std::max(1, opt.latency_runs); ++i) {
          auto t0 = std::chrono::steady_clock::now();
          exe->run(feeds);
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ms.begin(), ms.end());
        r.cost = ms[ms.size() / 2];
      } else {
        r.cost = estimate_plan_cost_us(m.graph, plan, target);
      }
      r.ok = true;
    } catch (const std::exception& e) {
      r.ok = false;
      r.error = e.what();
    }
    return r;
  };

  tr.search = search_pipeline(eval, so);
  tr.full = tr.search.trials.front().result;  // trial 0 is the baseline: full's passes in order
  tr.best = tr.search.best_pipeline;
  tr.best.network_class = tr.classification.primary;

  using nlohmann::json;
  json trials = json::array();
  for (auto& t : tr.search.trials)
    trials.push_back({{"trial", t.index}, {"phase", t.phase}, {"passes", t.passes}, {"ok", t.result.ok},
                      {"error", t.result.error}, {"kernels", t.result.kernels}, {"cost", t.result.cost},
                      {"ms", t.result.ms}, {"improved", t.improved}});
  const Trial& b = tr.search.best_trial();
  std::vector<std::string> best_names;
  for (auto& s : tr.best.steps) best_names.push_back(s.pass);
  tr.report = {{"model", original.path.empty() ? original.graph.name : original.path},
               {"network_class", tr.classification.primary},
               {"objective", opt.objective},
               {"cost_unit", opt.objective == "latency" ? "ms (measured median)" : "us (estimated from the fusion plan)"},
               {"target", opt.target},
               {"budget", opt.budget},
               {"seed", opt.seed},
               {"trials_run", tr.search.trials.size()},
               {"best", {{"trial", b.index}, {"pipeline", best_names}, {"kernels", b.result.kernels}, {"cost", b.result.cost}, {"ms", b.result.ms}}},
               {"full", {{"kernels", tr.full.kernels}, {"cost", tr.full.cost}, {"ms", tr.full.ms}, {"ok", tr.full.ok}}},
               {"trials", trials}};
  return tr;
}

}  // namespace nnfuse
