#pragma once
// The nnfuse IR: a DAG whose vertices are operators and whose edges carry tensors.
//
// Storage is a boost::adjacency_list (bidirectional, list-backed so vertex descriptors stay valid
// across edits); see graph/bgl.h for the type. Every vertex has a stable NodeId. Tensors are SSA
// values named as in ONNX: each has at most one producer node, and the list of its uses. A value
// with no producer is a graph input, an initializer (weight) or, inside a subgraph body, a
// reference to the enclosing scope. Edges mirror the uses between two nodes and are kept in sync
// by the editing API, so passes never touch them directly.
//
// Copying a Graph is a deep copy of the structure; initializer data is shared (weights are never
// duplicated by a copy or a rewrite).
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/attribute.h"
#include "graph/tensor.h"

namespace nnfuse {

using NodeId = uint32_t;
constexpr NodeId kNoNode = ~NodeId(0);

// A dimension: a known size, or unknown (value < 0) optionally named by a symbol ("batch", "N").
struct Dim {
  int64_t value = -1;
  std::string symbol;
  Dim() = default;
  Dim(int64_t v) : value(v) {}  // NOLINT: implicit from a size is convenient in builders
  static Dim sym(std::string s) { Dim d; d.symbol = std::move(s); return d; }
  bool known() const { return value >= 0; }
  bool operator==(const Dim& o) const { return value == o.value && (value >= 0 || symbol == o.symbol); }
  std::string str() const { return known() ? std::to_string(value) : (symbol.empty() ? "?" : symbol); }
};

// What a value holds: a tensor, a sequence of tensors (ONNX seq(tensor)) or an optional
// (ONNX optional(tensor) or optional(seq(tensor)); `optional_of` says which). For a sequence
// and an optional, dtype and dims describe the tensors inside.
enum class ValueKind : uint8_t { Tensor, Sequence, Optional };

struct TensorType {
  ValueKind kind = ValueKind::Tensor;
  ValueKind optional_of = ValueKind::Tensor;  // kind Optional: Tensor or Sequence
  DType dtype = DType::Undefined;
  bool has_shape = false;  // false: rank unknown
  std::vector<Dim> dims;

  TensorType() = default;
  TensorType(DType t, std::vector<Dim> d) : dtype(t), has_shape(true), dims(std::move(d)) {}
  static TensorType of(DType t, const Shape& s);
  static TensorType unknown_shape(DType t) { TensorType tt; tt.dtype = t; return tt; }
  int64_t rank() const { return has_shape ? int64_t(dims.size()) : -1; }
  bool is_static() const;  // a tensor, its rank and every dim known
  Shape static_shape() const;  // throws Shape error if not static
  std::optional<int64_t> numel() const;
  std::string str() const;  // "float32[1,3,N,224]" / "float32[?]"
  static TensorType sequence_of(DType t) { TensorType tt; tt.kind = ValueKind::Sequence; tt.dtype = t; return tt; }
  bool is_tensor() const { return kind == ValueKind::Tensor; }
  bool operator==(const TensorType& o) const {
    return kind == o.kind && optional_of == o.optional_of && dtype == o.dtype && has_shape == o.has_shape && dims == o.dims;
  }
};

struct Use {
  NodeId node = kNoNode;
  int slot = 0;  // input index at the consumer
  bool operator==(const Use& o) const { return node == o.node && slot == o.slot; }
};

struct Value {
  std::string name;
  TensorType type;
  NodeId producer = kNoNode;
  int producer_slot = -1;
  std::vector<Use> uses;
};

struct Node {
  NodeId id = kNoNode;
  std::string name;
  std::string op_type;
  std::string domain;  // "" is the default ONNX domain ("ai.onnx")
  std::vector<std::string> inputs;   // "" marks an absent optional input
  std::vector<std::string> outputs;  // "" marks an absent optional output
  Attributes attrs;
  std::string doc;

  // "name" or "#id" when unnamed; used in error messages.
  std::string label() const { return name.empty() ? "#" + std::to_string(id) : name; }
  int num_present_inputs() const;
};

struct GraphImpl;

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph& other);             // deep copy; weights shared
  Graph& operator=(const Graph& other);  // deep copy; weights shared
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;

  std::string name;
  std::string doc;
  // A body of If/Loop/Scan: it may read values of the enclosing graph (outer references).
  bool is_subgraph = false;
  // Opsets by domain ("" = ai.onnx). Subgraph bodies carry their model's opsets.
  std::map<std::string, int64_t> opset_imports;
  int64_t opset(const std::string& domain = "") const;

  // ---- values ----
  bool has_value(const std::string& name) const;
  const Value& value(const std::string& name) const;  // throws Model error if unknown
  const Value* find_value(const std::string& name) const;  // null if unknown (one lookup)
  const TensorType& type(const std::string& name) const { return value(name).type; }
  void set_type(const std::string& name, TensorType t);
  // Creates the value if it does not exist (used by builders and importers before the producer).
  void declare_value(const std::string& name, TensorType t = {});
  // A name not yet used in this graph, derived from `hint`.
  std::string fresh_name(const std::string& hint);
  std::vector<std::string> value_names() const;  // sorted

  // ---- graph interface ----
  const std::vector<std::string>& inputs() const;   // runtime inputs (initializers excluded)
  const std::vector<std::string>& outputs() const;
  void add_input(const std::string& name, TensorType t);
  void add_output(const std::string& name);  // type comes from the value
  void set_outputs(std::vector<std::string> names);
  void remove_input(const std::string& name);
  bool is_input(const std::string& name) const;
  bool is_output(const std::string& name) const;

  // ---- initializers (weights) ----
  void set_initializer(const std::string& name, Tensor t);  // declares the value, type from t
  void remove_initializer(const std::string& name);
  bool is_initializer(const std::string& name) const;
  const Tensor& initializer(const std::string& name) const;  // throws if absent
  const Tensor* find_initializer(const std::string& name) const;
  // The initializer's data for a rewrite in place of the same dtype and shape, or null if there is
  // no such initializer or its buffer may be seen elsewhere (Tensor::exclusive_raw). Callers check
  // that the value has no other reader that must see the old contents.
  void* initializer_data_for_update(const std::string& name);
  std::vector<std::string> initializer_names() const;  // sorted
  // The constant data of a value: an initializer or the output of a Constant node; else null.
  const Tensor* constant_value(const std::string& name) const;

  // ---- nodes ----
  // Adds a node; inputs must already exist as values (or be "" for absent optional inputs);
  // outputs are created (or adopted if declared and unproduced). Returns its stable id.
  NodeId add_node(const std::string& op_type, const std::vector<std::string>& inputs,
                  const std::vector<std::string>& outputs, Attributes attrs = {}, const std::string& name = "",
                  const std::string& domain = "");
  // Removes a node. Its outputs stay as values without a producer unless `drop_outputs` and they
  // are unused; the caller rewires uses first.
  void remove_node(NodeId id, bool drop_outputs = true);
  bool has_node(NodeId id) const;
  const Node& node(NodeId id) const;
  // Mutable attributes. Counts as an edit (a body may be added or replaced): take it, change the
  // attributes, and query the graph afterwards; do not hold on to it across queries.
  Attributes& attrs(NodeId id);
  void set_node_name(NodeId id, const std::string& name);
  void set_node_doc(NodeId id, const std::string& doc);
  size_t num_nodes() const;
  std::vector<NodeId> node_ids() const;  // ascending id (insertion order)
  NodeId find_node(const std::string& node_name) const;  // kNoNode if none

  // Rewires one input of a node to another value ("" to drop an optional input).
  void set_input(NodeId id, int slot, const std::string& value);
  void add_node_input(NodeId id, const std::string& value);
  // Every use of `from` (node inputs and graph outputs) now reads `to`. Graph outputs keep their
  // name: if `from` is a graph output, the output list is updated to `to`.
  void replace_all_uses(const std::string& from, const std::string& to);
  // Replaces node `id` by a new node; outputs keep their names (so consumers stay wired).
  NodeId replace_node(NodeId id, const std::string& op_type, const std::vector<std::string>& inputs,
                      Attributes attrs, const std::string& domain = "");

  // ---- queries ----
  // Dependencies are node inputs and body reads: a node whose If/Loop/Scan body (or a body nested
  // in it) reads a value of this graph by name depends on that value's producer as if it were an
  // input, though no edge of impl().g carries it. predecessors, successors, topo_order, has_cycle
  // and reaches all see both kinds. The body reads are cached until the graph or one of its
  // bodies is edited; a graph with no subgraph attribute pays nothing for them.
  std::optional<NodeId> producer(const std::string& value) const;
  const std::vector<Use>& consumers(const std::string& value) const;
  std::vector<NodeId> predecessors(NodeId id) const;  // distinct producers of what it reads
  std::vector<NodeId> successors(NodeId id) const;    // distinct nodes that read its outputs
  // Deterministic topological order (ties broken by id). Throws Model error naming a node on a cycle.
  std::vector<NodeId> topo_order() const;
  // True if the graph has a cycle; `cycle` receives the nodes on one of them.
  bool has_cycle(std::vector<NodeId>* cycle = nullptr) const;
  // Is there a path of one or more edges from `from` to `to` (or from == to)? Adding an edge
  // b -> a closes a cycle exactly when reaches(a, b).
  bool reaches(NodeId from, NodeId to) const;
  // Values read by the graph that nothing produces and that are neither inputs nor initializers
  // (outer-scope references of a subgraph body).
  std::vector<std::string> outer_references() const;

  // ---- whole-graph operations ----
  // A standalone graph of the given nodes: its inputs are the values they read from outside
  // (initializers stay initializers), its outputs the values used outside or graph outputs.
  Graph extract(const std::vector<NodeId>& nodes) const;
  // Checks every invariant; throws Model error naming the first broken one.
  void validate() const;
  // Removes values that have no producer, no use, and are not inputs/outputs/initializers.
  void prune_values();

  // Access for algorithms written against Boost.Graph (see graph/bgl.h).
  GraphImpl& impl() { return *impl_; }
  const GraphImpl& impl() const { return *impl_; }

 private:
  std::unique_ptr<GraphImpl> impl_;
};

// A model-local function (ONNX FunctionProto): nodes of domain `domain` and type `name` call it.
// nnfuse writes fused blocks this way (--export-fused); the body's inputs/outputs are the
// function's formal parameters.
struct ModelFunction {
  std::string name;
  std::string domain;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::map<std::string, int64_t> opset_imports;
  Graph body;
};

// A model: a graph plus the metadata ONNX keeps around it.
struct Model {
  Graph graph;
  int64_t ir_version = 8;
  std::string producer_name = "nnfuse";
  std::string producer_version;
  std::string domain;
  int64_t model_version = 0;
  std::string doc;
  std::map<std::string, std::string> metadata;
  std::string path;  // file it was loaded from, for error messages ("" if from bytes)
  std::vector<ModelFunction> functions;
};

}  // namespace nnfuse
