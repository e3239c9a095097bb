#include "rewrite/passes_util.h"

#include "graph/error.h"
#include "graph/op_registry.h"
#include "rewrite/passes.h"

namespace nnfuse {

void register_structural_passes() {
  static bool done = false;
  if (done) return;
  done = true;
  passes::register_constant_folding_pass();
  passes::register_dce_pass();
  passes::register_cse_pass();
  passes::register_shape_simplification_pass();
  passes::register_fold_batchnorm_pass();
  passes::register_combine_parallel_passes();
  passes::register_fold_transpose_into_gemm_pass();
  passes::register_decompose_attention_pass();
  passes::register_decompose_rms_norm_pass();
  passes::register_decompose_rotary_embedding_pass();
  passes::register_qdq_to_float_pass();
}

namespace passes {

bool single_use(const Graph& g, const std::string& v) { return g.consumers(v).size() == 1 && !g.is_output(v); }

bool is_random_op(const Node& n) {
  static const char* kRandom[] = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                                  "Bernoulli"};
  if (!n.domain.empty()) return false;
  for (const char* r : kRandom)
    if (n.op_type == r) return true;
  // Dropout in training mode draws a random mask; in inference it is Identity (handled elsewhere).
  return n.op_type == "Dropout";
}

bool has_subgraph(const Node& n) {
  for (auto& [k, a] : n.attrs.all())
    if (a.kind == Attribute::Kind::Graph || a.kind == Attribute::Kind::Graphs) return true;
  return false;
}

namespace {
// Names a body reads from enclosing scopes, including those read by bodies nested in it.
void collect_outer_reads(const Graph& body, std::set<std::string>& out) {
  for (auto& r : body.outer_references()) out.insert(r);
  std::set<std::string> defined;
  for (auto& v : body.value_names())
    if (body.producer(v) || body.is_input(v) || body.is_initializer(v)) defined.insert(v);
  std::set<std::string> inner;
  for (NodeId id : body.node_ids())
    for (auto& [k, a] : body.node(id).attrs.all()) {
      if (a.kind == Attribute::Kind::Graph && a.g) collect_outer_reads(*a.g, inner);
      if (a.kind == Attribute::Kind::Graphs)
        for (auto& b : a.graphs)
          if (b) collect_outer_reads(*b, inner);
    }
  for (auto& v : inner)
    if (!defined.count(v)) out.insert(v);
}
}  // namespace

std::set<std::string> subgraph_reads(const Node& n) {
  std::set<std::string> reads;
  for (auto& [k, a] : n.attrs.all()) {
    if (a.kind == Attribute::Kind::Graph && a.g) collect_outer_reads(*a.g, reads);
    if (a.kind == Attribute::Kind::Graphs)
      for (auto& b : a.graphs)
        if (b) collect_outer_reads(*b, reads);
  }
  return reads;
}

std::set<std::string> names_read_by_subgraphs(const Graph& g) {
  std::set<std::string> reads;
  for (NodeId id : g.node_ids())
    if (has_subgraph(g.node(id))) reads.merge(subgraph_reads(g.node(id)));
  return reads;
}

bool can_redirect(const Graph& g, const std::string& from, const std::string& to) {
  if (!g.is_output(from)) return true;
  if (g.is_output(to) || g.is_input(to)) return false;
  if (g.is_initializer(to)) return true;
  return g.producer(to).has_value();
}

void redirect(Graph& g, std::string from, std::string to) {
  if (!g.is_output(from)) {
    g.replace_all_uses(from, to);
    return;
  }
  if (!can_redirect(g, from, to))
    fail(ErrorKind::Invalid, "cannot redirect graph output '" + from + "' to '" + to + "'");
  if (g.is_initializer(to)) {
    // The output keeps its name as an initializer sharing the data; its readers keep reading it.
    g.set_initializer(from, g.initializer(to));
    return;
  }
  // Rebuild the producer of `to` so that it produces `from`; readers of `to` follow.
  NodeId p = *g.producer(to);
  g.replace_all_uses(to, from);
  Node old = g.node(p);
  g.remove_node(p, /*drop_outputs=*/false);
  std::vector<std::string> outs = old.outputs;
  for (auto& o : outs)
    if (o == to) o = from;
  NodeId n = g.add_node(old.op_type, old.inputs, outs, old.attrs, old.name, old.domain);
  if (!old.doc.empty()) g.set_node_doc(n, old.doc);
}

bool bypass_node(Graph& g, NodeId id, std::string in, std::string out) {
  if (in.empty() || out.empty() || !can_redirect(g, out, in)) return false;
  g.remove_node(id, /*drop_outputs=*/false);
  redirect(g, out, in);
  return true;
}

std::string add_initializer(Graph& g, const std::string& hint, Tensor t) {
  std::string name = g.fresh_name(hint);
  g.set_initializer(name, std::move(t));
  return name;
}

std::string NodeMaker::operator()(const std::string& type, const std::vector<std::string>& ins, Attributes attrs) const {
  std::string out = g.fresh_name(base + "/" + type);
  g.add_node(type, ins, {out}, std::move(attrs), g.fresh_name(base + "/" + type));
  return out;
}

std::string NodeMaker::ints(const std::string& hint, const std::vector<int64_t>& v) const {
  Tensor t(DType::Int64, {int64_t(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return add_initializer(g, base + "/" + hint, std::move(t));
}

std::string NodeMaker::scalar(const std::string& hint, float v) const {
  Tensor t(DType::Float32, Shape{});
  t.data<float>()[0] = v;
  return add_initializer(g, base + "/" + hint, std::move(t));
}

void rewrite_each(PassContext& ctx, const std::string& op, const std::string& pass, const std::function<bool(Graph&, NodeId)>& apply) {
  Graph& g = ctx.graph();
  int done = 0;
  for (NodeId id : g.topo_order())
    if (g.has_node(id) && g.node(id).op_type == op && g.node(id).domain.empty() && apply(g, id)) ++done;
  if (done) {
    g.prune_values();
    ctx.rules_fired[pass] += done;
  }
}

std::optional<std::vector<Tensor>> evaluate_constant_node(const Graph& g, NodeId id, PassContext* ctx) {
  const Node& n = g.node(id);
  std::vector<const Tensor*> ins;
  for (auto& i : n.inputs) {
    if (i.empty()) {
      ins.push_back(nullptr);
      continue;
    }
    const Tensor* t = g.constant_value(i);
    if (!t) return std::nullopt;
    ins.push_back(t);
  }
  try {
    std::vector<Tensor> outs = run_node(n, g.opset(n.domain), ins);
    for (auto& t : outs)
      if (!t.is_tensor()) return std::nullopt;  // a sequence or optional cannot become an initializer
    return outs;
  } catch (const Error& e) {
    if (ctx) ctx->warnings.push_back("constant evaluation of " + n.op_type + " node '" + n.label() + "' failed: " + e.detail());
    return std::nullopt;
  }
}

void replace_by_constants(Graph& g, NodeId id, const std::vector<Tensor>& results) {
  Node old = g.node(id);
  // Outputs nothing reads still become initializers: a subgraph body may read them by name
  // (dce removes the rest).
  g.remove_node(id, /*drop_outputs=*/false);
  for (size_t k = 0; k < old.outputs.size() && k < results.size(); ++k)
    if (!old.outputs[k].empty()) g.set_initializer(old.outputs[k], results[k]);
}

bool same_runtime_type(const TensorType& a, const TensorType& b) {
  if (a.dtype != b.dtype || !a.has_shape || !b.has_shape || a.dims.size() != b.dims.size()) return false;
  for (size_t i = 0; i < a.dims.size(); ++i) {
    const Dim &x = a.dims[i], &y = b.dims[i];
    if (x.known() != y.known()) return false;
    if (x.known() ? x.value != y.value : (x.symbol.empty() || x.symbol != y.symbol)) return false;
  }
  return true;
}

size_t count_ops(const Graph& g) {
  size_t n = 0;
  for (NodeId id : g.node_ids())
    if (g.node(id).op_type != "Constant") ++n;
  return n;
}

}  // namespace passes
}  // namespace nnfuse
