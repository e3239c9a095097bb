#pragma once
// The ONNX RNN op (an Elman cell): h' = f(x W^T + h R^T + Wb + Rb), f Tanh (the default), Relu or
// Sigmoid per direction; optional clip, sequence_lens, initial state; layout 0 or 1; forward,
// reverse or bidirectional. The input projection is hoisted out of the time loop (recurrent.h);
// each step is one GEMM against R with P's row and then f applied in its epilogue, straight into
// the state.
#include <vector>

#include "gemm.h"
#include "math.h"
#include "recurrent.h"

namespace nnfuse::mk {

template <class Arch>
using RnnWeights = GateWeights<Arch, 1>;

enum class RnnActivation { Tanh = 0, Relu = 1, Sigmoid = 2 };

struct RnnArgs : RecurrentDims {
  const float* x = nullptr;
  const float* bias = nullptr;  // [D, 2H] as ONNX's B (Wb then Rb), or null
  const float* h0 = nullptr;    // initial state (state layout), or null for zeros
  float clip = 0.f;             // > 0: pre-activations clamped to [-clip, clip]
  RnnActivation act[2] = {RnnActivation::Tanh, RnnActivation::Tanh};  // per direction
  float* y = nullptr;           // outputs, each may be null
  float* y_h = nullptr;
};

template <class Arch, class ParFor = SerialFor>
void rnn(const RnnArgs& a, const RnnWeights<Arch>& w, const ParFor& par = {}) {
  const int64_t S = a.S, B = a.B, H = a.H;
  const int D = a.directions;
  if (a.y && a.seq_lens) std::fill(a.y, a.y + S * D * B * H, 0.f);  // rows past a sequence's end
  std::vector<float> hin(static_cast<size_t>(B * H)), hn(static_cast<size_t>(B * H)), bias(static_cast<size_t>(H)), h(static_cast<size_t>(B * H));
  for (int d = 0; d < D; ++d) {
    for (int64_t n = 0; n < H; ++n) bias[size_t(n)] = a.bias ? a.bias[d * 2 * H + n] + a.bias[d * 2 * H + H + n] : 0.f;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t o = a.state_off(d, b);
      for (int64_t j = 0; j < H; ++j) h[size_t(b * H + j)] = a.h0 ? a.h0[o + j] : 0.f;
    }
    const RnnActivation act = a.act[d];
    const float clip = a.clip;
    auto step = [&](auto t_of, const std::vector<int64_t>& rows, const float* pstep) {
      const int64_t M = int64_t(rows.size());
      // h' = f(h . R^T + P's row): the whole cell in the GEMM's epilogue.
      const AddRows add{pstep, H};
      auto cell = [add, act, clip](auto v, int64_t row, int64_t col) {
        using T = decltype(v);
        const T p = clip_gate(T(add(v, row, col)), clip);
        if (act == RnnActivation::Relu) {
          if constexpr (std::is_same_v<T, float>) return std::max(p, 0.f);
          else return xsimd::max(p, T(0.f));
        }
        if (act == RnnActivation::Sigmoid) return T(vsigmoid(p));
        return T(vtanh(p));
      };
      GemmArgs g = GemmArgs::matmul(M, H, H, active_state_rows(h, rows, B, H, hin), false, nullptr, false, hn.data());
      gemm_packed<Arch>(g, w.r[size_t(d)], cell, par);
      for (int64_t r = 0; r < M; ++r) {
        const int64_t b = rows[size_t(r)];
        std::copy(hn.begin() + r * H, hn.begin() + (r + 1) * H, h.begin() + b * H);
        if (a.y) std::copy(hn.begin() + r * H, hn.begin() + (r + 1) * H, a.y + a.y_off(t_of(r), d, b));
      }
    };
    recurrent_direction<Arch>(a, d, a.x, w.w[size_t(d)], H, bias.data(), step, par);
    for (int64_t b = 0; b < B; ++b)
      if (a.y_h) std::copy(h.begin() + b * H, h.begin() + (b + 1) * H, a.y_h + a.state_off(d, b));
  }
}

}  // namespace nnfuse::mk
