// Convolution algorithm per blocked Conv stage: direct NCHW<c>c, Winograd F(4x4, 3x3) or
// F(2x2, 3x3) (kernels/microkernels/conv_nchwc.h, conv_winograd.h). Runs after the layouts are
// final, since only blocked dense convolutions have a Winograd kernel.
//
// The cost model (deterministic; the mode "auto"): F(4x4) does 36 products per 4x4 output tile
// and input channel where the direct kernel does 144, F(2x2) 16 per 2x2 tile where it does 36;
// their transformed weights are 4x and 1.8x larger than the direct ones and are streamed once per
// call, and a map that is not a multiple of the tile computes the padding tiles too. Measured on
// the ResNet-50 and YOLOv8n layer shapes (bench/kernels_bench.cpp, bench/RESULTS.md): F(4x4) is
// 2-4.5x faster than direct from 20 tiles per call (20x20 maps and up), F(2x2) wins below that
// (14x14: 1.95x vs 1.84x; 10x10: 1.55x vs 1.36x) down to 20 tiles of 2x2. On 7x7 maps (16 such
// tiles) direct wins on a Xeon since a padded direct conv runs on a zero-bordered copy of its
// input (F(2x2) 0.92x, F(4x4) 0.66x of direct) while F(2x2) still wins on Zen 4 (1.2x): which is
// why CpuModel times the candidates on the machine by default (kernels/conv_probe.h) and this
// model decides only under --no-profile and for cross targets. Winograd's scratch (the
// transformed input and products) is kept within a bound so that a large image falls back to the
// direct kernel.
//
// The int8 kernel (kernels/microkernels/conv_int8.h) is not a choice by cost: where the target has
// VNNI and the conv's input and weights hold 8-bit integers (conv_int8_applicable), it does 4x the
// multiply-adds per instruction of the float kernels on the same data, exactly.
#include <cmath>
#include <cstdlib>
#include <optional>

#include "graph/error.h"
#include "lowering/kernel_ir.h"

namespace nnfuse {

namespace {

constexpr int64_t kMinF4Tiles = 20, kMinF2Tiles = 20;
constexpr int64_t kMaxWinogradScratchBytes = int64_t(64) << 20;

int64_t ip(const Stage& st, const char* k) {
  auto it = st.iparams.find(k);
  return it == st.iparams.end() ? 0 : it->second;
}

bool winograd_applicable(const Stage& st) {
  return st.kind == StageKind::Anchor && st.anchor_op == "Conv" && st.layout_block > 0 && ip(st, "G") == 1 && ip(st, "KH") == 3 &&
         ip(st, "KW") == 3 && ip(st, "SH") == 1 && ip(st, "SW") == 1 && ip(st, "DH") == 1 && ip(st, "DW") == 1;
}

// Tiles of an m x m output tile per call, and whether Winograd's scratch for them stays bounded.
int64_t winograd_tiles(const Stage& st, int64_t m) { return ip(st, "N") * ((ip(st, "OH") + m - 1) / m) * ((ip(st, "OW") + m - 1) / m); }
bool scratch_fits(const Stage& st, int64_t m) {
  const int64_t c = st.layout_block, t = m + 2;
  const int64_t cb = (ip(st, "C") + c - 1) / c, kb = (ip(st, "CO") + c - 1) / c;
  return t * t * (cb + kb) * winograd_tiles(st, m) * c * int64_t(sizeof(float)) <= kMaxWinogradScratchBytes;
}

int64_t cost_model_choice(const Stage& st) {
  if (winograd_tiles(st, 4) >= kMinF4Tiles && scratch_fits(st, 4)) return kConvWinogradF4x4;
  if (winograd_tiles(st, 2) >= kMinF2Tiles && scratch_fits(st, 2)) return kConvWinogradF2x2;
  return kConvDirect;
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

}  // namespace

bool conv_int8_applicable(const KernelModule& mod, const Stage& st, double& scale, int64_t& offset, std::vector<int64_t>& multipliers) {
  if (st.kind != StageKind::Anchor || st.anchor_op != "Conv" || st.layout_block != 16 || ip(st, "G") != 1) return false;
  if (st.anchor_inputs.size() < 2 || st.anchor_inputs[1] < 0 || st.anchor == kNoNode) return false;
  const Graph& g = mod.graph;
  double zp = 0, lo = 0, hi = 0;
  if (!fake_quantized(g, g.node(st.anchor).inputs[0], scale, zp, lo, hi)) return false;
  // u = q - lo = t + (zp - lo) must fit a byte: an 8-bit type's range.
  if (hi - lo > 255) return false;
  offset = int64_t(zp - lo);
  // Weights: per output channel k, integers in [-127, 127] times max|w_k| / m_k for some m_k in
  // [1, 127] (127 for a per-channel symmetric int8 weight; a per-tensor scale puts each channel's
  // largest weight at some m_k <= 127; any m that makes every weight an integer is exact, the true
  // one or a multiple). The search stops at a channel's first non-integer, so a float model's
  // weights fail fast. PackedConvInt8::pack computes the integers with the same float arithmetic.
  const KBuffer& wb = mod.buffers[size_t(st.anchor_inputs[1])];
  const int64_t K = ip(st, "CO"), per_k = ip(st, "C") * ip(st, "KH") * ip(st, "KW");
  if (wb.kind != BufferKind::Weight || wb.data.dtype() != DType::Float32 || wb.data.numel() != K * per_k || K <= 0) return false;
  // int32 holds a sum of per_k products of at most 255 * 128.
  if (per_k > (int64_t(1) << 31) / (255 * 128)) return false;
  const float* w = wb.data.data<float>();
  multipliers.assign(size_t(K), 0);
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = w + k * per_k;
    float amax = 0.f;
    for (int64_t i = 0; i < per_k; ++i) amax = std::max(amax, std::fabs(wk[i]));
    if (!std::isfinite(amax)) return false;
    for (int64_t m = 127; m >= 1 && !multipliers[size_t(k)]; --m) {
      const float s = amax > 0.f ? amax / float(m) : 1.f;
      bool on_grid = true;
      for (int64_t i = 0; i < per_k && on_grid; ++i) {
        const float r = wk[i] / s;
        on_grid = std::fabs(r - std::nearbyint(r)) <= 1e-3f;
      }
      if (on_grid) multipliers[size_t(k)] = m;
    }
    if (!multipliers[size_t(k)]) return false;
  }
  return true;
}

std::vector<int64_t> conv_algorithm_candidates(const Stage& st) {
  if (ip(st, "ALGO") == kConvInt8 || !winograd_applicable(st)) return {};
  std::vector<int64_t> c = {kConvDirect};
  if (scratch_fits(st, 4)) c.push_back(kConvWinogradF4x4);
  if (scratch_fits(st, 2)) c.push_back(kConvWinogradF2x2);
  return c.size() > 1 ? c : std::vector<int64_t>{};
}

std::string conv_algorithm_name(int64_t algo) {
  if (algo == kConvInt8) return "int8_vnni_nchwc";
  return algo == kConvWinogradF4x4 ? "winograd_f4x4_3x3" : algo == kConvWinogradF2x2 ? "winograd_f2x2_3x3" : "direct_nchwc";
}

bool conv_stage_depthwise(const Stage& st) {
  return st.anchor_op == "Conv" && ip(st, "G") > 1 && ip(st, "G") == ip(st, "C") && ip(st, "CO") == ip(st, "C");
}

std::string conv_algorithm_name(const Stage& st) {
  if (st.kind != StageKind::Anchor || st.anchor_op != "Conv") return "";
  if (ip(st, "ALGO") != kConvDirect) return conv_algorithm_name(ip(st, "ALGO"));
  if (st.layout_block <= 0) return ip(st, "G") > 1 && ip(st, "G") == ip(st, "C") ? "depthwise" : "im2col_gemm";
  if (ip(st, "G") == 1) return "direct_nchwc";
  return conv_stage_depthwise(st) ? "depthwise_nchwc" : "grouped_nchwc";
}

void choose_conv_algorithms(KernelModule& mod, const std::string& mode, bool int8_dot) {
  if (mode != "auto" && mode != "direct" && mode != "winograd" && mode != "winograd2")
    fail(ErrorKind::Invalid, "conv algorithm '" + mode + "': expected auto, direct, winograd or winograd2");
  mod.conv_algorithm = mode;
  mod.int8_dot = int8_dot;
  for (auto& st : mod.stages) {
    if (st.kind != StageKind::Anchor || st.anchor_op != "Conv") continue;
    int64_t algo = kConvDirect;
    if (winograd_applicable(st)) {
      if (mode == "auto") algo = cost_model_choice(st);
      // A forced Winograd mode still keeps the scratch bound: a layer whose transformed input would
      // not fit runs direct rather than allocating without limit.
      else if (mode == "winograd" && scratch_fits(st, 4)) algo = kConvWinogradF4x4;
      else if (mode == "winograd2" && scratch_fits(st, 2)) algo = kConvWinogradF2x2;
    }
    double scale = 1;
    int64_t offset = 0;
    std::vector<int64_t> multipliers;
    if (int8_dot && conv_int8_applicable(mod, st, scale, offset, multipliers)) {
      algo = kConvInt8;
      st.fparams["XSCALE"] = scale;
      st.iparams["XOFFSET"] = offset;
      st.vparams["WMULT"] = multipliers;
    }
    st.iparams["ALGO"] = algo;
  }
}

nlohmann::json conv_algorithm_summary(const KernelModule& mod) {
  nlohmann::json j;
  j["mode"] = mod.conv_algorithm;
  nlohmann::json counts = nlohmann::json::object(), blocks = nlohmann::json::object();
  for (auto& st : mod.stages) {
    const std::string a = conv_algorithm_name(st);
    if (a.empty()) continue;
    counts[a] = counts.value(a, 0) + 1;
    blocks["b" + std::to_string(st.block)] = a;
  }
  j["counts"] = counts;
  j["blocks"] = blocks;
  if (!mod.conv_timings.empty()) j["measured"] = mod.conv_timings;
  return j;
}

}  // namespace nnfuse
