// Classic-ML ops that exported scikit-learn and text pipelines hold: Binarizer,
// ArrayFeatureExtractor and TreeEnsemble (domain ai.onnx.ml) and TfIdfVectorizer (ai.onnx 9).
//
// Binarizer: 1 where x > threshold, else 0, in x's type.
// ArrayFeatureExtractor: the last axis of X gathered at the int64 indices Y (any shape, read
//   flat): [..., len(Y)]; a 1-D X gives [1, len(Y)] (as ONNX Runtime and the ONNX reference do).
// TfIdfVectorizer: counts, per row of an int input ([C] or [B, C]), the pool's n-grams of
//   min_gram_length..max_gram_length items, their items max_skip_count or fewer apart (the same
//   skip between every two items of one n-gram; unigrams once), into the output slot
//   ngram_indexes gives each n-gram; mode TF gives the counts, IDF the weight (1 without weights)
//   where the count is non-zero, TFIDF count x weight. String pools are not supported (no string
//   tensors).
// TreeEnsemble (ai.onnx.ml 5): every row of X [N, F] walks each tree from its root (node i: go
//   to the true branch where x[feature] <= / < / >= / > / == / != split, or is in the node's set
//   of membership_values, or is NaN and nodes_missing_value_tracks_true; nodes_*leafs say whether
//   a branch id names a leaf), and the leaves' weights are aggregated per target (SUM, AVERAGE,
//   MIN, MAX; a target no leaf reaches is 0, as in ONNX Runtime, where the ONNX reference leaves
//   MIN/MAX at the float range's end) into Y [N, n_targets]; post_transform by the spec's
//   numbering, NONE (0), SOFTMAX (1), LOGISTIC (2) or SOFTMAX_ZERO (3) (PROBIT is refused).
//   ONNX Runtime 1.23 swaps 1 and 2 (its own enum's order): it applies a logistic for 1; and
//   its SOFTMAX_ZERO of a row of zeros is NaN (0 / 0), ours stays zeros.
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "graph/ops_common.h"
#include "graph/ops_tensor_util.h"

namespace nnfuse::tensor_ops {

namespace {

template <class T>
void binarize(const Tensor& x, double threshold, Tensor& y) {
  const T* a = x.data<T>();
  T* b = y.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) b[i] = to_double(a[i]) > threshold ? from_double<T>(1.0) : from_double<T>(0.0);
}

std::vector<Tensor> kernel_binarizer(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const double threshold = c.node.attrs.get_float("threshold", 0.f);
  Tensor y(x.dtype(), x.shape());
  switch (x.dtype()) {
    case DType::Float32: binarize<float>(x, threshold, y); break;
    case DType::Float64: binarize<double>(x, threshold, y); break;
    case DType::Int64: binarize<int64_t>(x, threshold, y); break;
    case DType::Int32: binarize<int32_t>(x, threshold, y); break;
    default: c.unsupported(std::string("Binarizer of ") + dtype_name(x.dtype()));
  }
  return {y};
}

InferResult infer_binarizer(const InferContext& c) {
  const DType t = c.input(0).dtype;
  if (t != DType::Float32 && t != DType::Float64 && t != DType::Int64 && t != DType::Int32)
    c.error(std::string("X must be float, double, int64 or int32, got ") + dtype_name(t));
  return infer_same_as(c);
}

// ---- ArrayFeatureExtractor -------------------------------------------------------------------

std::vector<Tensor> kernel_array_feature_extractor(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& idx = c.input(1);
  if (x.rank() < 1) c.error("X must have at least one dimension, got a scalar");
  if (idx.dtype() != DType::Int64) c.error(std::string("Y must be int64, got ") + dtype_name(idx.dtype()));
  const int64_t n = x.shape().back(), k = idx.numel(), rows = x.numel() / std::max<int64_t>(n, 1);
  const std::vector<int64_t> at = idx.to_int_vector();
  for (int64_t j = 0; j < k; ++j)
    if (at[size_t(j)] < 0 || at[size_t(j)] >= n)
      c.error("index Y[" + std::to_string(j) + "] = " + std::to_string(at[size_t(j)]) + " is outside the last axis of X, of size " +
              std::to_string(n));
  Shape out = x.rank() == 1 ? Shape{1, k} : x.shape();
  out.back() = k;
  Tensor y(x.dtype(), out);
  const size_t es = dtype_size(x.dtype());
  const auto* src = static_cast<const uint8_t*>(x.raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  for (int64_t r = 0; r < (x.rank() == 1 ? 1 : rows); ++r)
    for (int64_t j = 0; j < k; ++j) std::memcpy(dst + size_t(r * k + j) * es, src + size_t(r * n + at[size_t(j)]) * es, es);
  return {y};
}

InferResult infer_array_feature_extractor(const InferContext& c) {
  const TensorType& x = c.input(0);
  const TensorType& i = c.input(1);
  if (i.dtype != DType::Int64) c.error(std::string("Y must be int64, got ") + dtype_name(i.dtype));
  if (x.dtype == DType::String) c.error("string X is not supported");
  if (!x.has_shape) return infer_one(TensorType::unknown_shape(x.dtype));
  if (x.rank() < 1) c.error("X must have at least one dimension, got a scalar");
  Dim k;
  if (i.has_shape) {
    int64_t n = 1;
    bool known = true;
    for (const Dim& d : i.dims) known = known && d.known(), n *= d.known() ? d.value : 1;
    if (known) k = Dim(n);
  }
  std::vector<Dim> out = x.rank() == 1 ? std::vector<Dim>{Dim(1), k} : x.dims;
  out.back() = k;
  return infer_one(TensorType(x.dtype, out));
}

// ---- TfIdfVectorizer ---------------------------------------------------------------------------

struct TfIdfParams {
  int64_t min_gram = 1, max_gram = 1, max_skip = 0, output_size = 0;
  enum Mode { TF, IDF, TFIDF } mode = TF;
  std::map<std::vector<int64_t>, int64_t> slot;  // pool n-gram (of a counted length) -> output slot
  std::vector<float> weights;
};

TfIdfParams tfidf_params(const Node& n, const std::function<void(const std::string&)>& error) {
  TfIdfParams p;
  const Attributes& a = n.attrs;
  p.min_gram = a.get_int("min_gram_length", 1);
  p.max_gram = a.get_int("max_gram_length", 1);
  p.max_skip = a.get_int("max_skip_count", 0);
  if (p.min_gram < 1 || p.max_gram < p.min_gram || p.max_skip < 0)
    error("min_gram_length " + std::to_string(p.min_gram) + ", max_gram_length " + std::to_string(p.max_gram) + ", max_skip_count " +
          std::to_string(p.max_skip) + ": expected 1 <= min <= max and a skip count >= 0");
  const std::string mode = a.get_string("mode", "");
  if (mode == "TF") p.mode = TfIdfParams::TF;
  else if (mode == "IDF") p.mode = TfIdfParams::IDF;
  else if (mode == "TFIDF") p.mode = TfIdfParams::TFIDF;
  else error("mode '" + mode + "': expected TF, IDF or TFIDF");
  if (a.has("pool_strings")) error("string pools (pool_strings) are not supported: nnfuse has no string tensors");
  const std::vector<int64_t> pool = a.get_ints("pool_int64s"), counts = a.get_ints("ngram_counts"), slots = a.get_ints("ngram_indexes");
  p.weights = a.get_floats("weights");
  // ngram_counts[i]: where the n-grams of i + 1 items start in the pool; n-gram ids run over every
  // length in order, and ngram_indexes gives each id its output slot.
  size_t id = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t len = int64_t(i) + 1, begin = counts[i], end = i + 1 < counts.size() ? counts[i + 1] : int64_t(pool.size());
    if (begin < 0 || end < begin || end > int64_t(pool.size()) || (end - begin) % len != 0)
      error("ngram_counts[" + std::to_string(i) + "] = " + std::to_string(begin) + " does not start whole " + std::to_string(len) +
            "-grams in a pool of " + std::to_string(pool.size()));
    for (int64_t at = begin; at < end; at += len, ++id) {
      if (id >= slots.size()) error("ngram_indexes has " + std::to_string(slots.size()) + " entries, fewer than the pool's n-grams");
      if (slots[id] < 0) error("ngram_indexes[" + std::to_string(id) + "] = " + std::to_string(slots[id]) + " is negative");
      p.output_size = std::max(p.output_size, slots[id] + 1);
      if (len >= p.min_gram && len <= p.max_gram) p.slot[std::vector<int64_t>(pool.begin() + at, pool.begin() + at + len)] = slots[id];
    }
  }
  for (int64_t s : slots) p.output_size = std::max(p.output_size, s + 1);
  if (!p.weights.empty() && int64_t(p.weights.size()) < p.output_size)
    error("weights has " + std::to_string(p.weights.size()) + " entries for " + std::to_string(p.output_size) + " output slots");
  return p;
}

std::vector<Tensor> kernel_tfidf(const KernelContext& c) {
  const TfIdfParams p = tfidf_params(c.node, [&](const std::string& m) { c.error(m); });
  const Tensor& x = c.input(0);
  if (x.dtype() != DType::Int64 && x.dtype() != DType::Int32) c.unsupported(std::string("TfIdfVectorizer of ") + dtype_name(x.dtype()));
  if (x.rank() > 2) c.error("X must be [C] or [B, C], got " + shape_str(x.shape()));
  const int64_t rows = x.rank() == 2 ? x.shape()[0] : 1, C = x.rank() == 0 ? 1 : x.shape().back();
  const std::vector<int64_t> v = x.to_int_vector();
  // The slots come from ngram_indexes, so their count is the file's to choose: checked against the
  // tensor limit (the counts are int64) before anything is allocated.
  tensor_bytes_checked(DType::Int64, {rows, p.output_size});
  std::vector<int64_t> count(size_t(rows * p.output_size), 0);
  std::vector<int64_t> gram;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* row = v.data() + r * C;
    // Items skip - 1 apart for skip = 1 .. max_skip + 1; unigrams only at skip 1 (they have no
    // gap, so every skip would count them again).
    for (int64_t skip = 1; skip <= p.max_skip + 1; ++skip) {
      const int64_t shortest = skip == 1 ? p.min_gram : std::max<int64_t>(p.min_gram, 2);
      if (shortest > p.max_gram) break;
      for (int64_t start = 0; start < C; ++start) {
        gram.clear();
        for (int64_t at = start; at < C && int64_t(gram.size()) < p.max_gram; at += skip) {
          gram.push_back(row[at]);
          if (int64_t(gram.size()) < shortest) continue;
          auto it = p.slot.find(gram);
          if (it != p.slot.end()) ++count[size_t(r * p.output_size + it->second)];
        }
      }
    }
  }
  Tensor y(DType::Float32, x.rank() == 2 ? Shape{rows, p.output_size} : Shape{p.output_size});
  float* out = y.data<float>();
  for (size_t i = 0; i < count.size(); ++i) {
    const float w = p.weights.empty() ? 1.f : p.weights[i % size_t(p.output_size)];
    const float f = float(count[i]);
    out[i] = p.mode == TfIdfParams::TF ? f : p.mode == TfIdfParams::IDF ? (count[i] > 0 ? w : 0.f) : f * w;
  }
  return {y};
}

InferResult infer_tfidf(const InferContext& c) {
  const TfIdfParams p = tfidf_params(c.node, [&](const std::string& m) { c.error(m); });
  const TensorType& x = c.input(0);
  if (x.dtype != DType::Int64 && x.dtype != DType::Int32) c.error(std::string("X must be int32 or int64, got ") + dtype_name(x.dtype));
  if (!x.has_shape) return infer_one(TensorType::unknown_shape(DType::Float32));
  if (x.rank() > 2) c.error("X must be [C] or [B, C], got rank " + std::to_string(x.rank()));
  std::vector<Dim> out{Dim(p.output_size)};
  if (x.rank() == 2) out.insert(out.begin(), x.dims[0]);
  return infer_one(TensorType(DType::Float32, out));
}

// ---- TreeEnsemble -------------------------------------------------------------------------------

struct TreeEnsembleParams {
  enum Mode { LEQ, LT, GTE, GT, EQ, NEQ, MEMBER };
  std::vector<double> splits, leaf_weights;
  std::vector<int64_t> features, modes, true_ids, false_ids, true_leaf, false_leaf, leaf_targets, roots, missing_true;
  std::vector<std::vector<double>> members;  // per node: its set (MEMBER nodes only)
  int64_t n_targets = 0, aggregate = 1, post = 0;
};

std::vector<double> tensor_attr(const Node& n, const char* name, const std::function<void(const std::string&)>& error) {
  const Attribute* a = n.attrs.find(name);
  if (!a) return {};
  if (a->kind != Attribute::Kind::Tensor) error(std::string(name) + " must be a tensor attribute");
  return a->t.to_double_vector();
}

TreeEnsembleParams tree_params(const Node& n, const std::function<void(const std::string&)>& error) {
  TreeEnsembleParams p;
  const Attributes& a = n.attrs;
  p.splits = tensor_attr(n, "nodes_splits", error);
  p.leaf_weights = tensor_attr(n, "leaf_weights", error);
  for (double m : tensor_attr(n, "nodes_modes", error)) p.modes.push_back(int64_t(m));
  p.features = a.get_ints("nodes_featureids");
  p.true_ids = a.get_ints("nodes_truenodeids");
  p.false_ids = a.get_ints("nodes_falsenodeids");
  p.true_leaf = a.get_ints("nodes_trueleafs");
  p.false_leaf = a.get_ints("nodes_falseleafs");
  p.leaf_targets = a.get_ints("leaf_targetids");
  p.roots = a.get_ints("tree_roots");
  p.missing_true = a.get_ints("nodes_missing_value_tracks_true");
  p.n_targets = a.get_int("n_targets", 0);
  p.aggregate = a.get_int("aggregate_function", 1);
  p.post = a.get_int("post_transform", 0);
  const size_t nodes = p.splits.size(), leaves = p.leaf_weights.size();
  for (auto [what, size] : {std::pair{"nodes_featureids", p.features.size()}, std::pair{"nodes_modes", p.modes.size()},
                            std::pair{"nodes_truenodeids", p.true_ids.size()}, std::pair{"nodes_falsenodeids", p.false_ids.size()},
                            std::pair{"nodes_trueleafs", p.true_leaf.size()}, std::pair{"nodes_falseleafs", p.false_leaf.size()}})
    if (size != nodes)
      error(std::string(what) + " has " + std::to_string(size) + " entries for " + std::to_string(nodes) + " nodes_splits");
  if (!p.missing_true.empty() && p.missing_true.size() != nodes) error("nodes_missing_value_tracks_true must have one entry per node");
  if (p.leaf_targets.size() != leaves) error("leaf_targetids and leaf_weights differ in length");
  if (p.n_targets < 1) error("n_targets must be at least 1");
  if (p.aggregate < 0 || p.aggregate > 3) error("aggregate_function " + std::to_string(p.aggregate) + ": expected 0 to 3");
  if (p.post < 0 || p.post > 4) error("post_transform " + std::to_string(p.post) + ": expected 0 to 4");
  for (size_t i = 0; i < nodes; ++i) {
    if (p.modes[i] < 0 || p.modes[i] > TreeEnsembleParams::MEMBER) error("nodes_modes[" + std::to_string(i) + "] is not a mode");
    for (auto [id, leaf] : {std::pair{p.true_ids[i], p.true_leaf[i]}, std::pair{p.false_ids[i], p.false_leaf[i]}})
      if (id < 0 || size_t(id) >= (leaf ? leaves : nodes))
        error("node " + std::to_string(i) + " branches to " + (leaf ? "leaf " : "node ") + std::to_string(id) + " of " +
              std::to_string(leaf ? leaves : nodes));
    if (p.features[i] < 0) error("nodes_featureids[" + std::to_string(i) + "] is negative");
  }
  for (size_t l = 0; l < leaves; ++l)
    if (p.leaf_targets[l] < 0 || p.leaf_targets[l] >= p.n_targets)
      error("leaf_targetids[" + std::to_string(l) + "] = " + std::to_string(p.leaf_targets[l]) + " is not one of the " +
            std::to_string(p.n_targets) + " targets");
  for (int64_t r : p.roots)
    if (r < 0 || size_t(r) >= std::max(nodes, leaves)) error("tree root " + std::to_string(r) + " names no node");
  // Membership sets: the values between NaNs, one run per MEMBER node in node order.
  const std::vector<double> mv = tensor_attr(n, "membership_values", error);
  p.members.resize(nodes);
  size_t at = 0;
  for (size_t i = 0; i < nodes; ++i) {
    if (p.modes[i] != TreeEnsembleParams::MEMBER) continue;
    if (at >= mv.size()) error("membership_values has no set for member node " + std::to_string(i));
    for (; at < mv.size() && !std::isnan(mv[at]); ++at) p.members[i].push_back(mv[at]);
    ++at;  // the NaN
  }
  return p;
}

std::vector<Tensor> kernel_tree_ensemble(const KernelContext& c) {
  auto error = [&](const std::string& m) { c.error(m); };
  const TreeEnsembleParams p = tree_params(c.node, error);
  if (p.post == 4) c.unsupported("TreeEnsemble with post_transform PROBIT");
  const Tensor& X = c.input(0);
  if (X.rank() != 2) c.error("X must be [N, F], got " + shape_str(X.shape()));
  const int64_t N = X.shape()[0], F = X.shape()[1], T = p.n_targets;
  for (int64_t f : p.features)
    if (f >= F) c.error("a node tests feature " + std::to_string(f) + " of " + std::to_string(F));
  // In double: a float64 X compared with float64 splits must not be rounded to float first.
  const std::vector<double> x = X.to_double_vector();
  const size_t nodes = p.splits.size();
  Tensor Y(DType::Float64, {N, T});  // n_targets is the file's to choose: the tensor limit applies
  double* y = Y.data<double>();
  for (int64_t r = 0; r < N; ++r) {
    const double* row = x.data() + r * F;
    double* out = y + r * T;
    std::fill(out, out + T, 0.0);
    std::vector<char> reached(size_t(T), 0);  // MIN/MAX: a target no leaf reached stays 0
    for (int64_t root : p.roots) {
      int64_t id = root;
      // A root whose branches both name the same leaf is that leaf (as the ONNX reference reads it).
      bool leaf = size_t(root) < nodes && p.true_leaf[size_t(root)] && p.false_leaf[size_t(root)] &&
                  p.true_ids[size_t(root)] == p.false_ids[size_t(root)];
      if (size_t(root) >= nodes) leaf = true;
      for (size_t steps = 0; !leaf; ++steps) {
        if (steps > nodes) c.error("tree " + std::to_string(root) + " has a cycle");
        const size_t i = size_t(id);
        const double v = row[p.features[i]], s = p.splits[i];
        bool go;
        switch (p.modes[i]) {
          case TreeEnsembleParams::LEQ: go = v <= s; break;
          case TreeEnsembleParams::LT: go = v < s; break;
          case TreeEnsembleParams::GTE: go = v >= s; break;
          case TreeEnsembleParams::GT: go = v > s; break;
          case TreeEnsembleParams::EQ: go = v == s; break;
          case TreeEnsembleParams::NEQ: go = v != s; break;
          default: go = std::find(p.members[i].begin(), p.members[i].end(), v) != p.members[i].end(); break;
        }
        if (std::isnan(v) && !p.missing_true.empty() && p.missing_true[i]) go = true;
        leaf = go ? p.true_leaf[i] : p.false_leaf[i];
        id = go ? p.true_ids[i] : p.false_ids[i];
      }
      const double w = p.leaf_weights[size_t(id)];
      const size_t target = size_t(p.leaf_targets[size_t(id)]);
      double& o = out[target];
      switch (p.aggregate) {
        case 0: o += w / double(p.roots.size()); break;
        case 1: o += w; break;
        case 2: o = reached[target] ? std::min(o, w) : w; break;
        default: o = reached[target] ? std::max(o, w) : w; break;
      }
      reached[target] = 1;
    }
    if (p.post == 2)
      for (int64_t t = 0; t < T; ++t) out[t] = 1.0 / (1.0 + std::exp(-out[t]));
    if (p.post == 1 || p.post == 3) {  // SOFTMAX_ZERO leaves zeros at zero
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t t = 0; t < T; ++t)
        if (p.post == 1 || out[t] != 0) mx = std::max(mx, out[t]);
      for (int64_t t = 0; t < T; ++t) {
        const bool keep = p.post == 1 || out[t] != 0;
        out[t] = keep ? std::exp(out[t] - mx) : 0.0;
        sum += out[t];
      }
      for (int64_t t = 0; t < T; ++t) out[t] = sum > 0 ? out[t] / sum : out[t];
    }
  }
  return {Y.cast(X.dtype())};
}

InferResult infer_tree_ensemble(const InferContext& c) {
  const TreeEnsembleParams p = tree_params(c.node, [&](const std::string& m) { c.error(m); });
  const TensorType& x = c.input(0);
  if (x.dtype != DType::Float32 && x.dtype != DType::Float64 && x.dtype != DType::Float16)
    c.error(std::string("X must be float, double or float16, got ") + dtype_name(x.dtype));
  if (x.has_shape && x.rank() != 2) c.error("X must be [N, F], got rank " + std::to_string(x.rank()));
  return infer_one(TensorType(x.dtype, {x.has_shape ? x.dims[0] : Dim{}, Dim(p.n_targets)}));
}

}  // namespace

void register_tensor_ml_ops(OpRegistry& r) {
  {
    OpSchema s = data_movement_schema("TreeEnsemble", 5, MappingType::ManyToMany, 1, 1, infer_tree_ensemble, kernel_tree_ensemble);
    s.domain = "ai.onnx.ml";
    // Per row and tree: one comparison per level (counted as the node count over the trees).
    s.flops = [](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
      const Attribute* f = n.attrs.find("nodes_featureids");
      if (ins.empty() || !ins[0].has_shape || ins[0].rank() != 2 || !ins[0].dims[0].known() || !f) return 0.0;
      return double(ins[0].dims[0].value) * double(f->ints.size());
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = data_movement_schema("Binarizer", 1, MappingType::OneToOne, 1, 1, infer_binarizer, kernel_binarizer);
    s.domain = "ai.onnx.ml";
    s.flops = [](const Node&, const std::vector<TensorType>&, const std::vector<TensorType>& outs) {
      return outs.empty() || !outs[0].numel() ? 0.0 : double(*outs[0].numel());
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = data_movement_schema("ArrayFeatureExtractor", 1, MappingType::Shuffle, 2, 2, infer_array_feature_extractor,
                                      kernel_array_feature_extractor);
    s.domain = "ai.onnx.ml";
    r.add(std::move(s));
  }
  {
    OpSchema s = data_movement_schema("TfIdfVectorizer", 9, MappingType::ManyToMany, 1, 1, infer_tfidf, kernel_tfidf);
    // Per input item: up to (max_skip + 1) x max_gram n-gram lookups (counted as one FLOP each).
    s.flops = [](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
      if (ins.empty() || !ins[0].numel()) return 0.0;
      return double(*ins[0].numel()) * double(n.attrs.get_int("max_skip_count", 0) + 1) * double(n.attrs.get_int("max_gram_length", 1));
    };
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::tensor_ops
