// fold-batchnorm: BatchNormalization (inference) after an anchor with constant weights becomes
// new constant weights and bias of the anchor:
//   y = scale * (x - mean) / sqrt(var + eps) + B = x * a + b,  a = scale / sqrt(var + eps),
//   b = B - mean * a  (per channel, BN axis 1)
// - Conv:          W'[m, ...] = W[m, ...] * a[m];       bias' = bias * a + b
// - ConvTranspose: W[c, j, ...] feeds output channel (c / (C/group)) * (M/group) + j
// - Gemm (2-D output [N, M]): the columns of op(B) scaled; C' = beta*C*a + b, beta := 1
// - MatMul with a constant 2-D weight and a 2-D output: W' columns scaled, then Add(b)
// Condition: the anchor's output is read only by the BN (and is no graph output); the BN's
// parameters, the anchor's weight and bias are float32 constants of the right sizes; the BN's
// optional outputs (training statistics) are unused.
// The rebuilt anchor produces the BN's output name, so readers and graph outputs stay wired.
#include <cmath>

#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

struct BnParams {
  std::vector<float> a, b;  // y = x * a + b per channel
};

const Tensor* float_const(const Graph& g, const Node& n, size_t slot) {
  if (slot >= n.inputs.size() || n.inputs[slot].empty()) return nullptr;
  const Tensor* t = g.constant_value(n.inputs[slot]);
  return t && t->dtype() == DType::Float32 ? t : nullptr;
}

std::optional<BnParams> bn_params(const Graph& g, const Node& bn) {
  if (bn.inputs.size() < 5 || bn.attrs.get_int("training_mode", 0) != 0) return std::nullopt;
  if (g.opset() < 7 && bn.attrs.get_int("is_test", 0) == 0) return std::nullopt;
  if (bn.attrs.has("spatial") && bn.attrs.get_int("spatial", 1) != 1) return std::nullopt;
  for (size_t k = 1; k < bn.outputs.size(); ++k)
    if (!bn.outputs[k].empty() && (!g.consumers(bn.outputs[k]).empty() || g.is_output(bn.outputs[k]))) return std::nullopt;
  const Tensor *s = float_const(g, bn, 1), *B = float_const(g, bn, 2), *m = float_const(g, bn, 3), *v = float_const(g, bn, 4);
  if (!s || !B || !m || !v) return std::nullopt;
  int64_t C = s->numel();
  if (s->rank() != 1 || B->numel() != C || m->numel() != C || v->numel() != C) return std::nullopt;
  float eps = bn.attrs.get_float("epsilon", 1e-5f);
  auto sv = s->to_float_vector(), Bv = B->to_float_vector(), mv = m->to_float_vector(), vv = v->to_float_vector();
  BnParams p;
  for (int64_t c = 0; c < C; ++c) {
    float a = sv[size_t(c)] / std::sqrt(vv[size_t(c)] + eps);
    p.a.push_back(a);
    p.b.push_back(Bv[size_t(c)] - mv[size_t(c)] * a);
  }
  return p;
}

// New anchor inputs (and, for MatMul, a bias to add after it) or nullopt when the anchor does not fit.
struct Folded {
  std::vector<std::string> inputs;
  Attributes attrs;
  std::string add_bias;  // MatMul: initializer added after the new MatMul
};

// Whether fold_conv can fold `p` into `conv`: its weight (rank >= 3, output channels matching
// the BN's) and bias (if any) are float32 constants of the right sizes.
bool conv_fits(const Graph& g, const Node& conv, const BnParams& p, bool transpose) {
  const Tensor* W = float_const(g, conv, 1);
  if (!W || W->rank() < 3) return false;
  int64_t group = conv.attrs.get_int("group", 1);
  if (group <= 0) return false;
  int64_t M = transpose ? W->dim(1) * group : W->dim(0);
  if (M != int64_t(p.a.size())) return false;
  if (conv.inputs.size() > 2 && !conv.inputs[2].empty()) {
    const Tensor* bias = float_const(g, conv, 2);
    if (!bias || bias->numel() != M) return false;
  }
  return true;
}

// Writes the conv weight `src` scaled per output channel into `dst` (which may be `src`: every
// element is read once, at the index it is written to).
void scale_conv_weight(const Shape& shape, const float* src, float* dst, const BnParams& p, int64_t group,
                       bool transpose) {
  int64_t d0 = shape[0], d1 = shape[1], inner = shape_numel(shape) / (d0 * d1);
  if (!transpose) {
    // Conv: W[m] (all of its d1 * inner elements) scales by a[m]; one contiguous, vectorisable
    // run per output channel (a 1x1 conv's innermost dimension alone is a single element).
    const int64_t run = d1 * inner;
    for (int64_t m = 0; m < d0; ++m) {
      const float a = p.a[size_t(m)];
      const float* s = src + m * run;
      float* d = dst + m * run;
      for (int64_t k = 0; k < run; ++k) d[k] = s[k] * a;
    }
  } else {
    for (int64_t i = 0; i < d0; ++i)
      for (int64_t j = 0; j < d1; ++j) {
        int64_t m = (i / (d0 / group)) * d1 + j;
        float a = p.a[size_t(m)];
        int64_t row = (i * d1 + j) * inner;
        for (int64_t k = 0; k < inner; ++k) dst[row + k] = src[row + k] * a;
      }
  }
}

// Scales the columns (output features) of a [K, M] matrix, or the rows of an [M, K] one; `dst`
// may be `src`.
void scale_features(const Shape& shape, const float* src, float* dst, const std::vector<float>& a, bool features_first) {
  int64_t R = shape[0], Ccols = shape[1];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < Ccols; ++c) dst[r * Ccols + c] = src[r * Ccols + c] * a[size_t(features_first ? r : c)];
}

// The anchor's weight `name` with `scale(src, dst)` applied; returns the name the new anchor
// reads. In place when the anchor is its only reader and nothing else can see its buffer
// (Graph::initializer_data_for_update): the weight keeps its name, and no second copy of it is
// allocated and faulted in (ResNet-50: 100 MB of conv weights). Otherwise a new initializer.
template <class Scale>
std::string scaled_weight(Graph& g, const std::string& name, const std::set<std::string>& body_reads, Scale scale) {
  if (single_use(g, name) && !g.is_input(name) && !body_reads.count(name))
    if (void* p = g.initializer_data_for_update(name)) {
      scale(static_cast<const float*>(p), static_cast<float*>(p));
      return name;
    }
  const Tensor& W = *g.constant_value(name);
  Tensor W2 = Tensor::uninitialized(DType::Float32, W.shape());  // every element written next
  scale(W.data<float>(), W2.data<float>());
  return add_initializer(g, name + "_bnfold", std::move(W2));
}

std::optional<Folded> fold_conv(Graph& g, const Node& conv, const BnParams& p, bool transpose,
                                const std::set<std::string>& body_reads) {
  if (!conv_fits(g, conv, p, transpose)) return std::nullopt;
  const Tensor* W = float_const(g, conv, 1);
  int64_t group = conv.attrs.get_int("group", 1);
  int64_t M = transpose ? W->dim(1) * group : W->dim(0);
  const Tensor* bias = conv.inputs.size() > 2 && !conv.inputs[2].empty() ? float_const(g, conv, 2) : nullptr;
  std::vector<float> b(static_cast<size_t>(M));
  auto bv = bias ? bias->to_float_vector() : std::vector<float>(size_t(M), 0.f);
  for (int64_t m = 0; m < M; ++m) b[size_t(m)] = bv[size_t(m)] * p.a[size_t(m)] + p.b[size_t(m)];
  const Shape shape = W->shape();
  std::string bias_hint = (bias ? conv.inputs[2] : conv.inputs[1]) + "_bnfold_bias";
  Folded f;
  f.inputs = {conv.inputs[0], scaled_weight(g, conv.inputs[1], body_reads, [&](const float* src, float* dst) {
                scale_conv_weight(shape, src, dst, p, group, transpose);
              }),
              add_initializer(g, bias_hint, Tensor::from_vector<float>({M}, b))};
  f.attrs = conv.attrs;
  return f;
}

std::optional<Folded> fold_gemm(Graph& g, const Node& gemm, const BnParams& p, const std::set<std::string>& body_reads) {
  const Tensor* B = float_const(g, gemm, 1);
  if (!B || B->rank() != 2) return std::nullopt;
  bool transB = gemm.attrs.get_int("transB", 0) != 0;
  int64_t M = transB ? B->dim(0) : B->dim(1);
  if (M != int64_t(p.a.size())) return std::nullopt;
  if (g.type(gemm.outputs[0]).rank() != 2) return std::nullopt;
  float beta = gemm.attrs.get_float("beta", 1.0f);
  // The new bias: [M], or [N, M] when C varies along N.
  const Tensor* C = nullptr;
  if (gemm.inputs.size() > 2 && !gemm.inputs[2].empty()) {
    C = float_const(g, gemm, 2);
    if (!C || C->rank() > 2) return std::nullopt;
  }
  bool per_row = C && C->rank() == 2 && C->dim(0) != 1;
  int64_t N = per_row ? C->dim(0) : 1;
  if (C && C->rank() >= 1 && C->dim(-1) != 1 && C->dim(-1) != M) return std::nullopt;
  int64_t rows = per_row ? N : 1;
  std::vector<float> nb(size_t(rows * M));
  std::vector<float> cv = C ? C->to_float_vector() : std::vector<float>{};
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float c = 0;
      if (C) {
        int64_t cr = C->rank() == 2 && C->dim(0) != 1 ? n : 0;
        int64_t cc = C->rank() >= 1 && C->dim(-1) != 1 ? m : 0;
        int64_t ncols = C->rank() >= 1 ? C->dim(-1) : 1;
        c = cv[size_t(cr * ncols + cc)];
      }
      nb[size_t(n * M + m)] = beta * c * p.a[size_t(m)] + p.b[size_t(m)];
    }
  Folded f;
  const Shape shape = B->shape();
  std::string bias_hint = gemm.inputs[1] + "_bnfold_bias";
  f.inputs = {gemm.inputs[0], scaled_weight(g, gemm.inputs[1], body_reads, [&](const float* src, float* dst) {
                scale_features(shape, src, dst, p.a, transB);
              }),
              add_initializer(g, bias_hint, per_row ? Tensor::from_vector<float>({N, M}, nb) : Tensor::from_vector<float>({M}, nb))};
  f.attrs = gemm.attrs;
  f.attrs.set("beta", Attribute::make_float(1.0f));
  return f;
}

std::optional<Folded> fold_matmul(Graph& g, const Node& mm, const BnParams& p, const std::set<std::string>& body_reads) {
  const Tensor* W = float_const(g, mm, 1);
  if (!W || W->rank() != 2 || W->dim(1) != int64_t(p.a.size())) return std::nullopt;
  const TensorType& yt = g.type(mm.outputs[0]);
  if (yt.rank() != 2) return std::nullopt;  // BN's channel axis 1 is the feature axis only in 2-D
  int64_t M = W->dim(1);
  Folded f;
  const Shape shape = W->shape();
  std::string bias_hint = mm.inputs[1] + "_bnfold_bias";
  f.inputs = {mm.inputs[0], scaled_weight(g, mm.inputs[1], body_reads, [&](const float* src, float* dst) {
                scale_features(shape, src, dst, p.a, false);
              })};
  f.add_bias = add_initializer(g, bias_hint, Tensor::from_vector<float>({M}, p.b));
  return f;
}

bool condition(const Graph& g, const Node& bn, const std::set<std::string>& body_reads) {
  if (bn.op_type != "BatchNormalization" || !bn.domain.empty() || bn.inputs.empty()) return false;
  auto p = g.producer(bn.inputs[0]);
  if (!p || !single_use(g, bn.inputs[0]) || body_reads.count(bn.inputs[0])) return false;
  const Node& anchor = g.node(*p);
  if (!anchor.domain.empty() || anchor.outputs.size() != 1) return false;
  const std::string& op = anchor.op_type;
  return op == "Conv" || op == "ConvTranspose" || op == "Gemm" || op == "MatMul";
}

bool apply(Graph& g, NodeId bn_id, const std::set<std::string>& body_reads) {
  Node bn = g.node(bn_id);
  auto params = bn_params(g, bn);
  if (!params) return false;
  NodeId anchor_id = *g.producer(bn.inputs[0]);
  Node anchor = g.node(anchor_id);
  std::optional<Folded> f;
  if (anchor.op_type == "Conv") f = fold_conv(g, anchor, *params, false, body_reads);
  else if (anchor.op_type == "ConvTranspose") f = fold_conv(g, anchor, *params, true, body_reads);
  else if (anchor.op_type == "Gemm") f = fold_gemm(g, anchor, *params, body_reads);
  else f = fold_matmul(g, anchor, *params, body_reads);
  if (!f) return false;
  const std::string y = bn.outputs[0];
  g.remove_node(bn_id, /*drop_outputs=*/false);
  g.remove_node(anchor_id, /*drop_outputs=*/true);
  if (f->add_bias.empty()) {
    g.add_node(anchor.op_type, f->inputs, {y}, f->attrs, anchor.name, anchor.domain);
  } else {
    std::string mid = g.fresh_name(anchor.outputs[0]);
    g.add_node(anchor.op_type, f->inputs, {mid}, f->attrs, anchor.name, anchor.domain);
    g.set_type(mid, g.type(y));
    g.add_node("Add", {mid, f->add_bias}, {y}, {}, bn.name);
  }
  // The replaced weights and BN parameters may have no readers left.
  std::vector<std::string> old(anchor.inputs.begin() + 1, anchor.inputs.end());
  old.insert(old.end(), bn.inputs.begin() + 1, bn.inputs.end());
  for (auto& w : old)
    if (!w.empty() && g.is_initializer(w) && !g.is_input(w) && !g.is_output(w) && g.consumers(w).empty() &&
        !body_reads.count(w))
      g.remove_initializer(w);
  return true;
}

void run(PassContext& ctx, const PassArgs&) {
  Graph& g = ctx.graph();
  int folded = 0;
  std::set<std::string> body_reads = names_read_by_subgraphs(g);
  for (NodeId id : g.topo_order())
    if (g.has_node(id) && condition(g, g.node(id), body_reads) && apply(g, id, body_reads)) ++folded;
  if (folded) {
    g.prune_values();
    ctx.rules_fired["fold-batchnorm"] += folded;
  }
}

}  // namespace

void register_fold_batchnorm_pass() {
  PassInfo info{"fold-batchnorm",
                "fold inference BatchNormalization into the weights of a preceding Conv, ConvTranspose, Gemm or "
                "MatMul with constant weights",
                {"shapes"},
                {"shapes"},
                false};
  info.bodies = true;
  register_pass(info, run);
}

}  // namespace nnfuse::passes
