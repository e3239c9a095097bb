#pragma once
// The Boost.Graph storage behind nnfuse::Graph, for algorithms written against BGL.
// Include only where BGL is needed: it is kept out of graph.h to keep compile times down.
#include <boost/graph/adjacency_list.hpp>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

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

// Edges the BGL graph does not hold: node N's If/Loop/Scan body (or a body nested in it) reads a
// value of this graph by name, so the value's producer must run first. Built on demand by
// graph.cpp and kept until this graph or one of those bodies is edited (`stamp`).
struct BodyReadEdges {
  std::vector<uint64_t> stamp;  // revisions of this graph and its bodies, depth first
  std::unordered_map<NodeId, std::vector<NodeId>> readers;    // producer -> reading nodes (sorted, distinct)
  std::unordered_map<NodeId, std::vector<NodeId>> producers;  // reading node -> producers (sorted, distinct)
};

uint64_t next_graph_revision();  // process-wide and increasing: two edits never share one

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
  // Changes on every edit that can change who produces a value or what a body of this graph reads
  // from outside it; BodyReadEdges and the topological order are cached against it.
  uint64_t revision = next_graph_revision();
  // Nodes that hold (or, after attrs(id), may hold) subgraph attributes. Empty for almost every
  // graph: then there are no body-read edges and the queries pay nothing for them.
  std::set<NodeId> body_holders;
  mutable std::mutex body_reads_mutex;
  mutable BodyReadEdges body_reads;
  // topo_order's last result and the stamp (as BodyReadEdges::stamp) it was computed for: every
  // pass's structural hash and most passes walk the graph in that order, usually unchanged since
  // the last walk. Empty stamp: nothing cached.
  mutable std::mutex topo_mutex;
  mutable std::vector<uint64_t> topo_stamp;
  mutable std::vector<NodeId> topo;

  Vertex vertex(NodeId id) const;
  void touch() { revision = next_graph_revision(); }
};

}  // namespace nnfuse
