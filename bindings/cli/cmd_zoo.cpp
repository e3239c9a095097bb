// nnfuse zoo list / nnfuse zoo export NAME -o FILE: the built-in model zoo.
#include <filesystem>
#include <iostream>
#include <limits>

#include "commands.h"
#include "graph/onnx_io.h"
#include "graph/zoo.h"
#include "report.h"

namespace nnfuse::cli {

namespace {

int run_zoo_list(const ParsedArgs& args) {
  const auto& models = zoo_models();
  if (args.json()) {
    json arr = json::array();
    for (auto& e : models)
      arr.push_back({{"name", e.name}, {"class", e.network_class}, {"tiny", e.tiny}, {"description", e.description}});
    print_json(json{{"models", arr}});
    return 0;
  }
  if (models.empty()) {
    std::cout << "the model zoo is empty\n";
    return 0;
  }
  size_t wn = 4, wc = 5;
  for (auto& e : models) {
    wn = std::max(wn, e.name.size());
    wc = std::max(wc, e.network_class.size());
  }
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w - s.size() + 2, ' '); };
  std::cout << pad("name", wn) << pad("class", wc) << pad("tiny", 4) << "description\n";
  for (auto& e : models)
    std::cout << pad(e.name, wn) << pad(e.network_class, wc) << pad(e.tiny ? "yes" : "no", 4) << e.description << "\n";
  return 0;
}

int run_zoo_export(const ParsedArgs& args) {
  const std::string usage = args.spec->usage_line();
  ZooOptions opt;
  opt.opset = args.get_int("--opset", 13, 0, 1000);
  if (opt.opset != 13 && opt.opset != 17 && opt.opset != 20)
    throw UsageError("--opset " + std::to_string(opt.opset) + " is not one of 13, 17, 20", usage);
  opt.seed = uint64_t(args.get_int("--seed", 0, 0, std::numeric_limits<int64_t>::max()));
  opt.batch = args.get_int("--batch", 1, 1, 1 << 20);
  opt.seq_len = args.get_int("--seq", 0, 1, 1 << 20);
  opt.dynamic_batch = args.has("--dynamic");
  const std::string name = args.positional(0), out = args.get("--output");

  Model m = build_zoo_model(name, opt);
  save_model(m, out);
  std::error_code ec;
  auto bytes = std::filesystem::file_size(out, ec);
  const Graph& g = m.graph;
  GraphStats st = graph_stats(g);
  if (args.json()) {
    json j;
    j["name"] = name;
    j["output"] = out;
    j["bytes"] = ec ? 0 : bytes;
    j["opset"] = opt.opset;
    j["seed"] = opt.seed;
    j["batch"] = opt.batch;
    j["seq_len"] = opt.seq_len;
    j["dynamic"] = opt.dynamic_batch;
    j["inputs"] = values_json(g, g.inputs());
    j["outputs"] = values_json(g, g.outputs());
    j["nodes"] = st.nodes;
    j["operators"] = st.operators;
    j["flops"] = st.flops;
    print_json(j);
    return 0;
  }
  std::cout << "wrote " << out << ": " << name << " (opset " << opt.opset << ", " << st.operators << " operators, "
            << human_flops(st.flops) << ", " << human_bytes(ec ? 0.0 : double(bytes)) << ")\n";
  for (auto& n : g.inputs()) std::cout << "  input  " << n << "  " << g.type(n).str() << "\n";
  for (auto& n : g.outputs()) std::cout << "  output " << n << "  " << g.type(n).str() << "\n";
  return 0;
}

}  // namespace

Command zoo_list_command() {
  CommandSpec s;
  s.name = "zoo list";
  s.summary = "list the built-in models (name, class, tiny, description)";
  s.options = {{"--json", "", "", "print one JSON object {\"models\": [...]} on stdout instead of text"}};
  s.description = "The zoo builds real architectures with their published layer configurations and seeded\n"
                  "random weights. Tiny models are small enough for quick tests.";
  s.examples = {"nnfuse zoo list --json"};
  return {s, run_zoo_list};
}

Command zoo_export_command() {
  CommandSpec s;
  s.name = "zoo export";
  s.summary = "build a zoo model and write it as ONNX";
  s.positionals = {{"NAME", "a model name from 'nnfuse zoo list'"}};
  s.options = {
      {"--output", "-o", "FILE", "the .onnx file to write", false, true},
      {"--opset", "", "13|17|20", "13: LayerNorm/GELU decomposed; 17: LayerNormalization; 20: also Gelu (default 13)"},
      {"--seed", "", "N", "seed of the random weights (default 0)"},
      {"--batch", "", "B", "batch size (default 1)"},
      {"--seq", "", "L", "sequence length (default: the model's own)"},
      {"--dynamic", "", "", "make batch (and sequence) dims symbolic, as exporters with dynamic axes do"},
      {"--json", "", "", "print one JSON object on stdout instead of text"},
  };
  s.examples = {"nnfuse zoo export bert_tiny -o bert_tiny.onnx --opset 17 --dynamic"};
  return {s, run_zoo_export};
}

}  // namespace nnfuse::cli
