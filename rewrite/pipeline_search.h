#pragma once
// Pipeline search: which passes, in which order, suit one model best (`nnfuse tune-pipeline`).
//
// As the pass-ordering literature does (random sampling of pass sequences, then iterative
// improvement of the best one), the search first evaluates the baseline order, then random
// subsets in random orders, then greedy neighbourhood moves around the best so far: drop a pass,
// swap two adjacent passes, insert a missing pass. Each evaluation is one trial of the budget.
//
// The search lives in rewrite/ and knows nothing of fusion or code generation: the caller gives
// an evaluator that runs a candidate pipeline on a fresh copy of the model and measures it
// (kernel count and estimated cost from the fusion plan, or measured latency). That keeps the
// folder rule (rewrite never includes fusion) and lets Python and tests plug in their own.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rewrite/pass.h"

namespace nnfuse {

// What one candidate pipeline gave. Smaller is better, compared in this order: kernels, cost,
// number of passes (a deterministic proxy for optimizer time), then optimizer ms.
struct TrialResult {
  bool ok = false;          // false: a pass failed or the result did not validate (never chosen)
  std::string error;
  size_t kernels = 0;
  double cost = 0;          // estimated (or measured) run time of the result, any unit
  double ms = 0;            // optimizer time (sum of pass times)
};

// Evaluates the pipeline whose searched passes are `passes` (the fixed tail is appended by the
// evaluator's caller: see SearchOptions::fixed_tail). Must not throw for a failing pipeline:
// return ok=false with the reason (the search also catches exceptions and records them).
using PipelineEvaluator = std::function<TrialResult(const std::vector<std::string>& passes)>;

struct Trial {
  int index = 0;
  std::string phase;  // "baseline", "random", "drop", "swap", "insert"
  std::vector<std::string> passes;  // searched passes, in order (fixed tail not included)
  TrialResult result;
  bool improved = false;  // became the best so far
};

struct SearchOptions {
  // Passes the search may pick from, in the baseline order (e.g. `full` without fusion-plan).
  std::vector<std::string> candidates;
  // Passes every candidate pipeline ends with, in order (e.g. fusion-plan). Not searched.
  std::vector<std::string> fixed_tail = {"fusion-plan"};
  int budget = 30;         // trials, the baseline included
  uint64_t seed = 0;
  double random_share = 0.3;  // share of the budget spent on random pipelines before greedy moves
  // Called after each trial (progress display); `total` is the budget.
  std::function<void(const Trial& t, int total, const Trial& best)> on_trial;
  // Whether optimizer ms may break ties (it is noisy; off makes the search a pure function of the
  // seed and the evaluator's deterministic fields).
  bool time_tiebreak = true;
};

struct SearchResult {
  std::vector<Trial> trials;
  int best = -1;  // index into trials
  Pipeline best_pipeline;  // searched passes + fixed tail
  const Trial& best_trial() const { return trials.at(size_t(best)); }
};

// True when a is strictly better than b (see TrialResult for the order).
bool trial_better(const Trial& a, const Trial& b, bool time_tiebreak = true);

// Runs the search. Throws Invalid when there are no candidates or the budget is below 1.
SearchResult search_pipeline(const PipelineEvaluator& eval, const SearchOptions& opt);

// Pipeline file text (parse_pipeline reads it back).
std::string pipeline_to_text(const Pipeline& p, const std::vector<std::string>& comments = {});

}  // namespace nnfuse
