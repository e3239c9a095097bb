// Layout assignment (lowering/layout.cpp): which buffers and stages run in NCHW<c>c, that layout
// changes are folded into neighbouring stages (never stages of their own), and that blocked code
// computes what the reference interpreter computes (channel counts that are not multiples of the
// block, plain inputs and outputs, residual and broadcast epilogues, pooling, a Gemm head).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "fusion/planner.h"
#include "fusion/target.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/zoo.h"
#include "kernels/cpu_model.h"
#include "lowering_test_util.h"

using namespace nnfuse;
using namespace nnfuse::testing;
namespace fs = std::filesystem;

namespace {

KernelModule lower_with(const Graph& g, const FusionPlan& p, int block) {
  LowerOptions o;
  o.layout_block = block;
  return lower_module(g, p, o);
}

std::vector<std::string> stage_names(const KernelModule& km) {
  std::vector<std::string> r;
  for (auto& s : km.stages) r.push_back(s.name + ":" + stage_kind_name(s.kind));
  return r;
}

// A blocked buffer is only touched by blocked stages; graph inputs and outputs stay plain.
void check_layout_invariants(const KernelModule& km) {
  for (auto& s : km.stages) {
    INFO("stage " << s.name);
    for (auto* list : {&s.inputs, &s.outputs})
      for (int b : *list)
        if (km.buffers[size_t(b)].layout_block > 0) CHECK(s.layout_block > 0);
  }
  for (auto& [name, b] : km.graph_inputs) CHECK(km.buffers[size_t(b)].layout_block == 0);
  for (auto& [name, b] : km.graph_outputs) CHECK(km.buffers[size_t(b)].layout_block == 0);
}

int count_convs(const KernelModule& km, bool blocked) {
  int n = 0;
  for (auto& s : km.stages) n += s.anchor_op == "Conv" && (!blocked || s.layout_block > 0);
  return n;
}

FusionPlan host_plan(const Graph& g) {
  PlanOptions po;
  po.profile = false;
  return plan_fusion(g, target_by_name("host"), po);
}

}  // namespace

TEST_CASE("layout: CNN chains stay blocked, with no reorder stages", "[layout]") {
  for (const char* name : {"resnet_tiny", "mobilenet_tiny", "efficientnet_tiny"}) {
    INFO(name);
    Model m = build_zoo_model(name, ZooOptions{});
    FusionPlan plan = host_plan(m.graph);
    KernelModule plain = lower_with(m.graph, plan, 0);
    for (int block : {16, 8, 4}) {
      INFO("block " << block);
      KernelModule km = lower_with(m.graph, plan, block);
      // Same stages as the NCHW lowering: every layout change is inside an existing stage.
      CHECK(stage_names(km) == stage_names(plain));
      check_layout_invariants(km);
      CHECK(km.layout_block == block);
      // Every convolution runs blocked; the first reads the plain model input itself.
      CHECK(count_convs(km, true) == count_convs(km, false));
      bool plain_input_conv = false;
      for (auto& s : km.stages)
        if (s.anchor_op == "Conv" && s.layout_block > 0 && s.iparams.at("XBLK") == 0) plain_input_conv = true;
      CHECK(plain_input_conv);
      // The blocked -> plain change at the head is a masked store of a blocked stage.
      bool folded_store = false;
      for (auto& s : km.stages)
        if (s.layout_block > 0)
          for (auto& st : s.stores) folded_store = folded_store || (km.buffers[size_t(st.buffer)].layout_block == 0 && st.access.masked);
      CHECK(folded_store);
      auto j = km.summary();
      CHECK(j["layout"]["block"] == block);
      CHECK(j["layout"]["blocked_stages"].get<int>() > 0);
      CHECK(j["layout"]["reorders_folded"].get<int>() >= 2);
    }
    for (auto& s : plain.stages) CHECK(s.layout_block == 0);
    for (auto& b : plain.buffers) CHECK(b.layout_block == 0);
  }
}

TEST_CASE("layout: a plain-only consumer keeps its producer's buffer plain", "[layout]") {
  // Conv -> Relu feeds both a Conv (blocked-capable) and a Transpose (Shuffle: plain only).
  GraphBuilder gb("mixed");
  auto x = gb.input("x", DType::Float32, {1, 5, 6, 7});
  auto c1 = gb.op("Conv", {x, gb.weight("w1", {12, 5, 3, 3}, 0.3f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  auto r1 = gb.op("Relu", {c1});
  auto c2 = gb.op("Conv", {r1, gb.weight("w2", {9, 12, 1, 1}, 0.3f), gb.weight("b2", {9})});
  auto t = gb.op("Transpose", {r1}, GraphBuilder::attrs({{"perm", A::is({0, 2, 3, 1})}}));
  gb.output(c2);
  gb.output(t);
  Model m = gb.finish();
  KernelModule km = lower_with(m.graph, singleton_plan(m.graph), 16);
  check_layout_invariants(km);
  CHECK(km.buffers[size_t(km.buffer_id(r1))].layout_block == 0);
  CHECK(km.buffers[size_t(km.buffer_id(c1))].layout_block == 16);
  // Nothing blocked reaches the plain consumers: the Relu stage stores plain (masked) itself.
  for (auto& s : km.stages)
    if (s.anchor_op.empty() && s.kind == StageKind::Elementwise && s.layout_block > 0)
      for (auto& st : s.stores) CHECK(st.access.masked);
}

TEST_CASE("layout: blocked kernels match the reference for odd channel counts", "[layout][codegen]") {
  // C = 3 -> 20 -> depthwise 20 (+ residual) -> max pool -> 1x1 to 7 with a per-channel scale
  // broadcast from a [1, 7, 1, 1] weight -> average pool -> global pool -> Flatten -> Gemm.
  GraphBuilder gb("odd_channels");
  auto x = gb.input("x", DType::Float32, {1, 3, 17, 15});
  auto c1 = gb.op("Conv", {x, gb.weight("w1", {20, 3, 3, 3}, 0.3f), gb.weight("b1", {20})},
                  GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}, {"strides", A::is({2, 1})}}));
  auto r1 = gb.op("Relu", {c1});
  auto dw = gb.op("Conv", {r1, gb.weight("wd", {20, 1, 3, 3}, 0.3f)},
                  GraphBuilder::attrs({{"pads", A::is({2, 2, 2, 2})}, {"group", A::i(20)}, {"dilations", A::is({2, 2})}}));
  auto res = gb.op("Add", {dw, r1});
  auto mp = gb.op("MaxPool", {res}, GraphBuilder::attrs({{"kernel_shape", A::is({3, 3})}, {"strides", A::is({2, 2})}, {"pads", A::is({1, 1, 1, 1})}}));
  auto c2 = gb.op("Conv", {mp, gb.weight("w2", {7, 20, 1, 1}, 0.3f)});
  auto sc = gb.op("Mul", {c2, gb.uniform("s", {1, 7, 1, 1}, 0.5f, 1.5f)});
  auto sg = gb.op("Sigmoid", {sc});
  auto ap = gb.op("AveragePool", {sg}, GraphBuilder::attrs({{"kernel_shape", A::is({2, 2})}, {"pads", A::is({0, 0, 1, 1})}, {"count_include_pad", A::i(1)}}));
  auto gap = gb.op("GlobalAveragePool", {ap});
  auto fl = gb.op("Flatten", {gap});
  auto fc = gb.op("Gemm", {fl, gb.weight("wf", {4, 7}, 0.3f), gb.weight("bf", {4})}, GraphBuilder::attrs({{"transB", A::i(1)}}));
  gb.output(fc);
  gb.output(mp);  // a blocked value that is also a model output: stored plain by its producer
  Model m = gb.finish();
  FusionPlan plan = host_plan(m.graph);
  TensorMap feeds = random_feeds(m.graph, 5);
  TensorMap want = run_reference(m.graph, feeds);
  fs::path cache = fs::temp_directory_path() / ("nnfuse_test_layout_" + std::to_string(::getpid()));
  // (target, forced block or -1 for the target's own); block 0 is the plain NCHW comparison.
  const int host_block = target_by_name("host").vector_bytes / 4;  // floats per vector
  for (auto [target, block, expect] : {std::tuple{"host", -1, host_block}, std::tuple{"x86-avx2", -1, 8}, std::tuple{"host", 0, 0}}) {
    INFO(target << " block " << expect);
    CpuCompileOptions o;
    o.target = target;
    o.cache_dir = cache.string();
    o.threads = 2;
    o.lower.layout_block = block;
    auto cm = CpuModel::build(m.graph, &plan, o);
    const KernelModule& km = cm->module();
    CHECK(km.layout_block == expect);
    CHECK(count_convs(km, true) == (expect ? 3 : 0));
    check_layout_invariants(km);
    check_close(cm->run(feeds), want);
  }
  std::error_code ec;
  fs::remove_all(cache, ec);
}

TEST_CASE("layout: strided 1x1 projections gather their input compactly and match the reference", "[layout][codegen]") {
  // A ResNet downsample block, batch 2, channels off whole blocks: a 1x1 stride-2 projection of
  // a blocked activation (the compact-copy path of conv_nchwc_dense: 48 outputs per gathered
  // value) added to a 3x3 stride-2 branch; a 1x1 stride-2 conv of the plain model input (gathered
  // and blocked by the same copy); and one with too few outputs to copy for (read in place).
  GraphBuilder gb("strided_projection");
  auto x = gb.input("x", DType::Float32, {2, 40, 9, 11});
  auto r = gb.op("Relu", {gb.op("Conv", {x, gb.weight("w0", {40, 40, 3, 3}, 0.1f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}))});
  auto proj = gb.op("Conv", {r, gb.weight("wp", {48, 40, 1, 1}, 0.3f), gb.weight("bp", {48})}, GraphBuilder::attrs({{"strides", A::is({2, 2})}}));
  auto c3 = gb.op("Conv", {r, gb.weight("w3", {48, 40, 3, 3}, 0.2f)}, GraphBuilder::attrs({{"strides", A::is({2, 2})}, {"pads", A::is({1, 1, 1, 1})}}));
  gb.output(gb.op("Relu", {gb.op("Add", {proj, c3})}));
  gb.output(gb.op("Conv", {x, gb.weight("wx", {64, 40, 1, 1}, 0.3f)}, GraphBuilder::attrs({{"strides", A::is({2, 3})}})));
  gb.output(gb.op("Conv", {r, gb.weight("wn", {8, 40, 1, 1}, 0.3f)}, GraphBuilder::attrs({{"strides", A::is({3, 2})}})));
  Model m = gb.finish();
  FusionPlan plan = host_plan(m.graph);
  TensorMap feeds = random_feeds(m.graph, 7);
  TensorMap want = run_reference(m.graph, feeds);
  fs::path cache = fs::temp_directory_path() / ("nnfuse_test_layout_proj_" + std::to_string(::getpid()));
  for (const char* target : {"host", "x86-avx2"}) {
    INFO(target);
    CpuCompileOptions o;
    o.target = target;
    o.cache_dir = cache.string();
    o.threads = 2;
    auto cm = CpuModel::build(m.graph, &plan, o);
    CHECK(count_convs(cm->module(), true) == 5);
    check_close(cm->run(feeds), want);
  }
  std::error_code ec;
  fs::remove_all(cache, ec);
}

TEST_CASE("layout: a channel Split on a block boundary reads the blocked buffer in place", "[layout][codegen]") {
  // Conv -> Split along channels -> Relu / Conv on each part (ResNet's merged sibling 1x1 convs;
  // CSP/C2f blocks split a conv's output the same way). Split sizes {16, 24} start the second
  // window on a block boundary for blocks 16, 8 and 4; {10, 30} does not for 16 and 8.
  for (auto sizes : {std::vector<int64_t>{16, 24}, std::vector<int64_t>{10, 30}}) {
    INFO("split " << sizes[0] << "," << sizes[1]);
    GraphBuilder gb("split_blocked");
    auto x = gb.input("x", DType::Float32, {1, 5, 9, 11});
    auto c1 = gb.op("Conv", {x, gb.weight("w1", {40, 5, 3, 3}, 0.3f), gb.weight("b1", {40})},
                    GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
    auto parts = gb.op_n("Split", {c1, gb.ints("sizes", sizes)}, 2, GraphBuilder::attrs({{"axis", A::i(1)}}));
    auto r0 = gb.op("Relu", {parts[0]});
    auto c2 = gb.op("Conv", {r0, gb.weight("w2", {7, sizes[0], 1, 1}, 0.3f)});
    auto c3 = gb.op("Conv", {parts[1], gb.weight("w3", {6, sizes[1], 3, 3}, 0.3f)},
                    GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
    gb.output(c2);
    gb.output(c3);
    Model m = gb.finish();
    FusionPlan plan = host_plan(m.graph);
    for (int block : {16, 8, 4}) {
      INFO("block " << block);
      KernelModule km = lower_with(m.graph, plan, block);
      check_layout_invariants(km);
      const bool aligned = sizes[0] % block == 0;
      // The split conv's output stays blocked exactly when the second window is whole blocks.
      const int conv_out = km.buffer_id(c1);
      REQUIRE(conv_out >= 0);
      CHECK((km.buffers[size_t(conv_out)].layout_block > 0) == aligned);
      // Every conv runs blocked either way: the consumers read a plain input when unaligned, and
      // the split conv then writes blocked scratch and stores the plain output from its epilogue.
      CHECK(count_convs(km, true) == 3);
    }
    TensorMap feeds = random_feeds(m.graph, 11);
    TensorMap want = run_reference(m.graph, feeds);
    fs::path cache = fs::temp_directory_path() / ("nnfuse_test_layout_split_" + std::to_string(::getpid()));
    for (int block : {-1, 0}) {
      CpuCompileOptions o;
      o.target = "host";
      o.cache_dir = cache.string();
      o.threads = 2;
      o.lower.layout_block = block;
      auto cm = CpuModel::build(m.graph, &plan, o);
      // Two chained convs (45 then 270 products per output) whose second sums partly cancel: the
      // kernels built by clang (the sanitizer job) round 1.07x past the default bound there.
      check_close(cm->run(feeds), want, 2e-4, 2e-5);
    }
    std::error_code ec;
    fs::remove_all(cache, ec);
  }
}

TEST_CASE("layout: 1-D and grouped convs run blocked between plain buffers and match the reference", "[layout][codegen]") {
  // A 1-D conv (lowered over [N, C, 1, L]) gets a 4-D driver and runs blocked; so do a strided
  // long-kernel 1-D conv (a spectrogram front end), a grouped 2-D conv with 4-channel groups and
  // one with 24-channel groups (whole blocks at c = 8 and 4, not at 16: NCHW there). Each sits
  // between plain buffers (a Reshape or the model output follows), so only the conv is blocked.
  GraphBuilder gb("lone_convs");
  auto wave = gb.input("wave", DType::Float32, {2, 1, 700});
  auto spec = gb.op("Conv", {wave, gb.weight("stft", {24, 1, 64}, 0.2f)}, GraphBuilder::attrs({{"strides", A::is({16})}}));
  auto c1 = gb.op("Conv", {gb.op("Relu", {spec}), gb.weight("w1", {20, 24, 5}, 0.2f), gb.weight("b1", {20})},
                  GraphBuilder::attrs({{"pads", A::is({2, 2})}}));
  gb.output(c1);
  auto x = gb.input("x", DType::Float32, {1, 48, 7, 9});
  auto g4 = gb.op("Conv", {x, gb.weight("g4", {48, 4, 3, 3}, 0.3f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}, {"group", A::i(12)}}));
  auto g24 = gb.op("Conv", {gb.op("Relu", {g4}), gb.weight("g24", {48, 24, 3, 3}, 0.3f)},
                   GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}, {"group", A::i(2)}}));
  gb.output(g24);
  // Groups of 2 channels: a block of c / 2 groups wastes c / 2 of every c FMAs, past the 4x cap
  // at c = 16 (NCHW, im2col per group there), within it at c = 8 and 4.
  auto g2 = gb.op("Conv", {x, gb.weight("g2", {48, 2, 3, 3}, 0.3f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}, {"group", A::i(24)}}));
  gb.output(g2);
  Model m = gb.finish();
  FusionPlan plan = host_plan(m.graph);
  for (int block : {16, 8, 4}) {
    INFO("block " << block);
    KernelModule km = lower_with(m.graph, plan, block);
    check_layout_invariants(km);
    int one_d = 0, grouped = 0;
    for (auto& s : km.stages) {
      if (s.anchor_op != "Conv") continue;
      const bool is_1d = s.iparams.at("H") == 1 && s.iparams.at("KH") == 1;
      const int64_t G = s.iparams.at("G");
      INFO("stage " << s.name << " G " << G);
      if (is_1d) {
        ++one_d;
        CHECK(s.layout_block == block);
        CHECK(s.driver.size() == 4);
      } else if (G == 12) {
        ++grouped;
        CHECK(s.layout_block == block);
      } else if (G == 2 || G == 24) {
        ++grouped;
        CHECK((s.layout_block > 0) == (block != 16));
      }
    }
    CHECK(one_d == 2);
    CHECK(grouped == 3);
  }
  TensorMap feeds = random_feeds(m.graph, 5);
  TensorMap want = run_reference(m.graph, feeds);
  CpuCompileOptions o = test_compile_options("layout_lone");
  auto cm = CpuModel::build(m.graph, &plan, o);
  check_close(cm->run(feeds), want, 2e-4, 2e-5);
  std::error_code ec;
  fs::remove_all(o.cache_dir, ec);
}

TEST_CASE("layout: convs to one output channel store only lane 0 into plain buffers", "[layout][codegen]") {
  // A blocked stage with one channel has c - 1 padding lanes and no buffer dim that follows the
  // lanes: a VAD's or a saliency head's last Conv (1-D and 2-D, 1x1 and 3x3), followed by a
  // Sigmoid, by a Squeeze of the channel dim, or as the model output. Each stored its last
  // padding lane's value into every element before the stores were masked.
  GraphBuilder gb("one_channel");
  auto x = gb.input("x", DType::Float32, {1, 24, 9, 7});
  auto c1 = gb.op("Conv", {x, gb.weight("w1", {1, 24, 3, 3}, 0.3f), gb.weight("b1", {1})}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  gb.output(c1);
  auto c2 = gb.op("Conv", {gb.op("Relu", {x}), gb.weight("w2", {1, 24, 1, 1}, 0.3f)});
  gb.output(gb.op("Sigmoid", {c2}));
  auto s = gb.input("s", DType::Float32, {2, 16, 5});
  auto c3 = gb.op("Conv", {s, gb.weight("w3", {1, 16, 1}, 0.3f), gb.weight("b3", {1})});
  gb.output(gb.op("Squeeze", {gb.op("Sigmoid", {c3}), gb.ints("axes", {1})}));
  Model m = gb.finish();
  FusionPlan plan = host_plan(m.graph);
  TensorMap feeds = random_feeds(m.graph, 7);
  TensorMap want = run_reference(m.graph, feeds);
  {  // the host's block; the mask does not depend on the block size
    CpuCompileOptions o = test_compile_options("layout_one_channel");
    auto cm = CpuModel::build(m.graph, &plan, o);
    CHECK(count_convs(cm->module(), true) == 3);
    check_layout_invariants(cm->module());
    check_close(cm->run(feeds), want, 2e-4, 2e-5);
    std::error_code ec;
    fs::remove_all(o.cache_dir, ec);
  }
}
