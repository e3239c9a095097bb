// The public C++ API (include/nnfuse/nnfuse.h) on top of the internal driver (api/optimize.h,
// api/compile.h). Every entry point translates internal errors into nnfuse::api::Error, so the
// public header never exposes an internal type.
#include "nnfuse/nnfuse.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <new>
#include <optional>
#include <set>

#include "api/compile.h"
#include "api/optimize.h"
#include "fusion/plan_report.h"
#include "fusion/target.h"
#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "graph/zoo.h"

#ifndef NNFUSE_VERSION
#define NNFUSE_VERSION "0.1.0"
#endif

namespace nnfuse::api {

namespace {

namespace in = ::nnfuse;

ErrorKind public_kind(in::ErrorKind k) {
  switch (k) {
    case in::ErrorKind::Parse: return ErrorKind::Parse;
    case in::ErrorKind::Model: return ErrorKind::Model;
    case in::ErrorKind::Unsupported: return ErrorKind::Unsupported;
    case in::ErrorKind::Shape: return ErrorKind::Shape;
    case in::ErrorKind::Invalid: return ErrorKind::Invalid;
    case in::ErrorKind::Runtime: return ErrorKind::Runtime;
    case in::ErrorKind::Io: return ErrorKind::Io;
  }
  return ErrorKind::Runtime;
}

// Runs `f`, rethrowing every failure as a public Error.
template <class F>
decltype(auto) guarded(F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const in::Error& e) {
    const in::ErrorContext& c = e.context();
    throw Error(public_kind(e.kind()), e.what(), e.detail(), c.file, c.line, c.col, c.node, c.op, c.opset);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorKind::Runtime, "out of memory", "out of memory");
  } catch (const std::exception& e) {
    throw Error(ErrorKind::Runtime, e.what(), e.what());
  }
}

[[noreturn]] void invalid(const std::string& msg) { throw Error(ErrorKind::Invalid, msg, msg); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

ValueInfo value_info(const in::Graph& g, const std::string& name) {
  ValueInfo v;
  v.name = name;
  const in::TensorType& t = g.type(name);
  v.dtype = DType(int32_t(t.dtype));
  v.has_shape = t.has_shape;
  for (auto& d : t.dims) {
    v.dims.push_back(d.known() ? d.value : -1);
    v.dim_names.push_back(d.known() ? "" : d.symbol);
  }
  v.type_str = t.str();
  const in::ValueKind held = t.kind == in::ValueKind::Optional ? t.optional_of : t.kind;
  v.kind = std::string(t.kind == in::ValueKind::Optional ? "optional_" : "") + (held == in::ValueKind::Sequence ? "sequence" : "tensor");
  return v;
}

std::vector<ValueInfo> infos(const in::Graph& g, const std::vector<std::string>& names) {
  std::vector<ValueInfo> r;
  for (auto& n : names) r.push_back(value_info(g, n));
  return r;
}

std::vector<std::string> runtime_inputs(const in::Graph& g) {
  std::vector<std::string> r;
  for (auto& n : g.inputs())
    if (!g.is_initializer(n)) r.push_back(n);
  return r;
}

in::Tensor to_internal(const std::string& name, const Tensor& t) {
  if (t.is_none()) return in::Tensor::none();
  if (t.is_sequence()) {
    std::vector<in::Tensor> el;
    for (size_t i = 0; i < t.elements().size(); ++i) el.push_back(to_internal(name + "[" + std::to_string(i) + "]", t.elements()[i]));
    return in::Tensor::sequence(in::DType(int32_t(t.dtype())), std::move(el));
  }
  if (!t.data() && t.numel() > 0) invalid("input '" + name + "' has no data");
  return in::Tensor::wrap(in::DType(int32_t(t.dtype())), t.shape(), const_cast<void*>(t.data()), t.owner());
}

Tensor to_public(const in::Tensor& t) {
  if (t.is_none()) return Tensor::none();
  if (t.is_sequence()) {
    std::vector<Tensor> el;
    for (auto& e : t.elements()) el.push_back(to_public(e));
    return Tensor::sequence(DType(int32_t(t.dtype())), std::move(el));
  }
  auto keep = std::make_shared<in::Tensor>(t);
  return Tensor::wrap(DType(int32_t(t.dtype())), t.shape(), keep->raw(), keep);
}

std::map<std::string, in::Shape> shape_map(const std::map<std::string, std::vector<int64_t>>& m) {
  std::map<std::string, in::Shape> r;
  for (auto& [k, v] : m) r[k] = v;
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Errors and tensors

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::Parse: return "parse";
    case ErrorKind::Model: return "model";
    case ErrorKind::Unsupported: return "unsupported";
    case ErrorKind::Shape: return "shape";
    case ErrorKind::Invalid: return "invalid";
    case ErrorKind::Runtime: return "runtime";
    case ErrorKind::Io: return "io";
  }
  return "runtime";
}

Error::Error(ErrorKind kind, const std::string& what, std::string detail, std::string file, int line, int col, std::string node,
             std::string op, int opset)
    : std::runtime_error(what),
      kind_(kind),
      detail_(detail.empty() ? what : std::move(detail)),
      file_(std::move(file)),
      line_(line),
      col_(col),
      node_(std::move(node)),
      op_(std::move(op)),
      opset_(opset) {}

size_t dtype_size(DType t) { return in::dtype_size(in::DType(int32_t(t))); }
const char* dtype_name(DType t) { return in::dtype_name(in::DType(int32_t(t))); }
DType dtype_from_name(const std::string& name) { return DType(int32_t(in::dtype_from_name(name))); }

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_)
    if (d < 0) invalid("Tensor: negative dim in shape " + shape_text(shape_));
  if (dtype_size(dtype) == 0) invalid(std::string("Tensor: dtype ") + dtype_name(dtype) + " has no fixed element size");
  size_t bytes = (nbytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  data_ = p;
}

Tensor Tensor::wrap(DType dtype, std::vector<int64_t> shape, void* data, std::shared_ptr<void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::sequence(DType elem_dtype, std::vector<Tensor> elements) {
  for (size_t i = 0; i < elements.size(); ++i)
    if (!elements[i].is_tensor() || elements[i].dtype() != elem_dtype)
      invalid("Tensor::sequence of " + std::string(dtype_name(elem_dtype)) + ": element " + std::to_string(i) + " is " +
              (elements[i].is_tensor() ? std::string("a ") + dtype_name(elements[i].dtype()) + " tensor" : "not a tensor"));
  Tensor t;
  t.dtype_ = elem_dtype;
  t.elements_ = std::make_shared<const std::vector<Tensor>>(std::move(elements));
  return t;
}

Tensor Tensor::none() {
  Tensor t;
  t.none_ = true;
  return t;
}

const std::vector<Tensor>& Tensor::elements() const {
  if (!elements_) invalid("Tensor::elements(): the value is not a sequence");
  return *elements_;
}

void Tensor::check(DType want) const {
  if (want != dtype_) invalid(std::string("Tensor::data<T>(): tensor holds ") + dtype_name(dtype_) + ", asked for " + dtype_name(want));
}

// ---------------------------------------------------------------------------------------------
// Model

struct Model::Impl {
  in::Model model;
  std::optional<in::FusionPlan> plan;
  nlohmann::json report = nlohmann::json::object();
  bool optimized = false;
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(const Model& o) : impl_(std::make_unique<Impl>(*o.impl_)) {}
Model& Model::operator=(const Model& o) {
  if (this != &o) impl_ = std::make_unique<Impl>(*o.impl_);
  return *this;
}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const std::string& path, const LoadOptions& opt) {
  return guarded([&] {
    in::ImportOptions io;
    io.input_shapes = shape_map(opt.input_shapes);
    auto impl = std::make_unique<Impl>();
    impl->model = in::load_model(path, io);
    return Model(std::move(impl));
  });
}

Model Model::load_bytes(const std::string& bytes, const LoadOptions& opt, const std::string& label) {
  return guarded([&] {
    in::ImportOptions io;
    io.input_shapes = shape_map(opt.input_shapes);
    auto impl = std::make_unique<Impl>();
    impl->model = in::load_model_bytes(bytes, io, "", label);
    return Model(std::move(impl));
  });
}

Model Model::zoo(const std::string& name, uint64_t seed) {
  return guarded([&] {
    in::ZooOptions zo;
    zo.seed = seed;
    auto impl = std::make_unique<Impl>();
    impl->model = in::build_zoo_model(name, zo);
    return Model(std::move(impl));
  });
}

std::string Model::name() const { return impl_->model.path.empty() ? impl_->model.graph.name : impl_->model.path; }
std::vector<ValueInfo> Model::inputs() const {
  return guarded([&] { return infos(impl_->model.graph, runtime_inputs(impl_->model.graph)); });
}
std::vector<ValueInfo> Model::outputs() const {
  return guarded([&] { return infos(impl_->model.graph, impl_->model.graph.outputs()); });
}
size_t Model::num_operators() const { return in::count_operators(impl_->model.graph); }

std::string Model::optimize(const OptimizeOptions& opt) {
  return guarded([&] {
    in::OptimizeOptions o;
    o.pipeline = opt.pipeline;
    o.pipeline_file = opt.pipeline_file;
    o.rule_files = opt.rule_files;
    o.target = opt.target;
    o.profile = opt.profile;
    in::target_by_name(o.target);  // an unknown target fails before any work
    // Optimize a copy: a failing pass must not leave this model half rewritten.
    in::Model m = impl_->model;
    in::OptimizeResult r = in::optimize(m, o);
    impl_->model = std::move(m);
    impl_->plan = std::move(r.plan);
    impl_->report = std::move(r.report);
    impl_->optimized = true;
    return impl_->report.dump();
  });
}

bool Model::optimized() const { return impl_->optimized; }
std::string Model::report() const { return impl_->report.dump(); }

std::string Model::to_bytes() const {
  return guarded([&] { return in::save_model_bytes(impl_->model); });
}
void Model::save(const std::string& path) const {
  guarded([&] { in::save_model(impl_->model, path); });
}
void Model::export_rewritten(const std::string& path) const {
  guarded([&] {
    if (!impl_->optimized) invalid("export_rewritten: the model is not optimized yet (call optimize() first)");
    in::save_model(impl_->model, path);
  });
}
void Model::export_fused(const std::string& path) const {
  guarded([&] {
    if (!impl_->plan) invalid("export_fused: no fusion plan (call optimize() with a pipeline that plans fusion first)");
    in::save_model(in::fused_model(impl_->model, *impl_->plan), path);
  });
}
std::string Model::to_dot() const {
  return guarded([&] {
    if (!impl_->plan) invalid("to_dot: no fusion plan (call optimize() with a pipeline that plans fusion first)");
    return in::plan_to_dot(impl_->model.graph, *impl_->plan);
  });
}

// ---------------------------------------------------------------------------------------------
// CompiledModel

struct CompiledModel::Impl {
  in::Model model;
  std::optional<in::FusionPlan> plan;
  in::CompileOptions opt;
  std::vector<std::string> input_names;
  std::vector<ValueInfo> ins, outs;
  bool static_inputs = true;
  std::unique_ptr<in::Executable> exe;  // static inputs (or the reference target): compiled once
  // Other targets with symbolic input dims compile once per set of input shapes (at the first run
  // of each; in background mode without waiting for it).
  mutable std::mutex mu;
  mutable std::map<std::vector<in::Shape>, std::shared_ptr<in::Executable>> by_shape;
  // Background mode: the reference executable serves runs whose shapes' build is not done.
  bool background = false;
  std::unique_ptr<in::Executable> reference;
  mutable std::atomic<size_t> reference_runs{0};  // runs it served (reported by info())
  using Build = std::shared_future<std::shared_ptr<in::Executable>>;
  // Builds started and not yet moved to by_shape (a failed one stays: its get() rethrows).
  // Declared after everything a build reads, so destroying the Impl waits for them first.
  mutable std::map<std::vector<in::Shape>, Build> building;

  // The build key of these feeds (their input shapes; empty for static inputs: one build, for
  // the declared shapes) and the dims to bind for it.
  std::vector<in::Shape> shape_key(const in::TensorMap& feeds, std::map<std::string, in::Shape>& bind) const {
    std::vector<in::Shape> key;
    if (static_inputs) return key;
    for (auto& n : input_names) {
      const in::Tensor& t = feeds.at(n);
      key.push_back(t.is_tensor() ? t.shape() : in::Shape{-1});  // a sequence or optional has no shape to bind
      if (t.is_tensor()) bind[n] = t.shape();
    }
    return key;
  }

  // The build of the model bound to `bind` (a copy of everything it needs: it may outlive a run).
  // Builds of one model run one at a time (each already compiles its units in parallel; many
  // batch sizes seen at once must not start as many compilers).
  std::shared_ptr<std::mutex> build_mu = std::make_shared<std::mutex>();
  std::function<std::shared_ptr<in::Executable>()> build_job(const std::map<std::string, in::Shape>& bind) const {
    in::Model bound = model;
    if (!bind.empty()) in::bind_input_shapes(bound.graph, bind);
    return [bound = std::move(bound), plan = plan, opt = opt, serial = build_mu]() {
      std::lock_guard<std::mutex> one_at_a_time(*serial);
      return std::shared_ptr<in::Executable>(in::compile(bound, plan ? &*plan : nullptr, opt));
    };
  }

  Build launch(const std::map<std::string, in::Shape>& bind) const {
    return std::async(std::launch::async, build_job(bind)).share();
  }

  // Moves a finished build to by_shape; a failed one rethrows here and stays in `building`, so
  // every later run of its shapes raises the same error.
  std::shared_ptr<in::Executable> collect(const std::vector<in::Shape>& key, const Build& f) const {
    auto exe = f.get();
    std::lock_guard<std::mutex> lock(mu);
    by_shape[key] = exe;
    building.erase(key);
    return exe;
  }

  // The compiled executable for these feeds' shapes, starting its build for shapes not seen
  // before. wait: block until it is built (without holding the lock, so runs of shapes already
  // built go on); else null while it builds (background mode: the reference kernels serve).
  std::shared_ptr<in::Executable> compiled_for(const in::TensorMap& feeds, bool wait) const {
    std::map<std::string, in::Shape> bind;
    const std::vector<in::Shape> key = shape_key(feeds, bind);
    Build f;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = by_shape.find(key); it != by_shape.end()) return it->second;
      auto b = building.find(key);
      if (b == building.end()) b = building.emplace(key, launch(bind)).first;
      f = b->second;
    }
    if (!wait && f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return nullptr;
    return collect(key, f);
  }

  void wait_builds() const {
    std::vector<std::pair<std::vector<in::Shape>, Build>> pending;
    {
      std::lock_guard<std::mutex> lock(mu);
      pending.assign(building.begin(), building.end());
    }
    for (auto& [key, f] : pending) collect(key, f);
  }
};

CompiledModel compile(const Model& model, const CompileOptions& opt) {
  return guarded([&] {
    auto impl = std::make_shared<CompiledModel::Impl>();
    impl->model = model.impl_->model;
    impl->plan = model.impl_->plan;
    impl->opt.target = opt.target;
    impl->opt.threads = opt.threads;
    impl->opt.cache_dir = opt.cache_dir;
    impl->opt.profile = opt.profile;
    impl->opt.precision = opt.precision;
    const in::Graph& g = impl->model.graph;
    impl->input_names = runtime_inputs(g);
    impl->ins = infos(g, impl->input_names);
    impl->outs = infos(g, g.outputs());
    for (auto& n : impl->input_names) impl->static_inputs &= g.type(n).is_static();
    impl->background = opt.background && opt.target != "reference";
    if (impl->background) {
      // Timing conv algorithms while the reference kernels serve runs on the same cores would
      // measure the load, and the timings are cached for later compiles: the cost model decides.
      impl->opt.profile = false;
      in::target_by_name(opt.target);  // unknown targets fail now, not in the background
      in::CompileOptions ref = impl->opt;
      ref.target = "reference";
      ref.precision = "fp32";  // the reference kernels serve runs in fp32 whatever the target's precision
      impl->reference = in::compile(impl->model, impl->plan ? &*impl->plan : nullptr, ref);
      // Static shapes are known now: start their build at once.
      if (impl->static_inputs) impl->building.emplace(std::vector<in::Shape>{}, impl->launch({}));
    } else if (impl->static_inputs || opt.target == "reference") {
      impl->exe = in::compile(impl->model, impl->plan ? &*impl->plan : nullptr, impl->opt);
    } else {
      in::target_by_name(opt.target);  // unknown targets fail now, not at the first run
    }
    CompiledModel c;
    c.impl_ = impl;
    return c;
  });
}

TensorMap CompiledModel::run(const TensorMap& feeds, const std::vector<std::string>& output_names) const {
  return guarded([&] {
    const Impl& im = *impl_;
    std::set<std::string> known(im.input_names.begin(), im.input_names.end());
    for (auto& [name, t] : feeds)
      if (!known.count(name)) invalid("'" + name + "' is not an input of the model (inputs: " + join(im.input_names) + ")");
    in::TensorMap in_feeds;
    for (auto& info : im.ins) {
      auto it = feeds.find(info.name);
      if (it == feeds.end()) invalid("missing input '" + info.name + "' (" + info.type_str + ")");
      const Tensor& t = it->second;
      if (info.kind != "tensor") {  // a sequence or optional: the interpreter checks what it holds
        in_feeds[info.name] = to_internal(info.name, t);
        continue;
      }
      if (!t.is_tensor())
        invalid("input '" + info.name + "' is a tensor input (" + info.type_str + "), given " + (t.is_none() ? "an empty optional" : "a sequence"));
      if (info.dtype != DType::Undefined && t.dtype() != info.dtype)
        invalid("input '" + info.name + "' has dtype " + dtype_name(t.dtype()) + ", the model expects " + info.type_str);
      if (info.has_shape) {
        bool ok = t.shape().size() == info.dims.size();
        for (size_t i = 0; ok && i < info.dims.size(); ++i) ok = info.dims[i] < 0 || info.dims[i] == t.shape()[i];
        if (!ok)
          invalid("input '" + info.name + "' has shape " + shape_text(t.shape()) + ", the model expects " + info.type_str);
      }
      in_feeds[info.name] = to_internal(info.name, t);
    }
    std::vector<std::string> all_outputs;
    for (auto& o : im.outs) all_outputs.push_back(o.name);
    for (auto& n : output_names)
      if (std::find(all_outputs.begin(), all_outputs.end(), n) == all_outputs.end())
        invalid("'" + n + "' is not an output of the model (outputs: " + join(all_outputs) + ")");
    in::TensorMap results;
    if (im.exe) {
      results = im.exe->run(in_feeds);
    } else {
      auto exe = im.compiled_for(in_feeds, !im.background);
      if (!exe) ++im.reference_runs;
      results = exe ? exe->run(in_feeds) : im.reference->run(in_feeds);
    }
    TensorMap out;
    for (auto& n : output_names.empty() ? all_outputs : output_names) {
      auto it = results.find(n);
      if (it == results.end()) throw Error(ErrorKind::Runtime, "the compiled model produced no value for output '" + n + "'");
      out[n] = to_public(it->second);
    }
    return out;
  });
}

std::vector<ValueInfo> CompiledModel::inputs() const { return impl_->ins; }
std::vector<ValueInfo> CompiledModel::outputs() const { return impl_->outs; }
std::string CompiledModel::target() const { return impl_->opt.target; }
std::string CompiledModel::info() const {
  return guarded([&] {
    const Impl& im = *impl_;
    if (im.exe) return im.exe->info().dump();
    nlohmann::json j = {{"target", im.opt.target}, {"compiled_per_input_shapes", !im.static_inputs}};
    if (!im.background) return j.dump();
    // Builds per set of input shapes: "ready" (runs use the generated kernels, or will at their
    // next run), "building" (runs use the reference kernels), "failed" (runs raise its error).
    std::lock_guard<std::mutex> lock(im.mu);
    size_t building = 0, failed = 0;
    std::shared_ptr<in::Executable> done = im.by_shape.empty() ? nullptr : im.by_shape.begin()->second;
    size_t ready = im.by_shape.size();
    for (auto& [key, f] : im.building) {
      if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        ++building;
        continue;
      }
      try {
        done = f.get();
        ++ready;
      } catch (...) {
        ++failed;
      }
    }
    j["background"] = {{"ready", ready}, {"building", building}, {"failed", failed}, {"reference_runs", im.reference_runs.load()}};
    // Static inputs: the one build's own report once it is done.
    if (im.static_inputs && done) {
      nlohmann::json e = done->info();
      for (auto& [k, v] : j.items()) e[k] = v;
      return e.dump();
    }
    return j.dump();
  });
}

void CompiledModel::wait() const {
  guarded([&] { impl_->wait_builds(); });
}

// ---------------------------------------------------------------------------------------------
// Misc

std::string version() { return NNFUSE_VERSION; }

std::vector<std::string> zoo_names() {
  std::vector<std::string> r;
  for (auto& e : in::zoo_models()) r.push_back(e.name);
  return r;
}

std::vector<std::string> targets() {
  return guarded([] { return in::target_names(); });
}

void set_data_dir(const std::string& dir) { ::setenv("NNFUSE_DATA_DIR", dir.c_str(), 1); }
std::string data_dir() { return in::data_dir(); }

namespace detail {
void set_default_data_dir(const char* dir) {
  std::error_code ec;
  if (!dir) return;
  std::filesystem::path d(dir);
  if (std::filesystem::exists(d / "rules" / "pipelines", ec)) ::setenv("NNFUSE_DATA_DIR", dir, 0);
  // The headers generated kernels are compiled against (installed next to the rules).
  if (std::filesystem::exists(d / "kernels" / "gen_support.h", ec))
    ::setenv("NNFUSE_KERNEL_INCLUDE", (d / "kernels").string().c_str(), 0);
}
}  // namespace detail

}  // namespace nnfuse::api
