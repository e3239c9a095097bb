// Kernel IR lowering: index maps, access classification, stages per block, fallback blocks,
// static shapes, and the memory plan. No compiler involved (see test_codegen.cpp for that).
#include <catch2/catch.hpp>

#include "fusion/planner.h"
#include "graph/builder.h"
#include "graph/error.h"
#include "lowering/kernel_ir.h"

using namespace nnfuse;

namespace {

// One block holding every node, with the given anchor (or none).
FusionPlan whole_graph_block(const Graph& g, NodeId anchor = kNoNode) {
  FusionPlan p = singleton_plan(g);
  FusionBlock b;
  b.id = 0;
  b.anchor = anchor;
  b.type = anchor == kNoNode ? MappingType::OneToOne : MappingType::ManyToMany;
  std::set<std::string> produced;
  for (auto& blk : p.blocks)
    for (NodeId id : blk.members) {
      b.members.push_back(id);
      for (auto& o : g.node(id).outputs) produced.insert(o);
    }
  for (NodeId id : b.members)
    for (auto& in : g.node(id).inputs)
      if (!in.empty() && !produced.count(in) && std::find(b.inputs.begin(), b.inputs.end(), in) == b.inputs.end()) b.inputs.push_back(in);
  b.outputs = g.outputs();
  FusionPlan out;
  out.target = "host";
  out.blocks = {b};
  out.constants = p.constants;
  return out;
}

}  // namespace

TEST_CASE("index maps compose transpose and reshape", "[lowering]") {
  // A [2,3] value read through Transpose(perm 1,0) then Reshape [3,2] -> [6]: element i of the
  // [6] driver is transposed element (i/2, i%2), i.e. source (i%2, i/2) of the [2,3] buffer.
  IndexMap m;
  m.domain = {6};
  IndexStep r;
  r.kind = IndexStep::Reshape;
  r.from = {6};
  r.to = {3, 2};
  IndexStep t;
  t.kind = IndexStep::Select;
  t.from = {3, 2};
  t.to = {2, 3};
  t.src = {1, 0};
  m.steps = {r, t};
  // i = 3 -> transposed (1,1) -> source (1,1) -> offset 1*3+1 = 4
  CHECK(m.offset({3}) == 4);
  // i = 4 -> transposed (2,0) -> source (0,2) -> offset 2
  CHECK(m.offset({4}) == 2);
  CHECK(m.offset({5}) == 5);
  Access a = classify_access(m, 1, 6);
  CHECK_FALSE(a.affine);  // a transpose read in a flat loop has no constant stride
}

TEST_CASE("broadcast access strides are 0 along broadcast dims", "[lowering]") {
  // A [4,1] column broadcast over a [4,8] driver viewed as 4 rows x 8: row stride 1, col stride 0.
  IndexMap m;
  m.domain = {4, 8};
  IndexStep s;
  s.kind = IndexStep::Select;
  s.from = {4, 8};
  s.to = {4, 1};
  s.src = {0, -1};
  m.steps = {s};
  Access a = classify_access(m, 4, 8);
  REQUIRE(a.affine);
  CHECK(a.row_stride == 1);
  CHECK(a.col_stride == 0);
  // A [8] bias broadcast over the rows: row stride 0, col stride 1.
  IndexMap b;
  b.domain = {4, 8};
  s.to = {8};
  s.src = {1};
  b.steps = {s};
  Access ab = classify_access(b, 4, 8);
  REQUIRE(ab.affine);
  CHECK(ab.row_stride == 0);
  CHECK(ab.col_stride == 1);
}

TEST_CASE("elementwise block lowers to one loop with index expressions", "[lowering]") {
  GraphBuilder gb("ew");
  auto x = gb.input("x", DType::Float32, {2, 3, 4});
  auto bias = gb.weight("bias", {4});
  auto s = gb.op("Add", {x, bias});
  auto t = gb.op("Transpose", {s}, GraphBuilder::attrs({{"perm", A::is({2, 0, 1})}}));
  auto y = gb.op("Sigmoid", {t});
  gb.output(y);
  Model m = gb.finish();
  KernelModule km = lower_module(m.graph, whole_graph_block(m.graph));
  REQUIRE(km.stages.size() == 1);
  const Stage& st = km.stages[0];
  CHECK(st.kind == StageKind::Elementwise);
  CHECK(st.driver == Shape{4, 2, 3});
  REQUIRE(st.stores.size() == 1);
  int loads = 0;
  for (auto& e : st.exprs) loads += e.kind == Expr::Load;
  CHECK(loads == 2);  // x and bias; the transpose is an index map, no copy
  CHECK(km.fallback_blocks == 0);
  CHECK(km.arena_bytes == 0);  // nothing but an input and an output
}

TEST_CASE("blocks with ops that have no lowering fall back", "[lowering]") {
  GraphBuilder gb("fb");
  auto ids = gb.input("ids", DType::Int64, {3, 4});
  auto table = gb.weight("table", {10, 4});
  auto e = gb.op("GatherElements", {table, ids});
  auto y = gb.op("Relu", {e});
  gb.output(y);
  Model m = gb.finish();
  KernelModule km = lower_module(m.graph, singleton_plan(m.graph));
  REQUIRE(km.stages.size() == 2);
  CHECK(km.stages[0].kind == StageKind::Fallback);
  CHECK(km.stages[1].kind == StageKind::Elementwise);
  CHECK(km.fallback_blocks == 1);
  CHECK(km.fallback_ops == std::vector<std::string>{"GatherElements"});
}

TEST_CASE("compiled targets need static shapes", "[lowering]") {
  GraphBuilder gb("dyn");
  auto x = gb.input("x", DType::Float32, {Dim::sym("N"), 4});
  gb.output(gb.op("Relu", {x}));
  Model m = gb.finish();
  try {
    lower_module(m.graph, singleton_plan(m.graph));
    FAIL("expected a Shape error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Shape);
    CHECK_THAT(std::string(e.what()), Catch::Contains("--shape") && Catch::Contains("'x'"));
  }
}

TEST_CASE("memory plan reuses buffers and runs One-to-One stages in place", "[lowering]") {
  // x -> Relu -> a -> Sigmoid -> b -> Tanh -> c -> Neg -> y: three activations of 4 KiB.
  GraphBuilder gb("chain");
  auto x = gb.input("x", DType::Float32, {1, 1024});
  auto a = gb.op("Relu", {x});
  auto b = gb.op("Sigmoid", {a});
  auto c = gb.op("Tanh", {b});
  gb.output(gb.op("Neg", {c}));
  Model m = gb.finish();
  KernelModule km = lower_module(m.graph, singleton_plan(m.graph));
  CHECK(km.naive_bytes == 3 * 4096);
  CHECK(km.arena_bytes == 4096);  // b and c reuse a's storage in place
  CHECK(km.inplace_count == 2);
  LowerOptions no_inplace;
  no_inplace.allow_inplace = false;
  KernelModule k2 = lower_module(m.graph, singleton_plan(m.graph), no_inplace);
  CHECK(k2.arena_bytes == 2 * 4096);  // a dies when c is made: c takes a's place, b alternates
  CHECK(k2.inplace_count == 0);
}

TEST_CASE("anchor blocks fuse prologue and epilogue", "[lowering]") {
  // Relu(x) @ W + bias, reshaped and transposed: prologue stage, then the MatMul whose epilogue
  // adds the bias and scatters through the Reshape/Transpose.
  GraphBuilder gb("mm");
  auto x = gb.input("x", DType::Float32, {1, 8, 16});
  auto w = gb.weight("w", {16, 12});
  auto bias = gb.weight("bias", {12});
  auto r = gb.op("Relu", {x});
  auto mm = gb.op("MatMul", {r, w});
  auto add = gb.op("Add", {mm, bias});
  auto rs = gb.op("Reshape", {add, gb.ints("shape", {1, 8, 3, 4})});
  auto tr = gb.op("Transpose", {rs}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1, 3})}}));
  gb.output(tr);
  Model m = gb.finish();
  NodeId anchor = m.graph.producer(mm).value();
  KernelModule km = lower_module(m.graph, whole_graph_block(m.graph, anchor));
  REQUIRE(km.stages.size() == 2);
  CHECK(km.stages[0].kind == StageKind::Elementwise);  // the prologue (Relu) into the anchor's input
  const Stage& a = km.stages[1];
  CHECK(a.kind == StageKind::Anchor);
  CHECK(a.anchor_op == "MatMul");
  CHECK(a.iparams.at("M") == 8);
  CHECK(a.iparams.at("N") == 12);
  CHECK(a.iparams.at("K") == 16);
  REQUIRE(a.stores.size() == 1);
  CHECK(a.primary_store == -1);  // the transposed store is not the GEMM's row-major layout
  CHECK(a.anchor_output >= 0);   // so the GEMM writes a scratch tile and the epilogue scatters
  CHECK_FALSE(a.stores[0].access.affine);
}
