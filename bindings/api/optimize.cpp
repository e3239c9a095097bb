#include "api/optimize.h"

#include <chrono>
#include <filesystem>
#include <mutex>
#include <unistd.h>

#include "fusion/fusion_pass.h"
#include "fusion/plan_report.h"
#include "graph/op_registry.h"
#include "rewrite/passes.h"
#include "rewrite/rule_passes.h"


namespace nnfuse {

void register_all_passes() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_structural_passes();
    register_rule_passes();
    register_fusion_passes();
  });
}

std::string data_dir() {
  // One lookup for every shipped data file: the directory that holds rules/ (see shipped_rules_dir).
  return std::filesystem::path(shipped_rules_dir()).parent_path().string();
}

size_t count_operators(const Graph& g) {
  size_t n = 0;
  for (NodeId id : g.node_ids()) n += g.node(id).op_type != "Constant";
  return n;
}

double total_flops(const Graph& g) {
  double f = 0;
  for (NodeId id : g.node_ids()) {
    if (g.node(id).op_type == "Constant") continue;
    try {
      f += node_flops(g, id);
    } catch (const Error&) {
      // An op with symbolic shapes or no FLOP count adds nothing (the report says FLOPs are a lower bound).
    }
  }
  return f;
}

static Pipeline load_named_pipeline(const std::string& name) {
  std::string path = data_dir() + "/rules/pipelines/" + name + ".pipeline";
  if (!std::filesystem::exists(path)) {
    std::string known;
    std::error_code ec;
    for (auto& e : std::filesystem::directory_iterator(data_dir() + "/rules/pipelines", ec))
      if (e.path().extension() == ".pipeline") known += (known.empty() ? "" : ", ") + e.path().stem().string();
    fail(ErrorKind::Invalid, "unknown pipeline '" + name + "' (pipelines: auto, none" + (known.empty() ? "" : ", " + known) + ")");
  }
  return load_pipeline_file(path);
}

Pipeline resolve_pipeline(const std::string& name, const std::string& file, const Classification& c) {
  if (!file.empty()) return load_pipeline_file(file);
  if (name == "none") {
    Pipeline p;
    p.name = "none";
    return p;
  }
  if (name != "auto") return load_named_pipeline(name);
  if (c.primary == "generic") return load_named_pipeline("full");
  Pipeline p = load_named_pipeline(c.primary);
  if (c.secondary.empty() || c.secondary == c.primary) return p;
  // A hybrid runs the union: the primary class's passes, then the secondary's that are missing,
  // before fusion planning (which must see the fully rewritten graph). A pass in both runs what
  // either runs (e.g. the union of their rules-recognition only= lists).
  Pipeline s = load_named_pipeline(c.secondary);
  std::vector<PipelineStep> merged;
  std::vector<PipelineStep> tail;
  for (auto& st : p.steps) (st.pass == "fusion-plan" ? tail : merged).push_back(st);
  for (auto& st : s.steps) {
    if (st.pass == "fusion-plan") continue;
    bool present = false;
    for (auto& m : merged)
      if (m.pass == st.pass) present = true, m.args = unite_step_args(m.args, st.args);
    if (!present) merged.push_back(st);
  }
  merged.insert(merged.end(), tail.begin(), tail.end());
  p.steps = merged;
  p.name = p.name + "+" + s.name;
  return p;
}

OptimizeResult optimize(Model& m, const OptimizeOptions& opt) {
  using nlohmann::json;
  register_all_passes();
  auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_ms();
  OptimizeResult r;
  Graph& g = m.graph;
  size_t ops_before = count_operators(g);
  r.classification = classify(g);
  double flops_before = r.classification.features.flops;  // total_flops(g), counted while classifying
  r.pipeline = resolve_pipeline(opt.pipeline, opt.pipeline_file, r.classification);

  PassContext ctx;
  ctx.model = &m;
  ctx.target = opt.target;
  ctx.verify = opt.verify;
  ctx.user_rule_files = opt.rule_files;
  ctx.valid.insert("shapes");  // imported models are inferred on load
  if (!opt.profile) ctx.artifacts["no_profile"] = true;
  if (!opt.profile_cache.empty()) ctx.artifacts["profile_cache"] = opt.profile_cache;
  r.passes = PassManager().run(r.pipeline, ctx);
  if (auto it = ctx.artifacts.find("fusion_plan"); it != ctx.artifacts.end())
    r.plan = std::move(*std::any_cast<FusionPlan>(&it->second));  // ctx ends here: move, do not copy

  size_t ops_after = count_operators(g);
  json rep;
  rep["model"] = m.path.empty() ? g.name : m.path;
  rep["target"] = opt.target;
  rep["ops_before"] = ops_before;
  rep["ops_after_rewrite"] = ops_after;
  rep["flops_before"] = flops_before;
  rep["flops_after"] = total_flops(g);
  const Classification& c = r.classification;
  rep["network_class"] = c.primary;
  rep["network_class_secondary"] = c.secondary.empty() ? json(nullptr) : json(c.secondary);
  const GraphFeatures& f = c.features;
  rep["classification"] = {
      {"confidence", c.confidence},
      {"reasons", c.reasons},
      {"features",
       {{"ops", f.ops}, {"convs", f.convs}, {"depthwise_convs", f.depthwise_convs}, {"grouped_convs", f.grouped_convs},
        {"pointwise_convs", f.pointwise_convs}, {"transposed_convs", f.transposed_convs}, {"residual_joins", f.residual_joins},
        {"matmuls", f.matmuls}, {"attention_blocks", f.attention_blocks}, {"causal_masks", f.causal_masks}, {"nms", f.nms},
        {"recurrent", f.recurrent}, {"batch_norms", f.batch_norms}, {"layer_norms", f.layer_norms},
        {"decomposed_layer_norms", f.decomposed_layer_norms}, {"instance_norms", f.instance_norms},
        {"group_norms", f.group_norms}, {"embeddings", f.embeddings}, {"conv_flop_share", f.conv_flop_share},
        {"matmul_flop_share", f.matmul_flop_share}, {"recurrent_flop_share", f.recurrent_flop_share}}}};
  rep["pipeline_name"] = r.pipeline.name;
  json names = json::array(), passes = json::array();
  for (auto& p : r.passes) {
    names.push_back(p.name);
    passes.push_back({{"name", p.name}, {"ms", p.ms}, {"cpu_ms", p.cpu_ms}, {"changed", p.changed}, {"args", p.args}, {"auto_inserted", p.auto_inserted},
                      {"nodes_before", p.nodes_before}, {"nodes_after", p.nodes_after}});
  }
  rep["pipeline"] = names;
  rep["passes"] = passes;
  rep["rules_fired"] = json(ctx.rules_fired);
  if (r.plan) {
    json pj = plan_to_json(g, *r.plan);
    rep["kernels"] = std::move(pj["kernels"]);
    rep["blocks"] = std::move(pj["blocks"]);  // moved, not copied: a BERT-base plan has ~170 blocks
    rep["fusion_stats"] = std::move(pj["fusion_stats"]);
  } else {
    rep["kernels"] = ops_after;  // unfused: one kernel per operator
    rep["blocks"] = json::array();
  }
  rep["warnings"] = ctx.warnings;
  rep["optimize_ms"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  rep["optimize_cpu_ms"] = thread_cpu_ms() - cpu0;  // CPU time of the same span (see PassRecord::cpu_ms)
  r.report = std::move(rep);
  return r;
}

}  // namespace nnfuse
