#include "fusion/recompute.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "fusion/cost_model.h"
#include "fusion/fusion_table.h"
#include "graph/op_registry.h"
#include "rewrite/passes_util.h"

namespace nnfuse {

namespace {

// Elementwise members only: each output element costs the same few operations, so a copy costs
// what the chain's kernel costs. Shuffles are left out (a copy would repeat strided reads).
bool recomputable_type(MappingType m) {
  return m == MappingType::OneToOne || m == MappingType::OneToMany || m == MappingType::Reorganize;
}

class Recomputer {
 public:
  Recomputer(const Graph& g, const TargetDesc& t, FusionPlan& plan, const std::vector<int>& node_pos, int max_inputs, int max_members)
      : g_(g), t_(t), plan_(plan), pos_(node_pos), max_inputs_(max_inputs), max_members_(max_members) {}

  void run() {
    blocks_of_.assign(pos_.size(), {});
    mtype_.assign(pos_.size(), MappingType::OneToOne);
    for (size_t b = 0; b < plan_.blocks.size(); ++b)
      for (NodeId m : plan_.blocks[b].members) {
        blocks_of_[size_t(m)].push_back(int(b));
        mtype_[size_t(m)] = node_mapping_type(g_, m);
      }
    dead_.assign(plan_.blocks.size(), false);
    // In plan order: a block that received a copy is examined later with the copy included, so
    // its own cost check covers what it would duplicate further.
    for (size_t c = 0; c < plan_.blocks.size(); ++c) {
      try_whole_block(int(c));
      if (!dead_[c]) try_shared_part(int(c));
    }
    std::vector<FusionBlock> alive;
    for (size_t b = 0; b < plan_.blocks.size(); ++b)
      if (!dead_[b]) alive.push_back(std::move(plan_.blocks[b]));
    plan_.blocks = std::move(alive);
  }

 private:
  const Graph& g_;
  const TargetDesc& t_;
  FusionPlan& plan_;
  const std::vector<int>& pos_;
  int max_inputs_, max_members_;
  std::vector<std::vector<int>> blocks_of_;  // node id -> blocks holding it
  std::vector<MappingType> mtype_;           // node id -> mapping type (every block member)
  std::vector<bool> dead_;
  const std::set<std::string> body_read_ = passes::names_read_by_subgraphs(g_);  // values If/Loop/Scan bodies read

  struct Edge {
    NodeId producer;  // chain member
    NodeId consumer;  // node outside the chain reading it
  };

  bool holds(int b, NodeId id) const {
    const auto& v = blocks_of_[size_t(id)];
    return std::find(v.begin(), v.end(), b) != v.end();
  }

  MappingType mtype(NodeId id) const { return mtype_[size_t(id)]; }

  // Whether generated float32 kernels can compute the chain: every value it reads or makes is
  // float32 or a constant (folded at lowering), except integer/bool values that reach only Casts
  // to float32, possibly through Reorganize members (loaded as float: an int64 attention mask,
  // unsqueezed and cast). Anything else would send the reader blocks to the fallback kernels.
  bool float_chain(const std::vector<NodeId>& chain) const {
    std::unordered_set<NodeId> inside(chain.begin(), chain.end());
    std::unordered_map<std::string, bool> cast_only;  // non-float value -> reaches only Casts to float
    std::function<bool(const std::string&)> loads_as_float = [&](const std::string& v) {
      auto it = cast_only.find(v);
      if (it != cast_only.end()) return it->second;
      auto p = g_.producer(v);
      bool made_here = p && inside.count(*p);  // then no reader outside may need it as it is
      bool ok = !g_.is_output(v);
      for (auto& u : g_.consumers(v)) {
        if (!inside.count(u.node)) {
          ok = ok && !made_here;
          continue;
        }
        const Node& c = g_.node(u.node);
        bool to_float = c.op_type == "Cast" && c.attrs.get_int("to", 0) == int64_t(DType::Float32);
        bool moves = mtype(u.node) == MappingType::Reorganize && u.slot == 0 && !c.outputs.empty() &&
                     loads_as_float(c.outputs[0]);
        ok = ok && (to_float || moves);
      }
      return cast_only[v] = ok;
    };
    auto fits = [&](const std::string& v) {
      return v.empty() || g_.type(v).dtype == DType::Float32 || g_.constant_value(v) || loads_as_float(v);
    };
    for (NodeId m : chain) {
      const Node& n = g_.node(m);
      for (auto& o : n.outputs)
        if (!fits(o)) return false;
      // Only the data input of a Reorganize member matters; its shape arguments are static.
      size_t data_inputs = mtype(m) == MappingType::Reorganize ? 1 : n.inputs.size();
      for (size_t i = 0; i < n.inputs.size() && i < data_inputs; ++i)
        if (!fits(n.inputs[i])) return false;
    }
    return true;
  }

  // `from` and every node of `members` that `from` depends on through members only.
  std::unordered_set<NodeId> upstream(const std::vector<NodeId>& members, const std::vector<NodeId>& from) const {
    std::unordered_map<std::string, NodeId> made;
    for (NodeId m : members)
      for (auto& o : g_.node(m).outputs)
        if (!o.empty()) made[o] = m;
    std::unordered_set<NodeId> seen(from.begin(), from.end());
    std::vector<NodeId> stack(from);
    while (!stack.empty()) {
      NodeId id = stack.back();
      stack.pop_back();
      for (auto& i : g_.node(id).inputs) {
        auto it = made.find(i);
        if (it != made.end() && seen.insert(it->second).second) stack.push_back(it->second);
      }
    }
    return seen;
  }

  // The chain members a consumer block needs: those whose outputs it reads, and their producers
  // inside the chain (topological order).
  std::vector<NodeId> part_for(const std::vector<NodeId>& chain, int d, const std::vector<Edge>& edges) const {
    std::vector<NodeId> read;
    for (auto& e : edges)
      if (holds(d, e.consumer)) read.push_back(e.producer);
    std::unordered_set<NodeId> need = upstream(chain, read);
    std::vector<NodeId> part;
    for (NodeId m : chain)
      if (need.count(m)) part.push_back(m);
    return part;
  }

  // The anchor of a block and the members it depends on inside the block (its prologue).
  std::unordered_set<NodeId> prologue_of(const FusionBlock& d) const {
    if (d.anchor == kNoNode) return {};
    return upstream(d.members, {d.anchor});
  }

  int inputs_after(const FusionBlock& d, const std::vector<NodeId>& part) const {
    std::unordered_set<std::string> produced, read;
    auto add = [&](NodeId m) {
      for (auto& o : g_.node(m).outputs)
        if (!o.empty()) produced.insert(o);
      for (auto& i : g_.node(m).inputs)
        if (!i.empty()) read.insert(i);
    };
    for (NodeId m : d.members) add(m);
    for (NodeId m : part) add(m);
    int n = 0;
    for (auto& r : read) n += !produced.count(r);
    return n;
  }

  // The mapping type of block d with the chain's part copied in, or nullopt where it may not take it.
  std::optional<MappingType> admit(MappingType chain_type, int d, const std::vector<NodeId>& part, const std::vector<Edge>& edges) const {
    const FusionBlock& blk = plan_.blocks[size_t(d)];
    for (NodeId m : blk.members)
      if (!t_.can_fuse_op(g_.node(m).op_type)) return std::nullopt;
    if (int(blk.members.size() + part.size()) > max_members_ || inputs_after(blk, part) > max_inputs_) return std::nullopt;
    std::unordered_set<NodeId> pro = prologue_of(blk);
    for (auto& e : edges) {
      if (!holds(d, e.consumer)) continue;
      if (e.consumer == blk.anchor || pro.count(e.consumer)) {
        // A prologue runs once per reuse of each anchor input element: only where the table
        // calls the pair profitable outright (a One-to-One chain before the anchor).
        const FusionCell& cell = fusion_cell(chain_type, MappingType::ManyToMany);
        if (!cell.fusable() || cell.status != Profitability::Profitable) return std::nullopt;
      } else if (!fusion_cell(chain_type, mtype(e.consumer)).fusable()) {
        return std::nullopt;
      }
    }
    if (blk.type == MappingType::ManyToMany) return MappingType::ManyToMany;
    const FusionCell& cell = fusion_cell(chain_type, blk.type);
    if (!cell.fusable()) return std::nullopt;
    return *cell.fused;
  }

  void copy_into(const std::vector<NodeId>& part, int d, MappingType type) {
    FusionBlock& blk = plan_.blocks[size_t(d)];
    std::unordered_set<NodeId> now(blk.members.begin(), blk.members.end());
    now.insert(part.begin(), part.end());
    for (NodeId m : part) {
      // The partner is the first member of the block reading this copy's output.
      NodeId partner = kNoNode;
      for (auto& o : g_.node(m).outputs)
        if (!o.empty())
          for (auto& u : g_.consumers(o))
            if (now.count(u.node) && (partner == kNoNode || pos_[size_t(u.node)] < pos_[size_t(partner)])) partner = u.node;
      blk.reasons.push_back({m, partner, cell_label(mtype(m), mtype(partner == kNoNode ? m : partner)), "recomputed"});
      blk.members.push_back(m);
      blocks_of_[size_t(m)].push_back(d);
    }
    std::sort(blk.members.begin(), blk.members.end(), [&](NodeId a, NodeId b) { return pos_[size_t(a)] < pos_[size_t(b)]; });
    blk.type = type;
  }

  // Blocks whose members are all cheap: the whole block is the chain and its kernel goes away.
  void try_whole_block(int c) {
    const FusionBlock& blk = plan_.blocks[size_t(c)];
    if (blk.anchor == kNoNode && !blk.members.empty()) try_recompute(c, blk.members, true);
  }

  // A cheap chain inside a bigger block (an anchor's prologue or side input, or the head of an
  // elementwise block) whose values other blocks read: they compute it themselves and the block
  // stops writing it out (a Relu of an input that two convolutions read). The block keeps its
  // copy; no kernel goes away, a write and n reads do.
  void try_shared_part(int h) {
    const std::vector<NodeId> members = plan_.blocks[size_t(h)].members;
    for (NodeId m : members) {
      if (mtype(m) == MappingType::ManyToMany || !read_elsewhere(m, h)) continue;
      std::unordered_set<NodeId> up = upstream(members, {m});
      // The block must keep members of its own that write something out: a chain that is the
      // whole block would leave a kernel with no outputs (that case is try_whole_block's).
      if (up.size() == members.size()) continue;
      std::vector<NodeId> chain;
      for (NodeId x : members)
        if (up.count(x)) chain.push_back(x);
      try_recompute(h, chain, false);
    }
  }

  bool read_elsewhere(NodeId m, int h) const {
    for (auto& o : g_.node(m).outputs)
      if (!o.empty())
        for (auto& u : g_.consumers(o))
          for (int b : blocks_of_[size_t(u.node)])
            if (b != h && !holds(b, m)) return true;
    return false;
  }

  // The fused type of a chain of recomputable members.
  MappingType chain_type(const std::vector<NodeId>& chain) const {
    MappingType t = MappingType::OneToOne;
    for (NodeId m : chain) {
      MappingType mt = mtype(m);
      if (mt == MappingType::OneToMany) t = mt;
      else if (mt == MappingType::Reorganize && t == MappingType::OneToOne) t = mt;
    }
    return t;
  }

  // `chain` (members of block c, topological order) is copied into every other block reading its
  // values. own_kernel: the chain is all of block c, which is dropped.
  void try_recompute(int c, const std::vector<NodeId>& chain, bool own_kernel) {
    std::unordered_set<NodeId> inside(chain.begin(), chain.end());
    for (NodeId m : chain)
      if (!recomputable_type(mtype(m)) || !t_.can_fuse_op(g_.node(m).op_type) || blocks_of_[size_t(m)].size() != 1) return;
    std::vector<Edge> edges;
    std::set<int> targets;  // consumer blocks, in plan order
    for (NodeId m : chain)
      for (auto& o : g_.node(m).outputs) {
        if (o.empty()) continue;
        if (g_.is_output(o)) return;  // written out anyway: a copy would only add work
        // An If/Loop/Scan body reads it by name, not as a node input: its block must write it.
        if (body_read_.count(o)) return;
        for (auto& u : g_.consumers(o)) {
          if (inside.count(u.node)) continue;
          for (int b : blocks_of_[size_t(u.node)])
            if (b != c) {
              edges.push_back({m, u.node});
              targets.insert(b);
            }
        }
      }
    // A chain with its own kernel and one reader block: that is fusion, which growth decides.
    if (targets.size() < (own_kernel ? 2u : 1u)) return;
    if (t_.float32_kernels_only && !float_chain(chain)) return;
    RecomputeEstimate e = estimate_recompute(g_, chain, int(targets.size()), t_, own_kernel);
    if (e.flops_per_element > kRecomputeMaxFlopsPerElement) return;
    // Never make the consumers read more than the materialised output, unless it stays in L1.
    if (e.input_bytes > e.output_bytes && e.input_bytes > t_.l1_bytes) return;
    if (!e.recompute()) return;
    MappingType type = chain_type(chain);
    std::vector<std::pair<std::vector<NodeId>, MappingType>> copies;
    for (int d : targets) {
      std::vector<NodeId> part = part_for(chain, d, edges);
      std::optional<MappingType> fused = admit(type, d, part, edges);
      if (!fused) return;  // all or nothing: a single reader left means the value is written out anyway
      copies.push_back({std::move(part), *fused});
    }
    size_t k = 0;
    for (int d : targets) {
      copy_into(copies[k].first, d, copies[k].second);
      ++k;
    }
    if (own_kernel) {
      for (NodeId m : chain) {
        auto& v = blocks_of_[size_t(m)];
        v.erase(std::remove(v.begin(), v.end(), c), v.end());
      }
      dead_[size_t(c)] = true;
    }
    ++plan_.stats.recomputed_chains;
    plan_.stats.recomputed_copies += int(targets.size());
  }
};

}  // namespace

void recompute_shared_chains(const Graph& g, const TargetDesc& t, FusionPlan& plan, const std::vector<int>& node_pos,
                             int max_block_inputs, int max_block_members) {
  Recomputer(g, t, plan, node_pos, max_block_inputs, max_block_members).run();
}

}  // namespace nnfuse
