#pragma once
// A model compiled for a CPU target: the kernel module (lowered blocks, memory plan), the loaded
// shared object of generated stages, and the runtime that executes them (thread pool, a pool of
// arenas so that concurrent run() calls never share activations, reused across runs).
#include <chrono>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fusion/planner.h"
#include "graph/interpreter.h"
#include "kernels/thread_pool.h"
#include "kernels/toolchain.h"
#include "lowering/kernel_ir.h"

namespace nnfuse {

struct CpuCompileOptions {
  std::string target = "host";
  int threads = 0;          // 0: physical cores
  std::string cache_dir;    // "" = $NNFUSE_CACHE_DIR or ~/.cache/nnfuse/kernels
  int jobs = 0;             // parallel compiler processes
  int max_units = 0;        // translation units (0: 2 per job, at least 1)
  LowerOptions lower;
  // Time the convolution algorithms of each layer with a choice on this machine and keep the
  // fastest (kernels/conv_probe.h); false: the lowering's cost model alone (deterministic).
  bool measure = true;
  std::function<void(size_t done, size_t total)> progress;  // compile progress (see ToolchainOptions)
  // Compile the bodies of If, Loop and Scan nodes as models of their own (kernels/cpu_bodies.cpp);
  // false, or $NNFUSE_COMPILED_BODIES=0: the reference interpreter runs them.
  bool compile_bodies = true;
  // Int8 kernels for the convolutions of quantized models where the target has them (a host with
  // AVX-512 VNNI: lowering/conv_algorithm.cpp); false, or $NNFUSE_INT8=0: the float kernels.
  bool int8 = true;
};

bool is_cpu_target(const std::string& target);

class CpuModel {
 public:
  // Lowers, emits, compiles (or finds in the cache) and loads. `plan` may be null (one block
  // per operator).
  static std::unique_ptr<CpuModel> build(const Graph& g, const FusionPlan* plan, const CpuCompileOptions& o);
  // Loads an artifact written by save(): no compiler is needed.
  static std::unique_ptr<CpuModel> load(const std::string& dir, int threads = 0);
  // Writes the deployable artifact: kernels.so, model.onnx (the optimized graph and its weights),
  // plan.json (fusion blocks by node name, target, hash, memory plan). For a cross target
  // (arm-neon on x86: kernels/cross_run.h) the standalone program `model` and its weights.bin
  // replace kernels.so.
  void save(const std::string& dir) const;

  TensorMap run(const TensorMap& feeds) const;
  // Times every stage over `runs` runs (the median); one row per block (kernel, ops, mapping type, ms, GFLOP/s).
  nlohmann::json profile(const TensorMap& feeds, int runs = 1) const;
  nlohmann::json info() const;
  const KernelModule& module() const { return mod_; }
  // Bytes of original weight data the model still holds (buffers and graph initializers, each
  // array once; the packed copies made by prepare entry points are not counted), and the bytes
  // freed after loading because only a prepare entry point read them.
  int64_t resident_weight_bytes() const;
  int64_t released_weight_bytes() const { return released_bytes_; }
  int threads() const { return pool_->threads(); }

 private:
  CpuModel() = default;
 public:
  ~CpuModel();
  CpuModel(const CpuModel&) = delete;
  CpuModel& operator=(const CpuModel&) = delete;

 private:
  // Resolves the stage entry points and runs the prepare entry points. `release_originals`: free
  // the original data of weights that only prepare entry points read, each right after the last
  // stage packing it (the bodies use the packed copies); only for a model that alone owns its
  // graph (load(); docs/codegen.md "Weights resident once").
  void link_stages(bool release_originals);
  // build(): link_stages(false) on the first run (lazy_link_), once, under concurrent run() calls.
  void ensure_linked() const;
  bool lazy_link_ = false;
  mutable std::once_flag link_once_;
  // Per buffer: a weight that some stage reads only through its prepare entry point and nothing
  // else reads at run time (Stage::prepare_only), still holding its data.
  std::vector<char> prepare_only_weights() const;
  void release_weight(KBuffer& B);
  TensorMap run_impl(const TensorMap& feeds, std::vector<double>* stage_ms) const;
  void run_fallback(const Stage& st, void* const* ptrs, std::map<int, Tensor>& dyn) const;

  // If/Loop/Scan bodies compiled as models of their own (kernels/cpu_bodies.cpp).
  struct CompiledBody {
    size_t stage;                     // the Fallback stage running the node
    NodeId node;
    std::string attr;                 // then_branch, else_branch or body
    const Graph* body;                // the body in mod_.graph (what the reference kernels hand over)
    std::unique_ptr<CpuModel> model;
  };
  std::vector<CompiledBody> bodies_;
  std::set<size_t> compiled_stages_;  // Fallback stages whose control-flow bodies are all compiled
  void compile_bodies(const CpuCompileOptions& o);
  void mark_compiled_stages();  // compiled_stages_ from bodies_
  // The compiled body's outputs for these feeds (the body's inputs and outer reads by name), or
  // nothing when `body` is not compiled or the feeds have other shapes.
  std::optional<std::vector<Tensor>> run_body(const Graph& body, const TensorMap& feeds) const;
  nlohmann::json save_bodies(const std::string& dir, const Graph& saved) const;
  void load_bodies(const nlohmann::json& list, const std::string& dir, int threads);
  // The report's fallback counts, ops and reasons with compiled control flow counted by its bodies.
  void body_summary(nlohmann::json& mem) const;
  // Blocks that run on reference kernels, in this model and its compiled bodies.
  int fallback_blocks() const;

  KernelModule mod_;
  FusionPlan plan_;
  std::string target_;
  std::string so_path_, hash_;
  std::string code_hash_;  // of the emitted sources: an artifact is stale when they differ
  int units_ = 1;
  bool cross_ = false;  // built for another CPU: a standalone program run under an emulator
  std::string program_;                  // cross: the static executable (cache or artifact)
  mutable std::string program_weights_;  // cross: its weights file (written on first run)
  mutable std::string weights_tmp_dir_;  // cross: where that file was written (removed at the end)
  TensorMap run_cross(const TensorMap& feeds) const;
  std::unique_ptr<SharedObject> so_;
  std::vector<nnfuse_stage_fn> fns_;  // per stage; null for fallback stages
  std::vector<void*> prepared_;       // per buffer: data made by a stage's prepare entry point
  std::vector<void (*)(void*)> release_;
  int64_t released_bytes_ = 0;
  // load(): the artifact's model.onnx, its size and modification time when loaded. Once weights
  // are released the graph no longer holds them, so save() copies this file instead.
  std::string source_model_;
  uintmax_t source_model_size_ = 0;
  int64_t source_model_mtime_ = 0;
  std::shared_ptr<ThreadPool> pool_;  // shared with the compiled bodies
  nlohmann::json build_info_;
  mutable std::mutex arenas_mu_;
  mutable std::vector<std::unique_ptr<char[]>> free_arenas_;
  mutable int arenas_made_ = 0;
};

}  // namespace nnfuse
