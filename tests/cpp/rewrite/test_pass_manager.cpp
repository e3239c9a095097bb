#include <catch2/catch.hpp>

#include "graph/builder.h"
#include "rewrite/pass.h"

using namespace nnfuse;

namespace {
Model small_model() {
  GraphBuilder b("pm");
  auto x = b.input("x", DType::Float32, {2, 4});
  auto r = b.op("Relu", {x}, {}, "relu");
  auto i = b.op("Identity", {r}, {}, "ident");
  b.output(b.op("Neg", {i}, {}, "neg"));
  return b.finish();
}

// Test passes, registered once: one that removes Identity nodes, one that changes nothing, one
// that requires shapes.
void register_test_passes() {
  static bool done = false;
  if (done) return;
  done = true;
  register_pass({"test-drop-identity", "bypass Identity nodes", {}, {}, false}, [](PassContext& ctx, const PassArgs&) {
    Graph& g = ctx.graph();
    for (NodeId id : g.node_ids()) {
      const Node& n = g.node(id);
      if (n.op_type != "Identity") continue;
      std::string in = n.inputs[0], out = n.outputs[0];
      g.remove_node(id, false);
      g.replace_all_uses(out, in);
    }
    g.prune_values();
  });
  register_pass({"test-nothing", "looks but never touches", {}, {}, false}, [](PassContext&, const PassArgs&) {});
  PassInfo needs{"test-needs-shapes", "requires inferred shapes", {"shapes"}, {}, false};
  needs.check_args = [](const PassArgs& a) { a.get_int("times", 1); };
  register_pass(needs, [](PassContext& ctx, const PassArgs& a) {
    REQUIRE(ctx.valid.count("shapes"));
    ctx.rules_fired["needs-shapes-ran"] += int(a.get_int("times", 1));
  });
}
}  // namespace

TEST_CASE("the structural hash ignores names and sees structure", "[passes]") {
  Model a = small_model();
  Model b = small_model();
  REQUIRE(structural_hash(a.graph) == structural_hash(b.graph));
  b.graph.set_node_name(b.graph.find_node("relu"), "renamed");
  REQUIRE(structural_hash(a.graph) == structural_hash(b.graph));
  b.graph.attrs(b.graph.find_node("neg")).set("x", Attribute::make_int(1));
  REQUIRE(structural_hash(a.graph) != structural_hash(b.graph));
}

TEST_CASE("the manager records change, time and requirements", "[passes]") {
  register_test_passes();
  Model m = small_model();
  PassContext ctx;
  ctx.model = &m;
  ctx.verify = true;
  Pipeline p = parse_pipeline("pipeline t\npass test-nothing\npass test-drop-identity\npass test-needs-shapes times=3\n");
  auto recs = PassManager().run(p, ctx);
  REQUIRE(recs.size() == 4);  // infer-shapes inserted before test-needs-shapes
  REQUIRE(recs[0].name == "test-nothing");
  REQUIRE_FALSE(recs[0].changed);
  REQUIRE(recs[1].name == "test-drop-identity");
  REQUIRE(recs[1].changed);
  REQUIRE(recs[1].nodes_before == 3);
  REQUIRE(recs[1].nodes_after == 2);
  REQUIRE(recs[2].name == "infer-shapes");
  REQUIRE(recs[2].auto_inserted);
  REQUIRE(recs[3].name == "test-needs-shapes");
  REQUIRE(ctx.rules_fired["needs-shapes-ran"] == 3);
  // Shapes stay valid until a pass changes the IR.
  auto again = PassManager().run(parse_pipeline("pipeline t2\npass test-needs-shapes\n"), ctx);
  REQUIRE(again.size() == 1);
  // A pass that declares no argument check takes no arguments: a typo is an error naming the line.
  REQUIRE_THROWS_WITH(PassManager().run(parse_pipeline("pipeline t3\npass test-nothing\npass test-nothing verbose=1\n", "t3.pipeline"), ctx),
                      Catch::Contains("t3.pipeline:3") && Catch::Contains("takes no arguments") && Catch::Contains("verbose=1"));
}

TEST_CASE("pipeline files parse with clear errors", "[passes][parse]") {
  Pipeline p = parse_pipeline("# header\npipeline resnet  # trailing comment\nclass residual_cnn\ndescription folds BN first\n\npass a k=1 flag=true\npass b\n", "x.pipeline");
  REQUIRE(p.name == "resnet");
  REQUIRE(p.network_class == "residual_cnn");
  REQUIRE(p.description == "folds BN first");
  REQUIRE(p.steps.size() == 2);
  REQUIRE(p.steps[0].args.get("k") == "1");
  REQUIRE(p.steps[0].args.get_bool("flag", false));
  REQUIRE(p.steps[1].line == 7);

  auto expect_error = [](const std::string& text, const std::string& where, const std::string& what) {
    try {
      parse_pipeline(text, "bad.pipeline");
      FAIL("accepted: " << text);
    } catch (const Error& e) {
      REQUIRE(e.kind() == ErrorKind::Parse);
      REQUIRE_THAT(e.what(), Catch::Contains(where) && Catch::Contains(what));
    }
  };
  expect_error("pipeline x\nfrobnicate y\n", "bad.pipeline:2:1", "expected 'pipeline', 'class', 'description' or 'pass'");
  expect_error("pipeline x\npass a k\n", "bad.pipeline:2:8", "expected key=value");
  expect_error("pipeline x\npass\n", "bad.pipeline:2:5", "expected a pass name");
  expect_error("pass a\n", "bad.pipeline:1:1", "missing 'pipeline NAME'");
  expect_error("pipeline a b\n", "bad.pipeline:1:1", "expected 'pipeline NAME'");
}

TEST_CASE("an unknown pass fails before anything runs, naming the line", "[passes][parse]") {
  register_test_passes();
  Model m = small_model();
  PassContext ctx;
  ctx.model = &m;
  Pipeline p = parse_pipeline("pipeline t\npass test-drop-identity\npass no-such-pass\n", "p.pipeline");
  REQUIRE_THROWS_WITH(PassManager().run(p, ctx), Catch::Contains("p.pipeline:3") && Catch::Contains("no-such-pass"));
  REQUIRE(m.graph.num_nodes() == 3);  // nothing ran
}

TEST_CASE("pass arguments are typed", "[passes]") {
  PassArgs a;
  a.values["n"] = "12";
  a.values["bad"] = "1x";
  REQUIRE(a.get_int("n", 0) == 12);
  REQUIRE(a.get_int("missing", 5) == 5);
  REQUIRE_THROWS_AS(a.get_int("bad", 0), Error);
  REQUIRE_THROWS_AS(a.get_bool("n", false), Error);
}

namespace {
// A chain of `n` Add nodes, each adding its own small weight (value names from `prefix`), ending
// in a MatMul by one large weight: more values than the hash's first table holds, so its name
// table must grow.
Model chain_model(const std::string& prefix, int n, const Tensor& big) {
  GraphBuilder b("chain");
  auto x = b.input(prefix + "x", DType::Float32, {1, 256});
  for (int k = 0; k < n; ++k)
    x = b.op("Add", {x, b.constant(prefix + "w" + std::to_string(k), Tensor::from_vector<float>({256}, std::vector<float>(256, float(k))))});
  b.output(b.op("MatMul", {x, b.constant(prefix + "big", big)}));
  return b.finish();
}
}  // namespace

TEST_CASE("the structural hash ignores value names, sees small weights' contents and big weights' buffers", "[passes]") {
  Tensor big(DType::Float32, {256, 8});  // 8 KiB: hashed by buffer identity
  Model a = chain_model("a_", 100, big);
  Model b = chain_model("other_prefix_", 100, big);
  REQUIRE(structural_hash(a.graph) == structural_hash(b.graph));
  REQUIRE(structural_hash(a.graph) == structural_hash(a.graph));
  // Same names, one small weight's value differs: a different graph.
  Model c = chain_model("a_", 100, big);
  Tensor w = c.graph.initializer("a_w57").clone();
  w.data<float>()[3] = -1.f;
  c.graph.set_initializer("a_w57", w);
  REQUIRE(structural_hash(a.graph) != structural_hash(c.graph));
  // An equal small weight in a new buffer (what folding produces) is the same graph.
  Model d = chain_model("a_", 100, big);
  d.graph.set_initializer("a_w57", d.graph.initializer("a_w57").clone());
  REQUIRE(structural_hash(a.graph) == structural_hash(d.graph));
  // A large weight is compared by buffer: passes never edit a weight in place.
  Model e = chain_model("a_", 100, big.clone());
  REQUIRE(structural_hash(a.graph) != structural_hash(e.graph));
  // One node fewer: different.
  REQUIRE(structural_hash(chain_model("a_", 99, big).graph) != structural_hash(a.graph));
}
