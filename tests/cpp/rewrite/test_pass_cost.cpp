// Checks for the cheaper shared passes (docs/pipelines.md, "Cost of the passes every pipeline
// keeps"): cse keys initializers by a sample of their elements, so tensors that agree on the
// sample but differ elsewhere must still stay apart; Tensor::uninitialized keeps padding zeroed.
#include <catch2/catch.hpp>

#include <cstring>

#include "graph/builder.h"
#include "rewrite/pass.h"
#include "rewrite/passes.h"

using namespace nnfuse;

namespace {

// Three [64, 64] weights: `wa`, an equal copy `wb`, and `wc`, which differs from `wa` only in one
// element that the key does not sample (it reads every 64th element and the first and last 16).
Model three_weights(float* unsampled_value) {
  GraphBuilder b("cse_sampled");
  auto x = b.input("x", DType::Float32, {2, 64});
  std::vector<float> v(64 * 64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 97) * 0.25f;
  std::vector<float> other = v;
  other[2050] += 1.0f;  // not a multiple of 64, not within the first/last 16 floats
  *unsampled_value = other[2050];
  auto wa = b.constant("wa", Tensor::from_vector<float>({64, 64}, v));
  auto wb = b.constant("wb", Tensor::from_vector<float>({64, 64}, v));
  auto wc = b.constant("wc", Tensor::from_vector<float>({64, 64}, other));
  auto sum = b.op("Add", {b.op("MatMul", {x, wa}), b.op("MatMul", {x, wb})});
  b.output(b.op("Add", {sum, b.op("MatMul", {x, wc})}));
  return b.finish();
}

}  // namespace

TEST_CASE("cse merges equal large initializers but not ones that differ outside its sampled key", "[passes][cse]") {
  register_structural_passes();
  float changed = 0;
  Model m = three_weights(&changed);
  PassContext ctx;
  ctx.model = &m;
  ctx.verify = true;
  PassManager().run(parse_pipeline("pipeline test\npass cse nodes=false\n"), ctx);
  m.graph.validate();
  REQUIRE(ctx.rules_fired["cse-initializers"] == 1);  // wb into wa; wc stays
  auto names = m.graph.initializer_names();
  REQUIRE(names.size() == 2);
  bool kept_changed = false;
  for (auto& n : names) kept_changed |= m.graph.initializer(n).data<float>()[2050] == changed;
  REQUIRE(kept_changed);
}

TEST_CASE("Tensor::uninitialized has the shape and dtype asked for and zeroed padding", "[tensor]") {
  Tensor t = Tensor::uninitialized(DType::Float32, {3, 5});  // 60 bytes in a 64-byte allocation
  REQUIRE(t.shape() == Shape{3, 5});
  REQUIRE(t.dtype() == DType::Float32);
  REQUIRE(t.nbytes() == 60);
  const unsigned char* pad = static_cast<const unsigned char*>(t.raw()) + t.nbytes();
  for (int i = 0; i < 4; ++i) REQUIRE(pad[i] == 0);
  Tensor src = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  Tensor c = src.clone();  // clone() builds on it: every element copied, buffer not shared
  REQUIRE(c.equals(src));
  REQUIRE(!c.same_data(src));
}
