// The built-in model zoo: every tiny model builds, infers static shapes and runs with finite
// outputs; full-size models have their published structure and parameter counts; opset forms,
// dynamic axes, seeds and batch sizes are honoured; masks behave as masks.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "graph/interpreter.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "graph/zoo.h"

using namespace nnfuse;

namespace {

// Parameters as PyTorch counts them: float initializers, without BatchNorm running statistics
// (buffers, not parameters) and without 0-D constants (exporter literals such as Clip bounds).
int64_t param_count(const Graph& g) {
  std::set<std::string> buffers;
  for (NodeId id : g.node_ids()) {
    const Node& n = g.node(id);
    if (n.op_type == "BatchNormalization" && n.inputs.size() >= 5) {
      buffers.insert(n.inputs[3]);
      buffers.insert(n.inputs[4]);
    }
  }
  int64_t total = 0;
  for (auto& name : g.initializer_names()) {
    const Tensor& t = g.initializer(name);
    if (t.dtype() == DType::Float32 && t.rank() > 0 && !buffers.count(name)) total += t.numel();
  }
  return total;
}

int count_op(const Graph& g, const std::string& op) {
  int c = 0;
  for (NodeId id : g.node_ids()) c += g.node(id).op_type == op;
  return c;
}

const Node* first_node(const Graph& g, const std::string& op) {
  for (NodeId id : g.node_ids())
    if (g.node(id).op_type == op) return &g.node(id);
  return nullptr;
}

// Values whose size depends on data (NonMaxSuppression's selection and what reads it).
std::set<std::string> data_dependent_values(const Graph& g) {
  std::set<std::string> dep;
  for (NodeId id : g.topo_order()) {
    const Node& n = g.node(id);
    bool tainted = n.op_type == "NonMaxSuppression";
    for (auto& i : n.inputs) tainted |= dep.count(i) > 0;
    if (tainted)
      for (auto& o : n.outputs) dep.insert(o);
  }
  return dep;
}

// Every value has a dtype and a fully known shape (data-dependent sizes excepted).
void require_static(const Graph& g, const std::string& model) {
  auto dep = data_dependent_values(g);
  for (auto& name : g.value_names()) {
    const TensorType& t = g.type(name);
    INFO(model << ": value " << name << " is " << t.str());
    CHECK(t.dtype != DType::Undefined);
    if (dep.count(name)) {
      CHECK(t.rank() == 2);
      continue;
    }
    CHECK(t.is_static());
  }
}

void require_finite(const Tensor& t, const std::string& what) {
  if (t.dtype() != DType::Float32) return;
  const float* p = t.data<float>();
  int64_t bad = 0;
  double max_abs = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(p[i])) ++bad;
    else max_abs = std::max(max_abs, double(std::fabs(p[i])));
  }
  INFO(what << " " << shape_str(t.shape()));
  CHECK(bad == 0);
  // Weights are scaled so activations stay O(1): nothing explodes through the depth.
  CHECK(max_abs < 1e4);
}

// Random feeds, with attention masks made of 0/1 (random_feeds draws integers in [0, 10)).
TensorMap feeds_for(const Graph& g, uint64_t seed) {
  TensorMap feeds = random_feeds(g, seed);
  auto it = feeds.find("attention_mask");
  if (it != feeds.end()) {
    Tensor m = it->second.clone();
    int64_t* p = m.data<int64_t>();
    int64_t S = m.dim(-1);
    for (int64_t i = 0; i < m.numel(); ++i) p[i] = (i % S) < S - 2 ? 1 : 0;  // the last two tokens padded
    it->second = m;
  }
  return feeds;
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  float m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
  return m;
}

}  // namespace

TEST_CASE("zoo lists every architecture with its network class", "[zoo]") {
  std::map<std::string, std::string> want = {
      {"resnet18", "residual_cnn"},           {"resnet50", "residual_cnn"},         {"resnet_tiny", "residual_cnn"},
      {"mobilenetv2", "mobile_cnn"},          {"mobilenet_tiny", "mobile_cnn"},     {"efficientnet_b0", "mobile_cnn"},
      {"efficientnet_tiny", "mobile_cnn"},    {"vgg16", "generic"},                 {"ssd_mobilenet", "detector"},
      {"ssd_tiny", "detector"},               {"bert_base", "transformer_encoder"}, {"bert_tiny", "transformer_encoder"},
      {"gpt2", "transformer_decoder"},        {"gpt2_tiny", "transformer_decoder"}, {"vit_b16", "transformer_encoder"},
      {"vit_tiny", "transformer_encoder"},    {"lstm_seq2seq", "rnn"},              {"lstm_tiny", "rnn"}};
  std::set<std::string> tiny = {"resnet_tiny", "mobilenet_tiny", "efficientnet_tiny", "ssd_tiny",
                                "bert_tiny",   "gpt2_tiny",      "vit_tiny",          "lstm_tiny"};
  REQUIRE(zoo_models().size() == want.size());
  for (auto& e : zoo_models()) {
    INFO(e.name);
    REQUIRE(want.count(e.name));
    CHECK(e.network_class == want[e.name]);
    CHECK(e.tiny == (tiny.count(e.name) > 0));
    CHECK(!e.description.empty());
  }
  try {
    build_zoo_model("resnet19");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Invalid);
    CHECK(std::string(e.what()).find("resnet18") != std::string::npos);  // names the known models
  }
  ZooOptions bad;
  bad.opset = 9;
  CHECK_THROWS_AS(build_zoo_model("resnet_tiny", bad), Error);
}

TEST_CASE("tiny zoo models build, infer static shapes and run with finite outputs", "[zoo]") {
  for (auto& e : zoo_models()) {
    if (!e.tiny) continue;
    SECTION(e.name) {
      Model m = build_zoo_model(e.name);
      CHECK_NOTHROW(m.graph.validate());
      CHECK(m.metadata["network_class"] == e.network_class);
      require_static(m.graph, e.name);
      TensorMap out = run_reference(m.graph, feeds_for(m.graph, 7));
      REQUIRE(out.size() == m.graph.outputs().size());
      for (auto& [name, t] : out) {
        require_finite(t, e.name + ":" + name);
        auto dep = data_dependent_values(m.graph);
        if (!dep.count(name)) CHECK(TensorType::of(t.dtype(), t.shape()) == m.graph.type(name));
      }
    }
  }
}

TEST_CASE("tiny zoo models have the expected output shapes", "[zoo]") {
  auto out_shape = [](const Model& m, const std::string& o) { return m.graph.type(o).static_shape(); };
  ZooOptions o;
  o.batch = 2;
  CHECK(out_shape(build_zoo_model("resnet_tiny", o), "logits") == Shape{2, 10});
  CHECK(out_shape(build_zoo_model("mobilenet_tiny", o), "logits") == Shape{2, 10});
  CHECK(out_shape(build_zoo_model("efficientnet_tiny", o), "logits") == Shape{2, 10});
  CHECK(out_shape(build_zoo_model("vit_tiny", o), "logits") == Shape{2, 10});
  o.seq_len = 16;
  Model bert = build_zoo_model("bert_tiny", o);
  CHECK(out_shape(bert, "last_hidden_state") == Shape{2, 16, 128});
  CHECK(out_shape(bert, "pooler_output") == Shape{2, 128});
  CHECK(out_shape(build_zoo_model("gpt2_tiny", o), "logits") == Shape{2, 16, 1000});
  CHECK(out_shape(build_zoo_model("lstm_tiny", o), "logits") == Shape{16, 2, 100});
  // ssd_tiny at 64x64: levels 4x4 (3 anchors), 2x2, 1x1, 1x1 (6 anchors) = 48 + 24 + 6 + 6.
  Model ssd = build_zoo_model("ssd_tiny", o);
  CHECK(out_shape(ssd, "boxes") == Shape{2, 84, 4});
  CHECK(out_shape(ssd, "scores") == Shape{2, 84, 5});
  CHECK(ssd.graph.type("selected_indices").rank() == 2);
  CHECK(ssd.graph.type("selected_indices").dims[1].value == 3);
}

TEST_CASE("full-size zoo models have the published structure and parameter counts", "[zoo][zoo_full]") {
  struct Expect {
    const char* name;
    int64_t params;  // as published (torchvision / HuggingFace)
  };
  const Expect expects[] = {{"resnet18", 11689512},   {"resnet50", 25557032},        {"mobilenetv2", 3504872},
                            {"efficientnet_b0", 5288548}, {"vgg16", 138357544},     {"bert_base", 109482240},
                            {"gpt2", 124439808},        {"vit_b16", 86567656}};
  for (auto& ex : expects) {
    SECTION(ex.name) {
      Model m = build_zoo_model(ex.name);
      int64_t p = param_count(m.graph);
      INFO(ex.name << ": " << p << " parameters, published " << ex.params);
      CHECK(std::llabs(p - ex.params) <= ex.params / 100);
      // Built layer for layer as torchvision / HuggingFace define them: the counts match exactly.
      CHECK(p == ex.params);
      const Graph& g = m.graph;
      std::string n = ex.name;
      if (n == "resnet50") {
        CHECK(count_op(g, "Conv") == 53);  // stem + 16 bottlenecks x 3 + 4 downsamples
        CHECK(count_op(g, "BatchNormalization") == 53);
        CHECK(count_op(g, "Add") == 16);
        CHECK(count_op(g, "Relu") == 49);
        CHECK(g.type("logits").static_shape() == Shape{1, 1000});
      } else if (n == "resnet18") {
        CHECK(count_op(g, "Conv") == 20);
        CHECK(count_op(g, "Add") == 8);
      } else if (n == "mobilenetv2") {
        CHECK(count_op(g, "Conv") == 52);  // stem + 2 + 16 x 3 + head
        CHECK(count_op(g, "Clip") == 35);  // stem + 1 + 16 x 2 + head
        CHECK(count_op(g, "Add") == 10);
      } else if (n == "efficientnet_b0") {
        CHECK(count_op(g, "Conv") == 81);  // stem + 4 + 15 x 5 + head
        CHECK(count_op(g, "Add") == 9);
        CHECK(count_op(g, "GlobalAveragePool") == 17);  // 16 SE blocks + classifier
      } else if (n == "vgg16") {
        CHECK(count_op(g, "Conv") == 13);
        CHECK(count_op(g, "Gemm") == 3);
        CHECK(count_op(g, "MaxPool") == 5);
        CHECK(count_op(g, "BatchNormalization") == 0);
      } else if (n == "bert_base") {
        CHECK(count_op(g, "Softmax") == 12);
        CHECK(count_op(g, "Erf") == 12);
        CHECK(g.type("last_hidden_state").static_shape() == Shape{1, 128, 768});
      } else if (n == "gpt2") {
        CHECK(count_op(g, "Where") == 12);
        CHECK(count_op(g, "Tanh") == 12);
        CHECK(g.type("logits").static_shape() == Shape{1, 64, 50257});
      } else if (n == "vit_b16") {
        CHECK(count_op(g, "Softmax") == 12);
        CHECK(g.type("logits").static_shape() == Shape{1, 1000});
      }
    }
  }
}

TEST_CASE("ssd_mobilenet and lstm_seq2seq full-size structure", "[zoo][zoo_full]") {
  Model ssd = build_zoo_model("ssd_mobilenet");
  // 19x19x3 + 10x10x6 + 5x5x6 + 3x3x6 + 2x2x6 + 1x1x6 anchors, as SSD-MobileNet at 300x300.
  CHECK(ssd.graph.type("boxes").static_shape() == Shape{1, 1917, 4});
  CHECK(ssd.graph.type("scores").static_shape() == Shape{1, 1917, 91});
  CHECK(count_op(ssd.graph, "NonMaxSuppression") == 1);
  Model lstm = build_zoo_model("lstm_seq2seq");
  CHECK(count_op(lstm.graph, "LSTM") == 8);
  CHECK(lstm.graph.type("logits").static_shape() == Shape{32, 1, 8000});
  // 4 + 4 layers of 4 gates: (4H * (I + H) + 8H) each, two 8000x1024 embeddings, 1024x8000 + 8000 projection.
  int64_t H = 1024;
  CHECK(param_count(lstm.graph) == 8 * (4 * H * (2 * H) + 8 * H) + 3 * 8000 * H + 8000);
}

TEST_CASE("zoo opset forms: LayerNorm and GELU decomposed or as ops", "[zoo]") {
  ZooOptions o;
  o.seq_len = 8;
  o.opset = 13;
  Model b13 = build_zoo_model("bert_tiny", o);
  CHECK(count_op(b13.graph, "LayerNormalization") == 0);
  CHECK(count_op(b13.graph, "Gelu") == 0);
  CHECK(count_op(b13.graph, "Erf") == 2);
  CHECK(count_op(b13.graph, "ReduceMean") == 2 * 5);  // 5 LayerNorms, two means each
  const Node* rm = first_node(b13.graph, "ReduceMean");
  REQUIRE(rm);
  CHECK(rm->inputs.size() == 1);  // axes is an attribute before opset 18
  CHECK(rm->attrs.get_ints("axes") == std::vector<int64_t>{-1});
  const Node* uq = first_node(b13.graph, "Unsqueeze");
  REQUIRE(uq);
  CHECK(uq->inputs.size() == 2);  // axes is an input from opset 13
  CHECK(!uq->attrs.has("axes"));

  o.opset = 17;
  Model b17 = build_zoo_model("bert_tiny", o);
  CHECK(count_op(b17.graph, "LayerNormalization") == 5);
  CHECK(count_op(b17.graph, "ReduceMean") == 0);
  CHECK(count_op(b17.graph, "Gelu") == 0);
  CHECK(count_op(b17.graph, "Erf") == 2);

  o.opset = 20;
  Model b20 = build_zoo_model("bert_tiny", o);
  CHECK(count_op(b20.graph, "LayerNormalization") == 5);
  CHECK(count_op(b20.graph, "Gelu") == 2);
  CHECK(count_op(b20.graph, "Erf") == 0);
  CHECK(first_node(b20.graph, "Gelu")->attrs.get_string("approximate", "") == "none");

  Model g20 = build_zoo_model("gpt2_tiny", o);
  CHECK(count_op(g20.graph, "Gelu") == 2);
  CHECK(first_node(g20.graph, "Gelu")->attrs.get_string("approximate", "") == "tanh");
  CHECK(count_op(g20.graph, "LayerNormalization") == 5);  // 2 per block + ln_f
  o.opset = 13;
  Model g13 = build_zoo_model("gpt2_tiny", o);
  CHECK(count_op(g13.graph, "Gelu") == 0);
  CHECK(count_op(g13.graph, "Tanh") == 2);
  CHECK(count_op(g13.graph, "Pow") == 2 + 5);  // x^3 per GELU, (x-mean)^2 per LayerNorm

  // ReLU6 as Clip with min/max inputs.
  Model mb = build_zoo_model("mobilenet_tiny", o);
  const Node* clip = first_node(mb.graph, "Clip");
  REQUIRE(clip);
  REQUIRE(clip->inputs.size() == 3);
  CHECK(mb.graph.constant_value(clip->inputs[1])->as_double() == 0.0);
  CHECK(mb.graph.constant_value(clip->inputs[2])->as_double() == 6.0);
}

TEST_CASE("zoo opset forms compute the same function", "[zoo]") {
  // The weights are drawn in the same order whatever the opset, so the decomposed and the op
  // forms of LayerNorm/GELU must agree up to rounding.
  for (const char* name : {"bert_tiny", "gpt2_tiny", "vit_tiny"}) {
    SECTION(name) {
      ZooOptions o;
      o.seq_len = 8;
      std::map<int64_t, Tensor> outs;
      TensorMap feeds;
      for (int64_t opset : {13, 17, 20}) {
        o.opset = opset;
        Model m = build_zoo_model(name, o);
        if (feeds.empty()) feeds = feeds_for(m.graph, 3);
        outs[opset] = run_reference(m.graph, feeds).at(m.graph.outputs()[0]);
      }
      CHECK(max_abs_diff(outs[13], outs[17]) < 1e-3f);
      CHECK(max_abs_diff(outs[13], outs[20]) < 1e-3f);
    }
  }
}

TEST_CASE("zoo dynamic axes: symbolic input dims, shape chains, binding makes everything static", "[zoo]") {
  ZooOptions o;
  o.dynamic_batch = true;
  for (auto& e : zoo_models()) {
    if (!e.tiny) continue;
    SECTION(e.name) {
      Model m = build_zoo_model(e.name, o);
      Graph& g = m.graph;
      std::map<std::string, Shape> bind;
      for (auto& in : g.inputs()) {
        const TensorType& t = g.type(in);
        INFO(in << " " << t.str());
        CHECK(!t.is_static());
        Shape s;
        for (auto& d : t.dims) {
          if (d.known()) s.push_back(d.value);
          else if (d.symbol == "batch") s.push_back(3);
          else if (d.symbol == "sequence") s.push_back(5);
          else FAIL("unexpected symbol '" << d.symbol << "'");
        }
        bind[in] = s;
      }
      // Reshape targets of models with reshapes are computed, not constants.
      if (count_op(g, "Reshape") > 0) CHECK(count_op(g, "Shape") > 0);
      // The batch symbol flows from the inputs to the first output.
      const TensorType& out_t = g.type(g.outputs()[0]);
      REQUIRE(out_t.has_shape);
      CHECK(out_t.dims[e.name == "lstm_tiny" ? 1 : 0].symbol == "batch");
      bind_input_shapes(g, bind);
      require_static(g, e.name);
      TensorMap out = run_reference(g, feeds_for(g, 5));
      for (auto& [name, t] : out) require_finite(t, e.name + ":" + name);
      const std::string& o0 = g.outputs()[0];
      if (e.name == "lstm_tiny") CHECK(out.at(o0).dim(1) == 3);
      else CHECK(out.at(o0).dim(0) == 3);
    }
  }
}

TEST_CASE("zoo seeds and batch sizes are honoured", "[zoo]") {
  ZooOptions a, b;
  b.seed = 1;
  Model m0 = build_zoo_model("resnet_tiny", a), m0b = build_zoo_model("resnet_tiny", a), m1 = build_zoo_model("resnet_tiny", b);
  const std::string w = m0.graph.initializer_names().front();
  CHECK(m0.graph.initializer(w).equals(m0b.graph.initializer(w)));
  bool any_diff = false;
  for (auto& name : m0.graph.initializer_names())
    if (m0.graph.initializer(name).dtype() == DType::Float32 && m0.graph.initializer(name).numel() > 8)
      any_diff |= !m0.graph.initializer(name).equals(m1.graph.initializer(name));
  CHECK(any_diff);
  a.batch = 4;
  Model m4 = build_zoo_model("resnet_tiny", a);
  CHECK(m4.graph.type("input").static_shape() == Shape{4, 3, 32, 32});
  ZooOptions too_long;
  too_long.seq_len = 129;  // gpt2_tiny has 128 positions
  CHECK_THROWS_AS(build_zoo_model("gpt2_tiny", too_long), Error);
}

TEST_CASE("gpt2_tiny is causal and bert_tiny honours its attention mask", "[zoo]") {
  ZooOptions o;
  o.seq_len = 6;
  {
    Model m = build_zoo_model("gpt2_tiny", o);
    TensorMap f = random_feeds(m.graph, 11);
    Tensor a = run_reference(m.graph, f).at("logits");
    Tensor ids = f.at("input_ids").clone();
    ids.data<int64_t>()[5] = (ids.data<int64_t>()[5] + 1) % 10;  // change the last token only
    f["input_ids"] = ids;
    Tensor b = run_reference(m.graph, f).at("logits");
    const int64_t V = 1000;
    float before = 0, last = 0;
    for (int64_t s = 0; s < 6; ++s)
      for (int64_t v = 0; v < V; ++v) {
        float d = std::fabs(a.data<float>()[s * V + v] - b.data<float>()[s * V + v]);
        (s < 5 ? before : last) = std::max(s < 5 ? before : last, d);
      }
    CHECK(before == 0.0f);  // earlier positions cannot see the change
    CHECK(last > 0.0f);
  }
  {
    Model m = build_zoo_model("bert_tiny", o);
    TensorMap f = feeds_for(m.graph, 12);  // the last two tokens are padding
    Tensor a = run_reference(m.graph, f).at("last_hidden_state");
    Tensor ids = f.at("input_ids").clone();
    ids.data<int64_t>()[5] = (ids.data<int64_t>()[5] + 1) % 10;  // change a padded token
    f["input_ids"] = ids;
    Tensor b = run_reference(m.graph, f).at("last_hidden_state");
    const int64_t H = 128;
    float unmasked = 0;
    for (int64_t s = 0; s < 4; ++s)
      for (int64_t h = 0; h < H; ++h)
        unmasked = std::max(unmasked, std::fabs(a.data<float>()[s * H + h] - b.data<float>()[s * H + h]));
    // exp(-10000) underflows to 0: padded tokens have no influence on the others.
    CHECK(unmasked < 1e-6f);
  }
}

TEST_CASE("tiny zoo models survive an ONNX export and re-import unchanged", "[zoo]") {
  for (auto& e : zoo_models()) {
    if (!e.tiny) continue;
    SECTION(e.name) {
      ZooOptions o;
      o.seq_len = 8;
      Model m = build_zoo_model(e.name, o);
      Model back = load_model_bytes(save_model_bytes(m));
      REQUIRE(back.graph.outputs() == m.graph.outputs());
      TensorMap feeds = feeds_for(m.graph, 9);
      TensorMap a = run_reference(m.graph, feeds), b = run_reference(back.graph, feeds);
      for (auto& [name, t] : a) {
        INFO(e.name << ":" << name);
        CHECK(t.equals(b.at(name)));
      }
    }
  }
}
