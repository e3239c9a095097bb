#pragma once
// The op registry: one entry per operator, and everything the pipeline needs to know about it:
// the ONNX name and opsets it covers, its DNNFusion mapping type, shape/dtype inference, a
// reference kernel (the oracle of every optimization), and its FLOP count.
// Adding an op touches one place: the register_*_ops function of its family (ops_*.cpp).
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/graph.h"

namespace nnfuse {

// DNNFusion's classification of how output elements depend on input elements.
enum class MappingType { OneToOne, OneToMany, ManyToMany, Reorganize, Shuffle };
const char* mapping_type_name(MappingType m);  // "One-to-One", ...
std::optional<MappingType> mapping_type_from_name(const std::string& s);

// What shape inference sees of one node.
struct InferContext {
  const Node& node;
  int64_t opset = 0;
  std::vector<TensorType> inputs;                         // absent input: Undefined, no shape
  std::vector<const Tensor*> values;                      // constant data of an input, if known
  std::vector<std::optional<std::vector<Dim>>> dim_values;  // 1-D int tensors whose elements are known dims
                                                          // (symbolic shape data: Shape->Gather->Concat)
  size_t num_inputs() const { return node.inputs.size(); }
  bool has_input(size_t i) const { return i < node.inputs.size() && !node.inputs[i].empty(); }
  const TensorType& input(size_t i) const;  // throws if absent
  const Tensor* value(size_t i) const { return i < values.size() ? values[i] : nullptr; }
  const std::optional<std::vector<Dim>>& dims_of_value(size_t i) const;
  [[noreturn]] void error(const std::string& msg) const;  // Shape error naming this node
};

struct InferResult {
  std::vector<TensorType> outputs;
  // Optional symbolic data of 1-D int outputs (for shape-computation chains); may be left empty.
  std::vector<std::optional<std::vector<Dim>>> dim_values;
};

// Runs a subgraph body (If/Loop/Scan): body inputs in order -> body outputs in order.
using SubgraphRunner = std::function<std::vector<Tensor>(const Graph& body, const std::vector<Tensor>& inputs)>;

struct KernelContext {
  const Node& node;
  int64_t opset = 0;
  std::vector<const Tensor*> inputs;  // null for absent optional inputs
  SubgraphRunner run_subgraph;        // set by the interpreter
  size_t num_inputs() const { return inputs.size(); }
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
  const Tensor& input(size_t i) const;  // throws if absent
  [[noreturn]] void error(const std::string& msg) const;  // Runtime error naming this node
  [[noreturn]] void unsupported(const std::string& msg) const;  // Unsupported error naming this node
};

using InferFn = std::function<InferResult(const InferContext&)>;
using KernelFn = std::function<std::vector<Tensor>(const KernelContext&)>;
using FlopFn = std::function<double(const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs)>;
using MappingFn = std::function<MappingType(const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs)>;

struct OpSchema {
  std::string name;
  std::string domain;          // "" = ai.onnx
  int since = 1;               // first opset version covered
  int until = 28;              // last opset version covered (inclusive): lower it where a newer
                               // version of the op computes something else
  int min_inputs = 1, max_inputs = 1;    // max -1 = variadic
  int min_outputs = 1, max_outputs = 1;  // max -1 = variadic
  MappingType mapping = MappingType::OneToOne;
  MappingFn mapping_fn;        // when the type depends on attributes/shapes; else `mapping` is used
  InferFn infer;
  KernelFn kernel;
  FlopFn flops;                // default: one FLOP per output element
  bool commutative = false;    // binary ops whose two inputs may be swapped
  // Inputs and outputs may be sequences and optionals (the sequence and optional ops, Identity,
  // If and Loop); every other op takes tensors only, which inference and run_node check, so
  // its kernel never sees anything else.
  bool takes_any_value = false;
  std::string family;          // "elementwise", "nn", "tensor", "control" (for docs)
};

class OpRegistry {
 public:
  // The registry of every built-in op (built once, thread-safe).
  static const OpRegistry& global();
  OpRegistry() = default;
  OpRegistry(const OpRegistry&) = delete;  // default_ops_ points into ops_
  OpRegistry& operator=(const OpRegistry&) = delete;
  void add(OpSchema s);  // throws Invalid on a duplicate name
  const OpSchema* find(const std::string& domain, const std::string& op) const;
  // The schema for a node at the given opset; throws Unsupported naming the node, op and opset.
  const OpSchema& get(const Node& n, int64_t opset) const;
  std::vector<const OpSchema*> all() const;  // sorted by name
  size_t size() const { return ops_.size(); }

 private:
  std::unordered_map<std::string, OpSchema> ops_;  // key: domain + "::" + name
  std::unordered_map<std::string, const OpSchema*> default_ops_;  // the ai.onnx ones by name, into ops_
};

// Mapping type / FLOPs of a node in its graph (types from the graph's values).
MappingType node_mapping_type(const Graph& g, NodeId id);
double node_flops(const Graph& g, NodeId id);
// The sum of node_flops over a graph's nodes; an op whose count fails counts as zero (an estimate).
double graph_flops(const Graph& g);

// Evaluates one node with its reference kernel. Checks arity; errors name the node.
std::vector<Tensor> run_node(const Node& n, int64_t opset, const std::vector<const Tensor*>& inputs,
                             const SubgraphRunner& run_subgraph = nullptr);

// Families, each in its own ops_*.cpp.
void register_elementwise_ops(OpRegistry& r);
void register_nn_ops(OpRegistry& r);
void register_tensor_ops(OpRegistry& r);
void register_control_ops(OpRegistry& r);

}  // namespace nnfuse
