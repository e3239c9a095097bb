// nnfuse compile MODEL -o DIR: optimize, generate and compile the kernels for a CPU target, and
// write a deployable artifact (kernels.so, model.onnx with the weights, plan.json) that
// `nnfuse run DIR` loads and runs without a compiler.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "api/compile.h"
#include "api/optimize.h"
#include "commands.h"
#include "report.h"

namespace nnfuse::cli {

namespace {

int run_compile(const ParsedArgs& args) {
  const std::string path = args.positional(0);
  const std::string out = args.get("--output");
  const std::string target = args.get("--target", "host");
  if (target == "reference" || target == "mali-opencl" || target == "volta-cuda")
    throw UsageError("--target '" + target + "' has no deployable artifact; CPU targets: host, x86-avx2, x86-avx512, arm-neon",
                     args.spec->usage_line());
  // Wall time per phase (the report's phases_ms): where a compile spends its time.
  auto clock = std::chrono::steady_clock::now();
  auto lap = [&clock] {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - clock).count();
    clock = now;
    return ms;
  };
  json phases;
  Model m = load_model_file(path, shape_bindings(args));
  phases["load"] = lap();
  OptimizeOptions o;
  o.pipeline = args.get("--pipeline", "auto");
  o.pipeline_file = args.get("--pipeline-file");
  o.rule_files = args.all("--rules");
  o.target = target;
  o.profile = !args.has("--no-profile");
  OptimizeResult r = optimize(m, o);
  phases["optimize"] = lap();
  CompileOptions co;
  co.target = target;
  co.progress = terminal_progress("compiling kernels");
  co.cache_dir = args.get("--cache-dir");
  co.profile = o.profile;
  auto exe = compile(m, r.plan ? &*r.plan : nullptr, co);
  phases["compile"] = lap();
  save_compiled(*exe, out);
  phases["save"] = lap();
  // total_ms: from the loaded model to the saved artifact (the load is in phases_ms).
  const double ms = phases["optimize"].get<double>() + phases["compile"].get<double>() + phases["save"].get<double>();
  json info = exe->info();
  if (args.json()) {
    json j;
    j["model"] = path;
    j["target"] = target;
    j["output"] = out;
    // kernels.so, model.onnx, plan.json; for arm-neon on x86 `model` (a static aarch64 program) and
    // weights.bin instead of kernels.so.
    std::vector<std::string> files;
    for (auto& e : std::filesystem::directory_iterator(out)) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    j["files"] = files;
    j["kernels"] = r.report.value("kernels", json(nullptr));
    j["pipeline"] = r.pipeline.name;
    j["compile"] = info;
    j["total_ms"] = ms;
    j["phases_ms"] = phases;
    print_json(j);
    return 0;
  }
  std::cout << "compiled " << path << " for " << target << " -> " << out
            << (info.contains("build") && info["build"].contains("program") ? " (model: a static program, weights.bin, model.onnx, plan.json)\n"
                                                                            : " (kernels.so, model.onnx, plan.json)\n");
  if (info.contains("memory")) {
    const json& mem = info["memory"];
    std::cout << "kernels: " << mem.value("blocks", 0) << " (" << mem.value("fallback_blocks", 0) << " run by reference kernels)\n";
  }
  std::cout << "time: " << human_ms(ms) << " (optimize " << human_ms(phases["optimize"]) << ", kernels " << human_ms(phases["compile"])
            << ", save " << human_ms(phases["save"]) << "; loading the model took " << human_ms(phases["load"]) << ")\n";
  return 0;
}

}  // namespace

Command compile_command() {
  CommandSpec s;
  s.name = "compile";
  s.summary = "compile a model for a CPU target into a deployable artifact directory";
  s.positionals = {{"MODEL", "an .onnx file"}};
  s.options = {
      {"--output", "-o", "DIR", "the artifact directory (created): kernels.so, model.onnx, plan.json", false, true},
      {"--target", "", "T", "host (default), x86-avx2, x86-avx512, arm-neon"},
      {"--pipeline", "", "P", "auto (default), none, or a pipeline name"},
      {"--pipeline-file", "", "FILE", "a pipeline file to run instead of --pipeline"},
      {"--rules", "", "FILE", "a user rule file for the pipeline's rule passes", true},
      {"--no-profile", "", "", "settle undecided fusions and conv algorithms by the cost models alone (no timing)"},
      {"--shape", "", "NAME=DIMS", "bind a model input's dims (compiled models have static shapes)", true},
      {"--cache-dir", "", "DIR", "kernel cache directory (default $NNFUSE_CACHE_DIR or ~/.cache/nnfuse/kernels)"},
      {"--json", "", "", "print one JSON object on stdout instead of text"},
  };
  s.description =
      "Optimizes MODEL, generates C++ kernels for its fused blocks, compiles them with the system\n"
      "compiler and writes DIR. `nnfuse run DIR` (or `nnfuse run X --compiled DIR`) runs it with no\n"
      "compiler present. Dynamic input dims must be bound with --shape.";
  s.examples = {"nnfuse compile resnet50.onnx -o resnet50.nnf", "nnfuse run resnet50.nnf --runs 20 --threads 2"};
  return {s, run_compile};
}

}  // namespace nnfuse::cli
