// nnfuse inspect MODEL: what a model is made of, after import and shape inference.
#include <iostream>

#include "commands.h"
#include "graph/error.h"
#include "graph/onnx_io.h"
#include "report.h"

namespace nnfuse::cli {

namespace {

size_t initializer_bytes(const Graph& g) {
  size_t total = 0;
  for (auto& n : g.initializer_names()) total += g.initializer(n).nbytes();
  return total;
}

void print_values(const Graph& g, const std::vector<std::string>& names) {
  size_t width = 0;
  for (auto& n : names) width = std::max(width, n.size());
  for (auto& n : names) std::cout << "  " << n << std::string(width - n.size() + 2, ' ') << g.type(n).str() << "\n";
  if (names.empty()) std::cout << "  (none)\n";
}

int run_inspect(const ParsedArgs& args) {
  const std::string path = args.positional(0);
  const auto bindings = shape_bindings(args);
  // A model whose shapes cannot be inferred (inconsistent shapes, a case an op's inference does not
  // cover) is still worth describing: load it again without inference (and without --shape), show
  // the declared types, and say why shapes are missing. Ops the importer rejects stay errors.
  Model m;
  std::string inference_error;
  try {
    m = load_model_file(path, bindings);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Unsupported && e.kind() != ErrorKind::Shape) throw;
    ImportOptions opt;
    opt.infer_shapes = false;
    try {
      m = load_model(path, opt);
    } catch (const Error&) {
      throw e;  // not an inference problem after all: report the first error
    }
    inference_error = e.what();
  }
  const Graph& g = m.graph;
  GraphStats st = graph_stats(g);
  size_t weight_bytes = initializer_bytes(g);

  if (args.json()) {
    json j;
    j["model"] = path;
    j["graph_name"] = g.name;
    j["ir_version"] = m.ir_version;
    j["producer"] = {{"name", m.producer_name}, {"version", m.producer_version}};
    j["opsets"] = opsets_json(g.opset_imports);
    j["inputs"] = values_json(g, g.inputs());
    j["outputs"] = values_json(g, g.outputs());
    j["shapes_inferred"] = inference_error.empty();
    j["shape_inference_error"] = inference_error.empty() ? json(nullptr) : json(inference_error);
    j["initializers"] = {{"count", g.initializer_names().size()}, {"bytes", weight_bytes}};
    j.update(stats_json(st));
    print_json(j);
    return 0;
  }
  std::cout << "model: " << path << (g.name.empty() ? "" : "  (graph '" + g.name + "')") << "\n";
  std::cout << "ir_version " << m.ir_version << ", producer "
            << (m.producer_name.empty() ? "(unknown)" : m.producer_name)
            << (m.producer_version.empty() ? "" : " " + m.producer_version) << "\n";
  std::cout << "opsets: " << opsets_text(g.opset_imports) << "\n";
  if (!inference_error.empty())
    std::cout << "note: shapes not inferred, types are as declared in the file (" << inference_error << ")\n";
  std::cout << "inputs:\n";
  print_values(g, g.inputs());
  std::cout << "outputs:\n";
  print_values(g, g.outputs());
  std::cout << "initializers: " << g.initializer_names().size() << " (" << human_bytes(double(weight_bytes)) << ")\n";
  std::cout << "nodes: " << st.nodes << " (" << st.operators << " operators, " << st.constants << " Constant)\n";
  std::cout << "ops by type:\n" << histogram_text(st.by_op);
  std::cout << "ops by mapping type:\n" << histogram_text(st.by_mapping);
  for (auto& [op, why] : st.unsupported) std::cout << "  (no mapping type for " << op << ": " << why << ")\n";
  std::cout << "FLOPs: " << flops_text(st) << "\n";
  return 0;
}

}  // namespace

Command inspect_command() {
  CommandSpec s;
  s.name = "inspect";
  s.summary = "show a model's opsets, inputs/outputs with inferred shapes, op histograms and FLOPs";
  s.positionals = {{"MODEL", "an .onnx file"}};
  s.options = {
      {"--shape", "", "NAME=DIMS", "bind a model input's dims, e.g. --shape input=1,3,224,224", true},
      {"--json", "", "", "print one JSON object on stdout instead of text"},
  };
  s.description =
      "Imports MODEL, infers every shape (symbolic dims keep their names unless bound with --shape)\n"
      "and prints: opsets, IR version, producer, inputs and outputs with shapes, initializer count\n"
      "and weight bytes, operators by op and by DNNFusion mapping type (Constant nodes are counted\n"
      "separately, not as operators), total FLOPs and node count. If shape inference fails (for\n"
      "example inconsistent shapes), the types declared in the file are shown with a note saying why.";
  s.examples = {"nnfuse inspect resnet50.onnx --shape input=1,3,224,224", "nnfuse inspect model.onnx --json"};
  return {s, run_inspect};
}

}  // namespace nnfuse::cli
