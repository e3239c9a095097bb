// Pad and Resize/Upsample lowered to index maps and expressions (lowering/lower_resample.cpp):
// every mode the lowering takes, over odd sizes, compiled for the host and compared with the
// reference interpreter, one block per op and fused (Pad as a Conv prologue, Resize after a Conv
// and inside elementwise chains). The forms left to the reference kernels fall back with a reason
// and still give the reference's result.
#include <catch2/catch.hpp>

#include "fusion/planner.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"
#include "kernels/emit_cpp.h"
#include "lowering_test_util.h"

using namespace nnfuse;
using namespace nnfuse::testing;

namespace {

CpuCompileOptions opts() { return test_compile_options("resample"); }

Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) { return GraphBuilder::attrs(kv); }

std::vector<std::string> non_constant_outputs(const Graph& g) {
  std::vector<std::string> all;
  for (NodeId id : g.topo_order())
    if (g.node(id).op_type != "Constant") all.push_back(g.node(id).outputs[0]);
  return all;
}

// Builds with each plan, checks no block falls back, and compares with the reference.
void check_plans(const Model& m, const std::vector<FusionPlan>& plans, uint64_t seed) {
  for (size_t i = 0; i < plans.size(); ++i) {
    INFO("plan " << i);
    auto cm = CpuModel::build(m.graph, &plans[i], opts());
    INFO(cm->module().summary().dump());
    CHECK(cm->module().fallback_blocks == 0);
    TensorMap feeds = random_feeds(m.graph, seed);
    check_close(cm->run(feeds), run_reference(m.graph, feeds));
  }
}

}  // namespace

TEST_CASE("codegen: Pad in every mode, negative pads, axes, as a Conv prologue", "[codegen][resample]") {
  GraphBuilder gb("pad_modes", 19);
  auto x = gb.input("x", DType::Float32, {1, 3, 7, 17});
  auto one = gb.input("one", DType::Float32, {2, 1, 5});
  auto pad = [&](const std::string& in, const std::string& tag, std::vector<int64_t> pads, const char* mode, float value = 0.f) {
    if (std::string(mode) == "constant") return gb.op("Pad", {in, gb.ints(tag, pads), gb.scalar(tag + "_v", value)}, attrs({{"mode", A::s(mode)}}));
    return gb.op("Pad", {in, gb.ints(tag, pads)}, attrs({{"mode", A::s(mode)}}));
  };
  // Constant 0.5 padding (asymmetric, as ZeroPad2d((1, 3, 2, 1)) writes) into a Conv with none.
  auto pc = pad(x, "pc", {0, 0, 2, 1, 0, 0, 1, 3}, "constant", 0.5f);             // [1, 3, 10, 21]
  auto conv = gb.op("Conv", {pc, gb.weight("w", {4, 3, 3, 3})}, attrs({{"kernel_shape", A::is({3, 3})}}));
  auto relu = gb.op("Relu", {conv});                                              // [1, 4, 8, 19]
  auto refl = pad(x, "pr", {0, 0, 3, 2, 0, 0, 1, 4}, "reflect");                  // [1, 3, 8, 23]
  auto edge = pad(x, "pe", {0, -1, 1, 0, 0, 0, 2, -3}, "edge");                   // [1, 2, 10, 14]: crops too
  auto wrap = pad(x, "pw", {0, 0, 1, 1, 0, 0, 2, 2}, "wrap");                     // [1, 3, 10, 20]
  auto crop = pad(x, "px", {0, 0, -2, -1, 0, 0, -1, -5}, "constant");             // [1, 3, 4, 11]: a pure crop
  auto unit = pad(one, "pu", {0, 2, 1, 0, 3, 2}, "reflect");                       // size-1 dim reflected
  auto ax = gb.op("Pad", {gb.op("Sigmoid", {x}), gb.ints("pa", {2, 3}), gb.scalar("pa_v", -1.f), gb.ints("paxes", {-1})});
  for (auto& o : {relu, refl, gb.op("Exp", {edge}), wrap, crop, unit, gb.op("Neg", {ax})}) gb.output(o);
  Model m = gb.finish();
  std::vector<std::string> rest;
  for (auto& v : non_constant_outputs(m.graph))
    if (v != pc && v != conv && v != relu) rest.push_back(v);
  check_plans(m, {singleton_plan(m.graph), grouped_plan(m.graph, {{pc, conv, relu}, rest})}, 3);
}

TEST_CASE("codegen: Pad before opset 11 (attributes)", "[codegen][resample]") {
  GraphBuilder gb("pad_opset9", 9);
  auto x = gb.input("x", DType::Float32, {2, 5, 1, 7});
  auto p = gb.op("Pad", {x}, attrs({{"pads", A::is({0, 1, 0, 2, 0, 1, 0, 1})}, {"value", A::f(-2.5f)}}));
  auto r = gb.op("Pad", {x}, attrs({{"pads", A::is({0, 0, 0, 6, 1, 0, 0, 6})}, {"mode", A::s("reflect")}}));
  gb.output(gb.op("Tanh", {p}));
  gb.output(r);
  Model m = gb.finish();
  check_plans(m, {singleton_plan(m.graph), grouped_plan(m.graph, {non_constant_outputs(m.graph)})}, 4);
}

TEST_CASE("codegen: Resize nearest and linear, every coordinate mode, up and down, odd sizes", "[codegen][resample]") {
  GraphBuilder gb("resize_modes", 13);
  auto x = gb.input("x", DType::Float32, {1, 2, 7, 5});
  auto y = gb.input("y", DType::Float32, {1, 1, 17, 1});
  auto roi = gb.constant("no_roi", Tensor(DType::Float32, {0}));
  auto no_scales = gb.constant("no_scales", Tensor(DType::Float32, {0}));
  std::vector<std::string> outs;
  int k = 0;
  auto resize = [&](const std::string& in, std::vector<int64_t> sizes, const char* mode, const char* coord, const char* nearest = "round_prefer_floor",
                    const std::string& r = "") {
    std::string tag = "s" + std::to_string(k++);
    return gb.op("Resize", {in, r.empty() ? roi : r, no_scales, gb.ints(tag, sizes)},
                 attrs({{"mode", A::s(mode)}, {"coordinate_transformation_mode", A::s(coord)}, {"nearest_mode", A::s(nearest)},
                        {"extrapolation_value", A::f(-7.f)}}));
  };
  for (const char* coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"}) {
    outs.push_back(resize(x, {1, 2, 17, 9}, "linear", coord));   // up by non-integer factors
    outs.push_back(resize(x, {1, 2, 3, 1}, "linear", coord));    // down, to a single column
    outs.push_back(resize(y, {1, 1, 7, 5}, "linear", coord));    // a size-1 dim stretched
  }
  for (const char* nearest : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}) {
    outs.push_back(resize(x, {1, 2, 14, 15}, "nearest", "half_pixel", nearest));
    outs.push_back(resize(x, {1, 2, 5, 3}, "nearest", "tf_half_pixel_for_nn", nearest));
    outs.push_back(resize(x, {2, 3, 9, 4}, "nearest", "asymmetric", nearest));  // batch and channels too
  }
  // Crop-and-resize: positions outside the roi take the extrapolation value.
  auto crop_roi = gb.constant("roi", Tensor::from_vector<float>({8}, {0, 0, -0.2f, 0.1f, 1, 1, 0.9f, 1.3f}));
  outs.push_back(resize(x, {1, 2, 6, 7}, "linear", "tf_crop_and_resize", "round_prefer_floor", crop_roi));
  outs.push_back(resize(x, {1, 2, 6, 7}, "nearest", "tf_crop_and_resize", "floor", crop_roi));
  // Scales instead of sizes, as torch writes F.interpolate(scale_factor=2).
  auto up2 = gb.op("Resize", {x, roi, gb.constant("sc", Tensor::from_vector<float>({4}, {1, 1, 2, 2}))},
                   attrs({{"mode", A::s("nearest")}, {"coordinate_transformation_mode", A::s("asymmetric")}, {"nearest_mode", A::s("floor")}}));
  outs.push_back(gb.op("Add", {up2, gb.op("Relu", {up2})}));
  for (auto& o : outs) gb.output(o);
  Model m = gb.finish();
  check_plans(m, {singleton_plan(m.graph), grouped_plan(m.graph, {non_constant_outputs(m.graph)})}, 5);
}

TEST_CASE("codegen: Resize after a Conv (FPN) and Upsample at opset 9", "[codegen][resample]") {
  for (int64_t opset : {9, 13}) {
    INFO("opset " << opset);
    GraphBuilder gb("upsample_fpn", opset);
    auto x = gb.input("x", DType::Float32, {1, 3, 5, 7});
    auto lat = gb.input("lat", DType::Float32, {1, 4, 10, 14});
    auto conv = gb.op("Conv", {x, gb.weight("w", {4, 3, 3, 3}), gb.weight("b", {4})},
                      attrs({{"kernel_shape", A::is({3, 3})}, {"pads", A::is({1, 1, 1, 1})}}));
    auto relu = gb.op("Relu", {conv});
    auto scales = gb.constant("scales", Tensor::from_vector<float>({4}, {1, 1, 2, 2}));
    std::string up, lin;
    if (opset < 10) {
      up = gb.op("Upsample", {relu, scales}, attrs({{"mode", A::s("nearest")}}));
      lin = gb.op("Upsample", {relu, scales}, attrs({{"mode", A::s("linear")}}));
    } else {
      auto roi = gb.constant("roi", Tensor(DType::Float32, {0}));
      up = gb.op("Resize", {relu, roi, scales}, attrs({{"mode", A::s("nearest")}}));
      lin = gb.op("Resize", {relu, roi, scales}, attrs({{"mode", A::s("linear")}}));
    }
    auto sum = gb.op("Add", {gb.op("Add", {up, lat}), lin});
    gb.output(sum);
    Model m = gb.finish();
    check_plans(m, {singleton_plan(m.graph), grouped_plan(m.graph, {non_constant_outputs(m.graph)})}, 6);
  }
}

TEST_CASE("codegen: Pad and Resize forms without a lowering fall back and stay correct", "[codegen][resample]") {
  GraphBuilder gb("resample_fallback", 18);
  auto x = gb.input("x", DType::Float32, {1, 2, 9, 8});
  auto pads = gb.input("pads", DType::Int64, {8});
  auto roi = gb.constant("roi", Tensor(DType::Float32, {0}));
  auto no_scales = gb.constant("no_scales", Tensor(DType::Float32, {0}));
  auto cubic = gb.op("Resize", {x, roi, no_scales, gb.ints("s1", {1, 2, 13, 11})}, attrs({{"mode", A::s("cubic")}}));
  // Antialiased linear downscaling reads more than two inputs per output.
  auto aa = gb.op("Resize", {x, roi, no_scales, gb.ints("s2", {1, 2, 4, 3})}, attrs({{"mode", A::s("linear")}, {"antialias", A::i(1)}}));
  auto dyn = gb.op("Pad", {x, pads});  // pads known only at run time: so is the output shape
  gb.output(cubic);
  gb.output(aa);
  gb.output(dyn);
  Model m = gb.finish();
  auto plan = singleton_plan(m.graph);
  auto cm = CpuModel::build(m.graph, &plan, opts());
  const KernelModule& km = cm->module();
  CHECK(km.fallback_blocks == 3);
  std::string reasons;
  for (auto& s : km.stages)
    if (s.kind == StageKind::Fallback) reasons += s.fallback_reason + "\n";
  INFO(reasons);
  CHECK(reasons.find("mode cubic") != std::string::npos);
  CHECK(reasons.find("more than two taps") != std::string::npos);
  CHECK(reasons.find("'" + dyn + "' has a data-dependent shape") != std::string::npos);
  TensorMap feeds = random_feeds(m.graph, 7);
  feeds["pads"] = Tensor::from_vector<int64_t>({8}, {0, 0, 1, 2, 0, 1, 0, 3});
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}

// Separable index maps (split_columns, emit_cpp.cpp): the row part once per row, the column part
// as c * stride or a table, constant Gather tables checked at code generation.
TEST_CASE("split_columns: row and column parts of index maps", "[lowering][resample]") {
  auto no_constants = [](int) -> const Tensor* { return nullptr; };
  Tensor tab = Tensor::from_vector<int64_t>({5}, {2, 1, 0, 1, -1});  // reflect-like, one negative
  auto constants = [&](int b) -> const Tensor* { return b == 7 ? &tab : nullptr; };
  IndexStep g;
  g.kind = IndexStep::Gather;
  g.from = {3, 5};
  g.to = {3, 4};
  g.axis = 1;
  g.q = 1;
  g.index_buffer = 7;
  IndexMap m;
  m.domain = {3, 5};
  m.steps = {g};
  SECTION("a constant table along the columns") {
    ColumnSplit cs = split_columns(m, 5, constants);
    REQUIRE(cs.separable);
    CHECK_FALSE(cs.col_dynamic);
    CHECK(cs.col == std::vector<int64_t>{0, -1, -2, -1, 1});  // offsets relative to column 0 (index 2)
    CHECK_FALSE(cs.col_affine);
  }
  SECTION("an index buffer read at run time along the columns: a per-call table") {
    ColumnSplit cs = split_columns(m, 5, no_constants);
    CHECK(cs.separable);
    CHECK(cs.col_dynamic);
  }
  SECTION("a constant table out of range is left to the run-time check") {
    tab = Tensor::from_vector<int64_t>({5}, {0, 1, 2, 3, 4});  // 4 >= 4
    ColumnSplit cs = split_columns(m, 5, constants);
    CHECK(cs.separable);
    CHECK(cs.col_dynamic);
  }
  SECTION("a data-dependent row index and affine columns (embedding rows)") {
    IndexStep e = g;
    e.from = {4, 6};
    e.to = {10, 6};
    e.axis = 0;
    IndexMap em;
    em.domain = {4, 6};
    em.steps = {e};
    ColumnSplit cs = split_columns(em, 6, no_constants);
    REQUIRE(cs.separable);
    CHECK_FALSE(cs.col_dynamic);
    CHECK(cs.col_affine);
    CHECK(cs.col_stride == 1);
  }
  SECTION("a Reshape that mixes rows and columns is not separable; a squeeze is") {
    IndexMap rm;
    rm.domain = {3, 4};
    rm.steps = {reshape_step({3, 4}, {2, 6}), g};
    rm.steps[1].from = {2, 6};
    rm.steps[1].to = {2, 4};
    CHECK_FALSE(split_columns(rm, 4, constants).separable);
    IndexMap sq;
    sq.domain = {1, 3, 5};
    sq.steps = {reshape_step({1, 3, 5}, {3, 5}), g};
    ColumnSplit cs = split_columns(sq, 5, constants);
    CHECK(cs.separable);
    CHECK(cs.col.size() == 5);
  }
  SECTION("a width that splits a dim is not separable") { CHECK_FALSE(split_columns(m, 3, constants).separable); }
}

TEST_CASE("codegen: Pad and Resize rows split from columns, odd widths, no per-element checks", "[codegen][resample]") {
  for (int64_t w : {1, 7, 17, 129}) {
    INFO("width " << w);
    GraphBuilder gb("split_w" + std::to_string(w), 19);
    auto x = gb.input("x", DType::Float32, {1, 3, 5, w});
    auto roi = gb.constant("no_roi", Tensor(DType::Float32, {0}));
    auto no_scales = gb.constant("no_scales", Tensor(DType::Float32, {0}));
    auto resize = [&](const char* tag, std::vector<int64_t> sizes, const char* mode) {
      return gb.op("Resize", {x, roi, no_scales, gb.ints(tag, sizes)},
                   attrs({{"mode", A::s(mode)}, {"coordinate_transformation_mode", A::s("half_pixel")}, {"nearest_mode", A::s("floor")}}));
    };
    const int64_t p = std::min<int64_t>(w - 1, 3);  // reflect pads at most w - 1
    gb.output(gb.op("Pad", {x, gb.ints("pr", {0, 0, 2, p, 0, 0, 1, p})}, attrs({{"mode", A::s("reflect")}})));
    gb.output(gb.op("Pad", {x, gb.ints("pe", {0, 0, 1, 4, 0, 0, 2, 5})}, attrs({{"mode", A::s("edge")}})));
    gb.output(resize("rn", {1, 3, 10, 2 * w}, "nearest"));
    gb.output(gb.op("Relu", {resize("rl", {1, 3, 9, 2 * w + 1}, "linear")}));
    Model m = gb.finish();
    check_plans(m, {singleton_plan(m.graph)}, 11);
    auto cm = CpuModel::build(m.graph, nullptr, opts());
    std::string code;
    for (auto& u : emit_cpp(cm->module(), 1)) code += u.code;
    CHECK_THAT(code, Catch::Contains("nf::elementwise_split"));
    CHECK_THAT(code, !Catch::Contains("wrap_index"));  // constant tables checked when emitted
  }
}

// columns_affine (emit_cpp.cpp's anchor epilogues): offset(r, c) == offset(r, 0) + c * stride,
// checked on the map itself, where split_columns's dependency analysis is too coarse.
TEST_CASE("columns_affine: a head transpose merged into the hidden dim keeps unit columns", "[lowering]") {
  // [1, heads 3, seq 5, d 4] -> transpose (0, 2, 1, 3) -> reshape [1, 5, 12]: attention's
  // probs x V output stored as [seq, heads * d].
  IndexMap m;
  m.domain = {1, 3, 5, 4};
  m.steps = {select_step({1, 3, 5, 4}, {1, 5, 3, 4}, {0, 2, 1, 3}), reshape_step({1, 5, 3, 4}, {1, 5, 12})};
  CHECK_FALSE(split_columns(m, 4, [](int) -> const Tensor* { return nullptr; }).separable);
  CHECK(columns_affine(m, 4, 1));   // a row (one head, one position) is 4 consecutive floats
  CHECK_FALSE(columns_affine(m, 4, 0));
  CHECK_FALSE(columns_affine(m, 20, 1));  // a row of 20 spans positions: stride 12 between them
  CHECK_FALSE(columns_affine(m, 3, 1));   // a row of 3 runs from one position into the next
}

// columns_chunked's and classify_access's exhaustive checks evaluate the map on the stack
// (index_map.cpp, LinearOffset): the table and strides they report must be IndexMap::offset's.
TEST_CASE("columns_chunked and classify_access agree with IndexMap::offset on Offset, Select and Reshape steps", "[lowering]") {
  // [7, 48] -> window at column 16 of [7, 80] read back as [7, 2, 3, 8] -> transpose (1, 0, 2, 3)
  // -> [2, 7, 24]: a Split output's heads stored apart, through every step kind.
  IndexMap m;
  m.domain = {7, 48};
  m.steps = {reshape_step({7, 48}, {7, 2, 3, 8}), select_step({7, 2, 3, 8}, {2, 7, 3, 8}, {1, 0, 2, 3}),
             reshape_step({2, 7, 3, 8}, {2, 7, 24}), offset_step({2, 7, 24}, {2, 7, 40}, {0, 0, 16})};
  auto offset_at = [&](int64_t r, int64_t c) { return m.offset({r, c}); };
  std::vector<int64_t> tab;
  REQUIRE(columns_chunked(m, 48, 8, tab));
  REQUIRE(tab.size() == 6);
  for (int64_t r = 0; r < 7; ++r)
    for (int64_t c = 0; c < 48; ++c) CHECK(offset_at(r, c) == offset_at(r, 0) + tab[size_t(c / 8)] + c % 8);
  CHECK_FALSE(columns_chunked(m, 48, 16, tab));  // runs of 16 cross a head (24 = 16 + 8)
  CHECK(columns_affine(m, 8, 1));  // a row of 8 is one head's slice of d
  CHECK_FALSE(columns_affine(m, 16, 1));
  CHECK_FALSE(classify_access(m, 42, 8).affine);  // the rows jump between heads
  // Rows of 48 (a whole [seq] position): offset(r, 0) = 16 + r * 40 ([2, 7, 40] stores row r at
  // r * 40 of head 0, past the window's 16); rows of 8 jump between heads, so not affine.
  int64_t base = -1, rs = -1;
  REQUIRE(rows_affine(m, 48, base, rs));
  CHECK(base == 16);
  CHECK(rs == 40);
  for (int64_t r = 0; r < 7; ++r) CHECK(offset_at(r, 0) == base + r * rs);
  CHECK_FALSE(rows_affine(m, 8, base, rs));
  // A Reshape then a window: affine only by the exhaustive check, base and strides as offset() has them.
  IndexMap w;
  w.domain = {6, 8};
  w.steps = {reshape_step({6, 8}, {48}), offset_step({48}, {64}, {16})};
  const Access a = classify_access(w, 6, 8);
  CHECK(a.affine);
  CHECK(a.base == w.offset({0, 0}));
  CHECK(a.row_stride == w.offset({1, 0}) - w.offset({0, 0}));
  CHECK(a.col_stride == w.offset({0, 1}) - w.offset({0, 0}));
}
