#include "fusion/planner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>
#include <unordered_map>
#include <string_view>
#include <unordered_set>

#include "fusion/attention_pattern.h"
#include "fusion/recompute.h"
#include "graph/error.h"
#include "graph/op_registry.h"
#include "rewrite/passes_util.h"

namespace nnfuse {

int FusionPlan::block_of(NodeId id) const {
  for (size_t b = 0; b < blocks.size(); ++b)
    for (NodeId m : blocks[b].members)
      if (m == id) return int(b);
  return -1;
}

std::vector<int> FusionPlan::blocks_of(NodeId id) const {
  std::vector<int> r;
  for (size_t b = 0; b < blocks.size(); ++b)
    if (std::find(blocks[b].members.begin(), blocks[b].members.end(), id) != blocks[b].members.end()) r.push_back(int(b));
  return r;
}

namespace {

bool is_constant_node(const Node& n) { return n.op_type == "Constant" && n.domain.empty(); }

// The contracted graph during planning: every operator starts as its own vertex; merging two
// adjacent vertices keeps a topological order of the vertices (dead slots are -1), so that the
// cycle check only searches the window between the two.
class Planner {
 public:
  Planner(const Graph& g, const TargetDesc& t, const PlanOptions& opt)
      : g_(g), t_(t), opt_(opt),
        max_inputs_(opt.max_block_inputs > 0 ? opt.max_block_inputs : t.max_block_inputs),
        max_members_(opt.max_block_members > 0 ? opt.max_block_members : t.max_block_members) {}

  FusionPlan run() {
    auto t0 = std::chrono::steady_clock::now();
    FusionPlan plan;
    plan.target = t_.name;
    // Body reads count: a node whose If/Loop/Scan body reads a value comes after its producer.
    std::vector<NodeId> topo = g_.topo_order();
    NodeId max_id = 0;
    for (NodeId id : topo) max_id = std::max(max_id, id);
    vertex_of_.assign(size_t(max_id) + 1, -1);
    node_pos_.assign(size_t(max_id) + 1, -1);
    fusable_.assign(size_t(max_id) + 1, 0);
    succs_.assign(size_t(max_id) + 1, {});
    for (NodeId id : topo) {
      const Node& n = g_.node(id);
      fusable_[id] = t_.can_fuse_op(n.op_type);
      succs_[id] = g_.successors(id);
      node_pos_[id] = int(node_pos_.size());  // placeholder, fixed below
      if (is_constant_node(n)) {
        plan.constants.push_back(id);
        continue;
      }
      int v = int(vs_.size());
      Vertex vx;
      vx.members = {id};
      vx.type = node_mapping_type(g_, id);
      vx.reasons.push_back({id, kNoNode, "seed", "seed"});
      vs_.push_back(std::move(vx));
      reached_mark_.push_back(0);
      vertex_of_[id] = v;
      mtype_[id] = vs_[size_t(v)].type;
      pos_.push_back(int(order_.size()));
      order_.push_back(v);
    }
    for (size_t i = 0; i < topo.size(); ++i) node_pos_[topo[i]] = int(i);

    // Seeds: Many-to-Many anchors by cost, then everything else in topological order.
    std::vector<NodeId> anchor_seeds, other_seeds;
    std::vector<std::pair<double, NodeId>> anchors;
    for (NodeId id : topo) {
      if (vertex_of_[id] < 0) continue;
      if (mtype_[id] == MappingType::ManyToMany) anchors.push_back({-node_flops(g_, id), id});
    }
    std::stable_sort(anchors.begin(), anchors.end(), [](auto& a, auto& b) { return a.first < b.first; });
    for (auto& [f, id] : anchors) anchor_seeds.push_back(id);
    for (NodeId id : topo)
      if (vertex_of_[id] >= 0 && mtype_[id] != MappingType::ManyToMany) other_seeds.push_back(id);

    form_attention_blocks();
    // Every anchor takes its epilogue before any anchor takes a prologue: a Relu between two
    // convolutions becomes the first one's epilogue (computed once, where the generator fuses
    // it best) even when the second, bigger one seeds first.
    for (NodeId s : anchor_seeds) seed(s, /*with_producers=*/false);
    for (NodeId s : anchor_seeds)
      if (fusable_[s]) grow(vertex_of_[s], true);  // an anchor's vertex survives its merges
    for (NodeId s : other_seeds) seed(s, true);
    if (opt_.profile && cache_) cache_->save();

    for (int v : order_) {
      if (v < 0) continue;
      Vertex& vx = vs_[size_t(v)];
      FusionBlock b;
      b.members = vx.members;
      std::sort(b.members.begin(), b.members.end(), [&](NodeId a, NodeId c) { return node_pos_[a] < node_pos_[c]; });
      b.type = vx.type;
      b.reasons = vx.reasons;
      for (NodeId m : b.members)
        if (mtype_[m] == MappingType::ManyToMany) b.anchor = m;
      if (!vx.pattern_nodes.empty()) {
        b.pattern = "attention";
        b.pattern_nodes = vx.pattern_nodes;
        b.anchor = vx.pattern_nodes.back();
      }
      plan.blocks.push_back(std::move(b));
    }
    plan.stats = stats_;  // recompute adds its own counts
    recompute_shared_chains(g_, t_, plan, node_pos_, max_inputs_, max_members_);
    for (size_t b = 0; b < plan.blocks.size(); ++b) plan.blocks[b].id = int(b);
    fill_block_interfaces(g_, plan);
    plan.stats.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return plan;
  }

 private:
  struct Vertex {
    std::vector<NodeId> members;
    MappingType type = MappingType::OneToOne;
    bool claimed = false;
    bool dead = false;
    std::vector<MemberReason> reasons;
    std::vector<NodeId> pattern_nodes;  // an attention block: MatMul(Q, Kt), Softmax, MatMul(p, V)
  };

  // Attention chains (fusion/attention_pattern.h) become one claimed vertex each before any seed
  // grows, then take their epilogue (the head merge after MatMul(p, V)). CPU targets only: the
  // device targets have no fused attention form yet and run the chain as three anchors.
  void form_attention_blocks() {
    if (!opt_.fuse_attention || t_.family != "cpu") return;
    if (const char* e = std::getenv("NNFUSE_FUSED_ATTENTION"); e && std::string(e) == "0") return;
    for (const AttentionChain& c : find_attention_chains(g_)) {
      bool free = true;
      for (NodeId m : c.members) free = free && vertex_of_[m] >= 0 && !vs_[size_t(vertex_of_[m])].claimed && fusable_[m];
      if (!free) continue;
      // Every link's only use is the next member, so no path leaves the chain and comes back:
      // the merges cannot close a cycle.
      int v = vertex_of_[c.members.front()];
      bool ok = true;
      for (size_t i = 1; i < c.members.size() && ok; ++i) {
        const NodeId m = c.members[i];
        const std::string label = cell_label(vs_[size_t(v)].type, mtype_[m]);
        ok = try_merge(v, vertex_of_[m], v);
        if (ok) {
          vs_[size_t(v)].type = MappingType::ManyToMany;  // from the first Softmax/MatMul on
          vs_[size_t(v)].reasons.push_back({m, c.members[i - 1], label, "attention"});
        }
      }
      if (!ok) fail(ErrorKind::Runtime, "fusion planner: attention chain at " + g_.node(c.softmax).label() + " closes a cycle");
      Vertex& vx = vs_[size_t(v)];
      vx.pattern_nodes = {c.qk, c.softmax, c.pv};
      vx.claimed = true;
      grow(v, /*with_producers=*/false);
    }
  }

  const Graph& g_;
  const TargetDesc& t_;
  const PlanOptions& opt_;
  int max_inputs_, max_members_;
  std::vector<Vertex> vs_;
  std::vector<int> vertex_of_;  // node id -> vertex (-1: Constant / absent)
  std::vector<int> node_pos_;   // node id -> topological position
  std::vector<char> fusable_;   // node id -> t_.can_fuse_op(its op), looked up once (a set of strings)
  // node id -> Graph::successors (body reads included), once: the graph is not edited while
  // planning, and the cycle check of every candidate merge walks them.
  std::vector<std::vector<NodeId>> succs_;
  std::vector<uint32_t> reached_mark_;  // vertex -> stamp of the try_merge that reached it
  uint32_t reach_stamp_ = 0;
  std::vector<int> order_;      // vertices in a topological order of the contracted graph; -1 = dead slot
  std::vector<int> pos_;        // vertex -> index in order_
  std::unordered_map<NodeId, MappingType> mtype_;
  std::unique_ptr<ProfileCache> cache_;
  PlanStats stats_;

  std::vector<int> vertex_succs(int v) const {
    std::vector<int> r;
    for (NodeId m : vs_[size_t(v)].members)
      for (NodeId s : succs_[m]) {  // body reads included: they constrain merges too
        int w = vertex_of_[s];
        if (w >= 0 && w != v) r.push_back(w);
      }
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
    return r;
  }

  // Merges vertex `second` into `first`'s position (first -> second is an edge, pos first <
  // pos second) if no other path first ~> second exists; the survivor gets id `keep`.
  bool try_merge(int first, int second, int keep) {
    const int lo = pos_[size_t(first)], hi = pos_[size_t(second)];
    const uint32_t stamp = ++reach_stamp_;
    auto reach = [&](int w) {  // true the first time this check reaches w
      if (reached_mark_[size_t(w)] == stamp) return false;
      reached_mark_[size_t(w)] = stamp;
      return true;
    };
    std::vector<int> stack;
    for (int w : vertex_succs(first))
      if (w != second && pos_[size_t(w)] < hi && reach(w)) stack.push_back(w);
    while (!stack.empty()) {
      int w = stack.back();
      stack.pop_back();
      for (int x : vertex_succs(w)) {
        if (x == second) {
          ++stats_.rejected_for_cycle;
          return false;
        }
        if (pos_[size_t(x)] < hi && reach(x)) stack.push_back(x);
      }
    }
    // Reorder the window (lo, hi): vertices not reached from `first`, then the merged vertex,
    // then the reached ones. The freed slot becomes a dead slot at `lo`.
    std::vector<int> before, after;
    for (int p = lo + 1; p < hi; ++p) {
      int w = order_[size_t(p)];
      if (w < 0) continue;
      (reached_mark_[size_t(w)] == stamp ? after : before).push_back(w);
    }
    int drop = keep == first ? second : first;
    Vertex& k = vs_[size_t(keep)];
    Vertex& d = vs_[size_t(drop)];
    for (NodeId m : d.members) {
      k.members.push_back(m);
      vertex_of_[m] = keep;
    }
    k.reasons.insert(k.reasons.end(), d.reasons.begin() + (d.reasons.empty() ? 0 : 1), d.reasons.end());
    d.members.clear();
    d.dead = true;
    int p = lo;
    order_[size_t(p++)] = -1;
    for (int w : before) { order_[size_t(p)] = w; pos_[size_t(w)] = p; ++p; }
    order_[size_t(p)] = keep;
    pos_[size_t(keep)] = p++;
    for (int w : after) { order_[size_t(p)] = w; pos_[size_t(w)] = p; ++p; }
    while (p <= hi) order_[size_t(p++)] = -1;  // dead slots in the window leave room at its end
    return true;
  }

  // Distinct values read from outside after adding `cand` to vertex v.
  int inputs_after(int v, NodeId cand) const {
    // Distinct values the members and `cand` read that none of them produces. Views of the
    // graph's names in sorted vectors: this runs for every candidate pair, and std::set<std::string>
    // copies of every name were a large part of planning a small graph.
    std::vector<std::string_view> produced, read;
    auto add = [&](NodeId m) {
      const Node& n = g_.node(m);
      for (auto& o : n.outputs) if (!o.empty()) produced.push_back(o);
      for (auto& i : n.inputs) if (!i.empty()) read.push_back(i);
    };
    for (NodeId m : vs_[size_t(v)].members) add(m);
    add(cand);
    std::sort(produced.begin(), produced.end());
    std::sort(read.begin(), read.end());
    read.erase(std::unique(read.begin(), read.end()), read.end());
    int n = 0;
    for (auto r : read) n += !std::binary_search(produced.begin(), produced.end(), r);
    return n;
  }

  double flops_per_element(NodeId id) const {
    double f = node_flops(g_, id);
    double elems = 0;
    for (auto& o : g_.node(id).outputs)
      if (!o.empty())
        if (auto k = g_.type(o).numel()) elems += double(*k);
    return elems > 0 ? f / elems : 0;
  }

  // Settles a fusable cell for the edge first -> second. Returns the decision label or "" to split.
  std::string decide(const FusionCell& cell, NodeId first, NodeId second) {
    if (cell.status == Profitability::Profitable) return "profitable";
    if (cell.status == Profitability::Unprofitable) return "";
    ++stats_.undecided_pairs;
    PairEstimate e = estimate_pair(g_, first, second, t_);
    Verdict v = judge(e);
    if (v != Verdict::Unsure) {
      ++stats_.settled_by_cost_model;
      return v == Verdict::Fuse ? "cost-model" : "";
    }
    if (!opt_.profile) return e.ratio() >= 1.0 ? "no-profile" : "";
    if (!cache_) cache_ = std::make_unique<ProfileCache>(opt_.profile_cache_path.empty() ? ProfileCache::default_path() : opt_.profile_cache_path);
    std::string key = pair_signature(g_, first, second, e, t_);
    if (auto hit = cache_->find(key)) {
      ++stats_.settled_from_cache;
      return hit->fuse ? "profile-cache" : "";
    }
    ProfileResult r = measure_pair(e);
    cache_->put(key, r);
    ++stats_.settled_by_profile;
    return r.fuse ? "profiled" : "";
  }

  bool within_budget(int v, NodeId cand) {
    if (int(vs_[size_t(v)].members.size()) + 1 > max_members_ || inputs_after(v, cand) > max_inputs_) {
      ++stats_.rejected_for_budget;
      return false;
    }
    return true;
  }

  void seed(NodeId s, bool with_producers) {
    int v = vertex_of_[s];
    if (vs_[size_t(v)].claimed) return;
    vs_[size_t(v)].claimed = true;
    if (fusable_[s]) grow(v, with_producers);
  }

  void grow(int v, bool with_producers) {
    for (bool progress = true; progress;) {
      progress = false;
      // Consumers: the block is the first operator of the pair.
      std::vector<NodeId> members = vs_[size_t(v)].members;
      for (NodeId m : members) {
        for (auto& o : g_.node(m).outputs) {
          if (o.empty()) continue;
          for (const Use& u : g_.consumers(o)) {  // the graph is not edited while planning
            int w = vertex_of_[u.node];
            if (w < 0 || w == v || vs_[size_t(w)].claimed) continue;
            if (!fusable_[u.node]) continue;
            const FusionCell& cell = fusion_cell(vs_[size_t(v)].type, mtype_[u.node]);
            if (!cell.fusable()) continue;
            std::string why = decide(cell, m, u.node);
            if (why.empty() || !within_budget(v, u.node)) continue;
            std::string label = cell_label(vs_[size_t(v)].type, mtype_[u.node]);
            if (!try_merge(v, w, v)) continue;
            vs_[size_t(v)].type = *cell.fused;
            vs_[size_t(v)].reasons.push_back({u.node, m, label, why});
            progress = true;
          }
        }
      }
      // Producers: the block is the second operator of the pair.
      if (!with_producers) continue;  // loops while the consumer pass made progress
      members = vs_[size_t(v)].members;
      for (NodeId m : members) {
        for (auto& in : g_.node(m).inputs) {
          if (in.empty()) continue;
          auto p = g_.producer(in);
          if (!p) continue;
          int w = vertex_of_[*p];
          if (w < 0 || w == v || vs_[size_t(w)].claimed) continue;
          if (!fusable_[*p]) continue;
          const FusionCell& cell = fusion_cell(mtype_[*p], vs_[size_t(v)].type);
          if (!cell.fusable()) continue;
          // A prologue on an anchor's input runs once per reuse of each element: only cheap
          // ops may be recomputed that way (never duplicate an expensive computation).
          if (vs_[size_t(v)].type == MappingType::ManyToMany && flops_per_element(*p) > 8) continue;
          std::string why = decide(cell, *p, m);
          if (why.empty() || !within_budget(v, *p)) continue;
          std::string label = cell_label(mtype_[*p], vs_[size_t(v)].type);
          if (!try_merge(w, v, v)) continue;
          vs_[size_t(v)].type = *cell.fused;
          vs_[size_t(v)].reasons.push_back({*p, m, label, why});
          progress = true;
        }
      }
    }
  }
};

}  // namespace

FusionPlan plan_fusion(const Graph& g, const TargetDesc& t, const PlanOptions& opt) { return Planner(g, t, opt).run(); }

void fill_block_interfaces(const Graph& g, FusionPlan& plan) {
  std::unordered_map<NodeId, std::vector<int>> holders;  // node -> blocks computing it
  for (size_t b = 0; b < plan.blocks.size(); ++b)
    for (NodeId m : plan.blocks[b].members) holders[m].push_back(int(b));
  auto holds = [&](NodeId id, int b) {
    auto it = holders.find(id);
    return it != holders.end() && std::find(it->second.begin(), it->second.end(), b) != it->second.end();
  };
  // If/Loop/Scan bodies read values of this graph by name (outer references), not through node
  // inputs: a block holding such a node reads them too, and a block computing one must write it
  // out (the expanded AffineGrid node tests split a graph input inside both If branches).
  std::unordered_map<NodeId, std::set<std::string>> body_reads;
  std::unordered_map<std::string, std::vector<NodeId>> body_readers;
  for (NodeId id : g.node_ids())
    if (passes::has_subgraph(g.node(id)))
      for (auto& v : body_reads[id] = passes::subgraph_reads(g.node(id))) body_readers[v].push_back(id);
  // Names as views into the graph (not edited here) in sorted vectors, per block: this runs once
  // per plan over every member, and sets of copied strings were most of its time.
  std::vector<std::string_view> produced, seen;
  auto add_input = [&](const std::string& i, FusionBlock& b) {
    if (i.empty() || std::binary_search(produced.begin(), produced.end(), std::string_view(i))) return;
    auto at = std::lower_bound(seen.begin(), seen.end(), std::string_view(i));
    if (at != seen.end() && *at == i) return;
    seen.insert(at, i);
    b.inputs.push_back(i);  // in order of first reading
  };
  for (size_t bi = 0; bi < plan.blocks.size(); ++bi) {
    FusionBlock& b = plan.blocks[bi];
    b.inputs.clear();
    b.outputs.clear();
    produced.clear();
    seen.clear();
    for (NodeId m : b.members)
      for (auto& o : g.node(m).outputs)
        if (!o.empty()) produced.push_back(o);
    std::sort(produced.begin(), produced.end());
    for (NodeId m : b.members) {
      for (auto& i : g.node(m).inputs) add_input(i, b);
      if (auto it = body_reads.find(m); it != body_reads.end())
        for (auto& i : it->second) add_input(i, b);
    }
    for (NodeId m : b.members)
      for (auto& o : g.node(m).outputs) {
        if (o.empty()) continue;
        // Written out when some block reading it does not compute it itself.
        bool outside = g.is_output(o);
        std::vector<NodeId> readers;
        for (auto& u : g.consumers(o)) readers.push_back(u.node);
        if (auto br = body_readers.find(o); br != body_readers.end()) readers.insert(readers.end(), br->second.begin(), br->second.end());
        for (NodeId u : readers) {
          auto it = holders.find(u);
          if (it == holders.end()) continue;
          for (int reader : it->second) outside |= !holds(m, reader);
        }
        if (outside) b.outputs.push_back(o);
      }
  }
}

void check_plan(const Graph& g, const FusionPlan& plan) {
  std::unordered_map<NodeId, int> copies;
  std::unordered_map<NodeId, int> recomputed;  // copies marked "recomputed"
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    std::unordered_set<NodeId> here;
    for (NodeId m : plan.blocks[b].members) {
      if (!g.has_node(m)) fail(ErrorKind::Model, "fusion plan: block " + std::to_string(b) + " names a node that is not in the graph");
      if (!here.insert(m).second) fail(ErrorKind::Model, "fusion plan: node '" + g.node(m).label() + "' is twice in block " + std::to_string(b));
      ++copies[m];
    }
    for (auto& r : plan.blocks[b].reasons)
      if (r.decision == "recomputed") ++recomputed[r.node];
  }
  for (auto& [id, n] : copies) {
    if (n == 1) continue;
    // A node in several blocks is a recomputed cheap op: never an anchor, and every copy says so.
    const Node& nd = g.node(id);
    if (node_mapping_type(g, id) == MappingType::ManyToMany)
      fail(ErrorKind::Model, "fusion plan: Many-to-Many node '" + nd.label() + "' (" + nd.op_type + ") is in " + std::to_string(n) + " blocks");
    // At most one block computes it as an ordinary member (a prologue whose readers recompute it).
    if (recomputed[id] < n - 1)
      fail(ErrorKind::Model, "fusion plan: node '" + nd.label() + "' (" + nd.op_type + ") is in " + std::to_string(n) +
                                 " blocks but only " + std::to_string(recomputed[id]) + " copies are marked recomputed");
  }
  std::unordered_set<NodeId> consts(plan.constants.begin(), plan.constants.end());
  for (NodeId id : g.node_ids())
    if (!copies.count(id) && !consts.count(id))
      fail(ErrorKind::Model, "fusion plan: node '" + g.node(id).label() + "' (" + g.node(id).op_type + ") is in no block");
  // Blocks must be in a topological order of the contracted graph: every value a block reads is
  // a graph input, a weight, a Constant or an output of an earlier block.
  std::unordered_set<std::string> ready;
  for (auto& i : g.inputs()) ready.insert(i);
  for (auto& i : g.initializer_names()) ready.insert(i);
  for (NodeId c : plan.constants)
    for (auto& o : g.node(c).outputs) ready.insert(o);
  for (auto& b : plan.blocks) {
    for (auto& i : b.inputs)
      if (!ready.count(i) && g.producer(i))
        fail(ErrorKind::Model, "fusion plan: block " + std::to_string(b.id) + " reads '" + i +
                                   "' before a block writes it out (a cycle between blocks, or a missing output)");
    for (auto& o : b.outputs) ready.insert(o);
  }
}

TensorMap run_plan_reference(const Graph& g, const FusionPlan& plan, const TensorMap& feeds) {
  TensorMap env = feeds;
  for (auto& name : g.initializer_names())
    if (!env.count(name)) env[name] = g.initializer(name);
  for (NodeId c : plan.constants) {
    const Node& n = g.node(c);
    auto outs = run_node(n, g.opset(n.domain), {});
    for (size_t k = 0; k < n.outputs.size() && k < outs.size(); ++k) env[n.outputs[k]] = outs[k];
  }
  for (auto& b : plan.blocks) {
    Graph sub = g.extract(b.members);
    TensorMap sub_feeds;
    for (auto& i : sub.inputs()) {
      auto it = env.find(i);
      if (it == env.end()) fail(ErrorKind::Model, "block " + std::to_string(b.id) + " input '" + i + "' has no value");
      sub_feeds[i] = it->second;
    }
    // b.outputs, not sub.outputs(): a value read only by a later block's If/Loop body is written
    // out too, and extract() sees only node inputs when it picks the sub-graph's outputs.
    TensorMap out = Interpreter(sub).run(sub_feeds, b.outputs);
    // Only what the block writes out is visible to later blocks: a recomputed value must be
    // computed again by every block that reads it.
    for (auto& o : b.outputs) env[o] = out.at(o);
  }
  TensorMap result;
  for (auto& o : g.outputs()) result[o] = env.at(o);
  return result;
}

}  // namespace nnfuse
