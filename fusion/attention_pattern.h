#pragma once
// Attention chains, fused by the planner into one block that lowers to the fused attention
// kernel (lowering: anchor_op "Attention"; kernels/microkernels/attention.h):
//
//   scores = MatMul(Q, Kt)                       [.., Sq, D] x [.., D, Sk]
//   s      = elementwise chain of scores         scale, additive masks, Where fills, softcaps:
//                                                 every link's only use is the next link
//   p      = Softmax(s, last axis)
//   [p     = Where(IsNaN(p), 0, p)]              the NaN guard of torch's dynamo exporter, and
//                                                 Identity / float Cast / inference Dropout links
//   out    = MatMul(p, V)                        [.., Sq, Sk] x [.., Sk, Dv]
//
// as the legacy and dynamo PyTorch exporters, Hugging Face models and tf2onnx write scaled
// dot-product attention (plain, masked, causal). The pairwise fusion table cannot express this
// block: it holds three Many-to-Many operators, and it is profitable only because the kernel
// never materialises the Sq x Sk scores. Other operands of the chain (a mask, a scale) are read
// by the score transform; Q, Kt and V are read as they lie.
#include <string>
#include <vector>

#include "graph/graph.h"

namespace nnfuse {

struct AttentionChain {
  NodeId qk = kNoNode;       // MatMul(Q, Kt)
  NodeId softmax = kNoNode;
  NodeId pv = kNoNode;       // MatMul(p, V)
  bool nan_guard = false;    // Where(IsNaN(p), 0, p) between the softmax and pv
  std::vector<NodeId> members;  // every node of the chain, topological order
};

// The attention chains of a graph with inferred static shapes (float32 operands only); chains
// whose shapes are not static are skipped (they stay ordinary blocks).
std::vector<AttentionChain> find_attention_chains(const Graph& g);

// The value that reaches MatMul(p, V) from a Softmax: its output through the optional NaN guard
// and links that pass it through unchanged at inference (Identity, Cast to float32 of float32,
// Dropout without training_mode), each the only use of the one before. `guarded`: whether the
// guard is among them; `links` gets their nodes in order.
std::string after_softmax(const Graph& g, NodeId softmax, bool* guarded = nullptr, std::vector<NodeId>* links = nullptr);

}  // namespace nnfuse
