#pragma once
// compile(): turns an optimized model into something that runs. Every target goes through this
// one call so the CLI (`nnfuse run`, `nnfuse compile`) and the Python module share it.
//   reference     the fusion plan executed block by block with the reference interpreter
//                 (or the whole graph when no plan exists)
//   host, x86-*, arm-neon, ...   generated kernels (issue 6: kernels/ registers a backend here)
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "api/optimize.h"
#include "graph/interpreter.h"

namespace nnfuse {

struct CompileOptions {
  std::string target = "host";
  int threads = 0;            // 0: physical cores
  std::string cache_dir;      // "" = $NNFUSE_CACHE_DIR or ~/.cache/nnfuse/kernels
  // Choose each convolution's algorithm by timing the candidates on this machine (cached per
  // machine and layer shape); false (--no-profile): the cost model alone, deterministic.
  bool profile = true;
  // GPU targets: "fp32", or "fp16" for GEMM and conv tiles on tensor cores (volta-cuda; fp16
  // operands, fp32 accumulation). CPU targets take fp32 only.
  std::string precision = "fp32";
  // Called as generated translation units finish compiling (done, total); the CLI draws a
  // progress bar with it on a terminal. May be called from compiler worker threads (serialised).
  std::function<void(size_t done, size_t total)> progress;
};

// A compiled model. run() is thread-safe: concurrent calls on one Executable are allowed.
class Executable {
 public:
  virtual ~Executable() = default;
  virtual TensorMap run(const TensorMap& feeds) const = 0;
  // target, kernels, compile times, memory plan, ... for reports.
  virtual nlohmann::json info() const = 0;
  // Per-kernel timings: the median over `runs` timed runs (empty when the backend does not profile).
  virtual nlohmann::json profile(const TensorMap& feeds, int runs = 1) const { (void)feeds; (void)runs; return nlohmann::json::array(); }
};

// A backend compiles an optimized model (graph after rewriting + its fusion plan) for targets it
// claims. kernels/ registers the CPU generator; later issues add OpenCL and CUDA.
struct Backend {
  std::string name;
  std::function<bool(const std::string& target)> handles;
  std::function<std::unique_ptr<Executable>(const Model& m, const FusionPlan* plan, const CompileOptions& o)> compile;
};
void register_backend(Backend b);

// Compiles an optimized model. `plan` may be null (no fusion: one kernel per operator).
// Throws Unsupported naming the target when no backend handles it.
std::unique_ptr<Executable> compile(const Model& m, const FusionPlan* plan, const CompileOptions& o);

// For a GPU target (mali-opencl, volta-cuda) without compiling: the plan lowered and printed as
// device kernels, with the stages that would run on the host and why ({kernels, entry_points,
// host_stages: [{stage, ops, reason}]}, or {error} when it cannot be lowered, e.g. dynamic shapes).
// With `cuda_arch` ("sm_70"), the CUDA spelling is also compiled with NVRTC for that architecture
// (no GPU needed) and `cuda_compile` gives registers, spills and shared memory per entry point
// with their maxima, or {error} (no NVRTC for it, a compile error). `precision` "fp16" prints
// GEMM/conv tiles for tensor cores, as CompileOptions::precision does (`tensor_core_kernels`).
nlohmann::json device_stage_report(const Graph& g, const FusionPlan& plan, const std::string& cuda_arch = "",
                                   const std::string& precision = "fp32");

// Deployable artifacts of CPU targets (`nnfuse compile -o DIR`): a shared library, the optimized
// model with its weights, and the plan. Loading needs no compiler.
void save_compiled(const Executable& e, const std::string& dir);
std::unique_ptr<Executable> load_compiled(const std::string& dir, int threads = 0);

}  // namespace nnfuse
