// LSTM, GRU, RNN and NonMaxSuppression as generated kernel-only stages (lowering/lower_kernel_ops.h):
// lowered without fallback, compiled for the host and run against the reference interpreter; the
// NMS output's data-dependent row count through a capacity buffer (read by the runtime and by a
// fallback consumer); and the same graphs as a standalone aarch64 program under qemu.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "kernels/cpu_model.h"
#include "kernels/cross_run.h"
#include "lowering_test_util.h"

using namespace nnfuse;
using namespace nnfuse::testing;
namespace fs = std::filesystem;

namespace {

// A bidirectional LSTM (initial states, sequence_lens as a graph input) feeding a reverse
// layout-1 LSTM with peepholes and clip; Y_c of the second is unused.
Model lstm_model() {
  GraphBuilder gb("lstm_ops", 14);
  const int64_t S = 6, B = 3, I = 5, H = 7;
  auto x = gb.input("x", DType::Float32, {S, B, I});
  auto lens = gb.input("lens", DType::Int32, {B});
  auto h0 = gb.input("h0", DType::Float32, {2, B, H});
  auto c0 = gb.input("c0", DType::Float32, {2, B, H});
  auto w = gb.uniform("w", {2, 4 * H, I}, -0.5f, 0.5f), r = gb.uniform("r", {2, 4 * H, H}, -0.5f, 0.5f);
  auto bias = gb.uniform("b", {2, 8 * H}, -0.3f, 0.3f);
  auto l1 = gb.op_n("LSTM", {x, w, r, bias, lens, h0, c0}, 3,
                    GraphBuilder::attrs({{"direction", A::s("bidirectional")}, {"hidden_size", A::i(H)}}), "bi");
  // [S, 2, B, H] -> [B, S, 2H] (layout 1 input of the second LSTM).
  auto t = gb.op("Transpose", {l1[0]}, GraphBuilder::attrs({{"perm", A::is({2, 0, 1, 3})}}));
  auto x2 = gb.op("Reshape", {t, gb.ints("shape", {B, S, 2 * H})});
  auto w2 = gb.uniform("w2", {1, 4 * H, 2 * H}, -0.5f, 0.5f), r2 = gb.uniform("r2", {1, 4 * H, H}, -0.5f, 0.5f);
  auto p2 = gb.uniform("p2", {1, 3 * H}, -0.5f, 0.5f);
  auto l2 = gb.op_n("LSTM", {x2, w2, r2, "", "", "", "", p2}, 2,
                    GraphBuilder::attrs({{"direction", A::s("reverse")}, {"hidden_size", A::i(H)}, {"layout", A::i(1)},
                                         {"clip", A::f(0.8f)}}),
                    "rev");
  for (auto& o : {l1[1], l1[2], l2[0], l2[1]}) gb.output(o);
  return gb.finish();
}

// GRUs as PyTorch exports them (linear_before_reset 1), bidirectional with sequence_lens and an
// initial state, feeding a reverse layout-1 GRU with linear_before_reset 0, clip and no bias.
Model gru_model() {
  GraphBuilder gb("gru_ops", 14);
  const int64_t S = 6, B = 3, I = 5, H = 9;  // H: one full AVX2 vector and a scalar tail
  auto x = gb.input("x", DType::Float32, {S, B, I});
  auto lens = gb.input("lens", DType::Int32, {B});
  auto h0 = gb.input("h0", DType::Float32, {2, B, H});
  auto w = gb.uniform("w", {2, 3 * H, I}, -0.5f, 0.5f), r = gb.uniform("r", {2, 3 * H, H}, -0.5f, 0.5f);
  auto bias = gb.uniform("b", {2, 6 * H}, -0.3f, 0.3f);
  auto g1 = gb.op_n("GRU", {x, w, r, bias, lens, h0}, 2,
                    GraphBuilder::attrs({{"direction", A::s("bidirectional")}, {"hidden_size", A::i(H)}, {"linear_before_reset", A::i(1)}}),
                    "bi");
  auto t = gb.op("Transpose", {g1[0]}, GraphBuilder::attrs({{"perm", A::is({2, 0, 1, 3})}}));
  auto x2 = gb.op("Reshape", {t, gb.ints("shape", {B, S, 2 * H})});
  auto w2 = gb.uniform("w2", {1, 3 * H, 2 * H}, -0.5f, 0.5f), r2 = gb.uniform("r2", {1, 3 * H, H}, -0.5f, 0.5f);
  auto g2 = gb.op_n("GRU", {x2, w2, r2}, 2,
                    GraphBuilder::attrs({{"direction", A::s("reverse")}, {"hidden_size", A::i(H)}, {"layout", A::i(1)}, {"clip", A::f(0.8f)}}),
                    "rev");
  for (auto& o : {g1[1], g2[0], g2[1]}) gb.output(o);
  return gb.finish();
}

// RNN (Elman) cells: bidirectional with Relu forward and Tanh backward, sequence_lens and an
// initial state, feeding a layout-1 forward cell with Sigmoid and clip.
Model rnn_model() {
  GraphBuilder gb("rnn_ops", 14);
  const int64_t S = 6, B = 3, I = 5, H = 9;
  auto x = gb.input("x", DType::Float32, {S, B, I});
  auto lens = gb.input("lens", DType::Int32, {B});
  auto h0 = gb.input("h0", DType::Float32, {2, B, H});
  auto w = gb.uniform("w", {2, H, I}, -0.5f, 0.5f), r = gb.uniform("r", {2, H, H}, -0.5f, 0.5f);
  auto bias = gb.uniform("b", {2, 2 * H}, -0.3f, 0.3f);
  const Attribute acts = Attribute::make_strings({"Relu", "Tanh"});
  auto r1 = gb.op_n("RNN", {x, w, r, bias, lens, h0}, 2,
                    GraphBuilder::attrs({{"direction", A::s("bidirectional")}, {"hidden_size", A::i(H)}, {"activations", acts}}), "bi");
  auto t = gb.op("Transpose", {r1[0]}, GraphBuilder::attrs({{"perm", A::is({2, 0, 1, 3})}}));
  auto x2 = gb.op("Reshape", {t, gb.ints("shape", {B, S, 2 * H})});
  auto w2 = gb.uniform("w2", {1, H, 2 * H}, -0.5f, 0.5f), r2 = gb.uniform("r2", {1, H, H}, -0.5f, 0.5f);
  const Attribute sig = Attribute::make_strings({"Sigmoid"});
  auto r2o = gb.op_n("RNN", {x2, w2, r2}, 2,
                     GraphBuilder::attrs({{"hidden_size", A::i(H)}, {"layout", A::i(1)}, {"clip", A::f(0.8f)}, {"activations", sig}}), "fwd");
  for (auto& o : {r1[1], r2o[0], r2o[1]}) gb.output(o);
  return gb.finish();
}

// NonMaxSuppression whose selection may also feed Shape (a fallback block reading the trimmed rows).
Model nms_model(bool with_shape = true) {
  GraphBuilder gb("nms_ops", 13);
  auto boxes = gb.input("boxes", DType::Float32, {2, 30, 4});
  auto scores = gb.input("scores", DType::Float32, {2, 3, 30});
  auto sel = gb.op("NonMaxSuppression", {boxes, scores, gb.ints("max", {10}), gb.scalar("iou", 0.1f), gb.scalar("score", 0.3f)});
  gb.output(sel);
  if (with_shape) gb.output(gb.op("Shape", {sel}));
  return gb.finish();
}

TensorMap lstm_feeds(const Model& m) {
  TensorMap f = random_feeds(m.graph, 3);
  f["lens"] = Tensor::from_vector<int32_t>({3}, {6, 2, 4});
  return f;
}

TensorMap nms_feeds(const Model& m) {
  TensorMap f = random_feeds(m.graph, 4);
  // Corner boxes from the random values: overlapping clusters, so suppression matters.
  float* b = f["boxes"].data<float>();
  for (int64_t i = 0; i < 2 * 30; ++i) {
    float cy = std::round(b[i * 4]) * 0.5f, cx = std::round(b[i * 4 + 1]) * 0.5f;  // 9 clusters
    float h = 0.3f + 0.1f * b[i * 4 + 2], w = 0.3f + 0.1f * b[i * 4 + 3];
    b[i * 4] = cy - h / 2, b[i * 4 + 1] = cx - w / 2, b[i * 4 + 2] = cy + h / 2, b[i * 4 + 3] = cx + w / 2;
  }
  float* s = f["scores"].data<float>();
  for (int64_t i = 0; i < 2 * 3 * 30; ++i) s[i] = 0.5f + 0.5f * s[i];  // in [0, 1)
  return f;
}

}  // namespace

namespace {

// The model's two recurrent nodes (`op`) lower to generated kernel stages, nothing falls back, and
// the outputs match the reference with x, lens {6, 2, 4} and random states.
void check_recurrent(const Model& m, const std::string& op) {
  auto cm = CpuModel::build(m.graph, nullptr, test_compile_options("kernel_ops"));
  const KernelModule& km = cm->module();
  CHECK(km.fallback_blocks == 0);
  int stages = 0;
  for (auto& s : km.stages) stages += s.anchor_op == op;
  CHECK(stages == 2);
  TensorMap feeds = lstm_feeds(m);
  check_close(cm->run(feeds), run_reference(m.graph, feeds));
}

}  // namespace

TEST_CASE("codegen: LSTM lowers to a generated kernel and matches the reference", "[codegen][lstm]") { check_recurrent(lstm_model(), "LSTM"); }

TEST_CASE("codegen: GRU lowers to a generated kernel and matches the reference", "[codegen][gru]") { check_recurrent(gru_model(), "GRU"); }

TEST_CASE("codegen: RNN lowers to a generated kernel and matches the reference", "[codegen][rnn]") { check_recurrent(rnn_model(), "RNN"); }

TEST_CASE("codegen: NonMaxSuppression writes a capacity buffer and records its row count", "[codegen][nms]") {
  Model m = nms_model();
  CpuCompileOptions o;
  o.cache_dir = test_cache_dir("kernel_ops");
  auto cm = CpuModel::build(m.graph, nullptr, o);
  const KernelModule& km = cm->module();
  const KBuffer& sel = km.buffers[size_t(km.buffer_id(m.graph.outputs()[0]))];
  CHECK(!sel.dynamic);
  CHECK(sel.shape == Shape{2 * 3 * 10, 3});  // B * C * min(max, N)
  REQUIRE(sel.row_count >= 0);
  CHECK(km.buffers[size_t(sel.row_count)].dtype == DType::Int64);
  CHECK(km.fallback_ops == std::vector<std::string>{"Shape"});
  TensorMap feeds = nms_feeds(m);
  TensorMap want = run_reference(m.graph, feeds), got = cm->run(feeds);
  const int64_t rows = want.at(m.graph.outputs()[0]).dim(0);
  INFO("selected rows: " << rows);
  CHECK((rows > 0 && rows <= 2 * 3 * 9));  // at most one box per cluster survives
  check_close(got, want);
}

// LSTM and NonMaxSuppression run on Arm in tests/python/test_arm_qemu.py (lstm_tiny, ssd_tiny);
// each cross-compile here costs half a minute.
TEST_CASE("codegen: GRU and RNN as standalone aarch64 programs under qemu; a fallback stage is refused", "[codegen][arm]") {
  if (std::system("aarch64-linux-gnu-g++ --version > /dev/null 2>&1") != 0 || std::system("qemu-aarch64 --version > /dev/null 2>&1") != 0) {
    WARN("aarch64-linux-gnu-g++ or qemu-aarch64 missing: skipped");
    return;
  }
  CrossRunOptions o;
  o.cache_dir = test_cache_dir("kernel_ops");
  o.threads = 2;
  Model gm = gru_model();
  KernelModule gk = lower_module(gm.graph, singleton_plan(gm.graph));
  TensorMap gf = lstm_feeds(gm);
  check_close(cross_run(gk, gf, o), run_reference(gm.graph, gf));
  Model rm = rnn_model();
  KernelModule rk = lower_module(rm.graph, singleton_plan(rm.graph));
  TensorMap rf = lstm_feeds(rm);
  check_close(cross_run(rk, rf, o), run_reference(rm.graph, rf));
  // The program has no reference kernels: the Shape consumer is refused, naming it.
  Model nm = nms_model();
  KernelModule nk = lower_module(nm.graph, singleton_plan(nm.graph));
  TensorMap nf = nms_feeds(nm);
  try {
    cross_run(nk, nf, o);
    FAIL("a module with a fallback stage was cross-run");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("Shape") != std::string::npos);
  }
}
