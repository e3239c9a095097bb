// Values an If/Loop/Scan body reads from the enclosing graph by name are dependencies like node
// inputs: the graph queries (topo_order, successors, predecessors, reaches, has_cycle) and the
// reference interpreter, which runs nodes in topo_order, must see them. Rewrites add nodes with
// new, higher ids, so a body read's producer can have a higher id than its reader: ties broken
// by id alone would put the reader first.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>

#include "graph/builder.h"
#include "graph/interpreter.h"

using namespace nnfuse;

namespace {
TensorType f32(std::vector<Dim> d) { return TensorType(DType::Float32, std::move(d)); }

// A body reading `outer` from the enclosing scope: out = op(outer).
std::shared_ptr<Graph> body_reading(const std::string& outer, const std::string& op, const std::string& out) {
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->opset_imports[""] = 17;
  body->declare_value(outer, f32({2}));  // produced by no node of the body: an outer reference
  body->add_node(op, {outer}, {out});
  body->set_type(out, f32({2}));
  body->add_output(out);
  return body;
}

Attributes if_branches(const std::string& outer) {
  Attributes a;
  a.set("then_branch", Attribute::make_graph(body_reading(outer, "Identity", "then_out")));
  a.set("else_branch", Attribute::make_graph(body_reading(outer, "Neg", "else_out")));
  return a;
}

size_t pos(const std::vector<NodeId>& order, NodeId id) {
  auto it = std::find(order.begin(), order.end(), id);
  REQUIRE(it != order.end());
  return size_t(it - order.begin());
}

bool contains(const std::vector<NodeId>& v, NodeId id) { return std::find(v.begin(), v.end(), id) != v.end(); }

// If (id 0) whose branches read `late`; Relu (id 1, added after the If as a rewrite would) makes
// `late` from x; Add joins the two.
Graph late_producer() {
  Graph g;
  g.add_input("x", f32({2}));
  g.add_input("cond", TensorType(DType::Bool, {}));
  g.add_node("If", {"cond"}, {"y"}, if_branches("late"), "if");
  g.add_node("Relu", {"x"}, {"late"}, {}, "relu");
  g.add_node("Add", {"y", "late"}, {"out"}, {}, "add");
  g.add_output("out");
  return g;
}
}  // namespace

TEST_CASE("a body read is an edge from the value's producer to the node holding the body", "[ir][subgraph]") {
  Graph g = late_producer();
  NodeId iff = g.find_node("if"), relu = g.find_node("relu"), add = g.find_node("add");
  REQUIRE(relu > iff);  // the case a tie-break by id gets wrong
  REQUIRE_NOTHROW(g.validate());
  auto order = g.topo_order();
  CHECK(pos(order, relu) < pos(order, iff));
  CHECK(pos(order, iff) < pos(order, add));
  CHECK(contains(g.successors(relu), iff));
  CHECK(contains(g.predecessors(iff), relu));
  CHECK(g.reaches(relu, iff));
  CHECK_FALSE(g.reaches(iff, relu));
  CHECK_FALSE(g.has_cycle());
  // The BGL edge set itself stays node inputs only (validate() checks it against them).
  CHECK(g.predecessors(relu).empty());
  // A copy has the same dependencies.
  Graph c = g;
  CHECK(c.topo_order() == order);
  CHECK(c.reaches(relu, iff));
}

TEST_CASE("a read by a body nested in a body is an edge to the outermost holder", "[ir][subgraph]") {
  Graph g;
  g.add_input("x", f32({2}));
  g.add_input("cond", TensorType(DType::Bool, {}));
  // The outer If's then-branch holds an inner If whose branches read `late` two scopes out.
  auto then_b = std::make_shared<Graph>();
  then_b->is_subgraph = true;
  then_b->add_input("inner_cond", TensorType(DType::Bool, {}));  // a body-local value, not a read
  then_b->add_node("If", {"inner_cond"}, {"inner_y"}, if_branches("late"), "inner_if");
  then_b->add_output("inner_y");
  Attributes a;
  a.set("then_branch", Attribute::make_graph(then_b));
  a.set("else_branch", Attribute::make_graph(body_reading("x", "Neg", "else_out")));
  NodeId iff = g.add_node("If", {"cond"}, {"y"}, a, "if");
  NodeId relu = g.add_node("Relu", {"x"}, {"late"}, {}, "relu");
  g.add_output("y");
  auto order = g.topo_order();
  CHECK(pos(order, relu) < pos(order, iff));
  CHECK(g.reaches(relu, iff));
  CHECK(contains(g.successors(relu), iff));
}

TEST_CASE("has_cycle and topo_order see a cycle closed by a body read", "[ir][subgraph]") {
  // relu reads the If's output and the If's bodies read relu's output: If -> relu -> (read) If.
  Graph g;
  g.add_input("cond", TensorType(DType::Bool, {}));
  NodeId iff = g.add_node("If", {"cond"}, {"y"}, if_branches("late"), "if");
  NodeId relu = g.add_node("Relu", {"y"}, {"late"}, {}, "relu");
  g.add_output("late");
  std::vector<NodeId> cyc;
  REQUIRE(g.has_cycle(&cyc));
  CHECK(contains(cyc, iff));
  CHECK(contains(cyc, relu));
  CHECK(g.reaches(iff, relu));
  CHECK(g.reaches(relu, iff));
  CHECK_THROWS_WITH(g.topo_order(), Catch::Contains("cycle"));
  CHECK_THROWS_WITH(g.validate(), Catch::Contains("cycle"));
  // Rewiring the Relu to a graph input breaks the cycle.
  g.add_input("x", f32({2}));
  g.set_input(relu, 0, "x");
  CHECK_FALSE(g.has_cycle());
  CHECK_FALSE(g.reaches(iff, relu));
}

TEST_CASE("body-read edges follow edits of the graph and of its bodies", "[ir][subgraph]") {
  Graph g = late_producer();
  NodeId iff = g.find_node("if");
  REQUIRE(pos(g.topo_order(), g.find_node("relu")) < pos(g.topo_order(), iff));
  // Replace the producer (a rewrite): the new one has a higher id still and must come first.
  NodeId relu = g.find_node("relu");
  NodeId sig = g.replace_node(relu, "Sigmoid", {"x"}, {});
  CHECK(pos(g.topo_order(), sig) < pos(g.topo_order(), iff));
  CHECK(g.reaches(sig, iff));
  // A node input that both an input edge and a body read carry counts once on each side.
  NodeId both = g.add_node("Custom", {"late"}, {"z"}, if_branches("late"), "both", "test.domain");
  CHECK(pos(g.topo_order(), sig) < pos(g.topo_order(), both));
  g.remove_node(both);
  // Edit a body in place: its then-branch now also reads `extra`, made by a new node.
  NodeId extra = g.add_node("Exp", {"x"}, {"extra"}, {}, "exp");
  CHECK_FALSE(g.reaches(extra, iff));
  Graph& then_b = *g.node(iff).attrs.find("then_branch")->g;
  then_b.declare_value("extra", f32({2}));
  then_b.add_node("Add", {"then_out", "extra"}, {"then_out2"});
  CHECK(g.reaches(extra, iff));
  CHECK(pos(g.topo_order(), extra) < pos(g.topo_order(), iff));
  // Replace the bodies through attrs(): the new ones read only the graph input x (no producer).
  g.attrs(iff).set("then_branch", Attribute::make_graph(body_reading("x", "Neg", "t")));
  CHECK_FALSE(g.reaches(extra, iff));
  CHECK(g.reaches(sig, iff));  // the else-branch still reads `late`
  g.attrs(iff).set("else_branch", Attribute::make_graph(body_reading("x", "Neg", "e")));
  CHECK_FALSE(g.reaches(sig, iff));
  CHECK(g.successors(sig) == std::vector<NodeId>{g.find_node("add")});
}

TEST_CASE("If: the interpreter runs a body read's producer first though its id is higher", "[ops][control][subgraph]") {
  GraphBuilder b("late_producer", 17);
  auto x = b.input("x", DType::Float32, {2});
  auto cond = b.input("cond", DType::Bool, {});
  b.graph().declare_value("late", f32({2}));
  auto y = b.op("If", {cond}, if_branches("late"), "if");
  b.graph().add_node("Relu", {x}, {"late"}, {}, "relu");  // added after the If, as a rewrite would
  b.output(b.op("Add", {y, "late"}, {}, "add"));
  Model m = b.finish();
  REQUIRE(m.graph.find_node("relu") > m.graph.find_node("if"));
  auto out = m.graph.outputs().front();
  TensorMap feeds{{x, Tensor::from_vector<float>({2}, {-1.5f, 2.f})}};
  feeds[cond] = Tensor::scalar<bool>(true);  // Identity(relu(x)) + relu(x)
  CHECK(run_reference(m.graph, feeds).at(out).to_float_vector() == std::vector<float>{0.f, 4.f});
  feeds[cond] = Tensor::scalar<bool>(false);  // Neg(relu(x)) + relu(x)
  CHECK(run_reference(m.graph, feeds).at(out).to_float_vector() == std::vector<float>{0.f, 0.f});
}
