#pragma once
// A lone node for op tests that call run_node directly (no graph around it).
#include <string>
#include <vector>

#include "graph/graph.h"

namespace nnfuse::test {

// A node with the given inputs ("" = absent) and outputs.
inline Node make_node(const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs, Attributes attrs = {}) {
  Node n;
  n.id = 0;
  n.name = op + "_test";
  n.op_type = op;
  n.inputs = std::move(ins);
  n.outputs = std::move(outs);
  n.attrs = std::move(attrs);
  return n;
}

}  // namespace nnfuse::test
