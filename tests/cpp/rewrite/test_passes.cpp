// The structural passes (rewrite/passes_*.cpp): per pass a graph where it applies (op counts,
// ops present, reference outputs before/after equal) and a near-miss where it must not; then
// every tiny zoo model through all of them.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/shape_inference.h"
#include "graph/zoo.h"
#include "rewrite/pass.h"
#include "rewrite/passes.h"
#include "rewrite/rule_passes.h"

using namespace nnfuse;

namespace {

PassContext run_pipeline(Model& m, const std::string& passes) {
  register_structural_passes();
  PassContext ctx;
  ctx.model = &m;
  ctx.verify = true;  // validate after every pass
  PassManager().run(parse_pipeline("pipeline test\n" + passes), ctx);
  m.graph.validate();
  return ctx;
}

std::map<std::string, int> histogram(const Graph& g) {
  std::map<std::string, int> h;
  for (NodeId id : g.node_ids()) ++h[g.node(id).op_type];
  return h;
}

int op_count(const Graph& g) {
  int n = 0;
  for (NodeId id : g.node_ids()) n += g.node(id).op_type != "Constant";
  return n;
}

// Outputs of `after` equal those of `before` (same names, |a-b| <= abs + rel*|b|).
void require_same_outputs(const Graph& before, const Graph& after, double rel = 1e-5, double abs = 1e-6, uint64_t seed = 7) {
  REQUIRE(before.outputs() == after.outputs());
  TensorMap feeds = random_feeds(before, seed);
  TensorMap want = run_reference(before, feeds);
  TensorMap got = run_reference(after, feeds);
  for (auto& name : before.outputs()) {
    const Tensor &w = want.at(name), &g = got.at(name);
    INFO("output " << name);
    REQUIRE(w.shape() == g.shape());
    REQUIRE(w.dtype() == g.dtype());
    if (w.dtype() == DType::Float32) {
      auto wv = w.to_float_vector(), gv = g.to_float_vector();
      double worst = 0;
      for (size_t i = 0; i < wv.size(); ++i) {
        double err = std::fabs(double(wv[i]) - gv[i]) - (abs + rel * std::fabs(double(wv[i])));
        worst = std::max(worst, err);
      }
      REQUIRE(worst <= 0);
    } else {
      REQUIRE(w.to_int_vector() == g.to_int_vector());
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- constant-folding
TEST_CASE("constant-folding evaluates constant subgraphs and Constant nodes", "[passes]") {
  GraphBuilder b("cf");
  auto x = b.input("x", DType::Float32, {2, 3});
  auto c1 = b.constant("c1", Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6}));
  auto c2 = b.constant_node("c2", Tensor::from_vector<float>({2, 3}, {0.5f, 0.5f, 0.5f, 1, 1, 1}));
  auto t = b.op("Sub", {c1, b.op("Neg", {c2})});  // c1 + c2
  b.output(b.op("Mul", {x, t}));
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass constant-folding\n");
  auto h = histogram(m.graph);
  REQUIRE(m.graph.num_nodes() == 1);
  REQUIRE(h["Mul"] == 1);
  REQUIRE(ctx.rules_fired["constant-folding"] == 3);  // Constant, Neg, Sub
  // The folded operand holds c1 + c2, computed by hand.
  const Node& mul = m.graph.node(m.graph.node_ids()[0]);
  const Tensor* folded = m.graph.constant_value(mul.inputs[1]);
  REQUIRE(folded);
  REQUIRE(folded->to_float_vector() == std::vector<float>{1.5f, 2.5f, 3.5f, 5, 6, 7});
  require_same_outputs(before, m.graph);
}

TEST_CASE("constant-folding respects max_elements and never materialises blow-ups", "[passes]") {
  GraphBuilder b("cf_cap");
  auto x = b.input("x", DType::Float32, {4, 3});
  auto c = b.constant("c", Tensor::from_vector<float>({1, 3}, {1, 2, 3}));
  auto tiled = b.op("Tile", {c, b.ints("reps", {4, 1})});  // 12 elements from 3 + 2
  auto y = b.op("Add", {x, tiled});
  // ConstantOfShape to 100x100: 10000 elements from a 2-element shape, under max_elements but a blow-up.
  auto big = b.op("ConstantOfShape", {b.ints("shape", {100, 100})},
                  GraphBuilder::attrs({{"value", A::t(Tensor::from_vector<float>({1}, {2.f}))}}));
  auto s = b.op("ReduceSum", {big}, GraphBuilder::attrs({{"keepdims", A::i(0)}}));
  b.output(b.op("Mul", {y, s}));
  Model m = b.finish();
  Graph before = m.graph;
  SECTION("capped by max_elements") {
    PassContext ctx = run_pipeline(m, "pass constant-folding max_elements=10\n");
    auto h = histogram(m.graph);
    REQUIRE(h["Tile"] == 1);  // 12 > 10
    REQUIRE(h["ConstantOfShape"] == 1);
    REQUIRE(ctx.rules_fired["constant-folding"] == 0);
  }
  SECTION("default cap folds the small Tile but not the 10000-element ConstantOfShape") {
    run_pipeline(m, "pass constant-folding\n");
    auto h = histogram(m.graph);
    REQUIRE(h["Tile"] == 0);
    REQUIRE(h["ConstantOfShape"] == 1);
    REQUIRE(h["ReduceSum"] == 1);
  }
  require_same_outputs(before, m.graph);
}

TEST_CASE("constant-folding leaves initializers that are graph inputs alone", "[passes]") {
  GraphBuilder b("cf_override");
  auto x = b.input("x", DType::Float32, {3});
  auto w = b.constant("w", Tensor::from_vector<float>({3}, {1, 2, 3}));
  b.graph().add_input(w, TensorType::of(DType::Float32, {3}));  // overridable default
  b.output(b.op("Add", {x, b.op("Neg", {w})}));
  Model m = b.finish();
  PassContext ctx = run_pipeline(m, "pass constant-folding\n");
  REQUIRE(histogram(m.graph)["Neg"] == 1);
  REQUIRE(ctx.rules_fired["constant-folding"] == 0);
}

// ---------------------------------------------------------------- dce
TEST_CASE("dce removes dead nodes, initializers and values", "[passes]") {
  GraphBuilder b("dce");
  auto x = b.input("x", DType::Float32, {2, 3});
  auto w = b.weight("w", {2, 3});
  auto unused_w = b.weight("unused", {5});
  auto dead = b.op("Exp", {b.op("Add", {x, w})});  // feeds nothing
  (void)dead;
  (void)unused_w;
  b.output(b.op("Relu", {x}));
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass dce\n");
  REQUIRE(m.graph.num_nodes() == 1);
  REQUIRE(histogram(m.graph)["Relu"] == 1);
  REQUIRE(m.graph.initializer_names().empty());
  REQUIRE(ctx.rules_fired["dce"] == 4);  // Add, Exp, w, unused
  REQUIRE(m.graph.inputs() == std::vector<std::string>{"x"});
  require_same_outputs(before, m.graph);
  // Near-miss: a live graph changes nothing.
  PassContext again = run_pipeline(m, "pass dce\n");
  REQUIRE(again.rules_fired["dce"] == 0);
}

// ---------------------------------------------------------------- cse
TEST_CASE("cse merges equal nodes and equal initializers", "[passes]") {
  GraphBuilder b("cse");
  auto x = b.input("x", DType::Float32, {2, 4});
  auto w1 = b.constant("w1", Tensor::from_vector<float>({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}));
  auto w2 = b.constant("w2", Tensor::from_vector<float>({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}));
  auto r1 = b.op("Relu", {x});
  auto r2 = b.op("Relu", {x});
  auto m1 = b.op("MatMul", {r1, w1});
  auto m2 = b.op("MatMul", {r2, w2});  // equal once w2 == w1 and r2 == r1
  b.output(b.op("Add", {m1, m2}));
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass cse\n");
  auto h = histogram(m.graph);
  REQUIRE(h["Relu"] == 1);
  REQUIRE(h["MatMul"] == 1);
  REQUIRE(h["Add"] == 1);
  REQUIRE(m.graph.initializer_names().size() == 1);
  REQUIRE(ctx.rules_fired["cse"] == 3);  // w2, Relu, MatMul
  require_same_outputs(before, m.graph);
}

TEST_CASE("cse does not merge nodes with different attributes or inputs", "[passes]") {
  GraphBuilder b("cse_miss");
  auto x = b.input("x", DType::Float32, {3, 4});
  auto y = b.input("y", DType::Float32, {3, 4});
  auto s0 = b.op("Softmax", {x}, GraphBuilder::attrs({{"axis", A::i(0)}}));
  auto s1 = b.op("Softmax", {x}, GraphBuilder::attrs({{"axis", A::i(1)}}));
  auto e1 = b.op("Exp", {x});
  auto e2 = b.op("Exp", {y});
  b.output(b.op("Sum", {s0, s1, e1, e2}));
  Model m = b.finish();
  PassContext ctx = run_pipeline(m, "pass cse\n");
  REQUIRE(ctx.rules_fired["cse"] == 0);
  REQUIRE(histogram(m.graph)["Softmax"] == 2);
  REQUIRE(histogram(m.graph)["Exp"] == 2);
}

TEST_CASE("cse keeps graph output names when merging", "[passes]") {
  GraphBuilder b("cse_out");
  auto x = b.input("x", DType::Float32, {3});
  auto a = b.op("Sigmoid", {x});
  auto c = b.op("Sigmoid", {x});
  b.output(b.op("Neg", {a}));
  b.output(c);  // the duplicate is a graph output
  Model m = b.finish();
  Graph before = m.graph;
  run_pipeline(m, "pass cse\n");
  REQUIRE(histogram(m.graph)["Sigmoid"] == 1);
  require_same_outputs(before, m.graph);
}

// ---------------------------------------------------------------- shape-simplification
TEST_CASE("shape-simplification folds static shape chains and drops no-op ops", "[passes]") {
  GraphBuilder b("shape");
  auto x = b.input("x", DType::Float32, {2, 3, 4});
  auto s = b.op("Shape", {x});
  auto d0 = b.op("Gather", {s, b.constant("i0", Tensor::scalar<int64_t>(0))}, GraphBuilder::attrs({{"axis", A::i(0)}}));
  auto u = b.op("Unsqueeze", {d0, b.ints("axes", {0})});
  auto target = b.op("Concat", {u, b.ints("minus1", {-1})}, GraphBuilder::attrs({{"axis", A::i(0)}}));
  auto r = b.op("Reshape", {x, target});                   // [2, 12]
  auto same = b.op("Reshape", {r, b.ints("t2", {2, 12})});  // no-op
  auto id = b.op("Identity", {same});
  auto cast = b.op("Cast", {id}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Float32))}}));  // no-op
  auto drop = b.op("Dropout", {cast});
  auto exp = b.op("Expand", {drop, b.ints("t3", {2, 12})});  // no-op
  b.output(b.op("Relu", {exp}));
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass shape-simplification\n");
  auto h = histogram(m.graph);
  REQUIRE(op_count(m.graph) == 2);
  REQUIRE(h["Reshape"] == 1);
  REQUIRE(h["Relu"] == 1);
  REQUIRE(ctx.rules_fired["shape-simplification"] == 9);  // Shape, Gather, Unsqueeze, Concat + 5 no-ops
  // The remaining Reshape reads the folded target [2, -1].
  for (NodeId id2 : m.graph.node_ids())
    if (m.graph.node(id2).op_type == "Reshape")
      REQUIRE(m.graph.constant_value(m.graph.node(id2).inputs[1])->to_int_vector() == std::vector<int64_t>{2, -1});
  require_same_outputs(before, m.graph);
}

TEST_CASE("shape-simplification folds known dims of dynamic shapes only", "[passes]") {
  GraphBuilder b("shape_dyn");
  auto x = b.input("x", DType::Float32, {Dim::sym("batch"), 3, 4});
  auto s = b.op("Shape", {x});
  auto d0 = b.op("Gather", {s, b.ints("i0", {0})}, GraphBuilder::attrs({{"axis", A::i(0)}}));  // batch: unknown
  auto d12 = b.op("Slice", {s, b.ints("st", {1}), b.ints("en", {3})});                       // [3, 4]: known
  auto prod = b.op("ReduceProd", {d12}, GraphBuilder::attrs({{"keepdims", A::i(1)}}));
  auto target = b.op("Concat", {d0, prod}, GraphBuilder::attrs({{"axis", A::i(0)}}));
  auto r = b.op("Reshape", {x, target});
  auto cast = b.op("Cast", {r}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Int32))}}));  // a real Cast
  b.output(cast);
  Model m = b.finish();
  bind_input_shapes(m.graph, {});  // keep symbolic
  PassContext ctx = run_pipeline(m, "pass shape-simplification\n");
  auto h = histogram(m.graph);
  REQUIRE(h["Shape"] == 1);  // still needed for the batch dim
  REQUIRE(h["Gather"] == 1);
  REQUIRE(h["Slice"] == 0);
  REQUIRE(h["ReduceProd"] == 0);
  REQUIRE(h["Cast"] == 1);
  REQUIRE(h["Reshape"] == 1);
  REQUIRE(ctx.rules_fired["shape-simplification"] == 2);  // Slice, ReduceProd
  // Run with a concrete batch: the result still flattens [b, 3, 4] to [b, 12].
  Model bound = m;
  bind_input_shapes(bound.graph, {{"x", {5, 3, 4}}});
  TensorMap out = run_reference(bound.graph, random_feeds(bound.graph, 3));
  REQUIRE(out.begin()->second.shape() == Shape{5, 12});
}

// ---------------------------------------------------------------- fold-batchnorm
namespace {
std::vector<std::string> bn_params(GraphBuilder& b, int64_t c) {
  return {b.uniform("bn_s", {c}, 0.5f, 1.5f), b.uniform("bn_b", {c}, -0.5f, 0.5f), b.uniform("bn_m", {c}, -0.5f, 0.5f),
          b.uniform("bn_v", {c}, 0.5f, 2.f)};
}
std::string bn(GraphBuilder& b, const std::string& x, int64_t c) {
  auto p = bn_params(b, c);
  return b.op("BatchNormalization", {x, p[0], p[1], p[2], p[3]}, GraphBuilder::attrs({{"epsilon", A::f(1e-3f)}}));
}
// A model's BNs folded both ways: with rules-recognition's bn-into-conv rules and with the
// fold-batchnorm pass, each on its own copy; `before` is the graph as built.
struct FoldedBothWays {
  Graph before;
  Model by_rule, by_pass;
  int64_t rules_fired = 0, pass_fired = 0;
};
FoldedBothWays fold_bn_both_ways(const Model& m) {
  FoldedBothWays f{m.graph, m, m};
  register_rule_passes();
  PassContext rc = run_pipeline(f.by_rule, "pass rules-recognition only=bn-into-conv,bn-into-conv-bias\n");
  PassContext pc = run_pipeline(f.by_pass, "pass fold-batchnorm\n");
  f.rules_fired = rc.rules_fired["bn-into-conv"] + rc.rules_fired["bn-into-conv-bias"];
  f.pass_fired = pc.rules_fired["fold-batchnorm"];
  return f;
}
}  // namespace

TEST_CASE("fold-batchnorm folds BN into Conv, ConvTranspose, Gemm and MatMul", "[passes]") {
  GraphBuilder b("bn", 17, 11);
  SECTION("Conv without bias") {
    auto x = b.input("x", DType::Float32, {1, 3, 8, 8});
    auto y = b.op("Conv", {x, b.weight("w", {4, 3, 3, 3}, 0.3f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
    b.output(bn(b, y, 4));
  }
  SECTION("ConvTranspose with group 2 and bias") {
    auto x = b.input("x", DType::Float32, {1, 4, 5, 5});
    auto y = b.op("ConvTranspose", {x, b.weight("w", {4, 3, 3, 3}, 0.3f), b.weight("bias", {6})},
                  GraphBuilder::attrs({{"group", A::i(2)}, {"strides", A::is({2, 2})}}));
    b.output(bn(b, y, 6));
  }
  SECTION("Gemm with transB, alpha, beta and a bias") {
    auto x = b.input("x", DType::Float32, {3, 5});
    auto y = b.op("Gemm", {x, b.weight("w", {4, 5}, 0.3f), b.weight("c", {4})},
                  GraphBuilder::attrs({{"transB", A::i(1)}, {"alpha", A::f(0.5f)}, {"beta", A::f(2.f)}}));
    b.output(bn(b, y, 4));
  }
  SECTION("MatMul with a constant weight") {
    auto x = b.input("x", DType::Float32, {3, 5});
    auto y = b.op("MatMul", {x, b.weight("w", {5, 4}, 0.3f)});
    b.output(bn(b, y, 4));
  }
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass fold-batchnorm\n");
  REQUIRE(ctx.rules_fired["fold-batchnorm"] == 1);
  REQUIRE(histogram(m.graph)["BatchNormalization"] == 0);
  REQUIRE(op_count(m.graph) <= 2);  // MatMul keeps an Add for the shift
  require_same_outputs(before, m.graph, 1e-5, 1e-5);
}

TEST_CASE("fold-batchnorm leaves a Conv whose output has two uses", "[passes]") {
  GraphBuilder b("bn_miss", 17, 3);
  auto x = b.input("x", DType::Float32, {1, 3, 6, 6});
  auto y = b.op("Conv", {x, b.weight("w", {4, 3, 1, 1})});
  auto n = bn(b, y, 4);
  b.output(b.op("Add", {n, b.op("Relu", {y})}));
  // And a BN whose scale is a runtime input: not constant.
  auto x2 = b.input("x2", DType::Float32, {1, 3, 6, 6});
  auto scale = b.input("scale", DType::Float32, {4});
  auto p = bn_params(b, 4);
  auto y2 = b.op("Conv", {x2, b.weight("w2", {4, 3, 1, 1})});
  b.output(b.op("BatchNormalization", {y2, scale, p[1], p[2], p[3]}));
  Model m = b.finish();
  PassContext ctx = run_pipeline(m, "pass fold-batchnorm\n");
  REQUIRE(ctx.rules_fired["fold-batchnorm"] == 0);
  REQUIRE(histogram(m.graph)["BatchNormalization"] == 2);
}

// A BN in training mode normalises with its batch's statistics, which no folded weight can give:
// both folding routes must leave it, and the graph must compute what it did.
TEST_CASE("fold-batchnorm and the bn-into-conv rules leave a training-mode BatchNormalization", "[passes]") {
  GraphBuilder b("bn_train", 17, 7);
  auto x = b.input("x", DType::Float32, {2, 3, 5, 5});
  auto y = b.op("Conv", {x, b.weight("w", {4, 3, 3, 3}, 0.3f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  auto p = bn_params(b, 4);
  b.output(b.op("BatchNormalization", {y, p[0], p[1], p[2], p[3]}, GraphBuilder::attrs({{"training_mode", A::i(1)}})));
  FoldedBothWays f = fold_bn_both_ways(b.finish());
  CHECK(f.rules_fired == 0);
  CHECK(f.pass_fired == 0);
  CHECK(histogram(f.by_rule.graph)["BatchNormalization"] == 1);
  CHECK(histogram(f.by_pass.graph)["BatchNormalization"] == 1);
  require_same_outputs(f.before, f.by_pass.graph, 1e-5, 1e-5);
}

// The CNN and detector class pipelines run fold-batchnorm where `full` runs rules-recognition
// (only its bn-into-conv rules fire there): the two must build the same graph, up to the names of
// the new weights, with the same weight values (bench/pipelines.py checks this on the zoo too).
TEST_CASE("fold-batchnorm builds the graph rules-recognition's bn-into-conv rules build", "[passes]") {
  GraphBuilder b("bn_same", 17, 5);
  auto x = b.input("x", DType::Float32, {1, 8, 6, 6});
  // 3x3 without bias, 1x1 with a bias, depthwise (group 8) without bias, in a chain.
  auto y = b.op("Conv", {x, b.weight("w1", {8, 8, 3, 3}, 0.3f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  y = b.op("Relu", {bn(b, y, 8)});
  y = b.op("Conv", {y, b.weight("w2", {16, 8, 1, 1}, 0.3f), b.weight("b2", {16})});
  y = b.op("Relu", {bn(b, y, 16)});
  y = b.op("Conv", {y, b.weight("w3", {16, 1, 3, 3}, 0.3f)}, GraphBuilder::attrs({{"group", A::i(16)}}));
  b.output(bn(b, y, 16));
  FoldedBothWays f = fold_bn_both_ways(b.finish());
  REQUIRE(f.rules_fired == 3);
  REQUIRE(f.pass_fired == 3);
  const Graph &gr = f.by_rule.graph, &gp = f.by_pass.graph;
  std::vector<NodeId> order_r = gr.topo_order(), order_p = gp.topo_order();
  REQUIRE(order_r.size() == order_p.size());
  REQUIRE(gr.initializer_names().size() == gp.initializer_names().size());
  for (size_t k = 0; k < order_r.size(); ++k) {
    const Node &nr = gr.node(order_r[k]), &np = gp.node(order_p[k]);
    INFO("node " << k << ": " << nr.op_type << " / " << np.op_type);
    REQUIRE(nr.op_type == np.op_type);
    REQUIRE(nr.attrs == np.attrs);
    REQUIRE(nr.inputs.size() == np.inputs.size());
    for (size_t i = 1; i < nr.inputs.size(); ++i) {  // the folded weight and bias: same values
      const Tensor *tr = gr.constant_value(nr.inputs[i]), *tp = gp.constant_value(np.inputs[i]);
      REQUIRE(tr);
      REQUIRE(tp);
      REQUIRE(tr->shape() == tp->shape());
      auto vr = tr->to_float_vector(), vp = tp->to_float_vector();
      for (size_t e = 0; e < vr.size(); ++e) REQUIRE(std::fabs(vr[e] - vp[e]) <= 1e-6f + 1e-6f * std::fabs(vr[e]));
    }
  }
  require_same_outputs(f.before, gp, 1e-5, 1e-5);
}

// fold-batchnorm writes the scaled weight into the old one's buffer when nothing else can see it
// (Graph::initializer_data_for_update); a copy of the model sharing the buffer must keep the
// original values, and then the pass writes a new weight instead.
namespace {
Model conv_bn_model(const char* name) {
  GraphBuilder b(name, 17, 13);
  auto x = b.input("x", DType::Float32, {1, 16, 6, 6});
  // 32*16*3*3 floats: 18 KiB, above the size the structural hash reads by content.
  auto y = b.op("Conv", {x, b.weight("w", {32, 16, 3, 3}, 0.3f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  b.output(bn(b, y, 32));
  return b.finish();
}
std::string conv_weight_name(const Graph& g) {
  for (NodeId id : g.node_ids())
    if (g.node(id).op_type == "Conv") return g.node(id).inputs[1];
  return "";
}
}  // namespace

TEST_CASE("fold-batchnorm scales a weight in place only when the graph alone holds it", "[passes]") {
  Model m = conv_bn_model("bn_inplace");
  const std::string w = conv_weight_name(m.graph);
  const Tensor& before_w = m.graph.initializer(w);
  const std::vector<float> original = before_w.to_float_vector();
  TensorMap feeds = random_feeds(m.graph, 5);
  TensorMap want = run_reference(m.graph, feeds);  // fresh output tensors: share nothing with m

  SECTION("sole owner: the same buffer and name, scaled") {
    const void* buffer = before_w.raw();
    PassContext ctx = run_pipeline(m, "pass fold-batchnorm\n");
    REQUIRE(ctx.rules_fired["fold-batchnorm"] == 1);
    REQUIRE(conv_weight_name(m.graph) == w);
    REQUIRE(m.graph.initializer(w).raw() == buffer);
    REQUIRE(m.graph.initializer(w).to_float_vector() != original);
    TensorMap got = run_reference(m.graph, feeds);
    auto gv = got.begin()->second.to_float_vector(), wv = want.begin()->second.to_float_vector();
    for (size_t i = 0; i < wv.size(); ++i) REQUIRE(std::fabs(gv[i] - wv[i]) <= 1e-5f + 1e-5f * std::fabs(wv[i]));
  }
  SECTION("a copy shares the buffer: it keeps its values, the pass writes a new weight") {
    Model copy = m;
    PassContext ctx = run_pipeline(m, "pass fold-batchnorm\n");
    REQUIRE(ctx.rules_fired["fold-batchnorm"] == 1);
    REQUIRE(conv_weight_name(m.graph) != w);
    REQUIRE(copy.graph.initializer(w).to_float_vector() == original);
    require_same_outputs(copy.graph, m.graph, 1e-5, 1e-5);
  }
}

TEST_CASE("the structural hash sees a large weight rewritten in place", "[passes]") {
  Model m = conv_bn_model("hash_inplace");
  const std::string w = conv_weight_name(m.graph);
  uint64_t h0 = structural_hash(m.graph);
  REQUIRE(structural_hash(m.graph) == h0);
  float* p = static_cast<float*>(m.graph.initializer_data_for_update(w));
  REQUIRE(p);
  p[100] += 1.0f;
  REQUIRE(structural_hash(m.graph) != h0);
  Model copy = m;  // now shared: no in-place access
  REQUIRE(m.graph.initializer_data_for_update(w) == nullptr);
}

// ---------------------------------------------------------------- combine-parallel-*
TEST_CASE("combine-parallel-matmul merges Q, K, V projections with their biases", "[passes]") {
  for (int64_t opset : {11, 13, 17}) {
    GraphBuilder b("qkv", opset, 5);
    auto x = b.input("x", DType::Float32, {2, 4, 8});
    std::vector<std::string> outs;
    for (int64_t n : {8, 4, 8}) {
      auto mm = b.op("MatMul", {x, b.weight("w", {8, n}, 0.3f)});
      outs.push_back(b.op("Add", {mm, b.weight("bias", {n})}));
    }
    b.output(b.op("Relu", {outs[0]}));
    b.output(b.op("Sigmoid", {outs[1]}));
    b.output(outs[2]);
    Model m = b.finish();
    Graph before = m.graph;
    PassContext ctx = run_pipeline(m, "pass combine-parallel-matmul\n");
    auto h = histogram(m.graph);
    INFO("opset " << opset);
    REQUIRE(ctx.rules_fired["combine-parallel-matmul"] == 1);
    REQUIRE(h["MatMul"] == 1);
    REQUIRE(h["Add"] == 1);
    REQUIRE(h["Split"] == 1);
    REQUIRE(op_count(m.graph) == 5);  // MatMul, Add, Split, Relu, Sigmoid (was 8)
    require_same_outputs(before, m.graph, 1e-6, 0);
  }
}

TEST_CASE("combine-parallel-matmul merges Gemms and leaves different activations alone", "[passes]") {
  GraphBuilder b("gemms", 17, 9);
  auto x = b.input("x", DType::Float32, {3, 6});
  auto y = b.input("y", DType::Float32, {3, 6});
  auto g1 = b.op("Gemm", {x, b.weight("w", {5, 6}), b.weight("c", {5})}, GraphBuilder::attrs({{"transB", A::i(1)}}));
  auto g2 = b.op("Gemm", {x, b.weight("w", {2, 6}), b.weight("c", {2})}, GraphBuilder::attrs({{"transB", A::i(1)}}));
  auto m1 = b.op("MatMul", {x, b.weight("v", {6, 4})});
  auto m2 = b.op("MatMul", {y, b.weight("v", {6, 4})});  // another activation: not combined with m1
  b.output(g1);
  b.output(g2);
  b.output(b.op("Add", {m1, m2}));
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass combine-parallel-matmul\n");
  auto h = histogram(m.graph);
  REQUIRE(ctx.rules_fired["combine-parallel-matmul"] == 1);
  REQUIRE(h["Gemm"] == 1);
  REQUIRE(h["Split"] == 1);
  REQUIRE(h["MatMul"] == 2);
  require_same_outputs(before, m.graph, 1e-6, 0);
}

TEST_CASE("combine-parallel-conv merges Convs of equal geometry only", "[passes]") {
  GraphBuilder b("convs", 17, 4);
  auto x = b.input("x", DType::Float32, {1, 8, 6, 6});
  auto a1 = GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}});
  auto c1 = b.op("Conv", {x, b.weight("w", {3, 8, 3, 3}), b.weight("b", {3})}, a1);
  auto c2 = b.op("Conv", {x, b.weight("w", {5, 8, 3, 3})}, a1);  // no bias: zeros in the combined one
  auto c3 = b.op("Conv", {x, b.weight("w", {2, 8, 3, 3})}, GraphBuilder::attrs({{"strides", A::is({2, 2})}}));
  b.output(c1);
  b.output(b.op("Relu", {c2}));
  b.output(c3);
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass combine-parallel-conv\n");
  auto h = histogram(m.graph);
  REQUIRE(ctx.rules_fired["combine-parallel-conv"] == 1);
  REQUIRE(h["Conv"] == 2);  // the strided one stays apart
  REQUIRE(h["Split"] == 1);
  require_same_outputs(before, m.graph, 1e-6, 0);
}

TEST_CASE("combine-parallel-conv leaves Convs apart where the Split would copy more than it saves", "[passes]") {
  // ResNet-50's first block: 64 channels into 64 (conv1) and 256 (downsample) at one size. One
  // read of x saved against 320 channels copied by the Split: not combined. Four narrow heads on
  // one wide map (an SSD's predictors) are.
  GraphBuilder b("convs", 17, 4);
  auto x = b.input("x", DType::Float32, {1, 16, 7, 7});
  b.output(b.op("Relu", {b.op("Conv", {x, b.weight("w", {16, 16, 1, 1}), b.weight("b", {16})})}));
  b.output(b.op("Conv", {x, b.weight("w", {64, 16, 1, 1}), b.weight("b", {64})}));
  auto y = b.input("y", DType::Float32, {1, 32, 5, 5});
  auto pads = GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}});
  for (int64_t k : {6, 12, 6, 4}) b.output(b.op("Conv", {y, b.weight("w", {k, 32, 3, 3}), b.weight("b", {k})}, pads));
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass combine-parallel-conv\n");
  auto h = histogram(m.graph);
  REQUIRE(ctx.rules_fired["combine-parallel-conv"] == 1);
  REQUIRE(h["Conv"] == 3);  // the two on x, the combined heads on y
  REQUIRE(h["Split"] == 1);
  require_same_outputs(before, m.graph, 1e-6, 0);
}

// ---------------------------------------------------------------- fold-transpose-into-gemm
TEST_CASE("fold-transpose-into-gemm turns Transposes into trans flags", "[passes]") {
  GraphBuilder b("tgemm", 17, 2);
  auto a = b.input("a", DType::Float32, {5, 3});
  auto w = b.weight("w", {4, 5});
  auto ta = b.op("Transpose", {a}, GraphBuilder::attrs({{"perm", A::is({1, 0})}}));
  auto tw = b.op("Transpose", {w});
  auto g = b.op("Gemm", {ta, tw, b.weight("c", {4})});
  b.output(g);
  // Near-miss: a Transpose of a 3-D tensor is not a Gemm operand form.
  auto x3 = b.input("x3", DType::Float32, {2, 3, 4});
  b.output(b.op("Transpose", {x3}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1})}})));
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass fold-transpose-into-gemm\n");
  REQUIRE(ctx.rules_fired["fold-transpose-into-gemm"] == 2);
  auto h = histogram(m.graph);
  REQUIRE(h["Transpose"] == 1);
  REQUIRE(h["Gemm"] == 1);
  for (NodeId id : m.graph.node_ids())
    if (m.graph.node(id).op_type == "Gemm") {
      REQUIRE(m.graph.node(id).attrs.get_int("transA", 0) == 1);
      REQUIRE(m.graph.node(id).attrs.get_int("transB", 0) == 1);
    }
  require_same_outputs(before, m.graph, 1e-6, 0);
}

// ---------------------------------------------------------------- the zoo
TEST_CASE("all structural passes keep every tiny zoo model's outputs", "[passes][zoo]") {
  const std::string pipeline =
      "pass constant-folding\npass shape-simplification\npass cse\npass fold-batchnorm\n"
      "pass fold-transpose-into-gemm\npass combine-parallel-matmul\npass combine-parallel-conv\n"
      "pass constant-folding\npass cse\npass dce\n";
  for (auto& e : zoo_models()) {
    if (!e.tiny) continue;
    for (int64_t opset : {13, 17}) {
      ZooOptions o;
      o.opset = opset;
      Model m = e.build(o);
      Graph before = m.graph;
      int ops_before = op_count(m.graph);
      PassContext ctx = run_pipeline(m, pipeline);
      int ops_after = op_count(m.graph);
      std::string fired;
      for (auto& [k, v] : ctx.rules_fired) fired += " " + k + "=" + std::to_string(v);
      WARN(e.name << " opset " << opset << ": ops " << ops_before << " -> " << ops_after << fired);
      INFO(e.name << " opset " << opset);
      REQUIRE(ops_after <= ops_before);
      require_same_outputs(before, m.graph, 1e-4, 1e-5, 11);
    }
  }
}

TEST_CASE("structural passes on dynamic-axes exports fold the static parts of shape chains", "[passes][zoo]") {
  const std::string pipeline =
      "pass constant-folding\npass shape-simplification\npass cse\npass fold-batchnorm\n"
      "pass combine-parallel-matmul\npass constant-folding\npass cse\npass dce\n";
  for (const char* name : {"bert_tiny", "gpt2_tiny", "vit_tiny", "resnet_tiny"}) {
    ZooOptions o;
    o.opset = 13;
    Model fixed = build_zoo_model(name, o);
    o.dynamic_batch = true;
    Model m = build_zoo_model(name, o);
    Model before = m;
    int ops_before = op_count(m.graph);
    PassContext ctx = run_pipeline(m, pipeline);
    int ops_after = op_count(m.graph);
    WARN(name << " dynamic: ops " << ops_before << " -> " << ops_after << ", shape-simplification="
              << ctx.rules_fired["shape-simplification"]);
    INFO(name);
    REQUIRE(ops_after <= ops_before);
    // Bind the dims the static build has and compare.
    std::map<std::string, Shape> bind;
    for (auto& in : fixed.graph.inputs()) bind[in] = fixed.graph.type(in).static_shape();
    bind_input_shapes(before.graph, bind);
    bind_input_shapes(m.graph, bind);
    require_same_outputs(before.graph, m.graph, 1e-4, 1e-5, 13);
  }
}

// Hidden (run by name): writes each tiny zoo model before/after the passes to $NNFUSE_PASSES_EXPORT
// so that ONNX Runtime can compare them (a manual cross-check of --export-rewritten).
#include <cstdlib>

#include "graph/onnx_io.h"

TEST_CASE("export tiny zoo models before and after the structural passes", "[.][passes-export]") {
  const char* dir = std::getenv("NNFUSE_PASSES_EXPORT");
  if (!dir) return;
  const std::string pipeline =
      "pass constant-folding\npass shape-simplification\npass cse\npass fold-batchnorm\n"
      "pass fold-transpose-into-gemm\npass combine-parallel-matmul\npass combine-parallel-conv\n"
      "pass constant-folding\npass cse\npass dce\n";
  for (auto& e : zoo_models()) {
    if (!e.tiny) continue;
    for (int64_t opset : {13, 17}) {
      ZooOptions o;
      o.opset = opset;
      Model m = e.build(o);
      std::string stem = std::string(dir) + "/" + e.name + "_" + std::to_string(opset);
      save_model(m, stem + "_before.onnx");
      run_pipeline(m, pipeline);
      save_model(m, stem + "_after.onnx");
    }
  }
}

#include <chrono>

// Hidden (run by name): time of each pass on a generated 100k-node graph.
TEST_CASE("structural passes on a 100k-node graph", "[.][passes-bench]") {
  // Built with Graph::add_node and explicit names (the builder's fresh names scan every node).
  Model m;
  Graph& g = m.graph;
  g.opset_imports[""] = 17;
  g.add_input("x", TensorType::of(DType::Float32, {4, 8}));
  g.set_initializer("c", Tensor::from_vector<float>({8}, {1, 2, 3, 4, 5, 6, 7, 8}));
  std::string cur = "x";
  for (int i = 0; i < 20000; ++i) {
    std::string p = "n" + std::to_string(i) + "_";
    g.add_node("Neg", {"c"}, {p + "k"});  // foldable
    g.add_node("Add", {cur, p + "k"}, {p + "a"});
    g.add_node("Relu", {p + "a"}, {p + "r1"});
    g.add_node("Relu", {p + "a"}, {p + "r2"});  // CSE
    g.add_node("Add", {p + "r1", p + "r2"}, {p + "s"});
    g.add_node("Identity", {p + "s"}, {p + "i"});  // shape-simplification
    cur = p + "i";
  }
  g.add_output(cur);
  REQUIRE(g.num_nodes() == 120000);
  register_structural_passes();
  PassContext ctx;
  ctx.model = &m;
  auto recs = PassManager().run(parse_pipeline("pipeline big\npass constant-folding\npass cse\npass shape-simplification\n"
                                               "pass fold-batchnorm\npass combine-parallel-matmul\npass fold-transpose-into-gemm\npass dce\n"),
                                ctx);
  for (auto& r : recs) WARN(r.name << ": " << r.ms << " ms, nodes " << r.nodes_before << " -> " << r.nodes_after);
  REQUIRE(g.num_nodes() == 60000);
}

TEST_CASE("passes keep values that subgraph bodies read by name", "[passes]") {
  GraphBuilder b("bodies", 17, 1);
  auto x = b.input("x", DType::Float32, {3});
  auto cond = b.input("cond", DType::Bool, {});
  auto r0 = b.op("Relu", {x});
  auto t = b.op("Relu", {x});                    // a duplicate of r0, read only by the then-branch
  auto u = b.op("Neg", {b.op("Identity", {x})});  // read only by the else-branch
  auto make_body = [&](const std::string& outer, const std::string& out) {
    auto body = std::make_shared<Graph>();
    body->is_subgraph = true;
    body->opset_imports[""] = 17;
    body->declare_value(outer, TensorType::of(DType::Float32, {3}));  // an outer reference
    body->add_node("Identity", {outer}, {out});
    body->set_type(out, TensorType::of(DType::Float32, {3}));
    body->add_output(out);
    return body;
  };
  auto y = b.op("If", {cond}, GraphBuilder::attrs({{"then_branch", Attribute::make_graph(make_body(t, "then_out"))},
                                                  {"else_branch", Attribute::make_graph(make_body(u, "else_out"))}}));
  b.output(b.op("Add", {r0, y}));
  Model m = b.finish();
  Graph before = m.graph;
  run_pipeline(m, "pass dce\npass cse\npass shape-simplification\npass constant-folding\npass dce\n");
  auto h = histogram(m.graph);
  REQUIRE(h["Relu"] == 2);  // t stays: the then-branch reads it by name
  REQUIRE(h["Neg"] == 1);
  REQUIRE(h["If"] == 1);
  REQUIRE(m.graph.has_value(t));
  REQUIRE(m.graph.has_value(u));
  for (bool c : {true, false}) {
    TensorMap feeds = random_feeds(before, 5);
    feeds["cond"] = Tensor::scalar<bool>(c);
    auto want = run_reference(before, feeds), got = run_reference(m.graph, feeds);
    REQUIRE(want.begin()->second.to_float_vector() == got.begin()->second.to_float_vector());
  }
}

// ---------------------------------------------------------------- qdq-to-float
TEST_CASE("qdq-to-float turns per-tensor activation QDQ pairs into float ops, bit for bit", "[passes]") {
  GraphBuilder b("qdq", 17, 13);
  auto x = b.input("x", DType::Float32, {1, 4, 6, 6});
  auto c = b.op("Conv", {x, b.weight("w", {4, 4, 3, 3}, 0.3f)}, GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  // uint8 with a zero point; one QuantizeLinear read by two DequantizeLinear nodes (ORT writes
  // one per consumer), the second with its own scale and zero point.
  auto s1 = b.scalar("s1", 0.05f);
  auto z1 = b.constant("z1", Tensor::from_vector<uint8_t>({}, {128}));
  auto q1 = b.op("QuantizeLinear", {c, s1, z1});
  auto d1 = b.op("DequantizeLinear", {q1, s1, z1});
  auto d2 = b.op("DequantizeLinear", {q1, b.scalar("s2", 0.04f), b.constant("z2", Tensor::from_vector<uint8_t>({1}, {120}))});
  // int8 without zero points, after a Relu.
  auto q3 = b.op("QuantizeLinear", {b.op("Relu", {d1}), b.scalar("s3", 0.02f)});
  b.output(b.op("Add", {b.op("DequantizeLinear", {q3, b.scalar("s4", 0.02f)}), d2}));
  // Near misses: a per-channel pair, and a pair whose scale is a runtime input.
  auto pc = b.weight("pc", {4}, 0.1f);
  auto pz = b.constant("pz", Tensor::from_vector<int8_t>({4}, {0, 1, -1, 2}));
  auto qpc = b.op("QuantizeLinear", {c, pc, pz}, GraphBuilder::attrs({{"axis", A::i(1)}}));
  b.output(b.op("DequantizeLinear", {qpc, pc, pz}, GraphBuilder::attrs({{"axis", A::i(1)}})));
  auto rs = b.input("rs", DType::Float32, {});
  b.output(b.op("DequantizeLinear", {b.op("QuantizeLinear", {c, rs}), rs}));
  Model m = b.finish();
  Graph before = m.graph;
  PassContext ctx = run_pipeline(m, "pass qdq-to-float\npass dce\n");
  CHECK(ctx.rules_fired["qdq-to-float"] == 3);
  auto h = histogram(m.graph);
  CHECK(h["QuantizeLinear"] == 2);  // the near misses
  CHECK(h["DequantizeLinear"] == 2);
  CHECK(h["Round"] == 3);
  // Exact: the same float division, rounding and integer arithmetic as the reference kernels.
  TensorMap feeds = random_feeds(before, 11);
  feeds["rs"] = Tensor::from_vector<float>({}, {0.07f});
  const TensorMap want = run_reference(before, feeds), got = run_reference(m.graph, feeds);
  for (auto& name : before.outputs()) {
    INFO("output " << name);
    CHECK(want.at(name).to_float_vector() == got.at(name).to_float_vector());
  }
}
