#include "api/compile.h"

#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "fusion/planner.h"
#include "kernels/cpu_model.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/device/device_model.h"
#include "kernels/opencl/opencl_api.h"

namespace nnfuse {

namespace {

class ReferenceExecutable : public Executable {
 public:
  ReferenceExecutable(const Model& m, const FusionPlan* plan) : model_(m) {
    if (plan) plan_ = *plan;
    if (!plan_) interp_ = std::make_unique<Interpreter>(model_.graph);
  }
  TensorMap run(const TensorMap& feeds) const override {
    if (plan_) return run_plan_reference(model_.graph, *plan_, feeds);
    return interp_->run(feeds);
  }
  nlohmann::json info() const override {
    return {{"target", "reference"},
            {"kernels", plan_ ? plan_->kernels() : model_.graph.num_nodes()},
            {"executor", plan_ ? "fusion plan, block by block, reference kernels" : "reference interpreter"}};
  }

 private:
  Model model_;
  std::optional<FusionPlan> plan_;
  std::unique_ptr<Interpreter> interp_;
};

std::mutex g_mu;
std::vector<Backend>& backends() {
  static std::vector<Backend> b;
  return b;
}

// The CPU code generator (kernels/): host, x86-avx2, x86-avx512, arm-neon.
class CpuExecutable : public Executable {
 public:
  explicit CpuExecutable(std::unique_ptr<CpuModel> m) : m_(std::move(m)) {}
  TensorMap run(const TensorMap& feeds) const override { return m_->run(feeds); }
  nlohmann::json info() const override { return m_->info(); }
  nlohmann::json profile(const TensorMap& feeds, int runs) const override { return m_->profile(feeds, runs); }
  const CpuModel& model() const { return *m_; }

 private:
  std::unique_ptr<CpuModel> m_;
};

// The GPU generators (kernels/device with kernels/opencl or kernels/cuda).
class DeviceExecutable : public Executable {
 public:
  explicit DeviceExecutable(std::unique_ptr<device::DeviceModel> m) : m_(std::move(m)) {}
  TensorMap run(const TensorMap& feeds) const override { return m_->run(feeds); }
  nlohmann::json info() const override { return m_->info(); }
  nlohmann::json profile(const TensorMap& feeds, int runs) const override { return m_->profile(feeds, runs); }

 private:
  std::unique_ptr<device::DeviceModel> m_;
};

void register_builtin_backends() {
  static std::once_flag once;
  std::call_once(once, [] {
    Backend b;
    b.name = "cpu";
    b.handles = [](const std::string& t) { return is_cpu_target(t); };
    b.compile = [](const Model& m, const FusionPlan* plan, const CompileOptions& o) -> std::unique_ptr<Executable> {
      CpuCompileOptions co;
      co.target = o.target;
      co.threads = o.threads;
      co.cache_dir = o.cache_dir;
      co.measure = o.profile;
      co.progress = o.progress;
      return std::make_unique<CpuExecutable>(CpuModel::build(m.graph, plan, co));
    };
    register_backend(std::move(b));
    Backend ocl;
    ocl.name = "opencl";
    ocl.handles = [](const std::string& t) { return t == "mali-opencl"; };
    ocl.compile = [](const Model& m, const FusionPlan* plan, const CompileOptions& o) -> std::unique_ptr<Executable> {
      return std::make_unique<DeviceExecutable>(device::DeviceModel::build(m.graph, plan, device::make_opencl_api(), o.target, o.precision));
    };
    register_backend(std::move(ocl));
    Backend cuda;
    cuda.name = "cuda";
    cuda.handles = [](const std::string& t) { return t == "volta-cuda"; };
    cuda.compile = [](const Model& m, const FusionPlan* plan, const CompileOptions& o) -> std::unique_ptr<Executable> {
      return std::make_unique<DeviceExecutable>(device::DeviceModel::build(m.graph, plan, device::make_cuda_api(), o.target, o.precision));
    };
    register_backend(std::move(cuda));
  });
}

}  // namespace

nlohmann::json device_stage_report(const Graph& g, const FusionPlan& plan, const std::string& cuda_arch, const std::string& precision) {
  const bool tensor_cores = device::tensor_cores_for_precision(precision);
  try {
    LowerOptions lo;
    lo.layout_block = 0;
    const KernelModule km = lower_module(g, plan, lo);
    device::DeviceProgramOptions po;
    po.tensor_cores = tensor_cores;
    const device::DeviceProgram p = device::print_device_program(km, po);
    int tensor_core_kernels = 0;
    for (auto& k : p.kernels) tensor_core_kernels += k.tensor_cores;
    std::set<std::string> entries;
    for (auto& k : p.kernels) entries.insert(k.name);
    nlohmann::json host = nlohmann::json::array();
    for (size_t i = 0; i < p.stage_kernels.size(); ++i) {
      if (!p.stage_kernels[i].empty()) continue;
      host.push_back({{"stage", km.stages[i].name}, {"ops", stage_node_list(g, km.stages[i])}, {"reason", p.host_reason[i]}});
    }
    nlohmann::json rep = {{"kernels", p.kernels.size()},
                          {"entry_points", entries.size()},
                          {"host_stages", host},
                          {"precision", precision},
                          {"tensor_core_kernels", tensor_core_kernels}};
    if (!cuda_arch.empty()) {
      try {
        const device::CudaCompileReport c = device::cuda_compile_check(device::cuda_prelude() + p.source, cuda_arch);
        int64_t regs = 0, spills = 0, shared = 0;
        for (auto& k : c.kernels) {
          regs = std::max<int64_t>(regs, k.registers);
          spills = std::max<int64_t>({spills, int64_t(k.spill_stores), int64_t(k.spill_loads)});
          shared = std::max<int64_t>(shared, k.shared_bytes);
        }
        nlohmann::json cj = device::to_json(c);
        cj.erase("log");
        cj["max_registers"] = regs;
        cj["max_spill_bytes"] = spills;
        cj["max_shared_bytes"] = shared;
        rep["cuda_compile"] = cj;
      } catch (const Error& e) {
        rep["cuda_compile"] = {{"error", e.what()}};
      }
    }
    return rep;
  } catch (const Error& e) {
    return {{"error", e.what()}};
  }
}

std::unique_ptr<Executable> load_compiled(const std::string& dir, int threads) {
  return std::make_unique<CpuExecutable>(CpuModel::load(dir, threads));
}

void save_compiled(const Executable& e, const std::string& dir) {
  auto* c = dynamic_cast<const CpuExecutable*>(&e);
  if (!c) fail(ErrorKind::Unsupported, "only models compiled for a CPU target can be saved as an artifact");
  c->model().save(dir);
}

void register_backend(Backend b) {
  std::lock_guard<std::mutex> lock(g_mu);
  backends().push_back(std::move(b));
}

std::unique_ptr<Executable> compile(const Model& m, const FusionPlan* plan, const CompileOptions& o) {
  if (device::tensor_cores_for_precision(o.precision) && o.target != "volta-cuda" && o.target != "mali-opencl")
    fail(ErrorKind::Invalid, "precision " + o.precision + " applies to GPU targets (volta-cuda: tensor cores); target " + o.target + " runs fp32");
  if (o.target == "reference") return std::make_unique<ReferenceExecutable>(m, plan);
  target_by_name(o.target);  // unknown names fail with the list of targets
  register_builtin_backends();
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& b : backends())
    if (b.handles(o.target)) return b.compile(m, plan, o);
  fail(ErrorKind::Unsupported, "no code generator for target '" + o.target + "' yet (available: reference, host, x86-avx2, x86-avx512, arm-neon, mali-opencl, volta-cuda)");
}

}  // namespace nnfuse
