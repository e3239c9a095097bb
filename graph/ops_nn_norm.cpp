// Normalisations (BatchNormalization, LayerNormalization, RMSNormalization, LpNormalization, InstanceNormalization,
// GroupNormalization, LRN, MeanVarianceNormalization) and Softmax, LogSoftmax, Hardmax.
// Means and variances accumulate in double: these kernels are the oracle, not the fast path.
#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {
namespace {

// Mean and (biased) variance of n values read with a stride.
template <class T>
void mean_var(const T* x, int64_t n, int64_t stride, double& mean, double& var) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i * stride]);
  mean = n ? s / double(n) : 0.0;
  double q = 0;
  for (int64_t i = 0; i < n; ++i) {
    double d = double(x[i * stride]) - mean;
    q += d * d;
  }
  var = n ? q / double(n) : 0.0;
}

// Checks a per-channel parameter has C elements.
void check_param(const KernelContext& c, const Tensor& p, int64_t want, const char* what) {
  if (p.numel() != want)
    c.error(std::string(what) + " " + shape_str(p.shape()) + " must have " + std::to_string(want) + " elements (one per channel)");
}

// ---------------------------------------------------------------- BatchNormalization
// Inference normalises with the running statistics (inputs 3 and 4). Training mode (opset 14+)
// normalises with the batch's own mean and biased variance over every axis but the channel's,
// and outputs the running statistics updated by `momentum`: r = input * momentum + batch * (1 - momentum).
// Training mode is deterministic, so the oracle computes it; a forward pass of a model exported
// in training mode needs it.
template <class T>
std::vector<Tensor> batchnorm_typed(const KernelContext& c, const std::vector<const Tensor*>& in, bool training) {
  const Tensor& X = *in[0];
  if (X.rank() < 2) c.error("input " + shape_str(X.shape()) + " must have rank >= 2 (N, C, ...)");
  int64_t N = X.dim(0), C = X.dim(1), sp = X.numel() / std::max<int64_t>(1, N * C);
  const char* names[] = {"X", "scale", "B", "input_mean", "input_var"};
  for (int i = 1; i < 5; ++i) check_param(c, *in[size_t(i)], C, names[i]);
  double eps = c.node.attrs.get_float("epsilon", 1e-5f);
  const T* s = in[1]->data<T>();
  const T* b = in[2]->data<T>();
  const T* m = in[3]->data<T>();
  const T* v = in[4]->data<T>();
  Tensor Y(DTypeOf<T>::value, X.shape());
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  if (!training) {
    for (int64_t ch = 0; ch < C; ++ch) {
      double a = double(s[ch]) / std::sqrt(double(v[ch]) + eps);
      T mul = T(a), add = T(double(b[ch]) - double(m[ch]) * a);
      for (int64_t n = 0; n < N; ++n) {
        const T* xc = x + (n * C + ch) * sp;
        T* yc = y + (n * C + ch) * sp;
        for (int64_t i = 0; i < sp; ++i) yc[i] = xc[i] * mul + add;
      }
    }
    return {Y};
  }
  // Training mode, all in double: the running statistics are Float64 here, so float_kernel leaves
  // them alone and the caller rounds them once, to input_mean's type. Y is (x - mean) * a + B, not
  // x * a + (B - mean * a): a batch's mean can be large against its spread.
  double momentum = c.node.attrs.get_float("momentum", 0.9f);
  Tensor running_mean(DType::Float64, {C}), running_var(DType::Float64, {C});
  const int64_t count = N * sp;
  for (int64_t ch = 0; ch < C; ++ch) {
    // Per-channel statistics over N x spatial, in two passes like mean_var; an empty batch has
    // no statistics (NaN, as numpy's and onnx.reference's mean of nothing).
    double sum = 0, sq = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < sp; ++i) sum += double(x[(n * C + ch) * sp + i]);
    const double mean = count ? sum / double(count) : std::numeric_limits<double>::quiet_NaN();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < sp; ++i) {
        double d = double(x[(n * C + ch) * sp + i]) - mean;
        sq += d * d;
      }
    const double var = count ? sq / double(count) : std::numeric_limits<double>::quiet_NaN();
    running_mean.data<double>()[ch] = double(m[ch]) * momentum + mean * (1 - momentum);
    running_var.data<double>()[ch] = double(v[ch]) * momentum + var * (1 - momentum);
    const double a = double(s[ch]) / std::sqrt(var + eps);
    for (int64_t n = 0; n < N; ++n) {
      const T* xc = x + (n * C + ch) * sp;
      T* yc = y + (n * C + ch) * sp;
      for (int64_t i = 0; i < sp; ++i) yc[i] = T((double(xc[i]) - mean) * a + double(b[ch]));
    }
  }
  return {Y, running_mean, running_var};
}

std::vector<Tensor> batchnorm_kernel(const KernelContext& c) {
  // `training_mode` exists from opset 14; before it, training outputs had other meanings (saved
  // mean and inverse std at opsets 9-13), which no exporter writes for inference.
  bool training = c.opset >= 14 && c.node.attrs.get_int("training_mode", 0) != 0;
  if (!training && c.node.attrs.get_int("training_mode", 0) != 0)
    c.unsupported("BatchNormalization with training_mode=1 before opset 14");
  if (!training)
    for (size_t i = 1; i < c.node.outputs.size(); ++i)
      if (!c.node.outputs[i].empty())
        c.unsupported(c.opset >= 14 ? "BatchNormalization with running-statistics outputs needs training_mode=1"
                                    : "BatchNormalization with statistics outputs before opset 14 (training; only inference is supported)");
  if (c.opset < 9 && c.node.attrs.get_int("spatial", 1) == 0 && c.input(1).rank() > 1)
    c.unsupported("BatchNormalization with spatial=0 and per-element parameters");
  std::vector<Tensor> out = float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
    using T = decltype(tag);
    return batchnorm_typed<T>(c, in, training);
  });
  // The running statistics take input_mean's type (T2 at opset 15), not X's.
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].dtype() != c.input(3).dtype()) out[i] = out[i].cast(c.input(3).dtype());
  return out;
}

InferResult infer_batchnorm(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (x.has_shape && x.rank() < 2) c.error("BatchNormalization: input " + x.str() + " must have rank >= 2 (N, C, ...)");
  for (size_t i = 1; i < 5 && i < c.num_inputs(); ++i) {
    const TensorType& p = c.input(i);
    if (x.has_shape && p.has_shape && p.rank() == 1 && p.dims[0].known() && x.dims[1].known() && p.dims[0].value != x.dims[1].value)
      c.error("BatchNormalization: input has " + x.dims[1].str() + " channels but parameter " + std::to_string(i) + " is " + p.str());
  }
  // From opset 14 the outputs are Y and, in training mode, the two running statistics; the saved
  // mean and variance outputs of opsets 9 to 13 are gone.
  if (c.opset >= 14 && c.node.outputs.size() > 3)
    fail(ErrorKind::Model, "BatchNormalization has at most 3 outputs from opset 14 (Y, running_mean, running_var), not " +
                               std::to_string(c.node.outputs.size()), {"", 0, 0, c.node.label(), c.node.op_type, int(c.opset)});
  InferResult r;
  r.outputs.push_back(x);
  // Running statistics (training mode) have input_mean's type and one value per channel.
  DType stat = c.num_inputs() > 3 && c.input(3).dtype != DType::Undefined ? c.input(3).dtype : x.dtype;
  for (size_t i = 1; i < c.node.outputs.size(); ++i)
    r.outputs.push_back(x.has_shape ? TensorType(stat, {x.dims[1]}) : TensorType::unknown_shape(stat));
  return r;
}

// ---------------------------------------------------------------- LayerNormalization
// Expands a parameter broadcast to `shape` into a dense vector of numel(shape) values.
template <class T>
std::vector<T> expand_param(const KernelContext& c, const Tensor& p, const Shape& shape, const char* what) {
  std::vector<T> r(size_t(shape_numel(shape)));
  if (p.rank() > int64_t(shape.size())) c.error(std::string(what) + " " + shape_str(p.shape()) + " does not broadcast to " + shape_str(shape));
  for (int64_t i = 0; i < p.rank(); ++i) {
    int64_t want = shape[shape.size() - size_t(p.rank()) + size_t(i)];
    if (p.dim(i) != 1 && p.dim(i) != want)
      c.error(std::string(what) + " " + shape_str(p.shape()) + " does not broadcast to " + shape_str(shape));
  }
  const T* d = p.data<T>();
  for_each_broadcast(shape, {p.shape()}, [&](int64_t i, const int64_t* off) { r[size_t(i)] = d[off[0]]; });
  return r;
}

template <class T>
std::vector<Tensor> layernorm_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", -1), X.rank(), c.node);
  double eps = c.node.attrs.get_float("epsilon", 1e-5f);
  Shape norm_shape(X.shape().begin() + axis, X.shape().end());
  int64_t inner = shape_numel(norm_shape), outer = inner ? X.numel() / inner : 0;
  std::vector<T> scale = expand_param<T>(c, *in[1], norm_shape, "Scale");
  std::vector<T> bias = in.size() > 2 && in[2] ? expand_param<T>(c, *in[2], norm_shape, "B") : std::vector<T>(size_t(inner), T(0));
  Shape stat_shape(X.shape().begin(), X.shape().begin() + axis);
  stat_shape.resize(size_t(X.rank()), 1);
  Tensor Y(DTypeOf<T>::value, X.shape()), Mean(DTypeOf<T>::value, stat_shape), Inv(DTypeOf<T>::value, stat_shape);
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  for (int64_t o = 0; o < outer; ++o) {
    double mean, var;
    mean_var(x + o * inner, inner, 1, mean, var);
    double inv = 1.0 / std::sqrt(var + eps);
    Mean.data<T>()[o] = T(mean);
    Inv.data<T>()[o] = T(inv);
    const T* xr = x + o * inner;
    T* yr = y + o * inner;
    for (int64_t i = 0; i < inner; ++i) yr[i] = T((double(xr[i]) - mean) * inv) * scale[size_t(i)] + bias[size_t(i)];
  }
  return {Y, Mean, Inv};
}

InferResult infer_layernorm(const InferContext& c) {
  const TensorType& x = c.input(0);
  InferResult r;
  r.outputs.push_back(x);
  if (!x.has_shape) {
    r.outputs.push_back(TensorType::unknown_shape(x.dtype));
    r.outputs.push_back(TensorType::unknown_shape(x.dtype));
    return r;
  }
  int64_t axis = c.node.attrs.get_int("axis", -1);
  if (axis < -x.rank() || axis >= x.rank()) c.error("LayerNormalization: axis " + std::to_string(axis) + " is out of range for " + x.str());
  if (axis < 0) axis += x.rank();
  std::vector<Dim> sd(x.dims.begin(), x.dims.begin() + axis);
  sd.resize(size_t(x.rank()), Dim(1));
  r.outputs.push_back(TensorType(x.dtype, sd));
  r.outputs.push_back(TensorType(x.dtype, sd));
  return r;
}

// ---------------------------------------------------------------- RMSNormalization (opset 23)
// Y = X / sqrt(mean(X^2 over the axes from `axis` on) + epsilon) * scale; the statistic in double
// (stash_type asks for at least float).
template <class T>
std::vector<Tensor> rmsnorm_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  const int64_t axis = normalize_axis(c.node.attrs.get_int("axis", -1), X.rank(), c.node);
  const double eps = c.node.attrs.get_float("epsilon", 1e-5f);
  Shape norm_shape(X.shape().begin() + axis, X.shape().end());
  const int64_t inner = shape_numel(norm_shape), outer = inner ? X.numel() / inner : 0;
  std::vector<T> scale = expand_param<T>(c, *in[1], norm_shape, "scale");
  Tensor Y(DTypeOf<T>::value, X.shape());
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  for (int64_t o = 0; o < outer; ++o) {
    const T* xr = x + o * inner;
    double ss = 0;
    for (int64_t i = 0; i < inner; ++i) ss += double(xr[i]) * double(xr[i]);
    const double inv = 1.0 / std::sqrt(ss / double(inner) + eps);
    for (int64_t i = 0; i < inner; ++i) y[o * inner + i] = T(double(xr[i]) * inv * double(scale[size_t(i)]));
  }
  return {Y};
}

// ---------------------------------------------------------------- LpNormalization
// Y = X / ||X||_p along `axis` (p 1 or 2); a zero vector stays zero (the node tests' reference).
template <class T>
std::vector<Tensor> lpnorm_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  const int64_t axis = normalize_axis(c.node.attrs.get_int("axis", -1), X.rank(), c.node);
  const int64_t p = c.node.attrs.get_int("p", 2);
  if (p != 1 && p != 2) c.error("p must be 1 or 2, got " + std::to_string(p));
  const auto [outer, n, inner] = split_at(X.shape(), axis);
  Tensor Y(DTypeOf<T>::value, X.shape());
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t base = o * n * inner + j;
      double norm = 0;
      for (int64_t k = 0; k < n; ++k) {
        const double v = double(x[base + k * inner]);
        norm += p == 1 ? std::fabs(v) : v * v;
      }
      if (p == 2) norm = std::sqrt(norm);
      for (int64_t k = 0; k < n; ++k) y[base + k * inner] = norm == 0 ? T(0) : T(double(x[base + k * inner]) / norm);
    }
  return {Y};
}

// ---------------------------------------------------------------- Instance / Group normalization
template <class T>
std::vector<Tensor> instancenorm_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  if (X.rank() < 3) c.error("input " + shape_str(X.shape()) + " must have rank >= 3 (N, C, spatial...)");
  int64_t N = X.dim(0), C = X.dim(1), sp = X.numel() / std::max<int64_t>(1, N * C);
  check_param(c, *in[1], C, "scale");
  check_param(c, *in[2], C, "B");
  double eps = c.node.attrs.get_float("epsilon", 1e-5f);
  const T* s = in[1]->data<T>();
  const T* b = in[2]->data<T>();
  Tensor Y(DTypeOf<T>::value, X.shape());
  for (int64_t i = 0; i < N * C; ++i) {
    const T* xc = X.data<T>() + i * sp;
    T* yc = Y.data<T>() + i * sp;
    double mean, var;
    mean_var(xc, sp, 1, mean, var);
    double a = double(s[i % C]) / std::sqrt(var + eps);
    double add = double(b[i % C]) - mean * a;
    for (int64_t j = 0; j < sp; ++j) yc[j] = T(double(xc[j]) * a + add);
  }
  return {Y};
}

template <class T>
std::vector<Tensor> groupnorm_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  if (X.rank() < 2) c.error("input " + shape_str(X.shape()) + " must have rank >= 2 (N, C, ...)");
  int64_t G = c.node.attrs.get_int("num_groups", 0);
  int64_t N = X.dim(0), C = X.dim(1), sp = X.numel() / std::max<int64_t>(1, N * C);
  if (G <= 0 || C % G != 0) c.error(std::to_string(C) + " channels are not divisible by num_groups=" + std::to_string(G));
  // Opset 18 has one scale/bias per group; opset 21 one per channel.
  bool per_channel = c.opset >= 21;
  int64_t want = per_channel ? C : G;
  for (int i = 1; i <= 2; ++i)
    if (in[size_t(i)]->numel() != want)
      c.error(std::string(i == 1 ? "scale " : "bias ") + shape_str(in[size_t(i)]->shape()) + " must have " + std::to_string(want) +
              " elements (one per " + (per_channel ? "channel" : "group") + " at opset " + std::to_string(c.opset) + ")");
  double eps = c.node.attrs.get_float("epsilon", 1e-5f);
  const T* s = in[1]->data<T>();
  const T* b = in[2]->data<T>();
  Tensor Y(DTypeOf<T>::value, X.shape());
  int64_t cg = C / G, block = cg * sp;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const T* xb = X.data<T>() + (n * C + g * cg) * sp;
      T* yb = Y.data<T>() + (n * C + g * cg) * sp;
      double mean, var;
      mean_var(xb, block, 1, mean, var);
      double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t ch = 0; ch < cg; ++ch) {
        int64_t pi = per_channel ? g * cg + ch : g;
        double a = double(s[pi]) * inv, add = double(b[pi]) - mean * a;
        for (int64_t j = 0; j < sp; ++j) yb[ch * sp + j] = T(double(xb[ch * sp + j]) * a + add);
      }
    }
  return {Y};
}

// ---------------------------------------------------------------- LRN
template <class T>
std::vector<Tensor> lrn_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  if (X.rank() < 2) c.error("input " + shape_str(X.shape()) + " must have rank >= 2 (N, C, ...)");
  int64_t size = c.node.attrs.get_int("size", 0);
  if (size <= 0) c.error("size must be positive");
  double alpha = c.node.attrs.get_float("alpha", 1e-4f), beta = c.node.attrs.get_float("beta", 0.75f),
         bias = c.node.attrs.get_float("bias", 1.0f);
  int64_t N = X.dim(0), C = X.dim(1), sp = X.numel() / std::max<int64_t>(1, N * C);
  int64_t lo = (size - 1) / 2, hi = (size - 1) - lo;  // channels [c - floor((size-1)/2), c + ceil((size-1)/2)]
  Tensor Y(DTypeOf<T>::value, X.shape());
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t j = 0; j < sp; ++j) {
        double sq = 0;
        for (int64_t k = std::max<int64_t>(0, ch - lo); k <= std::min(C - 1, ch + hi); ++k) {
          double v = double(x[(n * C + k) * sp + j]);
          sq += v * v;
        }
        int64_t i = (n * C + ch) * sp + j;
        y[i] = T(double(x[i]) / std::pow(bias + alpha / double(size) * sq, beta));
      }
  return {Y};
}

// ---------------------------------------------------------------- MeanVarianceNormalization
template <class T>
std::vector<Tensor> mvn_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  std::vector<int64_t> axes = c.node.attrs.get_ints("axes", {0, 2, 3});
  Shape kept = X.shape();
  for (auto a : axes) kept[size_t(normalize_axis(a, X.rank(), c.node))] = 1;
  std::vector<double> sum(size_t(shape_numel(kept)), 0.0), sq(sum.size(), 0.0);
  const T* x = X.data<T>();
  for_each_broadcast(X.shape(), {kept}, [&](int64_t i, const int64_t* off) {
    double v = double(x[i]);
    sum[size_t(off[0])] += v;
    sq[size_t(off[0])] += v * v;
  });
  double cnt = double(X.numel()) / double(std::max<int64_t>(1, shape_numel(kept)));
  std::vector<double> mean(sum.size()), denom(sum.size());
  for (size_t k = 0; k < sum.size(); ++k) {
    mean[k] = sum[k] / cnt;
    // The spec's function: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9).
    denom[k] = std::sqrt(std::max(0.0, sq[k] / cnt - mean[k] * mean[k])) + 1e-9;
  }
  Tensor Y(DTypeOf<T>::value, X.shape());
  T* y = Y.data<T>();
  for_each_broadcast(X.shape(), {kept}, [&](int64_t i, const int64_t* off) {
    y[i] = T((double(x[i]) - mean[size_t(off[0])]) / denom[size_t(off[0])]);
  });
  return {Y};
}

// ---------------------------------------------------------------- Softmax family
enum class SoftKind { Softmax, LogSoftmax, Hardmax };

template <class T>
std::vector<Tensor> softmax_typed(const KernelContext& c, const Tensor& X, SoftKind kind) {
  bool legacy = c.opset < 13;  // before 13: coerce to 2-D at axis (default 1); from 13: along axis (default -1)
  int64_t r = X.rank();
  int64_t axis = c.node.attrs.get_int("axis", legacy ? 1 : -1);
  Tensor Y(DTypeOf<T>::value, X.shape());
  if (r == 0) {
    Y.data<T>()[0] = kind == SoftKind::LogSoftmax ? T(0) : T(1);
    return {Y};
  }
  int64_t a = normalize_axis(axis, r, c.node);
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t d = 0; d < a; ++d) outer *= X.dim(d);
  if (legacy) {
    for (int64_t d = a; d < r; ++d) n *= X.dim(d);
  } else {
    n = X.dim(a);
    for (int64_t d = a + 1; d < r; ++d) inner *= X.dim(d);
  }
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      const T* xs = x + o * n * inner + j;
      T* ys = y + o * n * inner + j;
      if (n == 0) continue;
      int64_t arg = 0;
      T mx = xs[0];
      for (int64_t i = 1; i < n; ++i)
        if (xs[i * inner] > mx) {
          mx = xs[i * inner];
          arg = i;
        }
      if (kind == SoftKind::Hardmax) {
        for (int64_t i = 0; i < n; ++i) ys[i * inner] = T(i == arg ? 1 : 0);
        continue;
      }
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += std::exp(double(xs[i * inner]) - double(mx));
      if (kind == SoftKind::Softmax) {
        for (int64_t i = 0; i < n; ++i) ys[i * inner] = T(std::exp(double(xs[i * inner]) - double(mx)) / sum);
      } else {
        double ls = std::log(sum);
        for (int64_t i = 0; i < n; ++i) ys[i * inner] = T(double(xs[i * inner]) - double(mx) - ls);
      }
    }
  return {Y};
}

InferResult infer_same_float(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (x.dtype != DType::Undefined && !is_floatish(x.dtype))
    c.error(c.node.op_type + ": input dtype " + dtype_name(x.dtype) + " is not a float type");
  return infer_one(x);
}

InferResult infer_softmax(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (x.has_shape && x.rank() > 0) {
    int64_t axis = c.node.attrs.get_int("axis", c.opset < 13 ? 1 : -1);
    if (axis < -x.rank() || axis >= x.rank())
      c.error(c.node.op_type + ": axis " + std::to_string(axis) + " is out of range for " + x.str());
  }
  return infer_same_float(c);
}

InferResult infer_channel_norm(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (x.has_shape && x.rank() < 2) c.error(c.node.op_type + ": input " + x.str() + " must have rank >= 2 (N, C, ...)");
  return infer_same_float(c);
}


FlopFn per_element(double k) {
  return [k](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) { return k * numel_or0(ins[0]); };
}

}  // namespace

void register_nn_norm_ops(OpRegistry& r) {
  {
    OpSchema s = nn_schema("BatchNormalization", 7, 5, 5, 1, 5);
    s.mapping = MappingType::OneToOne;  // inference: a per-channel scale and shift
    // Training mode reduces over the batch first: every output element depends on its channel's
    // whole batch.
    s.mapping_fn = [](const Node& n, const std::vector<TensorType>&, const std::vector<TensorType>&) {
      return n.attrs.get_int("training_mode", 0) != 0 ? MappingType::ManyToMany : MappingType::OneToOne;
    };
    s.infer = infer_batchnorm;
    s.kernel = batchnorm_kernel;
    // One multiply-add per element in inference; training first sums and squares deviations.
    s.flops = [](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
      return (n.attrs.get_int("training_mode", 0) != 0 ? 6.0 : 2.0) * numel_or0(ins[0]);
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("LayerNormalization", 17, 2, 3, 1, 3);
    s.infer = infer_layernorm;
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return layernorm_typed<T>(c, in);
      });
    };
    s.flops = per_element(8);
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("RMSNormalization", 23, 2, 2, 1, 1);
    s.infer = [](const InferContext& c) { return infer_one(c.input(0)); };
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return rmsnorm_typed<T>(c, in);
      });
    };
    s.flops = per_element(4);
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("LpNormalization", 1, 1, 1, 1, 1);
    s.infer = [](const InferContext& c) { return infer_one(c.input(0)); };
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return lpnorm_typed<T>(c, in);
      });
    };
    s.flops = per_element(3);
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("InstanceNormalization", 6, 3, 3, 1, 1);
    s.infer = infer_channel_norm;
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return instancenorm_typed<T>(c, in);
      });
    };
    s.flops = per_element(8);
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("GroupNormalization", 18, 3, 3, 1, 1);
    s.infer = infer_channel_norm;
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return groupnorm_typed<T>(c, in);
      });
    };
    s.flops = per_element(8);
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("LRN", 1, 1, 1, 1, 1);
    s.infer = infer_channel_norm;
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return lrn_typed<T>(c, in);
      });
    };
    s.flops = [](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
      return (2.0 * double(n.attrs.get_int("size", 1)) + 4.0) * numel_or0(ins[0]);
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("MeanVarianceNormalization", 9, 1, 1, 1, 1);
    s.infer = infer_same_float;
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return mvn_typed<T>(c, in);
      });
    };
    s.flops = per_element(8);
    r.add(std::move(s));
  }
  auto soft = [&](const char* name, SoftKind kind) {
    OpSchema s = nn_schema(name, 1, 1, 1, 1, 1);
    s.infer = infer_softmax;
    s.kernel = [kind](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return softmax_typed<T>(c, *in[0], kind);
      });
    };
    s.flops = per_element(5);
    r.add(std::move(s));
  };
  soft("Softmax", SoftKind::Softmax);
  soft("LogSoftmax", SoftKind::LogSoftmax);
  soft("Hardmax", SoftKind::Hardmax);
}

}  // namespace nnfuse::nn
