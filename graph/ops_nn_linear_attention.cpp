// The stateful sequence mixers of linear-attention and state-space LLMs (opset 27): reference
// kernels in double, one token at a time, as the spec defines them.
//
// LinearAttention: query [B, T, Hq*dk], key [B, T, Hkv*dk], value [B, T, Hkv*dv], optional
//   past_state [B, Hkv, dk, dv], decay (log-space gate, [B, T, Hkv] or [B, T, Hkv*dk]) and beta
//   ([B, T, Hkv] or [B, T, 1]). Per token t and KV head, with S the head's dk x dv state:
//     gated rules:  S = exp(g_t) S          (g per head, or per key row)
//     delta rules:  v_t = beta_t (v_t - S^T k_t)
//     all:          S = S + k_t v_t^T;  o_t = scale q_t^T S   (query head h reads KV head h / (Hq/Hkv))
//   update_rule: linear, gated, delta, gated_delta (default); scale 0 means 1/sqrt(dk).
//   Outputs: [B, T, Hq*dv] in the query's type, and the last S in past_state's type (else the
//   query's).
// CausalConvWithState: input [B, C, L], depthwise weight [C, 1, k], optional bias [C] and
//   past_state [B, C, k-1] (zeros without it): the depthwise valid conv of past_state ++ input,
//   then optionally SiLU ("silu"/"swish"); present_state is the last k-1 positions of
//   past_state ++ input.
#include <cmath>
#include <string>
#include <vector>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {

namespace {

Tensor from_doubles(const std::vector<double>& v, const Shape& s, DType t) {
  Tensor y(DType::Float64, s);
  std::copy(v.begin(), v.end(), y.data<double>());
  return y.cast(t);
}

// ---- LinearAttention ---------------------------------------------------------------------------

struct LinearAttentionDims {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, dk = 0, dv = 0;
  bool gated = false, delta = false;
  double scale = 0;
};

template <class Err>
LinearAttentionDims linear_attention_dims(const Node& n, const std::vector<Shape>& in, const std::vector<bool>& present, const Err& error) {
  LinearAttentionDims d;
  const std::string rule = n.attrs.get_string("update_rule", "gated_delta");
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta")
    error("update_rule '" + rule + "': expected linear, gated, delta or gated_delta");
  d.gated = rule == "gated" || rule == "gated_delta";
  d.delta = rule == "delta" || rule == "gated_delta";
  if (!n.attrs.has("q_num_heads") || !n.attrs.has("kv_num_heads")) error("q_num_heads and kv_num_heads are required");
  d.Hq = n.attrs.get_int("q_num_heads", 0);
  d.Hkv = n.attrs.get_int("kv_num_heads", 0);
  if (d.Hq <= 0 || d.Hkv <= 0 || d.Hq % d.Hkv != 0)
    error("q_num_heads " + std::to_string(d.Hq) + " must be a positive multiple of kv_num_heads " + std::to_string(d.Hkv));
  const char* names[] = {"query", "key", "value"};
  for (int i = 0; i < 3; ++i)
    if (in[size_t(i)].size() != 3) error(std::string(names[i]) + " must be [B, T, H*D], got " + shape_str(in[size_t(i)]));
  d.B = in[0][0], d.T = in[0][1];
  for (int i = 1; i < 3; ++i)
    if (in[size_t(i)][0] != d.B || in[size_t(i)][1] != d.T)
      error(std::string(names[i]) + " " + shape_str(in[size_t(i)]) + " does not match query " + shape_str(in[0]) + " in B and T");
  if (in[0][2] % d.Hq || in[1][2] % d.Hkv || in[2][2] % d.Hkv)
    error("query " + shape_str(in[0]) + ", key " + shape_str(in[1]) + " and value " + shape_str(in[2]) +
          " must split into q_num_heads / kv_num_heads heads");
  d.dk = in[0][2] / d.Hq, d.dv = in[2][2] / d.Hkv;
  if (in[1][2] / d.Hkv != d.dk)
    error("key head size " + std::to_string(in[1][2] / d.Hkv) + " differs from query's " + std::to_string(d.dk));
  if (present[3] && in[3] != Shape{d.B, d.Hkv, d.dk, d.dv})
    error("past_state " + shape_str(in[3]) + " must be " + shape_str(Shape{d.B, d.Hkv, d.dk, d.dv}));
  if (d.gated != present[4]) error("update_rule '" + rule + (d.gated ? "' needs" : "' takes no") + " decay input");
  if (d.delta != present[5]) error("update_rule '" + rule + (d.delta ? "' needs" : "' takes no") + " beta input");
  if (present[4] && (in[4].size() != 3 || in[4][0] != d.B || in[4][1] != d.T || (in[4][2] != d.Hkv && in[4][2] != d.Hkv * d.dk)))
    error("decay " + shape_str(in[4]) + " must be [B, T, kv_num_heads] or [B, T, kv_num_heads * d_k]");
  if (present[5] && (in[5].size() != 3 || in[5][0] != d.B || in[5][1] != d.T || (in[5][2] != d.Hkv && in[5][2] != 1)))
    error("beta " + shape_str(in[5]) + " must be [B, T, kv_num_heads] or [B, T, 1]");
  const float scale = n.attrs.get_float("scale", 0.f);
  d.scale = scale == 0.f ? 1.0 / std::sqrt(double(d.dk)) : double(scale);
  return d;
}

std::vector<Tensor> linear_attention_kernel(const KernelContext& c) {
  std::vector<Shape> shapes(6);
  std::vector<bool> present(6, false);
  for (size_t i = 0; i < 6; ++i)
    if (c.has_input(i)) shapes[i] = c.input(i).shape(), present[i] = true;
  const LinearAttentionDims d = linear_attention_dims(c.node, shapes, present, [&](const std::string& m) { c.error(m); });
  for (size_t i = 0; i < 6; ++i)
    if (present[i] && !dtype_is_float(c.input(i).dtype())) c.error(std::string("input ") + std::to_string(i) + " must be a float tensor");
  const std::vector<double> q = c.input(0).to_double_vector(), k = c.input(1).to_double_vector(), v = c.input(2).to_double_vector();
  const std::vector<double> g = present[4] ? c.input(4).to_double_vector() : std::vector<double>{};
  const std::vector<double> beta = present[5] ? c.input(5).to_double_vector() : std::vector<double>{};
  const int64_t B = d.B, T = d.T, Hq = d.Hq, Hkv = d.Hkv, dk = d.dk, dv = d.dv, group = Hq / Hkv;
  // The state is dk x dv per head, more than the inputs hold: checked before allocating.
  tensor_bytes_checked(DType::Float64, {B, Hkv, dk, dv});
  tensor_bytes_checked(DType::Float64, {B, T, Hq, dv});
  std::vector<double> S = present[3] ? c.input(3).to_double_vector() : std::vector<double>(size_t(B * Hkv * dk * dv), 0.0);
  std::vector<double> out(size_t(B * T * Hq * dv), 0.0);
  std::vector<double> vt(static_cast<size_t>(dv));
  const int64_t gw = present[4] ? shapes[4][2] : 0, bw = present[5] ? shapes[5][2] : 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hkv; ++h) {
        double* s = S.data() + ((b * Hkv + h) * dk) * dv;
        const double* kt = k.data() + (b * T + t) * Hkv * dk + h * dk;
        const double* vsrc = v.data() + (b * T + t) * Hkv * dv + h * dv;
        if (d.gated)
          for (int64_t r = 0; r < dk; ++r) {
            const double f = std::exp(g[size_t((b * T + t) * gw + (gw == Hkv ? h : h * dk + r))]);
            for (int64_t m = 0; m < dv; ++m) s[r * dv + m] *= f;
          }
        for (int64_t m = 0; m < dv; ++m) vt[size_t(m)] = vsrc[m];
        if (d.delta) {
          const double bt = beta[size_t((b * T + t) * bw + (bw == 1 ? 0 : h))];
          for (int64_t m = 0; m < dv; ++m) {
            double retrieved = 0;
            for (int64_t r = 0; r < dk; ++r) retrieved += s[r * dv + m] * kt[r];
            vt[size_t(m)] = bt * (vt[size_t(m)] - retrieved);
          }
        }
        for (int64_t r = 0; r < dk; ++r)
          for (int64_t m = 0; m < dv; ++m) s[r * dv + m] += kt[r] * vt[size_t(m)];
      }
      for (int64_t h = 0; h < Hq; ++h) {
        const double* s = S.data() + ((b * Hkv + h / group) * dk) * dv;
        const double* qt = q.data() + (b * T + t) * Hq * dk + h * dk;
        double* o = out.data() + (b * T + t) * Hq * dv + h * dv;
        for (int64_t m = 0; m < dv; ++m) {
          double acc = 0;
          for (int64_t r = 0; r < dk; ++r) acc += qt[r] * s[r * dv + m];
          o[m] = d.scale * acc;
        }
      }
    }
  const DType qt = c.input(0).dtype(), st = present[3] ? c.input(3).dtype() : qt;
  return {from_doubles(out, {B, T, Hq * dv}, qt), from_doubles(S, {B, Hkv, dk, dv}, st)};
}

InferResult infer_linear_attention(const InferContext& c) {
  const TensorType& q = c.input(0);
  if (!dtype_is_float(q.dtype)) c.error(std::string("query must be a float tensor, got ") + dtype_name(q.dtype));
  InferResult r;
  const int64_t Hq = c.node.attrs.get_int("q_num_heads", 0), Hkv = c.node.attrs.get_int("kv_num_heads", 0);
  bool all = true;
  for (size_t i = 0; i < 6 && i < c.num_inputs(); ++i)
    if (c.has_input(i)) all = all && c.input(i).is_static();
  if (all) {
    std::vector<Shape> shapes(6);
    std::vector<bool> present(6, false);
    for (size_t i = 0; i < 6 && i < c.num_inputs(); ++i)
      if (c.has_input(i)) shapes[i] = c.input(i).static_shape(), present[i] = true;
    const LinearAttentionDims d = linear_attention_dims(c.node, shapes, present, [&](const std::string& m) { c.error(m); });
    r.outputs.push_back(TensorType(q.dtype, {Dim(d.B), Dim(d.T), Dim(d.Hq * d.dv)}));
    r.outputs.push_back(TensorType(present[3] ? c.input(3).dtype : q.dtype, {Dim(d.B), Dim(d.Hkv), Dim(d.dk), Dim(d.dv)}));
    return r;
  }
  // Symbolic: batch and length from the query; the head sizes where the last dims are known.
  const TensorType& v = c.input(2);
  auto last = [](const TensorType& t, int64_t heads) {
    return t.has_shape && t.rank() == 3 && t.dims[2].known() && heads > 0 ? Dim(t.dims[2].value / heads) : Dim{};
  };
  const Dim dk = last(q, Hq), dv = last(v, Hkv);
  const Dim B = q.has_shape && q.rank() == 3 ? q.dims[0] : Dim{}, T = q.has_shape && q.rank() == 3 ? q.dims[1] : Dim{};
  r.outputs.push_back(TensorType(q.dtype, {B, T, dv.known() ? Dim(dv.value * Hq) : Dim{}}));
  r.outputs.push_back(TensorType(c.has_input(3) ? c.input(3).dtype : q.dtype, {B, Dim(Hkv), dk, dv}));
  return r;
}

// ---- CausalConvWithState -------------------------------------------------------------------------

std::vector<Tensor> causal_conv_kernel(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& w = c.input(1);
  const std::string act = c.node.attrs.get_string("activation", "none");
  if (act != "none" && act != "silu" && act != "swish") c.error("activation '" + act + "': expected none, silu or swish");
  if (x.rank() != 3) c.error("input must be [B, C, L], got " + shape_str(x.shape()));
  const int64_t B = x.shape()[0], C = x.shape()[1], L = x.shape()[2];
  if (w.rank() != 3 || w.shape()[0] != C || w.shape()[1] != 1 || w.shape()[2] < 1)
    c.error("weight must be [C, 1, k] with C = " + std::to_string(C) + ", got " + shape_str(w.shape()));
  const int64_t K = w.shape()[2], P = K - 1;
  if (c.has_input(2) && c.input(2).shape() != Shape{C})
    c.error("bias must be [" + std::to_string(C) + "], got " + shape_str(c.input(2).shape()));
  if (c.has_input(3) && c.input(3).shape() != Shape{B, C, P})
    c.error("past_state must be " + shape_str(Shape{B, C, P}) + ", got " + shape_str(c.input(3).shape()));
  tensor_bytes_checked(DType::Float64, {B, C, P});  // the state: B x C x (k - 1), more than the inputs hold
  const std::vector<double> xv = x.to_double_vector(), wv = w.to_double_vector();
  const std::vector<double> bias = c.has_input(2) ? c.input(2).to_double_vector() : std::vector<double>(size_t(C), 0.0);
  const std::vector<double> past = c.has_input(3) ? c.input(3).to_double_vector() : std::vector<double>(size_t(B * C * P), 0.0);
  std::vector<double> y(size_t(B * C * L)), state(size_t(B * C * P)), padded(size_t(P + L));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t ch = 0; ch < C; ++ch) {
      const int64_t row = b * C + ch;
      std::copy(past.begin() + row * P, past.begin() + (row + 1) * P, padded.begin());
      std::copy(xv.begin() + row * L, xv.begin() + (row + 1) * L, padded.begin() + P);
      for (int64_t l = 0; l < L; ++l) {
        double acc = bias[size_t(ch)];
        for (int64_t j = 0; j < K; ++j) acc += wv[size_t(ch * K + j)] * padded[size_t(l + j)];
        y[size_t(row * L + l)] = act == "none" ? acc : acc / (1.0 + std::exp(-acc));
      }
      std::copy(padded.end() - P, padded.end(), state.begin() + row * P);
    }
  return {from_doubles(y, x.shape(), x.dtype()), from_doubles(state, {B, C, P}, x.dtype())};
}

InferResult infer_causal_conv(const InferContext& c) {
  const TensorType& x = c.input(0);
  const TensorType& w = c.input(1);
  if (!dtype_is_float(x.dtype)) c.error(std::string("input must be a float tensor, got ") + dtype_name(x.dtype));
  if (x.has_shape && x.rank() != 3) c.error("input must be [B, C, L], got rank " + std::to_string(x.rank()));
  if (w.has_shape && w.rank() != 3) c.error("weight must be [C, 1, k], got rank " + std::to_string(w.rank()));
  InferResult r;
  r.outputs.push_back(x);
  const Dim k1 = w.has_shape && w.rank() == 3 && w.dims[2].known() ? Dim(w.dims[2].value - 1) : Dim{};
  r.outputs.push_back(TensorType(x.dtype, {x.has_shape ? x.dims[0] : Dim{}, x.has_shape ? x.dims[1] : Dim{}, k1}));
  return r;
}

}  // namespace

void register_nn_linear_attention_ops(OpRegistry& r) {
  {
    OpSchema s = nn_schema("LinearAttention", 27, 3, 6, 1, 2);
    s.infer = infer_linear_attention;
    s.kernel = linear_attention_kernel;
    // Per token and head: the state update and read, about 3 multiply-adds per state element
    // (4 with the delta rule's retrieval).
    s.flops = [](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
      if (outs.size() < 2 || !outs[1].numel() || ins.empty() || !ins[0].has_shape || ins[0].rank() != 3 || !ins[0].dims[1].known())
        return 0.0;
      const double per = n.attrs.get_string("update_rule", "gated_delta").find("delta") != std::string::npos ? 8.0 : 6.0;
      return per * double(*outs[1].numel()) * double(ins[0].dims[1].value);
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("CausalConvWithState", 27, 2, 4, 1, 2);
    s.infer = infer_causal_conv;
    s.kernel = causal_conv_kernel;
    s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
      if (outs.empty() || !outs[0].numel() || ins.size() < 2 || !ins[1].has_shape || ins[1].rank() != 3 || !ins[1].dims[2].known())
        return 0.0;
      return 2.0 * double(*outs[0].numel()) * double(ins[1].dims[2].value);
    };
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::nn
