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
