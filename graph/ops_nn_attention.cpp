// Attention (opsets 23-25): scaled dot-product attention as one op, as LLM exports write it; and
// TensorScatter (24), the key/value cache update that goes with it.
// The reference kernel follows the spec's reference implementation (onnx.reference
// op_attention) case for case: 3-D inputs with q_num_heads/kv_num_heads or 4-D [B, H, S, D],
// grouped-query heads, a past key/value cache (present_key/present_value outputs), boolean or
// additive masks broadcast to [B, Hq, Sq, L] (a shorter last dim is padded as masked), is_causal
// aligned to the bottom right when there is a cache, nonpad_kv_seqlen (24), the sliding window
// (25), softcap, and the four qk_matmul_output modes. Scores accumulate in double; a row every
// key of which is masked gives zeros.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct AttnDims {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, Dk = 0, Dv = 0;
  bool three_d = false;
};

// Heads and head sizes from Q, K, V (3-D: from the head-count attributes).
template <class Err>
AttnDims attention_dims(const Node& n, const std::vector<int64_t>& q, const std::vector<int64_t>& k, const std::vector<int64_t>& v,
                        int64_t opset, const Err& error) {
  AttnDims a;
  if (q.size() != k.size() || q.size() != v.size() || (q.size() != 3 && q.size() != 4))
    error("Q, K and V must all be 3-D or all 4-D");
  a.three_d = q.size() == 3;
  a.B = q[0];
  if (k[0] != a.B || v[0] != a.B) error("Q, K and V disagree on the batch size");
  if (a.three_d) {
    a.Hq = n.attrs.get_int("q_num_heads", 0), a.Hkv = n.attrs.get_int("kv_num_heads", 0);
    if (a.Hq <= 0 || a.Hkv <= 0) error("3-D inputs need q_num_heads and kv_num_heads");
    if (q[2] % a.Hq || k[2] % a.Hkv || v[2] % a.Hkv) error("hidden sizes are not divisible by the head counts");
    a.Sq = q[1], a.Skv = k[1], a.Dk = q[2] / a.Hq, a.Dv = v[2] / a.Hkv;
    if (k[2] / a.Hkv != a.Dk) error("Q and K head sizes differ");
    if (v[1] != a.Skv) error("K and V sequence lengths differ");
  } else {
    if (opset >= 25 && (n.attrs.has("q_num_heads") || n.attrs.has("kv_num_heads")))
      error("q_num_heads and kv_num_heads must not be given for 4-D inputs");
    a.Hq = q[1], a.Hkv = k[1], a.Sq = q[2], a.Skv = k[2], a.Dk = q[3], a.Dv = v[3];
    if (k[3] != a.Dk) error("Q and K head sizes differ");
    if (v[1] != a.Hkv || v[2] != a.Skv) error("K and V disagree on heads or sequence length");
  }
  if (a.Hkv <= 0 || a.Hq % a.Hkv) error("q heads (" + std::to_string(a.Hq) + ") must be a multiple of kv heads (" + std::to_string(a.Hkv) + ")");
  return a;
}

template <class T>
std::vector<Tensor> attention_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  auto err = [&](const std::string& m) { c.error(m); };
  const Tensor &Q = *in[0], &K = *in[1], &V = *in[2];
  const Tensor* mask = in.size() > 3 ? in[3] : nullptr;
  const Tensor* past_k = in.size() > 4 ? in[4] : nullptr;
  const Tensor* past_v = in.size() > 5 ? in[5] : nullptr;
  const Tensor* nonpad = in.size() > 6 ? in[6] : nullptr;
  const AttnDims a = attention_dims(c.node, Q.shape(), K.shape(), V.shape(), c.opset, err);
  if ((past_k == nullptr) != (past_v == nullptr)) c.error("past_key and past_value must be given together");
  if (nonpad && past_k) c.error("nonpad_kv_seqlen cannot be combined with past_key/past_value");
  // The rank first: the past length is read from dim 2 (a fuzzed 2-D past_key read past its shape).
  if (past_k && past_k->rank() != 4) c.error("past_key " + shape_str(past_k->shape()) + " must be [B, kv heads, past, head size]");
  const int64_t P = past_k ? past_k->dim(2) : 0, L = P + a.Skv;
  if (past_k && (past_k->dim(0) != a.B || past_k->dim(1) != a.Hkv || past_k->dim(3) != a.Dk))
    c.error("past_key " + shape_str(past_k->shape()) + " must be [B, kv heads, past, head size]");
  if (past_v && (past_v->rank() != 4 || past_v->dim(0) != a.B || past_v->dim(1) != a.Hkv || past_v->dim(2) != P || past_v->dim(3) != a.Dv))
    c.error("past_value " + shape_str(past_v->shape()) + " does not match past_key " + shape_str(past_k->shape()));
  if (nonpad && nonpad->numel() != a.B) c.error("nonpad_kv_seqlen must hold one length per batch entry");

  // present = concat(past, K) in [B, Hkv, L, D]; 3-D K/V are [B, S, H*D].
  auto present = [&](const Tensor& X, const Tensor* past, int64_t D) {
    Tensor out(DTypeOf<T>::value, {a.B, a.Hkv, L, D});
    T* o = out.data<T>();
    const T* x = X.data<T>();
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t h = 0; h < a.Hkv; ++h)
        for (int64_t s = 0; s < L; ++s)
          for (int64_t d = 0; d < D; ++d) {
            T val;
            if (s < P) val = past->data<T>()[((b * a.Hkv + h) * P + s) * D + d];
            else if (a.three_d) val = x[(b * a.Skv + (s - P)) * a.Hkv * D + h * D + d];
            else val = x[((b * a.Hkv + h) * a.Skv + (s - P)) * D + d];
            o[((b * a.Hkv + h) * L + s) * D + d] = val;
          }
    return out;
  };
  Tensor Kp = present(K, past_k, a.Dk), Vp = present(V, past_v, a.Dv);

  // The mask as an additive bias, broadcast (right-aligned) to [B, Hq, Sq, L].
  std::vector<int64_t> mshape(4, 1), mstride(4, 0);
  if (mask) {
    if (mask->rank() < 1 || mask->rank() > 4) c.error("attn_mask must be 1-D to 4-D, got " + shape_str(mask->shape()));
    for (int64_t i = 0; i < mask->rank(); ++i) mshape[size_t(4 - mask->rank() + i)] = mask->dim(i);
    const int64_t want[4] = {a.B, a.Hq, a.Sq, L};
    int64_t st = 1;
    for (int i = 3; i >= 0; --i) {
      if (i < 3 && mshape[size_t(i)] != 1 && mshape[size_t(i)] != want[i])
        c.error("attn_mask " + shape_str(mask->shape()) + " does not broadcast to [" + std::to_string(a.B) + ", " + std::to_string(a.Hq) + ", " +
                std::to_string(a.Sq) + ", " + std::to_string(L) + "]");
      mstride[size_t(i)] = mshape[size_t(i)] == 1 && i < 3 ? 0 : st;
      st *= mshape[size_t(i)];
    }
    if (mshape[3] > L) c.error("attn_mask's last dim " + std::to_string(mshape[3]) + " exceeds the " + std::to_string(L) + " keys");
  }
  const bool bool_mask = mask && mask->dtype() == DType::Bool;
  auto mask_bias = [&](int64_t b, int64_t h, int64_t i, int64_t j) -> double {
    if (!mask) return 0.0;
    if (j >= mshape[3]) return kNegInf;  // padded to the key count as masked
    const int64_t at = (mshape[0] == 1 ? 0 : b * mstride[0]) + (mshape[1] == 1 ? 0 : h * mstride[1]) + (mshape[2] == 1 ? 0 : i * mstride[2]) + j;
    if (bool_mask) return mask->data<bool>()[at] ? 0.0 : kNegInf;
    return mask->as_double(at);
  };

  const bool causal = c.node.attrs.get_int("is_causal", 0) != 0;
  const int64_t left = c.opset >= 25 ? c.node.attrs.get_int("left_window_size", -1) : -1;
  const int64_t right = c.opset >= 25 ? c.node.attrs.get_int("right_window_size", -1) : -1;
  if (left < -1 || right < -1) c.error("left_window_size and right_window_size must be -1 or nonnegative");
  const double softcap = c.node.attrs.get_float("softcap", 0.f);
  const int64_t mode = c.node.attrs.get_int("qk_matmul_output_mode", 0);
  if (mode < 0 || mode > 3) c.error("qk_matmul_output_mode must be 0 to 3, got " + std::to_string(mode));
  const double scale = c.node.attrs.has("scale") ? double(c.node.attrs.get_float("scale", 1.f)) : 1.0 / std::sqrt(double(a.Dk));

  Tensor Y = a.three_d ? Tensor(DTypeOf<T>::value, {a.B, a.Sq, a.Hq * a.Dv}) : Tensor(DTypeOf<T>::value, {a.B, a.Hq, a.Sq, a.Dv});
  Tensor QK(DTypeOf<T>::value, {a.B, a.Hq, a.Sq, L});
  const T* q = Q.data<T>();
  const T* kp = Kp.data<T>();
  const T* vp = Vp.data<T>();
  T* y = Y.data<T>();
  T* qk_out = QK.data<T>();
  std::vector<double> qk(static_cast<size_t>(L)), bias(static_cast<size_t>(L)), p(static_cast<size_t>(L));
  const int64_t group = a.Hq / a.Hkv;
  for (int64_t b = 0; b < a.B; ++b) {
    // The causal and window frontier: query i sits at key position i + offset.
    const int64_t offset = past_k ? P : nonpad ? nonpad->as_int(b) - a.Sq : 0;
    const int64_t valid = nonpad ? nonpad->as_int(b) : L;
    for (int64_t h = 0; h < a.Hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < a.Sq; ++i) {
        const T* qi = a.three_d ? q + (b * a.Sq + i) * a.Hq * a.Dk + h * a.Dk : q + ((b * a.Hq + h) * a.Sq + i) * a.Dk;
        double bias_max = kNegInf;
        for (int64_t j = 0; j < L; ++j) {
          const T* kj = kp + ((b * a.Hkv + hk) * L + j) * a.Dk;
          double dot = 0;
          for (int64_t d = 0; d < a.Dk; ++d) dot += double(qi[d]) * double(kj[d]);
          dot *= scale;
          if (softcap > 0) dot = std::tanh(dot / softcap) * softcap;
          qk[size_t(j)] = dot;
          double bj = mask_bias(b, h, i, j);
          const int64_t diff = i + offset - j;
          if (causal && diff < 0) bj = kNegInf;
          if ((left >= 0 && diff > left) || (right >= 0 && -diff > right)) bj = kNegInf;
          if (j >= valid) bj = kNegInf;
          bias[size_t(j)] = bj;
          bias_max = std::max(bias_max, bj);
        }
        double mx = kNegInf;
        for (int64_t j = 0; j < L; ++j) mx = std::max(mx, qk[size_t(j)] + bias[size_t(j)]);
        const double safe = std::isinf(mx) && mx < 0 ? 0.0 : mx;
        double sum = 0;
        for (int64_t j = 0; j < L; ++j) sum += p[size_t(j)] = std::exp(qk[size_t(j)] + bias[size_t(j)] - safe);
        if (sum == 0) sum = 1;
        const bool all_masked = std::isinf(bias_max) && bias_max < 0;
        for (int64_t j = 0; j < L; ++j) p[size_t(j)] = all_masked ? 0.0 : p[size_t(j)] / sum;
        T* qo = qk_out + ((b * a.Hq + h) * a.Sq + i) * L;
        for (int64_t j = 0; j < L; ++j)
          qo[j] = T(mode == 3 ? p[size_t(j)] : mode == 2 ? qk[size_t(j)] + bias[size_t(j)] : qk[size_t(j)]);
        T* yi = a.three_d ? y + (b * a.Sq + i) * a.Hq * a.Dv + h * a.Dv : y + ((b * a.Hq + h) * a.Sq + i) * a.Dv;
        for (int64_t d = 0; d < a.Dv; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < L; ++j) acc += double(T(p[size_t(j)])) * double(vp[((b * a.Hkv + hk) * L + j) * a.Dv + d]);
          yi[d] = T(acc);
        }
      }
    }
  }
  return {Y, Kp, Vp, QK};
}

InferResult infer_attention(const InferContext& c) {
  const TensorType &q = c.input(0), &k = c.input(1), &v = c.input(2);
  InferResult r;
  const DType dt = q.dtype;
  auto unknown = [&] {
    for (size_t i = 0; i < c.node.outputs.size(); ++i) r.outputs.push_back(TensorType::unknown_shape(dt));
    return r;
  };
  if (!q.has_shape || !k.has_shape || !v.has_shape) return unknown();
  if (q.rank() != k.rank() || q.rank() != v.rank() || (q.rank() != 3 && q.rank() != 4))
    c.error("Q, K and V must all be 3-D or all 4-D, got " + q.str() + ", " + k.str() + ", " + v.str());
  const bool three_d = q.rank() == 3;
  const int64_t hq = c.node.attrs.get_int("q_num_heads", 0), hkv = c.node.attrs.get_int("kv_num_heads", 0);
  auto div = [](const Dim& d, int64_t by) { return d.known() && by > 0 ? Dim(d.value / by) : Dim{}; };
  Dim B = q.dims[0], Hq = three_d ? Dim(hq) : q.dims[1], Hkv = three_d ? Dim(hkv) : k.dims[1], Sq = three_d ? q.dims[1] : q.dims[2];
  Dim Skv = three_d ? k.dims[1] : k.dims[2], Dk = three_d ? div(k.dims[2], hkv) : k.dims[3], Dv = three_d ? div(v.dims[2], hkv) : v.dims[3];
  if (three_d && (hq <= 0 || hkv <= 0)) c.error("3-D inputs need q_num_heads and kv_num_heads");
  Dim L = Skv;
  if (c.has_input(4)) {
    const TensorType& pk = c.input(4);
    L = pk.has_shape && pk.rank() == 4 && pk.dims[2].known() && Skv.known() ? Dim(pk.dims[2].value + Skv.value) : Dim{};
  }
  r.outputs.push_back(three_d ? TensorType(dt, {B, Sq, Dv.known() && hq > 0 ? Dim(Dv.value * hq) : Dim{}}) : TensorType(dt, {B, Hq, Sq, Dv}));
  if (c.node.outputs.size() > 1) r.outputs.push_back(TensorType(dt, {B, Hkv, L, Dk}));
  if (c.node.outputs.size() > 2) r.outputs.push_back(TensorType(dt, {B, Hkv, L, Dv}));
  if (c.node.outputs.size() > 3) r.outputs.push_back(TensorType(dt, {B, Hq, Sq, L}));
  return r;
}

// TensorScatter: present = past_cache with `update` written along `axis` (default -2, the
// sequence axis of [B, H, S, D]) from write_indices[b] on (0 without them) for each batch entry
// b; mode circular wraps around the cache length, linear requires the write to fit.
std::vector<Tensor> tensor_scatter_kernel(const KernelContext& c) {
  const Tensor& past = c.input(0);
  const Tensor& upd = c.input(1);
  const Tensor* idx = c.has_input(2) ? c.inputs[2] : nullptr;
  const std::string mode = c.node.attrs.get_string("mode", "linear");
  if (mode != "linear" && mode != "circular") c.error("mode must be linear or circular, got '" + mode + "'");
  if (past.rank() < 1 || upd.rank() != past.rank() || upd.dtype() != past.dtype())
    c.error(std::string("update ") + dtype_name(upd.dtype()) + shape_str(upd.shape()) + " must have past_cache's dtype and rank (" + dtype_name(past.dtype()) +
            shape_str(past.shape()) + ")");
  const int64_t axis = normalize_axis(c.node.attrs.get_int("axis", -2), past.rank(), c.node);
  if (axis == 0) c.error("axis must not be the batch axis 0");
  for (int64_t i = 0; i < past.rank(); ++i)
    if (i == axis ? upd.dim(i) > past.dim(i) : upd.dim(i) != past.dim(i))
      c.error("update " + shape_str(upd.shape()) + " does not fit past_cache " + shape_str(past.shape()) + " along axis " + std::to_string(axis));
  const int64_t B = past.dim(0);
  if (idx && idx->numel() != B) c.error("write_indices must hold one index per batch entry (" + std::to_string(B) + ")");
  int64_t outer = 1, inner = 1;  // per batch entry: dims between batch and axis, and after axis
  for (int64_t i = 1; i < axis; ++i) outer *= past.dim(i);
  for (int64_t i = axis + 1; i < past.rank(); ++i) inner *= past.dim(i);
  const int64_t M = past.dim(axis), S = upd.dim(axis);
  const size_t es = dtype_size(past.dtype()), row = size_t(inner) * es;
  Tensor out = past.clone();
  char* o = static_cast<char*>(out.raw());
  const char* u = static_cast<const char*>(upd.raw());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t w0 = idx ? idx->as_int(b) : 0;
    if (mode == "linear" && (w0 < 0 || w0 + S > M))
      c.error("write_indices[" + std::to_string(b) + "] = " + std::to_string(w0) + " with " + std::to_string(S) + " updates overruns the cache length " +
              std::to_string(M));
    for (int64_t m = 0; m < outer; ++m)
      for (int64_t s = 0; s < S; ++s) {
        int64_t at = w0 + s;
        if (mode == "circular") at = ((at % M) + M) % M;
        std::memcpy(o + size_t(((b * outer + m) * M + at)) * row, u + size_t(((b * outer + m) * S + s)) * row, row);
      }
  }
  return {out};
}

}  // namespace

void register_nn_attention_ops(OpRegistry& r) {
  {
    OpSchema s = nn_schema("TensorScatter", 24, 2, 3, 1, 1, MappingType::ManyToMany);  // as ScatterND
    s.infer = [](const InferContext& c) { return infer_one(c.input(0)); };
    s.kernel = tensor_scatter_kernel;
    s.flops = [](const Node&, const std::vector<TensorType>&, const std::vector<TensorType>&) { return 0.0; };
    r.add(std::move(s));
  }
  OpSchema s = nn_schema("Attention", 23, 3, 7, 1, 4);
  s.infer = infer_attention;
  s.kernel = [](const KernelContext& c) {
    if (c.opset < 24 && c.num_inputs() > 6 && c.has_input(6)) c.error("nonpad_kv_seqlen needs opset 24");
    return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
      using T = decltype(tag);
      return attention_typed<T>(c, in);
    });
  };
  // Two products per head, [Sq, D] x [D, L] and [Sq, L] x [L, D]: 4 * numel(Q) * L (L the keys of
  // K; a cache adds its own), plus 5 per score for the softmax, counted with Q's numel.
  s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
    if (ins.size() < 2 || !ins[0].numel() || !ins[1].has_shape || ins[1].rank() < 3) return 0.0;
    const Dim& keys = ins[1].dims[ins[1].rank() == 3 ? 1 : 2];
    return keys.known() ? 4.0 * double(*ins[0].numel()) * double(keys.value) : 0.0;
  };
  r.add(std::move(s));
}

}  // namespace nnfuse::nn
