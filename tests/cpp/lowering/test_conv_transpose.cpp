// ConvTranspose as a generated anchor (lowering/lower_conv_transpose.cpp,
// kernels/microkernels/conv_transpose.h) against the reference interpreter: odd sizes, strides,
// pads, output_padding, dilations and groups, with a bias and a fused epilogue; and the forms
// left to the reference kernel (auto_pad, output_shape) fall back with the reason.
#include <catch2/catch.hpp>

#include "fusion/planner.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"
#include "lowering_test_util.h"

using namespace nnfuse;
using namespace nnfuse::testing;

namespace {

CpuCompileOptions opts() { return test_compile_options("convt"); }

struct ConvTCase {
  int64_t N, C, H, W, K, KH, KW, SH, SW, group, DH, DW;
  std::vector<int64_t> pads, out_pad;
};

}  // namespace

TEST_CASE("codegen: ConvTranspose over odd sizes, strides, pads, output_padding, dilations, groups", "[codegen][conv_transpose]") {
  const std::vector<ConvTCase> cases = {
      {1, 3, 7, 5, 4, 2, 2, 2, 2, 1, 1, 1, {0, 0, 0, 0}, {0, 0}},   // U-Net 2x upsampling
      {2, 4, 5, 7, 6, 3, 3, 2, 2, 2, 1, 1, {1, 1, 1, 1}, {1, 1}},   // FCN: k3 s2 p1 op1, 2 groups
      {1, 5, 1, 17, 3, 1, 3, 1, 3, 1, 1, 1, {0, 2, 0, 1}, {0, 2}},  // 1-row input, asymmetric pads
      {1, 2, 4, 3, 2, 3, 2, 1, 1, 1, 2, 3, {0, 0, 2, 1}, {0, 0}},   // stride 1, dilated
      {1, 6, 3, 3, 6, 4, 4, 3, 2, 6, 1, 1, {1, 2, 0, 1}, {2, 1}},   // depthwise-style groups
  };
  for (const auto& c : cases) {
    INFO("N" << c.N << " C" << c.C << " H" << c.H << " W" << c.W << " K" << c.K << " k" << c.KH << "x" << c.KW << " s" << c.SH << "x" << c.SW
              << " g" << c.group << " d" << c.DH << "x" << c.DW);
    GraphBuilder gb("convt");
    auto x = gb.input("x", DType::Float32, {c.N, c.C, c.H, c.W});
    auto y = gb.op("ConvTranspose", {x, gb.weight("w", {c.C, c.K / c.group, c.KH, c.KW}, 0.3f), gb.weight("b", {c.K}, 0.3f)},
                   GraphBuilder::attrs({{"kernel_shape", A::is({c.KH, c.KW})},
                                        {"strides", A::is({c.SH, c.SW})},
                                        {"pads", A::is(c.pads)},
                                        {"output_padding", A::is(c.out_pad)},
                                        {"dilations", A::is({c.DH, c.DW})},
                                        {"group", A::i(c.group)}}));
    gb.output(gb.op("Relu", {gb.op("Sub", {y, gb.scalar("t", 0.1f)})}));
    Model m = gb.finish();
    std::vector<std::string> all;
    for (NodeId id : m.graph.topo_order())
      if (m.graph.node(id).op_type != "Constant") all.push_back(m.graph.node(id).outputs[0]);
    for (bool fused : {false, true}) {
      INFO((fused ? "epilogue fused" : "one block per op"));
      FusionPlan plan = fused ? grouped_plan(m.graph, {all}) : singleton_plan(m.graph);
      auto cm = CpuModel::build(m.graph, &plan, opts());
      CHECK(cm->module().fallback_blocks == 0);
      TensorMap feeds = random_feeds(m.graph, 11);
      check_close(cm->run(feeds), run_reference(m.graph, feeds));
    }
  }
}

TEST_CASE("ConvTranspose with auto_pad or output_shape falls back with the reason", "[codegen][conv_transpose]") {
  GraphBuilder gb("convt_fallback");
  auto x = gb.input("x", DType::Float32, {1, 2, 3, 4});
  auto a = gb.op("ConvTranspose", {x, gb.weight("w1", {2, 3, 3, 3})},
                 GraphBuilder::attrs({{"strides", A::is({2, 2})}, {"auto_pad", A::s("SAME_UPPER")}}));
  auto b = gb.op("ConvTranspose", {x, gb.weight("w2", {2, 3, 3, 3})},
                 GraphBuilder::attrs({{"strides", A::is({2, 2})}, {"output_shape", A::is({7, 10})}}));
  gb.output(a);
  gb.output(b);
  Model m = gb.finish();
  auto plan = singleton_plan(m.graph);
  auto cm = CpuModel::build(m.graph, &plan, opts());
  std::string reasons;
  for (auto& s : cm->module().stages)
    if (s.kind == StageKind::Fallback) reasons += s.fallback_reason + "\n";
  INFO(reasons);
  CHECK(cm->module().fallback_blocks == 2);
  CHECK(reasons.find("auto_pad SAME_UPPER") != std::string::npos);
  CHECK(reasons.find("output_shape attribute") != std::string::npos);
  TensorMap feeds = random_feeds(m.graph, 12);
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}
