// ONNX import/export. Models that our exporter would never write (typed-field initializers,
// unordered nodes, malformed files) are encoded here byte by byte with a tiny protobuf writer, so
// the tests depend on the ONNX wire format only, not on a second copy of the proto headers.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "graph/builder.h"
#include "graph/onnx_io.h"

using namespace nnfuse;
namespace fs = std::filesystem;

namespace {

// ---- a minimal protobuf encoder (field numbers from onnx.proto) ----
struct Msg {
  std::string b;
  void key(int field, int wire) { raw_varint((uint64_t(field) << 3) | uint64_t(wire)); }
  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      b.push_back(char(uint8_t(v) | 0x80));
      v >>= 7;
    }
    b.push_back(char(v));
  }
  Msg& varint(int field, int64_t v) { key(field, 0); raw_varint(uint64_t(v)); return *this; }
  Msg& bytes(int field, const std::string& s) { key(field, 2); raw_varint(s.size()); b += s; return *this; }
  Msg& msg(int field, const Msg& m) { return bytes(field, m.b); }
  Msg& f32(int field, float v) {
    key(field, 5);
    char c[4];
    std::memcpy(c, &v, 4);
    b.append(c, 4);
    return *this;
  }
  template <class T>
  Msg& packed_varints(int field, const std::vector<T>& vs) {
    Msg p;
    for (T v : vs) p.raw_varint(uint64_t(int64_t(v)));
    return bytes(field, p.b);
  }
  template <class T>
  Msg& packed_fixed(int field, const std::vector<T>& vs) {
    std::string s(vs.size() * sizeof(T), '\0');
    if (!vs.empty()) std::memcpy(s.data(), vs.data(), s.size());
    return bytes(field, s);
  }
};

// TensorProto: 1 dims, 2 data_type, 4 float_data, 5 int32_data, 7 int64_data, 8 name, 9 raw_data,
// 10 double_data, 11 uint64_data, 13 external_data, 14 data_location.
Msg tensor_header(const std::string& name, int dtype, const std::vector<int64_t>& dims) {
  Msg t;
  for (int64_t d : dims) t.varint(1, d);
  t.varint(2, dtype);
  t.bytes(8, name);
  return t;
}
Msg raw_floats(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
  Msg t = tensor_header(name, 1, dims);
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return t.bytes(9, s);
}

// ValueInfoProto{1 name, 2 type{1 tensor_type{1 elem_type, 2 shape{1 dim{1 value | 2 param}}}}}.
// A dim given as a negative number is written as dim_param "d<k>"; use `syms` to name it.
Msg value_info(const std::string& name, int elem, const std::vector<std::string>& dims) {
  Msg shape;
  for (auto& d : dims) {
    Msg dm;
    if (!d.empty() && (std::isdigit(static_cast<unsigned char>(d[0])) != 0)) dm.varint(1, std::stoll(d));
    else if (!d.empty()) dm.bytes(2, d);
    shape.msg(1, dm);
  }
  Msg tt;
  tt.varint(1, elem).msg(2, shape);
  Msg tp;
  tp.msg(1, tt);
  Msg vi;
  vi.bytes(1, name).msg(2, tp);
  return vi;
}

// NodeProto{1 input, 2 output, 3 name, 4 op_type, 5 attribute, 7 domain}.
Msg node(const std::string& op, const std::vector<std::string>& ins, const std::vector<std::string>& outs,
         const std::string& name = "", const std::vector<Msg>& attrs = {}) {
  Msg n;
  for (auto& i : ins) n.bytes(1, i);
  for (auto& o : outs) n.bytes(2, o);
  if (!name.empty()) n.bytes(3, name);
  n.bytes(4, op);
  for (auto& a : attrs) n.msg(5, a);
  return n;
}

// GraphProto{1 node, 2 name, 5 initializer, 11 input, 12 output, 13 value_info}.
struct GraphMsg {
  std::vector<Msg> nodes, inits, inputs, outputs, infos;
  Msg encode(const std::string& name = "g") const {
    Msg g;
    for (auto& n : nodes) g.msg(1, n);
    g.bytes(2, name);
    for (auto& i : inits) g.msg(5, i);
    for (auto& i : inputs) g.msg(11, i);
    for (auto& o : outputs) g.msg(12, o);
    for (auto& v : infos) g.msg(13, v);
    return g;
  }
};

// ModelProto{1 ir_version, 2 producer_name, 7 graph, 8 opset_import{1 domain, 2 version}}.
std::string model_bytes(const GraphMsg& g, int64_t opset = 17, int64_t ir = 8) {
  Msg m;
  m.varint(1, ir).bytes(2, "test").msg(7, g.encode());
  Msg os;
  os.bytes(1, "").varint(2, opset);
  m.msg(8, os);
  return m.b;
}

// x:float[N,4] -> Relu -> y
GraphMsg relu_graph() {
  GraphMsg g;
  g.inputs.push_back(value_info("x", 1, {"N", "4"}));
  g.outputs.push_back(value_info("y", 1, {"N", "4"}));
  g.nodes.push_back(node("Relu", {"x"}, {"y"}, "relu"));
  return g;
}

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("nnfuse_onnx_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& contents) const {
    fs::path p = path / name;
    std::ofstream(p, std::ios::binary).write(contents.data(), std::streamsize(contents.size()));
    return p.string();
  }
};

// Runs `f`, expects an nnfuse::Error of `kind`, and returns its message.
template <class F>
std::string error_of(F&& f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(error_kind_name(e.kind()) == std::string(error_kind_name(kind)));
    return e.what();
  }
  FAIL("no error thrown");
  return "";
}

ImportOptions no_inference() {
  ImportOptions o;
  o.infer_shapes = false;
  return o;
}

}  // namespace

TEST_CASE("onnx: a built graph survives export and import", "[onnx]") {
  GraphBuilder b("roundtrip", 17, 42);
  auto x = b.input("x", DType::Float32, {Dim::sym("batch"), 4});
  auto w = b.weight("w", {4, 3});
  auto mm = b.op("MatMul", {x, w}, {}, "mm");
  auto r = b.op("Relu", {mm}, {}, "relu");
  auto shape = b.constant_node("shape", Tensor::from_vector<int64_t>({2}, {-1, 3}));
  auto y = b.op("Reshape", {r, shape}, {}, "reshape");
  b.output(y);
  Model m = b.finish();
  m.producer_version = "1.2";
  m.doc = "doc text";
  m.metadata["author"] = "tests";

  std::string bytes = save_model_bytes(m);
  Model back = load_model_bytes(bytes);
  const Graph& g = back.graph;
  REQUIRE(g.num_nodes() == m.graph.num_nodes());
  auto order_a = m.graph.topo_order(), order_b = g.topo_order();
  for (size_t k = 0; k < order_a.size(); ++k) {
    const Node& na = m.graph.node(order_a[k]);
    const Node& nb = g.node(order_b[k]);
    CHECK(na.op_type == nb.op_type);
    CHECK(na.name == nb.name);
    CHECK(na.inputs == nb.inputs);
    CHECK(na.outputs == nb.outputs);
    CHECK(na.attrs == nb.attrs);
  }
  REQUIRE(g.initializer_names() == m.graph.initializer_names());
  CHECK(g.initializer(w).equals(m.graph.initializer(w)));
  REQUIRE(g.inputs() == std::vector<std::string>{"x"});
  REQUIRE(g.outputs() == std::vector<std::string>{y});
  // The symbolic batch dim travels as dim_param.
  CHECK(g.type("x") == TensorType(DType::Float32, {Dim::sym("batch"), 4}));
  CHECK(g.type(y) == m.graph.type(y));
  CHECK(g.type(mm) == m.graph.type(mm));
  CHECK(g.opset() == 17);
  CHECK(back.ir_version == 8);
  CHECK(back.producer_version == "1.2");
  CHECK(back.doc == "doc text");
  CHECK(back.metadata.at("author") == "tests");
  // A constant node's value is still constant data after the trip.
  const Tensor* sv = g.constant_value(shape);
  REQUIRE(sv);
  CHECK(sv->to_int_vector() == std::vector<int64_t>{-1, 3});
  // Export is deterministic.
  CHECK(save_model_bytes(back) == bytes);
}

TEST_CASE("onnx: every attribute kind round-trips", "[onnx]") {
  Model m;
  m.graph.opset_imports[""] = 17;
  m.graph.add_input("x", TensorType(DType::Float32, {2}));
  auto body = std::make_shared<Graph>();
  body->is_subgraph = true;
  body->name = "body";
  body->opset_imports = m.graph.opset_imports;
  body->add_input("b_in", TensorType(DType::Float32, {2}));
  body->add_node("Relu", {"b_in"}, {"b_out"}, {}, "body_relu");
  body->set_type("b_out", TensorType(DType::Float32, {2}));
  body->add_output("b_out");
  Attributes a;
  a.set("f", Attribute::make_float(0.25f));
  a.set("i", Attribute::make_int(-7));
  a.set("s", Attribute::make_string("text"));
  a.set("t", Attribute::make_tensor(Tensor::from_vector<int32_t>({2, 2}, {1, 2, 3, 4})));
  a.set("g", Attribute::make_graph(body));
  a.set("fs", Attribute::make_floats({1.5f, -2.0f}));
  a.set("is", Attribute::make_ints({1, 2, 3}));
  a.set("ss", Attribute::make_strings({"a", "bc"}));
  Attribute ts;
  ts.kind = Attribute::Kind::Tensors;
  ts.tensors = {Tensor::scalar<double>(2.5), Tensor::from_vector<uint8_t>({3}, {1, 2, 255})};
  a.set("ts", ts);
  Attribute gs;
  gs.kind = Attribute::Kind::Graphs;
  gs.graphs = {body, body};
  a.set("gs", gs);
  m.graph.add_node("Identity", {"x"}, {"y"}, a, "id");
  m.graph.set_type("y", TensorType(DType::Float32, {2}));
  m.graph.add_output("y");

  Model back = load_model_bytes(save_model_bytes(m), no_inference());
  NodeId id = back.graph.find_node("id");
  REQUIRE(id != kNoNode);
  const Attributes& b = back.graph.node(id).attrs;
  REQUIRE(b.size() == 10);
  CHECK(b.find("f")->kind == Attribute::Kind::Float);
  CHECK(b.get_float("f", 0) == 0.25f);
  CHECK(b.get_int("i", 0) == -7);
  CHECK(b.get_string("s", "") == "text");
  CHECK(b.find("t")->t.equals(Tensor::from_vector<int32_t>({2, 2}, {1, 2, 3, 4})));
  CHECK(b.get_floats("fs") == std::vector<float>{1.5f, -2.0f});
  CHECK(b.get_ints("is") == std::vector<int64_t>{1, 2, 3});
  CHECK(b.find("ss")->strings == std::vector<std::string>{"a", "bc"});
  REQUIRE(b.find("ts")->tensors.size() == 2);
  CHECK(b.find("ts")->tensors[0].equals(Tensor::scalar<double>(2.5)));
  CHECK(b.find("ts")->tensors[1].equals(Tensor::from_vector<uint8_t>({3}, {1, 2, 255})));
  for (const Graph* sg : {b.find("g")->g.get(), b.find("gs")->graphs.at(0).get(), b.find("gs")->graphs.at(1).get()}) {
    REQUIRE(sg);
    CHECK(sg->is_subgraph);
    CHECK(sg->opset() == 17);
    CHECK(sg->name == "body");
    CHECK(sg->inputs() == std::vector<std::string>{"b_in"});
    CHECK(sg->outputs() == std::vector<std::string>{"b_out"});
    REQUIRE(sg->num_nodes() == 1);
    CHECK(sg->node(sg->node_ids()[0]).op_type == "Relu");
    CHECK(sg->type("b_out") == TensorType(DType::Float32, {2}));
  }
}

TEST_CASE("onnx: initializers stored in the typed fields", "[onnx]") {
  GraphMsg g;
  auto add = [&](Msg t) {
    g.inits.push_back(t);
  };
  add(tensor_header("f32", 1, {2}).packed_fixed<float>(4, {1.5f, -2.0f}));
  add(tensor_header("i32", 6, {2}).packed_varints<int32_t>(5, {-5, 7}));
  add(tensor_header("i64", 7, {3}).packed_varints<int64_t>(7, {-1, 0, int64_t(1) << 40}));
  add(tensor_header("f64", 11, {1}).packed_fixed<double>(10, {0.125}));
  add(tensor_header("u64", 13, {1}).packed_varints<uint64_t>(11, {~uint64_t(0)}));
  add(tensor_header("u32", 12, {2}).packed_varints<uint64_t>(11, {7, 4000000000u}));
  add(tensor_header("f16", 10, {2}).packed_varints<int32_t>(5, {0x3C00, 0xC000}));  // 1.0, -2.0
  add(tensor_header("bf16", 16, {1}).packed_varints<int32_t>(5, {0x3FC0}));         // 1.5
  add(tensor_header("b", 9, {3}).packed_varints<int32_t>(5, {1, 0, 1}));
  add(tensor_header("i8", 3, {2}).packed_varints<int32_t>(5, {-128, 127}));
  add(tensor_header("u8", 2, {2}).packed_varints<int32_t>(5, {0, 255}));
  add(tensor_header("i16", 5, {1}).packed_varints<int32_t>(5, {-300}));
  add(tensor_header("u16", 4, {1}).packed_varints<int32_t>(5, {65535}));
  add(raw_floats("raw", {2, 1}, {3.0f, 4.0f}));
  add(tensor_header("scalar", 7, {}).packed_varints<int64_t>(7, {9}));
  add(tensor_header("empty", 1, {0, 3}));
  g.inputs.push_back(value_info("x", 1, {"2"}));
  g.outputs.push_back(value_info("y", 1, {"2"}));
  g.nodes.push_back(node("Identity", {"x"}, {"y"}));
  Model m = load_model_bytes(model_bytes(g));
  const Graph& gr = m.graph;
  CHECK(gr.initializer("f32").to_float_vector() == std::vector<float>{1.5f, -2.0f});
  CHECK(gr.initializer("i32").dtype() == DType::Int32);
  CHECK(gr.initializer("i32").to_int_vector() == std::vector<int64_t>{-5, 7});
  CHECK(gr.initializer("i64").to_int_vector() == std::vector<int64_t>{-1, 0, int64_t(1) << 40});
  CHECK(gr.initializer("f64").data<double>()[0] == 0.125);
  CHECK(gr.initializer("u64").data<uint64_t>()[0] == ~uint64_t(0));
  CHECK(gr.initializer("u32").data<uint32_t>()[1] == 4000000000u);
  CHECK(gr.initializer("f16").to_float_vector() == std::vector<float>{1.0f, -2.0f});
  CHECK(gr.initializer("bf16").to_float_vector() == std::vector<float>{1.5f});
  const bool* bp = gr.initializer("b").data<bool>();
  CHECK((bp[0] && !bp[1] && bp[2]));
  CHECK(gr.initializer("i8").to_int_vector() == std::vector<int64_t>{-128, 127});
  CHECK(gr.initializer("u8").to_int_vector() == std::vector<int64_t>{0, 255});
  CHECK(gr.initializer("i16").to_int_vector() == std::vector<int64_t>{-300});
  CHECK(gr.initializer("u16").to_int_vector() == std::vector<int64_t>{65535});
  CHECK(gr.initializer("raw").shape() == Shape{2, 1});
  CHECK(gr.initializer("raw").to_float_vector() == std::vector<float>{3.0f, 4.0f});
  CHECK(gr.initializer("scalar").shape().empty());
  CHECK(gr.initializer("scalar").as_int() == 9);
  CHECK(gr.initializer("empty").numel() == 0);
  CHECK(gr.type("i8") == TensorType(DType::Int8, {2}));

  // Exported as raw_data, read back the same.
  Model back = load_model_bytes(save_model_bytes(m));
  for (auto& n : gr.initializer_names()) {
    INFO(n);
    CHECK(back.graph.initializer(n).equals(gr.initializer(n)));
  }

  // A count that does not match the shape names the tensor.
  GraphMsg bad = relu_graph();
  bad.inits.push_back(tensor_header("short", 1, {3}).packed_fixed<float>(4, {1.0f}));
  std::string msg = error_of([&] { load_model_bytes(model_bytes(bad)); }, ErrorKind::Model);
  CHECK_THAT(msg, Catch::Contains("'short'") && Catch::Contains("float_data"));
}

TEST_CASE("onnx: external data is read relative to the model", "[onnx]") {
  TempDir dir;
  std::vector<float> w = {1, 2, 3, 4};
  std::string data(8, 'x');  // 8 bytes of padding before the tensor
  data.append(reinterpret_cast<const char*>(w.data()), 16);
  fs::create_directories(dir.path / "weights");
  dir.file("weights/w.bin", data);
  auto external = [](const std::string& location) {
    Msg t = tensor_header("w", 1, {2, 2});
    auto kv = [&](const std::string& k, const std::string& v) {
      Msg e;
      e.bytes(1, k).bytes(2, v);
      t.msg(13, e);
    };
    kv("location", location);
    kv("offset", "8");
    kv("length", "16");
    t.varint(14, 1);
    return t;
  };
  GraphMsg g;
  g.inits.push_back(external("weights/w.bin"));
  g.inputs.push_back(value_info("x", 1, {"2", "2"}));
  g.outputs.push_back(value_info("y", 1, {"2", "2"}));
  g.nodes.push_back(node("MatMul", {"x", "w"}, {"y"}, "mm"));
  std::string path = dir.file("model.onnx", model_bytes(g));
  Model m = load_model(path);
  CHECK(m.path == path);
  CHECK(m.graph.initializer("w").to_float_vector() == w);
  // From bytes, base_dir does the resolving.
  Model mb = load_model_bytes(model_bytes(g), {}, dir.path.string());
  CHECK(mb.graph.initializer("w").to_float_vector() == w);

  GraphMsg missing = g;
  missing.inits[0] = external("weights/absent.bin");
  std::string p2 = dir.file("missing.onnx", model_bytes(missing));
  std::string msg = error_of([&] { load_model(p2); }, ErrorKind::Io);
  CHECK_THAT(msg, Catch::Contains("'w'") && Catch::Contains("absent.bin"));
}

TEST_CASE("onnx: an initializer listed as an input stays overridable", "[onnx]") {
  GraphMsg g;
  g.inits.push_back(raw_floats("w", {2}, {1.0f, -1.0f}));
  g.inputs.push_back(value_info("x", 1, {"2"}));
  g.inputs.push_back(value_info("w", 1, {"2"}));
  g.outputs.push_back(value_info("y", 1, {"2"}));
  g.nodes.push_back(node("MatMul", {"x", "w"}, {"y"}));
  Model m = load_model_bytes(model_bytes(g, 9, 3));
  const Graph& gr = m.graph;
  CHECK(gr.is_initializer("w"));
  CHECK(gr.is_input("w"));
  CHECK(gr.constant_value("w") == nullptr);  // the input may be fed instead
  CHECK(gr.initializer("w").to_float_vector() == std::vector<float>{1.0f, -1.0f});
  // An unnamed node gets no name.
  CHECK(gr.node(gr.node_ids()[0]).name.empty());
  Model back = load_model_bytes(save_model_bytes(m));
  CHECK(back.graph.is_input("w"));
  CHECK(back.graph.is_initializer("w"));
  CHECK(back.ir_version >= 4);
}

TEST_CASE("onnx: nodes may come in any order; symbolic dims are kept", "[onnx]") {
  GraphMsg g;
  g.inputs.push_back(value_info("x", 1, {"batch", "3"}));
  g.outputs.push_back(value_info("z", 1, {"batch", "3"}));
  g.nodes.push_back(node("Relu", {"y"}, {"z"}, "second"));
  g.nodes.push_back(node("Sigmoid", {"x"}, {"y"}, "first"));
  Model m = load_model_bytes(model_bytes(g));
  auto order = m.graph.topo_order();
  REQUIRE(order.size() == 2);
  CHECK(m.graph.node(order[0]).name == "first");
  CHECK(m.graph.node(order[1]).name == "second");
  TensorType want(DType::Float32, {Dim::sym("batch"), 3});
  CHECK(m.graph.type("x") == want);
  CHECK(m.graph.type("y") == want);  // inferred through the symbol
  CHECK(m.graph.type("z") == want);
  Model back = load_model_bytes(save_model_bytes(m));
  CHECK(back.graph.type("y") == want);
  CHECK(back.graph.type("z").dims[0].symbol == "batch");
}

TEST_CASE("onnx: IR versions 11-14 import (onnx 1.23's make_model writes 14)", "[onnx]") {
  for (int64_t ir : {11, 14}) {
    Model m = load_model_bytes(model_bytes(relu_graph(), 21, ir), {}, "", "ir.onnx");
    CHECK(m.ir_version == ir);
    CHECK(m.graph.num_nodes() == 1);
    Model back = load_model_bytes(save_model_bytes(m));  // and export keeps it
    CHECK(back.ir_version == ir);
  }
}

TEST_CASE("onnx: opsets 22-28 import; an op newer than the model's opset is refused by name", "[onnx]") {
  for (int64_t opset : {22, 25, 28}) {
    Model m = load_model_bytes(model_bytes(relu_graph(), opset, 14), {}, "", "new.onnx");
    CHECK(m.graph.opset("") == opset);
    CHECK(m.graph.num_nodes() == 1);
  }
  GraphMsg g = relu_graph();
  g.nodes[0] = node("Swish", {"x"}, {"y"}, "swish_node");  // opset 24
  auto msg = error_of([&] { load_model_bytes(model_bytes(g, 21, 10), {}, "", "swish.onnx"); }, ErrorKind::Unsupported);
  CHECK_THAT(msg, Catch::Contains("swish.onnx") && Catch::Contains("swish_node") &&
                      Catch::Contains("Swish is supported for opsets 24 to 28, not opset 21"));
  CHECK_NOTHROW(load_model_bytes(model_bytes(g, 24, 14), {}, "", "swish.onnx"));
}

TEST_CASE("onnx: Constant value_* forms become a value tensor", "[onnx]") {
  GraphMsg g;
  Msg a;  // AttributeProto{1 name, 8 ints, 20 type=INTS(7)}
  a.bytes(1, "value_ints").packed_varints<int64_t>(8, {2, 2}).varint(20, 7);
  g.nodes.push_back(node("Constant", {}, {"shape"}, "c", {a}));
  g.inputs.push_back(value_info("x", 1, {"4"}));
  g.outputs.push_back(value_info("y", 1, {"2", "2"}));
  g.nodes.push_back(node("Reshape", {"x", "shape"}, {"y"}, "r"));
  Model m = load_model_bytes(model_bytes(g));
  const Tensor* t = m.graph.constant_value("shape");
  REQUIRE(t);
  CHECK(t->to_int_vector() == std::vector<int64_t>{2, 2});
  CHECK(m.graph.type("y") == TensorType(DType::Float32, {2, 2}));
}

TEST_CASE("onnx: malformed models give errors naming what is at fault", "[onnx]") {
  TempDir dir;
  SECTION("nonexistent file") {
    std::string p = (dir.path / "nope.onnx").string();
    auto msg = error_of([&] { load_model(p); }, ErrorKind::Io);
    CHECK_THAT(msg, Catch::Contains("nope.onnx"));
  }
  SECTION("empty file") {
    std::string p = dir.file("empty.onnx", "");
    auto msg = error_of([&] { load_model(p); }, ErrorKind::Model);
    CHECK_THAT(msg, Catch::Contains("empty.onnx") && Catch::Contains("not a valid ONNX model"));
  }
  SECTION("truncated protobuf") {
    std::string full = model_bytes(relu_graph());
    std::string p = dir.file("cut.onnx", full.substr(0, full.size() / 2));
    auto msg = error_of([&] { load_model(p); }, ErrorKind::Model);
    CHECK_THAT(msg, Catch::Contains("cut.onnx: not a valid ONNX model (protobuf parse failed)"));
  }
  SECTION("random bytes") {
    std::mt19937 rng(1234);
    std::string junk;
    for (int i = 0; i < 256; ++i) junk.push_back(char(rng()));
    std::string p = dir.file("junk.onnx", junk);
    auto msg = error_of([&] { load_model(p); }, ErrorKind::Model);
    CHECK_THAT(msg, Catch::Contains("junk.onnx") && Catch::Contains("not a valid ONNX model"));
  }
  SECTION("cycle") {
    GraphMsg g;
    g.inputs.push_back(value_info("x", 1, {"2"}));
    g.outputs.push_back(value_info("z", 1, {"2"}));
    g.nodes.push_back(node("Relu", {"b"}, {"a"}, "n_a"));
    g.nodes.push_back(node("Relu", {"a"}, {"b"}, "n_b"));
    g.nodes.push_back(node("Identity", {"x"}, {"z"}, "n_z"));
    std::string p = dir.file("cycle.onnx", model_bytes(g));
    auto msg = error_of([&] { load_model(p); }, ErrorKind::Model);
    CHECK_THAT(msg, Catch::Contains("cycle.onnx") && Catch::Contains("cycle") && Catch::Contains("n_a") && Catch::Contains("n_b"));
  }
  SECTION("dangling edge") {
    GraphMsg g = relu_graph();
    g.nodes.push_back(node("Relu", {"ghost"}, {"w"}, "haunted"));
    auto msg = error_of([&] { load_model_bytes(model_bytes(g), {}, "", "dangling.onnx"); }, ErrorKind::Model);
    CHECK_THAT(msg, Catch::Contains("dangling.onnx") && Catch::Contains("dangling edge") && Catch::Contains("haunted") &&
                        Catch::Contains("'ghost'"));
  }
  SECTION("unknown op") {
    GraphMsg g = relu_graph();
    g.nodes.push_back(node("FooBar", {"y"}, {"w"}, "foo_node"));
    std::string p = dir.file("foo.onnx", model_bytes(g));
    auto msg = error_of([&] { load_model(p, no_inference()); }, ErrorKind::Unsupported);
    CHECK_THAT(msg, Catch::Contains("foo.onnx") && Catch::Contains("foo_node") && Catch::Contains("FooBar") &&
                        Catch::Contains("opset 17"));
  }
  SECTION("wrong arity") {
    GraphMsg g = relu_graph();
    g.nodes.push_back(node("Relu", {"x", "y"}, {"w"}, "two_inputs"));
    auto msg = error_of([&] { load_model_bytes(model_bytes(g), no_inference(), "", "arity.onnx"); }, ErrorKind::Model);
    CHECK_THAT(msg, Catch::Contains("arity.onnx") && Catch::Contains("two_inputs") && Catch::Contains("Relu") &&
                        Catch::Contains("2 inputs"));
  }
  SECTION("opset 6") {
    auto msg = error_of([&] { load_model_bytes(model_bytes(relu_graph(), 6), {}, "", "old.onnx"); }, ErrorKind::Unsupported);
    CHECK_THAT(msg, Catch::Contains("old.onnx") &&
                        Catch::Contains("model uses opset 6 of ai.onnx; nnfuse supports 7 to 28"));
  }
  SECTION("opset 29 (newer than any onnx release we know)") {
    auto msg = error_of([&] { load_model_bytes(model_bytes(relu_graph(), 29, 14), {}, "", "new.onnx"); }, ErrorKind::Unsupported);
    CHECK_THAT(msg, Catch::Contains("new.onnx") && Catch::Contains("model uses opset 29 of ai.onnx; nnfuse supports 7 to 28"));
  }
  SECTION("IR version 2") {
    auto msg = error_of([&] { load_model_bytes(model_bytes(relu_graph(), 17, 2), {}, "", "ir2.onnx"); }, ErrorKind::Unsupported);
    CHECK_THAT(msg, Catch::Contains("ir2.onnx") && Catch::Contains("IR version 2"));
  }
  SECTION("IR version 15 (newer than any onnx release we know)") {
    auto msg = error_of([&] { load_model_bytes(model_bytes(relu_graph(), 17, 15), {}, "", "ir15.onnx"); }, ErrorKind::Unsupported);
    CHECK_THAT(msg, Catch::Contains("ir15.onnx") && Catch::Contains("IR version 15") && Catch::Contains("3 to 14"));
  }
  SECTION("produced twice") {
    GraphMsg g = relu_graph();
    g.nodes.push_back(node("Relu", {"x"}, {"y"}, "again"));
    auto msg = error_of([&] { load_model_bytes(model_bytes(g)); }, ErrorKind::Model);
    CHECK_THAT(msg, Catch::Contains("'y'") && Catch::Contains("produced twice"));
  }
}

TEST_CASE("onnx: save_model writes a file that loads back", "[onnx]") {
  TempDir dir;
  Model m = load_model_bytes(model_bytes(relu_graph()));
  std::string p = (dir.path / "out.onnx").string();
  save_model(m, p);
  Model back = load_model(p);
  CHECK(back.graph.num_nodes() == 1);
  CHECK(back.graph.type("y") == TensorType(DType::Float32, {Dim::sym("N"), 4}));
  auto msg = error_of([&] { save_model(m, (dir.path / "no_dir" / "x.onnx").string()); }, ErrorKind::Io);
  CHECK_THAT(msg, Catch::Contains("no_dir"));
}

TEST_CASE("onnx: model-local functions are exported and inlined on import", "[onnx]") {
  Model m;
  m.ir_version = 8;
  m.graph.opset_imports[""] = 17;
  m.graph.opset_imports["nnfuse"] = 1;
  m.graph.add_input("x", TensorType(DType::Float32, {2, 3}));
  ModelFunction f;
  f.name = "Block0_Relu";
  f.domain = "nnfuse";
  f.inputs = {"a"};
  f.outputs = {"c"};
  f.opset_imports[""] = 17;
  f.body.is_subgraph = true;
  f.body.opset_imports = f.opset_imports;
  f.body.add_input("a", TensorType(DType::Float32, {2, 3}));
  f.body.add_node("Relu", {"a"}, {"b"}, {}, "r");
  f.body.add_node("Sigmoid", {"b"}, {"c"}, {}, "s");
  f.body.add_output("c");
  m.functions.push_back(f);
  // Two calls of one function: their internal names must not collide once inlined.
  m.graph.add_node("Block0_Relu", {"x"}, {"y1"}, {}, "block0", "nnfuse");
  m.graph.add_node("Block0_Relu", {"y1"}, {"y"}, {}, "block1", "nnfuse");
  m.graph.set_type("y", TensorType(DType::Float32, {2, 3}));
  m.graph.add_output("y");

  Model back = load_model_bytes(save_model_bytes(m));
  const Graph& g = back.graph;
  REQUIRE(g.num_nodes() == 4);
  std::vector<std::string> ops;
  for (NodeId id : g.topo_order()) ops.push_back(g.node(id).op_type);
  CHECK(ops == std::vector<std::string>{"Relu", "Sigmoid", "Relu", "Sigmoid"});
  CHECK(g.producer("y1").has_value());
  CHECK(g.type("y1") == TensorType(DType::Float32, {2, 3}));
  CHECK(g.type("y") == TensorType(DType::Float32, {2, 3}));
  CHECK(back.functions.empty());
}

TEST_CASE("onnx: save_model can write weights as external data", "[onnx]") {
  TempDir dir;
  GraphBuilder b("ext", 17, 7);
  auto x = b.input("x", DType::Float32, {1, 64});
  auto w = b.weight("w", {64, 64});
  auto s = b.scalar("s", 2.0f);  // 4 bytes: stays embedded
  auto y = b.op("MatMul", {x, w});
  b.output(y);
  b.output(s);
  Model m = b.finish();
  SaveOptions opt;
  opt.external_data = true;
  std::string p = (dir.path / "ext.onnx").string();
  save_model(m, p, opt);
  REQUIRE(fs::exists(dir.path / "ext.onnx.data"));
  CHECK(fs::file_size(dir.path / "ext.onnx.data") >= 64 * 64 * 4);
  CHECK(fs::file_size(p) < 64 * 64 * 4);
  Model back = load_model(p);
  CHECK(back.graph.initializer(w).equals(m.graph.initializer(w)));
  CHECK(back.graph.initializer(s).equals(m.graph.initializer(s)));
}

TEST_CASE("onnx: fields newer than ONNX 1.12's proto are ignored", "[onnx]") {
  GraphMsg g = relu_graph();
  Msg meta;  // StringStringEntryProto
  meta.bytes(1, "k").bytes(2, "v");
  g.nodes[0].bytes(8, "overload_name").msg(9, meta);       // NodeProto.overload, metadata_props (IR 10)
  g.infos.push_back(value_info("unused_f8", 17, {"2"}));   // float8e4m3fn (IR 9): skipped, not an error
  Msg graph = g.encode();
  graph.msg(16, meta);                                     // GraphProto.metadata_props
  Msg m;
  m.varint(1, 10).msg(7, graph);
  Msg os;
  os.bytes(1, "").varint(2, 21);
  m.msg(8, os);
  Msg cfg;  // ModelProto.configuration (IR 10)
  cfg.bytes(1, "cfg");
  m.msg(26, cfg);
  Model model = load_model_bytes(m.b);
  CHECK(model.ir_version == 10);
  CHECK(model.graph.opset() == 21);
  CHECK(model.graph.num_nodes() == 1);
  CHECK(model.graph.type("y") == TensorType(DType::Float32, {Dim::sym("N"), 4}));
}

TEST_CASE("onnx: If bodies import as subgraphs reading the outer scope", "[onnx]") {
  auto branch = [](const std::string& op, const std::string& out, const std::string& in) {
    GraphMsg b;
    b.nodes.push_back(node(op, {in}, {out}, op + "_in_branch"));
    b.outputs.push_back(value_info(out, 1, {"2"}));
    return b.encode(op + "_branch");
  };
  auto if_model = [&](const std::string& else_input) {
    GraphMsg g;
    g.inputs.push_back(value_info("cond", 9, {}));
    g.inputs.push_back(value_info("x", 1, {"2"}));
    g.outputs.push_back(value_info("y", 1, {"2"}));
    Msg then_attr, else_attr;  // AttributeProto{1 name, 6 g, 20 type=GRAPH(5)}
    then_attr.bytes(1, "then_branch").msg(6, branch("Relu", "t_out", "x")).varint(20, 5);
    else_attr.bytes(1, "else_branch").msg(6, branch("Sigmoid", "e_out", else_input)).varint(20, 5);
    g.nodes.push_back(node("If", {"cond"}, {"y"}, "the_if", {then_attr, else_attr}));
    return model_bytes(g);
  };
  Model m = load_model_bytes(if_model("x"));
  const Node& n = m.graph.node(m.graph.find_node("the_if"));
  const Attribute* tb = n.attrs.find("then_branch");
  REQUIRE(tb);
  REQUIRE(tb->kind == Attribute::Kind::Graph);
  CHECK(tb->g->is_subgraph);
  CHECK(tb->g->opset() == 17);
  CHECK(tb->g->outer_references() == std::vector<std::string>{"x"});
  CHECK(m.graph.type("y") == TensorType(DType::Float32, {2}));
  // Round trip keeps the bodies.
  Model back = load_model_bytes(save_model_bytes(m));
  const Node& nb = back.graph.node(back.graph.find_node("the_if"));
  CHECK(nb.attrs.find("else_branch")->g->num_nodes() == 1);

  auto msg = error_of([&] { load_model_bytes(if_model("nowhere"), {}, "", "if.onnx"); }, ErrorKind::Model);
  CHECK_THAT(msg, Catch::Contains("if.onnx") && Catch::Contains("dangling edge") && Catch::Contains("'nowhere'") &&
                      Catch::Contains("Sigmoid_in_branch"));
}

TEST_CASE("onnx: the committed malformed models give their errors", "[onnx]") {
  // Written by tests/data/models/make_malformed.py (for CLI tests); checked here so they stay meaningful.
  const std::string dir = std::string(NNFUSE_TEST_DATA) + "/models/";
  CHECK(load_model(dir + "valid_relu.onnx").graph.num_nodes() == 1);
  struct Case {
    const char* file;
    ErrorKind kind;
    const char* says;
  };
  const Case cases[] = {
      {"empty.onnx", ErrorKind::Model, "not a valid ONNX model"},
      {"truncated.onnx", ErrorKind::Model, "protobuf parse failed"},
      {"random_bytes.onnx", ErrorKind::Model, "not a valid ONNX model"},
      {"cycle.onnx", ErrorKind::Model, "cycle_a"},
      {"dangling_edge.onnx", ErrorKind::Model, "'ghost'"},
      {"unknown_op.onnx", ErrorKind::Unsupported, "FooBar"},
      {"wrong_arity.onnx", ErrorKind::Model, "two_inputs"},
      {"opset6.onnx", ErrorKind::Unsupported, "opset 6"},
      {"ir2.onnx", ErrorKind::Unsupported, "IR version 2"},
  };
  for (const Case& c : cases) {
    INFO(c.file);
    auto msg = error_of([&] { load_model(dir + c.file); }, c.kind);
    CHECK_THAT(msg, Catch::Contains(c.file) && Catch::Contains(c.says));
  }
}

TEST_CASE("onnx: a sparse Constant becomes a dense value", "[onnx]") {
  // SparseTensorProto{1 values, 2 indices, 3 dims}: 2 non-zeros of a [4] tensor at 1 and 3.
  Msg sp;
  sp.msg(1, raw_floats("", {2}, {5.0f, 7.0f}))
      .msg(2, tensor_header("", 7, {2}).packed_varints<int64_t>(7, {1, 3}))
      .varint(3, 4);
  Msg a;  // AttributeProto{1 name, 22 sparse_tensor, 20 type=SPARSE_TENSOR(11)}
  a.bytes(1, "sparse_value").msg(22, sp).varint(20, 11);
  GraphMsg g;
  g.nodes.push_back(node("Constant", {}, {"y"}, "c", {a}));
  g.outputs.push_back(value_info("y", 1, {"4"}));
  Model m = load_model_bytes(model_bytes(g));
  const Tensor* t = m.graph.constant_value("y");
  REQUIRE(t);
  CHECK(t->to_float_vector() == std::vector<float>{0.0f, 5.0f, 0.0f, 7.0f});
}
