// Small fuzzed graphs run end to end through the reference interpreter, then optimized with the
// pipeline the classifier picks (rewrite rules, folding, CSE, DCE, fusion planning) and run again:
// the outputs must agree (the oracle of every optimization) or the input must be refused with an
// Error. Graphs whose inputs are not static, or hold more than 2^16 elements, are only imported.
#include <cstdio>

#include "api/optimize.h"
#include "fuzz_common.h"
#include "graph/interpreter.h"
#include "graph/onnx_io.h"

namespace {

bool small_static_inputs(const nnfuse::Graph& g) {
  int64_t total = 0;
  for (auto& in : g.inputs()) {
    const nnfuse::TensorType& t = g.type(in);
    if (!t.is_static()) return false;
    auto n = t.numel();
    if (!n || *n > (int64_t(1) << 16)) return false;
    total += *n;
  }
  return total <= (int64_t(1) << 16);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  nnfuse::fuzz::set_fuzz_limits();
  nnfuse::register_all_passes();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nnfuse::Model m;
  try {
    m = nnfuse::load_model_bytes(nnfuse::fuzz::as_string(data, size), {}, "", "fuzz.onnx");
  } catch (const nnfuse::Error&) {
    return 0;
  }
  if (!small_static_inputs(m.graph) || m.graph.num_nodes() > 64) return 0;
  nnfuse::TensorMap feeds, want;
  try {
    feeds = nnfuse::random_feeds(m.graph, 7);
    want = nnfuse::run_reference(m.graph, feeds);
  } catch (const nnfuse::Error&) {
    return 0;  // refused at run time (a bad index, a size past the caps): also a clear error
  }
  nnfuse::OptimizeOptions o;
  o.profile = false;
  o.verify = true;
  try {
    nnfuse::optimize(m, o);
  } catch (const nnfuse::Error& e) {
    // The model ran: an optimizer that cannot handle it must leave it alone, not refuse it.
    std::fprintf(stderr, "the model runs, but optimizing it failed: %s\n", e.what());
    std::abort();
  }
  nnfuse::TensorMap got;
  try {
    got = nnfuse::run_reference(m.graph, feeds);
  } catch (const nnfuse::Error& e) {
    std::fprintf(stderr, "the model runs, but the optimized model does not: %s\n", e.what());
    std::abort();
  }
  if (std::string d = nnfuse::fuzz::first_difference(want, got, 1e-3f, 1e-3f); !d.empty()) {
    std::fprintf(stderr, "the optimized model differs from the original: %s\n", d.c_str());
    std::abort();
  }
  return 0;
}
