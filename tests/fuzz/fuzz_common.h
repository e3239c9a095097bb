#pragma once
// Shared by the libFuzzer targets (tests/fuzz/README.md). Every target feeds its bytes to one
// entry point and accepts exactly one outcome besides success: an nnfuse::Error, the library's
// clear error naming the file, node, op, line or shape at fault. Anything else -- a crash, a
// sanitizer report, an uncaught std::exception (std::out_of_range from a map::at, a JSON type
// error, std::bad_alloc), a timeout or a blown memory limit -- is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cmath>

#include "graph/error.h"
#include "graph/interpreter.h"

namespace nnfuse::fuzz {

// Limits the library's own caps so that a fuzzed size fails with an Error long before the
// fuzzer's -rss_limit_mb (2 GiB by default) would call it an out-of-memory crash.
inline void set_fuzz_limits() {
  setenv("NNFUSE_MAX_TENSOR_BYTES", "67108864", 0);  // 64 MiB per tensor and arena
  setenv("NNFUSE_MAX_LOOP_ITERATIONS", "10000", 0);
  setenv("NNFUSE_MAX_GRAPH_NODES", "100000", 0);  // inlined function calls too
}

// The first element where `got` differs from `want` by more than atol + rtol*|want|, described
// ("output 'y'[3]: 1.5 expected, 2 given"), or "" when all agree; a missing output or another
// dtype or shape is a difference too. Values not finite on either side are not compared (an
// algebraic rewrite may turn 0*inf into 0).
inline std::string first_difference(const TensorMap& want, const TensorMap& got, float rtol, float atol) {
  for (auto& [name, w] : want) {
    auto it = got.find(name);
    if (it == got.end()) return "output '" + name + "' is missing";
    const Tensor& g = it->second;
    if (!w.is_tensor() || !g.is_tensor()) {
      // A sequence or optional (reference target only): elements compared one by one.
      if (w.is_none() || g.is_none() || w.is_sequence() != g.is_sequence() || w.is_tensor() != g.is_tensor()) {
        if (w.is_none() && g.is_none()) continue;
        return "output '" + name + "': " + w.kind_str() + " expected, " + g.kind_str() + " given";
      }
      if (w.elements().size() != g.elements().size()) return "output '" + name + "': " + w.kind_str() + " expected, " + g.kind_str() + " given";
      TensorMap we, ge;
      for (size_t k = 0; k < w.elements().size(); ++k) {
        we[name + "[" + std::to_string(k) + "]"] = w.elements()[k];
        ge[name + "[" + std::to_string(k) + "]"] = g.elements()[k];
      }
      if (std::string d = first_difference(we, ge, rtol, atol); !d.empty()) return d;
      continue;
    }
    if (g.dtype() != w.dtype() || g.shape() != w.shape())
      return "output '" + name + "': " + dtype_name(w.dtype()) + shape_str(w.shape()) + " expected, " + dtype_name(g.dtype()) +
             shape_str(g.shape()) + " given";
    if (w.dtype() == DType::String) continue;
    std::vector<float> a = w.to_float_vector(), b = g.to_float_vector();
    for (size_t k = 0; k < a.size(); ++k)
      if (std::isfinite(a[k]) && std::isfinite(b[k]) && std::fabs(a[k] - b[k]) > atol + rtol * std::fabs(a[k]))
        return "output '" + name + "'[" + std::to_string(k) + "]: " + std::to_string(a[k]) + " expected, " + std::to_string(b[k]) + " given";
  }
  return "";
}

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace nnfuse::fuzz
