// LSTM and NonMaxSuppression microkernels (lstm.h, nms.h) against the reference interpreter's
// one-node graphs: odd sizes, every direction and layout, initial states, sequence_lens,
// peepholes, clip, input_forget; NMS with and without a score threshold, center boxes, limits.
#include "test_microkernels_util.h"

#include "graph/builder.h"
#include "kernels/microkernels/lstm.h"
#include "kernels/microkernels/nms.h"

using namespace mktest;

namespace {

struct LstmCase {
  int64_t S, B, I, H;
  std::string direction;
  int layout;
  bool bias, init, seq_lens, peepholes, input_forget;
  float clip;
};

void check_lstm(const LstmCase& c, uint64_t seed) {
  INFO("LSTM S" << c.S << " B" << c.B << " I" << c.I << " H" << c.H << " " << c.direction << " layout " << c.layout << " bias " << c.bias
                << " init " << c.init << " seq_lens " << c.seq_lens << " peep " << c.peepholes << " input_forget " << c.input_forget
                << " clip " << c.clip);
  const int64_t D = c.direction == "bidirectional" ? 2 : 1, S = c.S, B = c.B, I = c.I, H = c.H;
  const Shape xs = c.layout == 0 ? Shape{S, B, I} : Shape{B, S, I};
  const Shape state = c.layout == 0 ? Shape{D, B, H} : Shape{B, D, H};
  Tensor X = random_tensor(xs, seed), W = random_tensor({D, 4 * H, I}, seed + 1, -0.6f, 0.6f);
  Tensor R = random_tensor({D, 4 * H, H}, seed + 2, -0.6f, 0.6f), Bias = random_tensor({D, 8 * H}, seed + 3);
  Tensor H0 = random_tensor(state, seed + 4), C0 = random_tensor(state, seed + 5), P = random_tensor({D, 3 * H}, seed + 6);
  std::vector<int32_t> lens;
  for (int64_t b = 0; b < B; ++b) lens.push_back(int32_t((b * 7 + 3) % (S + 1)));  // 0..S, one row may be empty
  Tensor Lens = Tensor::from_vector<int32_t>({B}, lens);

  GraphBuilder gb("lstm_oracle", 14);
  nnfuse::TensorMap feeds;
  auto in = [&](const std::string& name, const Tensor& t, bool use) -> std::string {
    if (!use) return "";
    std::vector<nnfuse::Dim> dims(t.shape().begin(), t.shape().end());
    feeds[name] = t;
    return gb.input(name, t.dtype(), dims);
  };
  std::vector<std::string> ins = {in("x", X, true), in("w", W, true), in("r", R, true), in("b", Bias, c.bias),
                                  in("lens", Lens, c.seq_lens), in("h0", H0, c.init), in("c0", C0, c.init), in("p", P, c.peepholes)};
  while (!ins.empty() && ins.back().empty()) ins.pop_back();
  auto attrs = GraphBuilder::attrs({{"direction", A::s(c.direction)}, {"hidden_size", A::i(H)}, {"layout", A::i(c.layout)},
                                    {"input_forget", A::i(c.input_forget)}});
  if (c.clip > 0) attrs.set("clip", A::f(c.clip));
  auto outs = gb.op_n("LSTM", ins, 3, attrs, "lstm");
  for (auto& o : outs) gb.output(o);
  nnfuse::Model m = gb.finish();
  nnfuse::TensorMap want = nnfuse::run_reference(m.graph, feeds);

  mk::LstmWeights<Arch> w;
  w.pack(D, I, H, W.data<float>(), R.data<float>());
  mk::LstmArgs a;
  a.S = S, a.B = B, a.I = I, a.H = H, a.directions = int(D), a.reverse = c.direction == "reverse", a.layout = c.layout;
  a.x = X.data<float>();
  a.bias = c.bias ? Bias.data<float>() : nullptr;
  a.seq_lens = c.seq_lens ? Lens.data<int32_t>() : nullptr;
  a.h0 = c.init ? H0.data<float>() : nullptr;
  a.c0 = c.init ? C0.data<float>() : nullptr;
  a.peepholes = c.peepholes ? P.data<float>() : nullptr;
  a.clip = c.clip;
  a.input_forget = c.input_forget;
  const size_t ny = size_t(S * D * B * H), ns = size_t(D * B * H);
  auto run = [&](auto par) {
    std::vector<float> y(ny, -7.f), yh(ns, -7.f), yc(ns, -7.f);
    a.y = y.data(), a.y_h = yh.data(), a.y_c = yc.data();
    mk::lstm<Arch>(a, w, par);
    return std::array<std::vector<float>, 3>{y, yh, yc};
  };
  auto serial = run(mk::SerialFor{});
  auto threaded = run(TwoThreadFor{});
  for (int k = 0; k < 3; ++k) {
    INFO("output " << k);
    require_identical(serial[size_t(k)], threaded[size_t(k)]);
    require_close(serial[size_t(k)].data(), want.at(outs[size_t(k)]));
  }
}

}  // namespace

TEST_CASE("microkernels: LSTM matches the reference", "[microkernels][lstm]") {
  // S, B, I, H, direction, layout, bias, init, seq_lens, peepholes, input_forget, clip
  const LstmCase cases[] = {
      {5, 3, 7, 9, "forward", 0, true, false, false, false, false, 0.f},
      {4, 2, 1, 17, "reverse", 0, true, true, false, false, false, 0.f},
      {6, 3, 5, 11, "bidirectional", 0, true, true, true, false, false, 0.f},
      {3, 4, 13, 8, "bidirectional", 1, false, true, false, true, false, 0.f},
      {7, 1, 33, 19, "forward", 1, true, false, true, true, true, 0.f},
      {5, 2, 6, 5, "reverse", 1, true, true, true, false, false, 0.5f},
      {1, 1, 1, 1, "forward", 0, false, false, false, false, false, 0.f},
  };
  uint64_t seed = 100;
  for (const auto& c : cases) check_lstm(c, seed += 10);
}

namespace {

// levels > 0: scores rounded to that many values (long runs of ties); nans: every 7th score NaN.
int64_t check_nms(int64_t B, int64_t N, int64_t C, int64_t max_per_class, float iou, std::optional<float> score_th, bool center, uint64_t seed,
                  int levels = 0, bool nans = false) {
  INFO("NMS B" << B << " N" << N << " C" << C << " max " << max_per_class << " iou " << iou << " score_th "
               << (score_th ? *score_th : -1.f) << " center " << center);
  // Boxes clustered so that suppression happens: centres on a coarse grid, jittered sizes.
  Tensor boxes(DType::Float32, {B, N, 4});
  Tensor jitter = random_tensor({B, N, 4}, seed, 0.f, 1.f);
  for (int64_t i = 0; i < B * N; ++i) {
    const float* j = jitter.data<float>() + i * 4;
    float cy = float(int(j[0] * 3)) * 0.3f + j[2] * 0.05f, cx = float(int(j[1] * 3)) * 0.3f + j[3] * 0.05f;
    float h = 0.2f + j[2] * 0.1f, w = 0.2f + j[3] * 0.1f;
    float* p = boxes.data<float>() + i * 4;
    if (center) p[0] = cy, p[1] = cx, p[2] = h, p[3] = w;
    else if (i % 2) p[0] = cy + h / 2, p[1] = cx + w / 2, p[2] = cy - h / 2, p[3] = cx - w / 2;  // flipped corners
    else p[0] = cy - h / 2, p[1] = cx - w / 2, p[2] = cy + h / 2, p[3] = cx + w / 2;
  }
  Tensor scores = random_tensor({B, C, N}, seed + 1, 0.f, 1.f);
  scores.data<float>()[1] = scores.data<float>()[2];  // a tie: stable order
  for (int64_t i = 0; i < B * C * N; ++i) {
    float& v = scores.data<float>()[i];
    if (levels > 0) v = std::floor(v * float(levels)) / float(levels);
    if (nans && i % 7 == 3) v = std::nanf("");
  }
  GraphBuilder gb("nms_oracle", 11);
  std::vector<std::string> ins = {gb.input("boxes", DType::Float32, {B, N, 4}), gb.input("scores", DType::Float32, {B, C, N}),
                                  gb.ints("max", {max_per_class}), gb.constant("iou", Tensor::from_vector<float>({1}, {iou}))};
  if (score_th) ins.push_back(gb.constant("score_th", Tensor::from_vector<float>({1}, {*score_th})));
  std::string out = gb.op("NonMaxSuppression", ins, GraphBuilder::attrs({{"center_point_box", A::i(center)}}));
  gb.output(out);
  nnfuse::Model m = gb.finish();
  Tensor want = nnfuse::run_reference(m.graph, {{"boxes", boxes}, {"scores", scores}}).at(out);

  mk::NmsArgs a;
  a.B = B, a.N = N, a.C = C, a.max_per_class = max_per_class, a.iou_threshold = iou, a.center_point_box = center;
  a.has_score_threshold = bool(score_th);
  a.score_threshold = score_th.value_or(0.f);
  a.boxes = boxes.data<float>(), a.scores = scores.data<float>();
  a.capacity = B * C * std::min(max_per_class, N);
  std::vector<int64_t> sel(size_t(a.capacity * 3) + 1, -1);
  a.selected = sel.data();
  const int64_t count = mk::nms(a);
  REQUIRE(want.dim(0) == count);
  REQUIRE(sel[size_t(a.capacity * 3)] == -1);  // nothing written past the capacity
  for (int64_t i = 0; i < count * 3; ++i) {
    INFO("row " << i / 3);
    REQUIRE(sel[size_t(i)] == want.data<int64_t>()[i]);
  }
  return count;
}

}  // namespace

TEST_CASE("microkernels: NonMaxSuppression matches the reference", "[microkernels][nms]") {
  // Suppression and the per-class limit both cut the selection.
  const int64_t limited = check_nms(1, 37, 3, 5, 0.5f, std::nullopt, false, 1);
  CHECK((limited > 0 && limited <= 15));
  const int64_t suppressed = check_nms(2, 29, 4, 100, 0.3f, 0.4f, false, 2);  // max above N: bounded by N
  CHECK((suppressed > 0 && suppressed < 2 * 4 * 29 / 2));
  check_nms(3, 17, 1, 2, 0.0f, 0.2f, true, 3);
  CHECK(check_nms(1, 9, 2, 0, 0.5f, std::nullopt, false, 4) == 0);  // no boxes requested
  CHECK(check_nms(2, 13, 2, 4, 0.7f, 1.5f, false, 5) == 0);          // threshold above every score: empty
  // Many candidates and few kept (SSD's shape), with runs of equal scores that must come in box
  // order.
  CHECK(check_nms(1, 1917, 3, 100, 0.5f, 0.05f, false, 6, 8) > 0);
  CHECK(check_nms(2, 300, 2, 7, 0.45f, std::nullopt, true, 7, 3) > 0);
  // NaN scores: without a threshold they are candidates, and the kernel orders them as the
  // reference does.
  check_nms(1, 64, 2, 10, 0.5f, std::nullopt, false, 8, 0, true);
  check_nms(1, 64, 2, 10, 0.5f, 0.3f, false, 9, 4, true);
}
