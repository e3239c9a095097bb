#pragma once
// tune_pipeline(): the pipeline search of rewrite/pipeline_search.h with the evaluator that runs
// each candidate on a copy of the model, validates the result, plans fusion and measures it.
// `nnfuse tune-pipeline` and the Python module share it.
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "api/optimize.h"
#include "fusion/planner.h"
#include "fusion/target.h"
#include "rewrite/pipeline_search.h"

namespace nnfuse {

struct TuneOptions {
  int budget = 30;
  uint64_t seed = 0;
  std::string objective = "kernels";  // kernels | latency
  std::string target = "host";
  std::vector<std::string> rule_files;  // user rules for rules-user
  int latency_runs = 5;                 // objective latency: timed runs per trial (median)
  std::function<void(const Trial&, int total, const Trial& best)> on_trial;
};

struct TuneResult {
  SearchResult search;
  Pipeline best;               // the best pipeline (named "tuned", class = the model's class)
  Classification classification;
  TrialResult full;            // the `full` pipeline's trial (the baseline)
  nlohmann::json report;       // {model, objective, budget, seed, best, full, trials: [...]}
};

// Estimated run time (microseconds) of a fusion plan on a target: per block, the bytes crossing
// its boundary (inputs read, weights included, and outputs written) over the memory bandwidth,
// plus its FLOPs over the peak. Values with symbolic shapes count 0 bytes.
double estimate_plan_cost_us(const Graph& g, const FusionPlan& plan, const TargetDesc& t);

// Runs the search on a model (the model is not modified). Throws Unsupported for
// objective=latency when the target has no code generator, Invalid for an unknown objective.
TuneResult tune_pipeline(const Model& m, const TuneOptions& opt);

}  // namespace nnfuse
