#pragma once
// Recomputation: the third way, besides fusing every consumer into the producer's block and
// materialising, to handle a tensor read by several blocks.
//
// After growth, a block that is a cheap chain (no Many-to-Many member; One-to-One, broadcasting
// One-to-Many and Reorganize members only; a few FLOPs per element) and whose outputs are read by
// two or more other blocks may be copied into each of them instead of running as its own kernel
// whose output they all read back: an attention mask `(1 - mask) * -10000` feeding every layer, a
// Relu on a tensor that several convolutions read. Each copy is listed in its block with the
// decision "recomputed". Likewise a cheap prologue or side chain inside an anchored block whose
// values other blocks read (a Relu of an input that two convolutions read) is copied into those
// blocks, and the block stops writing it out: no kernel goes away, but a write and n reads do.
// The chain is recomputed only when
//   - it produces no graph output and has no member recomputed already (with its own kernel, it
//     has two or more reader blocks; one reader block would be plain fusion, left to growth),
//   - every consumer block can take it: the fusion table admits the chain's type before the
//     member that reads it (before the anchor itself only as a profitable One-to-One prologue),
//     the target can lower every member, and the block stays within its budgets,
//   - re-reading its inputs costs no more than reading its output back (input bytes at most
//     output bytes, or small enough to stay in L1), the chain's values are float32 where the
//     target's kernels compute only in float32 (integer/bool values only as far as a Cast to
//     float, through Reorganize members: an int64 mask unsqueezed and cast), and
//   - the cost model (estimate_recompute) finds n copies no slower than one kernel plus n reads.
// Every consumer block comes after the chain in the plan's order, and the chain's inputs come from
// blocks before it, so dropping the chain's block keeps the order topological: the contracted
// graph stays acyclic. No measurement is taken, so --no-profile plans stay deterministic.
#include "fusion/planner.h"

namespace nnfuse {

// The most FLOPs per output element a recomputed chain may cost ("a few ops per element").
constexpr double kRecomputeMaxFlopsPerElement = 4.0;

// Replaces cheap chain blocks, and shared cheap prologues, by copies in their reader blocks (see above). Blocks keep their
// members and types; inputs, outputs and ids are left for the caller to refill. Updates
// plan.stats.recomputed_chains / recomputed_copies. `node_pos` maps a node id to its topological
// position (members are kept in topological order).
void recompute_shared_chains(const Graph& g, const TargetDesc& t, FusionPlan& plan, const std::vector<int>& node_pos,
                             int max_block_inputs, int max_block_members);

}  // namespace nnfuse
