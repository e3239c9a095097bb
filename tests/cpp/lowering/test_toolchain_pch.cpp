// The precompiled support header (kernels/toolchain.cpp): built once, then used by builds in other
// kernel caches; a damaged one is bypassed (the build still succeeds) and removed; NNFUSE_PCH=0
// turns it off. Results always match the reference interpreter. One PCH build (~3.5 s CPU) in a
// private directory, removed at the end.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"

using namespace nnfuse;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("nnfuse_test_pch_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
    ::unsetenv("NNFUSE_PCH_DIR");
    ::unsetenv("NNFUSE_PCH");
  }
};

// Builds the model with a fresh kernel cache (so it really compiles), checks its outputs, and
// returns what the build says about the precompiled header.
std::string build_and_check(const Model& m, const std::string& y, const fs::path& cache) {
  CpuCompileOptions o;
  o.target = "host";
  o.threads = 1;
  o.cache_dir = cache.string();
  auto cm = CpuModel::build(m.graph, nullptr, o);
  nlohmann::json build = cm->info()["build"];
  REQUIRE_FALSE(build["cache_hit"].get<bool>());
  TensorMap feeds = random_feeds(m.graph, 7);
  TensorMap want = run_reference(m.graph, feeds);
  TensorMap got = cm->run(feeds);
  auto a = got.at(y).to_float_vector(), b = want.at(y).to_float_vector();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(std::fabs(a[i] - b[i]) <= 1e-5 + 1e-4 * std::fabs(b[i]));
  return build.value("precompiled_header", "");
}

}  // namespace

TEST_CASE("toolchain: precompiled support header built once, shared, damaged one bypassed", "[codegen][pch]") {
  TempDir tmp;
  ::setenv("NNFUSE_PCH_DIR", (tmp.path / "pch").c_str(), 1);
  GraphBuilder gb("pch");
  auto x = gb.input("x", DType::Float32, {3, 37});
  const std::string y = gb.op("Sigmoid", {gb.op("Mul", {x, x})});
  gb.output(y);
  Model m = gb.finish();

  CHECK(build_and_check(m, y, tmp.path / "c1") == "built");
  fs::path gch;
  for (auto& e : fs::directory_iterator(tmp.path / "pch"))
    if (e.is_directory() && fs::exists(e.path() / "gen_support.h.gch")) gch = e.path() / "gen_support.h.gch";
  REQUIRE_FALSE(gch.empty());
  // Another kernel cache (another model's, a test's) uses the same header.
  CHECK(build_and_check(m, y, tmp.path / "c2") == "used");

  // g++ stops at a truncated PCH: the build retries without it and drops it.
  fs::resize_file(gch, 4096);
  std::string status = build_and_check(m, y, tmp.path / "c3");
  CHECK(status.rfind("off (the precompiled header", 0) == 0);
  CHECK_FALSE(fs::exists(gch));

  ::setenv("NNFUSE_PCH", "0", 1);
  CHECK(build_and_check(m, y, tmp.path / "c4") == "off");
}
