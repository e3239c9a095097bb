#include "rewrite/pipeline_search.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "graph/error.h"

namespace nnfuse {

namespace {

// Costs within this relative distance are equal: sums of doubles differ in the last bits when the
// same blocks come out in another order.
bool cost_less(double a, double b) { return a < b - 1e-9 * std::max(std::abs(a), std::abs(b)); }

// Uniform integer in [0, n) from the engine alone (std::uniform_int_distribution differs between
// standard libraries; the search must be the same sequence for a seed everywhere).
size_t pick(std::mt19937_64& rng, size_t n) { return n <= 1 ? 0 : size_t(rng() % n); }

template <class T>
void shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[pick(rng, i)]);
}

std::string key_of(const std::vector<std::string>& passes) {
  std::string k;
  for (auto& p : passes) k += p + '\n';
  return k;
}

}  // namespace

bool trial_better(const Trial& a, const Trial& b, bool time_tiebreak) {
  if (a.result.ok != b.result.ok) return a.result.ok;
  if (!a.result.ok) return false;
  if (a.result.kernels != b.result.kernels) return a.result.kernels < b.result.kernels;
  if (cost_less(a.result.cost, b.result.cost)) return true;
  if (cost_less(b.result.cost, a.result.cost)) return false;
  if (a.passes.size() != b.passes.size()) return a.passes.size() < b.passes.size();
  return time_tiebreak && a.result.ms < b.result.ms;
}

SearchResult search_pipeline(const PipelineEvaluator& eval, const SearchOptions& opt) {
  if (opt.candidates.empty()) fail(ErrorKind::Invalid, "pipeline search: no candidate passes to search over");
  if (opt.budget < 1) fail(ErrorKind::Invalid, "pipeline search: the budget must be at least 1 trial, got " + std::to_string(opt.budget));
  std::set<std::string> unique(opt.candidates.begin(), opt.candidates.end());
  if (unique.size() != opt.candidates.size()) fail(ErrorKind::Invalid, "pipeline search: a candidate pass is listed twice");

  SearchResult res;
  std::mt19937_64 rng(opt.seed);
  std::set<std::string> seen;  // pass lists tried (a repeated candidate costs no trial)

  // Evaluates a candidate unless tried already; returns false when the budget is spent.
  auto attempt = [&](const std::vector<std::string>& passes, const std::string& phase) -> bool {
    if (int(res.trials.size()) >= opt.budget) return false;
    const std::string key = key_of(passes);
    if (seen.count(key)) return true;
    Trial t;
    t.index = int(res.trials.size());
    t.phase = phase;
    t.passes = passes;
    try {
      t.result = eval(passes);
    } catch (const std::exception& e) {
      t.result = TrialResult{};
      t.result.error = e.what();
    }
    if (!t.result.ok && t.result.error.empty()) t.result.error = "failed";
    seen.insert(key);
    if (res.best < 0 ? t.result.ok : trial_better(t, res.trials[size_t(res.best)], opt.time_tiebreak)) {
      t.improved = true;
      res.best = t.index;
    }
    res.trials.push_back(t);
    if (opt.on_trial) opt.on_trial(res.trials.back(), opt.budget, res.best >= 0 ? res.trials[size_t(res.best)] : res.trials.back());
    return true;
  };

  auto random_pipeline = [&]() {
    std::vector<std::string> v;
    for (auto& c : opt.candidates)
      if (rng() & 1) v.push_back(c);
    shuffle(v, rng);
    return v;
  };

  // 1. The baseline: every candidate in the given order.
  attempt(opt.candidates, "baseline");

  // 2. Random subsets in random orders. A few draws may repeat; bound the attempts.
  int random_trials = std::max(0, int(std::lround(opt.budget * opt.random_share)));
  for (int tries = 0; int(res.trials.size()) < 1 + random_trials && tries < 20 * (random_trials + 1); ++tries)
    if (!attempt(random_pipeline(), "random")) break;

  // 3. Greedy improvement (first improvement): the neighbourhood of the best pipeline in a seeded
  // order; on an improvement start again from the new best. A local optimum whose whole
  // neighbourhood was tried restarts from a random pipeline while budget remains.
  auto neighbours = [&](const std::vector<std::string>& cur) {
    std::vector<std::pair<std::string, std::vector<std::string>>> n;
    for (size_t i = 0; i < cur.size(); ++i) {
      auto v = cur;
      v.erase(v.begin() + long(i));
      n.push_back({"drop", v});
    }
    for (size_t i = 0; i + 1 < cur.size(); ++i) {
      auto v = cur;
      std::swap(v[i], v[i + 1]);
      n.push_back({"swap", v});
    }
    std::set<std::string> present(cur.begin(), cur.end());
    for (auto& c : opt.candidates) {
      if (present.count(c)) continue;
      for (size_t pos = 0; pos <= cur.size(); ++pos) {
        auto v = cur;
        v.insert(v.begin() + long(pos), c);
        n.push_back({"insert", v});
      }
    }
    // Seeded order, but drops first: removing passes is the move that saves optimizer time.
    std::vector<size_t> idx(n.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    shuffle(idx, rng);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return (n[a].first == "drop") > (n[b].first == "drop"); });
    std::vector<std::pair<std::string, std::vector<std::string>>> out;
    for (size_t i : idx) out.push_back(n[i]);
    return out;
  };

  int restarts = 0;
  std::vector<std::string> centre = res.best >= 0 ? res.trials[size_t(res.best)].passes : opt.candidates;
  while (int(res.trials.size()) < opt.budget && restarts < 8) {
    int best_before = res.best;
    bool spent = false;
    for (auto& [phase, v] : neighbours(centre)) {
      if (!attempt(v, phase)) {
        spent = true;
        break;
      }
      if (res.best != best_before) break;
    }
    if (spent) break;
    if (res.best != best_before) {
      centre = res.trials[size_t(res.best)].passes;
      continue;
    }
    // Local optimum: every neighbour tried. Restart from a random pipeline.
    ++restarts;
    centre = random_pipeline();
    if (!attempt(centre, "random")) break;
  }

  if (res.best < 0) {
    std::string why = res.trials.empty() ? "no trials" : res.trials.front().result.error;
    fail(ErrorKind::Invalid, "pipeline search: every trial failed (first: " + why + ")");
  }
  Pipeline& p = res.best_pipeline;
  p.name = "tuned";
  for (auto& s : res.trials[size_t(res.best)].passes) p.steps.push_back({s, {}, 0});
  for (auto& s : opt.fixed_tail) p.steps.push_back({s, {}, 0});
  return res;
}

std::string pipeline_to_text(const Pipeline& p, const std::vector<std::string>& comments) {
  std::string s;
  for (auto& c : comments) s += "# " + c + "\n";
  s += "pipeline " + (p.name.empty() ? std::string("tuned") : p.name) + "\n";
  if (!p.network_class.empty()) s += "class " + p.network_class + "\n";
  if (!p.description.empty()) s += "description " + p.description + "\n";
  for (auto& st : p.steps) {
    s += "pass " + st.pass;
    std::string a = st.args.str();
    if (!a.empty()) s += " " + a;
    s += "\n";
  }
  return s;
}

}  // namespace nnfuse
