// nnfuse tune-pipeline MODEL: search pass subsets and orders for one model; write the best
// pipeline file and print what was tried.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "api/tune_pipeline.h"
#include "commands.h"
#include "graph/onnx_io.h"
#include "report.h"

namespace nnfuse::cli {

namespace {

int parse_int(const ParsedArgs& args, const std::string& opt, int dflt, int min) {
  if (!args.has(opt)) return dflt;
  const std::string v = args.get(opt);
  try {
    size_t used = 0;
    long long n = std::stoll(v, &used);
    if (used != v.size() || n < min || n > 1000000) throw std::invalid_argument(v);
    return int(n);
  } catch (const std::exception&) {
    throw UsageError(opt + " '" + v + "': expected an integer >= " + std::to_string(min), args.spec->usage_line());
  }
}

std::string join_passes(const std::vector<std::string>& p) {
  if (p.empty()) return "(none)";
  std::string s;
  for (auto& x : p) s += (s.empty() ? "" : ",") + x;
  return s;
}

int run_tune(const ParsedArgs& args) {
  const std::string path = args.positional(0);
  TuneOptions o;
  o.budget = parse_int(args, "--budget", 30, 1);
  o.seed = uint64_t(parse_int(args, "--seed", 0, 0));
  o.objective = args.get("--objective", "kernels");
  if (o.objective != "kernels" && o.objective != "latency")
    throw UsageError("--objective '" + o.objective + "': expected kernels or latency", args.spec->usage_line());
  o.target = args.get("--target", "host");
  o.rule_files = args.all("--rules");
  target_by_name(o.target);  // an unknown target fails before any work
  Model m = load_model_file(path, shape_bindings(args));

  // Progress on a terminal only: one rewritten status line on stderr.
  const bool progress = isatty(STDERR_FILENO) != 0;
  if (progress)
    o.on_trial = [](const Trial& t, int total, const Trial& best) {
      std::cerr << "\rtune-pipeline: trial " << (t.index + 1) << "/" << total << "  best: " << best.result.kernels
                << " kernels, cost " << std::fixed << std::setprecision(1) << best.result.cost << " (trial " << best.index << ")   "
                << std::flush;
    };
  TuneResult r = tune_pipeline(m, o);
  if (progress) std::cerr << "\n";

  const std::string out = args.get("--output", "");
  if (!out.empty()) {
    const Trial& b = r.search.best_trial();
    std::ostringstream why;
    why << "best of " << r.search.trials.size() << " trials (trial " << b.index << ", seed " << o.seed << ", objective "
        << o.objective << "): " << b.result.kernels << " kernels, cost " << b.result.cost << ", " << b.result.ms
        << " ms of passes; full: " << r.full.kernels << " kernels, cost " << r.full.cost << ", " << r.full.ms << " ms";
    Pipeline p = r.best;
    p.name = "tuned";
    p.description = "tuned for " + path + " by nnfuse tune-pipeline";
    std::ofstream f(out);
    if (!f) fail(ErrorKind::Io, "cannot write '" + out + "'");
    f << pipeline_to_text(p, {"Written by nnfuse tune-pipeline " + path, why.str()});
    if (!f) fail(ErrorKind::Io, "cannot write '" + out + "'");
  }

  nlohmann::json rep = r.report;
  rep["model"] = path;
  if (!out.empty()) rep["output"] = out;
  if (args.json()) {
    print_json(rep);
    return 0;
  }
  const bool lat = o.objective == "latency";
  std::cout << path << ": " << r.classification.primary << ", " << r.search.trials.size() << " trials (budget " << o.budget
            << ", seed " << o.seed << ", objective " << o.objective << ")\n";
  std::cout << std::left << std::setw(6) << "trial" << std::setw(9) << "phase" << std::right << std::setw(8) << "kernels"
            << std::setw(14) << (lat ? "latency ms" : "cost us") << std::setw(10) << "opt ms" << "  passes\n";
  for (auto& t : r.search.trials) {
    std::cout << std::left << std::setw(6) << t.index << std::setw(9) << t.phase << std::right;
    if (t.result.ok)
      std::cout << std::setw(8) << t.result.kernels << std::setw(14) << std::fixed << std::setprecision(2) << t.result.cost
                << std::setw(10) << t.result.ms;
    else
      std::cout << std::setw(32) << "failed";
    std::cout << (t.improved ? " *" : "  ") << join_passes(t.passes);
    if (!t.result.ok) std::cout << "  (" << t.result.error << ")";
    std::cout << "\n";
  }
  const Trial& b = r.search.best_trial();
  std::cout << "best: trial " << b.index << ": " << b.result.kernels << " kernels, " << (lat ? "latency " : "cost ") << std::fixed
            << std::setprecision(2) << b.result.cost << (lat ? " ms" : " us") << ", " << b.result.ms << " ms of passes\n";
  std::cout << "full: " << r.full.kernels << " kernels, " << (lat ? "latency " : "cost ") << r.full.cost << (lat ? " ms" : " us")
            << ", " << r.full.ms << " ms of passes\n";
  std::cout << "pipeline: " << join_passes(b.passes) << ",fusion-plan\n";
  if (!out.empty()) std::cout << "wrote " << out << "\n";
  return 0;
}

}  // namespace

Command tune_pipeline_command() {
  CommandSpec s;
  s.name = "tune-pipeline";
  s.summary = "search pass subsets and orders for one model; write the best pipeline";
  s.positionals = {{"MODEL", "an .onnx file"}};
  s.options = {
      {"--budget", "", "N", "trials to spend, the baseline (full) included (default 30)"},
      {"--seed", "", "S", "seed of the random pipelines and of the neighbour order (default 0)"},
      {"--output", "-o", "OUT.pipeline", "write the best pipeline file here"},
      {"--objective", "", "kernels|latency", "kernels (then estimated cost, then optimizer time; default) or measured latency (compiled targets)"},
      {"--target", "", "TARGET", "target the fusion plan (and, for latency, the kernels) are made for (default host)"},
      {"--rules", "", "FILE", "a user rule file for rules-user", true},
      {"--shape", "", "NAME=DIMS", "bind a model input's dims, e.g. --shape input=1,3,224,224", true},
      {"--json", "", "", "print the search (every trial and the best) as one JSON object"},
  };
  s.description =
      "Evaluates the full pipeline, then random subsets of its passes in random orders, then greedy\n"
      "moves around the best so far (drop a pass, swap two adjacent passes, insert a missing one),\n"
      "within --budget trials. Each trial rewrites a fresh copy of the model, validates the graph and\n"
      "plans fusion; trials are ranked by kernels, then estimated cost (bytes at block boundaries over\n"
      "bandwidth plus FLOPs over peak for the target), then pass count and optimizer time. Progress\n"
      "goes to stderr when it is a terminal.";
  s.examples = {"nnfuse tune-pipeline resnet50.onnx --budget 40 -o resnet50.pipeline",
                "nnfuse optimize resnet50.onnx --pipeline-file resnet50.pipeline"};
  return {s, run_tune};
}

}  // namespace nnfuse::cli
