#include "kernels/cpu_model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/op_registry.h"
#include "kernels/artifact_plan.h"
#include "kernels/conv_probe.h"
#include "kernels/cross_run.h"
#include "kernels/emit_cpp.h"
#include "kernels/stage_timing.h"
#include "fusion/attention_pattern.h"
#include "lowering/stage_reference.h"

namespace fs = std::filesystem;

namespace nnfuse {

bool is_cpu_target(const std::string& t) { return t == "host" || t == "x86-avx2" || t == "x86-avx512" || t == "arm-neon"; }

namespace {

constexpr const char* kArtifactFormat = "nnfuse-cpu-artifact-1";

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Arena memory: 64-byte aligned, one per concurrent run.
char* aligned_base(std::unique_ptr<char[]>& raw) {
  uintptr_t p = reinterpret_cast<uintptr_t>(raw.get());
  return reinterpret_cast<char*>((p + 63) / 64 * 64);
}

// The shape a buffer holds in this run: a capacity buffer (NonMaxSuppression's output) holds as
// many rows as its stage stored in its row_count buffer.
Shape run_shape(const KBuffer& B, void* const* ptrs) {
  Shape s = B.shape;
  if (B.row_count >= 0 && !s.empty()) s[0] = std::clamp<int64_t>(*static_cast<const int64_t*>(ptrs[B.row_count]), 0, s[0]);
  return s;
}

// The NCHW<c>c block for a target: its float vector width (what one xsimd batch holds under the
// target's flags). $NNFUSE_LAYOUT=nchw keeps every buffer NCHW (comparisons, debugging).
int layout_block_for(const std::string& target) {
  if (const char* e = std::getenv("NNFUSE_LAYOUT"); e && *e) {
    std::string v = e;
    if (v == "nchw") return 0;
    if (v != "auto" && v != "nchwc") fail(ErrorKind::Invalid, "NNFUSE_LAYOUT='" + v + "': expected nchw, nchwc or auto");
  }
  auto flags = target_flags(target);
  auto has = [&](const char* f) { return std::find(flags.begin(), flags.end(), std::string(f)) != flags.end(); };
  return has("-mavx512f") ? 16 : has("-mavx2") ? 8 : 4;
}

}  // namespace

std::unique_ptr<CpuModel> CpuModel::build(const Graph& g, const FusionPlan* plan, const CpuCompileOptions& o) {
  if (!is_cpu_target(o.target)) fail(ErrorKind::Unsupported, "target '" + o.target + "' is not a CPU target");
  std::unique_ptr<CpuModel> m(new CpuModel());
  m->target_ = o.target;
  auto t0 = std::chrono::steady_clock::now();
  m->plan_ = plan ? *plan : singleton_plan(g);
  LowerOptions lo = o.lower;
  if (lo.layout_block < 0) lo.layout_block = layout_block_for(o.target);
  // $NNFUSE_CONV_ALGO=auto|direct|winograd|winograd2 overrides the cost model's choice (comparisons).
  if (const char* e = std::getenv("NNFUSE_CONV_ALGO"); e && *e && lo.conv_algorithm == "auto") lo.conv_algorithm = e;
  // Int8 convolutions for quantized models where the host has VNNI; $NNFUSE_INT8=0 keeps them in
  // float (comparisons). Cross targets name an ISA without it.
  if (o.target == "host") {
    const char* e = std::getenv("NNFUSE_INT8");
    lo.int8_dot = o.int8 && target_by_name("host").int8_dot && !(e && std::string(e) == "0");
  }
  m->mod_ = lower_module(g, m->plan_, lo);
  double lower_ms = ms_since(t0);
  int jobs = o.jobs > 0 ? o.jobs : int(std::max(1u, std::thread::hardware_concurrency()));
  // Convolution algorithms by timing them here (kernels/conv_probe.h), unless the choice is forced
  // or the caller wants the deterministic cost model (--no-profile); cross targets cannot run here.
  nlohmann::json conv_probe_info;
  if (o.measure && lo.conv_algorithm == "auto" && !is_cross_target(o.target)) {
    ToolchainOptions to;
    to.target = o.target;
    to.cache_dir = o.cache_dir;
    to.jobs = jobs;
    ConvProbeResult pr = choose_conv_algorithms_by_measurement(m->mod_, to);
    if (pr.layers > 0) conv_probe_info = {{"layers", pr.layers}, {"measured", pr.measured}, {"ms", pr.ms}};
  }
  int units = o.max_units > 0 ? o.max_units : std::max(1, 2 * jobs);
  auto t1 = std::chrono::steady_clock::now();
  std::vector<SourceUnit> src = emit_cpp(m->mod_, units);
  double emit_ms = ms_since(t1);
  m->units_ = units;
  {
    std::string all;
    for (auto& u : src) all += u.code;
    m->code_hash_ = content_hash(all);
  }
  size_t stages = 0, implementations = 0;
  for (auto& u : src) stages += u.symbols.size(), implementations += u.implementations;
  m->build_info_ = {{"lower_ms", lower_ms}, {"emit_ms", emit_ms},        {"units", src.size()},
                    {"stages", stages},     {"implementations", implementations}};
  if (!conv_probe_info.is_null()) m->build_info_["conv_timing"] = conv_probe_info;
  if (is_cross_target(o.target)) {
    // The runtime cannot load code for this CPU: a standalone program (kernels/cross_run.h),
    // run under an emulator here and deployable as it is.
    CrossRunOptions co;
    co.target = o.target;
    co.cache_dir = o.cache_dir;
    co.jobs = jobs;
    co.progress = o.progress;
    BuildResult br = build_standalone(m->mod_, co);
    m->program_ = br.so_path;
    m->hash_ = br.hash;
    m->cross_ = true;
    m->build_info_["compile_ms"] = br.ms;
    m->build_info_["cache_hit"] = br.cache_hit;
    m->build_info_["hash"] = br.hash;
    m->build_info_["program"] = br.so_path;
    m->pool_ = std::make_unique<ThreadPool>(o.threads);
    return m;
  }
  if (!src.empty()) {
    ToolchainOptions to;
    to.target = o.target;
    to.cache_dir = o.cache_dir;
    to.jobs = jobs;
    to.progress = o.progress;
    BuildResult br = build_shared_object(src, to);
    m->so_path_ = br.so_path;
    m->hash_ = br.hash;
    m->build_info_["compile_ms"] = br.ms;
    m->build_info_["cache_hit"] = br.cache_hit;
    if (!br.cache_hit) m->build_info_["precompiled_header"] = br.pch;
    m->build_info_["rebuilt_corrupt_entry"] = br.rebuilt_corrupt;
    m->build_info_["hash"] = br.hash;
    m->build_info_["shared_object"] = br.so_path;
    size_t lines = 0;
    for (auto& u : src) lines += size_t(std::count(u.code.begin(), u.code.end(), '\n'));
    m->build_info_["generated_lines"] = lines;
    m->so_ = std::make_unique<SharedObject>(br.so_path);
  }
  m->pool_ = std::make_unique<ThreadPool>(o.threads);
  m->compile_bodies(o);
  // Entry points are resolved and weights packed on the first run, not here: a compile that only
  // saves the artifact (`nnfuse compile`) never packs them (BERT-base: 0.5 s of a warm compile).
  // The caller owns the graph (and may save the model, which writes model.onnx from it): keep.
  m->lazy_link_ = true;
  return m;
}

void CpuModel::ensure_linked() const {
  if (!lazy_link_) return;
  // run() is const and may be called from several threads at once: the first call links.
  std::call_once(link_once_, [this] { const_cast<CpuModel*>(this)->link_stages(/*release_originals=*/false); });
}

void CpuModel::link_stages(bool release_originals) {
  // Weights to free as soon as the last stage packing them has run (so that the original and
  // packed copies of all weights never coexist: the peak stays near one copy plus one weight).
  std::vector<char> releasable = release_originals ? prepare_only_weights() : std::vector<char>(mod_.buffers.size(), 0);
  std::vector<int> last_packer(mod_.buffers.size(), -1);
  for (size_t i = 0; i < mod_.stages.size(); ++i)
    for (int b : mod_.stages[i].prepare_only) last_packer[size_t(b)] = int(i);
  int64_t released_since_trim = 0;
  fns_.assign(mod_.stages.size(), nullptr);
  prepared_.assign(mod_.buffers.size(), nullptr);
  release_.assign(mod_.buffers.size(), nullptr);
  std::vector<void*> weights(mod_.buffers.size(), nullptr);
  for (auto& B : mod_.buffers)
    if (B.kind == BufferKind::Weight) weights[size_t(B.id)] = const_cast<void*>(B.data.raw());
  for (size_t i = 0; i < mod_.stages.size(); ++i) {
    const Stage& s = mod_.stages[i];
    if (s.kind == StageKind::Fallback) continue;
    if (!so_) fail(ErrorKind::Runtime, "generated stage " + s.name + " has no loaded library (cross-compiled for another target?)");
    fns_[i] = reinterpret_cast<nnfuse_stage_fn>(so_->symbol(stage_symbol(s)));
    if (s.prepared >= 0) {
      auto prep = reinterpret_cast<void* (*)(void* const*)>(so_->symbol(stage_symbol(s) + "_prepare"));
      release_[size_t(s.prepared)] = reinterpret_cast<void (*)(void*)>(so_->symbol(stage_symbol(s) + "_release"));
      prepared_[size_t(s.prepared)] = prep(weights.data());
      for (int b : s.prepare_only)
        if (releasable[size_t(b)] && last_packer[size_t(b)] == int(i)) {
          released_since_trim += int64_t(mod_.buffers[size_t(b)].data.nbytes());
          release_weight(mod_.buffers[size_t(b)]);
          weights[size_t(b)] = nullptr;
        }
      // Freed arrays below glibc's mmap threshold stay in the heap until trimmed; trimming as we
      // go keeps the originals from piling up beside the packed copies.
      if (released_since_trim >= (int64_t(32) << 20)) {
        return_free_memory_to_os();
        released_since_trim = 0;
      }
    }
  }
  if (released_since_trim > 0) return_free_memory_to_os();
}

std::vector<char> CpuModel::prepare_only_weights() const {
  const size_t nb = mod_.buffers.size();
  std::vector<char> packed_only(nb, 0), other_use(nb, 0);
  auto mark = [&](int b) {
    if (b >= 0 && size_t(b) < nb) other_use[size_t(b)] = 1;
  };
  auto mark_map = [&](const IndexMap& m) {
    for (int b : m.index_buffers()) mark(b);
  };
  // Every way a stage can reach a buffer at run time, except the prepare-only anchor inputs.
  for (const Stage& st : mod_.stages) {
    if (st.kind == StageKind::Fallback) {
      for (int b : st.inputs) mark(b);
      for (int b : st.outputs) mark(b);
      for (NodeId id : st.nodes)
        for (auto& v : mod_.graph.node(id).inputs)
          if (!v.empty()) mark(mod_.buffer_id(v));
      continue;
    }
    for (auto& e : st.exprs)
      if (e.kind == Expr::Load) {
        mark(e.buffer);
        mark_map(e.map);
      }
    for (auto& sto : st.stores) {
      mark(sto.buffer);
      mark_map(sto.map);
    }
    for (int b : st.anchor_inputs)
      if (std::find(st.prepare_only.begin(), st.prepare_only.end(), b) == st.prepare_only.end()) mark(b);
    mark(st.anchor_output);
    for (int b : st.kernel_outputs) mark(b);
    for (int b : st.outputs) mark(b);
    for (int b : st.prepare_only)
      if (b >= 0 && size_t(b) < nb) packed_only[size_t(b)] = 1;
  }
  for (auto& [name, b] : mod_.graph_inputs) mark(b);
  for (auto& [name, b] : mod_.graph_outputs) mark(b);
  std::vector<char> r(nb, 0);
  for (const KBuffer& B : mod_.buffers) {
    const size_t i = size_t(B.id);
    r[i] = packed_only[i] && !other_use[i] && B.kind == BufferKind::Weight && B.prepared_by < 0 && !B.data.empty_data();
  }
  return r;
}

void CpuModel::release_weight(KBuffer& B) {
  // The graph shares the array (graph/tensor.h): drop both owners, keeping the initializer's type
  // and shape (a data-less tensor) so the graph stays well-formed for info() and the plan.
  if (!B.value.empty() && mod_.graph.is_initializer(B.value) && mod_.graph.initializer(B.value).same_data(B.data))
    mod_.graph.set_initializer(B.value, Tensor::wrap(B.dtype, B.shape, nullptr, nullptr));
  released_bytes_ += int64_t(B.data.nbytes());
  B.data = Tensor();
}

int64_t CpuModel::resident_weight_bytes() const {
  std::set<const void*> seen;
  int64_t total = 0;
  auto add = [&](const Tensor& t) {
    if (!t.empty_data() && t.raw() && seen.insert(t.raw()).second) total += int64_t(t.nbytes());
  };
  for (auto& B : mod_.buffers)
    if (B.kind == BufferKind::Weight) add(B.data);
  for (auto& n : mod_.graph.initializer_names()) add(mod_.graph.initializer(n));
  return total;
}

CpuModel::~CpuModel() {
  for (size_t i = 0; i < prepared_.size(); ++i)
    if (prepared_[i] && release_[i]) release_[i](prepared_[i]);
  std::error_code ec;
  if (!weights_tmp_dir_.empty()) fs::remove_all(weights_tmp_dir_, ec);
}

TensorMap CpuModel::run_cross(const TensorMap& feeds) const {
  {
    std::lock_guard<std::mutex> lock(arenas_mu_);
    if (program_weights_.empty()) {
      fs::path d = fs::temp_directory_path() / ("nnfuse_weights_" + std::to_string(::getpid()) + "_" + hash_ + "_" +
                                                std::to_string(reinterpret_cast<uintptr_t>(this) % 1000003));
      fs::create_directories(d);
      weights_tmp_dir_ = d.string();
      write_driver_weights(mod_, (d / "weights.bin").string());
      program_weights_ = (d / "weights.bin").string();
    }
  }
  CrossRunOptions o;
  o.target = target_;
  o.threads = pool_ ? pool_->threads() : 1;
  return run_standalone(mod_, program_, program_weights_, feeds, o);
}

void CpuModel::run_fallback(const Stage& st, void* const* ptrs, std::map<int, Tensor>& dyn) const {
  auto input = [&](int b) -> Tensor {
    const KBuffer& B = mod_.buffers[size_t(b)];
    if (!B.dynamic) return Tensor::wrap(B.dtype, run_shape(B, ptrs), ptrs[b], nullptr);
    auto d = dyn.find(b);
    if (d == dyn.end()) fail(ErrorKind::Runtime, "fallback stage " + st.name + ": '" + B.value + "' was not computed");
    return d->second;
  };
  auto output = [&](int b, const Tensor& t) {
    const KBuffer& B = mod_.buffers[size_t(b)];
    if (!t.is_tensor())  // lowering refuses sequence values; a mistyped model must not reach a buffer
      fail(ErrorKind::Runtime, "fallback stage " + st.name + ": '" + B.value + "' came out as " + t.kind_str() + ", planned a tensor");
    if (B.dynamic) {
      dyn[b] = t;
      return;
    }
    if (t.raw() == ptrs[b]) return;
    if (t.dtype() != B.dtype || t.numel() != shape_numel(B.shape))
      fail(ErrorKind::Runtime, "fallback stage " + st.name + ": '" + B.value + "' came out as " + dtype_name(t.dtype()) +
                                   shape_str(t.shape()) + ", planned " + dtype_name(B.dtype) + shape_str(B.shape));
    std::memcpy(ptrs[b], t.raw(), size_t(B.bytes));
  };
  if (bodies_.empty()) return run_stage_reference(mod_, st, st.outputs, input, output);
  run_stage_reference(mod_, st, st.outputs, input, output,
                      [this](const Graph& body, const TensorMap& feeds) { return run_body(body, feeds); });
}

TensorMap CpuModel::run_impl(const TensorMap& feeds, std::vector<double>* stage_ms) const {
  ensure_linked();
  if (cross_)
    fail(ErrorKind::Unsupported, "this model was compiled for " + target_ + " as a standalone program; it runs whole under an emulator, "
                                 "so its stages cannot be profiled here");
  // An arena for this call (reused across calls; one per concurrent call).
  std::unique_ptr<char[]> arena;
  {
    std::lock_guard<std::mutex> lock(arenas_mu_);
    if (!free_arenas_.empty()) {
      arena = std::move(free_arenas_.back());
      free_arenas_.pop_back();
    }
  }
  if (!arena) {
    arena.reset(new char[size_t(mod_.arena_bytes) + 64]);
    std::lock_guard<std::mutex> lock(arenas_mu_);
    ++arenas_made_;
  }
  struct Return {
    const CpuModel* m;
    std::unique_ptr<char[]>& a;
    ~Return() {
      std::lock_guard<std::mutex> lock(m->arenas_mu_);
      m->free_arenas_.push_back(std::move(a));
    }
  } give_back{this, arena};
  char* base = aligned_base(arena);

  std::vector<void*> ptrs(mod_.buffers.size(), nullptr);
  TensorMap result;
  std::map<int, Tensor> outputs, dyn;
  for (auto& B : mod_.buffers) {
    if (B.dynamic) continue;
    switch (B.kind) {
      case BufferKind::Weight:
        ptrs[size_t(B.id)] = B.prepared_by >= 0 ? prepared_[size_t(B.id)] : const_cast<void*>(B.data.raw());
        break;
      case BufferKind::Activation: ptrs[size_t(B.id)] = base + B.offset; break;
      case BufferKind::Output: {
        Tensor t(B.dtype, B.shape);  // its size was checked when the buffer was planned
        ptrs[size_t(B.id)] = t.raw();
        outputs[B.id] = t;
        break;
      }
      case BufferKind::Input: break;
    }
  }
  for (auto& [name, b] : mod_.graph_inputs) {
    const Tensor& t = checked_feed(mod_, feeds, name, b);
    const KBuffer& B = mod_.buffers[size_t(b)];
    if (B.kind == BufferKind::Output) std::memcpy(ptrs[size_t(b)], t.raw(), t.nbytes());  // an input that is also an output
    else ptrs[size_t(b)] = const_cast<void*>(t.raw());
  }
  nnfuse_exec_ctx ctx = pool_->ctx();
  int32_t status = 0;  // per run: stages flag bad data here (exec_ctx.h)
  ctx.status = &status;
  if (stage_ms) stage_ms->assign(mod_.stages.size(), 0);
  for (size_t i = 0; i < mod_.stages.size(); ++i) {
    const auto t0 = stage_ms ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (fns_[i]) {
      fns_[i](&ctx, ptrs.data());
      if (status) fail(ErrorKind::Runtime, "stage " + mod_.stages[i].name + " (" + stage_node_list(mod_.graph, mod_.stages[i]) +
                                               "): " + nnfuse_status_message(status));
    } else run_fallback(mod_.stages[i], ptrs.data(), dyn);
    if (stage_ms) (*stage_ms)[i] = ms_since(t0);
  }
  for (auto& [name, b] : mod_.graph_outputs) {
    const KBuffer& B = mod_.buffers[size_t(b)];
    if (B.dynamic) result[name] = dyn.at(b);
    else if (B.row_count >= 0) {
      Tensor t(B.dtype, run_shape(B, ptrs.data()));
      std::memcpy(t.raw(), ptrs[size_t(b)], t.nbytes());
      result[name] = t;
    } else if (B.kind == BufferKind::Output) result[name] = outputs.at(b);
    else {
      Tensor t(B.dtype, B.shape);
      std::memcpy(t.raw(), ptrs[size_t(b)], size_t(B.bytes));
      result[name] = t;
    }
  }
  return result;
}

TensorMap CpuModel::run(const TensorMap& feeds) const { return cross_ ? run_cross(feeds) : run_impl(feeds, nullptr); }

nlohmann::json CpuModel::profile(const TensorMap& feeds, int runs) const {
  const std::vector<double> ms = median_stage_ms(runs, [&](std::vector<double>* m) { run_impl(feeds, m); });
  nlohmann::json rows = nlohmann::json::array();
  std::map<int, size_t> row_of;
  for (size_t i = 0; i < mod_.stages.size(); ++i) {
    const Stage& s = mod_.stages[i];
    if (!row_of.count(s.block)) {
      row_of[s.block] = rows.size();
      std::vector<std::string> ops;
      for (NodeId id : s.nodes) ops.push_back(mod_.graph.node(id).op_type);
      rows.push_back({{"kernel", "b" + std::to_string(s.block)}, {"ops", ops}, {"mapping_type", s.mapping}, {"ms", 0.0}, {"flops", 0.0},
                      {"stages", nlohmann::json::array()}, {"generated", s.kind != StageKind::Fallback || compiled_stages_.count(i) > 0},
                      {"layout", layout_name(0)}});
    }
    auto& r = rows[row_of[s.block]];
    r["ms"] = r["ms"].get<double>() + ms[i];
    r["flops"] = r["flops"].get<double>() + s.flops;
    r["stages"].push_back(s.name + (s.anchor_op.empty() ? "" : ":" + s.anchor_op));
    if (s.kind == StageKind::Fallback && !compiled_stages_.count(i)) r["generated"] = false;
    if (s.layout_block > 0) r["layout"] = layout_name(s.layout_block);
    if (std::string a = conv_algorithm_name(s); !a.empty()) r["algorithm"] = a;
    if (s.iparams.count("INT8")) r["algorithm"] = "int8_vnni_gemm";
  }
  for (auto& r : rows) {
    double t = r["ms"].get<double>();
    r["gflops"] = t > 0 ? r["flops"].get<double>() / (t * 1e6) : 0.0;
  }
  return rows;
}

nlohmann::json CpuModel::info() const {
  nlohmann::json j;
  j["target"] = target_;
  j["kernels"] = mod_.blocks;
  j["threads"] = pool_ ? pool_->threads() : 0;
  j["memory"] = mod_.summary();
  body_summary(j["memory"]);  // control flow with compiled bodies counts by what its bodies run
  j["build"] = build_info_;
  {
    std::lock_guard<std::mutex> lock(arenas_mu_);
    j["arenas"] = arenas_made_;
  }
  int gen = 0;
  for (auto& s : mod_.stages) gen += s.kind != StageKind::Fallback;
  j["generated_stages"] = gen;
  j["weights"] = {{"resident_bytes", resident_weight_bytes()}, {"released_bytes", released_bytes_}};
  return j;
}

// ---------------------------------------------------------------- artifacts
void CpuModel::save(const std::string& dir) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) fail(ErrorKind::Io, "cannot create artifact directory '" + dir + "'");
  Model m;
  m.graph = mod_.graph;
  // Fusion blocks are recorded by node name: give every node a unique one.
  std::set<std::string> names;
  for (NodeId id : m.graph.node_ids()) {
    std::string n = m.graph.node(id).name;
    if (n.empty() || names.count(n)) {
      n = "nnfuse_node_" + std::to_string(id);
      m.graph.set_node_name(id, n);
    }
    names.insert(n);
  }
  if (released_bytes_ > 0) {
    // The graph no longer holds the weights that only prepare entry points read (released after
    // load): the artifact's model.onnx, unchanged since it was loaded, is the same model.
    std::error_code ec;
    if (!fs::exists(source_model_) || fs::file_size(source_model_, ec) != source_model_size_ ||
        fs::last_write_time(source_model_, ec).time_since_epoch().count() != source_model_mtime_)
      fail(ErrorKind::Io, "cannot save: '" + source_model_ + "', which this model was loaded from and whose weights it no longer holds in memory, "
                          "has changed or gone since it was loaded (load the artifact again, or compile the model)");
    fs::path dst = fs::path(dir) / "model.onnx";
    if (!fs::exists(dst) || !fs::equivalent(source_model_, dst)) fs::copy_file(source_model_, dst, fs::copy_options::overwrite_existing);
  } else {
    save_model(m, (fs::path(dir) / "model.onnx").string());
  }
  if (!so_path_.empty()) fs::copy_file(so_path_, fs::path(dir) / "kernels.so", fs::copy_options::overwrite_existing);
  if (cross_) {
    // A standalone program for the target CPU and the weights it reads (kernels/cross_run.h).
    fs::path prog = fs::path(dir) / "model";
    fs::copy_file(program_, prog, fs::copy_options::overwrite_existing);
    fs::permissions(prog, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
    write_driver_weights(mod_, (fs::path(dir) / "weights.bin").string());
  }
  nlohmann::json plan;
  plan["format"] = kArtifactFormat;
  plan["target"] = target_;
  plan["hash"] = hash_;
  plan["code_hash"] = code_hash_;
  plan["units"] = units_;
  plan["layout_block"] = mod_.layout_block;
  plan["conv_algorithm"] = mod_.conv_algorithm;
  if (mod_.int8_dot) plan["int8_dot"] = true;
  // Measured choices (kernels/conv_probe.h) differ from what the mode alone gives: load() applies
  // them again so that it regenerates the same code.
  if (!mod_.conv_timings.empty()) {
    nlohmann::json chosen = nlohmann::json::object();
    for (auto& st : mod_.stages)
      if (mod_.conv_timings.contains("b" + std::to_string(st.block)) && st.iparams.count("ALGO")) chosen[st.name] = st.iparams.at("ALGO");
    plan["conv_algorithm_measured"] = chosen;
    plan["conv_timings"] = mod_.conv_timings;
  }
  plan["kernels_checksum"] = so_path_.empty() ? "" : file_checksum((fs::path(dir) / "kernels.so").string());
  plan["model_checksum"] = file_checksum((fs::path(dir) / "model.onnx").string());
  if (cross_) {
    plan["kind"] = "standalone";
    plan["program_checksum"] = file_checksum((fs::path(dir) / "model").string());
    plan["weights_checksum"] = file_checksum((fs::path(dir) / "weights.bin").string());
  }
  nlohmann::json blocks = nlohmann::json::array();
  for (auto& b : plan_.blocks) {
    std::vector<std::string> mem, recomputed;
    for (NodeId id : b.members) mem.push_back(m.graph.node(id).name);
    // Members this block computes again (a cheap chain shared with other blocks): the plan check
    // at load time needs them marked to accept a node in several blocks.
    for (auto& r : b.reasons)
      if (r.decision == "recomputed") recomputed.push_back(m.graph.node(r.node).name);
    blocks.push_back({{"id", b.id}, {"members", mem}, {"anchor", b.anchor == kNoNode ? "" : m.graph.node(b.anchor).name},
                      {"mapping_type", mapping_type_name(b.type)}, {"inputs", b.inputs}, {"outputs", b.outputs},
                      {"recomputed", recomputed}});
    if (!b.pattern.empty()) {
      std::vector<std::string> pn;
      for (NodeId id : b.pattern_nodes) pn.push_back(m.graph.node(id).name);
      blocks.back()["pattern"] = b.pattern;
      blocks.back()["pattern_nodes"] = pn;
    }
  }
  plan["blocks"] = blocks;
  std::vector<std::string> stages;
  for (auto& s : mod_.stages) stages.push_back(s.name + ":" + stage_kind_name(s.kind));
  plan["stages"] = stages;
  plan["memory"] = mod_.summary();
  if (!bodies_.empty()) plan["bodies"] = save_bodies(dir, m.graph);
  std::ofstream f(fs::path(dir) / "plan.json");
  f << plan.dump(2) << "\n";
  if (!f) fail(ErrorKind::Io, "cannot write plan.json in '" + dir + "'");
}

std::unique_ptr<CpuModel> CpuModel::load(const std::string& dir, int threads) {
  fs::path d(dir);
  std::ifstream f(d / "plan.json");
  if (!f) fail(ErrorKind::Io, "'" + dir + "' is not a compiled nnfuse model (no plan.json)");
  nlohmann::json plan;
  try {
    f >> plan;
  } catch (const std::exception& e) {
    fail(ErrorKind::Io, "'" + (d / "plan.json").string() + "': " + e.what());
  }
  check_artifact_plan(plan, (d / "plan.json").string());
  if (plan["format"] != kArtifactFormat) fail(ErrorKind::Io, "'" + dir + "': unknown artifact format");
  // model.onnx holds the weights the kernels run with: an edited one is refused, not run.
  if (plan.contains("model_checksum") && !file_checksum_matches((d / "model.onnx").string(), plan["model_checksum"].get<std::string>()))
    fail(ErrorKind::Io, "artifact '" + dir + "': model.onnx is corrupt or was edited (checksum mismatch); rebuild it with nnfuse compile");
  Model model = load_model((d / "model.onnx").string());
  std::string source_model = fs::absolute(d / "model.onnx").string();
  uintmax_t source_size = fs::file_size(source_model);
  int64_t source_mtime = int64_t(fs::last_write_time(source_model).time_since_epoch().count());
  std::unique_ptr<CpuModel> m(new CpuModel());
  m->target_ = plan["target"].get<std::string>();
  const Graph& g = model.graph;
  std::map<std::string, NodeId> by_name;
  for (NodeId id : g.node_ids()) by_name[g.node(id).name] = id;
  FusionPlan fp;
  fp.target = m->target_;
  std::optional<std::vector<AttentionChain>> chains;  // found when the first attention block is read
  for (auto& b : plan["blocks"]) {
    FusionBlock blk;
    blk.id = b["id"];
    for (auto& n : b["members"]) {
      auto it = by_name.find(n.get<std::string>());
      if (it == by_name.end()) fail(ErrorKind::Io, "artifact plan names node '" + n.get<std::string>() + "' absent from model.onnx");
      blk.members.push_back(it->second);
    }
    std::string a = b["anchor"];
    if (!a.empty() && !by_name.count(a)) fail(ErrorKind::Io, "artifact plan names anchor '" + a + "' absent from model.onnx");
    blk.anchor = a.empty() ? kNoNode : by_name.at(a);
    auto type = mapping_type_from_name(b["mapping_type"]);
    if (!type) fail(ErrorKind::Io, "artifact plan: block " + std::to_string(blk.id) + " has the unknown mapping type '" + b["mapping_type"].get<std::string>() + "'");
    blk.type = *type;
    blk.inputs = b["inputs"].get<std::vector<std::string>>();
    blk.outputs = b["outputs"].get<std::vector<std::string>>();
    for (auto& n : b.value("recomputed", nlohmann::json::array())) {
      auto it = by_name.find(n.get<std::string>());
      if (it == by_name.end()) fail(ErrorKind::Io, "artifact plan names node '" + n.get<std::string>() + "' absent from model.onnx");
      MemberReason r;
      r.node = it->second;
      r.decision = "recomputed";
      blk.reasons.push_back(r);
    }
    if (b.contains("pattern")) {
      // An attention block must be one of the model's attention chains, whole: the lowering
      // reads the chain's operands as the pattern defines them.
      const std::string what = "artifact plan: block " + std::to_string(blk.id);
      if (b["pattern"] != "attention") fail(ErrorKind::Io, what + " has the unknown pattern " + b["pattern"].dump());
      for (auto& n : b.value("pattern_nodes", nlohmann::json::array())) {
        auto it = by_name.find(n.get<std::string>());
        if (it == by_name.end()) fail(ErrorKind::Io, "artifact plan names node '" + n.get<std::string>() + "' absent from model.onnx");
        blk.pattern_nodes.push_back(it->second);
      }
      bool found = false;
      if (!chains) chains = find_attention_chains(g);
      for (const AttentionChain& c : *chains)
        if (blk.pattern_nodes == std::vector<NodeId>{c.qk, c.softmax, c.pv} && blk.anchor == c.pv) {
          found = true;
          for (NodeId id : c.members) found = found && std::find(blk.members.begin(), blk.members.end(), id) != blk.members.end();
        }
      if (!found) fail(ErrorKind::Io, what + ": its pattern_nodes are not an attention chain of model.onnx held by the block");
      blk.pattern = "attention";
    }
    fp.blocks.push_back(blk);
  }
  for (NodeId id : g.node_ids())
    if (g.node(id).op_type == "Constant") fp.constants.push_back(id);
  m->plan_ = fp;
  LowerOptions lo;
  lo.layout_block = plan.value("layout_block", 0);
  // Artifacts written before the algorithm choice existed ran every conv directly.
  lo.conv_algorithm = plan.value("conv_algorithm", std::string("direct"));
  // Lowered for a CPU with VNNI: the int8 convolutions' code needs it (and the lowering must
  // choose them again to reproduce the stages).
  lo.int8_dot = plan.value("int8_dot", false);
  if (lo.int8_dot && !target_by_name("host").int8_dot)
    fail(ErrorKind::Unsupported, "artifact '" + dir + "' holds int8 convolution kernels for AVX-512 VNNI, which this CPU lacks (compile the model on this machine)");
  m->mod_ = lower_module(g, fp, lo);
  if (auto it = plan.find("conv_algorithm_measured"); it != plan.end() && it->is_object()) {
    for (auto& st : m->mod_.stages)
      if (auto c = it->find(st.name); c != it->end() && !conv_algorithm_candidates(st).empty()) {
        auto cands = conv_algorithm_candidates(st);
        if (std::find(cands.begin(), cands.end(), c->get<int64_t>()) == cands.end())
          fail(ErrorKind::Io, "artifact plan: stage " + st.name + " names convolution algorithm " + std::to_string(c->get<int64_t>()) +
                                  ", which it cannot run (the artifact was edited; rebuild it with nnfuse compile)");
        st.iparams["ALGO"] = c->get<int64_t>();
      }
    m->mod_.conv_timings = plan.value("conv_timings", nlohmann::json::object());
  }
  m->source_model_ = source_model;
  m->source_model_size_ = source_size;
  m->source_model_mtime_ = source_mtime;
  // The module's graph shares the weights; this copy is not needed any more (and would keep the
  // weights released by link_stages alive).
  model = Model();
  // The lowering must reproduce the stages the library was generated for.
  std::vector<std::string> stages;
  for (auto& s : m->mod_.stages) stages.push_back(s.name + ":" + stage_kind_name(s.kind));
  if (stages != plan["stages"].get<std::vector<std::string>>())
    fail(ErrorKind::Io, "artifact '" + dir + "' is stale: its kernels were generated for a different lowering (rebuild it with nnfuse compile)");
  m->hash_ = plan.value("hash", "");
  {
    std::string all;
    for (auto& u : emit_cpp(m->mod_, plan.value("units", 1))) all += u.code;
    if (content_hash(all) != plan.value("code_hash", ""))
      fail(ErrorKind::Io, "artifact '" + dir + "' is stale: it was generated by another version of nnfuse's code generator (rebuild it with nnfuse compile)");
    // Kept for save(): an artifact saved again must pass this check when it is loaded.
    m->code_hash_ = content_hash(all);
    m->units_ = plan.value("units", 1);
  }
  if (plan.value("kind", "") == "standalone") {
    // A standalone program (kernels/cross_run.h): runs natively on its CPU, else under an emulator.
    for (auto [file, key] : {std::pair<const char*, const char*>{"model", "program_checksum"}, {"weights.bin", "weights_checksum"}}) {
      std::string p = (d / file).string();
      if (!fs::exists(p)) fail(ErrorKind::Io, "artifact '" + dir + "' lacks " + file);
      if (!file_checksum_matches(p, plan.value(key, "")))
        fail(ErrorKind::Io, "artifact '" + dir + "': " + file + " is corrupt (checksum mismatch); rebuild it with nnfuse compile");
    }
    check_standalone(m->mod_, m->target_);
    m->cross_ = true;
    m->program_ = (d / "model").string();
    m->program_weights_ = (d / "weights.bin").string();
    m->pool_ = std::make_unique<ThreadPool>(threads);
    m->build_info_ = {{"artifact", dir}, {"hash", m->hash_}, {"program", m->program_}};
    return m;
  }
  bool any_gen = false;
  for (auto& s : m->mod_.stages) any_gen |= s.kind != StageKind::Fallback;
  if (any_gen) {
    std::string so = (d / "kernels.so").string();
    if (!fs::exists(so)) fail(ErrorKind::Io, "artifact '" + dir + "' lacks kernels.so");
    if (!file_checksum_matches(so, plan.value("kernels_checksum", "")))
      fail(ErrorKind::Io, "artifact '" + dir + "': kernels.so is corrupt (checksum mismatch); rebuild it with nnfuse compile");
    m->so_path_ = so;
    m->so_ = std::make_unique<SharedObject>(so);
  }
  m->pool_ = std::make_unique<ThreadPool>(threads);
  m->build_info_ = {{"artifact", dir}, {"hash", m->hash_}};
  if (plan.contains("bodies")) m->load_bodies(plan["bodies"], dir, threads);
  // A loaded model is the only owner of its graph, so weights read only by prepare entry points
  // are freed once packed: about one copy of the weights stays resident.
  m->link_stages(/*release_originals=*/true);
  return m;
}

}  // namespace nnfuse
