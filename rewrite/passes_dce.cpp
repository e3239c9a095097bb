// dce: removes what no graph output needs: nodes, initializers and values. ONNX inference ops
// have no side effects, so liveness is reachability backwards from the graph outputs.
//
// Subgraph bodies (If/Loop/Scan) read values of this graph by name without a recorded use: the
// outer references of a live node's bodies are live too.
#include <set>

#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

void run(PassContext& ctx, const PassArgs&) {
  Graph& g = ctx.graph();
  std::set<std::string> live_values(g.outputs().begin(), g.outputs().end());
  std::set<NodeId> live_nodes;
  std::vector<std::string> work(live_values.begin(), live_values.end());
  auto mark = [&](const std::string& v) {
    if (!v.empty() && g.has_value(v) && live_values.insert(v).second) work.push_back(v);
  };
  while (!work.empty()) {
    std::string v = work.back();
    work.pop_back();
    auto p = g.producer(v);
    if (!p || !live_nodes.insert(*p).second) continue;
    const Node& n = g.node(*p);
    for (auto& i : n.inputs) mark(i);
    if (has_subgraph(n)) {
      for (auto& r : subgraph_reads(n)) mark(r);
    }
  }
  int removed = 0;
  for (NodeId id : g.node_ids())
    if (!live_nodes.count(id)) {
      g.remove_node(id, /*drop_outputs=*/true);
      ++removed;
    }
  for (auto& w : g.initializer_names())
    if (!live_values.count(w) && !g.is_input(w) && g.consumers(w).empty()) {
      g.remove_initializer(w);
      ++removed;
    }
  g.prune_values();
  if (removed) ctx.rules_fired["dce"] += removed;
}

}  // namespace

void register_dce_pass() {
  PassInfo info{"dce", "remove nodes, initializers and values that reach no graph output", {}, {"shapes"}, false};
  info.bodies = true;  // a body's outputs are its graph outputs
  register_pass(info, run);
}

}  // namespace nnfuse::passes
