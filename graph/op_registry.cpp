#include "graph/op_registry.h"

#include <algorithm>
#include <memory>
#include <mutex>

namespace nnfuse {

const char* mapping_type_name(MappingType m) {
  switch (m) {
    case MappingType::OneToOne: return "One-to-One";
    case MappingType::OneToMany: return "One-to-Many";
    case MappingType::ManyToMany: return "Many-to-Many";
    case MappingType::Reorganize: return "Reorganize";
    case MappingType::Shuffle: return "Shuffle";
  }
  return "?";
}

std::optional<MappingType> mapping_type_from_name(const std::string& s) {
  for (auto m : {MappingType::OneToOne, MappingType::OneToMany, MappingType::ManyToMany, MappingType::Reorganize,
                 MappingType::Shuffle})
    if (s == mapping_type_name(m)) return m;
  return std::nullopt;
}

static ErrorContext node_ctx(const Node& n, int64_t opset) { return {"", 0, 0, n.label(), n.op_type, int(opset)}; }

const TensorType& InferContext::input(size_t i) const {
  if (!has_input(i)) error("input " + std::to_string(i) + " is required but absent");
  return inputs[i];
}
const std::optional<std::vector<Dim>>& InferContext::dims_of_value(size_t i) const {
  static const std::optional<std::vector<Dim>> none;
  return i < dim_values.size() ? dim_values[i] : none;
}
void InferContext::error(const std::string& msg) const {
  std::string shapes;
  for (size_t i = 0; i < inputs.size(); ++i) shapes += (i ? ", " : "") + (has_input(i) ? inputs[i].str() : std::string("-"));
  fail(ErrorKind::Shape, msg + " (inputs: " + shapes + ")", node_ctx(node, opset));
}

const Tensor& KernelContext::input(size_t i) const {
  if (!has_input(i)) error("input " + std::to_string(i) + " is required but absent");
  return *inputs[i];
}
void KernelContext::error(const std::string& msg) const { fail(ErrorKind::Runtime, msg, node_ctx(node, opset)); }
void KernelContext::unsupported(const std::string& msg) const { fail(ErrorKind::Unsupported, msg, node_ctx(node, opset)); }

static std::string key(const std::string& domain, const std::string& op) {
  return (domain == "ai.onnx" ? std::string() : domain) + "::" + op;
}

void OpRegistry::add(OpSchema s) {
  std::string k = key(s.domain, s.name);
  if (ops_.count(k)) fail(ErrorKind::Invalid, "op " + s.name + " registered twice");
  if (!s.infer || !s.kernel) fail(ErrorKind::Invalid, "op " + s.name + " needs an inference function and a kernel");
  bool default_domain = s.domain.empty() || s.domain == "ai.onnx";
  std::string name = s.name;
  const OpSchema& stored = ops_.emplace(k, std::move(s)).first->second;  // node-based: stays put
  if (default_domain) default_ops_.emplace(std::move(name), &stored);
}

const OpSchema* OpRegistry::find(const std::string& domain, const std::string& op) const {
  if (domain.empty() || domain == "ai.onnx") {  // nearly every lookup: by name, no key to build
    auto it = default_ops_.find(op);
    return it == default_ops_.end() ? nullptr : it->second;
  }
  auto it = ops_.find(key(domain, op));
  return it == ops_.end() ? nullptr : &it->second;
}

const OpSchema& OpRegistry::get(const Node& n, int64_t opset) const {
  // Runs for every node in every pass that asks for a schema: the error context (the node's label)
  // is built only when there is an error to report.
  const OpSchema* s = find(n.domain, n.op_type);
  if (!s)
    fail(ErrorKind::Unsupported, "op " + (n.domain.empty() ? "" : n.domain + ".") + n.op_type + " is not supported",
         node_ctx(n, opset));
  if (opset < s->since || opset > s->until)
    fail(ErrorKind::Unsupported, "op " + n.op_type + " is supported for opsets " + std::to_string(s->since) + " to " +
                                     std::to_string(s->until) + ", not opset " + std::to_string(opset),
         node_ctx(n, opset));
  return *s;
}

std::vector<const OpSchema*> OpRegistry::all() const {
  std::vector<const OpSchema*> r;
  for (auto& [k, s] : ops_) r.push_back(&s);
  std::sort(r.begin(), r.end(), [](auto* a, auto* b) { return a->domain + a->name < b->domain + b->name; });
  return r;
}

const OpRegistry& OpRegistry::global() {
  static OpRegistry* reg = [] {
    auto* r = new OpRegistry();
    register_elementwise_ops(*r);
    register_nn_ops(*r);
    register_tensor_ops(*r);
    register_control_ops(*r);
    return r;
  }();
  return *reg;
}

namespace {
// node_flops and node_mapping_type run for every node several times per optimize (classification,
// the FLOP counts of the report, fusion planning), and the schema functions take the types as
// vectors. Copying them into fresh vectors allocated for every call (a TensorType owns its dims);
// instead each call leases per-thread vectors whose copy-assignment reuses their capacity. Leases
// nest: an If/Loop FLOP function calls node_flops on its body while the outer lease is in use.
struct NodeTypes {
  std::vector<TensorType> ins, outs;
};
thread_local std::vector<std::unique_ptr<NodeTypes>> node_types_pool;
thread_local size_t node_types_depth = 0;

class NodeTypesLease {
 public:
  NodeTypesLease(const Graph& g, const Node& n) {
    if (node_types_pool.size() <= node_types_depth) node_types_pool.push_back(std::make_unique<NodeTypes>());
    t_ = node_types_pool[node_types_depth++].get();
    fill(g, n.inputs, t_->ins);
    fill(g, n.outputs, t_->outs);
  }
  ~NodeTypesLease() { --node_types_depth; }
  NodeTypesLease(const NodeTypesLease&) = delete;
  NodeTypesLease& operator=(const NodeTypesLease&) = delete;
  const std::vector<TensorType>& ins() const { return t_->ins; }
  const std::vector<TensorType>& outs() const { return t_->outs; }

 private:
  NodeTypes* t_;
  static void fill(const Graph& g, const std::vector<std::string>& names, std::vector<TensorType>& r) {
    static const TensorType unknown{};
    r.resize(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const Value* v = names[i].empty() ? nullptr : g.find_value(names[i]);
      r[i] = v ? v->type : unknown;
    }
  }
};
}  // namespace

MappingType node_mapping_type(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  const OpSchema& s = OpRegistry::global().get(n, g.opset(n.domain));
  if (!s.mapping_fn) return s.mapping;
  NodeTypesLease t(g, n);
  return s.mapping_fn(n, t.ins(), t.outs());
}

double node_flops(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  const OpSchema& s = OpRegistry::global().get(n, g.opset(n.domain));
  NodeTypesLease t(g, n);
  if (s.flops) return s.flops(n, t.ins(), t.outs());
  double total = 0;
  for (auto& o : t.outs())
    if (auto k = o.numel()) total += double(*k);
  return total;
}

double graph_flops(const Graph& g) {
  double total = 0;
  for (NodeId id : g.node_ids()) {
    try {
      total += node_flops(g, id);
    } catch (const Error&) {
      // An op we cannot count (unsupported in a body) counts as zero; the count is an estimate.
    }
  }
  return total;
}

std::vector<Tensor> run_node(const Node& n, int64_t opset, const std::vector<const Tensor*>& inputs,
                             const SubgraphRunner& run_subgraph) {
  const OpSchema& s = OpRegistry::global().get(n, opset);
  auto ctx = node_ctx(n, opset);
  int present = 0;
  for (auto* t : inputs) present += t != nullptr;
  if (int(inputs.size()) < s.min_inputs || (s.max_inputs >= 0 && int(inputs.size()) > s.max_inputs))
    fail(ErrorKind::Model, "has " + std::to_string(inputs.size()) + " inputs; " + n.op_type + " takes " +
                               std::to_string(s.min_inputs) + (s.max_inputs < 0 ? " or more" : " to " + std::to_string(s.max_inputs)), ctx);
  if (!s.takes_any_value)
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i] && !inputs[i]->is_tensor())
        fail(ErrorKind::Model, "input " + std::to_string(i) + " '" + (i < n.inputs.size() ? n.inputs[i] : "") + "' is " +
                                   inputs[i]->kind_str() + "; " + n.op_type + " takes tensors", ctx);
  KernelContext kc{n, opset, inputs, run_subgraph};
  std::vector<Tensor> out;
  try {
    out = s.kernel(kc);
  } catch (const Error& e) {
    rethrow_in(e, ctx);  // an error from below the kernel (a tensor too large to allocate) names this node
  }
  if (out.size() < n.outputs.size()) {
    // Kernels may produce fewer outputs than requested only when the missing ones are absent.
    for (size_t i = out.size(); i < n.outputs.size(); ++i)
      if (!n.outputs[i].empty()) fail(ErrorKind::Runtime, "kernel produced " + std::to_string(out.size()) + " outputs, node wants " + std::to_string(n.outputs.size()), ctx);
  }
  return out;
}

}  // namespace nnfuse
