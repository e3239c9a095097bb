// Convolution algorithm per blocked Conv stage: direct NCHW<c>c or Winograd F(4x4, 3x3)
// (kernels/microkernels/conv_nchwc.h, conv_winograd.h). Runs after the layouts are final, since
// only blocked dense convolutions have a Winograd kernel.
//
// The cost model (deterministic; the mode "auto"): Winograd does 36 products per 4x4 output tile
// and input channel where the direct kernel does 144, but its transformed weights are 4x larger
// (36 vs 9 values per filter tap set) and are streamed once per call. Measured on the ResNet-50
// and YOLOv8n layer shapes (bench/kernels_bench.cpp, bench/RESULTS.md): 2-3.9x faster with 9 or
// more tiles per call, break-even at 4 tiles (a 7x7 map, 512 channels), where streaming the
// weights dominates. Winograd's scratch (the transformed input and products, 36 values per tile
// and channel) is kept within a bound so that a large image falls back to the direct kernel.
#include <cstdlib>

#include "graph/error.h"
#include "lowering/kernel_ir.h"

namespace nnfuse {

namespace {

constexpr int64_t kMinWinogradTiles = 8;
constexpr int64_t kMaxWinogradScratchBytes = int64_t(64) << 20;

int64_t ip(const Stage& st, const char* k) {
  auto it = st.iparams.find(k);
  return it == st.iparams.end() ? 0 : it->second;
}

bool winograd_applicable(const Stage& st) {
  return st.kind == StageKind::Anchor && st.anchor_op == "Conv" && st.layout_block > 0 && ip(st, "G") == 1 && ip(st, "KH") == 3 &&
         ip(st, "KW") == 3 && ip(st, "SH") == 1 && ip(st, "SW") == 1 && ip(st, "DH") == 1 && ip(st, "DW") == 1;
}

bool winograd_pays(const Stage& st) {
  const int64_t c = st.layout_block;
  const int64_t tiles = ip(st, "N") * ((ip(st, "OH") + 3) / 4) * ((ip(st, "OW") + 3) / 4);
  const int64_t cb = (ip(st, "C") + c - 1) / c, kb = (ip(st, "CO") + c - 1) / c;
  const int64_t scratch = 36 * (cb + kb) * tiles * c * int64_t(sizeof(float));
  return tiles >= kMinWinogradTiles && scratch <= kMaxWinogradScratchBytes;
}

}  // namespace

std::string conv_algorithm_name(const Stage& st) {
  if (st.kind != StageKind::Anchor || st.anchor_op != "Conv") return "";
  if (ip(st, "ALGO") == kConvWinogradF4x4) return "winograd_f4x4_3x3";
  if (st.layout_block <= 0) return ip(st, "G") > 1 && ip(st, "G") == ip(st, "C") ? "depthwise" : "im2col_gemm";
  return ip(st, "G") > 1 ? "depthwise_nchwc" : "direct_nchwc";
}

void choose_conv_algorithms(KernelModule& mod, const std::string& mode) {
  if (mode != "auto" && mode != "direct" && mode != "winograd")
    fail(ErrorKind::Invalid, "conv algorithm '" + mode + "': expected auto, direct or winograd");
  mod.conv_algorithm = mode;
  for (auto& st : mod.stages) {
    if (st.kind != StageKind::Anchor || st.anchor_op != "Conv") continue;
    const bool wino = winograd_applicable(st) && (mode == "winograd" || (mode == "auto" && winograd_pays(st)));
    st.iparams["ALGO"] = wino ? kConvWinogradF4x4 : kConvDirect;
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
  return j;
}

}  // namespace nnfuse
