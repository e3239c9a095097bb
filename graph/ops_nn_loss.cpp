// Loss functions: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opsets 12/13/22), as
// exported training graphs and evaluation models carry them. Reference kernels only, following
// the spec's reference implementation (onnx.reference), including how `mean` weighs.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {

namespace {

// x [N, C, d...] (log-probabilities), target [N, d...] class indices, weight [C] optional.
// Per element: -x[n, t, d] * w[t] (w = 1 without weights); an element whose target is
// ignore_index counts 0. reduction none: per element; sum; mean: the weighted sum over the sum of
// the weights when weights or an ignore_index apply (the spec's NLL reference skips the weights
// for ignore_index -1 without a weight input and averages over every element: kept as specified).
template <class T>
Tensor nll(const KernelContext& c, const std::vector<double>& logp, const Shape& xs, const Tensor& target, const Tensor* weight,
           bool nll_quirk) {
  if (xs.size() < 2) c.error("input must be at least 2-D [N, C, ...], got " + shape_str(xs));
  const int64_t N = xs[0], C = xs[1];
  int64_t D = 1;
  for (size_t i = 2; i < xs.size(); ++i) D *= xs[i];
  Shape ts(xs.begin(), xs.end());
  ts.erase(ts.begin() + 1);
  if (target.shape() != ts) c.error("target " + shape_str(target.shape()) + " must be " + shape_str(ts) + " for input " + shape_str(xs));
  if (weight && (weight->rank() != 1 || weight->dim(0) != C)) c.error("weight " + shape_str(weight->shape()) + " must be [" + std::to_string(C) + "]");
  const std::optional<int64_t> ignore = c.node.attrs.opt_int("ignore_index");
  const std::string red = c.node.attrs.get_string("reduction", "mean");
  if (red != "mean" && red != "sum" && red != "none") c.error("reduction must be mean, sum or none, got '" + red + "'");
  const bool weighted = weight || (nll_quirk ? ignore != std::optional<int64_t>(-1) : ignore.has_value());
  std::vector<double> loss(size_t(N * D)), w(size_t(N * D), 1.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t i = n * D + d, t = target.as_int(i);
      if (ignore && t == *ignore) {
        loss[size_t(i)] = 0, w[size_t(i)] = 0;
        continue;
      }
      if (t < 0 || t >= C) c.error("target " + std::to_string(t) + " at element " + std::to_string(i) + " is outside [0, " + std::to_string(C) + ")");
      w[size_t(i)] = weight ? weight->as_double(t) : 1.0;
      loss[size_t(i)] = -logp[size_t((n * C + t) * D + d)] * (weight ? w[size_t(i)] : 1.0);
    }
  if (red == "none") {
    Tensor out(DTypeOf<T>::value, ts);
    for (size_t i = 0; i < loss.size(); ++i) out.data<T>()[i] = T(loss[i]);
    return out;
  }
  double sum = 0, wsum = 0;
  for (size_t i = 0; i < loss.size(); ++i) sum += loss[i], wsum += w[i];
  double r = sum;
  if (red == "mean") r = weighted ? sum / wsum : sum / double(loss.size());
  Tensor out(DTypeOf<T>::value, Shape{});
  out.data<T>()[0] = T(r);
  return out;
}

template <class T>
std::vector<Tensor> nll_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  std::vector<double> x(size_t(X.numel()));
  for (int64_t i = 0; i < X.numel(); ++i) x[size_t(i)] = double(X.data<T>()[i]);
  return {nll<T>(c, x, X.shape(), *in[1], in.size() > 2 ? in[2] : nullptr, true)};
}

// log_softmax over axis 1, then the NLL of it; the second output (when asked) is log_softmax.
template <class T>
std::vector<Tensor> sce_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  if (X.rank() < 2) c.error("scores must be at least 2-D [N, C, ...], got " + shape_str(X.shape()));
  const int64_t N = X.dim(0), C = X.dim(1), D = C ? X.numel() / std::max<int64_t>(1, N * C) : 0;
  std::vector<double> lp(size_t(X.numel()));
  const T* x = X.data<T>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      double mx = -INFINITY, s = 0;
      for (int64_t k = 0; k < C; ++k) mx = std::max(mx, double(x[(n * C + k) * D + d]));
      for (int64_t k = 0; k < C; ++k) s += std::exp(double(x[(n * C + k) * D + d]) - mx);
      for (int64_t k = 0; k < C; ++k) lp[size_t((n * C + k) * D + d)] = double(x[(n * C + k) * D + d]) - mx - std::log(s);
    }
  std::vector<Tensor> outs{nll<T>(c, lp, X.shape(), *in[1], in.size() > 2 ? in[2] : nullptr, false)};
  Tensor log_prob(DTypeOf<T>::value, X.shape());
  for (size_t i = 0; i < lp.size(); ++i) log_prob.data<T>()[i] = T(lp[i]);
  outs.push_back(log_prob);
  return outs;
}

InferResult infer_loss(const InferContext& c) {
  const TensorType& x = c.input(0);
  const std::string red = c.node.attrs.get_string("reduction", "mean");
  InferResult r;
  if (red == "none") {
    if (x.has_shape && x.rank() >= 2) {
      std::vector<Dim> d = x.dims;
      d.erase(d.begin() + 1);
      r.outputs.push_back(TensorType(x.dtype, d));
    } else {
      r.outputs.push_back(TensorType::unknown_shape(x.dtype));
    }
  } else {
    r.outputs.push_back(TensorType(x.dtype, std::vector<Dim>{}));
  }
  if (c.node.outputs.size() > 1) r.outputs.push_back(x);
  return r;
}

}  // namespace

void register_nn_loss_ops(OpRegistry& r) {
  for (bool sce : {false, true}) {
    OpSchema s = nn_schema(sce ? "SoftmaxCrossEntropyLoss" : "NegativeLogLikelihoodLoss", 12, 2, 3, 1, sce ? 2 : 1);
    s.infer = infer_loss;
    s.kernel = [sce](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
        using T = decltype(tag);
        return sce ? sce_typed<T>(c, in) : nll_typed<T>(c, in);
      });
    };
    s.flops = [sce](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
      return (sce ? 5.0 : 1.0) * numel_or0(ins[0]);
    };
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::nn
