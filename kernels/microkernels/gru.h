#pragma once
// GRU (ONNX semantics: gate order z, r, h; activations Sigmoid, Tanh; linear_before_reset 0 or 1;
// optional clip, sequence_lens, initial state; layout 0 or 1; forward, reverse or bidirectional):
//   z = σ(x W_z^T + h R_z^T + Wb_z + Rb_z)       r = σ(x W_r^T + h R_r^T + Wb_r + Rb_r)
//   linear_before_reset 0: h~ = tanh(x W_h^T + (r ⊙ h) R_h^T + Rb_h + Wb_h)
//   linear_before_reset 1: h~ = tanh(x W_h^T + r ⊙ (h R_h^T + Rb_h) + Wb_h)   (PyTorch's GRU)
//   h' = (1 - z) ⊙ h~ + z ⊙ h
// The input projection is hoisted out of the time loop (recurrent.h); each step runs two GEMMs
// against R: [z | r] = h R_zr^T + P_zr, then the candidate's h R_h^T (or (r ⊙ h) R_h^T, which
// needs r first), and one vectorised pass for the gates and the update.
#include <vector>

#include "gemm.h"
#include "math.h"
#include "recurrent.h"

namespace nnfuse::mk {

// W^T, R_zr^T and R_h^T per direction, packed for gemm_packed.
template <class Arch>
struct GruWeights {
  std::vector<PackedB<Arch>> w, rzr, rh;
  // W [D, 3H, I], R [D, 3H, H], both row-major (as ONNX stores them).
  void pack(int64_t D, int64_t I, int64_t H, const float* W, const float* R) {
    w = std::vector<PackedB<Arch>>(size_t(D));
    rzr = std::vector<PackedB<Arch>>(size_t(D));
    rh = std::vector<PackedB<Arch>>(size_t(D));
    for (int64_t d = 0; d < D; ++d) {
      w[size_t(d)].pack(I, 3 * H, W + d * 3 * H * I, 1, I);  // B(k, n) = W[n*I + k]
      rzr[size_t(d)].pack(H, 2 * H, R + d * 3 * H * H, 1, H);
      rh[size_t(d)].pack(H, H, R + d * 3 * H * H + 2 * H * H, 1, H);
    }
  }
};

struct GruArgs : RecurrentDims {
  const float* x = nullptr;
  const float* bias = nullptr;  // [D, 6H] as ONNX's B (Wb then Rb), or null
  const float* h0 = nullptr;    // initial state (state layout), or null for zeros
  float clip = 0.f;             // > 0: gate pre-activations clamped to [-clip, clip]
  bool linear_before_reset = false;
  float* y = nullptr;           // outputs, each may be null
  float* y_h = nullptr;
};

template <class Arch, class ParFor = SerialFor>
void gru(const GruArgs& a, const GruWeights<Arch>& w, const ParFor& par = {}) {
  using V = vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  const int64_t S = a.S, B = a.B, H = a.H, N = 3 * H;
  const int D = a.directions;
  const bool lbr = a.linear_before_reset;
  if (a.y && a.seq_lens) std::fill(a.y, a.y + S * D * B * H, 0.f);  // rows past a sequence's end
  std::vector<float> hin(static_cast<size_t>(B * H)), hr(static_cast<size_t>(B * H)), gzr(static_cast<size_t>(B * 2 * H)),
      gh(static_cast<size_t>(B * H)), bias(static_cast<size_t>(N)), rb_h(static_cast<size_t>(H)), h(static_cast<size_t>(B * H));
  for (int d = 0; d < D; ++d) {
    // P's bias: Wb + Rb for z and r; Wb_h for the candidate, plus Rb_h unless it sits inside r ⊙ (.).
    const float* wb = a.bias ? a.bias + d * 2 * N : nullptr;
    const float* rb = a.bias ? wb + N : nullptr;
    for (int64_t n = 0; n < N; ++n) bias[size_t(n)] = a.bias ? wb[n] + (n < 2 * H || !lbr ? rb[n] : 0.f) : 0.f;
    for (int64_t j = 0; j < H; ++j) rb_h[size_t(j)] = a.bias && lbr ? rb[2 * H + j] : 0.f;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t o = a.state_off(d, b);
      for (int64_t j = 0; j < H; ++j) h[size_t(b * H + j)] = a.h0 ? a.h0[o + j] : 0.f;
    }
    auto step = [&](auto t_of, const std::vector<int64_t>& rows, const float* pstep) {
      const int64_t M = int64_t(rows.size());
      const float* hp = active_state_rows(h, rows, B, H, hin);
      // [z | r] pre-activations: h . R_zr^T + P_zr.
      GemmArgs g = GemmArgs::matmul(M, 2 * H, H, hp, false, nullptr, false, gzr.data());
      gemm_packed<Arch>(g, w.rzr[size_t(d)], AddRows{pstep, N}, par);
      auto gate = [&](auto tag, const float* p, int64_t j) {
        using T = decltype(tag);
        return T(vsigmoid(clip_gate(load_at<T>(p, j), a.clip)));
      };
      if (lbr) {
        // h R_h^T + Rb_h, scaled by r in the update.
        const float* rbp = rb_h.data();
        auto add_rb = [rbp](auto v, int64_t, int64_t col) { return v + load_at<decltype(v)>(rbp, col); };
        GemmArgs gc = GemmArgs::matmul(M, H, H, hp, false, nullptr, false, gh.data());
        gemm_packed<Arch>(gc, w.rh[size_t(d)], add_rb, par);
      } else {
        // (r ⊙ h) R_h^T: r first.
        for (int64_t r = 0; r < M; ++r) {
          const float* rg = gzr.data() + r * 2 * H + H;
          const float* hs = hp + r * H;
          float* out = hr.data() + r * H;
          auto reset = [&](auto tag, int64_t j) {
            using T = decltype(tag);
            store_at(out, j, T(gate(tag, rg, j) * load_at<T>(hs, j)));
          };
          int64_t j = 0;
          for (; j + L <= H; j += L) reset(V(0.f), j);
          for (; j < H; ++j) reset(0.f, j);
        }
        GemmArgs gc = GemmArgs::matmul(M, H, H, hr.data(), false, nullptr, false, gh.data());
        gemm_packed<Arch>(gc, w.rh[size_t(d)], IdentityEpilogue{}, par);
      }
      for (int64_t r = 0; r < M; ++r) {
        const int64_t b = rows[size_t(r)];
        const float* zg = gzr.data() + r * 2 * H;
        const float* rg = zg + H;
        const float* px = pstep + r * N + 2 * H;  // x W_h^T + its bias
        const float* ghr = gh.data() + r * H;
        float* hs = h.data() + b * H;
        auto update = [&](auto tag, int64_t j) {
          using T = decltype(tag);
          const T z = gate(tag, zg, j);
          const T rec = lbr ? T(gate(tag, rg, j) * load_at<T>(ghr, j)) : load_at<T>(ghr, j);
          const T cand = vtanh(clip_gate(T(load_at<T>(px, j) + rec), a.clip));
          const T hp_ = load_at<T>(hs, j);
          store_at(hs, j, T((T(1.f) - z) * cand + z * hp_));
        };
        int64_t j = 0;
        for (; j + L <= H; j += L) update(V(0.f), j);
        for (; j < H; ++j) update(0.f, j);
        if (a.y) std::copy(hs, hs + H, a.y + a.y_off(t_of(r), d, b));
      }
    };
    recurrent_direction<Arch>(a, d, a.x, w.w[size_t(d)], N, bias.data(), step, par);
    for (int64_t b = 0; b < B; ++b)
      if (a.y_h) std::copy(h.begin() + b * H, h.begin() + (b + 1) * H, a.y_h + a.state_off(d, b));
  }
}

}  // namespace nnfuse::mk
