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
// The int8 kernel (kernels/microkernels/conv_int8.h) is not a choice by cost: choose_int8_kernels
// (int8_kernels.cpp) sets it afterwards where the target has VNNI and the conv's input and weights
// hold 8-bit integers; it does 4x the multiply-adds per instruction of the float kernels on the
// same data, exactly.
#include <cstdlib>

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

}  // namespace

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

void choose_conv_algorithms(KernelModule& mod, const std::string& mode) {
  if (mode != "auto" && mode != "direct" && mode != "winograd" && mode != "winograd2")
    fail(ErrorKind::Invalid, "conv algorithm '" + mode + "': expected auto, direct, winograd or winograd2");
  mod.conv_algorithm = mode;
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
