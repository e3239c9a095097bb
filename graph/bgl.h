#pragma once
// The Boost.Graph storage behind nnfuse::Graph, for algorithms written against BGL.
// Include only where BGL is needed: it is kept out of graph.h to keep compile times down.
#include <boost/graph/adjacency_list.hpp>
#include <unordered_map>

#include "graph/graph.h"

namespace nnfuse {

struct EdgeData {
  std::string value;  // the tensor this edge carries
  int slot = 0;       // input index at the consumer
};

// listS for vertices and edges: descriptors stay valid when other vertices are removed.
using BGraph = boost::adjacency_list<boost::listS, boost::listS, boost::bidirectionalS, Node, EdgeData>;
using Vertex = boost::graph_traits<BGraph>::vertex_descriptor;
using Edge = boost::graph_traits<BGraph>::edge_descriptor;

struct GraphImpl {
  BGraph g;
  std::unordered_map<NodeId, Vertex> vertex_of;
  // Node name -> ids (ONNX does not force names to be unique); unnamed nodes are not indexed.
  std::unordered_map<std::string, std::vector<NodeId>> nodes_by_name;
  std::unordered_map<std::string, Value> values;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::map<std::string, Tensor> initializers;  // Tensor copies share their buffer
  NodeId next_id = 0;
  uint64_t name_counter = 0;

  Vertex vertex(NodeId id) const;
};

}  // namespace nnfuse
