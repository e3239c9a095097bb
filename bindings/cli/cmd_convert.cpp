// nnfuse convert MODEL -o OUT.onnx: import (shapes inferred, --shape bindings applied), export.
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "graph/onnx_io.h"
#include "report.h"

namespace nnfuse::cli {

namespace {

int run_convert(const ParsedArgs& args) {
  const std::string path = args.positional(0);
  const std::string out = args.get("--output");
  Model m = load_model_file(path, shape_bindings(args));
  save_model(m, out);
  std::error_code ec;
  auto bytes = std::filesystem::file_size(out, ec);
  const Graph& g = m.graph;
  if (args.json()) {
    json j;
    j["model"] = path;
    j["output"] = out;
    j["bytes"] = ec ? 0 : bytes;
    j["opsets"] = opsets_json(g.opset_imports);
    j["inputs"] = values_json(g, g.inputs());
    j["outputs"] = values_json(g, g.outputs());
    j["nodes"] = g.num_nodes();
    j["initializers"] = g.initializer_names().size();
    print_json(j);
    return 0;
  }
  std::cout << "wrote " << out << " (" << human_bytes(ec ? 0.0 : double(bytes)) << ", " << g.num_nodes() << " nodes, opsets "
            << opsets_text(g.opset_imports) << ")\n";
  for (auto& n : g.inputs()) std::cout << "  input  " << n << "  " << g.type(n).str() << "\n";
  for (auto& n : g.outputs()) std::cout << "  output " << n << "  " << g.type(n).str() << "\n";
  return 0;
}

}  // namespace

Command convert_command() {
  CommandSpec s;
  s.name = "convert";
  s.summary = "import a model and export it again (shapes inferred, --shape bindings applied)";
  s.positionals = {{"MODEL", "an .onnx file"}};
  s.options = {
      {"--output", "-o", "OUT.onnx", "the file to write", false, true},
      {"--shape", "", "NAME=DIMS", "bind a model input's dims, e.g. --shape input=1,3,224,224", true},
      {"--json", "", "", "print one JSON object on stdout instead of text"},
  };
  s.description =
      "Imports MODEL into the nnfuse IR, infers shapes (binding dynamic dims given with --shape) and\n"
      "writes a standard ONNX model with the inferred value types, which onnx.checker accepts and\n"
      "ONNX Runtime can run.";
  s.examples = {"nnfuse convert bert.onnx -o bert_b1.onnx --shape input_ids=1,128 --shape attention_mask=1,128"};
  return {s, run_convert};
}

}  // namespace nnfuse::cli
