#pragma once
// Shape and dtype inference over a whole graph, in topological order, with the registry's
// per-op functions. Shape-computation chains (Shape -> Gather -> Concat -> Reshape, as framework
// exporters emit them) are followed by propagating constant data and symbolic dims.
#include <map>
#include <string>

#include "graph/graph.h"

namespace nnfuse {

struct InferOptions {
  // Evaluate nodes whose inputs are all constant and small (<= this many elements) to learn
  // their values (needed by Reshape/Expand/... targets). 0 disables.
  int64_t max_fold_elements = 1 << 16;
  // If true, a node whose output type conflicts with a declared type is an error; else the
  // inferred type wins.
  bool strict = false;
};

// Infers every value's type in place. Errors name the node, op and shapes at fault.
void infer_shapes(Graph& g, const InferOptions& opt = {});

// Binds graph inputs to concrete shapes ("--shape NAME=1,3,224,224"): checks rank and the dims
// already known, binds the symbols those inputs use everywhere in the graph, then re-infers.
void bind_input_shapes(Graph& g, const std::map<std::string, Shape>& shapes);

// Parses "NAME=1,3,224,224" into a binding (Invalid error on bad syntax).
std::pair<std::string, Shape> parse_shape_binding(const std::string& s);

}  // namespace nnfuse
