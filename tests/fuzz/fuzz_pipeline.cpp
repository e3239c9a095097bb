// The pipeline-file parser and the pass manager: what parses runs on a small residual model, so
// fuzzed pass arguments reach each pass's argument check and the pass itself.
#include "api/optimize.h"
#include "fuzz_common.h"
#include "graph/builder.h"

namespace {

nnfuse::Model small_model() {
  using nnfuse::GraphBuilder;
  namespace A = nnfuse::A;
  GraphBuilder gb("fuzz_pipeline");
  auto x = gb.input("x", nnfuse::DType::Float32, {1, 4, 6, 6});
  auto c = gb.op("Conv", {x, gb.weight("w", {4, 4, 3, 3}, 0.3f), gb.weight("b", {4})},
                 GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  auto bn = gb.op("BatchNormalization", {c, gb.uniform("s", nnfuse::Shape{4}, 0.5f, 1.5f), gb.weight("bb", {4}),
                                         gb.weight("m", {4}), gb.uniform("v", nnfuse::Shape{4}, 0.5f, 1.5f)});
  auto r = gb.op("Relu", {gb.op("Add", {bn, x})});
  auto t = gb.op("Transpose", {gb.op("Mul", {r, gb.scalar("two", 2.f)})}, GraphBuilder::attrs({{"perm", A::is({0, 2, 3, 1})}}));
  gb.output(gb.op("Transpose", {t}, GraphBuilder::attrs({{"perm", A::is({0, 3, 1, 2})}})));
  return gb.finish();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  nnfuse::fuzz::set_fuzz_limits();
  nnfuse::register_all_passes();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 8192) return 0;
  static const nnfuse::Model base = small_model();
  try {
    nnfuse::Pipeline p = nnfuse::parse_pipeline(nnfuse::fuzz::as_string(data, size), "fuzz.pipeline");
    if (p.steps.size() > 32) return 0;
    nnfuse::Model m = base;
    nnfuse::PassContext ctx;
    ctx.model = &m;
    ctx.verify = true;  // every pass must leave a valid graph
    nnfuse::PassManager().run(p, ctx);
  } catch (const nnfuse::Error&) {
  }
  return 0;
}
