// The compiled-artifact loader (`nnfuse run DIR`) on fuzzed plan.json files. At start-up a small
// model is compiled for the host and saved (its plan.json is the seed); every input replaces the
// plan.json of a copy of that artifact. What loads must run and agree with the reference
// interpreter; what does not must fail with an Error.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fuzz_common.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"

namespace fs = std::filesystem;

namespace {

fs::path g_root;  // removed at exit: the compiled kernels and the artifact copy
fs::path g_dir;
nnfuse::Model* g_model = nullptr;
nnfuse::TensorMap* g_feeds = nullptr;
nnfuse::TensorMap* g_want = nullptr;

nnfuse::Model small_model() {
  using nnfuse::GraphBuilder;
  namespace A = nnfuse::A;
  GraphBuilder gb("fuzz_artifact");
  auto x = gb.input("x", nnfuse::DType::Float32, {1, 4, 6, 6});
  auto c = gb.op("Conv", {x, gb.weight("w", {8, 4, 3, 3}, 0.3f), gb.weight("b", {8})},
                 GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  auto r = gb.op("Relu", {c});
  auto p = gb.op("GlobalAveragePool", {r});
  auto f = gb.op("Flatten", {p});
  gb.output(gb.op("Softmax", {gb.op("Gemm", {f, gb.weight("fc", {3, 8}, 0.3f)}, GraphBuilder::attrs({{"transB", A::i(1)}}))}));
  return gb.finish();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  nnfuse::fuzz::set_fuzz_limits();
  fs::path root = fs::temp_directory_path() / ("nnfuse_fuzz_artifact_" + std::to_string(::getpid()));
  fs::create_directories(root);
  g_root = root;
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(g_root, ec);
  });
  g_model = new nnfuse::Model(small_model());
  nnfuse::CpuCompileOptions o;
  o.threads = 1;
  o.measure = false;
  o.cache_dir = (root / "cache").string();
  auto cm = nnfuse::CpuModel::build(g_model->graph, nullptr, o);
  g_dir = root / "artifact";
  fs::create_directories(g_dir);
  cm->save(g_dir.string());
  // The seed corpus: the artifact's own plan.json, written where scripts/fuzz.sh asks.
  if (const char* seed = std::getenv("NNFUSE_FUZZ_SEED_DIR"); seed && *seed) {
    fs::create_directories(seed);
    fs::copy_file(g_dir / "plan.json", fs::path(seed) / "plan.json", fs::copy_options::overwrite_existing);
  }
  g_feeds = new nnfuse::TensorMap(nnfuse::random_feeds(g_model->graph, 3));
  g_want = new nnfuse::TensorMap(nnfuse::run_reference(g_model->graph, *g_feeds));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream f(g_dir / "plan.json", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  std::unique_ptr<nnfuse::CpuModel> m;
  try {
    m = nnfuse::CpuModel::load(g_dir.string(), 1);
  } catch (const nnfuse::Error&) {
    return 0;
  }
  if (std::string d = nnfuse::fuzz::first_difference(*g_want, m->run(*g_feeds), 1e-4f, 1e-4f); !d.empty()) {
    std::fprintf(stderr, "a loaded artifact differs from the reference: %s\n", d.c_str());
    std::abort();
  }
  return 0;
}
