#include "rewrite/classifier.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "graph/op_registry.h"

namespace nnfuse {

const char* const kNetworkClasses[7] = {"residual_cnn", "mobile_cnn", "detector", "transformer_encoder",
                                        "transformer_decoder", "rnn", "generic"};

namespace {

bool is_constant(const Graph& g, const std::string& v) { return g.constant_value(v) != nullptr; }

// Elementwise ops that sit between the attention MatMuls and the Softmax (scale, mask, cast).
bool is_attention_glue(const std::string& op) {
  static const std::unordered_set<std::string> glue = {"Div", "Mul", "Add", "Sub", "Where", "Cast", "Reshape",
                                                       "Transpose", "Softmax", "Identity", "Slice"};
  return glue.count(op) != 0;
}
bool is_matmul(const std::string& op) { return op == "MatMul" || op == "Gemm" || op == "Einsum"; }

// Walks producers from `v` through glue ops (at most `depth` steps) looking for a MatMul.
bool matmul_upstream(const Graph& g, const std::string& v, int depth) {
  if (depth < 0 || v.empty()) return false;
  auto p = g.producer(v);
  if (!p) return false;
  const Node& n = g.node(*p);
  if (is_matmul(n.op_type)) return true;
  if (!is_attention_glue(n.op_type)) return false;
  for (auto& i : n.inputs)
    if (!is_constant(g, i) && matmul_upstream(g, i, depth - 1)) return true;
  return false;
}
bool matmul_downstream(const Graph& g, const std::string& v, int depth) {
  if (depth < 0) return false;
  for (auto& u : g.consumers(v)) {
    const Node& n = g.node(u.node);
    if (is_matmul(n.op_type)) return true;
    if (is_attention_glue(n.op_type))
      for (auto& o : n.outputs)
        if (!o.empty() && matmul_downstream(g, o, depth - 1)) return true;
  }
  return false;
}

// A constant whose last two dims are square and whose values differ across the diagonal
// (a lower-triangular 0/1 or 0/-inf mask), as exporters bake causal masks.
bool triangular_constant(const Tensor& t) {
  if (t.rank() < 2) return false;
  int64_t n = t.dim(-1);
  if (n < 2 || t.dim(-2) != n || n > 4096) return false;
  double below = t.as_double(1 * n + 0), above = t.as_double(0 * n + 1), diag = t.as_double(0);
  if (below == above) return false;
  for (int64_t r = 0; r < std::min<int64_t>(n, 8); ++r)
    for (int64_t c = 0; c < std::min<int64_t>(n, 8); ++c) {
      double v = t.as_double(r * n + c);
      if (c > r && v != above) return false;
      if (c <= r && v != (c == r ? diag : below)) return false;
    }
  return true;
}

// Residual joins: do two values meet after diverging, i.e. is the second an ancestor of the
// first, or do they share a non-constant ancestor, within `depth` producer steps? The value graph
// is indexed once per classification (each edge's constness decided once), and each walk marks
// what it reaches with a fresh stamp instead of building a set of names: a BERT-base export has
// ~100 candidate Adds, each walking up to 24 steps.
class ResidualWalker {
 public:
  explicit ResidualWalker(const Graph& g) {
    for (NodeId nid : g.node_ids()) {
      const Node& n = g.node(nid);
      std::vector<int> reads;
      for (auto& i : n.inputs)
        if (!i.empty() && !is_constant(g, i)) reads.push_back(index(i));
      for (auto& o : n.outputs)
        if (!o.empty()) reads_[size_t(index(o))] = reads;
    }
  }

  bool joins(const std::string& a, const std::string& b) {
    const int ia = index(a), ib = index(b);
    mark_a_.resize(reads_.size(), 0);  // a name first seen here (no producer, no reads)
    mark_b_.resize(reads_.size(), 0);
    ++stamp_;
    walk(ia, mark_a_, nullptr);
    if (mark_a_[size_t(ib)] == stamp_) return true;  // identity shortcut: b feeds a
    reached_b_.clear();
    walk(ib, mark_b_, &reached_b_);
    for (int x : reached_b_)
      if (x != ib && mark_a_[size_t(x)] == stamp_) return true;
    return false;
  }

 private:
  static constexpr int kDepth = 24;
  std::unordered_map<std::string_view, int> ids_;  // views into the graph's names (const here)
  std::vector<std::vector<int>> reads_;             // value -> non-constant inputs of its producer
  std::vector<uint32_t> mark_a_, mark_b_;
  std::vector<int> reached_b_;
  std::vector<std::pair<int, int>> stack_;
  uint32_t stamp_ = 0;

  int index(std::string_view v) {
    auto [it, added] = ids_.emplace(v, int(reads_.size()));
    if (added) reads_.emplace_back();
    return it->second;
  }
  // Depth-first from v, a value counted when first popped and expanded only below kDepth (as
  // the name-set walk it replaces did, so the features are unchanged).
  void walk(int v, std::vector<uint32_t>& mark, std::vector<int>* reached) {
    stack_.assign(1, {v, 0});
    while (!stack_.empty()) {
      auto [x, d] = stack_.back();
      stack_.pop_back();
      if (mark[size_t(x)] == stamp_) continue;
      mark[size_t(x)] = stamp_;
      if (reached) reached->push_back(x);
      if (d >= kDepth) continue;
      for (int i : reads_[size_t(x)]) stack_.push_back({i, d + 1});
    }
  }
};

}  // namespace

namespace {

struct FlopSums {
  double total = 0, conv = 0, mm = 0, rec = 0;
};

// Counts g's operators into f, and those of the bodies of its If/Loop/Scan nodes, recursively:
// the work inside control flow is the model's work too (Silero VAD's older exports hold the
// whole network in an If; both branches count, as either may run).
void add_features(const Graph& g, GraphFeatures& f, FlopSums& fs) {
  double& total_flops = fs.total;
  double& conv_flops = fs.conv;
  double& mm_flops = fs.mm;
  double& rec_flops = fs.rec;
  std::optional<ResidualWalker> residual;  // built at the first candidate join
  for (NodeId id : g.node_ids()) {
    const Node& n = g.node(id);
    if (n.op_type == "Constant") continue;
    for (auto& [k, a] : n.attrs.all()) {
      if (a.kind == Attribute::Kind::Graph && a.g) add_features(*a.g, f, fs);
      if (a.kind == Attribute::Kind::Graphs)
        for (auto& b : a.graphs)
          if (b) add_features(*b, f, fs);
    }
    ++f.ops;
    ++f.histogram[n.op_type];
    double fl = 0;
    try { fl = node_flops(g, id); } catch (const Error&) {}
    total_flops += fl;
    const std::string& op = n.op_type;
    if (op == "Conv" || op == "ConvTranspose") {
      ++f.convs;
      conv_flops += fl;
      if (op == "ConvTranspose") ++f.transposed_convs;
      int64_t group = n.attrs.get_int("group", 1);
      int64_t cin = -1;
      if (!n.inputs.empty() && g.type(n.inputs[0]).rank() >= 2 && g.type(n.inputs[0]).dims[1].known()) cin = g.type(n.inputs[0]).dims[1].value;
      if (group > 1 && group == cin) ++f.depthwise_convs;
      else if (group > 1) ++f.grouped_convs;
      auto ks = n.attrs.get_ints("kernel_shape");
      if (ks.empty() && n.inputs.size() > 1 && g.type(n.inputs[1]).is_static()) {
        auto ws = g.type(n.inputs[1]).static_shape();
        ks.assign(ws.begin() + 2, ws.end());
      }
      if (group == 1 && !ks.empty() && std::all_of(ks.begin(), ks.end(), [](int64_t k) { return k == 1; })) ++f.pointwise_convs;
    } else if (is_matmul(op)) {
      ++f.matmuls;
      mm_flops += fl;
    } else if (op == "LSTM" || op == "GRU" || op == "RNN" || op == "Loop" || op == "Scan") {
      ++f.recurrent;
      rec_flops += fl;
    } else if (op == "NonMaxSuppression") {
      ++f.nms;
    } else if (op == "BatchNormalization") {
      ++f.batch_norms;
    } else if (op == "LayerNormalization" || op == "RMSNormalization") {
      ++f.layer_norms;
    } else if (op == "Attention") {  // opset 23: a whole attention block as one op
      ++f.attention_blocks;
      mm_flops += fl;
      if (n.attrs.get_int("is_causal", 0) != 0) ++f.causal_masks;
    } else if (op == "InstanceNormalization") {
      ++f.instance_norms;
    } else if (op == "GroupNormalization") {
      ++f.group_norms;
    } else if (op == "Trilu") {
      ++f.causal_masks;
    } else if (op == "Gather" && n.inputs.size() == 2) {
      const Tensor* w = g.constant_value(n.inputs[0]);
      if (w && w->rank() == 2 && dtype_is_integer(g.type(n.inputs[1]).dtype)) ++f.embeddings;
    } else if (op == "ReduceMean" && !n.outputs.empty()) {
      // Decomposed LayerNorm: x - mean(x), squared, mean again.
      for (auto& u : g.consumers(n.outputs[0])) {
        const Node& sub = g.node(u.node);
        if (sub.op_type != "Sub") continue;
        for (auto& u2 : g.consumers(sub.outputs[0])) {
          const Node& sq = g.node(u2.node);
          if (sq.op_type == "Pow" || sq.op_type == "Mul") {
            for (auto& u3 : g.consumers(sq.outputs[0]))
              if (g.node(u3.node).op_type == "ReduceMean") ++f.decomposed_layer_norms;
          }
        }
      }
    } else if (op == "Softmax" && !n.inputs.empty()) {
      if (matmul_upstream(g, n.inputs[0], 6) && matmul_downstream(g, n.outputs[0], 3)) {
        ++f.attention_blocks;
        // A causal mask: a triangular constant (or Trilu output) among the glue inputs.
        std::function<bool(const std::string&, int)> causal = [&](const std::string& v, int d) -> bool {
          if (d < 0 || v.empty()) return false;
          if (const Tensor* t = g.constant_value(v)) return triangular_constant(*t);
          auto p = g.producer(v);
          if (!p) return false;
          const Node& pn = g.node(*p);
          if (pn.op_type == "Trilu") return true;
          if (is_matmul(pn.op_type) && d < 6) return false;
          for (auto& i : pn.inputs)
            if (causal(i, d - 1)) return true;
          return false;
        };
        if (causal(n.inputs[0], 8)) ++f.causal_masks;
      }
    }
    if ((op == "Add" || op == "Sum") && n.inputs.size() == 2 && !is_constant(g, n.inputs[0]) && !is_constant(g, n.inputs[1])) {
      const TensorType& a = g.type(n.inputs[0]);
      const TensorType& b = g.type(n.inputs[1]);
      if (a.has_shape && a == b && a.rank() >= 3) {
        // Two activations of one shape that meet after diverging: the second input is an
        // ancestor of the first (identity shortcut), or they share an ancestor.
        if (!residual) residual.emplace(g);
        if (residual->joins(n.inputs[0], n.inputs[1])) ++f.residual_joins;
      }
    }
  }
}

}  // namespace

GraphFeatures extract_features(const Graph& g) {
  GraphFeatures f;
  FlopSums fs;
  add_features(g, f, fs);
  f.flops = fs.total;
  if (fs.total > 0) {
    f.conv_flop_share = fs.conv / fs.total;
    f.matmul_flop_share = fs.mm / fs.total;
    f.recurrent_flop_share = fs.rec / fs.total;
  }
  return f;
}

Classification classify(const Graph& g) {
  Classification c;
  GraphFeatures& f = c.features = extract_features(g);
  auto why = [&](const std::string& s) { c.reasons.push_back(s); };
  // Candidate scores in [0, 1]; the best is primary, a second strong one is secondary.
  std::map<std::string, double> score;
  if (f.recurrent > 0) {
    score["rnn"] = 0.6 + 0.4 * std::max(f.recurrent_flop_share, f.recurrent >= 2 ? 0.5 : 0.0);
    why(std::to_string(f.recurrent) + " recurrent ops (LSTM/GRU/RNN/Loop/Scan), " +
        std::to_string(int(100 * f.recurrent_flop_share)) + "% of FLOPs");
  }
  if (f.nms > 0) {
    score["detector"] = 1.0;  // NMS is decisive: a detector is primary over its backbone
    why(std::to_string(f.nms) + " NonMaxSuppression (detection head)");
  }
  if (f.attention_blocks > 0) {
    double s = 0.7 + 0.3 * std::min(1.0, f.attention_blocks / 2.0);
    bool decoder = f.causal_masks > 0;
    score[decoder ? "transformer_decoder" : "transformer_encoder"] = s;
    why(std::to_string(f.attention_blocks) + " attention blocks (MatMul->Softmax->MatMul)" +
        (decoder ? ", " + std::to_string(f.causal_masks) + " causal masks" : ", no causal mask"));
  }
  if (f.convs >= 5) {
    double dw_share = double(f.depthwise_convs) / f.convs;
    if (dw_share >= 0.15) {
      score["mobile_cnn"] = 0.7 + 0.3 * std::min(1.0, dw_share / 0.3);
      why(std::to_string(f.depthwise_convs) + " of " + std::to_string(f.convs) + " convolutions depthwise");
    } else if (f.residual_joins >= 2) {
      score["residual_cnn"] = 0.7 + 0.3 * std::min(1.0, f.residual_joins / 8.0);
      why(std::to_string(f.residual_joins) + " residual joins over " + std::to_string(f.convs) + " convolutions");
    } else {
      why(std::to_string(f.convs) + " convolutions without residual joins or depthwise layers (plain CNN)");
    }
  }
  // Convolutions that carry most of the FLOPs in a transformer graph make a hybrid; a single
  // patch-embedding conv (ViT) does not.
  if (score.empty()) {
    c.primary = "generic";
    c.confidence = 1.0 - std::min(1.0, (f.convs >= 5 ? 0.3 : 0.0));
    if (c.reasons.empty()) why("no class-specific structure found");
    return c;
  }
  std::vector<std::pair<double, std::string>> ranked;
  for (auto& [k, v] : score) ranked.push_back({v, k});
  std::sort(ranked.rbegin(), ranked.rend());
  // A detector is primary over its backbone; the backbone becomes secondary.
  c.primary = ranked[0].second;
  c.confidence = ranked[0].first;
  if (ranked.size() > 1 && ranked[1].first >= kMinConfidence) c.secondary = ranked[1].second;
  if (c.confidence < kMinConfidence) {
    why("confidence " + std::to_string(c.confidence) + " below " + std::to_string(kMinConfidence) + ": generic");
    c.secondary = c.primary;
    c.primary = "generic";
  }
  return c;
}

}  // namespace nnfuse
