// nnfuse demo: a tiny zoo model through everything that exists, as a list of stages.
// Later issues add stages (rewrite, fusion, compile) by appending to make_stages().
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>

#include "api/compile.h"
#include "api/optimize.h"
#include "commands.h"
#include "graph/builder.h"
#include "graph/error.h"
#include "graph/interpreter.h"
#include "graph/onnx_io.h"
#include "graph/zoo.h"
#include "report.h"

namespace nnfuse::cli {

namespace {

// Everything the stages hand to each other, and what the summary reports.
struct DemoState {
  std::string model_name, model_class, description;
  Model original;
  std::string onnx_bytes;
  Model reimported;
  GraphStats stats;
  TensorMap feeds, outputs, outputs_reimported;
  double run_ms = 0;
  double max_abs_diff = 0;
  // The compiled (host) run.
  std::unique_ptr<Executable> exe;
  size_t kernels = 0;
  double compiled_ms = 0, compiled_max_diff = 0;
  nlohmann::json compile_info;
};

struct Stage {
  std::string name;
  // Does the work; returns a one-line detail for the report.
  std::function<std::string(DemoState&)> run;
};

// A small MLP built in place, so that the demo still shows the pipeline when the zoo has no tiny
// model.
Model builtin_mlp() {
  GraphBuilder b("demo_mlp", 17, 0);
  std::string x = b.input("x", DType::Float32, {Dim(2), Dim(16)});
  std::string h = b.op("MatMul", {x, b.weight("w1", {16, 32}, 0.25f)});
  h = b.op("Add", {h, b.weight("b1", {32})});
  h = b.op("Relu", {h});
  h = b.op("MatMul", {h, b.weight("w2", {32, 10}, 0.25f)});
  h = b.op("Softmax", {h}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
  b.output(h);
  return b.finish();
}

std::string build_stage(DemoState& s) {
  const ZooEntry* pick = nullptr;
  for (auto& e : zoo_models())
    if (e.name == "bert_tiny") pick = &e;
  if (!pick)
    for (auto& e : zoo_models())
      if (e.tiny) { pick = &e; break; }
  if (pick) {
    s.model_name = pick->name;
    s.model_class = pick->network_class;
    s.description = pick->description;
    ZooOptions opt;
    opt.opset = 17;
    s.original = build_zoo_model(pick->name, opt);
  } else {
    s.model_name = "demo_mlp";
    s.model_class = "generic";
    s.description = "built-in 2-layer MLP (the zoo has no tiny model yet)";
    s.original = builtin_mlp();
  }
  return s.model_name + ": " + std::to_string(s.original.graph.num_nodes()) + " nodes, " +
         std::to_string(s.original.graph.initializer_names().size()) + " weights";
}

std::string export_stage(DemoState& s) {
  s.onnx_bytes = save_model_bytes(s.original);
  return "ONNX protobuf, " + human_bytes(double(s.onnx_bytes.size()));
}

std::string import_stage(DemoState& s) {
  s.reimported = load_model_bytes(s.onnx_bytes, ImportOptions{}, "", s.model_name + ".onnx (round trip)");
  const Graph &a = s.original.graph, &b = s.reimported.graph;
  if (a.num_nodes() != b.num_nodes())
    fail(ErrorKind::Runtime, "round trip changed the node count from " + std::to_string(a.num_nodes()) + " to " + std::to_string(b.num_nodes()));
  return std::to_string(b.num_nodes()) + " nodes, shapes inferred";
}

std::string analyze_stage(DemoState& s) {
  s.stats = graph_stats(s.reimported.graph);
  std::string out;
  for (auto& n : s.reimported.graph.outputs()) out += (out.empty() ? "" : ", ") + n + " " + s.reimported.graph.type(n).str();
  return std::to_string(s.stats.operators) + " operators, " + human_flops(s.stats.flops) + "; outputs " + out;
}

std::string run_stage(DemoState& s) {
  s.feeds = random_feeds(s.original.graph, 0);
  Interpreter interp(s.original.graph);
  auto t0 = std::chrono::steady_clock::now();
  s.outputs = interp.run(s.feeds);
  s.run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return "reference interpreter on random inputs (seed 0): " + human_ms(s.run_ms);
}

std::string check_stage(DemoState& s) {
  s.outputs_reimported = run_reference(s.reimported.graph, s.feeds);
  double worst = 0;
  for (auto& [name, a] : s.outputs) {
    auto it = s.outputs_reimported.find(name);
    if (it == s.outputs_reimported.end()) fail(ErrorKind::Runtime, "round trip lost output '" + name + "'");
    const Tensor& b = it->second;
    if (a.shape() != b.shape() || a.dtype() != b.dtype())
      fail(ErrorKind::Runtime, "round trip changed output '" + name + "' from " + dtype_name(a.dtype()) + shape_str(a.shape()) +
                                   " to " + dtype_name(b.dtype()) + shape_str(b.shape()));
    Tensor x = a.cast(DType::Float64), y = b.cast(DType::Float64);
    const double *p = x.data<double>(), *q = y.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      double d = std::fabs(p[i] - q[i]);
      if (std::isnan(d) && !(std::isnan(p[i]) && std::isnan(q[i]))) d = INFINITY;
      if (d > worst) worst = d;
    }
  }
  s.max_abs_diff = worst;
  // The same graph on the same inputs: any difference is a bug in import or export.
  if (!(worst <= 1e-6)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", worst);
    fail(ErrorKind::Runtime, std::string("round-trip outputs differ from the original's (max abs difference ") + buf + ")");
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "re-imported model matches: max abs difference %g", worst);
  return buf;
}

// Worst |a - b| / (1e-5 + 1e-4 |b|) over every output (<= 1 passes the contract's float bound).
double worst_scaled_diff(const TensorMap& got, const TensorMap& want, double* max_abs) {
  double worst = 0;
  *max_abs = 0;
  for (auto& [name, w] : want) {
    auto it = got.find(name);
    if (it == got.end()) fail(ErrorKind::Runtime, "compiled model lost output '" + name + "'");
    Tensor x = it->second.cast(DType::Float64), y = w.cast(DType::Float64);
    if (x.numel() != y.numel()) fail(ErrorKind::Runtime, "compiled output '" + name + "' has shape " + shape_str(x.shape()));
    const double *p = x.data<double>(), *q = y.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      double d = std::fabs(p[i] - q[i]);
      if (std::isnan(d)) d = (std::isnan(p[i]) && std::isnan(q[i])) ? 0 : INFINITY;
      *max_abs = std::max(*max_abs, d);
      worst = std::max(worst, d / (1e-5 + 1e-4 * std::fabs(q[i])));
    }
  }
  return worst;
}

std::string compile_stage(DemoState& s) {
  Model m = s.reimported;
  OptimizeOptions o;
  o.target = "host";
  o.profile = false;  // deterministic and offline
  OptimizeResult r = optimize(m, o);
  CompileOptions co;
  co.target = "host";
  co.profile = false;  // deterministic and offline, like the fusion plan above
  s.exe = compile(m, r.plan ? &*r.plan : nullptr, co);
  s.compile_info = s.exe->info();
  s.kernels = r.plan ? r.plan->kernels() : m.graph.num_nodes();
  const auto& mem = s.compile_info["memory"];
  const auto& b = s.compile_info["build"];
  return std::to_string(s.kernels) + " fused kernels (" + std::to_string(mem.value("fallback_blocks", 0)) +
         " on reference kernels), C++ " + (b.value("cache_hit", false) ? "from the kernel cache" : "compiled") + " in " +
         human_ms(b.value("compile_ms", 0.0)) + "; activations " + human_bytes(double(mem.value("peak_activation_bytes", 0))) +
         " planned vs " + human_bytes(double(mem.value("naive_activation_bytes", 0)));
}

std::string compiled_run_stage(DemoState& s) {
  TensorMap got = s.exe->run(s.feeds);  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    got = s.exe->run(s.feeds);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  s.compiled_ms = ms[ms.size() / 2];
  double max_abs = 0;
  double worst = worst_scaled_diff(got, s.outputs, &max_abs);
  s.compiled_max_diff = max_abs;
  if (!(worst <= 1.0)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%g", max_abs);
    fail(ErrorKind::Runtime, std::string("compiled outputs differ from the reference interpreter's (max abs difference ") + buf + ")");
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "median %s over 5 runs (%d threads); matches the reference: max abs difference %g",
                human_ms(s.compiled_ms).c_str(), s.compile_info.value("threads", 1), max_abs);
  return buf;
}

std::vector<Stage> make_stages() {
  return {
      {"build", build_stage},          // zoo model with seeded weights
      {"export", export_stage},        // nnfuse IR -> ONNX bytes
      {"import", import_stage},        // ONNX bytes -> nnfuse IR, shape inference
      {"analyze", analyze_stage},      // mapping types, FLOPs
      {"run", run_stage},              // reference interpreter
      {"round-trip check", check_stage},  // re-imported model gives the same outputs
      {"compile (host)", compile_stage},    // optimize, lower, generate C++, compile, load
      {"compiled run", compiled_run_stage}, // generated kernels vs the reference interpreter
  };
}

int run_demo(const ParsedArgs& args) {
  DemoState s;
  std::vector<Stage> stages = make_stages();
  json stage_reports = json::array();
  bool text = !args.json();
  for (size_t i = 0; i < stages.size(); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::string detail;
    try {
      detail = stages[i].run(s);
    } catch (const Error& e) {
      fail(e.kind(), "demo stage '" + stages[i].name + "' failed: " + e.what());
    } catch (const std::exception& e) {
      fail(ErrorKind::Runtime, "demo stage '" + stages[i].name + "' failed: " + e.what());
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    stage_reports.push_back({{"name", stages[i].name}, {"ms", ms}, {"detail", detail}});
    if (text) {
      if (i == 0) std::cout << "nnfuse demo: " << s.model_name << " (" << s.model_class << ") - " << s.description << "\n";
      std::string label = "[" + std::to_string(i + 1) + "/" + std::to_string(stages.size()) + "] " + stages[i].name;
      std::cout << "  " << label << std::string(label.size() < 24 ? 24 - label.size() : 1, ' ') << human_ms(ms) << "  " << detail << "\n";
    }
  }
  if (!text) {
    json j;
    j["model"] = s.model_name;
    j["class"] = s.model_class;
    j["description"] = s.description;
    j["stages"] = stage_reports;
    j["ops"] = s.stats.by_op;
    j["mapping_types"] = s.stats.by_mapping;
    j["operators"] = s.stats.operators;
    j["flops"] = s.stats.flops;
    j["latency_ms"] = s.run_ms;
    j["max_abs_diff"] = s.max_abs_diff;
    j["kernels"] = s.kernels;
    j["compiled"] = {{"latency_ms", s.compiled_ms}, {"max_abs_diff_vs_reference", s.compiled_max_diff}, {"info", s.compile_info}};
    print_json(j);
    return 0;
  }
  std::cout << "summary:\n";
  std::cout << "  operators: " << s.stats.operators << " (plus " << s.stats.constants << " Constant nodes)\n";
  std::cout << "  ops by mapping type:\n" << histogram_text(s.stats.by_mapping, "    ");
  std::cout << "  FLOPs: " << flops_text(s.stats) << "\n";
  std::cout << "  latency (reference interpreter): " << human_ms(s.run_ms) << "\n";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", s.max_abs_diff);
  std::cout << "  round-trip max abs difference: " << buf << "\n";
  std::cout << "  fused kernels: " << s.kernels << "; latency (generated kernels, host): " << human_ms(s.compiled_ms) << "\n";
  std::snprintf(buf, sizeof buf, "%g", s.compiled_max_diff);
  std::cout << "  compiled vs reference max abs difference: " << buf << "\n";
  return 0;
}

}  // namespace

Command demo_command() {
  CommandSpec s;
  s.name = "demo";
  s.summary = "run a tiny zoo model through the whole pipeline and summarise each stage";
  s.options = {{"--json", "", "", "print one JSON object on stdout instead of text"}};
  s.description =
      "Builds a tiny zoo model (bert_tiny if present, else the first tiny one), exports it to ONNX and\n"
      "imports it again, infers shapes, runs it with the reference interpreter on random inputs and\n"
      "checks that the re-imported model gives the same outputs; then optimizes it, compiles the fused\n"
      "blocks for the host CPU and checks the generated kernels against the interpreter. Prints each\n"
      "stage's time and result, ops by mapping type, FLOPs, latencies and the max abs differences.";
  s.examples = {"nnfuse demo", "nnfuse demo --json"};
  return {s, run_demo};
}

}  // namespace nnfuse::cli
