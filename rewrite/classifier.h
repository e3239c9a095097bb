#pragma once
// The network classifier: from graph features alone, which kind of network is this? The class
// picks the pass pipeline (rules/pipelines/<class>.pipeline); a low-confidence graph is
// `generic` and gets the `full` pipeline.
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace nnfuse {

// Class names as the pipelines and reports spell them.
extern const char* const kNetworkClasses[7];  // residual_cnn, mobile_cnn, detector, transformer_encoder,
                                              // transformer_decoder, rnn, generic

struct GraphFeatures {
  int ops = 0;                 // operators (Constant nodes excluded)
  int convs = 0;               // Conv + ConvTranspose
  int depthwise_convs = 0;     // group == input channels > 1
  int grouped_convs = 0;       // 1 < group < input channels
  int pointwise_convs = 0;     // 1x1, group 1
  int transposed_convs = 0;
  int residual_joins = 0;      // Add/Sum of two activations of equal shape from diverging paths
  int matmuls = 0;             // MatMul, Gemm, Einsum
  int attention_blocks = 0;    // MatMul -> (scale/mask)* -> Softmax -> MatMul
  int causal_masks = 0;        // Trilu, or a triangular constant feeding the attention scores
  int nms = 0;                 // NonMaxSuppression
  int recurrent = 0;           // LSTM, GRU, RNN, Loop, Scan
  int batch_norms = 0, layer_norms = 0, instance_norms = 0, group_norms = 0;
  int decomposed_layer_norms = 0;  // ReduceMean -> Sub -> Pow/Mul -> ReduceMean chains
  int embeddings = 0;          // Gather from a 2-D weight with integer indices
  double conv_flop_share = 0, matmul_flop_share = 0, recurrent_flop_share = 0;
  double flops = 0;            // FLOPs of the operators whose shapes allow a count (a lower bound)
  std::map<std::string, int> histogram;  // op type -> count
};

struct Classification {
  std::string primary = "generic";
  std::string secondary;  // hybrid networks: a backbone/head of another class ("" if none)
  double confidence = 0;  // 0..1
  std::vector<std::string> reasons;  // the features that decided it, in words
  GraphFeatures features;
};

GraphFeatures extract_features(const Graph& g);
Classification classify(const Graph& g);
// Confidence below this gives `generic` (and the `full` pipeline).
constexpr double kMinConfidence = 0.6;

}  // namespace nnfuse
