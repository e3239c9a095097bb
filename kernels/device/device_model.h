#pragma once
// A model compiled for a GPU target (mali-opencl, volta-cuda): the kernel module lowered in NCHW,
// its device program (device_program.h) built by the backend, and the runtime that executes it:
// one device arena for the activations (the memory plan's offsets), weights uploaded once, graph
// inputs and outputs in their own device buffers, stages launched in order and the stages with no
// device form run on the host in between (their inputs downloaded, their outputs uploaded).
#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fusion/planner.h"
#include "graph/interpreter.h"
#include "kernels/device/device_api.h"
#include "kernels/device/device_program.h"
#include "lowering/kernel_ir.h"

namespace nnfuse::device {

class DeviceModel {
 public:
  // Lowers (plan may be null: one block per operator), prints and builds the program on `api`.
  // `precision`: "fp32", or "fp16" for GEMM/conv tiles on tensor cores (fp16 operands, fp32
  // accumulation; a backend without them is an Unsupported error); $NNFUSE_DEVICE_PRECISION
  // overrides it.
  static std::unique_ptr<DeviceModel> build(const Graph& g, const FusionPlan* plan, std::unique_ptr<DeviceApi> api,
                                            const std::string& target, const std::string& precision = "fp32");
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  // Thread-safe; runs are serialised (one arena on the device).
  TensorMap run(const TensorMap& feeds) const;
  // Runs once, waiting after every stage: one row per stage (kernel or host, form, ms).
  nlohmann::json profile(const TensorMap& feeds, int runs = 1) const;
  nlohmann::json info() const;
  const KernelModule& module() const { return mod_; }
  const DeviceProgram& program() const { return prog_; }

 private:
  DeviceModel() = default;
  TensorMap run_impl(const TensorMap& feeds, std::vector<double>* stage_ms) const;
  void launch_stage(size_t stage) const;
  // Records every stage's launches as one replayable graph (DeviceApi::begin_capture); false,
  // with the reason in graph_error_ where there is one, when the backend has none or refuses it.
  bool capture_launches() const;
  void run_on_host(const Stage& st, std::map<int, Tensor>& dyn) const;
  KernelArg arg(int buffer) const;
  // A buffer's shape in this run: a capacity buffer's rows are its row count on the device.
  Shape run_shape(const KBuffer& B) const;

  std::string target_;
  KernelModule mod_;
  FusionPlan plan_;
  DeviceProgram prog_;
  std::unique_ptr<DeviceApi> api_;
  DeviceMemory arena_, status_, scratch_;  // scratch: split-K partial sums (device_program.h)
  std::vector<DeviceMemory> own_;  // per buffer: its own allocation (weights, inputs, outputs), or none
  nlohmann::json build_info_;
  mutable std::mutex run_mu_;
  int host_stages_ = 0;
  // Runs with no host stage replay a captured launch sequence where the backend can
  // (DeviceApi::begin_capture); NNFUSE_DEVICE_GRAPH=0 turns it off.
  enum class GraphReplay { Untried, Captured, Off };
  mutable std::atomic<GraphReplay> graph_replay_{GraphReplay::Untried};  // read by info() during a run
  mutable std::string graph_error_;  // why a capture failed (guarded by run_mu_)
};

}  // namespace nnfuse::device
