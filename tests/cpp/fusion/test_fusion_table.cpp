#include <catch2/catch.hpp>

#include "fusion/fusion_table.h"

using namespace nnfuse;
using M = MappingType;

namespace {
// The architecture note's table, written out independently of fusion_table.cpp: row = first.
struct Row { M first; std::optional<M> fused[5]; };
const M kCols[5] = {M::OneToOne, M::OneToMany, M::ManyToMany, M::Reorganize, M::Shuffle};
const std::optional<M> X = std::nullopt;
}  // namespace

TEST_CASE("every fusion table cell has the architecture note's fused type", "[fusion][table]") {
  const Row rows[5] = {
      {M::OneToOne, {M::OneToOne, M::OneToMany, M::ManyToMany, M::Reorganize, M::Shuffle}},
      {M::OneToMany, {M::OneToMany, M::OneToMany, X, M::OneToMany, M::OneToMany}},
      {M::ManyToMany, {M::ManyToMany, M::ManyToMany, X, M::ManyToMany, M::ManyToMany}},
      {M::Reorganize, {M::Reorganize, M::OneToMany, M::ManyToMany, M::Reorganize, M::Reorganize}},
      {M::Shuffle, {M::Shuffle, M::OneToMany, M::ManyToMany, M::Reorganize, M::Shuffle}},
  };
  for (auto& r : rows)
    for (int c = 0; c < 5; ++c) {
      INFO(cell_label(r.first, kCols[c]));
      const FusionCell& cell = fusion_cell(r.first, kCols[c]);
      REQUIRE(cell.fusable() == r.fused[c].has_value());
      if (r.fused[c]) REQUIRE(*cell.fused == *r.fused[c]);
    }
}

TEST_CASE("pairs with a One-to-One member are profitable", "[fusion][table]") {
  for (M m : kCols) {
    REQUIRE(fusion_cell(M::OneToOne, m).status == Profitability::Profitable);
    REQUIRE(fusion_cell(m, M::OneToOne).status == Profitability::Profitable);
  }
}

TEST_CASE("expensive pairs without a One-to-One member are undecided", "[fusion][table]") {
  // The note's examples: Conv then Resize, Transpose then MatMul, Expand then Reshape.
  REQUIRE(fusion_cell(M::ManyToMany, M::OneToMany).status == Profitability::Undecided);
  REQUIRE(fusion_cell(M::Shuffle, M::ManyToMany).status == Profitability::Undecided);
  REQUIRE(fusion_cell(M::OneToMany, M::Reorganize).status == Profitability::Undecided);
  REQUIRE(fusion_cell(M::Reorganize, M::ManyToMany).status == Profitability::Undecided);
  // Pure index manipulation composes for free.
  REQUIRE(fusion_cell(M::Reorganize, M::Shuffle).status == Profitability::Profitable);
  REQUIRE(fusion_cell(M::Shuffle, M::Shuffle).status == Profitability::Profitable);
}

TEST_CASE("cell labels read first+second", "[fusion][table]") {
  REQUIRE(cell_label(M::ManyToMany, M::OneToOne) == "Many-to-Many+One-to-One");
}
