// A loaded artifact frees the original data of weights that only prepare entry points read (GEMM
// B, NCHWc conv weights: packed at load time), keeps weights a stage body still reads, and gives
// the reference interpreter's outputs run after run, concurrently, and after save + load.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "graph/builder.h"
#include "graph/error.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"
#include "lowering_test_util.h"

using namespace nnfuse;
using namespace nnfuse::testing;
namespace fs = std::filesystem;

namespace {

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

const KBuffer& buffer_of(const CpuModel& m, const std::string& value) {
  int b = m.module().buffer_id(value);
  REQUIRE(b >= 0);
  return m.module().buffers[size_t(b)];
}

}  // namespace

TEST_CASE("weight release: a loaded artifact keeps one copy of packed weights", "[codegen][concurrency]") {
  GraphBuilder gb("release");
  auto x = gb.input("x", DType::Float32, {1, 8, 6, 6});
  auto z = gb.input("z", DType::Float32, {10, 10});
  auto wc = gb.weight("conv_w", {16, 8, 3, 3});
  auto c = gb.op("Relu", {gb.op("Conv", {x, wc}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}))});
  auto flat = gb.op("Reshape", {c, gb.ints("flat", {1, 16 * 36})});
  auto w2 = gb.weight("fc_w", {16 * 36, 10});
  auto h = gb.op("MatMul", {flat, w2});  // B packed; read by nothing else: released
  auto w3 = gb.weight("shared_w", {10, 10});
  auto y = gb.op("MatMul", {h, w3});     // B packed, but also read by the Add: kept
  auto s = gb.op("Add", {z, w3});
  gb.output(y);
  gb.output(s);
  Model m = gb.finish();
  TensorMap feeds = random_feeds(m.graph, 11);
  TensorMap want = run_reference(m.graph, feeds);

  CpuCompileOptions o;
  o.cache_dir = test_cache_dir("codegen");
  o.threads = 2;
  auto built = CpuModel::build(m.graph, nullptr, o);
  // The lowering records which inputs only the prepare entry point reads.
  const int w2_buf = built->module().buffer_id(w2), w3_buf = built->module().buffer_id(w3);
  bool w2_prepare_only = false, w3_prepare_only = false;
  for (auto& st : built->module().stages)
    for (int b : st.prepare_only) {
      w2_prepare_only |= b == w2_buf;
      w3_prepare_only |= b == w3_buf;
    }
  CHECK(w2_prepare_only);
  CHECK(w3_prepare_only);  // prepare-only in its MatMul stage; the Add stage reads it too
  // A built model shares its weights with the caller's graph and may be saved: nothing released.
  CHECK(built->released_weight_bytes() == 0);
  const int64_t built_resident = built->resident_weight_bytes();
  check_close(built->run(feeds), want);

  fs::path art = fs::path(test_cache_dir("codegen")) / "release_artifact";
  fs::remove_all(art);
  built->save(art.string());
  built.reset();

  auto loaded = CpuModel::load(art.string(), 2);
  const int64_t w2_bytes = int64_t(16 * 36 * 10 * sizeof(float)), w3_bytes = int64_t(10 * 10 * sizeof(float));
  CHECK(loaded->released_weight_bytes() >= w2_bytes);
  CHECK(loaded->resident_weight_bytes() == built_resident - loaded->released_weight_bytes());
  CHECK(loaded->info()["weights"]["released_bytes"].get<int64_t>() == loaded->released_weight_bytes());
  CHECK(buffer_of(*loaded, w2).data.empty_data());
  CHECK_FALSE(buffer_of(*loaded, w3).data.empty_data());
  CHECK(buffer_of(*loaded, w3).data.nbytes() == size_t(w3_bytes));
  // The module's graph no longer holds the released array either.
  CHECK(loaded->module().graph.initializer(w2).raw() == nullptr);

  for (int run = 0; run < 3; ++run) check_close(loaded->run(feeds), want);
  {
    std::vector<TensorMap> outs(4);
    std::vector<std::thread> th;
    for (int i = 0; i < 4; ++i) th.emplace_back([&, i] { outs[size_t(i)] = loaded->run(feeds); });
    for (auto& t : th) t.join();
    for (auto& out : outs) check_close(out, want);
  }

  // Saving a model whose weights were released copies the artifact's model.onnx (byte for byte),
  // and the copy loads and runs the same.
  fs::path art2 = fs::path(test_cache_dir("codegen")) / "release_artifact_resaved";
  fs::remove_all(art2);
  loaded->save(art2.string());
  CHECK(file_bytes(art2 / "model.onnx") == file_bytes(art / "model.onnx"));
  auto reloaded = CpuModel::load(art2.string(), 1);
  check_close(reloaded->run(feeds), want);
  CHECK(reloaded->released_weight_bytes() == loaded->released_weight_bytes());

  // If the source file changed meanwhile the weights cannot be recovered: a clear error.
  {
    std::ofstream f(art2 / "model.onnx", std::ios::binary | std::ios::app);
    f << "x";
  }
  fs::path art3 = fs::path(test_cache_dir("codegen")) / "release_artifact_stale";
  CHECK_THROWS_AS(reloaded->save(art3.string()), Error);
  check_close(reloaded->run(feeds), want);  // still runs: the packed copies are intact
}
