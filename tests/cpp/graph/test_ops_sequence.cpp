// Sequence and optional values (graph/ops_sequence.cpp): the ops against hand-worked values,
// their errors, the kind checks of tensor ops, a Loop that carries a sequence, and the
// import/export and .pb forms of sequence and optional types.
#include <catch2/catch.hpp>

#include <filesystem>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/onnx_io.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"
#include "node_maker.h"

using namespace nnfuse;

namespace {

using test::make_node;

Tensor f32(Shape s, std::vector<float> v) { return Tensor::from_vector<float>(std::move(s), v); }
Tensor i64(int64_t v) { return Tensor::scalar<int64_t>(v); }

std::vector<float> values(const Tensor& t) { return t.to_float_vector(); }

Tensor seq3() { return Tensor::sequence(DType::Float32, {f32({1}, {1}), f32({2}, {2, 3}), f32({1}, {4})}); }

}  // namespace

TEST_CASE("Sequence ops: construct, at, length, insert, erase with negative positions", "[ops][sequence]") {
  const Tensor a = f32({1}, {1}), b = f32({2}, {2, 3});
  auto s = run_node(make_node("SequenceConstruct", {"a", "b"}, {"s"}), 17, {&a, &b});
  REQUIRE(s[0].is_sequence());
  REQUIRE(s[0].elements().size() == 2);
  REQUIRE(s[0].kind_str() == "a sequence of 2 float32");

  const Tensor q = seq3(), last = i64(-1), first = i64(0), three = i64(3), minus4 = i64(-4);
  REQUIRE(values(run_node(make_node("SequenceAt", {"s", "p"}, {"y"}), 17, {&q, &last})[0]) == std::vector<float>{4});
  REQUIRE(values(run_node(make_node("SequenceAt", {"s", "p"}, {"y"}), 17, {&q, &first})[0]) == std::vector<float>{1});
  REQUIRE_THROWS_WITH(run_node(make_node("SequenceAt", {"s", "p"}, {"y"}), 17, {&q, &three}),
                      Catch::Contains("position 3 is out of range for a sequence of 3"));
  REQUIRE_THROWS_WITH(run_node(make_node("SequenceAt", {"s", "p"}, {"y"}), 17, {&q, &minus4}),
                      Catch::Contains("position -4 is out of range"));
  REQUIRE(run_node(make_node("SequenceLength", {"s"}, {"n"}), 17, {&q})[0].as_int(0) == 3);

  // Insert: at the end by default, at 3 (== length) too, before element 1 at -2.
  const Tensor v = f32({1}, {9}), minus2 = i64(-2);
  auto ins_end = run_node(make_node("SequenceInsert", {"s", "v"}, {"t"}), 17, {&q, &v})[0].elements();
  REQUIRE(ins_end.size() == 4);
  REQUIRE(values(ins_end[3]) == std::vector<float>{9});
  auto ins_mid = run_node(make_node("SequenceInsert", {"s", "v", "p"}, {"t"}), 17, {&q, &v, &minus2})[0].elements();
  REQUIRE(values(ins_mid[1]) == std::vector<float>{9});
  REQUIRE(values(ins_mid[2]) == std::vector<float>{2, 3});
  REQUIRE(run_node(make_node("SequenceInsert", {"s", "v", "p"}, {"t"}), 17, {&q, &v, &three})[0].elements().size() == 4);
  const Tensor wrong = Tensor::from_vector<int32_t>({1}, {7});
  REQUIRE_THROWS_WITH(run_node(make_node("SequenceInsert", {"s", "v"}, {"t"}), 17, {&q, &wrong}),
                      Catch::Contains("inserts a int32 tensor into a sequence of float32"));

  // Erase: the last by default, element 0 at -3.
  auto er = run_node(make_node("SequenceErase", {"s"}, {"t"}), 17, {&q})[0].elements();
  REQUIRE(er.size() == 2);
  REQUIRE(values(er[1]) == std::vector<float>{2, 3});
  const Tensor minus3 = i64(-3);
  auto er0 = run_node(make_node("SequenceErase", {"s", "p"}, {"t"}), 17, {&q, &minus3})[0].elements();
  REQUIRE(values(er0[0]) == std::vector<float>{2, 3});
  const Tensor empty = Tensor::sequence(DType::Float32, {});
  REQUIRE_THROWS_WITH(run_node(make_node("SequenceErase", {"s"}, {"t"}), 17, {&empty}), Catch::Contains("erases from an empty sequence"));

  Attributes dt;
  dt.set("dtype", Attribute::make_int(int64_t(DType::Int64)));
  auto e = run_node(make_node("SequenceEmpty", {}, {"s"}, dt), 17, {})[0];
  REQUIRE(e.is_sequence());
  REQUIRE(e.elements().empty());
  REQUIRE(e.dtype() == DType::Int64);
}

TEST_CASE("SplitToSequence and ConcatFromSequence", "[ops][sequence]") {
  const Tensor x = f32({5, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  Attributes ax0;
  ax0.set("axis", Attribute::make_int(0));
  // A scalar split: chunks of 2, the last one shorter.
  const Tensor two = i64(2);
  auto chunks = run_node(make_node("SplitToSequence", {"x", "s"}, {"q"}, ax0), 17, {&x, &two})[0].elements();
  REQUIRE(chunks.size() == 3);
  REQUIRE(chunks[2].shape() == Shape{1, 2});
  REQUIRE(values(chunks[1]) == std::vector<float>{4, 5, 6, 7});
  // 1-D sizes, along axis 1 (-1).
  Attributes ax1;
  ax1.set("axis", Attribute::make_int(-1));
  const Tensor sizes = Tensor::from_vector<int64_t>({2}, {1, 1});
  auto cols = run_node(make_node("SplitToSequence", {"x", "s"}, {"q"}, ax1), 17, {&x, &sizes})[0].elements();
  REQUIRE(cols.size() == 2);
  REQUIRE(cols[1].shape() == Shape{5, 1});
  REQUIRE(values(cols[1]) == std::vector<float>{1, 3, 5, 7, 9});
  const Tensor over = Tensor::from_vector<int64_t>({2}, {1, 2}), under = Tensor::from_vector<int64_t>({2}, {1, 0});
  REQUIRE_THROWS_WITH(run_node(make_node("SplitToSequence", {"x", "s"}, {"q"}, ax1), 17, {&x, &over}),
                      Catch::Contains("split sizes add up to more than the axis 1 has (2)"));
  REQUIRE_THROWS_WITH(run_node(make_node("SplitToSequence", {"x", "s"}, {"q"}, ax1), 17, {&x, &under}),
                      Catch::Contains("split sizes add up to 1, the axis 1 has 2"));
  // No split: one element per index, squeezed with keepdims=0.
  Attributes nokeep = ax1;
  nokeep.set("keepdims", Attribute::make_int(0));
  auto rows = run_node(make_node("SplitToSequence", {"x"}, {"q"}, nokeep), 17, {&x})[0];
  REQUIRE(rows.elements().size() == 2);
  REQUIRE(rows.elements()[0].shape() == Shape{5});

  // Concatenating the chunks back gives x; stacking the columns (new_axis) gives x's transpose
  // shape [2, 5] on axis 0, and [5, 2] on axis 1.
  const Tensor chunk_seq = Tensor::sequence(DType::Float32, chunks);
  auto back = run_node(make_node("ConcatFromSequence", {"q"}, {"y"}, ax0), 17, {&chunk_seq})[0];
  REQUIRE(back.shape() == Shape{5, 2});
  REQUIRE(back.equals(x));
  Attributes stack0 = ax0, stack1;
  stack0.set("new_axis", Attribute::make_int(1));
  stack1.set("axis", Attribute::make_int(-1));
  stack1.set("new_axis", Attribute::make_int(1));
  auto st0 = run_node(make_node("ConcatFromSequence", {"q"}, {"y"}, stack0), 17, {&rows})[0];
  REQUIRE(st0.shape() == Shape{2, 5});
  REQUIRE(values(st0) == std::vector<float>{0, 2, 4, 6, 8, 1, 3, 5, 7, 9});
  auto st1 = run_node(make_node("ConcatFromSequence", {"q"}, {"y"}, stack1), 17, {&rows})[0];
  REQUIRE(st1.equals(x));
  const Tensor mixed = Tensor::sequence(DType::Float32, {f32({1, 2}, {0, 1}), f32({1, 3}, {0, 1, 2})});
  REQUIRE_THROWS_WITH(run_node(make_node("ConcatFromSequence", {"q"}, {"y"}, ax0), 17, {&mixed}),
                      Catch::Contains("does not match element 0's [1,2] off the axis 0"));
}

TEST_CASE("Tensor ops refuse sequences and optionals by name; optionals hold or lack a value", "[ops][sequence]") {
  const Tensor q = seq3(), x = f32({1}, {1});
  REQUIRE_THROWS_WITH(run_node(make_node("Add", {"s", "x"}, {"y"}), 17, {&q, &x}),
                      Catch::Contains("input 0 's' is a sequence of 3 float32; Add takes tensors"));
  const Tensor none = Tensor::none();
  REQUIRE_THROWS_WITH(run_node(make_node("Relu", {"o"}, {"y"}), 17, {&none}), Catch::Contains("is an empty optional; Relu takes tensors"));

  auto has = [&](const Tensor* t, int64_t opset) {
    return run_node(make_node("OptionalHasElement", {t ? "o" : ""}, {"b"}), opset, {t})[0].as_int(0);
  };
  REQUIRE(has(&none, 18) == 0);
  REQUIRE(has(&x, 18) == 1);
  REQUIRE(has(&q, 18) == 1);
  REQUIRE(has(nullptr, 18) == 0);
  REQUIRE_THROWS_WITH(has(nullptr, 15), Catch::Contains("needs an input before opset 18"));
  REQUIRE(run_node(make_node("OptionalGetElement", {"o"}, {"y"}), 18, {&q})[0].equals(q));
  REQUIRE_THROWS_WITH(run_node(make_node("OptionalGetElement", {"o"}, {"y"}), 18, {&none}), Catch::Contains("the optional is empty"));
  REQUIRE(run_node(make_node("Optional", {""}, {"o"}), 18, {nullptr})[0].is_none());
}

TEST_CASE("A Loop carries a sequence: SequenceInsert per iteration, then ConcatFromSequence", "[ops][sequence]") {
  // body(i, cond, s) -> (cond, s + [i as float, 2i]): the carried value starts as SequenceEmpty.
  auto body = std::make_shared<Graph>();
  body->name = "grow";
  body->is_subgraph = true;
  body->add_input("i", TensorType(DType::Int64, {}));
  body->add_input("cond_in", TensorType(DType::Bool, {}));
  body->add_input("s_in", TensorType::sequence_of(DType::Float32));
  body->set_initializer("two", Tensor::scalar<int64_t>(2));
  body->set_initializer("axes", Tensor::from_vector<int64_t>({1}, {0}));
  body->add_node("Mul", {"i", "two"}, {"i2"});
  Attributes to_f;
  to_f.set("to", Attribute::make_int(int64_t(DType::Float32)));
  body->add_node("Unsqueeze", {"i", "axes"}, {"i1"});
  body->add_node("Unsqueeze", {"i2", "axes"}, {"i21"});
  body->add_node("Concat", {"i1", "i21"}, {"pair"}, GraphBuilder::attrs({{"axis", Attribute::make_int(0)}}));
  body->add_node("Cast", {"pair"}, {"pairf"}, to_f);
  body->add_node("SequenceInsert", {"s_in", "pairf"}, {"s_out"});
  body->set_outputs({"cond_in", "s_out"});

  GraphBuilder gb("loop_seq", 17);
  auto m_trip = gb.input("M", DType::Int64, {});
  auto empty = gb.op("SequenceEmpty", {});
  Attributes at;
  at.set("body", Attribute::make_graph(body));
  auto s = gb.op("Loop", {m_trip, "", empty}, at);
  auto cat = gb.op("ConcatFromSequence", {s}, GraphBuilder::attrs({{"axis", Attribute::make_int(0)}, {"new_axis", Attribute::make_int(1)}}));
  gb.output(s);
  gb.output(cat);
  Model m = gb.finish();
  REQUIRE(m.graph.type(empty).str() == "seq(float32[?])");
  REQUIRE(m.graph.type(s).kind == ValueKind::Sequence);
  REQUIRE(m.graph.type(cat).is_tensor());
  REQUIRE(m.graph.type(cat).dtype == DType::Float32);
  auto res = run_reference(m.graph, {{"M", Tensor::scalar<int64_t>(3)}});
  REQUIRE(res.at(s).elements().size() == 3);
  REQUIRE(res.at(cat).shape() == Shape{3, 2});
  REQUIRE(values(res.at(cat)) == std::vector<float>{0, 0, 1, 2, 2, 4});
  // Zero iterations: the empty sequence passes through, and concatenating it is an error that says so.
  REQUIRE_THROWS_WITH(run_reference(m.graph, {{"M", Tensor::scalar<int64_t>(0)}}), Catch::Contains("the sequence is empty"));
  // A feed of the wrong kind is refused by name.
  GraphBuilder gb2("seq_in", 17);
  Graph& g2 = gb2.graph();
  g2.add_input("q", TensorType::sequence_of(DType::Float32));
  auto n = gb2.op("SequenceLength", {"q"});
  gb2.output(n);
  Model m2 = gb2.finish();
  REQUIRE(run_reference(m2.graph, {{"q", seq3()}}).at(n).as_int(0) == 3);
  REQUIRE_THROWS_WITH(run_reference(m2.graph, {{"q", f32({1}, {1})}}), Catch::Contains("input 'q' expects seq(float32[?]), got a tensor float32[1]"));
  REQUIRE_THROWS_WITH(run_reference(m2.graph, {{"q", Tensor::sequence(DType::Int64, {})}}), Catch::Contains("expects seq(float32[?])"));
  // Inference refuses a sequence where a tensor op wants a tensor.
  GraphBuilder gb3("seq_to_relu", 17);
  gb3.graph().add_input("q", TensorType::sequence_of(DType::Float32));
  gb3.output(gb3.op("Relu", {"q"}));
  REQUIRE_THROWS_WITH(gb3.finish(), Catch::Contains("input 0 'q' is seq(float32[?]); Relu takes tensors"));
}

TEST_CASE("Sequence and optional types survive export and import; .pb values round-trip", "[ops][sequence][onnx]") {
  GraphBuilder gb("opt_types", 18);
  gb.graph().add_input("q", TensorType::sequence_of(DType::Float32));
  TensorType opt_seq = TensorType::sequence_of(DType::Float32);
  opt_seq.optional_of = ValueKind::Sequence;
  opt_seq.kind = ValueKind::Optional;
  auto o = gb.op("Optional", {""}, GraphBuilder::attrs({{"type", Attribute::make_type(TensorType::sequence_of(DType::Float32))}}));
  auto h = gb.op("OptionalHasElement", {o});
  auto l = gb.op("SequenceLength", {"q"});
  gb.output(o);
  gb.output(h);
  gb.output(l);
  Model m = gb.finish();
  REQUIRE(m.graph.type(o) == opt_seq);
  REQUIRE(m.graph.type(o).str() == "optional(seq(float32[?]))");

  const auto dir = std::filesystem::temp_directory_path() / "nnfuse_test_seq_types";
  std::filesystem::create_directories(dir);
  save_model(m, (dir / "m.onnx").string());
  Model back = load_model((dir / "m.onnx").string());
  REQUIRE(back.graph.type("q").kind == ValueKind::Sequence);
  REQUIRE(back.graph.type(o) == opt_seq);
  auto res = run_reference(back.graph, {{"q", seq3()}});
  REQUIRE(res.at(o).is_none());
  REQUIRE(res.at(h).as_int(0) == 0);
  REQUIRE(res.at(l).as_int(0) == 3);

  // .pb forms: a SequenceProto, an OptionalProto holding a sequence, an empty one.
  save_value_pb(seq3(), TensorType::sequence_of(DType::Float32), "q", (dir / "q.pb").string());
  REQUIRE(load_value_pb((dir / "q.pb").string(), TensorType::sequence_of(DType::Float32)).equals(seq3()));
  save_value_pb(seq3(), opt_seq, "o", (dir / "o.pb").string());
  REQUIRE(load_value_pb((dir / "o.pb").string(), opt_seq).equals(seq3()));
  save_value_pb(Tensor::none(), opt_seq, "n", (dir / "n.pb").string());
  REQUIRE(load_value_pb((dir / "n.pb").string(), opt_seq).is_none());
  // A sequence file read where a tensor is declared: a clear error naming the file.
  REQUIRE_THROWS_WITH(load_value_pb((dir / "q.pb").string(), TensorType(DType::Float32, {2})), Catch::Contains("is segmented"));
  // A tensor file where a sequence is declared: protobuf would read it as an empty sequence with a
  // strange name; its unknown fields give it away.
  save_tensor_pb(f32({2}, {1, 2}), "t", (dir / "t.pb").string());
  REQUIRE_THROWS_WITH(load_value_pb((dir / "t.pb").string(), TensorType::sequence_of(DType::Float32)),
                      Catch::Contains("not an onnx.SequenceProto of tensors"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("SequenceMap: per-element body over two sequences and a tensor; its arity checked", "[ops][sequence]") {
  // body(a, b, t) -> a + b + t, element by element.
  auto body = std::make_shared<Graph>();
  body->name = "add3";
  body->is_subgraph = true;
  body->add_input("a", TensorType::unknown_shape(DType::Float32));
  body->add_input("b", TensorType::unknown_shape(DType::Float32));
  body->add_input("t", TensorType::unknown_shape(DType::Float32));
  body->add_node("Add", {"a", "b"}, {"ab"});
  body->add_node("Add", {"ab", "t"}, {"y"});
  body->set_outputs({"y"});
  GraphBuilder gb("seq_map", 17);
  gb.graph().add_input("p", TensorType::sequence_of(DType::Float32));
  gb.graph().add_input("q", TensorType::sequence_of(DType::Float32));
  auto t = gb.input("t", DType::Float32, {1});
  auto y = gb.op("SequenceMap", {"p", "q", t}, GraphBuilder::attrs({{"body", Attribute::make_graph(body)}}));
  gb.output(y);
  Model m = gb.finish();
  REQUIRE(m.graph.type(y) == TensorType::sequence_of(DType::Float32));
  const Tensor p = Tensor::sequence(DType::Float32, {f32({2}, {1, 2}), f32({1}, {3})});
  const Tensor q = Tensor::sequence(DType::Float32, {f32({2}, {10, 20}), f32({1}, {30})});
  auto res = run_reference(m.graph, {{"p", p}, {"q", q}, {"t", f32({1}, {100})}});
  const auto& el = res.at(y).elements();
  REQUIRE(el.size() == 2);
  REQUIRE(values(el[0]) == std::vector<float>{111, 122});
  REQUIRE(values(el[1]) == std::vector<float>{133});
  const Tensor short_q = Tensor::sequence(DType::Float32, {f32({2}, {10, 20})});
  REQUIRE_THROWS_WITH(run_reference(m.graph, {{"p", p}, {"q", short_q}, {"t", f32({1}, {100})}}),
                      Catch::Contains("input 1 is a sequence of 1, input 0 of 2"));
  // A node with two outputs on a one-output body: an error at inference, not a read past the
  // body's outputs when the sequence is empty.
  GraphBuilder gb2("seq_map_arity", 17);
  gb2.graph().add_input("p", TensorType::sequence_of(DType::Float32));
  gb2.graph().add_input("q", TensorType::sequence_of(DType::Float32));
  auto t2 = gb2.input("t", DType::Float32, {1});
  auto ys = gb2.op_n("SequenceMap", {"p", "q", t2}, 2, GraphBuilder::attrs({{"body", Attribute::make_graph(body)}}));
  gb2.output(ys[0]);
  REQUIRE_THROWS_WITH(gb2.finish(), Catch::Contains("body takes 3 inputs and gives 1 outputs; the node has 3 and 2"));
  Node n = make_node("SequenceMap", {"p", "q", "t"}, {"y0", "y1"}, GraphBuilder::attrs({{"body", Attribute::make_graph(body)}}));
  const Tensor empty = Tensor::sequence(DType::Float32, {}), one = f32({1}, {1});
  SubgraphRunner never = [](const Graph&, const std::vector<Tensor>&) -> std::vector<Tensor> { FAIL("the body must not run"); return {}; };
  REQUIRE_THROWS_WITH(run_node(n, 17, {&empty, &empty, &one}, never), Catch::Contains("body takes 3 inputs and gives 1 outputs"));
}

TEST_CASE("Kinds must agree: declared outputs, If branches, Identity and Optional* opsets", "[ops][sequence]") {
  // A file that declares a sequence value a tensor: a Model error (a compiled target would
  // otherwise plan a tensor buffer for it).
  {
    GraphBuilder gb("declared_tensor", 17);
    auto x = gb.input("x", DType::Float32, {});
    auto s = gb.op("SequenceConstruct", {x});
    gb.output(s);
    gb.graph().set_type(s, TensorType(DType::Float32, std::vector<Dim>{}));
    REQUIRE_THROWS_WITH(gb.finish(), Catch::Contains("is declared float32[] but is seq(float32[?])"));
  }
  // Declared optional(tensor), found a tensor: the value fits.
  {
    GraphBuilder gb("declared_optional", 17);
    auto x = gb.input("x", DType::Float32, {2});
    auto y = gb.op("Identity", {x});
    gb.output(y);
    TensorType opt(DType::Float32, {2});
    opt.kind = ValueKind::Optional;
    gb.graph().set_type(y, opt);
    Model m = gb.finish();
    REQUIRE(m.graph.type(y).kind == ValueKind::Optional);
  }
  // If whose branches give a tensor and a sequence.
  {
    auto then_b = std::make_shared<Graph>();
    then_b->is_subgraph = true;
    then_b->declare_value("x", TensorType(DType::Float32, {2}));
    then_b->add_node("Identity", {"x"}, {"t_out"});
    then_b->set_outputs({"t_out"});
    auto else_b = std::make_shared<Graph>();
    else_b->is_subgraph = true;
    else_b->declare_value("x", TensorType(DType::Float32, {2}));
    else_b->add_node("SequenceConstruct", {"x"}, {"e_out"});
    else_b->set_outputs({"e_out"});
    GraphBuilder gb("if_kinds", 17);
    auto x = gb.input("x", DType::Float32, {2});
    auto c = gb.input("c", DType::Bool, {});
    auto y = gb.op("If", {c}, GraphBuilder::attrs({{"then_branch", Attribute::make_graph(then_b)}, {"else_branch", Attribute::make_graph(else_b)}}));
    gb.output(y);
    REQUIRE(x == "x");
    REQUIRE_THROWS_WITH(gb.finish(), Catch::Contains("output 0 is float32[2] in then_branch but seq(float32[?]) in else_branch"));
  }
  // Identity takes sequences from opset 14; OptionalHasElement a plain value from opset 18.
  for (int64_t opset : {13, 14}) {
    GraphBuilder gb("identity_seq", opset);
    gb.graph().add_input("q", TensorType::sequence_of(DType::Float32));
    gb.output(gb.op("Identity", {"q"}));
    if (opset == 13) REQUIRE_THROWS_WITH(gb.finish(), Catch::Contains("takes seq(float32[?]) only from opset 14"));
    else REQUIRE(run_reference(gb.finish().graph, {{"q", seq3()}}).begin()->second.equals(seq3()));
  }
  for (int64_t opset : {17, 18}) {
    GraphBuilder gb("has_element", opset);
    auto x = gb.input("x", DType::Float32, {1});
    auto h = gb.op("OptionalHasElement", {x});
    gb.output(h);
    if (opset == 17) REQUIRE_THROWS_WITH(gb.finish(), Catch::Contains("takes an optional input before opset 18"));
    else REQUIRE(run_reference(gb.finish().graph, {{"x", f32({1}, {1})}}).at(h).as_int(0) == 1);
  }
  // Optional(x) holds x: has an element, gives x back.
  GraphBuilder gb("optional_of_x", 18);
  auto x = gb.input("x", DType::Float32, {2});
  auto o = gb.op("Optional", {x});
  auto back = gb.op("OptionalGetElement", {o});
  gb.output(o);
  gb.output(back);
  Model m = gb.finish();
  REQUIRE(m.graph.type(o).str() == "optional(float32[2])");
  REQUIRE(m.graph.type(back) == TensorType(DType::Float32, {2}));
  auto res = run_reference(m.graph, {{"x", f32({2}, {5, 6})}});
  REQUIRE(values(res.at(back)) == std::vector<float>{5, 6});
  REQUIRE(res.at(o).is_tensor());
}
