#include <catch2/catch.hpp>

#include "graph/graph.h"

using namespace nnfuse;

TEST_CASE("empty graph validates") {
  Graph g;
  g.validate();
  REQUIRE(g.num_nodes() == 0);
}
