#pragma once
// Shared by the device tests (PoCL, CUDA emulation, a CUDA GPU): outputs against the reference.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "fusion/planner.h"
#include "fusion/target.h"
#include "graph/interpreter.h"

#include <vector>

namespace nnfuse::device_test {

inline const std::vector<std::string> kTinyZoo = {"resnet_tiny", "mobilenet_tiny", "efficientnet_tiny", "ssd_tiny",
                                                  "bert_tiny",   "gpt2_tiny",      "vit_tiny",          "lstm_tiny"};

inline void check_close(const TensorMap& got, const TensorMap& want, const std::string& what, double rtol = 1e-4, double atol = 1e-4) {
  for (auto& [name, w] : want) {
    INFO(what << " output " << name);
    REQUIRE(got.count(name));
    const Tensor& g = got.at(name);
    REQUIRE(g.shape() == w.shape());
    REQUIRE(g.dtype() == w.dtype());
    if (w.dtype() != DType::Float32) {
      CHECK(g.to_int_vector() == w.to_int_vector());
      continue;
    }
    const float* a = g.data<float>();
    const float* b = w.data<float>();
    int64_t bad = 0;
    for (int64_t i = 0; i < w.numel(); ++i) bad += !(std::fabs(a[i] - b[i]) <= atol + rtol * std::fabs(b[i]));
    CHECK(bad == 0);
  }
}

// Reduced-precision results (fp16 tensor cores): every output's largest error within `tol` of its
// largest magnitude (fp16 operands carry a relative error of 2^-11 each, and it compounds through
// layers; a wrong tile or fragment layout is off by the magnitude itself).
inline void check_close_scaled(const TensorMap& got, const TensorMap& want, const std::string& what, double tol) {
  for (auto& [name, w] : want) {
    INFO(what << " output " << name);
    REQUIRE(got.count(name));
    const Tensor& g = got.at(name);
    REQUIRE(g.shape() == w.shape());
    if (w.dtype() != DType::Float32) continue;  // indices (argmax, NMS) may flip between near ties
    const float* a = g.data<float>();
    const float* b = w.data<float>();
    double err = 0, mag = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      err = std::max(err, double(std::fabs(a[i] - b[i])));
      mag = std::max(mag, double(std::fabs(b[i])));
    }
    INFO("largest error " << err << ", largest magnitude " << mag);
    CHECK(err <= tol * std::max(mag, 1e-3));
  }
}

// The fusion plan for a target, by the cost models alone (no timing in tests).
inline FusionPlan plan_for(const Graph& g, const std::string& target) {
  PlanOptions po;
  po.profile = false;
  return plan_fusion(g, target_by_name(target), po);
}

// Sets an environment variable for a scope; restores it (or its absence) on the way out, also
// when a REQUIRE throws.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

}  // namespace nnfuse::device_test
