// Int8 kernels for quantized models: which Conv and MatMul/Gemm stages run on them
// (kernels/microkernels/conv_int8.h, gemm_int8.h; both need AVX-512 VNNI, LowerOptions::int8_dot).
//
// A quantized model reaches the lowering in float: its weights' DequantizeLinear folded into float
// constants, each activation QuantizeLinear -> DequantizeLinear pair written as float arithmetic
// (rewrite/passes_qdq_to_float.cpp). Both facts the int8 kernels need are still there to read:
//   - the anchor's data input is that arithmetic's result, so its values are (q - z) * s_x for
//     integers q of an 8-bit range (fake_quantized);
//   - each output's weights (a conv's output channel, a MatMul's column) are integers in
//     [-127, 127] times max|w| / m for some m in [1, 127] (int8_weight_grid: 127 for ONNX
//     Runtime's per-channel symmetric weights, some m <= 127 per channel for a per-tensor scale;
//     any m that makes every weight an integer is exact, the true one or a multiple of it). The
//     search stops at an output's first non-integer, so a float model's weights fail fast.
// Then the kernels' integer sums are exact and the result is the float kernels' up to rounding.
#include <cmath>
#include <optional>

#include "lowering/kernel_ir.h"

namespace nnfuse {

namespace {

int64_t ip(const Stage& st, const char* k) {
  auto it = st.iparams.find(k);
  return it == st.iparams.end() ? 0 : it->second;
}

// A one-element constant as a double.
std::optional<double> scalar(const Graph& g, const std::string& v) {
  const Tensor* t = v.empty() ? nullptr : g.constant_value(v);
  if (!t || t->numel() != 1) return std::nullopt;
  return t->as_double(0);
}
bool integral(double v) { return std::isfinite(v) && v == std::nearbyint(v); }

// The node producing v if it is `op` with one constant scalar operand: the other operand's name
// and the constant. Commutative ops take the constant on either side.
std::optional<NodeId> unary_with_constant(const Graph& g, const std::string& v, const char* op, std::string& other, double& c,
                                          bool commutative) {
  const auto p = g.producer(v);
  if (!p) return std::nullopt;
  const Node& n = g.node(*p);
  if (n.op_type != op || !n.domain.empty() || n.inputs.size() != 2) return std::nullopt;
  for (int i = 0; i < (commutative ? 2 : 1); ++i)
    if (auto k = scalar(g, n.inputs[size_t(1 - i)]); k && !g.constant_value(n.inputs[size_t(i)])) {
      other = n.inputs[size_t(i)], c = *k;
      return p;
    }
  return std::nullopt;
}

// Whether v's values are (q - zp) * scale for integers q in [lo, hi]: the chain qdq-to-float writes,
// Mul(Sub?(Min(Max(Add?(Round(..), zq), lo), hi), zp), scale), the clamp also as Max(Min) or Clip.
bool fake_quantized(const Graph& g, const std::string& v, double& scale, double& zp, double& lo, double& hi) {
  std::string a;
  if (!unary_with_constant(g, v, "Mul", a, scale, true) || !(std::isfinite(scale) && scale > 0)) return false;
  std::string b = a;
  zp = 0;
  if (!unary_with_constant(g, a, "Sub", b, zp, false)) b = a;
  std::string r, m;
  if (unary_with_constant(g, b, "Min", m, hi, true) && unary_with_constant(g, m, "Max", r, lo, true)) {
  } else if (unary_with_constant(g, b, "Max", m, lo, true) && unary_with_constant(g, m, "Min", r, hi, true)) {
  } else if (const auto c = g.producer(b); c && g.node(*c).op_type == "Clip" && g.node(*c).inputs.size() == 3) {
    const Node& n = g.node(*c);
    const auto l = scalar(g, n.inputs[1]), h = scalar(g, n.inputs[2]);
    if (!l || !h) return false;
    r = n.inputs[0], lo = *l, hi = *h;
  } else {
    return false;
  }
  std::string rr;
  double zq = 0;
  if (unary_with_constant(g, r, "Add", rr, zq, true)) r = rr;
  const auto rp = g.producer(r);
  if (!rp || g.node(*rp).op_type != "Round") return false;
  return integral(zp) && integral(zq) && integral(lo) && integral(hi) && lo < hi;
}

// The input's quantization as the kernels take it: scale s_x and offset B = z - lowest, when
// v is quantized to at most 256 levels.
bool quantized_input(const Graph& g, const std::string& v, double& scale, int64_t& offset) {
  double zp = 0, lo = 0, hi = 0;
  if (!fake_quantized(g, v, scale, zp, lo, hi) || hi - lo > 255) return false;
  offset = int64_t(zp - lo);
  return true;
}

// Multipliers per output j of `outs`, whose n weights are w[j * s_out + i * s_in]; false if some
// output has no grid. The float arithmetic is int8_common.h's (int8_weight_scale / _value).
bool int8_weight_grid(const float* w, int64_t outs, int64_t n, int64_t s_out, int64_t s_in, std::vector<int64_t>& mult) {
  // int32 holds a sum of n products of at most 255 * 128.
  if (n > (int64_t(1) << 31) / (255 * 128)) return false;
  mult.assign(size_t(outs), 0);
  for (int64_t j = 0; j < outs; ++j) {
    const float* wj = w + j * s_out;
    float amax = 0.f;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(wj[i * s_in]));
    if (!std::isfinite(amax)) return false;
    for (int64_t m = 127; m >= 1 && !mult[size_t(j)]; --m) {
      const float s = amax > 0.f ? amax / float(m) : 1.f;
      bool on_grid = true;
      for (int64_t i = 0; i < n && on_grid; ++i) {
        const float r = wj[i * s_in] / s;
        on_grid = std::fabs(r - std::nearbyint(r)) <= 1e-3f;
      }
      if (on_grid) mult[size_t(j)] = m;
    }
    if (!mult[size_t(j)]) return false;
  }
  return true;
}

// The float data of a constant weight buffer of n elements, or null.
const float* weight_data(const KernelModule& mod, int buffer, int64_t n) {
  if (buffer < 0) return nullptr;
  const KBuffer& b = mod.buffers[size_t(buffer)];
  if (b.kind != BufferKind::Weight || b.data.dtype() != DType::Float32 || b.data.numel() != n || n <= 0) return nullptr;
  return b.data.data<float>();
}

}  // namespace

bool conv_int8_applicable(const KernelModule& mod, const Stage& st, double& scale, int64_t& offset, std::vector<int64_t>& multipliers) {
  if (st.kind != StageKind::Anchor || st.anchor_op != "Conv" || st.layout_block != 16 || ip(st, "G") != 1) return false;
  if (st.anchor_inputs.size() < 2 || st.anchor == kNoNode) return false;
  if (!quantized_input(mod.graph, mod.graph.node(st.anchor).inputs[0], scale, offset)) return false;
  const int64_t K = ip(st, "CO"), per_k = ip(st, "C") * ip(st, "KH") * ip(st, "KW");
  const float* w = weight_data(mod, st.anchor_inputs[1], K * per_k);
  return w && int8_weight_grid(w, K, per_k, per_k, 1, multipliers);
}

bool gemm_int8_applicable(const KernelModule& mod, const Stage& st, double& scale, int64_t& offset, std::vector<int64_t>& multipliers) {
  if (st.kind != StageKind::Anchor || (st.anchor_op != "MatMul" && st.anchor_op != "Gemm") || st.layout_block > 0) return false;
  // B a weight packed once (shared by every batch element); A row-major with its batch elements
  // one after another, so that all of them are one M x K matrix.
  if (st.prepared < 0 || st.anchor_inputs.size() < 2 || st.anchor == kNoNode || ip(st, "transA")) return false;
  const int64_t M = ip(st, "M"), N = ip(st, "N"), K = ip(st, "K");
  const auto& aoff = st.vparams.at("a_off");
  for (size_t b = 0; b < aoff.size(); ++b)
    if (aoff[b] != int64_t(b) * M * K) return false;
  if (!quantized_input(mod.graph, mod.graph.node(st.anchor).inputs[0], scale, offset)) return false;
  const float* w = weight_data(mod, st.anchor_inputs[1], K * N);
  // B(k, n) = w[k * N + n], or w[n * K + k] transposed.
  return w && (ip(st, "transB") ? int8_weight_grid(w, N, K, K, 1, multipliers) : int8_weight_grid(w, N, K, 1, N, multipliers));
}

void choose_int8_kernels(KernelModule& mod, bool int8_dot) {
  mod.int8_dot = int8_dot;
  if (!int8_dot) return;
  for (auto& st : mod.stages) {
    double scale = 1;
    int64_t offset = 0;
    std::vector<int64_t> mult;
    if (conv_int8_applicable(mod, st, scale, offset, mult)) st.iparams["ALGO"] = kConvInt8;
    else if (gemm_int8_applicable(mod, st, scale, offset, mult)) st.iparams["INT8"] = 1;
    else continue;
    // Both kernels read the input's quantization and the weights' grid under the same names.
    st.fparams["XSCALE"] = scale;
    st.iparams["XOFFSET"] = offset;
    st.vparams["WMULT"] = mult;
  }
}

nlohmann::json int8_summary(const KernelModule& mod) {
  nlohmann::json blocks = nlohmann::json::object();
  int convs = 0, gemms = 0;
  for (auto& st : mod.stages) {
    const bool conv = st.anchor_op == "Conv" && st.iparams.count("ALGO") && st.iparams.at("ALGO") == kConvInt8;
    const bool gemm = st.iparams.count("INT8") > 0;
    if (!conv && !gemm) continue;
    convs += conv, gemms += gemm;
    blocks["b" + std::to_string(st.block)] = conv ? "conv" : "gemm";
  }
  return {{"enabled", mod.int8_dot}, {"convs", convs}, {"gemms", gemms}, {"blocks", blocks}};
}

}  // namespace nnfuse
