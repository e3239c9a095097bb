// Data-movement, selection and conversion lowerings (lowering/lower_data_movement.cpp): Gather,
// Slice, Concat, Tile, Where, comparisons, Cast between float and integers, Softmax over any
// axis. Index-map units run without a compiler; each "[codegen]" case builds one model with many
// such members, compiles it for the host and compares with the reference interpreter.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "fusion/planner.h"
#include "graph/builder.h"
#include "graph/error.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"
#include "kernels/emit_cpp.h"
#include "lowering_test_util.h"

using namespace nnfuse;
using namespace nnfuse::testing;
namespace fs = std::filesystem;

namespace {

CpuCompileOptions opts() { return test_compile_options("dm"); }

const Stage* stage_of_block(const KernelModule& km, int block, StageKind kind) {
  for (auto& s : km.stages)
    if (s.block == block && s.kind == kind) return &s;
  return nullptr;
}

}  // namespace

TEST_CASE("strided offset maps: offsets and affine access with a base", "[lowering][data_movement]") {
  // Slice x[:, 16:0:-3] of a [7, 17] buffer: element (r, c) reads (r, 16 - 3c).
  IndexMap m;
  m.domain = {7, 6};
  m.steps = {offset_step({7, 6}, {7, 17}, {0, 16}, {1, -3})};
  CHECK(m.offset({0, 0}) == 16);
  CHECK(m.offset({2, 5}) == 2 * 17 + 1);
  Access a = classify_access(m, 7, 6);
  REQUIRE(a.affine);
  CHECK(a.base == 16);
  CHECK(a.row_stride == 17);
  CHECK(a.col_stride == -3);
  // A window [1, 3..] of a [1, 8, 5] buffer (a Concat part) viewed as 3 rows x 5: contiguous.
  IndexMap w;
  w.domain = {1, 3, 5};
  w.steps = {offset_step({1, 3, 5}, {1, 8, 5}, {0, 3, 0})};
  Access aw = classify_access(w, 3, 5);
  REQUIRE(aw.affine);
  CHECK(aw.base == 15);
  CHECK(aw.row_stride == 5);
  CHECK(aw.col_stride == 1);
  // A Gather step has no static offsets.
  IndexStep gs;
  gs.kind = IndexStep::Gather;
  gs.from = {3, 5};
  gs.to = {10, 5};
  gs.q = 1;
  gs.index_buffer = 0;
  IndexMap gm;
  gm.domain = {3, 5};
  gm.steps = {gs};
  CHECK_FALSE(classify_access(gm, 3, 5).affine);
  CHECK(gm.index_buffers() == std::vector<int>{0});
  CHECK_THROWS_AS(gm.offset({0, 0}), Error);
}

TEST_CASE("Concat in an elementwise block stores each input into its window", "[lowering][data_movement]") {
  GraphBuilder gb("concat_ew");
  auto a = gb.input("a", DType::Float32, {2, 3});
  auto b = gb.input("b", DType::Float32, {2, 5});
  auto c = gb.op("Concat", {gb.op("Relu", {a}), gb.op("Sigmoid", {b})}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
  gb.output(gb.op("Tanh", {c}));
  Model m = gb.finish();
  std::vector<std::string> all;
  for (NodeId id : m.graph.topo_order()) all.push_back(m.graph.node(id).outputs[0]);
  KernelModule km = lower_module(m.graph, grouped_plan(m.graph, {all}));
  CHECK(km.fallback_blocks == 0);
  // Two part stages (Relu and Sigmoid computed straight into the windows), then the Tanh.
  REQUIRE(km.stages.size() == 3);
  CHECK(km.stages[0].driver == Shape{2, 3});
  CHECK(km.stages[1].driver == Shape{2, 5});
  CHECK(km.stages[1].stores.at(0).access.base == 3);
  CHECK(km.stages[2].driver == Shape{2, 8});
}

TEST_CASE("codegen: Gather (embedding rows, any axis, negative and constant indices)", "[codegen][data_movement]") {
  GraphBuilder gb("gather");
  auto ids = gb.input("ids", DType::Int64, {7});
  auto x = gb.input("x", DType::Float32, {7, 17, 3});
  auto table = gb.weight("table", {17, 129}, 1.0f);
  auto rows = gb.op("Gather", {table, ids}, GraphBuilder::attrs({{"axis", A::i(0)}}));  // [7, 129]
  auto emb = gb.op("Relu", {rows});
  // Constant 2-D int32 indices along axis 1 (negative entries count from the end): [7, 2, 2, 3].
  auto idx2 = gb.constant("idx2", Tensor::from_vector<int32_t>({2, 2}, {0, -1, 16, 5}));
  auto mid = gb.op("Gather", {x, idx2}, GraphBuilder::attrs({{"axis", A::i(1)}}));
  // A scalar constant index along the last axis: a fixed offset, [7, 17].
  auto last = gb.op("Gather", {x, gb.constant("two", Tensor::scalar<int64_t>(-1))}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
  gb.output(emb);
  gb.output(gb.op("Neg", {mid}));
  gb.output(gb.op("Abs", {last}));
  Model m = gb.finish();
  auto cm = CpuModel::build(m.graph, nullptr, opts());
  CHECK(cm->module().fallback_blocks == 0);
  TensorMap feeds = random_feeds(m.graph, 3);
  feeds["ids"] = Tensor::from_vector<int64_t>({7}, {0, 16, -1, -17, 5, 3, 8});
  check_close(cm->run(feeds), run_reference(m.graph, feeds));

  SECTION("an index out of range is a run-time error naming the stage, not a crash") {
    feeds["ids"] = Tensor::from_vector<int64_t>({7}, {0, 1, 2, 17, 4, 5, 6});
    try {
      cm->run(feeds);
      FAIL("expected an error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::Runtime);
      CHECK_THAT(std::string(e.what()), Catch::Contains("Gather") && Catch::Contains("out of range"));
    }
  }
}

// Gather through separable maps (emit_cpp.cpp): data indices along the rows are read once per
// row; along the columns they fill a per-call column table, still range-checked; constant
// indices are checked when the code is emitted.
TEST_CASE("codegen: Gather rows and columns split, negative indices, odd widths", "[codegen][data_movement]") {
  for (int64_t w : {1, 7, 17, 129}) {
    INFO("width " << w);
    GraphBuilder gb("gather_split" + std::to_string(w));
    auto rid = gb.input("rid", DType::Int64, {2, 3});
    auto cid = gb.input("cid", DType::Int32, {5});
    auto x = gb.input("x", DType::Float32, {4, 3, w});
    auto table = gb.weight("table", {11, w}, 1.0f);
    auto rows = gb.op("Gather", {table, rid}, GraphBuilder::attrs({{"axis", A::i(0)}}));  // [2, 3, w]: row indices
    auto cols = gb.op("Gather", {x, cid}, GraphBuilder::attrs({{"axis", A::i(-1)}}));     // [4, 3, 5]: column indices
    auto cst = gb.constant("cidx", Tensor::from_vector<int64_t>({3}, {-1, 0, -3}));
    auto fixed = gb.op("Gather", {x, cst}, GraphBuilder::attrs({{"axis", A::i(1)}}));    // [4, 3, w]: constant rows
    gb.output(gb.op("Relu", {rows}));
    gb.output(gb.op("Neg", {cols}));
    gb.output(gb.op("Abs", {fixed}));
    Model m = gb.finish();
    auto cm = CpuModel::build(m.graph, nullptr, opts());
    CHECK(cm->module().fallback_blocks == 0);
    std::string code;
    for (auto& u : emit_cpp(cm->module(), 1)) code += u.code;
    CHECK_THAT(code, Catch::Contains("nf::elementwise_split"));
    if (w > 1) CHECK_THAT(code, Catch::Contains("std::vector<int64_t> ct_"));  // the column indices' per-call table
    CHECK_THAT(code, Catch::Contains("nf::wrap_index"));                          // data indices stay checked
    TensorMap feeds = random_feeds(m.graph, 4);
    feeds["rid"] = Tensor::from_vector<int64_t>({2, 3}, {0, -1, 10, -11, 5, 3});
    const int32_t wl = int32_t(w);
    feeds["cid"] = Tensor::from_vector<int32_t>({5}, {0, -1, wl - 1, -wl, wl / 2});
    check_close(cm->run(feeds), run_reference(m.graph, feeds));
    for (const char* bad : {"rid", "cid"}) {
      INFO(bad << " out of range");
      TensorMap f = feeds;
      if (std::string(bad) == "rid") f["rid"] = Tensor::from_vector<int64_t>({2, 3}, {0, 1, 2, 11, 4, 5});
      else f["cid"] = Tensor::from_vector<int32_t>({5}, {0, 0, wl, 0, 0});
      try {
        cm->run(f);
        FAIL("expected an error");
      } catch (const Error& e) {
        CHECK(e.kind() == ErrorKind::Runtime);
        CHECK_THAT(std::string(e.what()), Catch::Contains("out of range"));
      }
    }
  }
}

TEST_CASE("codegen: Slice (steps, negative starts), Concat along each axis, Tile", "[codegen][data_movement]") {
  GraphBuilder gb("slice_concat");
  auto x = gb.input("x", DType::Float32, {1, 7, 17});
  auto y = gb.input("y", DType::Float32, {1, 7, 129});
  // x[:, 1:7:2, -1:-100:-3] -> [1, 3, 6]
  auto s1 = gb.op("Slice", {x, gb.ints("st1", {1, -1}), gb.ints("en1", {7, -100}), gb.ints("ax1", {1, 2}), gb.ints("sp1", {2, -3})});
  // y[..., -20:] with a start past the end clamped on another axis: [1, 7, 20]
  auto s2 = gb.op("Slice", {y, gb.ints("st2", {-20, 0}), gb.ints("en2", {1000, 1000}), gb.ints("ax2", {-1, 0})});
  auto e1 = gb.op("Exp", {s1});
  std::vector<std::string> outs;
  for (int64_t axis : {0, 1, -1}) {
    auto c = gb.op("Concat", {x, gb.op("Neg", {x}), x}, GraphBuilder::attrs({{"axis", A::i(axis)}}));
    outs.push_back(gb.op("Sigmoid", {c}));
  }
  auto cat_y = gb.op("Concat", {s2, y}, GraphBuilder::attrs({{"axis", A::i(2)}}));  // [1, 7, 149]
  auto tile = gb.op("Tile", {e1, gb.ints("reps", {2, 1, 3})});                       // [2, 3, 18]
  gb.output(e1);
  gb.output(cat_y);
  gb.output(tile);
  for (auto& o : outs) gb.output(o);
  Model m = gb.finish();
  std::vector<std::string> all;
  for (NodeId id : m.graph.topo_order())
    if (m.graph.node(id).op_type != "Constant") all.push_back(m.graph.node(id).outputs[0]);
  for (bool fused : {false, true}) {
    INFO((fused ? "one block" : "one block per op"));
    FusionPlan plan = fused ? grouped_plan(m.graph, {all}) : singleton_plan(m.graph);
    auto cm = CpuModel::build(m.graph, &plan, opts());
    CHECK(cm->module().fallback_blocks == 0);
    TensorMap feeds = random_feeds(m.graph, 5);
    check_close(cm->run(feeds), run_reference(m.graph, feeds));
  }
}

TEST_CASE("codegen: Cast between float, int64, int32 and bool; Where and comparisons broadcast", "[codegen][data_movement]") {
  GraphBuilder gb("cast_where");
  auto mask = gb.input("mask", DType::Int64, {1, 7});
  auto x = gb.input("x", DType::Float32, {2, 7, 17});
  auto col = gb.input("col", DType::Float32, {7, 1});
  auto to = [](DType d) { return GraphBuilder::attrs({{"to", A::i(int64_t(d))}}); };
  // An int64 mask, unsqueezed and cast to float inside the block (BERT's attention mask).
  auto mf = gb.op("Cast", {gb.op("Unsqueeze", {mask, gb.ints("ax", {2})})}, to(DType::Float32));  // [1, 7, 1]
  auto scaled = gb.op("Mul", {gb.op("Sub", {gb.scalar("one", 1.f), mf}), gb.scalar("big", -1000.f)});
  auto cond = gb.op("Greater", {x, col});                                   // [2, 7, 17] bool
  auto sel = gb.op("Where", {cond, x, scaled});                             // broadcast y
  auto both = gb.op("And", {cond, gb.op("Not", {gb.op("Equal", {x, col})})});
  auto as_f = gb.op("Cast", {both}, to(DType::Float32));
  auto big = gb.op("Mul", {x, gb.scalar("k", 37.5f)});
  auto i64 = gb.op("Cast", {big}, to(DType::Int64));                       // truncation toward zero
  auto i32 = gb.op("Cast", {big}, to(DType::Int32));
  auto back = gb.op("Cast", {gb.op("Cast", {big}, to(DType::Int64))}, to(DType::Float32));
  auto b = gb.op("Cast", {x}, to(DType::Bool));
  auto le = gb.op("LessOrEqual", {x, gb.scalar("zero", 0.f)});
  gb.output(sel);
  gb.output(as_f);
  gb.output(i64);
  gb.output(i32);
  gb.output(back);
  gb.output(b);
  gb.output(le);
  Model m = gb.finish();
  std::vector<std::string> all;
  for (NodeId id : m.graph.topo_order())
    if (m.graph.node(id).op_type != "Constant") all.push_back(m.graph.node(id).outputs[0]);
  auto plan = grouped_plan(m.graph, {all});
  auto cm = CpuModel::build(m.graph, &plan, opts());
  CHECK(cm->module().fallback_blocks == 0);
  TensorMap feeds = random_feeds(m.graph, 9);
  feeds["mask"] = Tensor::from_vector<int64_t>({1, 7}, {1, 1, 0, 1, 0, 0, 1});
  // Some exact zeros and ties for Cast to bool, Equal and LessOrEqual.
  float* xp = feeds["x"].data<float>();
  xp[0] = 0.f;
  xp[5] = -0.f;
  feeds["col"].data<float>()[0] = xp[3];
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}

TEST_CASE("codegen: Softmax over a non-last axis; Concat as a MatMul epilogue", "[codegen][data_movement]") {
  GraphBuilder gb("softmax_axis");
  auto x = gb.input("x", DType::Float32, {2, 7, 17, 3});
  auto sm1 = gb.op("Softmax", {x}, GraphBuilder::attrs({{"axis", A::i(1)}}));
  auto ep = gb.op("Mul", {sm1, gb.scalar("two", 2.f)});
  auto sm0 = gb.op("Softmax", {x}, GraphBuilder::attrs({{"axis", A::i(-3)}}));
  // A ViT-style token concat after a MatMul: [1, 7, 129] x [129, 5] -> cat(cls [1,1,5]) -> + pos.
  auto t = gb.input("t", DType::Float32, {1, 7, 129});
  auto mm = gb.op("MatMul", {t, gb.weight("w", {129, 5}, 0.2f)});
  auto cat = gb.op("Concat", {gb.weight("cls", {1, 1, 5}, 1.f), mm}, GraphBuilder::attrs({{"axis", A::i(1)}}));
  auto pos = gb.op("Add", {cat, gb.weight("pos", {1, 8, 5}, 1.f)});
  gb.output(ep);
  gb.output(sm0);
  gb.output(pos);
  Model m = gb.finish();
  FusionPlan plan = grouped_plan(m.graph, {{sm1, ep}, {mm, cat, pos}});
  auto cm = CpuModel::build(m.graph, &plan, opts());
  const KernelModule& km = cm->module();
  CHECK(km.fallback_blocks == 0);
  // The MatMul block: the anchor stores its rows into the Concat window (epilogue), and one
  // stage writes the class token's window: no materialised MatMul output, no copy of it.
  int mm_block = -1;
  for (auto& b : plan.blocks)
    if (b.anchor != kNoNode && m.graph.node(b.anchor).op_type == "MatMul") mm_block = b.id;
  int stages = 0;
  for (auto& s : km.stages) stages += s.block == mm_block;
  CHECK(stages == 2);
  const Stage* a = stage_of_block(km, mm_block, StageKind::Anchor);
  REQUIRE(a);
  REQUIRE(a->stores.size() == 1);
  CHECK(km.buffers[size_t(a->stores[0].buffer)].value == pos);
  TensorMap feeds = random_feeds(m.graph, 13);
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}
