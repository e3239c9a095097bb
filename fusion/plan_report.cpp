#include "fusion/plan_report.h"

#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace nnfuse {

const char* mapping_type_colour(MappingType m) {
  switch (m) {
    case MappingType::OneToOne: return "#c6e5b3";
    case MappingType::OneToMany: return "#fde2a7";
    case MappingType::ManyToMany: return "#f4b6b6";
    case MappingType::Reorganize: return "#b8d4f0";
    case MappingType::Shuffle: return "#d9c4ec";
  }
  return "#eeeeee";
}

nlohmann::json plan_to_json(const Graph& g, const FusionPlan& plan) {
  // Built by assigning keys rather than from nested initializer lists: nlohmann copies every
  // element of an initializer list, which made this report a sizeable share of a small model's
  // optimize call (the JSON is the same; objects keep their keys sorted either way).
  using nlohmann::json;
  json blocks = json::array();
  auto& block_list = blocks.get_ref<json::array_t&>();
  block_list.reserve(plan.blocks.size());
  // A node's mapping type needs a schema lookup; recomputed nodes appear in several blocks.
  std::unordered_map<NodeId, const char*> mapping_names;
  for (auto& b : plan.blocks) {
    json members = json::array();
    auto& member_list = members.get_ref<json::array_t&>();
    member_list.reserve(b.reasons.size());
    for (auto& r : b.reasons) {
      const Node& n = g.node(r.node);
      auto [it, fresh] = mapping_names.try_emplace(r.node, nullptr);
      if (fresh) it->second = mapping_type_name(node_mapping_type(g, r.node));
      json& m = member_list.emplace_back(json::object());
      m["name"] = n.label();
      m["op"] = n.op_type;
      m["mapping_type"] = it->second;
      m["joined_by"] = r.cell;
      m["decision"] = r.decision;
      if (r.partner != kNoNode) m["with"] = g.node(r.partner).label();
    }
    json& blk = block_list.emplace_back(json::object());
    blk["id"] = b.id;
    blk["mapping_type"] = mapping_type_name(b.type);
    blk["members"] = std::move(members);
    blk["inputs"] = b.inputs;
    blk["outputs"] = b.outputs;
    blk["anchor"] = b.anchor == kNoNode ? json(nullptr) : json(g.node(b.anchor).label());
    if (!b.pattern.empty()) blk["pattern"] = b.pattern;
  }
  int attention_blocks = 0;
  for (const FusionBlock& b : plan.blocks) attention_blocks += b.pattern == "attention";
  const PlanStats& s = plan.stats;
  json stats = json::object();
  stats["target"] = plan.target;
  stats["undecided_pairs"] = s.undecided_pairs;
  stats["settled_by_cost_model"] = s.settled_by_cost_model;
  stats["settled_by_profile"] = s.settled_by_profile;
  stats["settled_from_cache"] = s.settled_from_cache;
  stats["rejected_for_cycle"] = s.rejected_for_cycle;
  stats["rejected_for_budget"] = s.rejected_for_budget;
  stats["recomputed_chains"] = s.recomputed_chains;
  stats["recomputed_copies"] = s.recomputed_copies;
  stats["attention_blocks"] = attention_blocks;
  stats["ms"] = s.ms;
  json out = json::object();
  out["kernels"] = plan.kernels();
  out["blocks"] = std::move(blocks);
  out["fusion_stats"] = std::move(stats);
  return out;
}

static std::string dot_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r;
}

std::string plan_to_dot(const Graph& g, const FusionPlan& plan) {
  std::ostringstream o;
  o << "digraph \"" << dot_escape(g.name) << "\" {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=Helvetica];\n";
  // A recomputed node is drawn once per block holding it (dashed), with its own DOT id there.
  std::unordered_map<NodeId, std::vector<int>> holders;
  for (auto& b : plan.blocks)
    for (NodeId m : b.members) holders[m].push_back(b.id);
  auto dot_id = [&](NodeId m, int block) {
    return holders[m].size() > 1 ? "n" + std::to_string(m) + "_b" + std::to_string(block) : "n" + std::to_string(m);
  };
  for (auto& b : plan.blocks) {
    o << "  subgraph cluster_" << b.id << " {\n    style=filled; color=\"" << mapping_type_colour(b.type) << "\";\n"
      << "    label=\"block " << b.id << " (" << mapping_type_name(b.type) << ")\";\n";
    for (NodeId m : b.members)
      o << "    " << dot_id(m, b.id) << " [label=\"" << dot_escape(g.node(m).op_type) << "\\n" << dot_escape(g.node(m).label()) << "\""
        << (holders[m].size() > 1 ? ", style=\"rounded,filled,dashed\"" : "") << "];\n";
    o << "  }\n";
  }
  // Edges into each member: from the copy in the same block when the producer is recomputed
  // there, else from the one block that writes the value out.
  std::set<std::string> drawn;  // an op reading one value twice gets one edge
  for (auto& b : plan.blocks) {
    std::unordered_set<NodeId> inside(b.members.begin(), b.members.end());
    for (NodeId m : b.members)
      for (auto& in : g.node(m).inputs) {
        auto p = in.empty() ? std::nullopt : g.producer(in);
        if (!p || !holders.count(*p)) continue;
        int from = inside.count(*p) ? b.id : holders[*p].front();
        std::string edge = "  " + dot_id(*p, from) + " -> " + dot_id(m, b.id) + ";\n";
        if (drawn.insert(edge).second) o << edge;
      }
  }
  // Legend: one swatch per mapping type.
  o << "  subgraph cluster_legend {\n    label=\"mapping type\"; style=dashed;\n";
  for (auto mt : {MappingType::OneToOne, MappingType::OneToMany, MappingType::ManyToMany, MappingType::Reorganize, MappingType::Shuffle})
    o << "    \"legend_" << mapping_type_name(mt) << "\" [label=\"" << mapping_type_name(mt) << "\", fillcolor=\"" << mapping_type_colour(mt) << "\"];\n";
  o << "  }\n}\n";
  return o.str();
}

Model fused_model(const Model& m, const FusionPlan& plan) {
  const Graph& g = m.graph;
  Model out;
  out.ir_version = std::max<int64_t>(m.ir_version, 8);  // model-local functions need IR 8
  out.producer_name = "nnfuse";
  out.doc = "nnfuse fusion plan for " + (g.name.empty() ? std::string("model") : g.name) + " (target " + plan.target + ")";
  Graph& f = out.graph;
  f.name = g.name + "_fused";
  f.opset_imports = g.opset_imports;
  f.opset_imports["nnfuse"] = 1;
  for (auto& i : g.inputs()) f.add_input(i, g.type(i));
  for (auto& w : g.initializer_names())
    if (!g.is_input(w)) f.set_initializer(w, g.initializer(w));
  for (NodeId c : plan.constants) {
    const Node& n = g.node(c);
    f.add_node(n.op_type, n.inputs, n.outputs, n.attrs, n.name, n.domain);
    for (auto& o : n.outputs) f.set_type(o, g.type(o));
  }
  for (auto& b : plan.blocks) {
    std::string anchor_op = b.anchor == kNoNode ? g.node(b.members.front()).op_type : g.node(b.anchor).op_type;
    std::string fname = "Block" + std::to_string(b.id) + "_" + anchor_op;
    ModelFunction fn;
    fn.name = fname;
    fn.domain = "nnfuse";
    fn.inputs = b.inputs;
    fn.outputs = b.outputs;
    fn.opset_imports = g.opset_imports;
    Graph& body = fn.body;
    body.opset_imports = g.opset_imports;
    body.is_subgraph = true;
    for (auto& i : b.inputs) body.add_input(i, g.type(i));
    for (NodeId id : b.members) {
      const Node& n = g.node(id);
      for (auto& o : n.outputs)
        if (!o.empty()) body.declare_value(o, g.type(o));
      body.add_node(n.op_type, n.inputs, n.outputs, n.attrs, n.name, n.domain);
    }
    for (auto& o : b.outputs) body.add_output(o);
    out.functions.push_back(std::move(fn));
    for (auto& i : b.inputs)
      if (!f.has_value(i)) f.declare_value(i, g.type(i));
    for (auto& o : b.outputs) f.declare_value(o, g.type(o));
    NodeId id = f.add_node(fname, b.inputs, b.outputs, {}, "block" + std::to_string(b.id), "nnfuse");
    std::string doc = std::string(mapping_type_name(b.type)) + " block of " + std::to_string(b.members.size()) + " ops:";
    for (NodeId mm : b.members) doc += " " + g.node(mm).op_type;
    (void)id;
    f.set_node_doc(id, doc);
  }
  f.set_outputs(g.outputs());
  return out;
}

}  // namespace nnfuse
