// If/Loop/Scan bodies compiled as models of their own (kernels/cpu_bodies.cpp): each body is generated
// code, the taken one runs on the outer buffers, nested Ifs compile recursively, artifacts keep the
// branches, and a branch that cannot be compiled keeps the reference path with its reason.
#include <catch2/catch.hpp>

#include <filesystem>

#include "fusion/planner.h"
#include "fusion/target.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "lowering_test_util.h"

using namespace nnfuse;
using namespace nnfuse::testing;
namespace fs = std::filesystem;

namespace {

FusionPlan host_plan(const Graph& g) {
  PlanOptions po;
  po.profile = false;
  return plan_fusion(g, target_by_name("host"), po);
}

// A branch body: Conv(x, w) + bias, `act`, + y, all read from the enclosing scope (w and b are
// the outer graph's weights, as exporters write them).
std::shared_ptr<Graph> conv_body(const std::string& tag, const std::string& act, const std::string& w, const std::string& b) {
  auto body = std::make_shared<Graph>();
  body->name = tag;
  body->is_subgraph = true;
  body->opset_imports[""] = 17;
  for (auto& v : {std::string("x"), std::string("y")}) body->declare_value(v, TensorType::of(DType::Float32, {1, 8, 6, 6}));
  body->declare_value(w, TensorType::of(DType::Float32, {8, 8, 3, 3}));
  body->declare_value(b, TensorType::of(DType::Float32, {8}));
  Attributes ca;
  ca.set("pads", A::is({1, 1, 1, 1}));
  body->add_node("Conv", {"x", w, b}, {tag + "_c"}, ca);
  body->add_node(act, {tag + "_c"}, {tag + "_a"});
  body->add_node("Add", {tag + "_a", "y"}, {tag + "_out"});
  body->add_output(tag + "_out");
  return body;
}

std::shared_ptr<Graph> if_body(const std::string& tag, const std::string& cond, std::shared_ptr<Graph> then_b, std::shared_ptr<Graph> else_b) {
  auto body = std::make_shared<Graph>();
  body->name = tag;
  body->is_subgraph = true;
  body->opset_imports[""] = 17;
  body->declare_value(cond, TensorType::of(DType::Bool, {}));
  Attributes at;
  at.set("then_branch", Attribute::make_graph(std::move(then_b)));
  at.set("else_branch", Attribute::make_graph(std::move(else_b)));
  body->add_node("If", {cond}, {tag + "_out"}, at);
  body->add_output(tag + "_out");
  return body;
}

Model if_model(bool nested) {
  GraphBuilder gb(nested ? "nested_if" : "one_if");
  gb.input("c1", DType::Bool, {});
  if (nested) gb.input("c2", DType::Bool, {});
  auto x = gb.input("x", DType::Float32, {1, 8, 6, 6});
  auto y = gb.input("y", DType::Float32, {1, 8, 6, 6});
  (void)x, (void)y;
  for (auto* w : {"w1", "w2", "w3"}) gb.weight(w, {8, 8, 3, 3}, 0.2f);
  for (auto* b : {"b1", "b2", "b3"}) gb.weight(b, {8}, 0.2f);
  auto then_b = nested ? if_body("inner", "c2", conv_body("t2", "Relu", "w1", "b1"), conv_body("e2", "Sigmoid", "w2", "b2"))
                       : conv_body("t", "Relu", "w1", "b1");
  Attributes at;
  at.set("then_branch", Attribute::make_graph(then_b));
  at.set("else_branch", Attribute::make_graph(conv_body("e", "Tanh", "w3", "b3")));
  auto out = gb.op("If", {"c1"}, at);
  gb.output(gb.op("Mul", {out, gb.scalar("half", 0.5f)}));
  return gb.finish();
}

void check_all_conditions(const CpuModel& cm, const Graph& g, bool nested) {
  TensorMap feeds = random_feeds(g, 3);
  for (int k = 0; k < (nested ? 4 : 2); ++k) {
    INFO("c1 " << (k & 1) << " c2 " << (k >> 1));
    feeds["c1"] = Tensor::scalar<bool>(k & 1);
    if (nested) feeds["c2"] = Tensor::scalar<bool>(k >> 1);
    check_close(cm.run(feeds), run_reference(g, feeds));
  }
}

// Builds the model for host (cost model only) in cache `tag`: the model and its report.
std::pair<std::unique_ptr<CpuModel>, nlohmann::json> build_host(const Model& m, CpuCompileOptions& o, const std::string& tag) {
  FusionPlan plan = host_plan(m.graph);
  o = test_compile_options(tag);
  o.measure = false;
  auto cm = CpuModel::build(m.graph, &plan, o);
  nlohmann::json info = cm->info();
  return {std::move(cm), std::move(info)};
}

// The report says that every body (`bodies` of them, of op `op`) was compiled and that nothing
// runs on reference kernels.
void check_all_compiled(const nlohmann::json& info, size_t bodies, const std::string& op) {
  const auto& br = info["build"]["bodies"];
  REQUIRE(br.size() == bodies);
  for (auto& b : br) {
    CHECK(b["op"] == op);
    CHECK(b["compiled"] == true);
    CHECK(b["fallback_blocks"] == 0);
  }
  CHECK(info["memory"]["fallback_blocks"] == 0);
  CHECK(info["memory"]["compiled_control_flow_blocks"] == 1);
  CHECK(info["memory"]["fallback_ops"].empty());
}

// The report says that no body was compiled, the first for `reason`.
void check_not_compiled(const nlohmann::json& info, size_t bodies, const std::string& reason) {
  const auto& br = info["build"]["bodies"];
  REQUIRE(br.size() == bodies);
  CHECK(br[0]["compiled"] == false);
  CHECK(br[0]["reason"].get<std::string>().find(reason) != std::string::npos);
  CHECK_FALSE(info["memory"].contains("compiled_control_flow_blocks"));
}

// A body reading `outer` (typed `t`) and giving `op(outer)` as `out`.
std::shared_ptr<Graph> unary_body(const std::string& op, const std::string& outer, const TensorType& t, const std::string& out,
                                  const Attributes& attrs = {}) {
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->opset_imports[""] = 17;
  body->declare_value(outer, t);
  body->add_node(op, {outer}, {out}, attrs);
  body->add_output(out);
  return body;
}

// Adds an If on input "c" with these branches as gb's output; its branches must stay interpreted
// for `reason` (the report says so) and both conditions match the reference.
void check_interpreted_if(GraphBuilder& gb, std::shared_ptr<Graph> then_b, std::shared_ptr<Graph> else_b, const std::string& tag,
                          const std::string& reason, TensorMap feeds) {
  gb.output(gb.op("If", {"c"}, GraphBuilder::attrs({{"then_branch", Attribute::make_graph(std::move(then_b))},
                                                    {"else_branch", Attribute::make_graph(std::move(else_b))}})));
  Model m = gb.finish();
  CpuCompileOptions o;
  auto [cm, info] = build_host(m, o, tag);
  INFO(info.dump());
  check_not_compiled(info, 2, reason);
  for (bool cond : {false, true}) {
    feeds["c"] = Tensor::scalar<bool>(cond);
    check_close(cm->run(feeds), run_reference(m.graph, feeds));
  }
  std::error_code ec;
  fs::remove_all(o.cache_dir, ec);
}

}  // namespace

TEST_CASE("compiled bodies: an If runs its branches as generated code and matches the reference", "[codegen][control]") {
  for (bool nested : {false, true}) {
    INFO((nested ? "nested" : "one If"));
    Model m = if_model(nested);
    CpuCompileOptions o;
    auto [cm, info] = build_host(m, o, "branches");
    INFO(info.dump());
    check_all_compiled(info, 2, "If");
    check_all_conditions(*cm, m.graph, nested);
    // The artifact keeps the bodies (bodies/<k>, each an artifact) and runs them without a
    // compiler.
    const fs::path dir = fs::path(o.cache_dir) / "artifact";
    cm->save(dir.string());
    CHECK(fs::exists(dir / "bodies" / "1" / "plan.json"));
    auto loaded = CpuModel::load(dir.string(), 2);
    CHECK(loaded->info()["memory"]["fallback_blocks"] == 0);
    check_all_conditions(*loaded, m.graph, nested);
    std::error_code ec;
    fs::remove_all(o.cache_dir, ec);
  }
}

TEST_CASE("compiled bodies: bodies with too little work stay interpreted", "[codegen][control]") {
  // Branches of a few element-wise ops (shape arithmetic, a clamp): a compile would cost more
  // than it ever saves.
  GraphBuilder gb("tiny_if");
  gb.input("c", DType::Bool, {});
  auto x = gb.input("x", DType::Float32, {4});
  const TensorType t = TensorType::of(DType::Float32, {4});
  check_interpreted_if(gb, unary_body("Relu", x, t, "t_out"), unary_body("Neg", x, t, "e_out"), "tiny_if", "too little work",
                       {{"x", Tensor::from_vector<float>({4}, {1, -2, 3, -4})}});
}

TEST_CASE("compiled bodies: a branch without static shapes keeps the reference path and says why", "[codegen][control]") {
  // The branches read NonZero's output, whose length only the run decides.
  GraphBuilder gb("dynamic_branch");
  gb.input("c", DType::Bool, {});
  auto x = gb.input("x", DType::Float32, {6});
  auto nz = gb.op("NonZero", {gb.op("Relu", {x})});
  const TensorType nz_type(DType::Int64, {Dim(1), Dim()});
  const Attributes no_keep = GraphBuilder::attrs({{"keepdims", A::i(0)}});
  check_interpreted_if(gb, unary_body("ReduceSum", nz, nz_type, "t_sum", no_keep), unary_body("ReduceMax", nz, nz_type, "e_max", no_keep),
                       "branches_dyn", "no static shape", {{"x", Tensor::from_vector<float>({6}, {1, -2, 3, 0, 5, -1})}});
}

namespace {

// Loop(M, cond) over h [1, 128]: h' = Tanh(h W + x) + i (the iteration number, cast), scanned each step.
// With `grow`, a second carried value doubles each iteration (Concat with itself), so its shape
// is not the one the body can be compiled for.
Model loop_model(bool grow) {
  GraphBuilder gb(grow ? "growing_loop" : "rnn_loop");
  auto trips = gb.input("M", DType::Int64, {});
  auto x = gb.input("x", DType::Float32, {1, 128});
  auto h0 = gb.input("h0", DType::Float32, {1, 128});
  gb.weight("W", {128, 128}, 0.1f);
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->opset_imports[""] = 17;
  body->add_input("i", TensorType(DType::Int64, {}));
  body->add_input("cond_in", TensorType(DType::Bool, {}));
  body->add_input("h_in", TensorType::unknown_shape(DType::Float32));  // as exporters often leave it
  body->declare_value("W", TensorType::of(DType::Float32, {128, 128}));
  body->declare_value(x, TensorType::of(DType::Float32, {1, 128}));
  body->add_node("MatMul", {"h_in", "W"}, {"hw"});
  body->add_node("Add", {"hw", x}, {"pre"});
  body->add_node("Tanh", {"pre"}, {"act"});
  body->add_node("Cast", {"i"}, {"fi"}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Float32))}}));
  body->add_node("Add", {"act", "fi"}, {"h_out"});
  body->add_node("Identity", {"cond_in"}, {"cond_out"});
  std::vector<std::string> outs = {"cond_out", "h_out"};
  std::vector<std::string> ins = {trips, "", h0};
  if (grow) {
    body->add_input("g_in", TensorType::unknown_shape(DType::Float32));
    body->add_node("Concat", {"g_in", "g_in"}, {"g_out"}, GraphBuilder::attrs({{"axis", A::i(0)}}));
    outs.push_back("g_out");
    ins.push_back(gb.weight("g0", {1}, 1.f));
  }
  body->add_node("Identity", {"h_out"}, {"scan_h"});
  outs.push_back("scan_h");
  for (auto& o : outs) body->add_output(o);
  auto res = gb.op_n("Loop", ins, int(outs.size()) - 1, GraphBuilder::attrs({{"body", Attribute::make_graph(body)}}));
  for (auto& r : res) gb.output(r);
  return gb.finish();
}

}  // namespace

TEST_CASE("compiled bodies: a Loop body runs as generated code each iteration, unless its carried shapes change", "[codegen][control]") {
  for (bool grow : {false, true}) {
    INFO((grow ? "growing carried value" : "shape-invariant"));
    Model m = loop_model(grow);
    CpuCompileOptions o;
    auto [cm, info] = build_host(m, o, grow ? "loop_grow" : "loop_body");
    INFO(info.dump());
    if (grow) check_not_compiled(info, 1, "loop-carried 'g_in'");
    else check_all_compiled(info, 1, "Loop");
    // The growing Loop runs on the reference path without iterations only: with some, the outer
    // graph's type of its carried output ([1], from the initial value) is what the run contradicts.
    TensorMap feeds = random_feeds(m.graph, 4);
    for (int64_t trips : grow ? std::vector<int64_t>{0} : std::vector<int64_t>{0, 1, 7}) {
      INFO("trips " << trips);
      feeds["M"] = Tensor::scalar<int64_t>(trips);
      check_close(cm->run(feeds), run_reference(m.graph, feeds));
    }
    std::error_code ec;
    fs::remove_all(o.cache_dir, ec);
  }
}
