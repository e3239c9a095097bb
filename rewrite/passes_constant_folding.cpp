// constant-folding: nodes whose inputs are all constant are evaluated once with the reference
// kernel and replaced by initializers; Constant nodes become initializers; an If with a constant
// condition is replaced by the branch it takes.
//
// Condition: every present input is a constant (an initializer that is not a graph input, or a
// Constant node's output); the op is deterministic and has no subgraph; the result is small
// (<= max_elements elements) and does not blow up compared to the inputs (ConstantOfShape,
// Expand, Tile or Range to a large tensor stay ops: materialising them costs memory and
// bandwidth for nothing).
// Apply: run the kernel, remove the node, give each output's name to an initializer.
#include "graph/op_registry.h"
#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

// Results up to this many elements may be larger than their inputs (shape arithmetic, small masks).
constexpr int64_t kSmallResult = 4096;

struct FoldLimits {
  int64_t max_elements = int64_t(1) << 20;
};

int64_t constant_input_elements(const Graph& g, const Node& n) {
  int64_t total = 0;
  for (auto& i : n.inputs)
    if (!i.empty())
      if (const Tensor* t = g.constant_value(i)) total += t->numel();
  return total;
}

bool output_too_big(int64_t out_elems, int64_t in_elems, const FoldLimits& lim) {
  if (out_elems > lim.max_elements) return true;
  return out_elems > kSmallResult && out_elems > in_elems;
}

bool condition(const Graph& g, const Node& n, const FoldLimits& lim) {
  if (n.op_type == "Constant" && n.domain.empty()) return true;
  if (n.num_present_inputs() == 0) return false;  // sources other than Constant (random generators)
  if (is_random_op(n) || has_subgraph(n)) return false;
  for (auto& i : n.inputs)
    if (!i.empty() && !g.constant_value(i)) return false;
  // Use the inferred output sizes, where known, to skip evaluating what would be rejected anyway.
  int64_t in_elems = constant_input_elements(g, n), out_elems = 0;
  for (auto& o : n.outputs) {
    if (o.empty()) continue;
    if (auto ne = g.type(o).numel()) out_elems += *ne;
  }
  return !output_too_big(out_elems, in_elems, lim);
}

bool apply(Graph& g, NodeId id, const FoldLimits& lim, PassContext& ctx) {
  const Node& n = g.node(id);
  int64_t in_elems = constant_input_elements(g, n);
  auto results = evaluate_constant_node(g, id, &ctx);
  if (!results) return false;
  int64_t out_elems = 0;
  for (auto& t : *results) out_elems += t.numel();
  if (n.op_type != "Constant" && output_too_big(out_elems, in_elems, lim)) return false;
  replace_by_constants(g, id, *results);
  return true;
}

// An If whose condition is a constant becomes the branch it takes: the branch's initializers and
// nodes join this graph under their own names (ONNX's scoping keeps them apart from this graph's;
// a branch with a name this graph already has stays an If), and an Identity gives each branch
// output the If output's name. Bodies nested in the branch read by name, so they are unchanged.
bool inline_constant_if(Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op_type != "If" || !n.domain.empty() || n.inputs.empty() || n.inputs[0].empty()) return false;
  const Tensor* cond = g.constant_value(n.inputs[0]);
  if (!cond || cond->numel() != 1) return false;
  const Attribute* a = n.attrs.find(cond->as_double(0) != 0 ? "then_branch" : "else_branch");
  if (!a || a->kind != Attribute::Kind::Graph || !a->g) return false;
  const std::shared_ptr<Graph> keep = a->g;  // the node (and its attribute) is removed below
  const Graph& b = *keep;
  if (!b.inputs().empty() || b.outputs().size() != n.outputs.size()) return false;
  for (auto& v : b.value_names())
    if ((b.producer(v) || b.is_initializer(v)) && g.has_value(v)) return false;
  const std::vector<std::string> outs = n.outputs;
  const std::string label = n.label();
  g.remove_node(id, /*drop_outputs=*/false);
  for (auto& w : b.initializer_names()) g.set_initializer(w, b.initializer(w));
  for (NodeId bid : b.topo_order()) {
    const Node& bn = b.node(bid);
    std::string name = bn.name;
    if (!name.empty() && g.find_node(name) != kNoNode) name = g.fresh_name(name);
    for (auto& o : bn.outputs)
      if (!o.empty()) g.declare_value(o, b.type(o));
    g.add_node(bn.op_type, bn.inputs, bn.outputs, bn.attrs, name, bn.domain);
  }
  for (size_t i = 0; i < outs.size(); ++i)
    if (!outs[i].empty()) g.add_node("Identity", {b.outputs()[i]}, {outs[i]}, {}, g.fresh_name(label + "_out" + std::to_string(i)));
  return true;
}

void run(PassContext& ctx, const PassArgs& args) {
  Graph& g = ctx.graph();
  FoldLimits lim;
  lim.max_elements = args.get_int("max_elements", lim.max_elements);
  int folded = 0, inlined = 0;
  // Topological order: a folded node's results make its consumers foldable in the same sweep.
  for (NodeId id : g.topo_order()) {
    if (!g.has_node(id)) continue;
    if (inline_constant_if(g, id)) {
      ++inlined;
      continue;
    }
    if (!condition(g, g.node(id), lim)) continue;
    if (apply(g, id, lim, ctx)) ++folded;
  }
  if (folded || inlined) g.prune_values();
  if (folded) ctx.rules_fired["constant-folding"] += folded;
  if (inlined) ctx.rules_fired["inline-constant-if"] += inlined;
}

}  // namespace

void register_constant_folding_pass() {
  PassInfo info{"constant-folding",
                "evaluate nodes whose inputs are all constant (results up to max_elements elements, default 1<<20) "
                "and turn Constant nodes into initializers",
                {"shapes"},
                {},
                false};
  info.bodies = true;
  info.check_args = [](const PassArgs& args) {
    for (auto& [key, value] : args.values)
      if (key != "max_elements") fail(ErrorKind::Invalid, "pass 'constant-folding': unknown argument '" + key + "' (arguments: max_elements=N)");
    args.get_int("max_elements", 0);
  };
  register_pass(info, run);
}

}  // namespace nnfuse::passes
