// Pass arguments that narrow a pass for a class pipeline: `rules-<group> only=/skip=` (a rule
// subset, parsed and matched alone), `cse initializers=/nodes=`, their checks before anything runs,
// and how a hybrid unites two pipelines' arguments.
#include <catch2/catch.hpp>

#include <map>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "rewrite/pass.h"
#include "rewrite/passes.h"
#include "rewrite/rule_passes.h"

using namespace nnfuse;

namespace {

// Pow(x, 2) (rule pow-two) and Div(y, 4) (rule div-const): two algebraic rules that both fire.
Model pow_and_div_model() {
  GraphBuilder b("args");
  auto x = b.input("x", DType::Float32, {2, 3});
  auto p = b.op("Pow", {x, b.scalar("two", 2.0f)});
  auto d = b.op("Div", {p, b.scalar("four", 4.0f)});
  b.output(b.op("Relu", {d}));
  return b.finish();
}

std::map<std::string, int> histogram(const Graph& g) {
  std::map<std::string, int> h;
  for (NodeId id : g.node_ids()) ++h[g.node(id).op_type];
  return h;
}

PassContext run_text(Model& m, const std::string& steps, const std::string& file = "<pipeline>") {
  register_structural_passes();
  register_rule_passes();
  PassContext ctx;
  ctx.model = &m;
  ctx.verify = true;
  ctx.valid.insert("shapes");
  PassManager().run(parse_pipeline("pipeline t\n" + steps, file), ctx);
  return ctx;
}

void require_same_outputs(const Graph& before, const Graph& after) {
  TensorMap feeds = random_feeds(before, 11);
  TensorMap want = run_reference(before, feeds), got = run_reference(after, feeds);
  for (auto& name : before.outputs()) {
    auto w = want.at(name).to_float_vector(), g = got.at(name).to_float_vector();
    REQUIRE(w.size() == g.size());
    for (size_t i = 0; i < w.size(); ++i) REQUIRE(g[i] == Approx(w[i]).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("a rule group with only= runs just those rules", "[passes][args]") {
  Model whole = pow_and_div_model();
  PassContext all = run_text(whole, "pass rules-algebraic\n");
  REQUIRE(all.rules_fired["pow-two"] == 1);
  REQUIRE(all.rules_fired["div-const"] == 1);

  Model m = pow_and_div_model();
  Graph before = m.graph;
  PassContext only = run_text(m, "pass rules-algebraic only=pow-two\n");
  REQUIRE(only.rules_fired == std::map<std::string, int>{{"pow-two", 1}});
  auto h = histogram(m.graph);
  REQUIRE(h["Pow"] == 0);
  REQUIRE(h["Div"] == 1);  // div-const was not run
  require_same_outputs(before, m.graph);

  Model s = pow_and_div_model();
  PassContext skip = run_text(s, "pass rules-algebraic skip=pow-two\n");
  REQUIRE(skip.rules_fired == std::map<std::string, int>{{"div-const", 1}});
  REQUIRE(histogram(s.graph)["Pow"] == 1);
}

TEST_CASE("rule subsets are parsed alone and match the whole file's rules", "[passes][args]") {
  for (auto& group : shipped_rule_groups()) {
    INFO("group " << group);
    const RuleSet& whole = shipped_rules(group);
    std::vector<std::string> names = shipped_rule_names(group);
    REQUIRE(names.size() == whole.rules.size());
    for (size_t i = 0; i < names.size(); ++i) REQUIRE(names[i] == whole.rules[i].name);
    // Every rule parsed on its own is the rule the whole file gives, at the same line.
    RuleSet each = shipped_rules_named(group, std::set<std::string>(names.begin(), names.end()));
    REQUIRE(each.rules.size() == whole.rules.size());
    for (size_t i = 0; i < names.size(); ++i) {
      REQUIRE(each.rules[i].name == whole.rules[i].name);
      REQUIRE(each.rules[i].line == whole.rules[i].line);
      REQUIRE(each.rules[i].text == whole.rules[i].text);
      REQUIRE(each.rules[i].pattern.str() == whole.rules[i].pattern.str());
      REQUIRE(each.rules[i].replacement.str() == whole.rules[i].replacement.str());
    }
  }
  RuleSet two = shipped_rules_named("recognition", {"bn-into-conv-bias", "bn-into-conv"});
  REQUIRE(two.rules.size() == 2);
  REQUIRE(two.rules[0].name == "bn-into-conv");  // the file's order, not the argument's
}

TEST_CASE("bad rule-pass arguments fail before anything runs, naming the line and the rules", "[passes][args][parse]") {
  auto expect_error = [](const std::string& steps, const std::vector<std::string>& parts) {
    Model m = pow_and_div_model();
    try {
      run_text(m, steps, "c.pipeline");
      FAIL("accepted: " << steps);
    } catch (const Error& e) {
      REQUIRE(e.kind() == ErrorKind::Parse);
      for (auto& p : parts) REQUIRE_THAT(e.what(), Catch::Contains(p));
    }
    REQUIRE(histogram(m.graph)["Pow"] == 1);  // the valid first step (pow-two) never ran either
  };
  expect_error("pass rules-algebraic only=pow-two\npass rules-algebraic only=pow-two,no-such-rule\n",
               {"c.pipeline:3", "rules-algebraic", "unknown rule 'no-such-rule'", "pow-two", "div-const"});
  expect_error("pass rules-algebraic only=pow-two\npass rules-recognition only=pow-two\n", {"c.pipeline:3", "unknown rule 'pow-two'", "bn-into-conv"});
  expect_error("pass rules-algebraic only=pow-two\npass rules-algebraic only=pow-two,\n", {"c.pipeline:3", "empty rule name"});
  expect_error("pass rules-algebraic only=pow-two\npass rules-algebraic onyl=pow-two\n", {"c.pipeline:3", "unknown argument 'onyl'"});
  expect_error("pass rules-algebraic only=pow-two\npass rules-algebraic only=pow-two skip=div-const\n", {"c.pipeline:3", "not both"});
  expect_error("pass rules-algebraic only=pow-two\npass cse nodes=maybe\n", {"c.pipeline:3", "cse", "not a boolean"});
  expect_error("pass rules-algebraic only=pow-two\npass cse values=false\n", {"c.pipeline:3", "unknown argument 'values'"});
}

TEST_CASE("cse halves can be switched off and report their merges apart", "[passes][args]") {
  auto model = [] {
    GraphBuilder b("cse_halves");
    auto x = b.input("x", DType::Float32, {2, 4});
    auto w1 = b.constant("w1", Tensor::from_vector<float>({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}));
    auto w2 = b.constant("w2", Tensor::from_vector<float>({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}));
    auto e1 = b.op("Exp", {x});
    auto e2 = b.op("Exp", {x});
    b.output(b.op("Add", {b.op("MatMul", {e1, w1}), b.op("MatMul", {e2, w2})}));
    return b.finish();
  };
  Model both = model();
  PassContext c = run_text(both, "pass cse\n");
  REQUIRE(c.rules_fired["cse-initializers"] == 1);
  REQUIRE(c.rules_fired["cse-nodes"] == 2);  // Exp, then the MatMuls once their inputs are equal
  Model no_inits = model();
  PassContext n = run_text(no_inits, "pass cse initializers=false\n");
  REQUIRE(n.rules_fired.count("cse-initializers") == 0);
  REQUIRE(n.rules_fired["cse-nodes"] == 1);  // the MatMuls read different initializers
  REQUIRE(no_inits.graph.initializer_names().size() == 2);
  Model no_nodes = model();
  PassContext i = run_text(no_nodes, "pass cse nodes=false\n");
  REQUIRE(i.rules_fired["cse-initializers"] == 1);
  REQUIRE(i.rules_fired.count("cse-nodes") == 0);
  REQUIRE(histogram(no_nodes.graph)["Exp"] == 2);
}

TEST_CASE("a hybrid unites two pipelines' arguments for a pass both list", "[passes][args]") {
  auto args = [](std::map<std::string, std::string> v) {
    PassArgs a;
    a.values = std::move(v);
    return a;
  };
  REQUIRE(unite_step_args(args({{"only", "a,b"}}), args({{"only", "c,a"}})).values ==
          std::map<std::string, std::string>{{"only", "a,b,c"}});
  // One side runs the whole pass: so does the union.
  REQUIRE(unite_step_args(args({{"only", "a"}}), args({})).values.empty());
  REQUIRE(unite_step_args(args({{"initializers", "false"}}), args({{"nodes", "false"}})).values.empty());
  REQUIRE(unite_step_args(args({{"initializers", "false"}}), args({{"initializers", "false"}})).values ==
          std::map<std::string, std::string>{{"initializers", "false"}});
}
