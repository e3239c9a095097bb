#pragma once
// LSTM (ONNX semantics: gate order i, o, f, c; activations Sigmoid, Tanh, Tanh; optional clip,
// peepholes, input_forget, sequence_lens, initial states; layout 0 or 1; forward, reverse or
// bidirectional).
//
// Per direction, the input projection of a chunk of time steps is one GEMM over all their rows
// (M = steps x batch, reading W once per chunk):
//   P[(t, b), 0:4H) = x_t(b) . W^T + (Wb + Rb)
// and each step is one GEMM against R only, with P's row added in its epilogue:
//   gates[b, 0:4H) = h_{t-1}(b) . R^T + P[(t, b)]
// followed by the gate nonlinearities and the state update as one vectorised pass over [B, H].
// At batch 1 the per-step GEMM is a matrix-vector product bound by reading R (the GEMM's 1-row
// kernel, gemm.h); concatenating [x_t | h] instead would stream W as well on every step, twice
// the bytes and, past the last-level cache, far slower (seq2seq with H = 1024: 32 MB per step).
// With sequence_lens, batch row b runs len[b] steps (reverse: from t = len[b]-1 down), its Y rows
// at t >= len[b] are zero and Y_h/Y_c hold its state after its last step.
#include <vector>

#include "gemm.h"
#include "math.h"

namespace nnfuse::mk {

// W^T and R^T per direction, packed for gemm_packed.
template <class Arch>
struct LstmWeights {
  std::vector<PackedB<Arch>> w, r;  // per direction: W^T (K = I, N = 4H) and R^T (K = H, N = 4H)
  // W [D, 4H, I], R [D, 4H, H], both row-major (as ONNX stores them).
  void pack(int64_t D, int64_t I, int64_t H, const float* W, const float* R) {
    const int64_t N = 4 * H;
    w = std::vector<PackedB<Arch>>(size_t(D));
    r = std::vector<PackedB<Arch>>(size_t(D));
    for (int64_t d = 0; d < D; ++d) {
      w[size_t(d)].pack(I, N, W + d * N * I, 1, I);  // B(k, n) = W[n*I + k]
      r[size_t(d)].pack(H, N, R + d * N * H, 1, H);
    }
  }
};

struct LstmArgs {
  int64_t S = 0, B = 0, I = 0, H = 0;
  int directions = 1;        // 1 or 2 (bidirectional: direction 1 runs in reverse)
  bool reverse = false;      // one direction, run from the last step
  int layout = 0;            // 0: X [S,B,I], Y [S,D,B,H], states [D,B,H]; 1: X [B,S,I], Y [B,S,D,H], states [B,D,H]
  const float* x = nullptr;
  const float* bias = nullptr;        // [D, 8H] as ONNX's B (Wb then Rb), or null
  const float* peepholes = nullptr;   // [D, 3H] (P_i, P_o, P_f), or null
  const int32_t* seq_lens = nullptr;  // [B], or null (every row runs S steps)
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
  const int64_t S = a.S, B = a.B, I = a.I, H = a.H, N = 4 * H;
  const int D = a.directions;
  // Offsets of x_t(b), Y(t, d, b) and state(d, b) in their layouts.
  auto x_at = [&](int64_t t, int64_t b) { return a.x + (a.layout == 0 ? (t * B + b) : (b * S + t)) * I; };
  auto y_at = [&](int64_t t, int64_t d, int64_t b) {
    return a.y + (a.layout == 0 ? ((t * D + d) * B + b) : ((b * S + t) * D + d)) * H;
  };
  auto state_off = [&](int64_t d, int64_t b) { return (a.layout == 0 ? (d * B + b) : (b * D + d)) * H; };
  if (a.y && a.seq_lens) std::fill(a.y, a.y + S * D * B * H, 0.f);  // rows past a sequence's end
  std::vector<int64_t> len(size_t(B), S);
  if (a.seq_lens)
    for (int64_t b = 0; b < B; ++b) len[size_t(b)] = std::max<int64_t>(0, std::min<int64_t>(S, a.seq_lens[b]));
  // Steps whose input projections are computed together: P stays within ~8 MiB.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(S, (int64_t(8) << 20) / int64_t(sizeof(float)) / std::max<int64_t>(1, B * N)));
  std::vector<float> xin(static_cast<size_t>(chunk * B * I)), proj(static_cast<size_t>(chunk * B * N));
  std::vector<float> hin(static_cast<size_t>(B * H)), gates(static_cast<size_t>(B * N)), bias(static_cast<size_t>(N));
  std::vector<float> h(static_cast<size_t>(B * H)), c(static_cast<size_t>(B * H));
  std::vector<int64_t> rows;  // batch rows active at this step
  for (int d = 0; d < D; ++d) {
    const bool rev = D == 2 ? d == 1 : a.reverse;
    for (int64_t n = 0; n < N; ++n) bias[size_t(n)] = a.bias ? a.bias[d * 2 * N + n] + a.bias[d * 2 * N + N + n] : 0.f;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t o = state_off(d, b);
      for (int64_t j = 0; j < H; ++j) {
        h[size_t(b * H + j)] = a.h0 ? a.h0[o + j] : 0.f;
        c[size_t(b * H + j)] = a.c0 ? a.c0[o + j] : 0.f;
      }
    }
    const float* p_i = a.peepholes ? a.peepholes + d * 3 * H : nullptr;
    const float* p_o = p_i ? p_i + H : nullptr;
    const float* p_f = p_i ? p_i + 2 * H : nullptr;
    const float* bp = bias.data();
    // P = ep(x . W^T): the epilogue adds the bias along the 4H columns.
    auto add_bias = [bp](auto v, int64_t, int64_t col) {
      using T = decltype(v);
      if constexpr (std::is_same_v<T, float>) return v + bp[col];
      else return v + T::load_unaligned(bp + col);
    };
    // gates = ep(h . R^T): the epilogue adds the row's input projection. P holds a chunk's rows
    // step by step, each step's active batch rows in ascending order, as `rows` lists them; so
    // GEMM row r of a step reads P row (first row of the step) + r.
    const float* pstep = nullptr;
    auto add_proj = [&pstep, N](auto v, int64_t row, int64_t col) {
      using T = decltype(v);
      if constexpr (std::is_same_v<T, float>) return v + pstep[row * N + col];
      else return v + T::load_unaligned(pstep + row * N + col);
    };
    for (int64_t s0 = 0; s0 < S; s0 += chunk) {
      const int64_t s1 = std::min(S, s0 + chunk);
      int64_t np = 0;
      for (int64_t s = s0; s < s1; ++s)
        for (int64_t b = 0; b < B; ++b) {
          if (s >= len[size_t(b)]) continue;
          const int64_t t = rev ? len[size_t(b)] - 1 - s : s;
          std::copy(x_at(t, b), x_at(t, b) + I, xin.begin() + np++ * I);
        }
      if (np == 0) break;
      GemmArgs gp = GemmArgs::matmul(np, N, I, xin.data(), false, nullptr, false, proj.data());
      gemm_packed<Arch>(gp, w.w[size_t(d)], add_bias, par);
      pstep = proj.data();
      for (int64_t s = s0; s < s1; ++s) {
        rows.clear();
        for (int64_t b = 0; b < B; ++b)
          if (s < len[size_t(b)]) rows.push_back(b);
        const int64_t M = int64_t(rows.size());
        if (M == 0) break;
        const float* hp = h.data();  // all rows active: h is the GEMM's A as it is
        if (M < B) {
          for (int64_t r = 0; r < M; ++r) std::copy(h.begin() + rows[size_t(r)] * H, h.begin() + (rows[size_t(r)] + 1) * H, hin.begin() + r * H);
          hp = hin.data();
        }
        GemmArgs g = GemmArgs::matmul(M, N, H, hp, false, nullptr, false, gates.data());
        gemm_packed<Arch>(g, w.r[size_t(d)], add_proj, par);
        pstep += M * N;
        for (int64_t r = 0; r < M; ++r) {
          const int64_t b = rows[size_t(r)], t = rev ? len[size_t(b)] - 1 - s : s;
          const float* gi = gates.data() + r * N;
          const float *go = gi + H, *gf = gi + 2 * H, *gc = gi + 3 * H;
          float* cs = c.data() + b * H;
          float* hs = h.data() + b * H;
          // One generic body for full vectors and the scalar tail.
          auto step = [&](auto tag, int64_t j) {
            using T = decltype(tag);
            auto ld = [&](const float* p) -> T {
              if constexpr (std::is_same_v<T, float>) return p[j];
              else return T::load_unaligned(p + j);
            };
            auto clip = [&](T v) -> T {
              if (a.clip > 0.f) {
                if constexpr (std::is_same_v<T, float>) return std::max(-a.clip, std::min(a.clip, v));
                else return xsimd::max(T(-a.clip), xsimd::min(T(a.clip), v));
              }
              return v;
            };
            const T cp = ld(cs);
            T pi = ld(gi), pf = ld(gf), po = ld(go);
            if (p_i) {
              pi = pi + ld(p_i) * cp;
              pf = pf + ld(p_f) * cp;
            }
            const T it = vsigmoid(clip(pi));
            const T ft = a.input_forget ? T(1.f) - it : vsigmoid(clip(pf));
            const T ct = vtanh(clip(ld(gc)));
            const T cn = ft * cp + it * ct;
            if (p_o) po = po + ld(p_o) * cn;
            const T hn = vsigmoid(clip(po)) * vtanh(cn);
            if constexpr (std::is_same_v<T, float>) {
              cs[j] = cn;
              hs[j] = hn;
            } else {
              cn.store_unaligned(cs + j);
              hn.store_unaligned(hs + j);
            }
          };
          int64_t j = 0;
          for (; j + L <= H; j += L) step(V(0.f), j);
          for (; j < H; ++j) step(0.f, j);
          if (a.y) std::copy(hs, hs + H, y_at(t, d, b));
        }
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      const int64_t o = state_off(d, b);
      if (a.y_h) std::copy(h.begin() + b * H, h.begin() + (b + 1) * H, a.y_h + o);
      if (a.y_c) std::copy(c.begin() + b * H, c.begin() + (b + 1) * H, a.y_c + o);
    }
  }
}

}  // namespace nnfuse::mk
