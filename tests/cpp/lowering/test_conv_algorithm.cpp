// Convolution algorithm per stage (lowering/conv_algorithm.cpp): the cost model's choice between
// the direct NCHW<c>c kernel and Winograd F(4x4,3x3) / F(2x2,3x3), the forced modes, the report, and that the
// generated code computes what the reference interpreter computes with either algorithm (plain
// graph input, padding on every border, output sizes that are not multiples of 4, a residual
// epilogue, batch 2).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "fusion/planner.h"
#include "fusion/target.h"
#include "graph/builder.h"
#include "graph/error.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"
#include "kernels/toolchain.h"
#include "lowering_test_util.h"

using namespace nnfuse;
using namespace nnfuse::testing;
namespace fs = std::filesystem;

namespace {

// x [2,5,13,11] -> conv3x3 p1 (20) -> Relu -> conv3x3 p1 (20) + residual -> Relu -> conv3x3 s2 (9)
// and, on a [1,16,10,10] second input, a conv3x3 p1 (16) whose 9 tiles of 4x4 the cost model
// does not give F(4x4) but whose 25 tiles of 2x2 take F(2x2), then a 1x1 conv (direct).
Model residual_model() {
  GraphBuilder gb("winograd_residual");
  auto x = gb.input("x", DType::Float32, {2, 5, 13, 11});
  auto c1 = gb.op("Conv", {x, gb.weight("w1", {20, 5, 3, 3}, 0.3f), gb.weight("b1", {20})}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  auto r1 = gb.op("Relu", {c1});
  auto c2 = gb.op("Conv", {r1, gb.weight("w2", {20, 20, 3, 3}, 0.2f), gb.weight("b2", {20})}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  auto r2 = gb.op("Relu", {gb.op("Add", {c2, r1})});
  auto c3 = gb.op("Conv", {r2, gb.weight("w3", {9, 20, 3, 3}, 0.2f)}, GraphBuilder::attrs({{"strides", A::is({2, 2})}}));
  gb.output(c3);
  auto s = gb.input("s", DType::Float32, {1, 16, 10, 10});
  auto c4 = gb.op("Conv", {s, gb.weight("w4", {16, 16, 3, 3}, 0.2f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  auto r4 = gb.op("Relu", {c4});  // a 1x1 conv after it keeps the 10x10 map blocked
  gb.output(gb.op("Conv", {r4, gb.weight("w5", {6, 16, 1, 1}, 0.2f)}));
  return gb.finish();
}

std::map<std::string, int> algorithm_counts(const KernelModule& km) {
  std::map<std::string, int> n;
  for (auto& s : km.stages)
    if (auto a = conv_algorithm_name(s); !a.empty()) ++n[a];
  return n;
}

// The fusion plan both cases compile (the fusion cost model alone: deterministic).
FusionPlan deterministic_plan(const Model& m) {
  PlanOptions po;
  po.profile = false;
  return plan_fusion(m.graph, target_by_name("host"), po);
}

}  // namespace

TEST_CASE("conv algorithm: cost model, forced modes and the generated code match the reference", "[conv_algorithm][codegen]") {
  Model m = residual_model();
  FusionPlan plan = deterministic_plan(m);
  TensorMap feeds = random_feeds(m.graph, 11);
  TensorMap want = run_reference(m.graph, feeds);
  fs::path cache = fs::temp_directory_path() / ("nnfuse_test_convalgo_" + std::to_string(::getpid()));
  // auto: the two 3x3 stride-1 convs over 2 x 4 x 3 = 24 tiles of 4x4 take F(4x4); the 10x10 map
  // (9 such tiles, which do not pay for streaming 4x larger weights) takes F(2x2) over its 25
  // tiles of 2x2; the strided and the 1x1 conv cannot.
  for (auto [mode, wino, wino2, direct] : {std::tuple{"auto", 2, 1, 2}, std::tuple{"direct", 0, 0, 5}, std::tuple{"winograd", 3, 0, 2},
                                           std::tuple{"winograd2", 0, 3, 2}}) {
    INFO("mode " << mode);
    CpuCompileOptions o;
    o.target = "host";
    o.cache_dir = cache.string();
    o.threads = 2;
    o.measure = false;  // the cost model's choice (measured choices: the test below)
    o.lower.conv_algorithm = mode;
    auto cm = CpuModel::build(m.graph, &plan, o);
    auto n = algorithm_counts(cm->module());
    CHECK(n["winograd_f4x4_3x3"] == wino);
    CHECK(n["winograd_f2x2_3x3"] == wino2);
    CHECK(n["direct_nchwc"] == direct);
    auto summary = cm->info()["memory"]["conv_algorithms"];
    CHECK(summary["mode"] == mode);
    CHECK(summary["counts"].value("winograd_f4x4_3x3", 0) == wino);
    CHECK(summary["counts"].value("winograd_f2x2_3x3", 0) == wino2);
    // Winograd rounds differently from the direct sum: a few 1e-6 relative to the outputs' scale.
    check_close(cm->run(feeds), want, 1e-4, 1e-4);
    auto prof = cm->profile(feeds);
    int profiled_wino = 0;
    for (auto& row : prof) profiled_wino += row.value("algorithm", std::string()).rfind("winograd", 0) == 0;
    CHECK(profiled_wino == wino + wino2);
  }
  SECTION("an artifact keeps the algorithms; one without the key is refused, never run with direct weights") {
    CpuCompileOptions o;
    o.target = "host";
    o.cache_dir = cache.string();
    o.threads = 2;
    o.measure = false;
    auto cm = CpuModel::build(m.graph, &plan, o);
    fs::path art = cache / "artifact";
    cm->save(art.string());
    auto loaded = CpuModel::load(art.string(), 2);
    CHECK(algorithm_counts(loaded->module()) == algorithm_counts(cm->module()));
    CHECK(algorithm_counts(loaded->module())["winograd_f4x4_3x3"] == 2);
    check_close(loaded->run(feeds), want, 1e-4, 1e-4);
    // An artifact from before the choice existed loads as direct; these kernels are Winograd, so
    // the code hash no longer matches and the load fails with a stale-artifact error.
    nlohmann::json pj;
    std::ifstream(art / "plan.json") >> pj;
    pj.erase("conv_algorithm");
    std::ofstream(art / "plan.json") << pj.dump();
    CHECK_THROWS_WITH(CpuModel::load(art.string(), 2), Catch::Contains("stale"));
  }
  SECTION("an unknown mode is an error naming it") {
    CpuCompileOptions o;
    o.target = "host";
    o.cache_dir = cache.string();
    o.lower.conv_algorithm = "fft";
    CHECK_THROWS_WITH(CpuModel::build(m.graph, &plan, o), Catch::Contains("conv algorithm 'fft'"));
  }
  std::error_code ec;
  fs::remove_all(cache, ec);
}

TEST_CASE("conv algorithm: measured on this machine, cached per machine and shape, kept by artifacts", "[conv_algorithm][codegen]") {
  Model m = residual_model();
  FusionPlan plan = deterministic_plan(m);
  TensorMap feeds = random_feeds(m.graph, 12);
  TensorMap want = run_reference(m.graph, feeds);
  fs::path cache = fs::temp_directory_path() / ("nnfuse_test_convmeasure_" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(cache, ec);
  CpuCompileOptions o;
  o.target = "host";
  o.cache_dir = cache.string();
  o.threads = 2;
  const std::vector<std::string> algos = {"direct_nchwc", "winograd_f4x4_3x3", "winograd_f2x2_3x3"};
  // Every measured stage runs the algorithm with the least time in its record.
  auto check_choices = [&](const CpuModel& cm, const std::string& source) {
    const auto& timings = cm.module().conv_timings;
    int n = 0;
    for (auto& st : cm.module().stages) {
      auto key = "b" + std::to_string(st.block);
      if (conv_algorithm_candidates(st).empty()) {
        CHECK_FALSE(timings.contains(key));
        continue;
      }
      REQUIRE(timings.contains(key));
      const auto& t = timings[key];
      CHECK(t["source"] == source);
      std::string best;
      for (auto& a : algos)
        if (t.contains(a) && (best.empty() || t[a].get<double>() < t[best].get<double>())) best = a;
      CHECK(t["direct_nchwc"].get<double>() > 0);
      CHECK(conv_algorithm_name(st) == best);
      ++n;
    }
    return n;
  };
  // The three 3x3 stride-1 convs have a choice (three geometries); the strided and 1x1 ones do not.
  auto first = CpuModel::build(m.graph, &plan, o);
  CHECK(check_choices(*first, "measured") == 3);
  CHECK(first->info()["build"]["conv_timing"]["measured"] == 3);
  CHECK(first->info()["memory"]["conv_algorithms"]["measured"].size() == 3);
  check_close(first->run(feeds), want, 1e-4, 1e-4);
  const fs::path timing_file = cache / "conv_timings.json";
  REQUIRE(fs::exists(timing_file));

  SECTION("a second compile takes the timings from the cache") {
    auto again = CpuModel::build(m.graph, &plan, o);
    CHECK(check_choices(*again, "cache") == 3);
    CHECK(again->info()["build"]["conv_timing"]["measured"] == 0);
  }
  SECTION("the choice follows the timings, and an artifact regenerates the same code") {
    // Rewrite the cached timings so that a different algorithm wins each layer than the cost model
    // picks: F(2x2) where it chose F(4x4), direct where it chose F(2x2).
    nlohmann::json j;
    std::ifstream(timing_file) >> j;
    for (auto& [machine, layers] : j.items())
      for (auto& [shape, t] : layers.items()) {
        for (auto& a : algos)
          if (t.contains(a)) t[a] = 100.0;
        t[t.contains("winograd_f4x4_3x3") && t.contains("winograd_f2x2_3x3") ? "winograd_f2x2_3x3" : "direct_nchwc"] = 1.0;
      }
    std::ofstream(timing_file) << j.dump();
    auto cm = CpuModel::build(m.graph, &plan, o);
    check_choices(*cm, "cache");
    const auto chosen = algorithm_counts(cm->module());
    auto n = chosen;
    CHECK(n["winograd_f4x4_3x3"] == 0);
    CHECK(n["winograd_f2x2_3x3"] + n["direct_nchwc"] == 5);
    CHECK(n["winograd_f2x2_3x3"] >= 2);
    check_close(cm->run(feeds), want, 1e-4, 1e-4);
    fs::path art = cache / "artifact";
    cm->save(art.string());
    auto loaded = CpuModel::load(art.string(), 2);  // a lowering without these choices would be refused as stale
    CHECK(algorithm_counts(loaded->module()) == chosen);
    CHECK(loaded->info()["memory"]["conv_algorithms"]["measured"].size() == 3);
    check_close(loaded->run(feeds), want, 1e-4, 1e-4);
  }
  SECTION("timings of other kernel headers are measured again") {
    // The cache's machine key ends with the hash of the headers the timing program compiled
    // against; an entry for other headers (an older nnfuse's) is not taken for these kernels.
    nlohmann::json j, old;
    std::ifstream(timing_file) >> j;
    REQUIRE(j.size() == 1);
    const std::string key = j.begin().key(), suffix = " | kernels " + kernel_headers_hash();
    REQUIRE(key.size() > suffix.size());
    CHECK(key.substr(key.size() - suffix.size()) == suffix);
    old[key.substr(0, key.size() - suffix.size()) + " | kernels 0123456789abcdef"] = j.begin().value();
    std::ofstream(timing_file) << old.dump();
    auto cm = CpuModel::build(m.graph, &plan, o);
    CHECK(check_choices(*cm, "measured") == 3);
    nlohmann::json after;
    std::ifstream(timing_file) >> after;
    CHECK(after.size() == 2);
    CHECK(after.contains(key));
  }
  SECTION("a damaged timing file is measured again and rewritten") {
    std::ofstream(timing_file) << "{ not json";
    auto cm = CpuModel::build(m.graph, &plan, o);
    CHECK(check_choices(*cm, "measured") == 3);
    nlohmann::json j;
    CHECK_NOTHROW(std::ifstream(timing_file) >> j);
  }
  SECTION("without measurement the cost model decides, and nothing is timed") {
    o.measure = false;
    auto cm = CpuModel::build(m.graph, &plan, o);
    CHECK(cm->module().conv_timings.empty());
    CHECK_FALSE(cm->info()["build"].contains("conv_timing"));
    CHECK(algorithm_counts(cm->module())["winograd_f4x4_3x3"] == 2);
  }
  fs::remove_all(cache, ec);
}
