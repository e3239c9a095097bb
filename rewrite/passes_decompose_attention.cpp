// decompose-attention: the Attention op (opset 23) -> Transpose(K), MatMul, Mul(scale),
// [Add(bias)], Softmax, MatMul: the form the legacy exporters write, which the fusion planner
// recognises as one attention block (fusion/attention_pattern.cpp) and the code generator runs
// as fused attention. Without it the op runs on its reference kernel.
// Condition: only output Y is used; no past_key/past_value or nonpad_kv_seqlen; no softcap and no
// sliding window; Q/K/V 3-D with static hidden sizes or 4-D with static head sizes; a mask, if
// any, covers every key (its last dim is the key count: the op pads a shorter one). A row with
// every key masked gives zeros from the op and NaN through a Softmax: a constant mask is checked
// to leave every row a key (and then needs nothing more); a mask computed at run time gets the
// guard Where(IsNaN(p), 0, p) after the Softmax, the form the dynamo exporter writes, which the
// fused kernel takes too. A boolean run-time mask becomes Where(mask, 0, -inf). Grouped-query
// heads repeat K and V (Reshape, Expand, Reshape).
// Apply: 3-D inputs are reshaped to [B, S, H, D] and transposed to [B, H, S, D]; the output goes
// back the same way. The scale is one Mul after the scores (the op scales Q and K by its square
// root each: the same product up to rounding).
#include <cmath>
#include <limits>

#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

bool used(const Graph& g, const Node& n, size_t out) {
  return out < n.outputs.size() && !n.outputs[out].empty() && (!g.consumers(n.outputs[out]).empty() || g.is_output(n.outputs[out]));
}

// The additive bias [Sq, L] or the mask's own rank (broadcast by Add), causal folded in; nullopt
// when the mask is not constant or leaves a row without keys.
std::optional<Tensor> constant_bias(const Graph& g, const Node& n, int64_t Sq, int64_t L, bool causal) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const Tensor* m = n.inputs.size() > 3 && !n.inputs[3].empty() ? g.constant_value(n.inputs[3]) : nullptr;
  if (n.inputs.size() > 3 && !n.inputs[3].empty() && !m) return std::nullopt;
  Shape ms = m ? m->shape() : Shape{Sq, L};
  if (ms.size() < 2 || ms.size() > 4 || ms.back() > L) return std::nullopt;
  if (ms.back() < L) return std::nullopt;  // padded masks: left to the op
  if (ms[ms.size() - 2] != Sq && ms[ms.size() - 2] != 1) return std::nullopt;
  Shape bs = ms;
  if (causal) bs[bs.size() - 2] = Sq;
  Tensor bias(DType::Float32, bs);
  float* b = bias.data<float>();
  const int64_t rows = bias.numel() / L;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % Sq;  // the query row (the mask's row, or its broadcast one)
    const int64_t mr = ms[ms.size() - 2] == 1 ? r / Sq : r;  // the mask row this bias row reads
    bool any = false;
    for (int64_t j = 0; j < L; ++j) {
      float v = 0.f;
      if (m) v = m->dtype() == DType::Bool ? (m->data<bool>()[mr * L + j] ? 0.f : neg_inf) : float(m->as_double(mr * L + j));
      if (causal && j > i) v = neg_inf;
      b[r * L + j] = v;
      any = any || !(std::isinf(v) && v < 0);
    }
    if (!any) return std::nullopt;
  }
  return bias;
}

bool apply(Graph& g, NodeId id) {
  const Node n = g.node(id);
  if (n.inputs.size() < 3 || !used(g, n, 0) || used(g, n, 1) || used(g, n, 2) || used(g, n, 3)) return false;
  for (size_t k = 4; k < n.inputs.size(); ++k)
    if (!n.inputs[k].empty()) return false;  // a cache or nonpad_kv_seqlen
  if (n.attrs.get_float("softcap", 0.f) != 0.f || n.attrs.get_int("left_window_size", -1) != -1 ||
      n.attrs.get_int("right_window_size", -1) != -1 || n.attrs.get_int("qk_matmul_output_mode", 0) != 0)
    return false;
  const TensorType &q = g.type(n.inputs[0]), &k = g.type(n.inputs[1]), &v = g.type(n.inputs[2]);
  // All three float32: the spec lets V's type differ from Q's and K's, which the float32
  // MatMuls below would mix.
  if (q.dtype != DType::Float32 || k.dtype != DType::Float32 || v.dtype != DType::Float32 || !q.has_shape || !k.has_shape || !v.has_shape || q.rank() != k.rank() || q.rank() != v.rank()) return false;
  const bool three_d = q.rank() == 3;
  if (!three_d && q.rank() != 4) return false;
  auto known = [](const TensorType& t, int i) { return t.dims[size_t(i)].known() ? t.dims[size_t(i)].value : int64_t(-1); };
  int64_t Hq, Hkv, Dk, Dv, Sq, L;
  if (three_d) {
    Hq = n.attrs.get_int("q_num_heads", 0), Hkv = n.attrs.get_int("kv_num_heads", 0);
    if (Hq <= 0 || Hkv <= 0 || known(q, 2) <= 0 || known(k, 2) <= 0 || known(v, 2) <= 0) return false;
    if (known(q, 2) % Hq || known(k, 2) % Hkv || known(v, 2) % Hkv) return false;
    Dk = known(q, 2) / Hq, Dv = known(v, 2) / Hkv, Sq = known(q, 1), L = known(k, 1);
    if (known(k, 2) / Hkv != Dk) return false;
  } else {
    Hq = known(q, 1), Hkv = known(k, 1), Dk = known(q, 3), Dv = known(v, 3), Sq = known(q, 2), L = known(k, 2);
    if (Hq <= 0 || Hkv <= 0 || Dk <= 0 || Dv <= 0 || known(k, 3) != Dk) return false;
  }
  if (Hq % Hkv) return false;
  const bool causal = n.attrs.get_int("is_causal", 0) != 0;
  const bool has_mask = n.inputs.size() > 3 && !n.inputs[3].empty();
  std::optional<Tensor> bias;  // constant mask and causal bias
  std::string runtime_mask;    // a mask computed at run time
  if (has_mask && !g.constant_value(n.inputs[3])) {
    const TensorType& m = g.type(n.inputs[3]);
    if (!m.has_shape || m.rank() < 1 || m.rank() > 4 || L <= 0 || !m.dims.back().known() || m.dims.back().value != L) return false;
    if (m.dtype != DType::Bool && m.dtype != DType::Float32) return false;
    runtime_mask = n.inputs[3];
    if (causal) {
      if (Sq <= 0) return false;
      Tensor tri(DType::Float32, {Sq, L});
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t j = 0; j < L; ++j) tri.data<float>()[i * L + j] = j > i ? -std::numeric_limits<float>::infinity() : 0.f;
      bias = tri;
    }
  } else if (has_mask || causal) {
    if (Sq <= 0 || L <= 0) return false;
    bias = constant_bias(g, n, Sq, L, causal);
    if (!bias) return false;
  }
  const double scale = n.attrs.has("scale") ? double(n.attrs.get_float("scale", 1.f)) : 1.0 / std::sqrt(double(Dk));
  const NodeMaker op{g, n.name.empty() ? "attention" : n.name};
  auto perm = [](std::vector<int64_t> p) {
    Attributes a;
    a.set("perm", Attribute::make_ints(std::move(p)));
    return a;
  };
  // [B, S, H*D] -> [B, H, S, D]
  auto heads = [&](const std::string& x, int64_t H, int64_t D) {
    if (!three_d) return x;
    return op("Transpose", {op("Reshape", {x, op.ints("heads_shape", {0, 0, H, D})})}, perm({0, 2, 1, 3}));
  };
  std::string Q = heads(n.inputs[0], Hq, Dk), K = heads(n.inputs[1], Hkv, Dk), V = heads(n.inputs[2], Hkv, Dv);
  if (Hq != Hkv) {  // grouped-query heads: each kv head serves Hq / Hkv query heads
    auto repeat = [&](const std::string& x, int64_t D) {
      std::string u = op("Unsqueeze", {x, op.ints("axis2", {2})});
      std::string e = op("Expand", {u, op.ints("group_shape", {1, 1, Hq / Hkv, 1, 1})});
      return op("Reshape", {e, op.ints("gqa_shape", {0, Hq, -1, D})});
    };
    K = repeat(K, Dk), V = repeat(V, Dv);
  }
  std::string kt = op("Transpose", {K}, perm({0, 1, 3, 2}));
  std::string scores = op("Mul", {op("MatMul", {Q, kt}), op.scalar("scale", float(scale))});
  auto scalar = [&](const std::string& hint, float v) { return op.scalar(hint, v); };
  if (!runtime_mask.empty()) {
    std::string m = runtime_mask;
    if (g.type(m).dtype == DType::Bool) m = op("Where", {m, scalar("zero", 0.f), scalar("neg_inf", -std::numeric_limits<float>::infinity())});
    scores = op("Add", {scores, m});
  }
  if (bias) scores = op("Add", {scores, add_initializer(g, op.base + "/bias", *bias)});
  Attributes sm;
  sm.set("axis", Attribute::make_int(-1));
  std::string p = op("Softmax", {scores}, sm);
  if (!runtime_mask.empty()) p = op("Where", {op("IsNaN", {p}), scalar("zero", 0.f), p});  // fully masked rows: 0
  std::string y = op("MatMul", {p, V});
  if (three_d) y = op("Reshape", {op("Transpose", {y}, perm({0, 2, 1, 3})), op.ints("out_shape", {0, 0, Hq * Dv})});
  const std::string out = n.outputs[0];
  g.remove_node(id, /*drop_outputs=*/false);
  redirect(g, out, y);
  return true;
}

void run(PassContext& ctx, const PassArgs&) { rewrite_each(ctx, "Attention", "decompose-attention", apply); }

}  // namespace

void register_decompose_attention_pass() {
  register_pass({"decompose-attention",
                 "Attention (opset 23) -> MatMul, Softmax, MatMul that the fusion planner runs as fused attention (no cache, softcap or window)",
                 {"shapes"}, {}, false},
                run);
}

}  // namespace nnfuse::passes
