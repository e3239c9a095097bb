#pragma once
// Helpers shared by the lowering / code generator tests: a per-process kernel cache directory,
// hand-made fusion plans, and output comparison against the reference interpreter.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <string>
#include <unistd.h>
#include <vector>

#include "fusion/planner.h"
#include "kernels/cpu_model.h"
#include "graph/graph.h"
#include "graph/interpreter.h"

namespace nnfuse::testing {

// The folders test_cache_dir made, removed when the test process exits (CTest runs one test case
// per process, and each leaves megabytes of compiled kernels behind otherwise).
struct TestCacheDirs {
  std::set<std::string> paths;
  ~TestCacheDirs() {
    std::error_code ec;
    for (auto& p : paths) std::filesystem::remove_all(p, ec);
  }
};
inline TestCacheDirs& test_cache_dirs() {
  static TestCacheDirs dirs;
  return dirs;
}

// A kernel cache private to this test process (so cache hits never come from another run).
inline std::string test_cache_dir(const std::string& tag) {
  namespace fs = std::filesystem;
  fs::path p = fs::temp_directory_path() / ("nnfuse_test_" + tag + "_" + std::to_string(::getpid()));
  fs::create_directories(p);
  test_cache_dirs().paths.insert(p.string());
  return p.string();
}

// Compile options of the codegen tests: two threads, the kernel cache test_cache_dir(tag).
inline CpuCompileOptions test_compile_options(const std::string& tag) {
  CpuCompileOptions o;
  o.cache_dir = test_cache_dir(tag);
  o.threads = 2;
  return o;
}

// Blocks from a list of node-output groups: each group is one block (anchor: its first
// Many-to-Many member), placed where its first member comes in topological order. Nodes not
// listed get a block of their own; Constant nodes are the plan's constants.
inline FusionPlan grouped_plan(const Graph& g, const std::vector<std::vector<std::string>>& groups) {
  FusionPlan p;
  p.target = "host";
  std::map<NodeId, int> group_of;
  for (size_t i = 0; i < groups.size(); ++i)
    for (auto& v : groups[i]) group_of[g.producer(v).value()] = int(i);
  std::map<int, FusionBlock> by_group;
  std::vector<int> order;
  int next_single = int(groups.size());
  for (NodeId id : g.topo_order()) {
    const Node& n = g.node(id);
    if (n.op_type == "Constant") {
      p.constants.push_back(id);
      continue;
    }
    int gid = group_of.count(id) ? group_of[id] : next_single++;
    if (!by_group.count(gid)) order.push_back(gid);
    FusionBlock& b = by_group[gid];
    b.members.push_back(id);
    if (b.anchor == kNoNode && node_mapping_type(g, id) == MappingType::ManyToMany) b.anchor = id;
  }
  for (int gid : order) {
    FusionBlock b = by_group[gid];
    b.id = int(p.blocks.size());
    b.type = b.anchor == kNoNode ? MappingType::OneToOne : MappingType::ManyToMany;
    p.blocks.push_back(b);
  }
  fill_block_interfaces(g, p);
  check_plan(g, p);
  return p;
}

// Every wanted output is present with the same dtype and shape, and every element is within
// atol + rtol * |want| (the float32 bound of the project: 1e-4 relative, 1e-5 absolute).
inline void check_close(const TensorMap& got, const TensorMap& want, double rtol = 1e-4, double atol = 1e-5) {
  for (auto& [name, w] : want) {
    INFO("output " << name);
    REQUIRE(got.count(name));
    const Tensor& t = got.at(name);
    REQUIRE(t.dtype() == w.dtype());
    REQUIRE(t.shape() == w.shape());
    auto a = t.to_float_vector(), b = w.to_float_vector();
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      double e = std::fabs(double(a[i]) - b[i]) / (atol + rtol * std::fabs(double(b[i])));
      if (!(e <= worst)) worst = e, at = i;  // NaN counts as worst
    }
    INFO("worst element " << at << " (error / tolerance " << worst << ")");
    CHECK(worst <= 1.0);
  }
}

}  // namespace nnfuse::testing
