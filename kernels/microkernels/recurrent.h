#pragma once
// What the recurrent kernels (lstm.h, gru.h) share: ONNX's tensor layouts and sequence lengths,
// and the time loop of one direction with the input projection hoisted out of it.
//
// Per direction, the input projection of a chunk of time steps is one GEMM over all their rows
// (M = steps x batch, reading W once per chunk):
//   P[(t, b), 0:N) = x_t(b) . W^T + bias
// and each step then works against R only (a matrix-vector product at batch 1, bound by reading
// R: concatenating [x_t | h] instead would stream W as well on every step, twice the bytes and,
// past the last-level cache, far slower: seq2seq with H = 1024 read 32 MB per step).
// With sequence_lens, batch row b runs len[b] steps (reverse: from t = len[b]-1 down), its Y rows
// at t >= len[b] are zero and the final states hold its state after its last step.
#include <algorithm>
#include <vector>

#include "gemm.h"

namespace nnfuse::mk {

struct RecurrentDims {
  int64_t S = 0, B = 0, I = 0, H = 0;
  int directions = 1;                 // 1 or 2 (bidirectional: direction 1 runs in reverse)
  bool reverse = false;               // one direction, run from the last step
  int layout = 0;                     // 0: X [S,B,I], Y [S,D,B,H], states [D,B,H]; 1: X [B,S,I], Y [B,S,D,H], states [B,D,H]
  const int32_t* seq_lens = nullptr;  // [B], or null (every row runs S steps)

  int64_t x_off(int64_t t, int64_t b) const { return (layout == 0 ? (t * B + b) : (b * S + t)) * I; }
  int64_t y_off(int64_t t, int64_t d, int64_t b) const { return (layout == 0 ? ((t * directions + d) * B + b) : ((b * S + t) * directions + d)) * H; }
  int64_t state_off(int64_t d, int64_t b) const { return (layout == 0 ? (d * B + b) : (b * directions + d)) * H; }
  bool runs_reversed(int d) const { return directions == 2 ? d == 1 : reverse; }
  // Steps each batch row runs.
  std::vector<int64_t> lengths() const {
    std::vector<int64_t> len(size_t(B), S);
    if (seq_lens)
      for (int64_t b = 0; b < B; ++b) len[size_t(b)] = std::max<int64_t>(0, std::min<int64_t>(S, seq_lens[b]));
    return len;
  }
};

// W^T and R^T per direction for a cell with G gates (LSTM 4, RNN 1), packed for gemm_packed.
template <class Arch, int64_t G>
struct GateWeights {
  std::vector<PackedB<Arch>> w, r;  // per direction: W^T (K = I, N = G*H) and R^T (K = H, N = G*H)
  // W [D, G*H, I], R [D, G*H, H], both row-major (as ONNX stores them).
  void pack(int64_t D, int64_t I, int64_t H, const float* W, const float* R) {
    const int64_t N = G * H;
    w = std::vector<PackedB<Arch>>(size_t(D));
    r = std::vector<PackedB<Arch>>(size_t(D));
    for (int64_t d = 0; d < D; ++d) {
      w[size_t(d)].pack(I, N, W + d * N * I, 1, I);  // B(k, n) = W[n*I + k]
      r[size_t(d)].pack(H, N, R + d * N * H, 1, H);
    }
  }
};

// Runs direction d's time loop: per chunk of steps, P = x W^T + bias (W packed, N columns) for the
// chunk's active rows, then step(t_of, rows, p) for each step, where rows lists the batch rows
// still running (ascending), t_of(r) is the time index row r reads and writes at this step, and p
// points at P's row for rows[0] (the rows of one step are consecutive in P).
template <class Arch, class ParFor, class Step>
void recurrent_direction(const RecurrentDims& a, int d, const float* x, const PackedB<Arch>& w, int64_t N, const float* bias, Step&& step,
                         const ParFor& par) {
  const int64_t S = a.S, B = a.B, I = a.I;
  const bool rev = a.runs_reversed(d);
  const std::vector<int64_t> len = a.lengths();
  // Steps whose input projections are computed together: P stays within ~8 MiB.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(S, (int64_t(8) << 20) / int64_t(sizeof(float)) / std::max<int64_t>(1, B * N)));
  std::vector<float> xin(static_cast<size_t>(chunk * B * I)), proj(static_cast<size_t>(chunk * B * N));
  std::vector<int64_t> rows;
  auto add_bias = [bias](auto v, int64_t, int64_t col) {
    using T = decltype(v);
    if constexpr (std::is_same_v<T, float>) return v + bias[col];
    else return v + T::load_unaligned(bias + col);
  };
  for (int64_t s0 = 0; s0 < S; s0 += chunk) {
    const int64_t s1 = std::min(S, s0 + chunk);
    int64_t np = 0;
    for (int64_t s = s0; s < s1; ++s)
      for (int64_t b = 0; b < B; ++b) {
        if (s >= len[size_t(b)]) continue;
        const int64_t t = rev ? len[size_t(b)] - 1 - s : s;
        std::copy(x + a.x_off(t, b), x + a.x_off(t, b) + I, xin.begin() + np++ * I);
      }
    if (np == 0) break;
    GemmArgs gp = GemmArgs::matmul(np, N, I, xin.data(), false, nullptr, false, proj.data());
    gemm_packed<Arch>(gp, w, add_bias, par);
    const float* pstep = proj.data();
    for (int64_t s = s0; s < s1; ++s) {
      rows.clear();
      for (int64_t b = 0; b < B; ++b)
        if (s < len[size_t(b)]) rows.push_back(b);
      if (rows.empty()) break;
      auto t_of = [&](int64_t r) { return rev ? len[size_t(rows[size_t(r)])] - 1 - s : s; };
      step(t_of, static_cast<const std::vector<int64_t>&>(rows), pstep);
      pstep += int64_t(rows.size()) * N;
    }
  }
}

// The GEMM operand of the running rows' states: `h` itself when every row runs, else those rows
// gathered into `buf` ([rows, H]).
inline const float* active_state_rows(const std::vector<float>& h, const std::vector<int64_t>& rows, int64_t B, int64_t H, std::vector<float>& buf) {
  const int64_t M = int64_t(rows.size());
  if (M == B) return h.data();
  for (int64_t r = 0; r < M; ++r) std::copy(h.begin() + rows[size_t(r)] * H, h.begin() + (rows[size_t(r)] + 1) * H, buf.begin() + r * H);
  return buf.data();
}

// Epilogue adding a row-major matrix (P's rows of one step, `ld` floats apart) to a GEMM result.
struct AddRows {
  const float* p;
  int64_t ld;
  template <class T>
  T operator()(T v, int64_t row, int64_t col) const {
    if constexpr (std::is_same_v<T, float>) return v + p[row * ld + col];
    else return v + T::load_unaligned(p + row * ld + col);
  }
};

// Clamps gate pre-activations to [-clip, clip] when clip > 0 (ONNX's `clip`).
template <class T>
inline T clip_gate(T v, float clip) {
  if (!(clip > 0.f)) return v;
  if constexpr (std::is_same_v<T, float>) return std::max(-clip, std::min(clip, v));
  else return xsimd::max(T(-clip), xsimd::min(T(clip), v));
}

// Loads a float or a vector at p + j.
template <class T>
inline T load_at(const float* p, int64_t j) {
  if constexpr (std::is_same_v<T, float>) return p[j];
  else return T::load_unaligned(p + j);
}
template <class T>
inline void store_at(float* p, int64_t j, T v) {
  if constexpr (std::is_same_v<T, float>) p[j] = v;
  else v.store_unaligned(p + j);
}

}  // namespace nnfuse::mk
