// The CPU code generator end to end: lower, emit C++, compile with the system compiler, load and
// run, against the reference interpreter. Each model covers several emitter features to keep the
// number of (slow) compiler runs small; the kernel cache lives in a per-run temp directory.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

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

CpuCompileOptions opts(int threads = 2) {
  CpuCompileOptions o;
  o.cache_dir = test_cache_dir("codegen");
  o.threads = threads;
  return o;
}

}  // namespace

TEST_CASE("codegen: elementwise broadcasting, reorganize and shuffle index expressions, fallback", "[codegen]") {
  GraphBuilder gb("ew");
  auto x = gb.input("x", DType::Float32, {2, 3, 20});
  auto col = gb.input("col", DType::Float32, {3, 1});
  auto ids = gb.input("ids", DType::Int64, {5, 6});
  auto bias = gb.weight("bias", {20});
  auto a = gb.op("Add", {x, bias});                         // row broadcast
  auto b = gb.op("Mul", {a, col});                          // column broadcast
  auto t = gb.op("Transpose", {b}, GraphBuilder::attrs({{"perm", A::is({2, 0, 1})}}));
  auto r = gb.op("Reshape", {t, gb.ints("shape", {20, 6})});
  auto s = gb.op("Tanh", {r});
  auto sg = gb.op("Sigmoid", {s});
  auto e = gb.op("Erf", {sg});
  auto table = gb.weight("table", {10, 6});
  auto gth = gb.op("GatherElements", {table, ids});         // no lowering: a fallback block
  auto c = gb.op("Clip", {gth, gb.scalar("lo", -0.02f), gb.scalar("hi", 0.02f)});
  gb.output(e);
  gb.output(c);
  Model m = gb.finish();
  FusionPlan plan = grouped_plan(m.graph, {{a, b, t, r, s, sg, e}, {gth, c}});
  auto cm = CpuModel::build(m.graph, &plan, opts());
  CHECK(cm->module().fallback_blocks == 1);
  TensorMap feeds = random_feeds(m.graph, 5);
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}

TEST_CASE("codegen: MatMul and Gemm anchors with prologue and scattering epilogue", "[codegen]") {
  GraphBuilder gb("mm");
  auto x = gb.input("x", DType::Float32, {1, 9, 20});
  auto w = gb.weight("w", {20, 24}, 0.3f);
  auto bias = gb.weight("bias", {24});
  auto rl = gb.op("Relu", {x});
  auto mm = gb.op("MatMul", {rl, w});
  auto add = gb.op("Add", {mm, bias});
  auto sg = gb.op("Sigmoid", {add});
  auto ge = gb.op("Mul", {add, sg});
  auto rs = gb.op("Reshape", {ge, gb.ints("shape", {1, 9, 2, 12})});
  auto tr = gb.op("Transpose", {rs}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1, 3})}}));  // [1,2,9,12]
  // Batched MatMul with a transposed operand: [1,2,9,12] x [1,2,12,9].
  auto tr2 = gb.op("Transpose", {tr}, GraphBuilder::attrs({{"perm", A::is({0, 1, 3, 2})}}));
  auto att = gb.op("MatMul", {tr, tr2});
  auto sm = gb.op("Softmax", {att}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
  // Gemm with transB, alpha/beta and a broadcast C.
  auto y2d = gb.op("Reshape", {sm, gb.ints("shape2", {18, 9})});
  auto gw = gb.weight("gw", {5, 9}, 0.3f);
  auto gc = gb.weight("gc", {5});
  auto gm = gb.op("Gemm", {y2d, gw, gc}, GraphBuilder::attrs({{"transB", A::i(1)}, {"alpha", A::f(0.5f)}, {"beta", A::f(2.0f)}}));
  gb.output(gb.op("Relu", {gm}));
  gb.output(tr);
  Model m = gb.finish();
  FusionPlan plan = grouped_plan(m.graph, {{rl, mm, add, sg, ge, rs, tr}, {tr2}, {att}, {sm, y2d}});
  auto cm = CpuModel::build(m.graph, &plan, opts());
  CHECK(cm->module().fallback_blocks == 0);
  TensorMap feeds = random_feeds(m.graph, 7);
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}

TEST_CASE("codegen: an epilogue storing heads apart ([seq, heads * d] as [heads, seq, d]) runs on vectors when d is a multiple of 16",
          "[codegen]") {
  // d = 32 and 16: every aligned run of 16 columns is contiguous in the output, so the epilogue
  // stores vectors through a table of run offsets; d = 12: lane by lane, as before.
  for (int64_t d : {int64_t(32), int64_t(16), int64_t(12)}) {
    INFO("head size " << d);
    GraphBuilder gb("heads");
    const int64_t heads = 3, seq = 9;
    auto x = gb.input("x", DType::Float32, {1, seq, 40});
    auto mm = gb.op("MatMul", {x, gb.weight("w", {40, heads * d}, 0.3f)});
    auto add = gb.op("Add", {mm, gb.weight("bias", {heads * d})});
    auto rl = gb.op("Relu", {add});
    auto rs = gb.op("Reshape", {rl, gb.ints("shape", {1, seq, heads, d})});
    auto tr = gb.op("Transpose", {rs}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1, 3})}}));
    gb.output(tr);
    Model m = gb.finish();
    FusionPlan plan = grouped_plan(m.graph, {{mm, add, rl, rs, tr}});
    auto cm = CpuModel::build(m.graph, &plan, opts());
    CHECK(cm->module().fallback_blocks == 0);
    std::string code;
    for (auto& u : emit_cpp(cm->module(), 1)) code += u.code;
    CHECK((code.find("static const int64_t runs_") != std::string::npos) == (d % 16 == 0));
    // The row part of the store (row r of [seq, heads * d] starts at r * d in [heads, seq, d]) is
    // a multiply, not the map's divisions.
    if (d % 16 == 0) CHECK(code.find("(int64_t(0) + r * int64_t(" + std::to_string(d) + "))") != std::string::npos);
    TensorMap feeds = random_feeds(m.graph, 3);
    check_close(cm->run(feeds), run_reference(m.graph, feeds));
  }
}

TEST_CASE("codegen: strided copies (transposes) run in column blocks and cover every element at any row count",
          "[codegen]") {
  // A transpose reads with a stride along its output rows, so it runs on scalars in column blocks
  // (gen_support.h, elementwise<false>). 16 rows of 8192: one group of rows, cut into column
  // ranges; 40 x 1000: groups of 16 rows with a ragged last group and block; 3 x 100: one task.
  GraphBuilder gb("strided");
  std::vector<std::string> outs;
  for (auto [rows, width] : {std::pair<int64_t, int64_t>{16, 8192}, {40, 1000}, {3, 100}}) {
    auto x = gb.input("x" + std::to_string(rows), DType::Float32, {width, rows});
    auto t = gb.op("Transpose", {x}, GraphBuilder::attrs({{"perm", A::is({1, 0})}}));
    gb.output(t);
    outs.push_back(t);
  }
  Model m = gb.finish();
  FusionPlan plan = grouped_plan(m.graph, {{outs[0]}, {outs[1]}, {outs[2]}});
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    auto cm = CpuModel::build(m.graph, &plan, opts(threads));
    CHECK(cm->module().fallback_blocks == 0);
    std::string code;
    for (auto& u : emit_cpp(cm->module(), 1)) code += u.code;
    CHECK(code.find("elementwise<false>") != std::string::npos);
    TensorMap feeds = random_feeds(m.graph, 11);
    auto got = cm->run(feeds);
    auto want = run_reference(m.graph, feeds);
    check_close(got, want, 0.0, 1e-30);  // a copy: exact
  }
}

TEST_CASE("codegen: a GEMM epilogue stores each output of a Split of its columns in its window, without a copy stage", "[codegen]") {
  // A combined Q/K/V projection: MatMul + bias, Split into three column windows, one stored as
  // heads apart. Windows on multiples of 16 store vectors; a window at column 20 runs lane by lane.
  for (auto sizes : {std::vector<int64_t>{32, 64, 16}, std::vector<int64_t>{20, 44, 32}}) {
    INFO("split sizes " << sizes[0] << ", " << sizes[1] << ", " << sizes[2]);
    GraphBuilder gb("split_epilogue");
    const int64_t seq = 9, n = sizes[0] + sizes[1] + sizes[2];
    auto x = gb.input("x", DType::Float32, {1, seq, 40});
    auto mm = gb.op("MatMul", {x, gb.weight("w", {40, n}, 0.3f)});
    auto add = gb.op("Add", {mm, gb.weight("bias", {n})});
    auto sp = gb.op_n("Split", {add, gb.ints("split", sizes)}, 3, GraphBuilder::attrs({{"axis", A::i(-1)}}));
    auto rl = gb.op("Relu", {sp[0]});
    auto rs = gb.op("Reshape", {sp[1], gb.ints("shape", {1, seq, 2, sizes[1] / 2})});
    auto tr = gb.op("Transpose", {rs}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1, 3})}}));
    gb.output(rl);
    gb.output(tr);
    gb.output(sp[2]);
    Model m = gb.finish();
    FusionPlan plan = grouped_plan(m.graph, {{mm, add, sp[0], rl, rs, tr}});
    auto cm = CpuModel::build(m.graph, &plan, opts());
    CHECK(cm->module().fallback_blocks == 0);
    int elementwise = 0;
    for (auto& st : cm->module().stages) elementwise += st.kind == StageKind::Elementwise;
    CHECK(elementwise == 0);  // before: the anchor output stored whole, then a stage per output
    std::string code;
    for (auto& u : emit_cpp(cm->module(), 1)) code += u.code;
    CHECK(code.find("if (c >= ") != std::string::npos);
    CHECK((code.find("nf::LaneSplit") != std::string::npos) == (sizes[0] % 16 != 0));
    TensorMap feeds = random_feeds(m.graph, 5);
    check_close(cm->run(feeds), run_reference(m.graph, feeds));
  }
  SECTION("a Split output that reads another buffer, or is concatenated, is not stored from the epilogue, and stays right") {
    GraphBuilder gb("split_epilogue_rest");
    auto x = gb.input("x", DType::Float32, {1, 7, 24});
    auto mm = gb.op("MatMul", {x, gb.weight("w", {24, 64}, 0.3f)});
    auto sp = gb.op_n("Split", {mm, gb.ints("split", {32, 32})}, 2, GraphBuilder::attrs({{"axis", A::i(2)}}));
    // rotate_half: Concat(-x2, x1); and a bias added to one half after the Split.
    auto neg = gb.op("Neg", {sp[1]});
    auto rot = gb.op("Concat", {neg, sp[0]}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
    auto biased = gb.op("Add", {sp[1], gb.weight("b2", {32})});
    gb.output(rot);
    gb.output(biased);
    Model m = gb.finish();
    for (auto group : {std::vector<std::string>{mm, sp[0], neg, rot}, std::vector<std::string>{mm, sp[0], biased}}) {
      FusionPlan plan = grouped_plan(m.graph, {group});
      auto cm = CpuModel::build(m.graph, &plan, opts());
      CHECK(cm->module().fallback_blocks == 0);
      TensorMap feeds = random_feeds(m.graph, 6);
      check_close(cm->run(feeds), run_reference(m.graph, feeds));
    }
  }
  SECTION("no window where the Split's offset merges with a Concat's, nor in a conv epilogue (blocked stores know none)") {
    // Concat(x, MatMul) then Split at the same boundary: the MatMul's part is output 1, at
    // Offset(+64) - 64 = identity, and x's part output 0: both must land in range. And a conv
    // over a 1 x 32 map split along its width (width = the driver's last dim).
    GraphBuilder gb("split_no_window");
    auto x = gb.input("x", DType::Float32, {1, 5, 64});
    auto a = gb.input("a", DType::Float32, {1, 5, 24});
    auto mm = gb.op("MatMul", {a, gb.weight("w", {24, 64}, 0.3f)});
    auto cat = gb.op("Concat", {x, mm}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
    auto sp = gb.op_n("Split", {cat, gb.ints("split", {64, 64})}, 2, GraphBuilder::attrs({{"axis", A::i(-1)}}));
    auto ci = gb.input("ci", DType::Float32, {1, 4, 1, 32});
    auto cv = gb.op("Conv", {ci, gb.weight("cw", {8, 4, 1, 3}, 0.3f)}, GraphBuilder::attrs({{"pads", A::is({0, 1, 0, 1})}}));
    auto csp = gb.op_n("Split", {cv, gb.ints("csplit", {16, 16})}, 2, GraphBuilder::attrs({{"axis", A::i(3)}}));
    gb.output(gb.op("Relu", {sp[0]}));
    gb.output(gb.op("Neg", {sp[1]}));
    gb.output(csp[0]);
    gb.output(gb.op("Relu", {csp[1]}));
    Model m = gb.finish();
    FusionPlan plan = grouped_plan(m.graph, {{mm, cat, sp[0]}, {cv, csp[0]}});
    auto cm = CpuModel::build(m.graph, &plan, opts());
    CHECK(cm->module().fallback_blocks == 0);
    int windows = 0;
    for (auto& st : cm->module().stages)
      for (auto& s : st.stores) windows += s.windowed();
    CHECK(windows == 0);
    TensorMap feeds = random_feeds(m.graph, 8);
    check_close(cm->run(feeds), run_reference(m.graph, feeds));
  }
}

TEST_CASE("codegen: Softplus is generated and stable for large inputs (Mish)", "[codegen]") {
  GraphBuilder gb("mish");
  auto x = gb.input("x", DType::Float32, {4, 8});
  auto sp = gb.op("Softplus", {x});
  auto y = gb.op("Mul", {x, gb.op("Tanh", {sp})});
  gb.output(y);
  Model m = gb.finish();
  auto cm = CpuModel::build(m.graph, nullptr, opts());
  CHECK(cm->module().fallback_blocks == 0);
  std::vector<float> v(32);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (float(i) - 16.f) * 6.f;  // -96 .. 90: exp overflows for the naive form
  TensorMap feeds{{"x", Tensor::from_vector<float>({4, 8}, v)}};
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}

TEST_CASE("codegen: Pow by 3, 4 and -1 as products, Gelu's tanh form, generated (no fallback)", "[codegen]") {
  // The tanh GELU as exporters write it (Pow(x, 3)) and as opset 20 names it (Gelu
  // approximate="tanh"); both were slow or reference-only before: a general pow per element, and
  // a Gelu whose tanh form had no lowering.
  GraphBuilder gb("pow_gelu", 20);
  auto x = gb.input("x", DType::Float32, {4, 16});
  auto cube = gb.op("Pow", {x, gb.scalar("three", 3.0f)});
  auto inner = gb.op("Mul", {gb.op("Add", {x, gb.op("Mul", {cube, gb.scalar("c", 0.044715f)})}), gb.scalar("k", 0.7978845608f)});
  auto gelu_written = gb.op("Mul", {gb.op("Mul", {x, gb.scalar("half", 0.5f)}), gb.op("Add", {gb.op("Tanh", {inner}), gb.scalar("one", 1.0f)})});
  gb.output(gelu_written);
  gb.output(gb.op("Gelu", {x}, GraphBuilder::attrs({{"approximate", A::s("tanh")}})));
  gb.output(gb.op("Add", {gb.op("Pow", {x, gb.scalar("four", 4.0f)}), gb.op("Pow", {x, gb.scalar("minus_one", -1.0f)})}));
  Model m = gb.finish();
  auto cm = CpuModel::build(m.graph, nullptr, opts(1));
  CHECK(cm->module().fallback_blocks == 0);
  std::string code;
  for (auto& u : emit_cpp(cm->module(), 1)) code += u.code;
  CHECK(code.find("op_Pow") == std::string::npos);
  CHECK(code.find("op_GeluTanh") != std::string::npos);
  // -12 .. 12 (x^4 up to 2e4; the GELUs' tails) and no zero, for 1/x.
  std::vector<float> v(64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (float(i) - 31.5f) * 0.38f;
  TensorMap feeds{{"x", Tensor::from_vector<float>({4, 16}, v)}};
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}

TEST_CASE("codegen: 32/64-bit integer comparisons are generated and exact past 2^24", "[codegen]") {
  // Silero VAD's sample-rate test (Equal(sr, 16000) on int64) had stayed on the reference
  // kernels: float holds int64 inexactly. Compared by exact 22-bit parts instead, values that
  // float would round together (2^40 and 2^40 + 1, INT64_MIN and INT64_MIN + 1) stay apart.
  GraphBuilder gb("wide_compare");
  auto a = gb.input("a", DType::Int64, {3, 8});
  auto b = gb.input("b", DType::Int64, {8});  // broadcast over a's rows
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) gb.output(gb.op(op, {a, b}));
  gb.output(gb.op("Equal", {a, gb.constant("rate", Tensor::scalar<int64_t>(16000))}));
  auto u = gb.input("u", DType::UInt64, {8});
  auto i32 = gb.input("i32", DType::Int32, {8});
  // A middle-axis broadcast: no view keeps b3's load affine, so the emitter splits it by rows.
  auto a3 = gb.input("a3", DType::Int64, {2, 3, 4});
  auto b3 = gb.input("b3", DType::Int64, {2, 1, 4});
  gb.output(gb.op("Equal", {a3, b3}));
  gb.output(gb.op("Less", {a3, b3}));
  gb.output(gb.op("Equal", {u, gb.constant("u_top", Tensor::scalar<uint64_t>((1ull << 63) + 1))}));  // past 2^53: no double
  gb.output(gb.op("Less", {u, gb.constant("u0", Tensor::from_vector<uint64_t>({8}, {0, 1, 1ull << 63, ~0ull, 5, 1ull << 44, 3, 16000}))}));
  gb.output(gb.op("GreaterOrEqual", {i32, gb.constant("i0", Tensor::from_vector<int32_t>({8}, {-1, 0, 1, INT32_MIN, INT32_MAX, 16777217, -16777217, 7}))}));
  Model m = gb.finish();
  auto cm = CpuModel::build(m.graph, nullptr, opts(1));
  CHECK(cm->module().fallback_blocks == 0);
  const int64_t big = int64_t(1) << 40, mn = std::numeric_limits<int64_t>::min(), mx = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> bv = {16000, big, -big, mn, mx, 0, (int64_t(1) << 44) + 5, -3};
  std::vector<int64_t> av = {16000, big + 1, -big, mn + 1, mx, -1, (int64_t(1) << 44) + 4, -3,   // neighbours of b
                             16001, big - 1, -big - 1, mn, mx - 1, 1, int64_t(1) << 45, -2,
                             16000, big, -big + 1, mx, mn, 0, (int64_t(1) << 44) + 5, -4};
  std::vector<int64_t> a3v(24), b3v(8);
  for (size_t i = 0; i < b3v.size(); ++i) b3v[i] = (int64_t(i % 2 ? -1 : 1) << (20 + 5 * i)) + int64_t(i);
  for (size_t i = 0; i < a3v.size(); ++i) a3v[i] = b3v[(i / 12) * 4 + i % 4] + int64_t(i % 3) - 1;  // b's value, and +-1
  TensorMap feeds{{"a3", Tensor::from_vector<int64_t>({2, 3, 4}, a3v)},
                  {"b3", Tensor::from_vector<int64_t>({2, 1, 4}, b3v)},
                  {"a", Tensor::from_vector<int64_t>({3, 8}, av)},
                  {"b", Tensor::from_vector<int64_t>({8}, bv)},
                  {"u", Tensor::from_vector<uint64_t>({8}, {1, (1ull << 63) + 1, (1ull << 63) - 1, ~0ull - 1, 5, (1ull << 44) + 1, 1ull << 63, 16000})},
                  {"i32", Tensor::from_vector<int32_t>({8}, {-2, 0, 2, INT32_MIN + 1, INT32_MAX, 16777216, -16777216, 6})}};
  const TensorMap want = run_reference(m.graph, feeds);
  const TensorMap got = cm->run(feeds);
  for (auto& [name, w] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    CHECK(got.at(name).to_float_vector() == w.to_float_vector());
  }
  // A Constant node grouped with the comparison: its buffer's parts are read.
  GraphBuilder gc("wide_compare_constant_node");
  auto x = gc.input("x", DType::Int64, {4});
  auto k = gc.op("Constant", {}, GraphBuilder::attrs({{"value", A::t(Tensor::from_vector<int64_t>({4}, {mn, big, -big, mx}))}}));
  auto eq = gc.op("Equal", {x, k}), lt = gc.op("Less", {x, k});
  gc.output(eq);
  gc.output(lt);
  Model mc = gc.finish();
  FusionPlan plan = grouped_plan(mc.graph, {{k, eq, lt}});
  auto cc = CpuModel::build(mc.graph, &plan, opts(1));
  CHECK(cc->module().fallback_blocks == 0);
  TensorMap xf{{"x", Tensor::from_vector<int64_t>({4}, {mn + 1, big, -big - 1, mx})}};
  const TensorMap wc = run_reference(mc.graph, xf), gotc = cc->run(xf);
  for (auto& [name, w] : wc) CHECK(gotc.at(name).to_float_vector() == w.to_float_vector());
}

TEST_CASE("codegen: reduction epilogues see the output as outer x inner", "[codegen]") {
  // keepdims=0 over the last axis (inner 1: the output's last dim is not the epilogue's width) with
  // a bias and a second block output; a middle axis whose inner part spans two dims.
  GraphBuilder gb("reduce_epilogue");
  auto x = gb.input("x", DType::Float32, {2, 3, 4});
  auto rs = gb.op("ReduceSum", {x, gb.ints("ax", {2})}, GraphBuilder::attrs({{"keepdims", A::i(0)}}));
  auto y = gb.op("Add", {rs, gb.weight("bias", {3}, 0.5f)});
  auto z = gb.op("Relu", {y});
  auto x2 = gb.input("x2", DType::Float32, {2, 16, 6, 9});
  auto rm = gb.op("ReduceMean", {x2}, GraphBuilder::attrs({{"axes", A::is({1})}, {"keepdims", A::i(1)}}));
  auto sc = gb.op("Mul", {rm, gb.weight("scale", {1, 1, 6, 9}, 0.5f)});
  gb.output(y);
  gb.output(z);
  gb.output(sc);
  Model m = gb.finish();
  FusionPlan plan = grouped_plan(m.graph, {{rs, y, z}, {rm, sc}});
  auto cm = CpuModel::build(m.graph, &plan, opts());
  CHECK(cm->module().fallback_blocks == 0);
  TensorMap feeds = random_feeds(m.graph, 12);
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}

TEST_CASE("codegen: Conv, depthwise Conv, BatchNorm, residual epilogue, pooling, LayerNorm, reductions", "[codegen][concurrency]") {
  GraphBuilder gb("cnn");
  auto x = gb.input("x", DType::Float32, {1, 3, 17, 15});
  auto w1 = gb.weight("w1", {8, 3, 3, 3}, 0.3f);
  auto b1 = gb.weight("b1", {8});
  auto c1 = gb.op("Conv", {x, w1, b1}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}, {"strides", A::is({2, 1})}}));
  auto sc = gb.uniform("s", {8}, 0.5f, 1.5f), bb = gb.weight("bb", {8}), mu = gb.weight("mu", {8}), var = gb.uniform("var", {8}, 0.5f, 2.f);
  auto bn = gb.op("BatchNormalization", {c1, sc, bb, mu, var});
  auto r1 = gb.op("Relu", {bn});
  auto wd = gb.weight("wd", {8, 1, 3, 3}, 0.3f);
  auto dw = gb.op("Conv", {r1, wd}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}, {"group", A::i(8)}, {"dilations", A::is({1, 1})}}));
  auto res = gb.op("Add", {dw, r1});
  auto clip = gb.op("Clip", {res, gb.scalar("z", 0.f), gb.scalar("six", 6.f)});
  auto mp = gb.op("MaxPool", {clip}, GraphBuilder::attrs({{"kernel_shape", A::is({3, 3})}, {"strides", A::is({2, 2})}, {"pads", A::is({1, 1, 1, 1})}}));
  auto gap = gb.op("GlobalAveragePool", {mp});
  auto ln_in = gb.op("Reshape", {mp, gb.ints("shape", {1, 8, -1})});
  auto ln = gb.op("LayerNormalization", {ln_in, gb.uniform("g", Shape{1}, 0.5f, 1.5f), gb.weight("beta", Shape{1})},
                  GraphBuilder::attrs({{"axis", A::i(-1)}, {"epsilon", A::f(1e-5f)}}));
  auto mean = gb.op("ReduceMean", {ln}, GraphBuilder::attrs({{"axes", A::is({-1})}, {"keepdims", A::i(1)}}));
  auto cen = gb.op("Sub", {ln, mean});
  gb.output(gap);
  gb.output(cen);
  Model m = gb.finish();
  FusionPlan plan = grouped_plan(m.graph, {{c1, bn, r1}, {dw, res, clip}, {mp}, {gap}, {ln_in, ln}, {mean, cen}});
  auto cm = CpuModel::build(m.graph, &plan, opts());
  CHECK(cm->module().fallback_blocks == 0);
  TensorMap feeds = random_feeds(m.graph, 11);
  TensorMap want = run_reference(m.graph, feeds);
  check_close(cm->run(feeds), want);

  SECTION("the same kernels run with one thread and under concurrent run() calls") {
    auto one = CpuModel::build(m.graph, &plan, opts(1));
    check_close(one->run(feeds), want);
    std::vector<TensorMap> outs(4);
    std::vector<std::thread> th;
    for (int i = 0; i < 4; ++i) th.emplace_back([&, i] { outs[size_t(i)] = cm->run(feeds); });
    for (auto& t : th) t.join();
    for (auto& o : outs) check_close(o, want);
  }
}

TEST_CASE("codegen: kernel cache hit, corrupt entry rebuilt, artifact round trip", "[codegen]") {
  GraphBuilder gb("cache");
  auto x = gb.input("x", DType::Float32, {4, 33});
  auto y = gb.op("Exp", {gb.op("Neg", {gb.op("Abs", {x})})});
  gb.output(y);
  Model m = gb.finish();
  CpuCompileOptions o = opts();
  o.cache_dir = (fs::path(test_cache_dir("codegen")) / "cache_test").string();
  fs::remove_all(o.cache_dir);
  auto first = CpuModel::build(m.graph, nullptr, o);
  CHECK_FALSE(first->info()["build"]["cache_hit"].get<bool>());
  auto second = CpuModel::build(m.graph, nullptr, o);
  // The key covers the support headers: if they were edited meanwhile, the first build is stale.
  for (int i = 0; i < 3 && second->info()["build"]["hash"] != first->info()["build"]["hash"]; ++i) {
    first = std::move(second);
    second = CpuModel::build(m.graph, nullptr, o);
  }
  CHECK(second->info()["build"]["cache_hit"].get<bool>());
  // Truncate the cached library: the checksum catches it and the entry is rebuilt. (Unload it
  // first: truncating a mapped library under a live process is a SIGBUS, not a cache problem.)
  std::string so = first->info()["build"]["shared_object"];
  first.reset();
  second.reset();
  fs::resize_file(so, fs::file_size(so) / 2);
  auto third = CpuModel::build(m.graph, nullptr, o);
  const std::string third_so = third->info()["build"]["shared_object"];
  CHECK_FALSE(third->info()["build"]["cache_hit"].get<bool>());
  CHECK(third->info()["build"]["rebuilt_corrupt_entry"].get<bool>());
  TensorMap feeds = random_feeds(m.graph, 3);
  TensorMap want = run_reference(m.graph, feeds);
  check_close(third->run(feeds), want);

  fs::path art = fs::path(test_cache_dir("codegen")) / "artifact";
  third->save(art.string());
  auto loaded = CpuModel::load(art.string(), 1);
  check_close(loaded->run(feeds), want);
  // A corrupt artifact library is refused, not run.
  loaded.reset();
  fs::resize_file(art / "kernels.so", 100);
  CHECK_THROWS_AS(CpuModel::load(art.string(), 1), Error);

  // A library without its checksum is what another process's publish looks like between its two
  // renames: the rebuild replaces it by rename and never removes it, so the path names a library
  // all along (removing it made a concurrent process's dlopen fail in CI).
  third.reset();
  fs::remove(third_so.substr(0, third_so.size() - 3) + ".sum");
  std::atomic<bool> done{false}, ever_missing{false};
  bool rebuilt = false;
  std::thread rebuild([&] {
    auto again = CpuModel::build(m.graph, nullptr, o);
    rebuilt = again->info()["build"]["rebuilt_corrupt_entry"].get<bool>();
    done = true;
  });
  while (!done) {
    if (!fs::exists(third_so)) ever_missing = true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  rebuild.join();
  CHECK(rebuilt);
  CHECK_FALSE(ever_missing);
}

#include "fusion/target.h"
#include "graph/zoo.h"
#include "kernels/cross_run.h"

TEST_CASE("codegen: arm-neon cross-compiled driver runs resnet_tiny under qemu", "[codegen][arm]") {
  if (std::system("aarch64-linux-gnu-g++ --version > /dev/null 2>&1") != 0 || std::system("qemu-aarch64 --version > /dev/null 2>&1") != 0) {
    WARN("aarch64-linux-gnu-g++ or qemu-aarch64 missing: skipped");
    return;
  }
  Model m = build_zoo_model("resnet_tiny", ZooOptions{});
  PlanOptions po;
  po.profile = false;
  FusionPlan plan = plan_fusion(m.graph, target_by_name("arm-neon"), po);
  LowerOptions lo;
  lo.layout_block = 4;  // what --target arm-neon picks: NCHW4c conv / pooling kernels under qemu
  KernelModule km = lower_module(m.graph, plan, lo);
  REQUIRE(layout_summary(km)["blocked_stages"].get<int>() > 0);
  REQUIRE(km.fallback_blocks == 0);
  TensorMap feeds = random_feeds(m.graph, 1);
  CrossRunOptions co;
  co.cache_dir = test_cache_dir("codegen");
  co.threads = 2;
  check_close(cross_run(km, feeds, co), run_reference(m.graph, feeds));
}

TEST_CASE("codegen: squeeze-excitation gate runs its activation once per channel, not per scaled element", "[codegen]") {
  // x -> GAP -> 1x1 conv -> Relu -> 1x1 conv -> Sigmoid -> Neg -> x * gate: the block anchored at
  // the second conv cannot scatter its epilogue (the Mul broadcasts the [1,16,1,1] gate over the
  // map), so it materialises a value and multiplies in a second stage. The value is the gate after
  // the one-to-one chain (Sigmoid, Neg), so the chain runs 16 times, not 16 * 9 * 9.
  GraphBuilder gb("se");
  auto x = gb.input("x", DType::Float32, {1, 16, 9, 9});
  auto gap = gb.op("GlobalAveragePool", {x});
  auto fc1 = gb.op("Conv", {gap, gb.weight("w1", {4, 16, 1, 1}, 0.3f), gb.weight("b1", {4})});
  auto r = gb.op("Relu", {fc1});
  auto fc2 = gb.op("Conv", {r, gb.weight("w2", {16, 4, 1, 1}, 0.3f), gb.weight("b2", {16})});
  auto sig = gb.op("Sigmoid", {fc2});
  auto neg = gb.op("Neg", {sig});
  auto y = gb.op("Mul", {x, neg});
  gb.output(y);
  Model m = gb.finish();
  FusionPlan plan = grouped_plan(m.graph, {{gap}, {fc1, r}, {fc2, sig, neg, y}});
  auto cm = CpuModel::build(m.graph, &plan, opts());
  CHECK(cm->module().fallback_blocks == 0);
  const auto& mod = cm->module();
  const int gate = mod.buffer_id(neg);
  REQUIRE(gate >= 0);
  CHECK(mod.buffer_id(fc2) < 0);  // the raw conv output is never stored
  CHECK(mod.buffer_id(sig) < 0);
  int anchors_storing_gate = 0;
  for (auto& st : mod.stages)
    for (auto& s : st.stores) anchors_storing_gate += s.buffer == gate && st.kind == StageKind::Anchor;
  CHECK(anchors_storing_gate == 1);
  TensorMap feeds = random_feeds(m.graph, 5);
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}

TEST_CASE("codegen: stages whose code differs only in their buffers share one compiled implementation", "[codegen]") {
  // Two identical layers (MatMul + bias + Relu on their own weights, then a Gather of columns by
  // an index input of its own): each layer's stages have the same code but for the buffers, so
  // the emitter compiles each stage's code once and the second layer's entry points pass their
  // own buffers to it. Weights are packed per stage (prepare), and each Gather reads its own
  // indices. (Constant index tables are written into the code, so such stages do not share.)
  GraphBuilder gb("shared");
  std::string cur = gb.input("x", DType::Float32, {1, 9, 20});
  std::vector<std::vector<std::string>> groups;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string l = std::to_string(layer);
    auto mm = gb.op("MatMul", {cur, gb.weight("w" + l, {20, 20}, 0.3f)});
    auto add = gb.op("Add", {mm, gb.weight("b" + l, {20})});
    auto rl = gb.op("Relu", {add});
    auto gi = gb.input("idx" + l, DType::Int64, {20});
    auto ga = gb.op("Gather", {rl, gi}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
    auto neg = gb.op("Neg", {ga});
    groups.push_back({mm, add, rl});
    groups.push_back({ga, neg});
    cur = neg;
  }
  gb.output(cur);
  Model m = gb.finish();
  FusionPlan plan = grouped_plan(m.graph, groups);
  auto cm = CpuModel::build(m.graph, &plan, opts());
  CHECK(cm->module().fallback_blocks == 0);
  std::string code;
  for (auto& u : emit_cpp(cm->module(), 1)) code += u.code;
  size_t shared_stages = 0;
  for (size_t p = 0; (p = code.find(": kernel k", p)) != std::string::npos; ++p) ++shared_stages;
  CHECK(shared_stages == 4);  // both layers' MatMul stages and both Gather stages
  CHECK_THAT(code, Catch::Contains("_prepare(S)"));
  TensorMap feeds = random_feeds(m.graph, 3);
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<int64_t> idx(20);
    for (int64_t c = 0; c < 20; ++c) idx[size_t(c)] = layer == 0 ? (c * 7) % 20 : c - 20;
    feeds["idx" + std::to_string(layer)] = Tensor::from_vector<int64_t>({20}, idx);
  }
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}
