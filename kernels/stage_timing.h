#pragma once
// Per-stage timings for `--profile`: the median over several timed runs, so that one cold or
// disturbed run does not decide a row (the first run after a compile also pays page faults on
// fresh arenas).
#include <algorithm>
#include <functional>
#include <vector>

namespace nnfuse {

// `timed_run(ms)` runs the model once and fills ms[i] with stage i's time.
inline std::vector<double> median_stage_ms(int runs, const std::function<void(std::vector<double>*)>& timed_run) {
  runs = std::max(runs, 1);
  std::vector<std::vector<double>> all;
  for (int r = 0; r < runs; ++r) {
    std::vector<double> ms;
    timed_run(&ms);
    all.push_back(std::move(ms));
  }
  std::vector<double> med(all[0].size(), 0.0);
  std::vector<double> col(static_cast<size_t>(runs));
  for (size_t i = 0; i < med.size(); ++i) {
    for (int r = 0; r < runs; ++r) col[size_t(r)] = i < all[size_t(r)].size() ? all[size_t(r)][i] : 0.0;
    std::sort(col.begin(), col.end());
    med[i] = runs % 2 ? col[size_t(runs / 2)] : (col[size_t(runs / 2 - 1)] + col[size_t(runs / 2)]) / 2;
  }
  return med;
}

}  // namespace nnfuse
