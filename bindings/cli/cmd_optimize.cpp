// nnfuse optimize MODEL: rewrite, classify, plan fusion; print the optimize report.
#include <fstream>
#include <iomanip>
#include <iostream>

#include "api/compile.h"
#include "api/optimize.h"
#include "commands.h"
#include "fusion/plan_report.h"
#include "graph/onnx_io.h"
#include "report.h"

namespace nnfuse::cli {

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) fail(ErrorKind::Io, "cannot write '" + path + "'");
  out << text;
}

int run_optimize(const ParsedArgs& args) {
  const std::string path = args.positional(0);
  Model m = load_model_file(path, shape_bindings(args));
  OptimizeOptions o;
  o.pipeline = args.get("--pipeline", "auto");
  o.pipeline_file = args.get("--pipeline-file");
  o.rule_files = args.all("--rules");
  o.target = args.get("--target", "host");
  o.profile = !args.has("--no-profile");
  o.profile_cache = args.get("--profile-cache");
  o.verify = args.has("--verify");
  target_by_name(o.target);  // an unknown target fails before any work
  if (args.has("--cuda-arch") && o.target != "volta-cuda") fail(ErrorKind::Invalid, "--cuda-arch needs --target volta-cuda");
  if (args.has("--precision") && o.target != "volta-cuda") fail(ErrorKind::Invalid, "--precision needs --target volta-cuda");
  OptimizeResult r = optimize(m, o);
  nlohmann::json& rep = r.report;
  rep["model"] = path;
  if (args.has("--export-rewritten")) {
    save_model(m, args.get("--export-rewritten"));
    rep["exported_rewritten"] = args.get("--export-rewritten");
  }
  if (args.has("--export-fused") || args.has("--dot")) {
    if (!r.plan) fail(ErrorKind::Invalid, "pipeline '" + r.pipeline.name + "' does no fusion planning: nothing to export as fused blocks");
    if (args.has("--export-fused")) {
      Model fm = fused_model(m, *r.plan);
      save_model(fm, args.get("--export-fused"));
      rep["exported_fused"] = args.get("--export-fused");
    }
    if (args.has("--dot")) {
      write_text(args.get("--dot"), plan_to_dot(m.graph, *r.plan));
      rep["dot"] = args.get("--dot");
    }
  }
  // GPU targets: which stages would run on the host between device launches.
  if (r.plan && (o.target == "mali-opencl" || o.target == "volta-cuda")) rep["device"] = device_stage_report(m.graph, *r.plan, args.get("--cuda-arch", ""), args.get("--precision", "fp32"));
  if (args.json()) {
    print_json(rep);
    return 0;
  }
  std::cout << path << ": " << rep["network_class"].get<std::string>();
  if (!rep["network_class_secondary"].is_null()) std::cout << " + " << rep["network_class_secondary"].get<std::string>();
  std::cout << " (confidence " << std::fixed << std::setprecision(2) << r.classification.confidence << ")\n";
  for (auto& why : r.classification.reasons) std::cout << "  - " << why << "\n";
  std::cout << "pipeline " << r.pipeline.name << ":\n";
  for (auto& p : r.passes)
    std::cout << "  " << std::left << std::setw(28) << p.name << std::right << std::setw(10) << std::setprecision(2) << p.ms << " ms  "
              << (p.changed ? "changed" : "no change") << (p.auto_inserted ? " (required)" : "") << "\n";
  std::cout << "operators: " << rep["ops_before"] << " -> " << rep["ops_after_rewrite"] << " after rewriting\n";
  std::cout << "FLOPs: " << human_flops(rep["flops_before"].get<double>()) << " -> " << human_flops(rep["flops_after"].get<double>()) << "\n";
  if (!rep["rules_fired"].empty()) {
    std::cout << "rules fired:\n";
    for (auto& [k, v] : rep["rules_fired"].items()) std::cout << "  " << std::left << std::setw(36) << k << std::right << v << "\n";
  }
  std::cout << "kernels: " << rep["kernels"] << (r.plan ? "" : " (no fusion planning in this pipeline)") << "\n";
  if (r.plan) {
    std::map<std::string, size_t> by_type;
    for (auto& b : r.plan->blocks) ++by_type[mapping_type_name(b.type)];
    std::cout << histogram_text(by_type);
  }
  if (rep.contains("device")) {
    const auto& d = rep["device"];
    if (d.contains("error")) std::cout << "device kernels: not printed (" << d["error"].get<std::string>() << ")\n";
    else {
      std::cout << "device kernels: " << d["kernels"] << " (" << d["entry_points"] << " entry points); stages on the host: "
                << d["host_stages"].size() << "\n";
      for (auto& h : d["host_stages"])
        std::cout << "  " << h["stage"].get<std::string>() << " (" << h["ops"].get<std::string>() << "): " << h["reason"].get<std::string>() << "\n";
      if (d.contains("cuda_compile")) {
        const auto& c = d["cuda_compile"];
        if (c.contains("error")) std::cout << "CUDA compile: failed (" << c["error"].get<std::string>() << ")\n";
        else
          std::cout << "CUDA compile for " << c["arch"].get<std::string>() << ": " << c["kernels"].size() << " entry points, at most "
                    << c["max_registers"] << " registers, " << c["max_spill_bytes"] << " spill bytes, " << c["max_shared_bytes"]
                    << " shared bytes (" << c["nvrtc"].get<std::string>() << ")\n";
      }
    }
  }
  for (auto& w : r.report["warnings"]) std::cerr << "nnfuse: warning: " << w.get<std::string>() << "\n";
  return 0;
}

}  // namespace

Command optimize_command() {
  CommandSpec s;
  s.name = "optimize";
  s.summary = "rewrite, classify and plan fusion; print the optimize report";
  s.positionals = {{"MODEL", "an .onnx file"}};
  s.options = {
      {"--pipeline", "", "auto|none|NAME", "pass pipeline: auto (classify and pick), none, or a shipped pipeline name"},
      {"--pipeline-file", "", "FILE", "a pipeline file to run instead"},
      {"--rules", "", "FILE", "a user rule file, on top of the shipped rules", true},
      {"--target", "", "TARGET", "host (default), x86-avx2, x86-avx512, arm-neon, mali-opencl, volta-cuda, reference"},
      {"--shape", "", "NAME=DIMS", "bind a model input's dims, e.g. --shape input=1,3,224,224", true},
      {"--no-profile", "", "", "settle undecided fusions by the cost model alone (deterministic, offline)"},
      {"--profile-cache", "", "FILE", "profile cache file (default $NNFUSE_PROFILE_CACHE or ~/.cache/nnfuse/profile.json)"},
      {"--export-rewritten", "", "OUT.onnx", "write the graph after rewriting, before fusion (runs in ONNX Runtime)"},
      {"--export-fused", "", "OUT.onnx", "write fused blocks as nnfuse-domain function nodes (for Netron)"},
      {"--dot", "", "OUT.dot", "draw the fusion blocks as Graphviz clusters coloured by mapping type"},
      {"--precision", "", "P", "volta-cuda: fp32 (default) or fp16 (GEMM/conv tiles on tensor cores) for the device report and --cuda-arch"},
      {"--cuda-arch", "", "ARCH", "volta-cuda: also compile the kernels with NVRTC for ARCH (e.g. sm_70; no GPU needed) and report registers, spills and shared memory"},
      {"--verify", "", "", "validate the graph after every pass"},
      {"--json", "", "", "print the optimize report as one JSON object"},
  };
  s.description =
      "Classifies the network (residual CNN, mobile CNN, detector, transformer encoder/decoder, RNN,\n"
      "generic), runs the pass pipeline chosen for its class (or the one named), plans DNNFusion-style\n"
      "fusion for the target and reports operators, FLOPs, kernels and why each block member joined.";
  s.examples = {"nnfuse optimize resnet50.onnx --json", "nnfuse optimize bert.onnx --pipeline full --dot bert.dot",
                "nnfuse optimize model.onnx --rules my.rules --export-rewritten model.opt.onnx"};
  return {s, run_optimize};
}

}  // namespace nnfuse::cli
