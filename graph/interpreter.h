#pragma once
// The reference interpreter: runs any graph of supported ops, node by node in topological order,
// with the registry's reference kernels. Straightforward on purpose: it is the oracle that rewrite
// rules, fusion plans and generated kernels are checked against.
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/op_registry.h"

namespace nnfuse {

using TensorMap = std::map<std::string, Tensor>;

class Interpreter {
 public:
  // Resolves every node's schema up front: an unsupported op fails here, naming the node.
  explicit Interpreter(const Graph& g);
  // Runs the graph. `outputs` empty = the graph outputs. Feeds are checked against the declared
  // input types (dtype, rank, static dims); errors name the input.
  TensorMap run(const TensorMap& feeds, const std::vector<std::string>& outputs = {}) const;
  // As run(), with values of an enclosing graph visible (subgraph bodies).
  TensorMap run_scoped(const TensorMap& feeds, const TensorMap* outer, const std::vector<std::string>& outputs) const;

 private:
  const Graph& g_;
  std::vector<NodeId> order_;
};

// Runs a graph once with the reference interpreter.
TensorMap run_reference(const Graph& g, const TensorMap& feeds, const std::vector<std::string>& outputs = {});

// Random feeds for every graph input (static shapes required; symbolic dims must be bound).
// Floats uniform in [-1, 1); integers in [0, 10); bools random.
TensorMap random_feeds(const Graph& g, uint64_t seed);

}  // namespace nnfuse
