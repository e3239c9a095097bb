#pragma once
// The optimize driver: classify the network, pick its pipeline, run the passes (rewriting and
// fusion planning), and describe what happened in the optimize report (the contract's JSON).
// The CLI and the Python module are thin layers over these calls.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fusion/planner.h"
#include "graph/graph.h"
#include "rewrite/classifier.h"
#include "rewrite/pass.h"

namespace nnfuse {

struct OptimizeOptions {
  std::string pipeline = "auto";      // auto | none | NAME (rules/pipelines/NAME.pipeline)
  std::string pipeline_file;          // overrides `pipeline`
  std::vector<std::string> rule_files;  // user rules on top of the shipped ones
  std::string target = "host";
  bool profile = true;                // false: --no-profile
  std::string profile_cache;          // "" = default location
  bool verify = false;                // validate after every pass
};

struct OptimizeResult {
  Classification classification;
  Pipeline pipeline;
  std::vector<PassRecord> passes;
  std::optional<FusionPlan> plan;     // absent when the pipeline does no fusion planning; it refers
                                      // to the optimized model's graph (the graph after rewriting)
  nlohmann::json report;              // the optimize report
};

// Registers every built-in pass once (rules, structural passes, fusion planning).
void register_all_passes();

// Where the shipped rules/ and rules/pipelines/ live: $NNFUSE_DATA_DIR, else the installed share
// directory next to the binary, else the source tree this was built from.
std::string data_dir();

// Resolves a pipeline by name ("full", "residual_cnn", ...) or file. "none" is the empty pipeline.
Pipeline resolve_pipeline(const std::string& name_or_auto, const std::string& file, const Classification& c);

// Optimizes a model in place (m.graph becomes the rewritten graph) and returns the report.
OptimizeResult optimize(Model& m, const OptimizeOptions& opt);

// Operators (Constant nodes excluded) and total FLOPs of a graph (ops with symbolic shapes add 0).
size_t count_operators(const Graph& g);
double total_flops(const Graph& g);

}  // namespace nnfuse
