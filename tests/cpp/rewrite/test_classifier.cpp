#include <catch2/catch.hpp>

#include "graph/builder.h"
#include "graph/zoo.h"
#include "rewrite/classifier.h"

using namespace nnfuse;

TEST_CASE("every zoo model is classified as its architecture", "[classifier][zoo]") {
  for (auto& e : zoo_models()) {
    // Full-size models cost seconds of random weights each: one form for them, two for tiny ones.
    std::vector<int64_t> opsets = e.tiny ? std::vector<int64_t>{13, 17} : std::vector<int64_t>{13};
    for (int64_t opset : opsets) {
      ZooOptions o;
      o.opset = opset;
      Model m = e.build(o);
      Classification c = classify(m.graph);
      INFO(e.name << " opset " << opset << ": got " << c.primary << " (" << c.confidence << ")");
      for (auto& r : c.reasons) INFO("  " << r);
      REQUIRE(c.primary == e.network_class);
      if (e.network_class != "generic") REQUIRE(c.confidence >= kMinConfidence);
      REQUIRE_FALSE(c.reasons.empty());
      if (e.network_class == "detector") REQUIRE(c.secondary == "mobile_cnn");
    }
  }
}

TEST_CASE("hand-built graphs of each class", "[classifier]") {
  SECTION("an MLP is generic") {
    GraphBuilder b("mlp");
    auto x = b.input("x", DType::Float32, {1, 16});
    auto h = b.op("Relu", {b.op("Gemm", {x, b.weight("w", {16, 16})})});
    b.output(b.op("Gemm", {h, b.weight("w2", {16, 4})}));
    Classification c = classify(b.finish().graph);
    REQUIRE(c.primary == "generic");
    REQUIRE(c.features.matmuls == 2);
  }
  SECTION("self-attention without a mask is an encoder, with a triangular mask a decoder") {
    for (bool causal : {false, true}) {
      GraphBuilder b("attn");
      auto x = b.input("x", DType::Float32, {1, 8, 16});
      auto q = b.op("MatMul", {x, b.weight("wq", {16, 16})});
      auto k = b.op("MatMul", {x, b.weight("wk", {16, 16})});
      auto v = b.op("MatMul", {x, b.weight("wv", {16, 16})});
      auto kt = b.op("Transpose", {k}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1})}}));
      auto s = b.op("Div", {b.op("MatMul", {q, kt}), b.scalar("scale", 4.0f)});
      if (causal) {
        std::vector<float> mask(64);
        for (int r = 0; r < 8; ++r)
          for (int col = 0; col < 8; ++col) mask[size_t(r * 8 + col)] = col > r ? -1e4f : 0.0f;
        s = b.op("Add", {s, b.constant("mask", Tensor::from_vector<float>({8, 8}, mask))});
      }
      auto p = b.op("Softmax", {s}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
      b.output(b.op("MatMul", {p, v}));
      Classification c = classify(b.finish().graph);
      REQUIRE(c.features.attention_blocks == 1);
      REQUIRE(c.primary == (causal ? "transformer_decoder" : "transformer_encoder"));
    }
  }
  SECTION("an LSTM is an rnn") {
    GraphBuilder b("rnn");
    auto x = b.input("x", DType::Float32, {4, 1, 8});
    auto outs = b.op_n("LSTM", {x, b.weight("w", {1, 64, 8}), b.weight("r", {1, 64, 16})}, 1,
                       GraphBuilder::attrs({{"hidden_size", A::i(16)}}));
    b.output(outs[0]);
    Classification c = classify(b.finish().graph);
    REQUIRE(c.primary == "rnn");
  }
}
