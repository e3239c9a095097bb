#include "fusion/planner.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "graph/op_registry.h"

namespace nnfuse {

int FusionPlan::block_of(NodeId id) const {
  for (size_t b = 0; b < blocks.size(); ++b)
    for (NodeId m : blocks[b].members)
      if (m == id) return int(b);
  return -1;
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
    std::vector<NodeId> topo = g_.topo_order();
    NodeId max_id = 0;
    for (NodeId id : topo) max_id = std::max(max_id, id);
    vertex_of_.assign(size_t(max_id) + 1, -1);
    node_pos_.assign(size_t(max_id) + 1, -1);
    for (NodeId id : topo) {
      const Node& n = g_.node(id);
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
      vertex_of_[id] = v;
      mtype_[id] = vs_[size_t(v)].type;
      pos_.push_back(int(order_.size()));
      order_.push_back(v);
    }
    for (size_t i = 0; i < topo.size(); ++i) node_pos_[topo[i]] = int(i);

    // Seeds: Many-to-Many anchors by cost, then everything else in topological order.
    std::vector<NodeId> seeds;
    std::vector<std::pair<double, NodeId>> anchors;
    for (NodeId id : topo) {
      if (vertex_of_[id] < 0) continue;
      if (mtype_[id] == MappingType::ManyToMany) anchors.push_back({-node_flops(g_, id), id});
    }
    std::stable_sort(anchors.begin(), anchors.end(), [](auto& a, auto& b) { return a.first < b.first; });
    for (auto& [f, id] : anchors) seeds.push_back(id);
    for (NodeId id : topo)
      if (vertex_of_[id] >= 0 && mtype_[id] != MappingType::ManyToMany) seeds.push_back(id);

    for (NodeId s : seeds) {
      int v = vertex_of_[s];
      if (vs_[size_t(v)].claimed) continue;
      vs_[size_t(v)].claimed = true;
      if (!t_.can_fuse_op(g_.node(s).op_type)) continue;
      grow(v);
    }
    if (opt_.profile && cache_) cache_->save();

    int bid = 0;
    for (int v : order_) {
      if (v < 0) continue;
      Vertex& vx = vs_[size_t(v)];
      FusionBlock b;
      b.id = bid++;
      b.members = vx.members;
      std::sort(b.members.begin(), b.members.end(), [&](NodeId a, NodeId c) { return node_pos_[a] < node_pos_[c]; });
      b.type = vx.type;
      b.reasons = vx.reasons;
      for (NodeId m : b.members)
        if (mtype_[m] == MappingType::ManyToMany) b.anchor = m;
      fill_interface(b);
      plan.blocks.push_back(std::move(b));
    }
    stats_.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    plan.stats = stats_;
    return plan;
  }

 private:
  struct Vertex {
    std::vector<NodeId> members;
    MappingType type = MappingType::OneToOne;
    bool claimed = false;
    bool dead = false;
    std::vector<MemberReason> reasons;
  };

  const Graph& g_;
  const TargetDesc& t_;
  const PlanOptions& opt_;
  int max_inputs_, max_members_;
  std::vector<Vertex> vs_;
  std::vector<int> vertex_of_;  // node id -> vertex (-1: Constant / absent)
  std::vector<int> node_pos_;   // node id -> topological position
  std::vector<int> order_;      // vertices in a topological order of the contracted graph; -1 = dead slot
  std::vector<int> pos_;        // vertex -> index in order_
  std::unordered_map<NodeId, MappingType> mtype_;
  std::unique_ptr<ProfileCache> cache_;
  PlanStats stats_;

  std::vector<int> vertex_succs(int v) const {
    std::vector<int> r;
    for (NodeId m : vs_[size_t(v)].members)
      for (NodeId s : g_.successors(m)) {
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
    std::unordered_set<int> reached;
    std::vector<int> stack;
    for (int w : vertex_succs(first))
      if (w != second && pos_[size_t(w)] < hi && reached.insert(w).second) stack.push_back(w);
    while (!stack.empty()) {
      int w = stack.back();
      stack.pop_back();
      for (int x : vertex_succs(w)) {
        if (x == second) {
          ++stats_.rejected_for_cycle;
          return false;
        }
        if (pos_[size_t(x)] < hi && reached.insert(x).second) stack.push_back(x);
      }
    }
    // Reorder the window (lo, hi): vertices not reached from `first`, then the merged vertex,
    // then the reached ones. The freed slot becomes a dead slot at `lo`.
    std::vector<int> before, after;
    for (int p = lo + 1; p < hi; ++p) {
      int w = order_[size_t(p)];
      if (w < 0) continue;
      (reached.count(w) ? after : before).push_back(w);
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
    std::set<std::string> produced, read;
    auto add = [&](NodeId m) {
      const Node& n = g_.node(m);
      for (auto& o : n.outputs) if (!o.empty()) produced.insert(o);
      for (auto& i : n.inputs) if (!i.empty()) read.insert(i);
    };
    for (NodeId m : vs_[size_t(v)].members) add(m);
    add(cand);
    int n = 0;
    for (auto& r : read) n += !produced.count(r);
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

  void grow(int v) {
    for (bool progress = true; progress;) {
      progress = false;
      // Consumers: the block is the first operator of the pair.
      std::vector<NodeId> members = vs_[size_t(v)].members;
      for (NodeId m : members) {
        for (auto& o : g_.node(m).outputs) {
          if (o.empty()) continue;
          std::vector<Use> uses = g_.consumers(o);
          for (auto& u : uses) {
            int w = vertex_of_[u.node];
            if (w < 0 || w == v || vs_[size_t(w)].claimed) continue;
            if (!t_.can_fuse_op(g_.node(u.node).op_type)) continue;
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
      members = vs_[size_t(v)].members;
      for (NodeId m : members) {
        for (auto& in : g_.node(m).inputs) {
          if (in.empty()) continue;
          auto p = g_.producer(in);
          if (!p) continue;
          int w = vertex_of_[*p];
          if (w < 0 || w == v || vs_[size_t(w)].claimed) continue;
          if (!t_.can_fuse_op(g_.node(*p).op_type)) continue;
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

  void fill_interface(FusionBlock& b) const {
    std::unordered_set<NodeId> inside(b.members.begin(), b.members.end());
    std::set<std::string> produced;
    for (NodeId m : b.members)
      for (auto& o : g_.node(m).outputs)
        if (!o.empty()) produced.insert(o);
    std::set<std::string> seen;
    for (NodeId m : b.members)
      for (auto& i : g_.node(m).inputs)
        if (!i.empty() && !produced.count(i) && seen.insert(i).second) b.inputs.push_back(i);
    for (NodeId m : b.members)
      for (auto& o : g_.node(m).outputs) {
        if (o.empty()) continue;
        bool outside = g_.is_output(o);
        for (auto& u : g_.consumers(o)) outside |= !inside.count(u.node);
        if (outside) b.outputs.push_back(o);
      }
  }
};

}  // namespace

FusionPlan plan_fusion(const Graph& g, const TargetDesc& t, const PlanOptions& opt) { return Planner(g, t, opt).run(); }

void check_plan(const Graph& g, const FusionPlan& plan) {
  std::unordered_map<NodeId, int> owner;
  for (size_t b = 0; b < plan.blocks.size(); ++b)
    for (NodeId m : plan.blocks[b].members) {
      if (!g.has_node(m)) fail(ErrorKind::Model, "fusion plan: block " + std::to_string(b) + " names a node that is not in the graph");
      if (!owner.emplace(m, int(b)).second)
        fail(ErrorKind::Model, "fusion plan: node '" + g.node(m).label() + "' is in two blocks");
    }
  std::unordered_set<NodeId> consts(plan.constants.begin(), plan.constants.end());
  for (NodeId id : g.node_ids())
    if (!owner.count(id) && !consts.count(id))
      fail(ErrorKind::Model, "fusion plan: node '" + g.node(id).label() + "' (" + g.node(id).op_type + ") is in no block");
  // Blocks must be in a topological order of the contracted graph: every block input is ready.
  std::unordered_set<std::string> ready;
  for (auto& i : g.inputs()) ready.insert(i);
  for (auto& i : g.initializer_names()) ready.insert(i);
  for (NodeId c : plan.constants)
    for (auto& o : g.node(c).outputs) ready.insert(o);
  for (auto& b : plan.blocks) {
    for (auto& i : b.inputs)
      if (!ready.count(i) && g.producer(i))
        fail(ErrorKind::Model, "fusion plan: block " + std::to_string(b.id) + " reads '" + i + "' before it is produced (a cycle between blocks)");
    for (NodeId m : b.members)
      for (auto& o : g.node(m).outputs)
        if (!o.empty()) ready.insert(o);
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
    TensorMap out = Interpreter(sub).run(sub_feeds, sub.outputs());
    for (auto& [k, v] : out) env[k] = v;
  }
  TensorMap result;
  for (auto& o : g.outputs()) result[o] = env.at(o);
  return result;
}

}  // namespace nnfuse
