#pragma once
// The cost model that settles undecided pairs of the fusion table, and the profile cache that
// keeps measurements for pairs the model cannot call.
//
// Fusing a pair saves writing the intermediate tensor and reading it back (and one kernel
// launch); it costs whatever the fused access pattern loses: strided accesses when a Shuffle
// moves the innermost dimension, index arithmetic (div/mod) when a Reorganize is composed with
// a broadcast, repeated writes when a One-to-Many expands an anchor's output.
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "fusion/target.h"
#include "graph/graph.h"

namespace nnfuse {

enum class FusedAccess { Free, Strided, IndexArith, Broadcast };
const char* fused_access_name(FusedAccess a);

struct PairEstimate {
  double saved_us = 0;    // time the fusion saves (memory round trip + launch)
  double penalty_us = 0;  // time the fused access pattern loses
  FusedAccess access = FusedAccess::Free;
  int64_t intermediate_bytes = 0;
  int64_t elements = 0;   // elements of the consumer's output (where the penalty applies)
  int64_t inner_stride = 1;
  // saved/penalty; infinity when there is no penalty.
  double ratio() const;
};

// Estimates fusing producer `first` into consumer `second` (an edge of g) on target t.
PairEstimate estimate_pair(const Graph& g, NodeId first, NodeId second, const TargetDesc& t);

// Recomputing a cheap chain (fusion/recompute.h) in each of its `consumers` blocks instead of
// running it as its own kernel whose output every consumer reads back.
struct RecomputeEstimate {
  double flops_per_element = 0;  // the chain's FLOPs per element of its largest output
  int64_t input_bytes = 0;       // what the chain reads (each copy reads it again)
  int64_t output_bytes = 0;      // what the chain's kernel writes (and each consumer reads back)
  int consumers = 0;
  double materialise_us = 0;     // one kernel: a launch, read inputs, write outputs, n reads back
  double recompute_us = 0;       // n copies: each reads the inputs and recomputes the chain
  bool recompute() const { return recompute_us <= materialise_us; }
};

// `chain` are the chain's nodes; its outputs are the values it produces that nodes outside it read.
// own_kernel: the chain runs as its own kernel unless recomputed (else it sits in a block that
// keeps computing it, and recompute only saves writing its output and the reads back).
RecomputeEstimate estimate_recompute(const Graph& g, const std::vector<NodeId>& chain, int consumers, const TargetDesc& t,
                                     bool own_kernel = true);

enum class Verdict { Fuse, Split, Unsure };
// Fuse when the ratio is >= 2, split when <= 0.5, unsure in between.
Verdict judge(const PairEstimate& e);

struct ProfileResult {
  bool fuse = false;
  double materialise_us = 0;  // measured: write + read back the intermediate
  double penalty_us = 0;      // measured: the fused access pattern's extra cost
};

// On-disk cache of measurements keyed by op signature and target. Thread-safe. A missing or
// corrupt file is treated as empty (and rewritten on the next save).
class ProfileCache {
 public:
  explicit ProfileCache(std::string path);
  // $NNFUSE_PROFILE_CACHE, else $XDG_CACHE_HOME/nnfuse/profile.json, else ~/.cache/nnfuse/profile.json.
  static std::string default_path();
  const std::string& path() const { return path_; }
  std::optional<ProfileResult> find(const std::string& key) const;
  void put(const std::string& key, const ProfileResult& r);
  void save() const;  // writes atomically (temp file + rename)
  size_t size() const;

 private:
  std::string path_;
  mutable std::mutex mu_;
  std::map<std::string, ProfileResult> entries_;
};

// The cache key of a pair: op types, mapping types, intermediate shape/dtype, access kind, target.
std::string pair_signature(const Graph& g, NodeId first, NodeId second, const PairEstimate& e, const TargetDesc& t);

// Measures the pair on this machine with a short micro-benchmark of the two access patterns the
// estimate compares (materialising the intermediate vs the fused pattern), a few ms at most.
ProfileResult measure_pair(const PairEstimate& e);

}  // namespace nnfuse
