#pragma once
// LSTM (ONNX semantics: gate order i, o, f, c; activations Sigmoid, Tanh, Tanh; optional clip,
// peepholes, input_forget, sequence_lens, initial states; layout 0 or 1; forward, reverse or
// bidirectional).
//
// The input projection is hoisted out of the time loop (recurrent.h): per chunk of steps one GEMM
//   P[(t, b), 0:4H) = x_t(b) . W^T + (Wb + Rb)
// and each step is one GEMM against R only, with P's row added in its epilogue:
//   gates[b, 0:4H) = h_{t-1}(b) . R^T + P[(t, b)]
// followed by the gate nonlinearities and the state update as one vectorised pass over [B, H].
#include <vector>

#include "gemm.h"
#include "math.h"
#include "recurrent.h"

namespace nnfuse::mk {

template <class Arch>
using LstmWeights = GateWeights<Arch, 4>;

struct LstmArgs : RecurrentDims {
  const float* x = nullptr;
  const float* bias = nullptr;        // [D, 8H] as ONNX's B (Wb then Rb), or null
  const float* peepholes = nullptr;   // [D, 3H] (P_i, P_o, P_f), or null
  const float* h0 = nullptr;          // initial states (state layout), or null for zeros
  const float* c0 = nullptr;
  float clip = 0.f;                   // > 0: gate pre-activations clamped to [-clip, clip]
  bool input_forget = false;          // f = 1 - i
  float* y = nullptr;                 // outputs, each may be null
  float* y_h = nullptr;
  float* y_c = nullptr;
};

template <class Arch, class ParFor = SerialFor>
void lstm(const LstmArgs& a, const LstmWeights<Arch>& w, const ParFor& par = {}) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  const int64_t S = a.S, B = a.B, H = a.H, N = 4 * H;
  const int D = a.directions;
  if (a.y && a.seq_lens) std::fill(a.y, a.y + S * D * B * H, 0.f);  // rows past a sequence's end
  std::vector<float> hin(static_cast<size_t>(B * H)), gates(static_cast<size_t>(B * N)), bias(static_cast<size_t>(N));
  std::vector<float> h(static_cast<size_t>(B * H)), c(static_cast<size_t>(B * H));
  for (int d = 0; d < D; ++d) {
    for (int64_t n = 0; n < N; ++n) bias[size_t(n)] = a.bias ? a.bias[d * 2 * N + n] + a.bias[d * 2 * N + N + n] : 0.f;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t o = a.state_off(d, b);
      for (int64_t j = 0; j < H; ++j) {
        h[size_t(b * H + j)] = a.h0 ? a.h0[o + j] : 0.f;
        c[size_t(b * H + j)] = a.c0 ? a.c0[o + j] : 0.f;
      }
    }
    const float* p_i = a.peepholes ? a.peepholes + d * 3 * H : nullptr;
    const float* p_o = p_i ? p_i + H : nullptr;
    const float* p_f = p_i ? p_i + 2 * H : nullptr;
    auto step = [&](auto t_of, const std::vector<int64_t>& rows, const float* pstep) {
      const int64_t M = int64_t(rows.size());
      // gates = h . R^T + P's rows of this step (epilogue).
      GemmArgs g = GemmArgs::matmul(M, N, H, active_state_rows(h, rows, B, H, hin), false, nullptr, false, gates.data());
      gemm_packed<Arch>(g, w.r[size_t(d)], AddRows{pstep, N}, par);
      for (int64_t r = 0; r < M; ++r) {
        const int64_t b = rows[size_t(r)];
        const float* gi = gates.data() + r * N;
        const float *go = gi + H, *gf = gi + 2 * H, *gc = gi + 3 * H;
        float* cs = c.data() + b * H;
        float* hs = h.data() + b * H;
        // One generic body for full vectors and the scalar tail.
        auto update = [&](auto tag, int64_t j) {
          using T = decltype(tag);
          const T cp = load_at<T>(cs, j);
          T pi = load_at<T>(gi, j), pf = load_at<T>(gf, j), po = load_at<T>(go, j);
          if (p_i) {
            pi = pi + load_at<T>(p_i, j) * cp;
            pf = pf + load_at<T>(p_f, j) * cp;
          }
          const T it = vsigmoid(clip_gate(pi, a.clip));
          const T ft = a.input_forget ? T(1.f) - it : vsigmoid(clip_gate(pf, a.clip));
          const T ct = vtanh(clip_gate(load_at<T>(gc, j), a.clip));
          const T cn = ft * cp + it * ct;
          if (p_o) po = po + load_at<T>(p_o, j) * cn;
          store_at(cs, j, cn);
          store_at(hs, j, T(vsigmoid(clip_gate(po, a.clip)) * vtanh(cn)));
        };
        int64_t j = 0;
        for (; j + L <= H; j += L) update(V(0.f), j);
        for (; j < H; ++j) update(0.f, j);
        if (a.y) std::copy(hs, hs + H, a.y + a.y_off(t_of(r), d, b));
      }
    };
    recurrent_direction<Arch>(a, d, a.x, w.w[size_t(d)], N, bias.data(), step, par);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t o = a.state_off(d, b);
      if (a.y_h) std::copy(h.begin() + b * H, h.begin() + (b + 1) * H, a.y_h + o);
      if (a.y_c) std::copy(c.begin() + b * H, c.begin() + (b + 1) * H, a.y_c + o);
    }
  }
}

}  // namespace nnfuse::mk
