// shape-simplification: shape computations on static shapes become constants, and ops that
// provably do nothing are removed.
//
// - Shape of a value whose dims (in the selected start/end range) are all known -> constant.
//   Gather/Slice of a Shape whose selected dims are known -> constant even when other dims are
//   symbolic (PyTorch's `x.size(1)` on a dynamic-batch tensor).
//   Consumers that then have only constant inputs (Unsqueeze, Concat, Mul, ... of the chain) are
//   folded in turn, as long as their results stay small.
// - Reshape/Flatten/Squeeze/Unsqueeze/Expand/Tile whose output type equals the input's (known
//   dims, or equal symbols) are removed; Cast to the input's dtype, Identity and inference
//   Dropout are removed.
// Relies on the shapes property (infer_shapes) for the value types.
#include "graph/op_registry.h"
#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

// Results of a folded shape chain stay below this many elements.
constexpr int64_t kChainElements = 4096;

// The dims a Shape node reads (start/end from opset 15), unknown dims as nullopt; nullopt when
// the rank is unknown.
std::optional<std::vector<std::optional<int64_t>>> shape_node_dims(const Graph& g, const Node& shape) {
  const TensorType& t = g.type(shape.inputs[0]);
  if (!t.has_shape) return std::nullopt;
  int64_t rank = t.rank(), start = 0, end = rank;
  if (g.opset() >= 15) {
    start = shape.attrs.get_int("start", 0);
    end = shape.attrs.get_int("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, 0, rank);
  }
  std::vector<std::optional<int64_t>> dims;
  for (int64_t i = start; i < end; ++i)
    dims.push_back(t.dims[size_t(i)].known() ? std::optional<int64_t>(t.dims[size_t(i)].value) : std::nullopt);
  return dims;
}

// Evaluates Gather/Slice on a Shape's output with unknown dims as a sentinel (-1: no real dim is
// negative); the result is constant when no sentinel survives.
std::optional<Tensor> eval_on_partial_shape(const Graph& g, const Node& n, const std::vector<std::optional<int64_t>>& dims) {
  std::vector<int64_t> v;
  for (auto& d : dims) v.push_back(d ? *d : -1);
  Tensor shape_data = Tensor::from_vector<int64_t>({int64_t(v.size())}, v);
  std::vector<const Tensor*> ins{&shape_data};
  for (size_t k = 1; k < n.inputs.size(); ++k) {
    if (n.inputs[k].empty()) {
      ins.push_back(nullptr);
      continue;
    }
    const Tensor* t = g.constant_value(n.inputs[k]);
    if (!t) return std::nullopt;
    ins.push_back(t);
  }
  try {
    auto out = run_node(n, g.opset(), ins);
    if (out.size() != 1) return std::nullopt;
    for (int64_t x : out[0].to_int_vector())
      if (x < 0) return std::nullopt;
    return out[0];
  } catch (const Error&) {
    return std::nullopt;
  }
}

struct Simplifier {
  Graph& g;
  PassContext& ctx;
  std::set<std::string> body_reads;  // names subgraph bodies read: never bypassed
  int changes = 0;

  // Folds, transitively, consumers of `v` whose inputs are now all constant and whose results are small.
  void propagate(const std::string& v) {
    std::vector<std::string> work{v};
    while (!work.empty()) {
      std::string cur = work.back();
      work.pop_back();
      if (!g.has_value(cur)) continue;
      std::vector<NodeId> consumers;
      for (auto& u : g.consumers(cur)) consumers.push_back(u.node);
      for (NodeId c : consumers) {
        if (!g.has_node(c)) continue;
        const Node& n = g.node(c);
        if (is_random_op(n) || has_subgraph(n)) continue;
        bool all_const = true;
        for (auto& i : n.inputs)
          if (!i.empty() && !g.constant_value(i)) all_const = false;
        if (!all_const) continue;
        auto results = evaluate_constant_node(g, c, nullptr);
        if (!results) continue;
        int64_t elems = 0;
        for (auto& t : *results) elems += t.numel();
        if (elems > kChainElements) continue;
        std::vector<std::string> outs = n.outputs;
        replace_by_constants(g, c, *results);
        ++changes;
        for (auto& o : outs)
          if (!o.empty()) work.push_back(o);
      }
    }
  }

  void to_constant(NodeId id, const Tensor& t) {
    std::string out = g.node(id).outputs[0];
    replace_by_constants(g, id, {t});
    ++changes;
    propagate(out);
  }

  void bypass(NodeId id) {
    const Node& n = g.node(id);
    // A graph-output bypass renames the input's producer output: that name must not be read by a body either.
    if (body_reads.count(n.outputs[0]) || (g.is_output(n.outputs[0]) && body_reads.count(n.inputs[0]))) return;
    if (bypass_node(g, id, n.inputs[0], n.outputs[0])) ++changes;
  }

  bool dropout_is_identity(const Node& n) {
    if (n.outputs.size() > 1 && !n.outputs[1].empty() && !g.consumers(n.outputs[1]).empty()) return false;
    if (n.outputs.size() > 1 && !n.outputs[1].empty() && g.is_output(n.outputs[1])) return false;
    if (g.opset() < 7 && n.attrs.get_int("is_test", 0) == 0) return false;  // training semantics before opset 7
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
      const Tensor* mode = g.constant_value(n.inputs[2]);
      if (!mode || mode->numel() != 1 || mode->as_double(0) != 0) return false;
    }
    return true;
  }

  void visit(NodeId id) {
    const Node& n = g.node(id);
    if (!n.domain.empty() || n.inputs.empty() || n.inputs[0].empty() || n.outputs.empty() || n.outputs[0].empty()) return;
    const std::string& op = n.op_type;
    const TensorType& in = g.type(n.inputs[0]);
    const TensorType& out = g.type(n.outputs[0]);
    if (op == "Shape") {
      auto dims = shape_node_dims(g, n);
      if (!dims) return;
      std::vector<int64_t> v;
      for (auto& d : *dims) {
        if (!d) return;
        v.push_back(*d);
      }
      to_constant(id, Tensor::from_vector<int64_t>({int64_t(v.size())}, v));
    } else if ((op == "Gather" || op == "Slice") && !g.constant_value(n.inputs[0])) {
      auto p = g.producer(n.inputs[0]);
      if (!p || g.node(*p).op_type != "Shape" || !g.node(*p).domain.empty()) return;
      auto dims = shape_node_dims(g, g.node(*p));
      if (!dims) return;
      if (auto t = eval_on_partial_shape(g, n, *dims)) to_constant(id, *t);
    } else if (op == "Identity") {
      bypass(id);
    } else if (op == "Dropout") {
      if (dropout_is_identity(n)) bypass(id);
    } else if (op == "Cast") {
      auto to = n.attrs.opt_int("to");
      if (to && in.dtype != DType::Undefined && int64_t(in.dtype) == *to) bypass(id);
    } else if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" || op == "Expand" ||
               op == "Tile") {
      if (same_runtime_type(in, out)) bypass(id);
    }
  }
};

void run(PassContext& ctx, const PassArgs&) {
  Graph& g = ctx.graph();
  Simplifier s{g, ctx, names_read_by_subgraphs(g)};
  for (NodeId id : g.topo_order())
    if (g.has_node(id)) s.visit(id);
  if (s.changes) {
    g.prune_values();
    ctx.rules_fired["shape-simplification"] += s.changes;
  }
}

}  // namespace

void register_shape_simplification_pass() {
  register_pass({"shape-simplification",
                 "fold shape computations on static shapes; remove no-op Reshape/Expand/Tile/Squeeze/Unsqueeze/Cast, "
                 "Identity and inference Dropout",
                 {"shapes"},
                 {},
                 false},
                run);
}

}  // namespace nnfuse::passes
