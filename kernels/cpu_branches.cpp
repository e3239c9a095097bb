// If nodes with compiled branches (CpuModel::compile_branches, run_branch, save/load).
//
// Control flow runs alone in its fusion block (fusion/target.cpp) and such a block is a Fallback
// stage: the reference interpreter ran the taken branch node by node, so a model whose work sits
// inside an If (a VAD exported with its sample-rate switch) ran entirely on reference kernels.
// Here each branch of such an If is compiled as a model of its own: its outer-scope reads become
// inputs (outer weights stay weights), shapes are inferred from the outer graph's, and it is
// planned, fused and generated like any model, recursively for Ifs nested in it. At run time the
// stage reads the condition and runs the taken branch's compiled model on the outer buffers. A
// branch that cannot be compiled (shapes that only the run decides, an op without a lowering
// that fails the build) keeps the reference path; the report says which and why.
#include <cstdlib>
#include <filesystem>
#include <set>

#include "fusion/planner.h"
#include "fusion/target.h"
#include "graph/error.h"
#include "graph/shape_inference.h"
#include "kernels/cpu_model.h"

namespace fs = std::filesystem;

namespace nnfuse {

namespace {

const Graph* branch_body(const Graph& g, NodeId id, const char* which) {
  const Attribute* a = g.node(id).attrs.find(which);
  return a && a->kind == Attribute::Kind::Graph && a->g ? a->g.get() : nullptr;
}

// The body as a standalone model: outer weights (and Constant outputs) it reads become its own
// weights, the other outer values it reads its inputs, typed as the outer graph types them.
Graph branch_model(const Graph& outer, const Graph& body, const std::string& name) {
  Graph g = body;
  g.is_subgraph = false;
  g.name = name;
  if (g.opset_imports.empty()) g.opset_imports = outer.opset_imports;
  for (const std::string& r : body.outer_references()) {
    if (!outer.has_value(r)) fail(ErrorKind::Unsupported, "it reads '" + r + "' from a scope further out");
    if (const Tensor* t = outer.constant_value(r); t && !outer.is_input(r)) {
      g.set_initializer(r, *t);
      continue;
    }
    const TensorType& t = outer.type(r);
    if (!t.has_shape || !t.is_static()) fail(ErrorKind::Unsupported, "its input '" + r + "' has no static shape (" + t.str() + ")");
    g.add_input(r, t);
  }
  InferOptions io;
  infer_shapes(g, io);
  for (const std::string& o : g.outputs())
    if (!g.type(o).has_shape || !g.type(o).is_static())
      fail(ErrorKind::Unsupported, "its output '" + o + "' has no static shape (" + g.type(o).str() + ")");
  return g;
}

}  // namespace

void CpuModel::compile_branches(const CpuCompileOptions& o) {
  if (const char* e = std::getenv("NNFUSE_COMPILED_BRANCHES"); !o.compile_branches || (e && std::string(e) == "0")) return;
  nlohmann::json report = nlohmann::json::array();
  for (size_t i = 0; i < mod_.stages.size(); ++i) {
    const Stage& st = mod_.stages[i];
    if (st.kind != StageKind::Fallback || st.nodes.size() != 1 || mod_.graph.node(st.nodes[0]).op_type != "If") continue;
    const NodeId id = st.nodes[0];
    const Node& n = mod_.graph.node(id);
    nlohmann::json row = {{"stage", st.name}, {"node", n.name}};
    try {
      CompiledIf c;
      CpuCompileOptions co = o;
      co.progress = nullptr;
      for (const char* which : {"then_branch", "else_branch"}) {
        const Graph* body = branch_body(mod_.graph, id, which);
        if (!body) fail(ErrorKind::Model, std::string("no ") + which);
        Graph g = branch_model(mod_.graph, *body, st.name + "_" + which);
        PlanOptions po;
        po.profile = o.measure;
        FusionPlan plan = plan_fusion(g, target_by_name(o.target), po);
        std::unique_ptr<CpuModel> child = build(g, &plan, co);
        child->pool_ = pool_;
        row[which] = {{"kernels", child->mod_.blocks}, {"fallback_blocks", child->fallback_blocks()}};
        (std::string(which) == "then_branch" ? c.then_m : c.else_m) = std::move(child);
      }
      bind_branch(i, c);
      row["compiled"] = true;
      branches_[i] = std::move(c);
    } catch (const Error& e) {
      row["compiled"] = false;
      row["reason"] = e.what();
    }
    report.push_back(row);
  }
  if (!report.empty()) build_info_["branches"] = report;
}

int CpuModel::fallback_blocks() const {
  int n = mod_.fallback_blocks;
  for (auto& [stage, c] : branches_) n += -1 + c.then_m->fallback_blocks() + c.else_m->fallback_blocks();
  return n;
}

void CpuModel::branch_summary(nlohmann::json& mem) const {
  if (branches_.empty()) return;
  mem["fallback_blocks"] = fallback_blocks();
  mem["generated_blocks"] = mod_.blocks - mod_.fallback_blocks + int(branches_.size());
  mem["compiled_if_blocks"] = branches_.size();
  // What runs on reference kernels: this model's fallback stages but the compiled Ifs, and what
  // the branches' own reports list (stage names prefixed with the If's stage and branch).
  nlohmann::json reasons = nlohmann::json::array();
  std::set<std::string> ops;
  for (size_t i = 0; i < mod_.stages.size(); ++i) {
    const Stage& s = mod_.stages[i];
    if (s.kind != StageKind::Fallback || branches_.count(i)) continue;
    reasons.push_back({{"stage", s.name}, {"reason", s.fallback_reason}});
    for (NodeId id : s.nodes) ops.insert(mod_.graph.node(id).op_type);
  }
  for (auto& [stage, c] : branches_)
    for (auto [which, m] : {std::pair<const char*, const CpuModel*>{"then", c.then_m.get()}, {"else", c.else_m.get()}}) {
      nlohmann::json sub = m->mod_.summary();
      m->branch_summary(sub);
      for (auto& r : sub["fallback_reasons"])
        reasons.push_back({{"stage", mod_.stages[stage].name + "/" + which + "/" + r["stage"].get<std::string>()}, {"reason", r["reason"]}});
      for (auto& o : sub["fallback_ops"]) ops.insert(o.get<std::string>());
    }
  mem["fallback_reasons"] = reasons;
  mem["fallback_ops"] = std::vector<std::string>(ops.begin(), ops.end());
}

bool CpuModel::run_branch(size_t stage, const std::function<Tensor(int)>& input, const std::function<void(int, const Tensor&)>& output) const {
  auto it = branches_.find(stage);
  if (it == branches_.end()) return false;
  const CompiledIf& c = it->second;
  const Tensor cond = input(c.cond);
  if (cond.numel() != 1)
    fail(ErrorKind::Runtime, "stage " + mod_.stages[stage].name + " (If): cond must hold one element, got shape " + shape_str(cond.shape()));
  const bool taken = cond.as_double(0) != 0;
  const CpuModel& m = taken ? *c.then_m : *c.else_m;
  TensorMap feeds;
  for (auto& [v, b] : taken ? c.then_inputs : c.else_inputs) feeds[v] = input(b);
  TensorMap outs = m.run(feeds);
  const auto& names = m.mod_.graph.outputs();
  for (size_t k = 0; k < c.outputs.size(); ++k)
    if (c.outputs[k] >= 0) output(c.outputs[k], outs.at(names[k]));
  return true;
}

void CpuModel::bind_branch(size_t stage, CompiledIf& c) const {
  const std::string& name = mod_.stages[stage].name;
  const Node& n = mod_.graph.node(mod_.stages[stage].nodes[0]);
  auto buffer = [&](const std::string& v) {
    const int b = mod_.buffer_id(v);
    if (b < 0) fail(ErrorKind::Runtime, "stage " + name + " (If): '" + v + "' has no buffer");
    return b;
  };
  c.cond = buffer(n.inputs.at(0));
  c.outputs.clear();
  for (auto& o : n.outputs) c.outputs.push_back(o.empty() ? -1 : buffer(o));
  for (auto [m, in] : {std::pair{c.then_m.get(), &c.then_inputs}, {c.else_m.get(), &c.else_inputs}}) {
    if (m->mod_.graph.outputs().size() != n.outputs.size())
      fail(ErrorKind::Model, "stage " + name + " (If): a branch gives " + std::to_string(m->mod_.graph.outputs().size()) + " outputs, the node has " +
                                 std::to_string(n.outputs.size()));
    in->clear();
    for (const std::string& v : m->mod_.graph.inputs()) in->emplace_back(v, buffer(v));
  }
}

nlohmann::json CpuModel::save_branches(const std::string& dir) const {
  nlohmann::json list = nlohmann::json::array();
  for (auto& [stage, c] : branches_) {
    const std::string& name = mod_.stages[stage].name;
    const std::string then_dir = "branches/" + name + "_then", else_dir = "branches/" + name + "_else";
    c.then_m->save((fs::path(dir) / then_dir).string());
    c.else_m->save((fs::path(dir) / else_dir).string());
    list.push_back({{"stage", name}, {"then", then_dir}, {"else", else_dir}});
  }
  return list;
}

void CpuModel::load_branches(const nlohmann::json& list, const std::string& dir, int threads) {
  for (auto& b : list) {
    const std::string name = b.at("stage").get<std::string>();
    for (const char* which : {"then", "else"}) {
      const std::string rel = b.at(which).get<std::string>();
      if (rel.empty() || rel.find("..") != std::string::npos || fs::path(rel).is_absolute())
        fail(ErrorKind::Io, "artifact plan: branch folder '" + rel + "' is outside the artifact");
    }
    size_t i = 0;
    while (i < mod_.stages.size() && mod_.stages[i].name != name) ++i;
    if (i == mod_.stages.size()) fail(ErrorKind::Io, "artifact plan: branches name stage '" + name + "', which the model does not have");
    const Stage& st = mod_.stages[i];
    if (st.kind != StageKind::Fallback || st.nodes.size() != 1 || mod_.graph.node(st.nodes[0]).op_type != "If")
      fail(ErrorKind::Io, "artifact plan: branches name stage '" + name + "', which is not an If");
    CompiledIf c;
    for (const char* which : {"then", "else"}) {
      std::unique_ptr<CpuModel> child = load((fs::path(dir) / b.at(which).get<std::string>()).string(), threads);
      child->pool_ = pool_;
      (std::string(which) == "then" ? c.then_m : c.else_m) = std::move(child);
    }
    bind_branch(i, c);
    branches_[i] = std::move(c);
  }
}

}  // namespace nnfuse
