// The IR editing API and the validator. These tests use the Graph API directly (no op registry):
// the IR must hold any op type; schemas are checked by inference and the interpreter.
#include <catch2/catch.hpp>

#include <algorithm>

#include "graph/bgl.h"
#include "graph/graph.h"

using namespace nnfuse;

namespace {
TensorType f32(std::vector<Dim> d) { return TensorType(DType::Float32, std::move(d)); }

// x -> A -> a -> B -> b ; a -> C -> c ; (b, c) -> D -> out
Graph diamond() {
  Graph g;
  g.add_input("x", f32({2, 3}));
  g.add_node("Relu", {"x"}, {"a"}, {}, "A");
  g.add_node("Neg", {"a"}, {"b"}, {}, "B");
  g.add_node("Exp", {"a"}, {"c"}, {}, "C");
  g.add_node("Add", {"b", "c"}, {"out"}, {}, "D");
  g.add_output("out");
  return g;
}
bool has_msg(const Error& e, const std::string& s) { return std::string(e.what()).find(s) != std::string::npos; }
}  // namespace

TEST_CASE("empty graph validates", "[ir]") {
  Graph g;
  g.validate();
  REQUIRE(g.num_nodes() == 0);
  REQUIRE(g.topo_order().empty());
}

TEST_CASE("producer and consumer queries follow the tensors", "[ir]") {
  Graph g = diamond();
  g.validate();
  NodeId A = g.find_node("A"), B = g.find_node("B"), C = g.find_node("C"), D = g.find_node("D");
  REQUIRE(g.producer("a") == A);
  REQUIRE_FALSE(g.producer("x").has_value());
  auto uses = g.consumers("a");
  REQUIRE(uses.size() == 2);
  REQUIRE(g.successors(A) == std::vector<NodeId>{B, C});
  REQUIRE(g.predecessors(D) == std::vector<NodeId>{B, C});
  REQUIRE(g.value("b").uses == std::vector<Use>{{D, 0}});
  REQUIRE(g.value("c").uses == std::vector<Use>{{D, 1}});
  // The Boost.Graph storage mirrors the op-to-op uses: A->B, A->C, B->D, C->D.
  REQUIRE(boost::num_edges(g.impl().g) == 4);
  REQUIRE(boost::num_vertices(g.impl().g) == 4);
}

// topo_order is cached against the graph's revision (docs/design-notes.md): every edit that can
// change the order must be seen by the next query, and a copy must not answer from its source.
TEST_CASE("the cached topological order follows every edit", "[ir]") {
  Graph g = diamond();
  NodeId A = g.find_node("A"), B = g.find_node("B"), C = g.find_node("C"), D = g.find_node("D");
  REQUIRE(g.topo_order() == std::vector<NodeId>{A, B, C, D});
  REQUIRE(g.topo_order() == std::vector<NodeId>{A, B, C, D});  // from the cache
  // C now reads b: B must come before C even though nothing else changed.
  g.set_input(C, 0, "b");
  REQUIRE(g.topo_order() == std::vector<NodeId>{A, B, C, D});
  NodeId E = g.add_node("Sqrt", {"x"}, {"e"}, {}, "E");
  g.set_input(A, 0, "e");
  REQUIRE(g.topo_order() == std::vector<NodeId>{E, A, B, C, D});
  Graph copy = g;  // a fresh revision: the copy computes its own order
  REQUIRE(copy.topo_order().size() == 5);
  g.remove_node(D, /*drop_outputs=*/false);
  REQUIRE(g.topo_order() == std::vector<NodeId>{E, A, B, C});
  REQUIRE(copy.topo_order().size() == 5);
  REQUIRE_FALSE(g.has_cycle());
  // An edit that closes a cycle after an order was cached: E reads c, which depends on E.
  g.set_input(E, 0, "c");
  REQUIRE(g.has_cycle());
  REQUIRE_THROWS_AS(g.topo_order(), Error);
}

TEST_CASE("topological order is deterministic and respects edges", "[ir]") {
  Graph g;
  g.add_input("x", f32({1}));
  // Added in reverse dependency order: consumers first (as some files list nodes).
  g.declare_value("m");
  g.add_node("Neg", {"m"}, {"y"}, {}, "second");
  g.add_node("Relu", {"x"}, {"m"}, {}, "first");
  g.add_output("y");
  g.validate();
  auto order = g.topo_order();
  REQUIRE(order.size() == 2);
  REQUIRE(g.node(order[0]).name == "first");
  REQUIRE(g.node(order[1]).name == "second");
}

TEST_CASE("rewiring consumers keeps edges and uses in sync", "[ir]") {
  Graph g = diamond();
  NodeId D = g.find_node("D");
  // Bypass C: D reads a directly.
  g.replace_all_uses("c", "a");
  REQUIRE(g.node(D).inputs == std::vector<std::string>{"b", "a"});
  REQUIRE(g.consumers("c").empty());
  g.remove_node(g.find_node("C"));
  REQUIRE_FALSE(g.has_value("c"));
  g.validate();
  REQUIRE(g.num_nodes() == 3);
  REQUIRE(boost::num_edges(g.impl().g) == 3);

  g.set_input(D, 1, "x");
  g.validate();
  REQUIRE(g.consumers("x").size() == 2);
}

TEST_CASE("replacing graph outputs updates the output list", "[ir]") {
  Graph g = diamond();
  g.add_node("Identity", {"out"}, {"out2"}, {}, "I");
  g.replace_all_uses("out", "b");
  REQUIRE(g.outputs() == std::vector<std::string>{"b"});
  REQUIRE(g.node(g.find_node("I")).inputs[0] == "b");
  g.validate();
}

TEST_CASE("replace_node keeps output names and consumers", "[ir]") {
  Graph g = diamond();
  NodeId B = g.find_node("B");
  Attributes a;
  a.set("alpha", Attribute::make_float(0.1f));
  NodeId nb = g.replace_node(B, "LeakyRelu", {"a"}, a);
  REQUIRE(nb != B);
  REQUIRE_FALSE(g.has_node(B));
  REQUIRE(g.node(nb).op_type == "LeakyRelu");
  REQUIRE(g.node(nb).name == "B");
  REQUIRE(g.producer("b") == nb);
  REQUIRE(g.consumers("b").size() == 1);
  g.validate();
}

TEST_CASE("a copy is deep for structure and shares weights", "[ir]") {
  Graph g = diamond();
  g.set_initializer("w", Tensor::from_vector<float>({2}, {1.0f, 2.0f}));
  Graph h = g;
  h.remove_node(h.find_node("D"));
  REQUIRE(g.num_nodes() == 4);
  REQUIRE(h.num_nodes() == 3);
  REQUIRE(g.initializer("w").same_data(h.initializer("w")));
  g.validate();
}

TEST_CASE("subgraph bodies are deep-copied with their node", "[ir]") {
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->declare_value("outer");
  body->add_node("Neg", {"outer"}, {"o"}, {}, "inner");
  body->add_output("o");
  Graph g;
  g.add_input("cond", TensorType(DType::Bool, {}));
  g.add_input("outer", f32({1}));
  Attributes a;
  a.set("then_branch", Attribute::make_graph(body));
  a.set("else_branch", Attribute::make_graph(body));
  g.add_node("If", {"cond"}, {"r"}, a, "if");
  g.add_output("r");
  Graph h = g;
  auto* hb = h.node(h.find_node("if")).attrs.find("then_branch");
  REQUIRE(hb->g != body);
  REQUIRE(hb->g->num_nodes() == 1);
  REQUIRE(body->outer_references() == std::vector<std::string>{"outer"});
  body->validate();  // a body may read the enclosing scope
}

TEST_CASE("extract builds a standalone graph from a node set", "[ir]") {
  Graph g = diamond();
  g.set_initializer("w", Tensor::from_vector<float>({1}, {3.0f}));
  NodeId E = g.add_node("Mul", {"out", "w"}, {"z"}, {}, "E");
  g.set_outputs({"z"});
  Graph s = g.extract({g.find_node("B"), g.find_node("C"), g.find_node("D"), E});
  s.validate();
  REQUIRE(s.num_nodes() == 4);
  REQUIRE(s.inputs() == std::vector<std::string>{"a"});
  REQUIRE(s.is_initializer("w"));
  REQUIRE(s.outputs() == std::vector<std::string>{"z"});
}

TEST_CASE("cycle detection names the nodes on the cycle", "[ir][malformed]") {
  Graph g;
  g.add_input("x", f32({1}));
  g.declare_value("q");
  g.add_node("Add", {"x", "q"}, {"p"}, {}, "P");
  g.add_node("Relu", {"p"}, {"q"}, {}, "Q");
  g.add_output("q");
  std::vector<NodeId> cyc;
  REQUIRE(g.has_cycle(&cyc));
  REQUIRE(cyc.size() == 2);
  try {
    g.validate();
    FAIL("validate accepted a cycle");
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::Model);
    REQUIRE(has_msg(e, "cycle"));
    REQUIRE(has_msg(e, "P"));
    REQUIRE(has_msg(e, "Q"));
  }
  REQUIRE_THROWS_AS(g.topo_order(), Error);
}

TEST_CASE("reaches answers whether an edge would close a cycle", "[ir]") {
  Graph g = diamond();
  NodeId A = g.find_node("A"), D = g.find_node("D"), B = g.find_node("B"), C = g.find_node("C");
  REQUIRE(g.reaches(A, D));
  REQUIRE_FALSE(g.reaches(D, A));
  REQUIRE_FALSE(g.reaches(B, C));
  REQUIRE(g.reaches(B, D));
}

TEST_CASE("validator names dangling inputs", "[ir][malformed]") {
  Graph g;
  g.add_input("x", f32({1}));
  g.declare_value("ghost");
  g.add_node("Add", {"x", "ghost"}, {"y"}, {}, "adder");
  g.add_output("y");
  try {
    g.validate();
    FAIL("validate accepted a dangling input");
  } catch (const Error& e) {
    REQUIRE(e.kind() == ErrorKind::Model);
    REQUIRE(has_msg(e, "ghost"));
    REQUIRE(has_msg(e, "adder"));
    REQUIRE(has_msg(e, "dangling"));
  }
}

TEST_CASE("a tensor cannot be produced twice", "[ir][malformed]") {
  Graph g;
  g.add_input("x", f32({1}));
  g.add_node("Relu", {"x"}, {"y"}, {}, "one");
  try {
    g.add_node("Neg", {"x"}, {"y"}, {}, "two");
    FAIL("second producer accepted");
  } catch (const Error& e) {
    REQUIRE(has_msg(e, "produced twice"));
    REQUIRE(has_msg(e, "one"));
  }
  REQUIRE_THROWS_AS(g.add_node("Relu", {"nope"}, {"z"}, {}, "three"), Error);
  REQUIRE_THROWS_AS(g.add_node("Relu", {"y"}, {"x"}, {}, "four"), Error);  // inputs are not produced
}

TEST_CASE("validator finds outputs nothing produces", "[ir][malformed]") {
  Graph g;
  g.add_input("x", f32({1}));
  g.add_node("Relu", {"x"}, {"y"}, {}, "r");
  g.add_output("nowhere");
  REQUIRE_THROWS_WITH(g.validate(), Catch::Contains("nowhere"));
}

TEST_CASE("fresh names never collide", "[ir]") {
  Graph g = diamond();
  std::string n1 = g.fresh_name("a");
  REQUIRE(n1 != "a");
  g.declare_value(n1);
  std::string n2 = g.fresh_name("a");
  REQUIRE(n2 != n1);
  REQUIRE(g.fresh_name("brand_new") == "brand_new");
}

TEST_CASE("constant_value sees initializers and Constant nodes but not fed inputs", "[ir]") {
  Graph g;
  g.set_initializer("w", Tensor::from_vector<float>({1}, {2.0f}));
  g.set_initializer("w_in", Tensor::from_vector<float>({1}, {2.0f}));
  g.add_input("w_in", f32({1}));  // opset-9 style: initializer also listed as an input
  Attributes a;
  a.set("value", Attribute::make_tensor(Tensor::scalar<int64_t>(7)));
  g.add_node("Constant", {}, {"k"}, a, "c");
  REQUIRE(g.constant_value("w") != nullptr);
  REQUIRE(g.constant_value("k")->as_int() == 7);
  REQUIRE(g.constant_value("w_in") == nullptr);
}

TEST_CASE("tensor types print symbolic dims", "[ir]") {
  TensorType t(DType::Float32, {Dim::sym("N"), 3, Dim(), 224});
  REQUIRE(t.str() == "float32[N,3,?,224]");
  REQUIRE_FALSE(t.is_static());
  REQUIRE(TensorType::of(DType::Int64, {2, 2}).numel() == 4);
  REQUIRE_THROWS_AS(t.static_shape(), Error);
}

TEST_CASE("a large chain stays fast to build, sort and validate", "[ir]") {
  Graph g;
  g.add_input("x", f32({8}));
  std::string prev = "x";
  for (int i = 0; i < 100000; ++i) {
    std::string o = "v" + std::to_string(i);
    g.add_node(i % 2 ? "Relu" : "Neg", {prev}, {o});
    prev = o;
  }
  g.add_output(prev);
  REQUIRE(g.topo_order().size() == 100000);
  g.validate();
}

TEST_CASE("find_node follows renames, removals and duplicate names", "[ir]") {
  Graph g = diamond();
  NodeId B = g.find_node("B");
  g.set_node_name(B, "renamed");
  REQUIRE(g.find_node("B") == kNoNode);
  REQUIRE(g.find_node("renamed") == B);
  NodeId dup = g.add_node("Relu", {"x"}, {"extra"}, {}, "renamed");  // ONNX allows repeated names
  REQUIRE(g.find_node("renamed") == B);                               // the first one wins
  g.remove_node(B, false);
  REQUIRE(g.find_node("renamed") == dup);
  Graph copy = g;
  REQUIRE(copy.find_node("renamed") == dup);
}
