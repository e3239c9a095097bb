// nnfuse run MODEL: run a model on given (.npy) or random inputs and report outputs and latency,
// on the reference interpreter or compiled for a CPU target (or from a compiled artifact).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <set>

#include <sys/resource.h>

#include "api/compile.h"
#include "api/optimize.h"
#include "commands.h"
#include "graph/error.h"
#include "graph/interpreter.h"
#include "graph/npy.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "report.h"

namespace nnfuse::cli {

namespace {

const std::vector<std::string> kSupportedTargets = {"reference", "host", "x86-avx2", "x86-avx512", "arm-neon", "mali-opencl", "volta-cuda"};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void check_choice(const ParsedArgs& args, const std::string& option, const std::string& value,
                  const std::vector<std::string>& supported) {
  if (std::find(supported.begin(), supported.end(), value) == supported.end())
    throw UsageError(option + " '" + value + "' is not supported yet; supported now: " + join(supported), args.spec->usage_line());
}

// An onnx.TensorProto file (.pb, as in ONNX test-data folders) rather than a .npy one.
bool is_tensor_proto_file(const std::string& file) {
  return std::filesystem::path(file).extension() == ".pb";
}

// numpy has no dtype for bfloat16, float8, float4 or the 4- and 2-bit integers: such outputs are
// written as .pb (onnx.TensorProto; onnx.numpy_helper.to_array reads them, with ml_dtypes).
bool npy_holds(DType t) { return t != DType::BFloat16 && !dtype_is_low_precision(t); }

struct Feed {
  std::string name;
  std::string source;  // file path, or "random"
  Tensor tensor;
};

// Loads the --input NAME=FILE.npy feeds, checks them against the model's declared inputs, and binds
// symbolic input dims to the shapes the files carry (so shapes below are inferred concretely).
std::vector<Feed> load_feeds(const ParsedArgs& args, Graph& g) {
  std::vector<Feed> feeds;
  std::set<std::string> seen;
  for (auto& spec : args.all("--input")) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      throw UsageError("--input '" + spec + "': expected NAME=FILE.npy or NAME=FILE.pb", args.spec->usage_line());
    std::string name = spec.substr(0, eq), file = spec.substr(eq + 1);
    if (!seen.insert(name).second) throw UsageError("--input given twice for input '" + name + "'", args.spec->usage_line());
    if (!g.is_input(name) || g.is_initializer(name))
      fail(ErrorKind::Invalid, "--input names '" + name + "', which is not a model input (inputs: " + join(g.inputs()) + ")");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec))
      fail(ErrorKind::Io, "input '" + name + "': cannot read '" + file + "': no such file");
    const TensorType& want = g.type(name);
    if (!want.is_tensor() && !is_tensor_proto_file(file))
      fail(ErrorKind::Invalid, "input '" + name + "' is " + want.str() + ": give it as a .pb file (onnx.SequenceProto or onnx.OptionalProto)");
    Tensor t;
    try {
      t = is_tensor_proto_file(file) ? load_value_pb(file, want) : load_npy(file);
    } catch (const Error& e) {
      fail(e.kind(), "input '" + name + "': " + e.what());
    }
    if (!want.is_tensor()) {  // the interpreter checks the kind and element type
      feeds.push_back({name, file, t});
      continue;
    }
    if (want.dtype != DType::Undefined && want.dtype != t.dtype())
      fail(ErrorKind::Invalid, "input '" + name + "' from '" + file + "' has dtype " + dtype_name(t.dtype()) + ", the model expects " + want.str());
    if (want.has_shape) {
      bool ok = int64_t(want.dims.size()) == t.rank();
      for (size_t i = 0; ok && i < want.dims.size(); ++i)
        if (want.dims[i].known() && want.dims[i].value != t.shape()[i]) ok = false;
      if (!ok)
        fail(ErrorKind::Invalid, "input '" + name + "' from '" + file + "' has shape " + shape_str(t.shape()) + ", the model expects " + want.str());
    }
    feeds.push_back({name, file, t});
  }
  if (feeds.empty()) return feeds;
  for (auto& name : g.inputs())
    if (!g.is_initializer(name) && !seen.count(name))
      fail(ErrorKind::Invalid, "missing input '" + name + "' (" + g.type(name).str() + "): give --input " + name +
                                   "=FILE.npy (or .pb), or no --input at all for random inputs");
  std::map<std::string, Shape> bind;
  for (auto& f : feeds)
    if (g.type(f.name).is_tensor() && !g.type(f.name).is_static()) bind[f.name] = f.tensor.shape();
  if (!bind.empty()) bind_input_shapes(g, bind);
  return feeds;
}

struct Timing {
  double median = 0, min = 0;
};

// User + system CPU time of this process so far, all threads.
double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3;
}

Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.min = ms.front();
  size_t n = ms.size();
  t.median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  return t;
}

// min / max / mean of a numeric tensor, for the text report.
std::string value_summary(const Tensor& t) {
  if (!t.is_tensor()) return t.kind_str();
  if (t.numel() == 0) return "empty";
  if (t.dtype() == DType::String || t.dtype() == DType::Undefined) return "";
  Tensor d = t.cast(DType::Float64);
  const double* p = d.data<double>();
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0;
  for (int64_t i = 0; i < d.numel(); ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
    sum += p[i];
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "min %.6g  max %.6g  mean %.6g", lo, hi, sum / double(d.numel()));
  return buf;
}

// Errors raised while the model runs (a node's kernel, a Loop past its limit, a random input past
// the size cap) name the model file too, as import errors do.
template <class F>
auto naming_model(const std::string& file, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    rethrow_in(e, {file});
  }
}

int run_run(const ParsedArgs& args) {
  const std::string path = args.positional(0);
  std::error_code dir_ec;
  // A directory is a compiled artifact (`nnfuse compile -o DIR`); so is --compiled DIR.
  const std::string artifact = args.has("--compiled") ? args.get("--compiled")
                               : std::filesystem::is_directory(path, dir_ec) ? path : "";
  std::string target = args.get("--target", "host");
  // Compiled targets optimize by default (the contract's `run`); the interpreter runs the graph as imported.
  std::string pipeline = args.get("--pipeline", target == "reference" ? "none" : "auto");
  check_choice(args, "--target", target, kSupportedTargets);
  const int64_t runs = args.get_int("--runs", 1, 1, 1000000);
  const int64_t threads = args.get_int("--threads", target == "reference" && artifact.empty() ? 1 : 0, 0, 4096);
  const int64_t seed = args.get_int("--seed", 0, 0, std::numeric_limits<int64_t>::max());
  if (!artifact.empty()) pipeline = "none";

  Model m = artifact.empty() ? load_model_file(path, shape_bindings(args))
                             : load_model_file((std::filesystem::path(artifact) / "model.onnx").string(), shape_bindings(args));
  Graph& g = m.graph;

  std::vector<Feed> feeds = load_feeds(args, g);
  bool random = feeds.empty();
  if (random)
    for (auto& [name, t] : naming_model(path, [&] { return random_feeds(g, uint64_t(seed)); })) feeds.push_back({name, "random", t});
  TensorMap feed_map;
  for (auto& f : feeds) feed_map[f.name] = f.tensor;
  // An artifact's executable loads the graph and weights itself; this copy only names inputs and
  // outputs from here on, so it keeps the initializers' types, not a second copy of the weights.
  if (!artifact.empty())
    for (auto& n : g.initializer_names()) {
      const Tensor& t = g.initializer(n);
      g.set_initializer(n, Tensor::wrap(t.dtype(), t.shape(), nullptr, nullptr));
    }
  if (!artifact.empty()) return_free_memory_to_os();

  // Output files: one .npy (or .pb) per graph output, names made safe (and distinct) for the
  // filesystem; the extension is added when the output's dtype is known. The directory is made
  // before running, so that a bad path fails before a long run.
  std::map<std::string, std::string> files;
  const std::string output_format = args.get("--output-format", "npy");
  if (output_format != "npy" && output_format != "pb")
    throw UsageError("--output-format '" + output_format + "': expected npy or pb", args.spec->usage_line());
  if (args.has("--outputs")) {
    std::filesystem::path dir = args.get("--outputs");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir))
      fail(ErrorKind::Io, "--outputs '" + dir.string() + "': cannot create directory" + (ec ? ": " + ec.message() : ""));
    std::set<std::string> used;
    for (auto& name : g.outputs()) {
      std::string base = sanitize_file_name(name), file = base;
      for (int k = 1; used.count(file); ++k) file = base + "_" + std::to_string(k);
      used.insert(file);
      files[name] = (dir / file).string();
    }
  }

  // With a pipeline, the model is rewritten and planned, and the reference interpreter runs the
  // fusion plan block by block (each block extracted as its own graph): the check that a plan
  // computes what the unfused graph does.
  std::optional<OptimizeResult> opt;
  if (pipeline != "none" || args.has("--pipeline-file")) {
    OptimizeOptions o;
    o.pipeline = pipeline;
    o.pipeline_file = args.get("--pipeline-file");
    o.rule_files = args.all("--rules");
    o.target = target;
    o.profile = !args.has("--no-profile");
    opt = optimize(m, o);
  }
  std::unique_ptr<Executable> exe;
  auto tc0 = std::chrono::steady_clock::now();
  if (!artifact.empty()) {
    exe = load_compiled(artifact, int(threads));
    if (!args.has("--target")) target = exe->info().value("target", target);  // arm-neon artifacts run under qemu
  } else if (target != "reference") {
    CompileOptions co;
    co.target = target;
    co.progress = terminal_progress("compiling kernels");
    co.threads = int(threads);
    co.profile = !args.has("--no-profile");
    co.precision = args.get("--precision", "fp32");
    exe = compile(m, opt && opt->plan ? &*opt->plan : nullptr, co);
  }
  const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tc0).count();
  std::optional<Interpreter> interp;
  if (!exe) interp.emplace(g);
  TensorMap result;
  // Per run: wall time, and the process's CPU time (all threads). On a machine shared with other
  // work the wall time swings with the load; single-threaded, the CPU time does much less.
  std::vector<double> times, cpu_times;
  for (int64_t r = 0; r < runs; ++r) {
    const double c0 = process_cpu_ms();
    auto t0 = std::chrono::steady_clock::now();
    result = naming_model(path, [&] {
      return exe ? exe->run(feed_map) : opt && opt->plan ? run_plan_reference(g, *opt->plan, feed_map) : interp->run(feed_map);
    });
    auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    cpu_times.push_back(process_cpu_ms() - c0);
  }
  json profile = json::array();
  if (args.has("--profile")) {
    if (!exe) throw UsageError("--profile needs a compiled target (--target host, ...); the reference interpreter has no kernels to time", args.spec->usage_line());
    profile = exe->profile(feed_map, int(std::min<int64_t>(runs, 100)));
  }
  Timing timing = summarize(times), cpu_timing = summarize(cpu_times);
  for (auto& [name, file] : files) {
    const Tensor& t = result.at(name);
    if (!t.is_tensor() || !g.type(name).is_tensor()) save_value_pb(t, g.type(name), name, file += ".pb");  // numpy has no sequences
    else if (output_format == "pb" || !npy_holds(t.dtype())) save_tensor_pb(t, name, file += ".pb");
    else save_npy(t, file += ".npy");
  }

  if (args.json()) {
    json j;
    j["model"] = path;
    j["target"] = target;
    j["pipeline"] = opt ? json(opt->pipeline.name) : json(pipeline);
    j["kernels"] = opt ? opt->report["kernels"] : json(count_operators(g));
    j["ops_before"] = opt ? opt->report["ops_before"] : json(count_operators(g));
    j["threads"] = threads;
    j["threads_used"] = exe ? exe->info().value("threads", 1) : 1;  // the reference interpreter is single-threaded
    if (exe) {
      j["compile"] = exe->info();
      j["compile_ms"] = compile_ms;
    }
    if (args.has("--profile")) j["profile"] = profile;
    j["seed"] = random ? json(seed) : json(nullptr);
    json ins = json::array();
    for (auto& f : feeds) {
      json e = tensor_info_json(f.tensor);
      e["name"] = f.name;
      e["source"] = f.source;
      ins.push_back(e);
    }
    j["inputs"] = ins;
    json outs = json::array();
    for (auto& name : g.outputs()) {
      json e = tensor_info_json(result.at(name));
      e["name"] = name;
      e["file"] = files.count(name) ? json(files[name]) : json(nullptr);
      outs.push_back(e);
    }
    j["outputs"] = outs;
    j["runs"] = runs;
    j["latency_ms"] = {{"median", timing.median}, {"min", timing.min}};
    j["cpu_ms"] = {{"median", cpu_timing.median}, {"min", cpu_timing.min}};
    print_json(j);
    return 0;
  }
  std::cout << "model: " << path << "  target: " << target << "  pipeline: " << pipeline << "\n";
  std::cout << "inputs:\n";
  for (auto& f : feeds)
    std::cout << "  " << f.name << "  " << (f.tensor.is_tensor() ? dtype_name(f.tensor.dtype()) + shape_str(f.tensor.shape()) : f.tensor.kind_str()) << "  from "
              << (f.source == "random" ? "random (seed " + std::to_string(seed) + ")" : f.source) << "\n";
  std::cout << "outputs:\n";
  for (auto& name : g.outputs()) {
    const Tensor& t = result.at(name);
    if (t.is_tensor()) std::cout << "  " << name << "  " << dtype_name(t.dtype()) << shape_str(t.shape()) << "  " << value_summary(t);
    else std::cout << "  " << name << "  " << t.kind_str();
    if (files.count(name)) std::cout << "  -> " << files[name];
    std::cout << "\n";
  }
  std::cout << "latency: median " << human_ms(timing.median) << ", min " << human_ms(timing.min) << " over " << runs
            << " run" << (runs > 1 ? "s" : "") << "; CPU time per run: median " << human_ms(cpu_timing.median);
  if (exe) {
    json info = exe->info();
    std::cout << " (" << info.value("target", target) << ", " << info.value("threads", 1) << " thread"
              << (info.value("threads", 1) == 1 ? "" : "s") << ")\n";
    if (info.contains("memory")) {
      const json& mem = info["memory"];
      std::cout << "kernels: " << mem.value("blocks", 0) << " (" << mem.value("fallback_blocks", 0)
                << " run by reference kernels)  activation memory: " << mem.value("peak_activation_bytes", 0) << " B planned vs "
                << mem.value("naive_activation_bytes", 0) << " B unplanned\n";
    }
    if (info.contains("build") && info["build"].contains("compile_ms"))
      std::cout << "compile: " << human_ms(info["build"].value("compile_ms", 0.0))
                << (info["build"].value("cache_hit", false) ? " (kernel cache hit)" : " (compiled)") << "\n";
  } else {
    std::cout << " (reference interpreter, 1 thread";
    if (threads != 1) std::cout << "; --threads " << threads << " has no effect on it";
    std::cout << ")\n";
  }
  if (!profile.empty()) {
    std::printf("%-8s %-44s %-13s %10s %9s\n", "kernel", "ops", "mapping", "ms", "GFLOP/s");
    for (auto& r : profile) {
      std::string ops;
      for (auto& o : r["ops"]) ops += (ops.empty() ? "" : "+") + o.get<std::string>();
      if (ops.size() > 44) ops = ops.substr(0, 41) + "...";
      std::printf("%-8s %-44s %-13s %10.3f %9.2f%s\n", r["kernel"].get<std::string>().c_str(), ops.c_str(),
                  r["mapping_type"].get<std::string>().c_str(), r["ms"].get<double>(), r["gflops"].get<double>(),
                  r["generated"].get<bool>() ? "" : "  (reference kernels)");
    }
  }
  return 0;
}

}  // namespace

Command run_command() {
  CommandSpec s;
  s.name = "run";
  s.summary = "run a model on .npy or random inputs; write outputs, time it";
  s.positionals = {{"MODEL", "an .onnx file"}};
  s.options = {
      {"--target", "", "T", "where to run: host (default), x86-avx2, x86-avx512, arm-neon (generated C++ kernels), mali-opencl, volta-cuda (generated GPU kernels: docs/gpu.md), or reference (the interpreter)"},
      {"--compiled", "", "DIR", "run a compiled artifact written by `nnfuse compile -o DIR` (MODEL may also be that DIR)"},
      {"--profile", "", "", "time every kernel (compiled targets), the median over --runs runs (at most 100): kernel, member ops, mapping type, ms, GFLOP/s"},
      {"--pipeline", "", "P", "none (the graph as imported; default for reference), auto (default for compiled targets), or a pipeline name"},
      {"--pipeline-file", "", "FILE", "a pipeline file to run instead of --pipeline"},
      {"--rules", "", "FILE", "a user rule file for the pipeline's rule passes", true},
      {"--no-profile", "", "", "settle undecided fusions and conv algorithms by the cost models alone (no timing)"},
      {"--precision", "", "P", "GPU targets: fp32 (default) or fp16 (volta-cuda: MatMul/Gemm/Conv tiles on tensor cores, fp32 accumulation)"},
      {"--shape", "", "NAME=DIMS", "bind a model input's dims, e.g. --shape input=1,3,224,224", true},
      {"--input", "", "NAME=FILE", "feed input NAME from a .npy file or an onnx.TensorProto .pb file (give all inputs, or none)", true},
      {"--seed", "", "N", "seed of the random inputs used when no --input is given (default 0)"},
      {"--outputs", "", "DIR", "write one file per graph output into DIR (created if missing): .npy, or .pb for dtypes numpy lacks"},
      {"--output-format", "", "F", "npy (default; bfloat16, float8, float4, int4/uint4, int2/uint2 outputs still go to .pb) or pb (onnx.TensorProto for every output)"},
      {"--runs", "", "N", "run N times and report the median and min latency (default 1)"},
      {"--threads", "", "T", "thread count of compiled targets (default: physical cores); the reference interpreter is single-threaded"},
      {"--json", "", "", "print one JSON object on stdout instead of text"},
  };
  s.description =
      "Imports MODEL and runs it. Inputs come from --input files (every input then needs one; their\n"
      "dtypes and shapes must match the model, and they bind its dynamic dims) or, without --input,\n"
      "are random (floats uniform in [-1,1), integers in [0,10)) from --seed. Dynamic dims of random\n"
      "inputs must be bound with --shape. Output files are named after the outputs, with characters\n"
      "other than letters, digits, '.', '_' and '-' replaced by '_'. A .pb file is an onnx.TensorProto\n"
      "(the form of ONNX test-data folders): it carries the dtypes numpy has none for.\n"
      "--target reference runs the interpreter (with a pipeline other than none, the fusion plan block\n"
      "by block); host, x86-avx2, x86-avx512 and arm-neon compile the fused blocks to C++ kernels\n"
      "(cached by content hash in $NNFUSE_CACHE_DIR or ~/.cache/nnfuse/kernels) and run them;\n"
      "mali-opencl and volta-cuda print them as OpenCL C / CUDA C and run them on a GPU (docs/gpu.md).";
  s.examples = {"nnfuse run model.onnx --input x=x.npy --outputs out/ --runs 10 --json",
                "nnfuse run bert.onnx --shape input_ids=1,128 --shape attention_mask=1,128 --seed 3"};
  return {s, run_run};
}

}  // namespace nnfuse::cli
