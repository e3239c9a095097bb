// Rule language, matcher, rewriter, loop guard, rule checker and the shipped rule files.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <iostream>

#include "graph/builder.h"
#include "graph/zoo.h"
#include "graph/interpreter.h"
#include "graph/shape_inference.h"
#include "rewrite/pass.h"
#include "rewrite/rule.h"
#include "rewrite/rule_passes.h"

using namespace nnfuse;

namespace {

RuleSet rules_of(const std::string& text) { return parse_rules(text, "test.rules"); }

// Rule `name` of the shipped files.
RuleSet shipped(const std::string& name) {
  RuleSet all = all_shipped_rules();
  RuleSet one;
  for (auto& r : all.rules)
    if (r.name == name) one.rules.push_back(r);
  REQUIRE(one.rules.size() == 1);
  return one;
}

int count_op(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id : g.node_ids()) n += g.node(id).op_type == op;
  return n;
}

RewriteOptions verified() {
  RewriteOptions o;
  o.verify = true;
  return o;
}

// Rewrites a copy of the model with the rules and checks outputs agree on random inputs.
RewriteResult rewrite_and_compare(Model& m, const RuleSet& rules, double tol = 1e-4) {
  Graph before = m.graph;
  RewriteResult r = apply_rules(m.graph, rules, verified());
  TensorMap feeds = random_feeds(before, 7);
  TensorMap a = run_reference(before, feeds), b = run_reference(m.graph, feeds);
  for (auto& [name, t] : a) {
    REQUIRE(b.count(name));
    const Tensor& u = b.at(name);
    REQUIRE(u.shape() == t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(std::fabs(t.as_double(i) - u.as_double(i)) <= tol * (1 + std::fabs(t.as_double(i))));
  }
  return r;
}

}  // namespace

TEST_CASE("rule parser: rules, multi-line rules, comments, attributes and guards", "[rules]") {
  RuleSet rs = rules_of(
      "# a comment\n"
      "rule exp-product: Mul(Exp(a), Exp(b)) => Exp(Add(a, b))\n"
      "rule tt: Transpose<perm=$q>(Transpose<perm=$p>(x))\n"
      "   => Transpose<perm=compose_perm($p, $q)>(x)   # trailing comment\n"
      "   where has_attr($p), rank(x) >= 2\n");
  REQUIRE(rs.rules.size() == 2);
  CHECK(rs.rules[0].name == "exp-product");
  CHECK(rs.rules[0].pattern.str() == "Mul(Exp(a), Exp(b))");
  CHECK(rs.rules[1].guards.size() == 2);
  CHECK(rs.rules[1].line == 3);
  CHECK(rs.rules[1].pattern_depth() == 2);
}

TEST_CASE("rule parser: errors give file:line:col, what was expected and found", "[rules]") {
  try {
    parse_rules("rule a: Mul(x, 1) => x\nrule b: Mul(x,\n  ) => x\n", "bad.rules");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Parse);
    CHECK(e.context().file == "bad.rules");
    CHECK(e.context().line == 3);
    CHECK(e.context().col == 3);
    CHECK_THAT(e.what(), Catch::Contains("expected a term") && Catch::Contains("found ')'"));
  }
  try {
    parse_rules("rule a: Mul(x, 1) x\n", "f.rules");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.context().line == 1);
    CHECK(e.context().col == 19);
    CHECK_THAT(e.what(), Catch::Contains("expected '=>'"));
  }
  try {
    parse_rules("rule uses-bogus: Frobnicate(x) => x\n", "f.rules");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("uses-bogus") && Catch::Contains("Frobnicate"));
  }
}

TEST_CASE("rules: every shipped rule file parses", "[rules]") {
  for (auto& g : shipped_rule_groups()) CHECK(!shipped_rules(g).rules.empty());
}

TEST_CASE("rules: exp-product rewrites a match, and not a near miss", "[rules]") {
  GraphBuilder b("t");
  auto x = b.input("x", DType::Float32, {2, 3});
  auto y = b.input("y", DType::Float32, {2, 3});
  b.output(b.op("Mul", {b.op("Exp", {x}), b.op("Exp", {y})}));
  Model m = b.finish();
  RewriteResult r = rewrite_and_compare(m, shipped("exp-product"));
  CHECK(r.fired["exp-product"] == 1);
  CHECK(count_op(m.graph, "Exp") == 1);
  CHECK(count_op(m.graph, "Add") == 1);

  // Near miss: one Exp is also used elsewhere (rewriting would compute it twice).
  GraphBuilder b2("t2");
  x = b2.input("x", DType::Float32, {2, 3});
  y = b2.input("y", DType::Float32, {2, 3});
  auto ex = b2.op("Exp", {x});
  b2.output(b2.op("Mul", {ex, b2.op("Exp", {y})}));
  b2.output(ex);
  Model m2 = b2.finish();
  CHECK(apply_rules(m2.graph, shipped("exp-product")).applications == 0);
}

TEST_CASE("rules: commutative ops match in either operand order", "[rules]") {
  RuleSet rs = rules_of("rule mul-one: Mul(x, 1) => Relu(x)");
  GraphBuilder b("t");
  auto x = b.input("x", DType::Float32, {4});
  b.output(b.op("Mul", {b.scalar("one", 1.0f), x}));  // the constant first
  Model m = b.finish();
  CHECK(apply_rules(m.graph, rs, verified()).applications == 1);
  CHECK(count_op(m.graph, "Relu") == 1);
  // Sub is not commutative: Sub(1, x) does not match Sub(x, 1).
  RuleSet sub = rules_of("rule s: Sub(x, 1) => Relu(x)");
  GraphBuilder b2("t");
  x = b2.input("x", DType::Float32, {4});
  b2.output(b2.op("Sub", {b2.scalar("one", 1.0f), x}));
  Model m2 = b2.finish();
  CHECK(apply_rules(m2.graph, sub).applications == 0);
}

TEST_CASE("rules: identities and strength reduction", "[rules]") {
  GraphBuilder b("t");
  auto x = b.input("x", DType::Float32, {2, 3});
  auto t = b.op("Mul", {x, b.scalar("one", 1.0f)});
  t = b.op("Add", {t, b.scalar("zero", 0.0f)});
  t = b.op("Neg", {b.op("Neg", {t})});
  t = b.op("Pow", {t, b.scalar("two", 2.0f)});
  t = b.op("Div", {t, b.scalar("four", 4.0f)});
  b.output(b.op("Relu", {t}));
  Model m = b.finish();
  RewriteResult r = rewrite_and_compare(m, all_shipped_rules());
  CHECK(r.fired["mul-one"] == 1);
  CHECK(r.fired["add-zero"] == 1);
  CHECK(r.fired["neg-neg"] == 1);
  CHECK(r.fired["pow-two"] == 1);
  CHECK(r.fired["div-const"] == 1);
  CHECK(count_op(m.graph, "Mul") == 2);  // x*x, then *0.25
  CHECK(m.graph.num_nodes() == 3);
  // x/4 became x*0.25: the reciprocal is folded into a new constant.
  for (NodeId id : m.graph.node_ids()) {
    const Node& n = m.graph.node(id);
    if (n.op_type == "Mul" && n.inputs[0] != n.inputs[1]) {
      const Tensor* c = m.graph.constant_value(n.inputs[1]);
      REQUIRE(c);
      CHECK(c->as_double(0) == 0.25);
    }
  }
}

TEST_CASE("rules: a broadcasting identity is not removed (x*1 with a bigger 1)", "[rules]") {
  GraphBuilder b("t");
  auto x = b.input("x", DType::Float32, {3});
  b.output(b.op("Mul", {x, b.constant("ones", Tensor::from_vector<float>({2, 3}, {1, 1, 1, 1, 1, 1}))}));
  Model m = b.finish();
  CHECK(apply_rules(m.graph, shipped("mul-one")).applications == 0);
}

TEST_CASE("rules: Sub(x, x) becomes zeros of x's shape", "[rules]") {
  GraphBuilder b("t");
  auto x = b.input("x", DType::Float32, {2, 2});
  b.output(b.op("Relu", {b.op("Sub", {x, x})}));
  Model m = b.finish();
  rewrite_and_compare(m, shipped("sub-self"));
  CHECK(count_op(m.graph, "Sub") == 0);
}

TEST_CASE("rules: associativity folds constants together", "[rules]") {
  GraphBuilder b("t");
  auto x = b.input("x", DType::Float32, {2, 3});
  b.output(b.op("Mul", {b.op("Mul", {x, b.scalar("c1", 3.0f)}), b.scalar("c2", 5.0f)}));
  Model m = b.finish();
  rewrite_and_compare(m, shipped("mul-const-assoc"));
  REQUIRE(count_op(m.graph, "Mul") == 1);
  const Node& n = m.graph.node(m.graph.node_ids()[0]);
  CHECK(m.graph.constant_value(n.inputs[1])->as_double(0) == 15.0);
}

TEST_CASE("rules: distributivity and MatMuls sharing an input", "[rules]") {
  GraphBuilder b("t");
  auto x = b.input("x", DType::Float32, {2, 4});
  auto a = b.input("a", DType::Float32, {2, 4});
  auto w1 = b.weight("w1", {4, 3}), w2 = b.weight("w2", {4, 3});
  auto y = b.input("y", DType::Float32, {2, 4});
  b.output(b.op("Add", {b.op("MatMul", {x, w1}), b.op("MatMul", {x, w2})}));
  b.output(b.op("Add", {b.op("Mul", {a, y}), b.op("Mul", {x, a})}));
  Model m = b.finish();
  RewriteResult r = rewrite_and_compare(m, all_shipped_rules());
  CHECK(r.fired["matmul-shared-input"] == 1);
  CHECK(r.fired["distribute-mul"] == 1);
  CHECK(count_op(m.graph, "MatMul") == 1);
  CHECK(count_op(m.graph, "Mul") == 1);
}

TEST_CASE("rules: sqrt-product requires non-negative operands", "[rules]") {
  auto build = [](bool relu) {
    GraphBuilder b("t");
    auto x = b.input("x", DType::Float32, {4});
    auto y = b.input("y", DType::Float32, {4});
    if (relu) x = b.op("Relu", {x}), y = b.op("Exp", {y});
    b.output(b.op("Mul", {b.op("Sqrt", {x}), b.op("Sqrt", {y})}));
    return b.finish();
  };
  Model yes = build(true), no = build(false);
  CHECK(apply_rules(yes.graph, shipped("sqrt-product")).applications == 1);
  CHECK(apply_rules(no.graph, shipped("sqrt-product")).applications == 0);
}

TEST_CASE("rules: data movement (Transpose pairs, Reshape pairs, Identity, Cast, Squeeze/Unsqueeze)", "[rules]") {
  GraphBuilder b("t");
  auto x = b.input("x", DType::Float32, {2, 3, 4});
  auto t = b.op("Transpose", {x}, GraphBuilder::attrs({{"perm", A::is({1, 0, 2})}}));
  t = b.op("Transpose", {t}, GraphBuilder::attrs({{"perm", A::is({1, 0, 2})}}));
  t = b.op("Identity", {t});
  t = b.op("Cast", {t}, GraphBuilder::attrs({{"to", A::i(1)}}));
  t = b.op("Reshape", {t, b.ints("s1", {6, 4})});
  t = b.op("Reshape", {t, b.ints("s2", {4, 6})});
  t = b.op("Unsqueeze", {t, b.ints("ax", {0})});
  t = b.op("Squeeze", {t, b.ints("ax2", {0})});
  b.output(b.op("Relu", {t}));
  Model m = b.finish();
  RewriteResult r = rewrite_and_compare(m, all_shipped_rules());
  CHECK(r.fired["transpose-transpose"] == 1);
  CHECK(r.fired["transpose-identity"] == 1);
  CHECK(r.fired["identity"] == 1);
  CHECK(r.fired["cast-noop"] == 1);
  CHECK(r.fired["reshape-reshape"] == 1);
  CHECK(r.fired["unsqueeze-squeeze"] == 1);
  CHECK(m.graph.num_nodes() == 2);  // Reshape, Relu
}

TEST_CASE("rules: a Transpose folds into Gemm only for 2-D MatMuls", "[rules]") {
  GraphBuilder b("t", 17);
  auto a = b.input("a", DType::Float32, {4, 3});
  auto w = b.input("w", DType::Float32, {4, 5});
  b.output(b.op("MatMul", {b.op("Transpose", {a}, GraphBuilder::attrs({{"perm", A::is({1, 0})}})), w}));
  Model m = b.finish();
  rewrite_and_compare(m, shipped("matmul-transpose-a"));
  CHECK(count_op(m.graph, "Gemm") == 1);

  GraphBuilder b3("t3", 17);
  auto a3 = b3.input("a", DType::Float32, {2, 4, 3});
  auto w3 = b3.input("w", DType::Float32, {2, 4, 5});
  b3.output(b3.op("MatMul", {b3.op("Transpose", {a3}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1})}})), w3}));
  Model m3 = b3.finish();
  CHECK(apply_rules(m3.graph, all_shipped_rules()).fired.count("matmul-transpose-a") == 0);
}

TEST_CASE("rules: LayerNormalization recognised at opset 17, not at 13", "[rules]") {
  auto build = [](int64_t opset) {
    GraphBuilder b("ln", opset);
    auto x = b.input("x", DType::Float32, {2, 3, 8});
    Attributes ax = GraphBuilder::attrs({{"axes", A::is({-1})}});
    auto mean = b.op("ReduceMean", {x}, ax);
    auto d = b.op("Sub", {x, mean});
    auto var = b.op("ReduceMean", {b.op("Pow", {d, b.scalar("two", 2.0f)})}, ax);
    auto den = b.op("Sqrt", {b.op("Add", {var, b.scalar("eps", 1e-5f)})});
    auto y = b.op("Add", {b.op("Mul", {b.op("Div", {d, den}), b.uniform("gamma", {8}, 0.5f, 1.5f)}), b.weight("beta", {8}, 0.1f)});
    b.output(y);
    return b.finish();
  };
  Model m17 = build(17), m13 = build(13);
  RewriteResult r = rewrite_and_compare(m17, shipped("layernorm"));
  CHECK(r.fired["layernorm"] == 1);
  CHECK(m17.graph.num_nodes() == 1);
  const Node& ln = m17.graph.node(m17.graph.node_ids()[0]);
  CHECK(ln.op_type == "LayerNormalization");
  CHECK(ln.attrs.get_int("axis", 0) == 2);
  CHECK(ln.attrs.get_float("epsilon", 0) == Approx(1e-5f));
  CHECK(apply_rules(m13.graph, shipped("layernorm")).applications == 0);
}

TEST_CASE("rules: GELU (erf and tanh forms) recognised at opset 20 only", "[rules]") {
  auto build = [](int64_t opset, bool tanh_form) {
    GraphBuilder b("g", opset);
    auto x = b.input("x", DType::Float32, {2, 5});
    std::string y;
    if (!tanh_form) {
      auto e = b.op("Erf", {b.op("Div", {x, b.scalar("s2", 1.41421356237f)})});
      y = b.op("Mul", {b.op("Mul", {x, b.op("Add", {e, b.scalar("one", 1.0f)})}), b.scalar("half", 0.5f)});
    } else {
      auto half = b.op("Mul", {b.scalar("half", 0.5f), x});
      auto inner = b.op("Add", {x, b.op("Mul", {b.scalar("k", 0.044715f), b.op("Pow", {x, b.scalar("three", 3.0f)})})});
      auto t = b.op("Tanh", {b.op("Mul", {b.scalar("c", 0.7978845608f), inner})});
      y = b.op("Mul", {half, b.op("Add", {b.scalar("one", 1.0f), t})});
    }
    b.output(y);
    return b.finish();
  };
  for (bool tanh_form : {false, true}) {
    Model m20 = build(20, tanh_form), m17 = build(17, tanh_form);
    RuleSet rec = shipped_rules("recognition");
    rewrite_and_compare(m20, rec, 1e-3);
    CHECK(count_op(m20.graph, "Gelu") == 1);
    CHECK(m20.graph.num_nodes() == 1);
    apply_rules(m17.graph, rec);
    CHECK(count_op(m17.graph, "Gelu") == 0);
  }
}

TEST_CASE("rules: HardSwish and HardSigmoid recognised", "[rules]") {
  GraphBuilder b("h", 17);
  auto x = b.input("x", DType::Float32, {2, 6});
  auto clip = [&] { return b.op("Clip", {b.op("Add", {x, b.scalar("three", 3.0f)}), b.scalar("zero", 0.0f), b.scalar("six", 6.0f)}); };
  b.output(b.op("Div", {b.op("Mul", {x, clip()}), b.scalar("six_", 6.0f)}));
  b.output(b.op("Div", {clip(), b.scalar("six__", 6.0f)}));
  Model m = b.finish();
  rewrite_and_compare(m, shipped_rules("recognition"));
  CHECK(count_op(m.graph, "HardSwish") == 1);
  CHECK(count_op(m.graph, "HardSigmoid") == 1);
  CHECK(count_op(m.graph, "Clip") == 0);
}

TEST_CASE("rules: Softmax recognised from its decomposition", "[rules]") {
  GraphBuilder b("s", 13);
  auto x = b.input("x", DType::Float32, {2, 7});
  auto mx = b.op("ReduceMax", {x}, GraphBuilder::attrs({{"axes", A::is({1})}}));
  auto e = b.op("Exp", {b.op("Sub", {x, mx})});
  b.output(b.op("Div", {e, b.op("ReduceSum", {e, b.ints("ax", {-1})})}));
  Model m = b.finish();
  rewrite_and_compare(m, shipped("softmax"));
  CHECK(count_op(m.graph, "Softmax") == 1);
  CHECK(m.graph.num_nodes() == 1);
}

TEST_CASE("rules: BatchNormalization folds into the preceding Conv", "[rules]") {
  GraphBuilder b("bn", 13);
  auto x = b.input("x", DType::Float32, {1, 3, 6, 6});
  auto c = b.op("Conv", {x, b.weight("w", {4, 3, 3, 3}, 0.3f), b.weight("cb", {4}, 0.1f)},
                GraphBuilder::attrs({{"pads", A::is({1, 1, 1, 1})}}));
  b.output(b.op("BatchNormalization", {c, b.uniform("s", {4}, 0.5f, 1.5f), b.weight("bb", {4}, 0.1f), b.weight("mean", {4}, 0.1f),
                                        b.uniform("var", {4}, 0.5f, 1.5f)}));
  Model m = b.finish();
  rewrite_and_compare(m, shipped_rules("recognition"));
  CHECK(count_op(m.graph, "BatchNormalization") == 0);
  CHECK(count_op(m.graph, "Conv") == 1);
  CHECK(m.graph.num_nodes() == 1);
  CHECK(m.graph.node(m.graph.node_ids()[0]).attrs.get_ints("pads") == std::vector<int64_t>{1, 1, 1, 1});
}

TEST_CASE("rules: MatMul + Add becomes Gemm for 2-D operands only", "[rules]") {
  GraphBuilder b("g", 13);
  auto x = b.input("x", DType::Float32, {3, 4});
  b.output(b.op("Add", {b.op("MatMul", {x, b.weight("w", {4, 5})}), b.weight("bias", {5})}));
  auto x3 = b.input("x3", DType::Float32, {2, 3, 4});
  b.output(b.op("Add", {b.op("MatMul", {x3, b.weight("w3", {4, 5})}), b.weight("bias3", {5})}));
  Model m = b.finish();
  rewrite_and_compare(m, shipped("matmul-add-gemm"));
  CHECK(count_op(m.graph, "Gemm") == 1);
  CHECK(count_op(m.graph, "MatMul") == 1);
}

TEST_CASE("rules: guards (const, is_scalar, rank, dtype, single_use, opset, attributes)", "[rules]") {
  GraphBuilder b("g", 17);
  auto x = b.input("x", DType::Float32, {2, 3});
  auto c = b.scalar("c", 2.0f);
  auto y = b.op("Sub", {x, c});  // not commutative: a is x, k is c
  b.output(y);
  Model m = b.finish();
  NodeId mul = *m.graph.producer(y);
  auto matches = [&](const std::string& guard) {
    return rule_matches_at(m.graph, rules_of("rule r: Sub(a, k) => Relu(a) where " + guard).rules[0], mul);
  };
  CHECK(matches("const(k)"));
  CHECK_FALSE(matches("const(a)"));
  CHECK(matches("is_scalar(k)"));
  CHECK(matches("scalar(k, 2)"));
  CHECK_FALSE(matches("scalar(k, 3)"));
  CHECK(matches("rank(a) == 2"));
  CHECK_FALSE(matches("rank(a) == 3"));
  CHECK(matches("numel(a) == 6, last_dim(a) == 3, dim(a, 0) == 2"));
  CHECK(matches("dtype(a) == float32, is_float(a)"));
  CHECK_FALSE(matches("dtype(a) == float64"));
  CHECK(matches("single_use(k)"));
  CHECK(matches("broadcastable(a, k), broadcastable_to(k, a)"));
  CHECK_FALSE(matches("broadcastable_to(a, k)"));
  CHECK_FALSE(matches("same_shape(a, k)"));
  CHECK(matches("same_shape(a, root)"));
  CHECK(matches("opset() >= 17"));
  CHECK_FALSE(matches("opset() >= 18"));
  CHECK(matches("non_negative(k)"));
  CHECK_FALSE(matches("non_negative(a)"));
  CHECK(matches("not const(a)"));
  // Attribute matching: literal (absent = ONNX default) and binding.
  GraphBuilder b2("g2", 13);
  auto x2 = b2.input("x", DType::Float32, {2, 3});
  auto w2 = b2.weight("w", {3, 4});
  auto gm = b2.op("Gemm", {x2, w2}, GraphBuilder::attrs({{"alpha", A::f(0.5f)}}));
  b2.output(gm);
  Model m2 = b2.finish();
  NodeId gid = *m2.graph.producer(gm);
  auto gm_matches = [&](const std::string& pat, const std::string& guard = "") {
    return rule_matches_at(m2.graph, rules_of("rule r: " + pat + " => Relu(a)" + guard).rules[0], gid);
  };
  CHECK(gm_matches("Gemm<alpha=0.5>(a, w)"));
  CHECK_FALSE(gm_matches("Gemm<alpha=1.0>(a, w)"));
  CHECK(gm_matches("Gemm<transA=0, beta=1.0>(a, w)"));  // absent: defaults
  CHECK(gm_matches("Gemm<alpha=$al>(a, w)", " where $al < 1"));
  CHECK_FALSE(gm_matches("Gemm<alpha=$al>(a, w)", " where $al > 1"));
}

TEST_CASE("rules: the loop guard stops two rules that undo each other and names both", "[rules]") {
  RuleSet rs = rules_of(
      "rule swap-a: Sub(x, Relu(y)) => Neg(Sub(Relu(y), x))\n"
      "rule swap-b: Neg(Sub(Relu(y), x)) => Sub(x, Relu(y))\n");
  GraphBuilder b("loop");
  auto x = b.input("x", DType::Float32, {2});
  auto y = b.input("y", DType::Float32, {2});
  b.output(b.op("Sub", {x, b.op("Relu", {y})}));
  Model m = b.finish();
  RewriteResult r = apply_rules(m.graph, rs);
  CHECK(r.loop_stopped);
  CHECK(r.loop_rules == std::vector<std::string>{"swap-a", "swap-b"});
  CHECK_THAT(r.loop_message, Catch::Contains("swap-a") && Catch::Contains("swap-b"));
  m.graph.validate();
  RewriteOptions strict;
  strict.strict = true;
  CHECK_THROWS_AS(apply_rules(m.graph, rs, strict), Error);
}

TEST_CASE("rules: user rules override shipped ones with a warning (rule passes)", "[rules]") {
  register_rule_passes();
  std::string path = "/tmp/nnfuse_test_user.rules";
  {
    FILE* f = fopen(path.c_str(), "w");
    fputs("rule mul-one: Mul(x, 1) => Relu(x)\nrule my-neg: Neg(Relu(x)) => Neg(Relu(x)) where rank(x) == 99\n", f);
    fclose(f);
  }
  GraphBuilder b("u");
  auto x = b.input("x", DType::Float32, {3});
  b.output(b.op("Mul", {x, b.scalar("one", 1.0f)}));
  Model m = b.finish();
  PassContext ctx;
  ctx.model = &m;
  ctx.verify = true;
  ctx.user_rule_files = {path};
  Pipeline p = parse_pipeline("pipeline t\npass rules-algebraic\npass rules-user\n");
  PassManager().run(p, ctx);
  CHECK(ctx.rules_fired["mul-one"] == 1);
  CHECK(count_op(m.graph, "Relu") == 1);
  REQUIRE(!ctx.warnings.empty());
  CHECK_THAT(ctx.warnings[0], Catch::Contains("mul-one") && Catch::Contains("replaces"));
}

TEST_CASE("rules check: a wrong rule is caught with a counter-example, shipped rules pass", "[rules]") {
  RuleSet bad = rules_of("rule bad: Sub(x, y) => Sub(y, x)\nrule good: Neg(Neg(x)) => x\nrule never: Mul(x, y) => Mul(y, x) where rank(x) == 99\n");
  auto res = check_rules(bad);
  REQUIRE(res.size() == 3);
  CHECK(res[0].wrong);
  CHECK(res[0].max_abs_diff > 0);
  CHECK_THAT(res[0].counterexample, Catch::Contains("max abs diff"));
  CHECK_FALSE(res[1].wrong);
  CHECK(res[1].instances > 0);
  CHECK_FALSE(res[2].wrong);
  CHECK(res[2].instances == 0);
  for (auto& g : shipped_rule_groups()) {
    for (auto& r : check_rules(shipped_rules(g))) {
      INFO(r.rule << ": " << r.counterexample);
      CHECK_FALSE(r.wrong);
    }
  }
}

TEST_CASE("rules: timing of a generated 100k-node graph", "[rules][timing]") {
  // Built with the Graph API directly (GraphBuilder names nodes by a linear search).
  Model m;
  Graph& g = m.graph;
  g.opset_imports[""] = 17;
  g.add_input("x", TensorType::of(DType::Float32, {4}));
  g.set_initializer("one", Tensor::scalar<float>(1.0f));
  g.set_initializer("zero", Tensor::scalar<float>(0.0f));
  g.set_initializer("c", Tensor::scalar<float>(2.0f));
  int counter = 0;
  std::string t = "x";
  auto op = [&](const std::string& type, std::vector<std::string> ins) {
    std::string out = "v" + std::to_string(counter++);
    g.add_node(type, ins, {out}, {}, "n" + out);
    return out;
  };
  // 12.5k blocks of eight nodes: x*1, Neg(Neg(.)), .+0, (.*c)*c, Relu(Exp(.)): three remain.
  for (int i = 0; i < 12500; ++i) {
    t = op("Mul", {t, "one"});
    t = op("Neg", {op("Neg", {t})});
    t = op("Add", {t, "zero"});
    t = op("Mul", {op("Mul", {t, "c"}), "c"});
    t = op("Relu", {op("Exp", {t})});
  }
  g.add_output(t);
  infer_shapes(g);
  size_t before = g.num_nodes();
  RuleSet rules = all_shipped_rules();
  auto t0 = std::chrono::steady_clock::now();
  RewriteResult r = apply_rules(g, rules);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "rewrite of a generated " << before << "-node graph with " << rules.rules.size() << " rules: " << s << " s, "
            << r.applications << " applications, " << g.num_nodes() << " nodes after\n";
  CHECK(g.num_nodes() == 12500 * 3);
  CHECK_FALSE(r.loop_stopped);
  g.validate();
}

TEST_CASE("rules: tiny zoo models keep their outputs and lose operators", "[rules][zoo]") {
  for (int64_t opset : {13, 17, 20}) {
    for (auto& e : zoo_models()) {
      if (!e.tiny) continue;
      ZooOptions opt;
      opt.opset = opset;
      Model m = build_zoo_model(e.name, opt);
      Graph before = m.graph;
      RuleSet rules = all_shipped_rules();
      RewriteOptions ro;
      ro.verify = true;
      RewriteResult r = apply_rules(m.graph, rules, ro);
      infer_shapes(m.graph);
      INFO(e.name << " opset " << opset);
      CHECK_FALSE(r.loop_stopped);
      CHECK(m.graph.num_nodes() <= before.num_nodes());
      std::string fired;
      for (auto& [k, v] : r.fired) fired += " " + k + "=" + std::to_string(v);
      std::cout << e.name << " opset " << opset << ": " << before.num_nodes() << " -> " << m.graph.num_nodes() << " nodes;" << fired << "\n";
      TensorMap feeds = random_feeds(before, 3);
      TensorMap a = run_reference(before, feeds), b = run_reference(m.graph, feeds);
      for (auto& [name, t] : a) {
        REQUIRE(b.count(name));
        const Tensor& u = b.at(name);
        REQUIRE(u.shape() == t.shape());
        if (!dtype_is_float(t.dtype())) continue;
        double maxabs = 0, scale = 0;
        for (int64_t i = 0; i < t.numel(); ++i) {
          maxabs = std::max(maxabs, std::fabs(t.as_double(i) - u.as_double(i)));
          scale = std::max(scale, std::fabs(t.as_double(i)));
        }
        INFO("output " << name << " max abs diff " << maxabs << " (max |value| " << scale << ")");
        CHECK(maxabs <= 1e-4 * std::max(1.0, scale));
      }
    }
  }
}

TEST_CASE("rules: literal matching is relative (an epsilon is not zero)", "[rules]") {
  GraphBuilder b("eps");
  auto x = b.input("x", DType::Float32, {3});
  b.output(b.op("Relu", {b.op("Add", {x, b.scalar("eps", 1e-6f)})}));
  b.output(b.op("Relu", {b.op("Mul", {x, b.scalar("almost_one", 1.0f + 1e-7f)})}));  // float rounding of a literal 1
  Model m = b.finish();
  RewriteResult r = apply_rules(m.graph, all_shipped_rules());
  CHECK(r.fired.count("add-zero") == 0);
  CHECK(r.fired["mul-one"] == 1);
}

// The expanded AffineGrid node tests slice a shape vector of unknown length (Concat of [1] dims
// and a "?" dim): the Slice's output is "?" too, but it drops elements. same_shape(x, root) took
// the two unknown dims as equal, slice-all removed the Slice, and ConstantOfShape made a rank-5
// tensor where a rank-3 one was meant.
TEST_CASE("rules: same_shape never takes two unknown dims as equal (slice-all keeps a real Slice)", "[rules]") {
  GraphBuilder b("slice-unknown");
  auto w = b.input("w", DType::Int64, {Dim()});  // a shape vector of unknown length
  auto shape = b.op("Concat", {b.ints("lead", {1, 1}), w}, GraphBuilder::attrs({{"axis", A::i(0)}}));
  auto tail = b.op("Slice", {shape, b.ints("starts", {2}), b.ints("ends", {5})});
  b.output(b.op("ConstantOfShape", {tail}));
  Model m = b.finish();
  INFO("Concat " << m.graph.type(shape).str() << ", Slice " << m.graph.type(tail).str());
  REQUIRE(m.graph.type(shape).rank() == 1);
  REQUIRE_FALSE(m.graph.type(shape).dims[0].known());
  REQUIRE(m.graph.type(tail).rank() == 1);
  REQUIRE_FALSE(m.graph.type(tail).dims[0].known());
  Graph before = m.graph;
  NodeId slice = *m.graph.producer(tail);
  CHECK_FALSE(rule_matches_at(m.graph, rules_of("rule r: Slice(x, s, e) => x where same_shape(x, root)").rules[0], slice));
  RewriteResult r = apply_rules(m.graph, all_shipped_rules(), verified());
  CHECK(r.fired.count("slice-all") == 0);
  CHECK(count_op(m.graph, "Slice") == 1);
  TensorMap feeds{{"w", Tensor::from_vector<int64_t>({3}, {2, 3, 4})}};
  TensorMap want = run_reference(before, feeds), got = run_reference(m.graph, feeds);
  REQUIRE(want.begin()->second.shape() == Shape{2, 3, 4});
  REQUIRE(got.begin()->second.shape() == Shape{2, 3, 4});

  // Known equal dims are still proof: slicing all of a [2, 3] tensor goes away.
  GraphBuilder k("slice-known");
  auto x = k.input("x", DType::Float32, {2, 3});
  k.output(k.op("Relu", {k.op("Slice", {x, k.ints("s", {0}), k.ints("e", {2})})}));
  Model mk = k.finish();
  CHECK(rewrite_and_compare(mk, shipped("slice-all")).applications == 1);
  CHECK(count_op(mk.graph, "Slice") == 0);
}
