#pragma once
// Shared helpers of the microkernel tests: one-op graphs run by the reference interpreter as the
// oracle, random tensors, a 2-thread par-for, closeness checks and a bias+relu epilogue.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <thread>
#include <ctime>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "kernels/microkernels/microkernels.h"

namespace mktest {

namespace mk = nnfuse::mk;
namespace A = nnfuse::A;
using nnfuse::GraphBuilder;
using nnfuse::DType;
using nnfuse::Shape;
using nnfuse::Tensor;
using nnfuse::TensorMap;
using Arch = nnfuse::mk::arch::x86_avx2;
using V = nnfuse::mk::vfloat<Arch>;

inline Tensor random_tensor(const Shape& s, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor t(DType::Float32, s);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  return t;
}

// Runs `build` (which adds nodes to a builder whose graph inputs are `inputs`) with the reference
// interpreter and returns the single output.
template <class Build>
Tensor reference(const std::vector<std::pair<std::string, Tensor>>& inputs, Build&& build, int64_t opset = 17) {
  nnfuse::GraphBuilder b("mk_oracle", opset);
  TensorMap feeds;
  std::vector<std::string> names;
  for (auto& [name, t] : inputs) {
    std::vector<nnfuse::Dim> dims(t.shape().begin(), t.shape().end());
    names.push_back(b.input(name, DType::Float32, dims));
    feeds[name] = t;
  }
  std::string out = build(b, names);
  b.output(out);
  nnfuse::Model m = b.finish();
  TensorMap res = nnfuse::run_reference(m.graph, feeds);
  return res.at(out);
}

// Splits [0, n) in two halves run on two threads (the second on a new std::thread).
struct TwoThreadFor {
  int threads() const { return 2; }  // what kernels balance their task counts for (mk::par_threads)
  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    if (n <= 0) return;
    if (n == 1) return fn(int64_t(0), int64_t(1));
    const int64_t mid = n / 2;
    std::thread t([&] { fn(mid, n); });
    fn(int64_t(0), mid);
    t.join();
  }
};

// |got - want| <= 1e-5 + 1e-4 |want| element-wise.
inline void require_close(const float* got, const Tensor& want, double rel = 1e-4, double abs_tol = 1e-5) {
  const float* w = want.data<float>();
  double worst = 0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double err = std::fabs(double(got[i]) - double(w[i])) - (abs_tol + rel * std::fabs(double(w[i])));
    if (err > worst || std::isnan(got[i]) != std::isnan(w[i])) {
      worst = std::isnan(got[i]) ? 1e30 : err;
      worst_i = i;
    }
  }
  INFO("worst element " << worst_i << " of " << nnfuse::shape_str(want.shape()) << ": got "
                        << (worst_i >= 0 ? got[worst_i] : 0.f) << " want " << (worst_i >= 0 ? w[worst_i] : 0.f));
  REQUIRE(worst_i == -1);
}

inline void require_identical(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("element " << i);
    REQUIRE(std::memcmp(&a[i], &b[i], sizeof(float)) == 0);
  }
}

// Runs the kernel serially and with two threads, checks both agree bitwise, returns the result.
template <class Run>
std::vector<float> run_serial_and_parallel(size_t n, Run&& run) {
  std::vector<float> serial(n, -7.f), parallel(n, -9.f);
  run(serial.data(), mk::SerialFor{});
  run(parallel.data(), TwoThreadFor{});
  require_identical(serial, parallel);
  return serial;
}

// CPU time of the calling thread: timings stay meaningful on a loaded, shared machine (wall
// time counts the time slices other processes take).
inline double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

inline V relu(const V& v) { return xsimd::max(v, V(0.f)); }
inline float relu(float v) { return v > 0.f ? v : 0.f; }

// ep(v, row, col) = relu(v + bias[row % channels]): a per-channel bias as Conv's epilogue.
struct RowBiasRelu {
  const float* bias;
  int64_t channels;
  V operator()(const V& v, int64_t r, int64_t) const { return relu(v + V(bias[r % channels])); }
  float operator()(float v, int64_t r, int64_t) const { return relu(v + bias[r % channels]); }
};
// ep(v, row, col) = relu(v + bias[col]): a bias along N as MatMul+Add's epilogue.
struct ColBiasRelu {
  const float* bias;
  V operator()(const V& v, int64_t, int64_t c) const { return relu(v + V::load_unaligned(bias + c)); }
  float operator()(float v, int64_t, int64_t c) const { return relu(v + bias[c]); }
};
// A prologue: relu on every input element.
struct ReluPrologue {
  V operator()(const V& v, int64_t, int64_t) const { return relu(v); }
  float operator()(float v, int64_t, int64_t) const { return relu(v); }
};

}  // namespace mktest
