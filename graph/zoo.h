#pragma once
// The built-in model zoo: C++ builders of real architectures with their published layer
// configurations and seeded random weights, built as framework exporters emit them.
#include <functional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace nnfuse {

struct ZooOptions {
  uint64_t seed = 0;
  // 13: LayerNorm/GELU decomposed into primitive ops as opset-13 exports show them;
  // 17: LayerNormalization op; 20: LayerNormalization and Gelu ops.
  int64_t opset = 13;
  int64_t batch = 1;
  int64_t seq_len = 0;  // 0: the model's default (BERT 128, GPT-2 64, LSTM 32)
  bool dynamic_batch = false;  // batch (and sequence) dims symbolic, as exporters with dynamic axes write them
};

struct ZooEntry {
  std::string name;
  std::string description;
  std::string network_class;  // residual_cnn, mobile_cnn, detector, transformer_encoder, transformer_decoder, rnn, generic
  bool tiny = false;          // small enough for every test run
  std::function<Model(const ZooOptions&)> build;
};

const std::vector<ZooEntry>& zoo_models();
// Throws Invalid naming the known models when `name` is unknown.
Model build_zoo_model(const std::string& name, const ZooOptions& opt = {});

}  // namespace nnfuse
