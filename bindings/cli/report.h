#pragma once
// Pieces shared by the commands: loading a model with --shape bindings, describing graphs and
// tensors as JSON, graph statistics (op histograms, FLOPs) and human-readable number formatting.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "graph/graph.h"

namespace nnfuse::cli {

using nlohmann::json;

// The --shape NAME=D1,D2,... options of a command; malformed or repeated names are usage errors.
std::map<std::string, Shape> shape_bindings(const ParsedArgs& args);

// Loads a model file (shapes inferred, bindings applied). Errors name the file.
Model load_model_file(const std::string& path, const std::map<std::string, Shape>& bindings);

// {"dtype": "float32", "shape": [ "batch", 3, 224, 224 ]}; symbolic dims by name, unknown dims as
// null, unknown rank as "shape": null.
json type_json(const TensorType& t);
// [{"name", "dtype", "shape", "type"}] for the given values of a graph.
json values_json(const Graph& g, const std::vector<std::string>& names);
json tensor_info_json(const Tensor& t);  // {"shape": [...], "dtype": "..."}

// Operators (Constant nodes excluded) counted by op and by mapping type, plus FLOPs.
struct GraphStats {
  size_t nodes = 0;      // every node, Constant included
  size_t operators = 0;  // nodes that are not Constant
  size_t constants = 0;  // Constant nodes
  std::map<std::string, size_t> by_op;
  std::map<std::string, size_t> by_mapping;  // mapping_type_name -> count
  double flops = 0;
  // Operators whose output shapes are not all static (symbolic dims not bound, or not inferred):
  // their FLOPs are not in `flops`, which is then a lower bound.
  size_t flops_unknown = 0;
  // Ops the registry does not know (or not at this opset): no mapping type or FLOPs for them.
  std::map<std::string, std::string> unsupported;  // op -> reason
};
GraphStats graph_stats(const Graph& g);
json stats_json(const GraphStats& s);
// Human-readable histogram lines ("  Conv           53"), sorted by count then name.
std::string histogram_text(const std::map<std::string, size_t>& h, const std::string& indent = "  ");

std::string human_bytes(double bytes);  // "1.50 MiB"
std::string human_flops(double flops);  // "4.11 GFLOP"
std::string human_ms(double ms);
// "4.11 GFLOP (4110000000)", noting operators left out for symbolic shapes.
std::string flops_text(const GraphStats& s);        // "12.3 ms"
std::string opsets_text(const std::map<std::string, int64_t>& opsets);  // "ai.onnx 17, com.microsoft 1"
json opsets_json(const std::map<std::string, int64_t>& opsets);

// A progress bar on stderr for long steps (compiling kernels): "label [=====     ] 5/12". Returns
// an empty function when stderr is not a terminal, so pipes and CI logs stay quiet.
std::function<void(size_t done, size_t total)> terminal_progress(const std::string& label);

// Writes the command's one JSON object to stdout.
void print_json(const json& j);

// A file name for a tensor name: characters outside [A-Za-z0-9._-] become '_' (so '/' and ':' are
// safe); never empty, never starting with a dot.
std::string sanitize_file_name(const std::string& name);

}  // namespace nnfuse::cli
