#pragma once
// The DNNFusion fusion table as one piece of data: for a producer (first) and a consumer
// (second) mapping type, whether the pair may fuse, the mapping type of the fused pair, and
// whether fusing is profitable, unprofitable or must be decided by the cost model / profiling.
#include <optional>
#include <string>

#include "graph/op_registry.h"

namespace nnfuse {

enum class Profitability { Profitable, Unprofitable, Undecided };
const char* profitability_name(Profitability p);

struct FusionCell {
  std::optional<MappingType> fused;  // nullopt: the pair must not fuse (✗)
  Profitability status = Profitability::Profitable;
  bool fusable() const { return fused.has_value(); }
};

// Row: the first (producing) operator; column: the second (consuming) one.
const FusionCell& fusion_cell(MappingType first, MappingType second);

// "One-to-One+Many-to-Many" style label of a cell, used in reports.
std::string cell_label(MappingType first, MappingType second);

}  // namespace nnfuse
