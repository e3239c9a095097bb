// If, Loop and Scan bodies compiled as models of their own (CpuModel::compile_bodies, body runner,
// save/load).
//
// Control flow runs alone in its fusion block (fusion/target.cpp) and such a block is a Fallback
// stage: the reference interpreter ran its bodies node by node, so a model whose work sits inside
// an If (a VAD exported with its sample-rate switch) or a Loop ran on reference kernels. Here each
// body is compiled like any model: its inputs typed from the node where the body leaves them open
// (a Loop's iteration number, condition and carried values), the outer values it reads as inputs
// too (outer weights become its own), shapes inferred again, planned, fused and generated,
// recursively for control flow nested in it. The op itself still runs in the reference kernels
// (lowering/stage_reference.cpp): they hand every body they run to the runner here, which runs
// the compiled body instead when the feeds have the shapes it was compiled for (else the
// interpreter runs it, as before). So the ops' semantics (trip counts, conditions, scan outputs,
// limits) stay in one place, graph/ops_control.cpp.
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "fusion/planner.h"
#include "fusion/target.h"
#include "graph/error.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"
#include "kernels/cpu_model.h"

namespace fs = std::filesystem;

namespace nnfuse {

namespace {

bool is_control_flow(const std::string& op) { return op == "If" || op == "Loop" || op == "Scan"; }

std::vector<std::string> body_attrs(const std::string& op) {
  if (op == "If") return {"then_branch", "else_branch"};
  return {"body"};
}

const Graph* body_of(const Node& n, const std::string& attr) {
  const Attribute* a = n.attrs.find(attr);
  return a && a->kind == Attribute::Kind::Graph && a->g ? a->g.get() : nullptr;
}

// Calls f(node id, node, attribute) for every body of the stage's control-flow nodes; true when
// the stage holds control flow only and f returned true for every body.
template <class F>
bool all_bodies(const Graph& g, const Stage& st, F&& f) {
  bool all = true, any = false;
  for (NodeId id : st.nodes) {
    const Node& n = g.node(id);
    if (!is_control_flow(n.op_type)) {
      all = false;
      continue;
    }
    any = true;
    for (const std::string& attr : body_attrs(n.op_type)) all = f(id, n, attr) && all;
  }
  return all && any;
}

// A body doing less work than this stays interpreted: compiling it costs seconds and saves
// microseconds (shape arithmetic in an If, a counter in a Loop). The VAD branch of the tests does
// about 2 MFLOP, the tf2onnx Loop RNN's step 57 kFLOP.
constexpr double kMinBodyFlops = 10e3;

// A scalar's type as the body declares it: [] or [1] (how the ops feed it, body_scalar).
TensorType scalar_like(DType d, const TensorType& declared) {
  return declared.has_shape && declared.rank() == 1 ? TensorType(d, {Dim(1)}) : TensorType(d, {});
}

// The body of `attr` of node `n` (in `outer`) as a standalone model.
Graph body_model(const Graph& outer, const Node& n, const Graph& body, const std::string& name) {
  Graph g = body;
  g.is_subgraph = false;
  g.name = name;
  if (g.opset_imports.empty()) g.opset_imports = outer.opset_imports;
  const auto& ins = body.inputs();
  for (size_t k = 0; k < ins.size(); ++k) {
    const TensorType& declared = body.type(ins[k]);
    if (declared.is_static()) continue;
    TensorType t = declared;
    if (n.op_type == "Loop") {
      // (iteration number, condition, carried values...): the carried ones enter as the node's inputs.
      if (k == 0) t = scalar_like(DType::Int64, declared);
      else if (k == 1) t = scalar_like(DType::Bool, declared);
      else if (k < n.inputs.size() && !n.inputs[k].empty()) t = outer.type(n.inputs[k]);
    }
    if (!t.is_static()) fail(ErrorKind::Unsupported, "its input '" + ins[k] + "' has no static shape (" + declared.str() + ")");
    g.set_type(ins[k], t);
  }
  for (const std::string& r : body.outer_references()) {
    if (!outer.has_value(r)) fail(ErrorKind::Unsupported, "it reads '" + r + "' from a scope further out");
    if (const Tensor* t = outer.constant_value(r); t && !outer.is_input(r)) {
      g.set_initializer(r, *t);
      continue;
    }
    const TensorType& t = outer.type(r);
    if (!t.is_static()) fail(ErrorKind::Unsupported, "it reads '" + r + "', which has no static shape (" + t.str() + ")");
    g.add_input(r, t);
  }
  InferOptions io;
  infer_shapes(g, io);
  for (const std::string& o : g.outputs())
    if (!g.type(o).is_static()) fail(ErrorKind::Unsupported, "its output '" + o + "' has no static shape (" + g.type(o).str() + ")");
  if (n.op_type == "Loop")
    for (size_t k = 2; k < ins.size() && k - 1 < g.outputs().size(); ++k)
      if (!(g.type(g.outputs()[k - 1]) == g.type(ins[k])))
        fail(ErrorKind::Unsupported, "loop-carried '" + ins[k] + "' enters as " + g.type(ins[k]).str() + " and leaves as " +
                                         g.type(g.outputs()[k - 1]).str());
  return g;
}

}  // namespace

void CpuModel::compile_bodies(const CpuCompileOptions& o) {
  if (const char* e = std::getenv("NNFUSE_COMPILED_BODIES"); !o.compile_bodies || (e && std::string(e) == "0")) return;
  nlohmann::json report = nlohmann::json::array();
  CpuCompileOptions co = o;
  co.progress = nullptr;
  PlanOptions po;
  po.profile = o.measure;
  for (size_t i = 0; i < mod_.stages.size(); ++i) {
    const Stage& st = mod_.stages[i];
    if (st.kind != StageKind::Fallback) continue;
    all_bodies(mod_.graph, st, [&](NodeId id, const Node& n, const std::string& attr) {
      nlohmann::json row = {{"stage", st.name}, {"node", n.name}, {"op", n.op_type}, {"body", attr}};
      bool ok = false;
      try {
        const Graph* body = body_of(n, attr);
        if (!body) fail(ErrorKind::Model, "no graph attribute '" + attr + "'");
        Graph g = body_model(mod_.graph, n, *body, st.name + "_" + attr);
        if (const double f = graph_flops(g); f < kMinBodyFlops)
          fail(ErrorKind::Unsupported, "too little work to pay for a compile (" + std::to_string(int64_t(f)) + " FLOPs)");
        FusionPlan plan = plan_fusion(g, target_by_name(o.target), po);
        CompiledBody c{i, id, attr, body, build(g, &plan, co)};
        c.model->pool_ = pool_;
        row["compiled"] = ok = true;
        row["kernels"] = c.model->mod_.blocks;
        row["fallback_blocks"] = c.model->fallback_blocks();
        bodies_.push_back(std::move(c));
      } catch (const Error& e) {
        row["compiled"] = false;
        row["reason"] = e.what();
      }
      report.push_back(row);
      return ok;
    });
  }
  mark_compiled_stages();
  if (!report.empty()) build_info_["bodies"] = report;
}

int CpuModel::fallback_blocks() const {
  int n = mod_.fallback_blocks - int(compiled_stages_.size());
  for (auto& b : bodies_)
    if (compiled_stages_.count(b.stage)) n += b.model->fallback_blocks();
  return n;
}

void CpuModel::body_summary(nlohmann::json& mem) const {
  if (compiled_stages_.empty()) return;
  mem["fallback_blocks"] = fallback_blocks();
  mem["generated_blocks"] = mod_.blocks - mod_.fallback_blocks + int(compiled_stages_.size());
  mem["compiled_control_flow_blocks"] = compiled_stages_.size();
  // What runs on reference kernels: this model's fallback stages but those whose bodies are all
  // compiled, and what those bodies list (stage names prefixed with the node's stage and body).
  nlohmann::json reasons = nlohmann::json::array();
  std::set<std::string> ops;
  for (size_t i = 0; i < mod_.stages.size(); ++i) {
    const Stage& s = mod_.stages[i];
    if (s.kind != StageKind::Fallback || compiled_stages_.count(i)) continue;
    reasons.push_back({{"stage", s.name}, {"reason", s.fallback_reason}});
    for (NodeId id : s.nodes) ops.insert(mod_.graph.node(id).op_type);
  }
  for (auto& b : bodies_) {
    if (!compiled_stages_.count(b.stage)) continue;
    nlohmann::json sub = b.model->mod_.summary();
    b.model->body_summary(sub);
    for (auto& r : sub["fallback_reasons"])
      reasons.push_back({{"stage", mod_.stages[b.stage].name + "/" + b.attr + "/" + r["stage"].get<std::string>()}, {"reason", r["reason"]}});
    for (auto& op : sub["fallback_ops"]) ops.insert(op.get<std::string>());
  }
  mem["fallback_reasons"] = reasons;
  mem["fallback_ops"] = std::vector<std::string>(ops.begin(), ops.end());
}

std::optional<std::vector<Tensor>> CpuModel::run_body(const Graph& body, const TensorMap& feeds) const {
  const CpuModel* m = nullptr;
  for (auto& b : bodies_)
    if (b.body == &body) m = b.model.get();
  if (!m) return std::nullopt;
  const Graph& g = m->mod_.graph;
  TensorMap f;
  for (const std::string& v : g.inputs()) {
    auto it = feeds.find(v);
    // Shapes other than the compiled ones (a carried value that grows): the interpreter runs it.
    if (it == feeds.end() || !it->second.is_tensor() || it->second.dtype() != g.type(v).dtype || it->second.shape() != g.type(v).static_shape()) return std::nullopt;
    f.emplace(v, it->second);
  }
  TensorMap outs = m->run(f);
  std::vector<Tensor> r;
  for (const std::string& o : g.outputs()) r.push_back(outs.at(o));
  return r;
}

nlohmann::json CpuModel::save_bodies(const std::string& dir, const Graph& saved) const {
  nlohmann::json list = nlohmann::json::array();
  for (size_t k = 0; k < bodies_.size(); ++k) {
    const CompiledBody& b = bodies_[k];
    const std::string sub = "bodies/" + std::to_string(k);
    b.model->save((fs::path(dir) / sub).string());
    list.push_back({{"node", saved.node(b.node).name}, {"attr", b.attr}, {"dir", sub}});
  }
  return list;
}

void CpuModel::load_bodies(const nlohmann::json& list, const std::string& dir, int threads) {
  std::map<std::string, NodeId> by_name;
  for (NodeId id : mod_.graph.node_ids()) by_name[mod_.graph.node(id).name] = id;
  std::map<NodeId, size_t> stage_of;
  for (size_t i = 0; i < mod_.stages.size(); ++i)
    if (mod_.stages[i].kind == StageKind::Fallback)
      for (NodeId id : mod_.stages[i].nodes) stage_of[id] = i;
  for (auto& e : list) {
    const std::string node = e.at("node").get<std::string>(), attr = e.at("attr").get<std::string>(), rel = e.at("dir").get<std::string>();
    if (rel.empty() || rel.find("..") != std::string::npos || fs::path(rel).is_absolute())
      fail(ErrorKind::Io, "artifact plan: body folder '" + rel + "' is outside the artifact");
    auto it = by_name.find(node);
    if (it == by_name.end() || !stage_of.count(it->second) || !is_control_flow(mod_.graph.node(it->second).op_type))
      fail(ErrorKind::Io, "artifact plan: bodies name node '" + node + "', which is no If, Loop or Scan of the model run on its own");
    const Node& n = mod_.graph.node(it->second);
    const Graph* body = body_of(n, attr);
    if (!body) fail(ErrorKind::Io, "artifact plan: node '" + node + "' has no body '" + attr + "'");
    CompiledBody c{stage_of.at(it->second), it->second, attr, body, load((fs::path(dir) / rel).string(), threads)};
    c.model->pool_ = pool_;
    bodies_.push_back(std::move(c));
  }
  mark_compiled_stages();
}

void CpuModel::mark_compiled_stages() {
  compiled_stages_.clear();
  for (size_t i = 0; i < mod_.stages.size(); ++i) {
    if (mod_.stages[i].kind != StageKind::Fallback) continue;
    const bool all = all_bodies(mod_.graph, mod_.stages[i], [&](NodeId m, const Node&, const std::string& attr) {
      for (auto& b : bodies_)
        if (b.node == m && b.attr == attr) return true;
      return false;
    });
    if (all) compiled_stages_.insert(i);
  }
}

}  // namespace nnfuse
