#include "fusion/fusion_table.h"

#include <array>

namespace nnfuse {

const char* profitability_name(Profitability p) {
  switch (p) {
    case Profitability::Profitable: return "profitable";
    case Profitability::Unprofitable: return "unprofitable";
    case Profitability::Undecided: return "undecided";
  }
  return "?";
}

namespace {
using M = MappingType;
constexpr auto P = Profitability::Profitable;
constexpr auto U = Profitability::Undecided;

FusionCell yes(M m, Profitability p) { return FusionCell{m, p}; }
FusionCell no() { return FusionCell{std::nullopt, Profitability::Unprofitable}; }

// Index order: OneToOne, OneToMany, ManyToMany, Reorganize, Shuffle (the enum's order).
// The fused types are the table of the architecture note (DNNFusion, PLDI'21, Table 3). The
// status follows the note's rule: a pair with a One-to-One member is profitable; a pair whose
// fused type is Many-to-Many or One-to-Many and whose other member is not One-to-One (Conv then
// Resize, Transpose then MatMul, Expand then Reshape) is undecided; pure index manipulation
// (Reorganize/Shuffle with each other) is profitable: it only composes index expressions.
const std::array<std::array<FusionCell, 5>, 5>& table() {
  static const std::array<std::array<FusionCell, 5>, 5> t = {{
      // first = One-to-One
      {yes(M::OneToOne, P), yes(M::OneToMany, P), yes(M::ManyToMany, P), yes(M::Reorganize, P), yes(M::Shuffle, P)},
      // first = One-to-Many
      {yes(M::OneToMany, P), yes(M::OneToMany, U), no(), yes(M::OneToMany, U), yes(M::OneToMany, U)},
      // first = Many-to-Many
      {yes(M::ManyToMany, P), yes(M::ManyToMany, U), no(), yes(M::ManyToMany, U), yes(M::ManyToMany, U)},
      // first = Reorganize
      {yes(M::Reorganize, P), yes(M::OneToMany, U), yes(M::ManyToMany, U), yes(M::Reorganize, P), yes(M::Reorganize, P)},
      // first = Shuffle
      {yes(M::Shuffle, P), yes(M::OneToMany, U), yes(M::ManyToMany, U), yes(M::Reorganize, P), yes(M::Shuffle, P)},
  }};
  return t;
}
}  // namespace

const FusionCell& fusion_cell(MappingType first, MappingType second) {
  return table()[size_t(first)][size_t(second)];
}

std::string cell_label(MappingType first, MappingType second) {
  return std::string(mapping_type_name(first)) + "+" + mapping_type_name(second);
}

}  // namespace nnfuse
