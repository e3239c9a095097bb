// Classic-ML featurization ops that exported scikit-learn and text pipelines put in front of a
// model: Binarizer and ArrayFeatureExtractor (domain ai.onnx.ml) and TfIdfVectorizer (ai.onnx 9).
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

}  // namespace

void register_tensor_ml_ops(OpRegistry& r) {
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
