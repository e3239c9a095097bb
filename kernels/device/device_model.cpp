#include "kernels/device/device_model.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>

#include "graph/error.h"
#include "kernels/exec_ctx.h"
#include "kernels/stage_timing.h"
#include "lowering/stage_reference.h"

namespace nnfuse::device {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A device setting from the environment: a whole number that is one of `allowed` (empty: any
// number >= 0), or `fallback` when the variable is unset or empty; anything else is an error
// naming the variable and what it takes.
int64_t env_setting(const char* name, int64_t fallback, std::initializer_list<int64_t> allowed, const char* expected) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(e, &end, 10);
  const bool ok = end && !*end && v >= 0 && (allowed.size() == 0 || std::find(allowed.begin(), allowed.end(), v) != allowed.end());
  if (!ok) fail(ErrorKind::Invalid, std::string(name) + "='" + e + "': expected " + expected);
  return v;
}

}  // namespace

std::unique_ptr<DeviceModel> DeviceModel::build(const Graph& g, const FusionPlan* plan, std::unique_ptr<DeviceApi> api,
                                                const std::string& target, const std::string& precision_option) {
  std::string precision = precision_option;
  if (const char* e = std::getenv("NNFUSE_DEVICE_PRECISION"); e && *e) precision = e;
  const bool tensor_cores = tensor_cores_for_precision(precision);
  if (tensor_cores && !api->tensor_cores())
    fail(ErrorKind::Unsupported, "precision fp16 runs GEMM and conv tiles on tensor cores, which the " + api->backend() + " device (" +
                                     api->device_info().value("name", std::string("?")) +
                                     ") does not have: volta-cuda on a GPU of sm_70 or later has them; use precision fp32");
  std::unique_ptr<DeviceModel> m(new DeviceModel());
  m->target_ = target;
  m->api_ = std::move(api);
  auto t0 = std::chrono::steady_clock::now();
  m->plan_ = plan ? *plan : singleton_plan(g);
  LowerOptions lo;
  lo.layout_block = 0;  // device kernels index NCHW buffers
  m->mod_ = lower_module(g, m->plan_, lo);
  const double lower_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  DeviceProgramOptions po;
  po.split_k_groups = env_setting("NNFUSE_DEVICE_SPLIT_K", po.split_k_groups, {}, "a number of work-groups (0: off)");
  po.register_block = int(env_setting("NNFUSE_DEVICE_REGISTER_BLOCK", po.register_block, {0, 1, 2, 4},
                                      "1, 2 or 4 outputs per work-item along each axis (0: by shape)"));
  po.k_tile = int(env_setting("NNFUSE_DEVICE_K_TILE", po.k_tile, {8, 16, 32}, "8, 16 or 32"));
  po.tensor_cores = tensor_cores;
  po.tensor_core_min_groups = env_setting("NNFUSE_DEVICE_TENSOR_CORE_GROUPS", po.tensor_core_min_groups, {},
                                          "a number of work-groups (0: every tiled product on tensor cores)");
  m->prog_ = print_device_program(m->mod_, po);
  const double print_ms = ms_since(t0);
  std::vector<std::string> names;
  for (auto& k : m->prog_.kernels) names.push_back(k.name);
  t0 = std::chrono::steady_clock::now();
  if (!names.empty()) m->api_->build(m->api_->prelude() + m->prog_.source, names);
  const double build_ms = ms_since(t0);
  // Memory: the arena, then every buffer that lives outside it.
  DeviceApi& A = *m->api_;
  m->arena_ = A.alloc(std::max<int64_t>(m->mod_.arena_bytes, 64));
  m->status_ = A.alloc(64);
  int64_t scratch = 0;
  for (auto& k : m->prog_.kernels) scratch = std::max(scratch, k.scratch_bytes);
  if (scratch) m->scratch_ = A.alloc(scratch);
  m->own_.assign(m->mod_.buffers.size(), DeviceMemory{});
  int64_t weight_bytes = 0;
  for (auto& B : m->mod_.buffers) {
    if (B.dynamic || B.prepared_by >= 0 || B.kind == BufferKind::Activation) continue;
    m->own_[size_t(B.id)] = A.alloc(std::max<int64_t>(B.bytes, 4));
    if (B.kind == BufferKind::Weight && B.bytes > 0) {
      if (B.data.nbytes() < size_t(B.bytes)) fail(ErrorKind::Runtime, "weight buffer '" + B.value + "' holds no data");
      A.upload(m->own_[size_t(B.id)], 0, B.data.raw(), B.bytes);
      weight_bytes += B.bytes;
    }
  }
  int host = 0;
  for (auto& ks : m->prog_.stage_kernels) host += ks.empty();
  m->host_stages_ = host;
  if (env_setting("NNFUSE_DEVICE_GRAPH", 1, {0, 1}, "1 (replay a captured graph where possible) or 0") == 0)
    m->graph_replay_ = GraphReplay::Off;
  nlohmann::json forms = nlohmann::json::object();
  nlohmann::json blocks = nlohmann::json::object();
  int tensor_core_kernels = 0;
  for (auto& k : m->prog_.kernels) {
    forms[k.form] = forms.value(k.form, 0) + 1;
    tensor_core_kernels += k.tensor_cores;
    if (k.register_block > 0) blocks[std::to_string(k.register_block)] = blocks.value(std::to_string(k.register_block), 0) + 1;
  }
  m->build_info_ = {{"target", target},
                    {"backend", m->api_->backend()},
                    {"device", m->api_->device_info()},
                    {"lower_ms", lower_ms},
                    {"print_ms", print_ms},
                    {"build_ms", build_ms},
                    {"cache_hit", !names.empty() && m->api_->build_cached()},
                    {"kernels", m->prog_.kernels.size()},
                    {"entry_points", std::set<std::string>(names.begin(), names.end()).size()},
                    {"kernel_forms", forms},
                    {"split_k_groups", po.split_k_groups},
                    {"register_blocks", blocks},
                    {"k_tile", po.k_tile},
                    {"precision", precision},
                    {"tensor_core_kernels", tensor_core_kernels},
                    {"host_stages", host},
                    {"arena_bytes", m->mod_.arena_bytes},
                    {"weight_bytes", weight_bytes},
                    {"source_bytes", m->prog_.source.size()}};
  return m;
}

DeviceModel::~DeviceModel() {
  if (!api_) return;
  auto release = [&](DeviceMemory d) {
    try {
      if (d.handle) api_->release(d);
    } catch (...) {
      // a failing driver at exit: free the rest regardless
    }
  };
  for (auto& d : own_) release(d);
  release(arena_);
  release(status_);
  release(scratch_);
}

Shape DeviceModel::run_shape(const KBuffer& B) const {
  Shape s = B.shape;
  if (B.row_count < 0 || s.empty()) return s;
  int64_t rows = 0;
  KernelArg c = arg(B.row_count);
  api_->download(c.mem, c.value, &rows, sizeof rows);
  s[0] = std::clamp<int64_t>(rows, 0, s[0]);
  return s;
}

KernelArg DeviceModel::arg(int b) const {
  const KBuffer& B = mod_.buffers[size_t(b)];
  KernelArg a;
  a.kind = KernelArg::Buffer;
  if (B.kind == BufferKind::Activation) {
    a.mem = arena_;
    a.value = B.offset;
  } else {
    a.mem = own_[size_t(b)];
  }
  return a;
}

void DeviceModel::run_on_host(const Stage& st, std::map<int, Tensor>& dyn) const {
  auto input = [&](int b) -> Tensor {
    const KBuffer& B = mod_.buffers[size_t(b)];
    if (B.dynamic) {
      auto d = dyn.find(b);
      if (d == dyn.end()) fail(ErrorKind::Runtime, "stage " + st.name + ": '" + B.value + "' was not computed");
      return d->second;
    }
    Tensor t(B.dtype, run_shape(B));
    KernelArg a = arg(b);
    api_->download(a.mem, a.value, t.raw(), int64_t(t.nbytes()));
    return t;
  };
  auto output = [&](int b, const Tensor& t) {
    const KBuffer& B = mod_.buffers[size_t(b)];
    if (B.dynamic) {
      dyn[b] = t;
      return;
    }
    // A capacity buffer (NonMaxSuppression's rows) takes up to its planned rows; its row count
    // goes to the device with it.
    const bool capacity = B.row_count >= 0 && !t.shape().empty() && t.shape().size() == B.shape.size() && t.shape()[0] <= B.shape[0] &&
                          shape_numel(t.shape()) / std::max<int64_t>(1, t.shape()[0]) == shape_numel(B.shape) / std::max<int64_t>(1, B.shape[0]);
    if (t.dtype() != B.dtype || (t.numel() != shape_numel(B.shape) && !capacity))
      fail(ErrorKind::Runtime, "stage " + st.name + ": '" + B.value + "' came out as " + dtype_name(t.dtype()) + shape_str(t.shape()) +
                                   ", planned " + dtype_name(B.dtype) + shape_str(B.shape));
    KernelArg a = arg(b);
    api_->upload(a.mem, a.value, t.raw(), int64_t(t.nbytes()));
    if (B.row_count >= 0) {
      const int64_t rows = t.shape().empty() ? 0 : t.shape()[0];
      KernelArg c = arg(B.row_count);
      api_->upload(c.mem, c.value, &rows, sizeof rows);
    }
  };
  run_stage_reference(mod_, st, stage_written_buffers(mod_, st), input, output);
}

void DeviceModel::launch_stage(size_t i) const {
  for (int k : prog_.stage_kernels[i]) {
    const DeviceKernel& K = prog_.kernels[size_t(k)];
    std::vector<KernelArg> args;
    for (int b : K.buffers) args.push_back(arg(b));
    if (K.scratch_bytes) {
      KernelArg sc;
      sc.mem = scratch_;
      args.push_back(sc);
    }
    KernelArg st;
    st.mem = status_;
    args.push_back(st);
    KernelArg id;
    id.kind = KernelArg::Int64;
    id.value = int64_t(i);
    args.push_back(id);
    try {
      if (K.groups > 0) api_->launch(k, args, K.groups, K.local);
    } catch (const Error& e) {
      fail(ErrorKind::Runtime, "stage " + mod_.stages[i].name + " (" + stage_node_list(mod_.graph, mod_.stages[i]) + "), kernel " + K.name +
                                   ": " + e.what());
    }
  }
}

bool DeviceModel::capture_launches() const {
  // A backend failing to capture (no stream, an invalidated capture, a graph it cannot
  // instantiate) costs the replay, not the run: its reason goes to info() and the kernels launch
  // one by one. A launch's own error is the run's.
  DeviceApi& A = *api_;
  try {
    if (!A.begin_capture()) return false;
  } catch (const Error& e) {
    graph_error_ = e.what();
    return false;
  }
  try {
    for (size_t i = 0; i < mod_.stages.size(); ++i) launch_stage(i);
  } catch (...) {
    try {
      A.end_capture();
    } catch (const Error&) {
      // the launch's error is the one to report
    }
    throw;
  }
  try {
    A.end_capture();
    return true;
  } catch (const Error& e) {
    graph_error_ = e.what();
    return false;
  }
}

TensorMap DeviceModel::run_impl(const TensorMap& feeds, std::vector<double>* stage_ms) const {
  std::lock_guard<std::mutex> lock(run_mu_);
  DeviceApi& A = *api_;
  for (auto& [name, b] : mod_.graph_inputs) {
    auto it = feeds.find(name);
    if (it == feeds.end()) fail(ErrorKind::Invalid, "missing input '" + name + "'");
    const KBuffer& B = mod_.buffers[size_t(b)];
    const Tensor& t = it->second;
    if (t.dtype() != B.dtype || t.shape() != B.shape)
      fail(ErrorKind::Invalid, "input '" + name + "' is " + dtype_name(t.dtype()) + shape_str(t.shape()) + ", compiled for " +
                                   dtype_name(B.dtype) + shape_str(B.shape));
    KernelArg a = arg(b);
    A.upload(a.mem, a.value, t.raw(), B.bytes);
  }
  A.fill_zero(status_);
  std::map<int, Tensor> dyn;
  if (stage_ms) stage_ms->assign(mod_.stages.size(), 0);
  // The kernels record the first failing stage next to the code (device_program.h).
  auto check_status = [&] {
    int32_t status[2] = {0, 0};
    A.download(status_, 0, status, sizeof status);
    if (!status[0]) return;
    const size_t i = status[1] >= 0 && size_t(status[1]) < mod_.stages.size() ? size_t(status[1]) : 0;
    fail(ErrorKind::Runtime, "stage " + mod_.stages[i].name + " (" + stage_node_list(mod_.graph, mod_.stages[i]) + "): " + nnfuse_status_message(status[0]));
  };
  // Without host stages the launch sequence is the same every run: captured once as a CUDA graph
  // and replayed (one submission instead of one per kernel), unless timing stages or turned off.
  if (!stage_ms && host_stages_ == 0 && graph_replay_ != GraphReplay::Off) {
    if (graph_replay_ == GraphReplay::Untried) {
      graph_replay_ = GraphReplay::Off;
      if (capture_launches()) graph_replay_ = GraphReplay::Captured;
    }
    if (graph_replay_ == GraphReplay::Captured) {
      A.replay_capture();
    } else {
      for (size_t i = 0; i < mod_.stages.size(); ++i) launch_stage(i);
    }
  } else {
    for (size_t i = 0; i < mod_.stages.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      if (!prog_.stage_kernels[i].empty()) {
        launch_stage(i);
      } else {
        A.finish();
        check_status();  // a bad index before the host reads what it produced
        run_on_host(mod_.stages[i], dyn);
      }
      if (stage_ms) {
        A.finish();
        (*stage_ms)[i] = ms_since(t0);
      }
    }
  }
  A.finish();
  check_status();
  TensorMap result;
  for (auto& [name, b] : mod_.graph_outputs) {
    const KBuffer& B = mod_.buffers[size_t(b)];
    if (B.dynamic) {
      result[name] = dyn.at(b);
      continue;
    }
    Tensor t(B.dtype, run_shape(B));
    KernelArg a = arg(b);
    A.download(a.mem, a.value, t.raw(), int64_t(t.nbytes()));
    result[name] = t;
  }
  return result;
}

TensorMap DeviceModel::run(const TensorMap& feeds) const { return run_impl(feeds, nullptr); }

nlohmann::json DeviceModel::profile(const TensorMap& feeds, int runs) const {
  const std::vector<double> ms = median_stage_ms(runs, [&](std::vector<double>* m) { run_impl(feeds, m); });
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < mod_.stages.size(); ++i) {
    const Stage& st = mod_.stages[i];
    const auto& ks = prog_.stage_kernels[i];
    rows.push_back({{"kernel", st.name},
                    {"ops", stage_node_list(mod_.graph, st)},
                    {"where", ks.empty() ? "host" : "device"},
                    {"form", ks.empty() ? prog_.host_reason[i] : prog_.kernels[size_t(ks[0])].form},
                    {"launches", ks.size()},
                    {"ms", ms[i]},
                    {"gflops", ms[i] > 0 ? st.flops / (ms[i] * 1e6) : 0.0}});
  }
  return rows;
}

nlohmann::json DeviceModel::info() const {
  nlohmann::json j = build_info_;
  // The CPU targets' report fields where they mean the same (docs/reports.md); fallback blocks are
  // those whose stages run on the host.
  j["memory"] = mod_.summary();
  j["build"] = {{"lower_ms", build_info_["lower_ms"]}, {"print_ms", build_info_["print_ms"]},
                {"compile_ms", build_info_["build_ms"]}, {"cache_hit", build_info_["cache_hit"]}};
  nlohmann::json host = nlohmann::json::array();
  for (size_t i = 0; i < prog_.stage_kernels.size(); ++i)
    if (prog_.stage_kernels[i].empty()) host.push_back({{"stage", mod_.stages[i].name}, {"reason", prog_.host_reason[i]}});
  j["host_stage_list"] = host;
  // As the CPU targets report it: stages that ran as generated (device) code.
  int64_t gen = 0;
  for (auto& ks : prog_.stage_kernels) gen += !ks.empty();
  j["generated_stages"] = gen;
  j["graph_replay"] = graph_replay_.load() == GraphReplay::Captured;  // after a run: whether it replays a captured graph
  {
    std::lock_guard<std::mutex> lock(run_mu_);
    if (!graph_error_.empty()) j["graph_replay_error"] = graph_error_;
  }
  return j;
}

}  // namespace nnfuse::device
