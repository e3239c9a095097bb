#pragma once
// The DNNFusion-style fusion planner.
//
// Every operator starts as its own block. Seeds are taken Many-to-Many anchors first, by FLOPs,
// then the remaining operators in topological order; each seed grows along its consumers and
// producers while the fusion table admits the pair (the block's fused mapping type first or
// second), the target can lower the op, the block stays within the target's budgets, and the
// contracted graph stays acyclic. Anchors take their consumers (epilogues) before any anchor
// takes producers (prologues). Undecided cells go to the cost model and, where it is unsure, to
// a short measurement kept in the profile cache.
//
// A tensor with several consumers is handled one of three ways: its consumers fuse into the
// producer's block, it is materialised (a block output), or, when its producer is a cheap chain
// that would otherwise run as its own kernel, the chain is recomputed inside every consumer
// block (see fusion/recompute.h). A recomputed node is then a member of several blocks.
#include <string>
#include <vector>

#include "fusion/cost_model.h"
#include "fusion/fusion_table.h"
#include "fusion/target.h"
#include "graph/graph.h"
#include "graph/interpreter.h"

namespace nnfuse {

struct MemberReason {
  NodeId node = kNoNode;
  NodeId partner = kNoNode;  // the member it was fused with (kNoNode for the seed)
  std::string cell;          // "seed" or the table cell, e.g. "Many-to-Many+One-to-One"
  // "seed", "profitable", "cost-model", "profiled", "profile-cache", "no-profile",
  // "recomputed" (a copy of a cheap chain computed again in this block; see fusion/recompute.h),
  // or "attention" (a member of an attention chain fused whole; fusion/attention_pattern.h)
  std::string decision;
};

struct FusionBlock {
  int id = 0;
  std::vector<NodeId> members;  // topological order; recomputed nodes appear in several blocks
  NodeId anchor = kNoNode;      // the Many-to-Many member, if any
  MappingType type = MappingType::OneToOne;
  std::vector<std::string> inputs;   // values read from outside the block (weights included)
  std::vector<std::string> outputs;  // values used outside the block or graph outputs
  std::vector<MemberReason> reasons; // one per member, in the order they joined
  // "attention": a chain MatMul -> score transform -> Softmax -> MatMul fused whole
  // (fusion/attention_pattern.h), lowered to the fused attention kernel; pattern_nodes then holds
  // its MatMul(Q, Kt), Softmax and MatMul(p, V), and `anchor` is the last. "" for other blocks.
  std::string pattern;
  std::vector<NodeId> pattern_nodes;
};

struct PlanStats {
  int undecided_pairs = 0;
  int settled_by_cost_model = 0;
  int settled_by_profile = 0;
  int settled_from_cache = 0;
  int rejected_for_cycle = 0;
  int rejected_for_budget = 0;
  int recomputed_chains = 0;  // chains whose own kernel was replaced by copies in their consumers
  int recomputed_copies = 0;  // copies made (one per consumer block)
  double ms = 0;
};

struct FusionPlan {
  std::string target;
  std::vector<FusionBlock> blocks;  // an executable (topological) order
  std::vector<NodeId> constants;    // Constant nodes: folded into weights, not kernels
  PlanStats stats;
  size_t kernels() const { return blocks.size(); }
  // Index of the first block holding a node, or -1 (Constant nodes).
  int block_of(NodeId id) const;
  // Indices of every block holding a node (several for a recomputed node).
  std::vector<int> blocks_of(NodeId id) const;
};

struct PlanOptions {
  bool profile = true;             // false: --no-profile (deterministic, offline)
  std::string profile_cache_path;  // "" = ProfileCache::default_path()
  int max_block_inputs = -1;       // -1: the target's budget
  int max_block_members = -1;      // -1: the target's budget
  // Attention chains as one block each (CPU targets; $NNFUSE_FUSED_ATTENTION=0 turns it off).
  bool fuse_attention = true;
};

// Plans fusion for a graph whose shapes have been inferred.
FusionPlan plan_fusion(const Graph& g, const TargetDesc& t, const PlanOptions& opt = {});

// Checks a plan: every non-Constant node in a block (several only when every copy is marked
// recomputed and the node is not Many-to-Many), blocks in topological order of the contracted
// graph (each block reads only graph inputs, weights and outputs of earlier blocks), inputs and
// outputs consistent. Throws Model error naming the first problem.
void check_plan(const Graph& g, const FusionPlan& plan);

// Fills every block's inputs and outputs from its members. A value is a block output when it is
// a graph output or some block reading it does not compute it itself.
void fill_block_interfaces(const Graph& g, FusionPlan& plan);

// Executes the plan block by block with the reference interpreter (each block extracted as a
// standalone graph); the outputs must equal those of the unfused graph.
TensorMap run_plan_reference(const Graph& g, const FusionPlan& plan, const TensorMap& feeds);

}  // namespace nnfuse
