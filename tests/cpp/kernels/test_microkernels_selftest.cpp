// A self-contained check of every microkernel family against naive loops written here, built
// three ways: inside test_kernels (AVX2, Catch2), and with MK_SELFTEST_MAIN as standalone programs
// for AVX-512 and for aarch64 NEON (run under qemu-aarch64), so that each Arch's tile sizes and
// code paths run, not only compile. Needs only the standard library, xsimd and the microkernel
// headers, like generated code. (The interpreter-based tests in the other files are the oracle
// for op semantics; this one covers the other ISAs.)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/microkernels/microkernels.h"

namespace mkself {

namespace mk = nnfuse::mk;

inline std::vector<float> rnd(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct Two {
  int threads() const { return 2; }  // what the kernels split their work for (mk::par_threads)
  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    if (n <= 0) return;
    const int64_t mid = n / 2;
    std::thread t([&] { if (mid < n) fn(mid, n); });
    if (mid > 0) fn(int64_t(0), mid);
    t.join();
  }
};

// Runs serially but tells the kernels it has `n` workers (mk::par_threads), so that they split
// their work into as many tasks as for n threads: the results must not change.
struct SerialAs {
  int64_t n = 1;
  int64_t threads() const { return n; }
  template <class Fn>
  void operator()(int64_t count, Fn&& fn) const {
    if (count > 0) fn(int64_t(0), count);
  }
};

struct Checker {
  int failures = 0;
  void close(const char* what, const std::vector<float>& got, const std::vector<double>& want) {
    for (size_t i = 0; i < want.size(); ++i)
      if (!(std::fabs(double(got[i]) - want[i]) <= 1e-5 + 1e-4 * std::fabs(want[i]))) {
        std::printf("FAIL %s: element %zu got %.7g want %.7g\n", what, i, double(got[i]), want[i]);
        ++failures;
        return;
      }
  }
  // Algorithms that round differently from the naive sum (Winograd): within rel of the largest
  // |want| (a transform bug gives errors of the order of the values themselves).
  void close_scaled(const char* what, const std::vector<float>& got, const std::vector<double>& want, double rel) {
    double mag = 0;
    for (double v : want) mag = std::max(mag, std::fabs(v));
    for (size_t i = 0; i < want.size(); ++i)
      if (!(std::fabs(double(got[i]) - want[i]) <= rel * mag)) {
        std::printf("FAIL %s: element %zu got %.7g want %.7g (scale %.3g)\n", what, i, double(got[i]), want[i], mag);
        ++failures;
        return;
      }
  }
  void same(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
    if (a != b) {
      std::printf("FAIL %s: serial and 2-thread results differ\n", what);
      ++failures;
    }
  }
};

template <class Arch>
struct BiasRelu {  // ep: relu(v + bias[row % n])
  const float* bias;
  int64_t n;
  mk::vfloat<Arch> operator()(const mk::vfloat<Arch>& v, int64_t r, int64_t) const {
    return xsimd::max(v + mk::vfloat<Arch>(bias[r % n]), mk::vfloat<Arch>(0.f));
  }
  float operator()(float v, int64_t r, int64_t) const { return std::max(v + bias[r % n], 0.f); }
};

// gemm through the instantiation the generator emits for M rows (GemmClass{M, 1}), for the M of
// gemm_cases.
template <class Arch, class Ep>
bool gemm_in_class(int64_t M, const mk::GemmArgs& g, const Ep& ep) {
  switch (M) {
    case 1: return mk::gemm<Arch, mk::GemmClass{1, 1}>(g, ep);
    case 7: return mk::gemm<Arch, mk::GemmClass{7, 1}>(g, ep);
    case 17: return mk::gemm<Arch, mk::GemmClass{17, 1}>(g, ep);
    case 29: return mk::gemm<Arch, mk::GemmClass{29, 1}>(g, ep);
    default: return false;
  }
}

template <class Arch>
void gemm_cases(Checker& ck) {
  for (int64_t M : {1, 7, 17, 29})
    for (int64_t N : {1, 9, 33, 70})
      for (int64_t K : {1, 17, 300})
        for (int t = 0; t < 4; ++t) {
          const bool ta = t & 1, tb = t & 2;
          auto A = rnd(size_t(M * K), unsigned(M * 7 + K)), B = rnd(size_t(K * N), unsigned(N * 5 + K));
          auto bias = rnd(size_t(M), 3);
          std::vector<double> want(size_t(M * N));
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double s = 0;
              for (int64_t k = 0; k < K; ++k)
                s += double(ta ? A[size_t(k * M + m)] : A[size_t(m * K + k)]) * (tb ? B[size_t(n * K + k)] : B[size_t(k * N + n)]);
              want[size_t(m * N + n)] = std::max(s + bias[size_t(m)], 0.0);
            }
          std::vector<float> s(size_t(M * N)), p(size_t(M * N));
          auto g = mk::GemmArgs::matmul(M, N, K, A.data(), ta, B.data(), tb, s.data());
          mk::gemm<Arch>(g, BiasRelu<Arch>{bias.data(), M});
          g.C = p.data();
          mk::gemm<Arch>(g, BiasRelu<Arch>{bias.data(), M}, Two{});
          std::string what = "gemm M" + std::to_string(M) + " N" + std::to_string(N) + " K" + std::to_string(K) + " t" + std::to_string(t);
          ck.close(what.c_str(), s, want);
          ck.same(what.c_str(), s, p);
          // The instantiation for this M's shape class (the row tiles M leaves) computes the same.
          std::vector<float> c(size_t(M * N), -7.f);
          g.C = c.data();
          if (!gemm_in_class<Arch>(M, g, BiasRelu<Arch>{bias.data(), M})) std::printf("FAIL %s: refused by its class\n", what.c_str()), ++ck.failures;
          ck.same((what + " class").c_str(), s, c);
        }
  // Batches folded into rows (M x batch rows) and a class refusing other rows: a [3 x 7] batch of
  // 7-row GEMMs sharing B runs as one of 21 rows.
  for (int64_t batch : {1, 3}) {
    const int64_t M = 7, N = 33, K = 17;
    auto A = rnd(size_t(batch * M * K), 61), B = rnd(size_t(K * N), 62), bias = rnd(size_t(batch * M), 63);
    std::vector<float> s(size_t(batch * M * N)), c(size_t(batch * M * N), -7.f);
    auto g = mk::GemmArgs::matmul(M, N, K, A.data(), false, B.data(), false, s.data());
    g.batch = batch, g.a_bs = M * K, g.c_bs = M * N;
    mk::gemm<Arch>(g, BiasRelu<Arch>{bias.data(), batch * M});
    g.C = c.data();
    const bool ran = batch == 1 ? mk::gemm<Arch, mk::GemmClass{7, 1}>(g, BiasRelu<Arch>{bias.data(), M})
                                : mk::gemm<Arch, mk::GemmClass{7, 3}>(g, BiasRelu<Arch>{bias.data(), batch * M});
    const std::string what = "gemm class M7 batch " + std::to_string(batch);
    if (!ran) std::printf("FAIL %s: refused by its class\n", what.c_str()), ++ck.failures;
    ck.same(what.c_str(), s, c);
    std::vector<float> untouched(c.size(), -7.f);
    c.assign(c.size(), -7.f);
    if (mk::gemm<Arch, mk::GemmClass{17, 1}>(g, BiasRelu<Arch>{bias.data(), batch * M}) || c != untouched)
      std::printf("FAIL %s: a class of other rows ran\n", what.c_str()), ++ck.failures;
  }
}

// relu(conv(x, w) + bias) in double: NCHW, `g` groups, stride s, padding p on every side,
// dilation d.
// Pads per side: top, left, bottom, right.
inline std::vector<double> naive_conv_bias_relu_pads(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& bias,
                                                     int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t KH, int64_t KW, int64_t s,
                                                     int64_t pt, int64_t pl, int64_t pb, int64_t pr, int64_t d, int64_t g) {
  const int64_t OH = (H + pt + pb - (KH - 1) * d - 1) / s + 1, OW = (W + pl + pr - (KW - 1) * d - 1) / s + 1;
  const int64_t Cg = C / g, Kg = K / g;
  std::vector<double> want(size_t(N * K * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = 0;
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                int64_t ih = oh * s - pt + kh * d, iw = ow * s - pl + kw * d;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += double(x[size_t(((n * C + (k / Kg) * Cg + ci) * H + ih) * W + iw)]) * w[size_t(((k * Cg + ci) * KH + kh) * KW + kw)];
              }
          want[size_t(((n * K + k) * OH + oh) * OW + ow)] = std::max(acc + bias[size_t(k)], 0.0);
        }
  return want;
}

inline std::vector<double> naive_conv_bias_relu(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& bias,
                                                int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t KH, int64_t KW,
                                                int64_t s, int64_t p, int64_t d, int64_t g) {
  return naive_conv_bias_relu_pads(x, w, bias, N, C, H, W, K, KH, KW, s, p, p, p, p, d, g);
}

template <class Arch>
void conv_cases(Checker& ck) {
  struct C { int64_t N, C, H, W, K, KH, KW, s, p, d, g; };
  for (C c : {C{1, 3, 7, 9, 5, 3, 3, 1, 1, 1, 1}, C{2, 4, 11, 10, 6, 3, 3, 2, 1, 1, 2}, C{1, 8, 9, 9, 8, 3, 3, 1, 1, 1, 8},
              C{1, 6, 13, 12, 12, 5, 5, 2, 2, 2, 6}, C{1, 16, 5, 7, 33, 1, 1, 1, 0, 1, 1}, C{1, 3, 20, 17, 7, 7, 7, 2, 3, 1, 1}}) {
    const int64_t OH = (c.H + 2 * c.p - (c.KH - 1) * c.d - 1) / c.s + 1, OW = (c.W + 2 * c.p - (c.KW - 1) * c.d - 1) / c.s + 1;
    const int64_t Cg = c.C / c.g;
    auto x = rnd(size_t(c.N * c.C * c.H * c.W), 11), w = rnd(size_t(c.K * Cg * c.KH * c.KW), 12), bias = rnd(size_t(c.K), 13);
    const std::vector<double> want = naive_conv_bias_relu(x, w, bias, c.N, c.C, c.H, c.W, c.K, c.KH, c.KW, c.s, c.p, c.d, c.g);
    mk::Conv2dArgs a;
    a.N = c.N, a.C = c.C, a.H = c.H, a.W = c.W, a.K = c.K, a.OH = OH, a.OW = OW, a.KH = c.KH, a.KW = c.KW;
    a.stride_h = a.stride_w = c.s, a.pad_top = a.pad_left = c.p, a.dil_h = a.dil_w = c.d, a.group = c.g;
    a.set_contiguous();
    a.x = x.data(), a.w = w.data();
    for (int algo = 0; algo < 4; ++algo) {
      if (algo == 3 && c.g != c.C) continue;
      std::vector<float> s(want.size()), p(want.size());
      for (int par = 0; par < 2; ++par) {
        a.y = par ? p.data() : s.data();
        BiasRelu<Arch> ep{bias.data(), c.K};
        auto go = [&](auto pf) {
          if (algo == 0) mk::conv2d<Arch>(a, ep, pf);
          if (algo == 1) mk::conv2d_gemm<Arch>(a, ep, pf);
          if (algo == 2) mk::conv2d_direct<Arch>(a, ep, pf);
          if (algo == 3) mk::conv2d_depthwise<Arch>(a, ep, pf);
        };
        if (par) go(Two{}); else go(mk::SerialFor{});
      }
      std::string what = "conv C" + std::to_string(c.C) + " K" + std::to_string(c.K) + " k" + std::to_string(c.KH) + " g" +
                         std::to_string(c.g) + " algo" + std::to_string(algo);
      ck.close(what.c_str(), s, want);
      ck.same(what.c_str(), s, p);
    }
  }
}

template <class Arch>
void pool_reduce_cases(Checker& ck) {
  // Max and average pooling 3x3 / 2, pad 1, ceil-mode-like extra output row.
  const int64_t N = 1, C = 3, H = 11, W = 13, OH = 6, OW = 7;
  auto x = rnd(size_t(N * C * H * W), 21);
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<double> want(size_t(C * OH * OW));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double m = -INFINITY, s = 0;
          int cnt = 0;
          for (int64_t kh = 0; kh < 3; ++kh)
            for (int64_t kw = 0; kw < 3; ++kw) {
              int64_t ih = oh * 2 - 1 + kh, iw = ow * 2 - 1 + kw;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              double v = x[size_t((c * H + ih) * W + iw)];
              m = std::max(m, v), s += v, ++cnt;
            }
          want[size_t((c * OH + oh) * OW + ow)] = kind == 0 ? m : s / cnt;
        }
    mk::Pool2dArgs a;
    a.N = N, a.C = C, a.H = H, a.W = W, a.OH = OH, a.OW = OW, a.KH = a.KW = 3, a.stride_h = a.stride_w = 2;
    a.pad_top = a.pad_left = a.pad_bottom = a.pad_right = 1;
    a.set_contiguous();
    a.x = x.data();
    std::vector<float> s(want.size()), p(want.size());
    a.y = s.data();
    if (kind == 0) mk::pool2d<Arch, mk::PoolKind::Max>(a); else mk::pool2d<Arch, mk::PoolKind::Avg>(a);
    a.y = p.data();
    if (kind == 0) mk::pool2d<Arch, mk::PoolKind::Max>(a, mk::IdentityEpilogue{}, Two{});
    else mk::pool2d<Arch, mk::PoolKind::Avg>(a, mk::IdentityEpilogue{}, Two{});
    ck.close(kind == 0 ? "maxpool" : "avgpool", s, want);
    ck.same("pool", s, p);
  }
  // Reductions over the last axis and a middle axis; softmax; layernorm.
  const int64_t O = 5, R = 37, I = 19;
  auto r = rnd(size_t(O * R * I), 22);
  {
    std::vector<double> want(size_t(O * I));
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < I; ++i) {
        double s = 0;
        for (int64_t j = 0; j < R; ++j) s += r[size_t((o * R + j) * I + i)];
        want[size_t(o * I + i)] = s / R;
      }
    std::vector<float> got(want.size());
    mk::reduce<Arch, mk::ReduceKind::Mean>(mk::ReduceArgs::contiguous(O, R, I, r.data(), got.data()));
    ck.close("reduce mean middle axis", got, want);
    std::vector<double> want2(size_t(O * R));
    for (int64_t o = 0; o < O * R; ++o) {
      double m = -INFINITY;
      for (int64_t i = 0; i < I; ++i) m = std::max(m, double(r[size_t(o * I + i)]));
      want2[size_t(o)] = m;
    }
    std::vector<float> got2(want2.size());
    mk::reduce<Arch, mk::ReduceKind::Max>(mk::ReduceArgs::contiguous(O * R, I, 1, r.data(), got2.data()));
    ck.close("reduce max last axis", got2, want2);
  }
  {
    const int64_t rows = O * R, len = I;
    std::vector<double> sm(size_t(rows * len)), ln(size_t(rows * len));
    for (int64_t i = 0; i < rows; ++i) {
      const float* xr = r.data() + i * len;
      double mx = -INFINITY, sum = 0, mean = 0, var = 0;
      for (int64_t c = 0; c < len; ++c) mx = std::max(mx, double(xr[c])), mean += xr[c];
      for (int64_t c = 0; c < len; ++c) sum += std::exp(xr[c] - mx);
      mean /= len;
      for (int64_t c = 0; c < len; ++c) var += (xr[c] - mean) * (xr[c] - mean);
      var /= len;
      for (int64_t c = 0; c < len; ++c) {
        sm[size_t(i * len + c)] = std::exp(xr[c] - mx) / sum;
        ln[size_t(i * len + c)] = (xr[c] - mean) / std::sqrt(var + 1e-5);
      }
    }
    std::vector<float> got(sm.size());
    mk::softmax<Arch>(rows, len, r.data(), len, got.data(), len);
    ck.close("softmax", got, sm);
    mk::layernorm<Arch>(rows, len, r.data(), len, nullptr, nullptr, 1e-5f, got.data(), len);
    ck.close("layernorm", got, ln);
  }
  {
    std::vector<float> in = rnd(1000, 23), out(1000);
    for (auto& v : in) v *= 10.f;
    std::vector<double> want(1000);
    for (size_t i = 0; i < in.size(); ++i) want[i] = std::tanh(double(in[i])) + std::exp(double(in[i]) * 0.5) + std::erf(double(in[i]));
    mk::unary_map<Arch>(1000, in.data(), out.data(), [](auto v) { return mk::vtanh(v) + mk::vexp(v * 0.5f) + mk::verf(v); });
    ck.close("math", out, want);
  }
}

// NCHW<L>c conv and pooling (conv_nchwc.h) against naive NCHW loops. Padding lanes of blocked
// inputs hold NaN, so a kernel that reads them as data fails; channel counts are not multiples of
// L; input channels past the per-pass chunk exercise the partial sums kept in y.
template <class Arch>
struct BlockedBiasRelu {  // ep: relu(v + bias[channel]) with bias padded to Kb*L
  const float* bias;
  int64_t Kb;
  mk::vfloat<Arch> operator()(const mk::vfloat<Arch>& v, int64_t r, int64_t) const {
    return xsimd::max(v + mk::vfloat<Arch>::load_unaligned(bias + (r % Kb) * int64_t(mk::vfloat<Arch>::size)), mk::vfloat<Arch>(0.f));
  }
  float operator()(float v, int64_t r, int64_t c) const {
    const int64_t L = int64_t(mk::vfloat<Arch>::size);
    return std::max(v + bias[(r % Kb) * L + c % L], 0.f);
  }
};

inline std::vector<float> to_blocked(const std::vector<float>& x, int64_t N, int64_t C, int64_t HW, int64_t L) {
  std::vector<float> y(size_t(N * mk::nchwc_blocks(C, L) * HW * L));
  mk::nchw_to_nchwc(x.data(), N, C, HW, L, y.data());
  for (int64_t i = 0; i < int64_t(y.size()); ++i)
    if ((i / (HW * L)) % mk::nchwc_blocks(C, L) * L + i % L >= C) y[size_t(i)] = std::nanf("");
  return y;
}

// Winograd F(MxM, 3x3) against naive loops (M = 4 and 2).
template <class Arch, int M>
void winograd_cases(Checker& ck) {
  constexpr int64_t L = int64_t(mk::vfloat<Arch>::size);
  // Winograd F(MxM,3x3) (conv_winograd.h): output sizes that are not multiples of M, pads 0 to 2
  // (tiles reading past every border), channel counts that are not multiples of L, plain and
  // blocked input, batch 2, and more input channels than one 1x1 pass holds (partial sums). The
  // kernel takes the top and left pads; the bottom and right ones follow from OH and OW, so
  // unequal pads (SAME_UPPER/LOWER, asymmetric Pad folded into the conv) and pads of 3 (whole
  // tiles in the padding) are cases too.
  struct WC { int64_t N, C, H, W, K, pt, pl, pb, pr; bool xblk; };
  for (WC c : {WC{1, 3, 7, 9, 5, 1, 1, 1, 1, false}, WC{2, 17, 11, 10, 20, 1, 1, 1, 1, true}, WC{1, 16, 8, 8, 16, 1, 1, 1, 1, true},
               WC{1, 33, 13, 6, 40, 0, 0, 0, 0, true}, WC{1, 7, 5, 5, 3, 2, 2, 2, 2, true}, WC{1, 600, 6, 7, 18, 1, 1, 1, 1, true},
               WC{2, 130, 7, 7, 70, 1, 1, 1, 1, true}, WC{1, 2, 1, 1, 2, 1, 1, 1, 1, false},
               WC{1, 9, 9, 8, 11, 1, 0, 2, 1, true}, WC{2, 17, 10, 9, 8, 0, 2, 1, 0, false}, WC{1, 5, 6, 7, 6, 3, 3, 3, 3, true},
               WC{1, 20, 12, 5, 24, 0, 1, 1, 3, true}}) {
    const int64_t OH = c.H + c.pt + c.pb - 2, OW = c.W + c.pl + c.pr - 2, Kb = mk::nchwc_blocks(c.K, L);
    auto x = rnd(size_t(c.N * c.C * c.H * c.W), 51), w = rnd(size_t(c.K * c.C * 9), 52), bias = rnd(size_t(c.K), 53);
    const std::vector<double> want = naive_conv_bias_relu_pads(x, w, bias, c.N, c.C, c.H, c.W, c.K, 3, 3, 1, c.pt, c.pl, c.pb, c.pr, 1, 1);
    auto xb = c.xblk ? to_blocked(x, c.N, c.C, c.H * c.W, L) : x;
    mk::PackedConvWinogradM<M> pw;
    pw.pack(w.data(), c.K, c.C, L);
    std::vector<float> bpad(size_t(Kb * L), 0.f);
    std::copy(bias.begin(), bias.end(), bpad.begin());
    mk::ConvNchwcArgs a;
    a.N = c.N, a.C = c.C, a.H = c.H, a.W = c.W, a.K = c.K, a.OH = OH, a.OW = OW, a.KH = a.KW = 3;
    a.pad_top = c.pt, a.pad_left = c.pl, a.x = xb.data(), a.x_blocked = c.xblk;
    std::string what = "conv_winograd F" + std::to_string(M) + " C" + std::to_string(c.C) + " K" + std::to_string(c.K) + " " + std::to_string(c.H) + "x" +
                       std::to_string(c.W) + " pads " + std::to_string(c.pt) + "," + std::to_string(c.pl) + "," + std::to_string(c.pb) + "," +
                       std::to_string(c.pr) + (c.xblk ? "" : " plain-input");
    if (!mk::conv_winograd_applicable(a)) {
      std::printf("FAIL %s: not applicable\n", what.c_str());
      ++ck.failures;
      continue;
    }
    std::vector<float> out[3];
    for (int par = 0; par < 3; ++par) {
      std::vector<float> yb(size_t(c.N * Kb * OH * OW * L), std::nanf(""));
      a.y = yb.data();
      if (par == 1) mk::conv2d_nchwc_winograd<Arch>(a, pw, BlockedBiasRelu<Arch>{bpad.data(), Kb}, Two{});
      else mk::conv2d_nchwc_winograd<Arch>(a, pw, BlockedBiasRelu<Arch>{bpad.data(), Kb}, SerialAs{par == 0 ? 1 : 7});
      out[par].resize(want.size());
      mk::nchwc_to_nchw(yb.data(), c.N, c.K, OH * OW, L, out[par].data());
    }
    ck.close_scaled(what.c_str(), out[0], want, 2e-5);
    ck.same(what.c_str(), out[0], out[1]);
    ck.same(what.c_str(), out[0], out[2]);
    if (c.W <= mk::kNarrowMapWidth) {  // a narrow map's class: its products take the narrow-map tile
      std::vector<float> yn(size_t(c.N * Kb * OH * OW * L), std::nanf("")), got(want.size());
      a.y = yn.data();
      constexpr mk::ConvClass narrow{mk::ConvKind::Spatial, 0, 0, 0, 0, mk::kNarrowMapWidth, 1};
      if (!mk::conv2d_nchwc_winograd<Arch, narrow>(a, pw, BlockedBiasRelu<Arch>{bpad.data(), Kb}, Two{}))
        std::printf("FAIL %s: refused by a narrow class\n", what.c_str()), ++ck.failures;
      mk::nchwc_to_nchw(yn.data(), c.N, c.K, OH * OW, L, got.data());
      ck.same((what + " narrow class").c_str(), out[0], got);
    }
    if (c.K == 20 || c.K == 40) {  // the products' task shapes of that K only; another K refused
      std::vector<float> yc(size_t(c.N * Kb * OH * OW * L), std::nanf("")), got(want.size());
      a.y = yc.data();
      const BlockedBiasRelu<Arch> ep{bpad.data(), Kb};
      const bool ran = c.K == 20 ? mk::conv2d_nchwc_winograd<Arch, mk::ConvClass{mk::ConvKind::Spatial, 20}>(a, pw, ep)
                                 : mk::conv2d_nchwc_winograd<Arch, mk::ConvClass{mk::ConvKind::Spatial, 40}>(a, pw, ep);
      const bool ran_other = c.K == 20 ? mk::conv2d_nchwc_winograd<Arch, mk::ConvClass{mk::ConvKind::Spatial, 40}>(a, pw, ep)
                                       : mk::conv2d_nchwc_winograd<Arch, mk::ConvClass{mk::ConvKind::Spatial, 20}>(a, pw, ep);
      mk::nchwc_to_nchw(yc.data(), c.N, c.K, OH * OW, L, got.data());
      if (!ran || ran_other) std::printf("FAIL %s: class K\n", what.c_str()), ++ck.failures;
      ck.same((what + " class").c_str(), out[0], got);
    }
  }
}

// conv2d_nchwc through the instantiation of shape class {kind, K} (K a compile-time constant), and
// with G > 0 of {kind, K, groups G} as the generator emits a dense or grouped conv's; with W > 0 the
// class knows the input width (on maps up to mk::kNarrowMapWidth wide AVX-512 takes its 7-pixel tile).
template <class Arch, int64_t K, class Ep, int64_t G = 0, int64_t W = 0>
bool conv_in_class(mk::ConvKind kind, const mk::ConvNchwcArgs& a, const Ep& ep, SerialAs par = {}) {
  switch (kind) {
    case mk::ConvKind::Pointwise: return mk::conv2d_nchwc<Arch, mk::ConvClass{mk::ConvKind::Pointwise, K, 0, 0, 0, W, G}>(a, ep, par);
    case mk::ConvKind::Spatial: return mk::conv2d_nchwc<Arch, mk::ConvClass{mk::ConvKind::Spatial, K, 0, 0, 0, W, G}>(a, ep, par);
    case mk::ConvKind::Depthwise: return mk::conv2d_nchwc<Arch, mk::ConvClass{mk::ConvKind::Depthwise, K}>(a, ep, par);
    default: return mk::conv2d_nchwc<Arch>(a, ep, par);
  }
}

// A depthwise conv through the instantiation for kernel width KW and column stride SW, as the
// generator emits it (the fixed-width row kernels of other widths are not compiled).
template <class Arch, int64_t KW, int64_t SW, class Ep>
bool depthwise_in_class(const mk::ConvNchwcArgs& a, const Ep& ep) {
  return mk::conv2d_nchwc<Arch, mk::ConvClass{mk::ConvKind::Depthwise, 0, KW, SW}>(a, ep);
}

// ... and for an undilated depthwise conv of input width W too, which fixes its row path (the
// fixed-width, the in-place or the generic kernel, by W, the stride and the Arch's tile): only that
// one compiled.
template <class Arch, int64_t KW, int64_t W, class Ep, int64_t SW = 1>
bool depthwise_in_width_class(const mk::ConvNchwcArgs& a, const Ep& ep) {
  return mk::conv2d_nchwc<Arch, mk::ConvClass{mk::ConvKind::Depthwise, 0, KW, SW, 1, W}>(a, ep);
}

template <class Arch>
void nchwc_cases(Checker& ck) {
  constexpr int64_t L = int64_t(mk::vfloat<Arch>::size);
  struct C { int64_t N, C, H, W, K, KH, KW, s, p, d; bool dw, xblk; int64_t g = 1; };
  for (C c : {C{1, 3, 7, 9, 5, 3, 3, 1, 1, 1, false, false}, C{2, 17, 11, 10, 20, 3, 3, 2, 1, 1, false, true},
              C{1, 7, 9, 9, 7, 3, 3, 1, 1, 1, true, true}, C{1, 20, 13, 12, 20, 5, 5, 2, 2, 2, true, true},
              C{1, 33, 5, 7, 40, 1, 1, 1, 0, 1, false, true}, C{1, 5, 1, 129, 17, 1, 3, 1, 1, 1, false, true},
              C{1, 240, 4, 5, 9, 3, 3, 1, 1, 1, false, true}, C{1, 1, 17, 1, 1, 3, 1, 1, 1, 1, false, false},
              C{1, 600, 2, 3, 3, 1, 1, 1, 0, 1, false, true}, C{1, 600, 5, 6, 20, 1, 1, 2, 0, 1, false, true},
              C{2, 130, 7, 7, 70, 3, 3, 1, 1, 1, false, true},
              // A 1x1 conv with several input-channel chunks and output-block tasks (the next
              // weight panel is prefetched across both).
              C{1, 1100, 3, 5, 100, 1, 1, 1, 0, 1, false, true},
              // Input-channel passes of equal size: an input past 192 KiB of 18 blocks at L = 8
              // (two passes of 9; at L = 16 nine blocks, two passes under the 32 KiB panel cap),
              // and one in L2 of 10 blocks at L = 8 (one pass).
              C{1, 144, 20, 20, 24, 1, 1, 1, 0, 1, false, true}, C{1, 80, 14, 14, 40, 1, 1, 1, 0, 1, false, true},
              // Narrow maps with four output blocks at L = 16 (AVX-512's 4 x 7 tile in a width
              // class): a 7x7 1x1 (seven whole tiles) and a 14x14 one with a padded input-channel block.
              C{1, 96, 7, 7, 64, 1, 1, 1, 0, 1, false, true}, C{1, 40, 14, 14, 70, 1, 1, 1, 0, 1, false, true},
              // Dense padded convs with enough work run on a zero-bordered copy of the input:
              // dilation 2 with pad 2, stride 2 with a 5x5 kernel, a 1-pixel-wide map.
              C{1, 32, 9, 8, 48, 3, 3, 1, 2, 2, false, true}, C{1, 40, 11, 9, 64, 5, 5, 2, 2, 1, false, true},
              C{1, 64, 6, 1, 64, 3, 3, 1, 1, 1, false, true},
              // Stride-1 depthwise rows up to 32 wide take the zero-padded plane path (3x3 and
              // 5x5): pads 0-2, KH != KW, batch 2, a row narrower than the kernel's span.
              C{1, 20, 14, 14, 20, 5, 5, 1, 2, 1, true, true}, C{2, 17, 6, 5, 17, 3, 3, 1, 0, 1, true, true},
              C{1, 33, 7, 7, 33, 5, 5, 1, 2, 1, true, true}, C{1, 5, 6, 3, 5, 5, 5, 1, 2, 1, true, true},
              C{1, 40, 56, 28, 40, 5, 5, 1, 2, 1, true, true},
              // Wider stride-1 depthwise rows on the in-place row kernel: interior and checked
              // border tiles (widths off the tile size, pads 0-2, a 1x3 kernel, batch 2).
              C{1, 20, 5, 37, 20, 3, 3, 1, 1, 1, true, true}, C{2, 17, 4, 34, 17, 3, 3, 1, 0, 1, true, true},
              C{1, 33, 6, 41, 33, 5, 5, 1, 2, 1, true, true}, C{1, 16, 3, 40, 16, 1, 3, 1, 1, 1, true, true},
              // Stride 2 on the in-place row kernel (conv_nchwc_depthwise_direct): odd and even
              // widths, pads 0-2, 3x3 and 5x5, batch 2; and stride 1 with a pad past the kernel's
              // reach (whole columns of padding before the first interior tile).
              C{1, 20, 9, 31, 20, 3, 3, 2, 1, 1, true, true}, C{2, 17, 7, 40, 17, 5, 5, 2, 2, 1, true, true},
              C{1, 33, 6, 29, 33, 3, 3, 2, 0, 1, true, true}, C{1, 16, 5, 45, 16, 3, 3, 1, 3, 1, true, true},
              // Narrow depthwise maps off the padded-row path's stride-1 case: stride 2, dilation
              // 2, and pads past the kernel's reach (whole rows and columns of padding). Depthwise
              // reads blocked input only (the layout pass blocks a depthwise conv's input first).
              C{1, 20, 9, 4, 20, 3, 3, 2, 1, 1, true, true}, C{2, 20, 9, 5, 20, 3, 3, 1, 2, 2, true, true},
              C{1, 17, 8, 6, 17, 5, 5, 1, 4, 1, true, true}, C{1, 9, 7, 3, 9, 3, 3, 2, 3, 2, true, true},
              // Grouped (not depthwise) convs by windows of output blocks (conv_nchwc_windows):
              // groups of 4 channels (several groups per block, a last window short of a block,
              // stride 2, batch 2, dilation 2 on a zero-bordered copy), of 32 (several blocks per
              // window), a pointwise one with Cg != Kg, a plain input, a 1x1 with several
              // input-channel chunks per window, and groups of 24 (not whole blocks at L = 16:
              // refused there, whole blocks at L = 8 and 4).
              C{1, 16, 9, 9, 16, 3, 3, 1, 1, 1, false, true, 4}, C{2, 40, 7, 6, 40, 3, 3, 2, 1, 1, false, true, 10},
              C{1, 20, 8, 8, 20, 3, 3, 1, 2, 2, false, true, 5}, C{1, 64, 6, 7, 64, 3, 3, 1, 1, 1, false, true, 2},
              C{1, 32, 5, 8, 16, 1, 1, 1, 0, 1, false, true, 4}, C{1, 48, 6, 6, 48, 3, 3, 1, 1, 1, false, false, 3},
              C{1, 1024, 3, 3, 64, 1, 1, 1, 0, 1, false, true, 2}, C{1, 96, 5, 5, 96, 3, 3, 1, 1, 1, false, true, 4},
              // Strided 1x1 convs on the compact gathered copy (ResNet's projections): channels
              // off whole blocks, a plain input at stride 3 and batch 2, a grouped one; and one
              // with too few outputs per copied value, read in place.
              C{1, 40, 9, 11, 48, 1, 1, 2, 0, 1, false, true}, C{2, 33, 8, 7, 64, 1, 1, 3, 0, 1, false, false},
              C{1, 64, 9, 9, 64, 1, 1, 2, 0, 1, false, true, 2}, C{1, 32, 9, 9, 16, 1, 1, 2, 0, 1, false, true},
              // Plain inputs: a dense padded conv of 40 channels (not whole blocks) and batch 2
              // blocked by the zero-border copy, and a grouped one read in place (1x1, no copy).
              C{2, 40, 7, 6, 48, 3, 3, 1, 1, 1, false, false}, C{2, 64, 5, 4, 32, 1, 1, 1, 0, 1, false, false, 2}}) {
    const int64_t OH = (c.H + 2 * c.p - (c.KH - 1) * c.d - 1) / c.s + 1, OW = (c.W + 2 * c.p - (c.KW - 1) * c.d - 1) / c.s + 1;
    const int64_t Cg = c.dw ? 1 : c.C / c.g, Kb = mk::nchwc_blocks(c.K, L);
    auto x = rnd(size_t(c.N * c.C * c.H * c.W), 31), w = rnd(size_t(c.K * Cg * c.KH * c.KW), 32), bias = rnd(size_t(c.K), 33);
    // Depthwise: one group per channel (K == C).
    const std::vector<double> want = naive_conv_bias_relu(x, w, bias, c.N, c.C, c.H, c.W, c.K, c.KH, c.KW, c.s, c.p, c.d, c.dw ? c.C : c.g);
    auto xb = c.xblk ? to_blocked(x, c.N, c.C, c.H * c.W, L) : x;
    mk::PackedConvNchwc pw;
    pw.pack(w.data(), c.K, Cg, c.KH, c.KW, L, c.dw ? 1 : c.g, c.dw);
    std::vector<float> bpad(size_t(Kb * L), 0.f);
    std::copy(bias.begin(), bias.end(), bpad.begin());
    mk::ConvNchwcArgs a;
    a.N = c.N, a.C = c.C, a.H = c.H, a.W = c.W, a.K = c.K, a.OH = OH, a.OW = OW, a.KH = c.KH, a.KW = c.KW;
    a.stride_h = a.stride_w = c.s, a.pad_top = a.pad_left = c.p, a.dil_h = a.dil_w = c.d, a.depthwise = c.dw;
    a.group = c.dw ? 1 : c.g;
    a.x = xb.data(), a.x_blocked = c.xblk, a.w = pw.w.data();
    std::string what = "conv_nchwc C" + std::to_string(c.C) + " K" + std::to_string(c.K) + " k" + std::to_string(c.KH) + "x" +
                       std::to_string(c.KW) + (c.dw ? " depthwise" : "") + (c.g > 1 ? " group " + std::to_string(c.g) : "") +
                       (c.xblk ? "" : " plain-input");
    if (c.g > 1) {
      // A grouping is taken when a group's output channels are whole blocks (its input channels
      // too), or a block holds whole groups whose input channels are whole blocks; else refused.
      const int64_t Kg = c.K / c.g;
      const bool takes = (Kg % L == 0 && Cg % L == 0) || (L % Kg == 0 && (L / Kg * Cg) % L == 0);
      std::vector<float> yb(size_t(c.N * Kb * OH * OW * L), -7.f);
      const std::vector<float> untouched = yb;
      a.y = yb.data();
      const bool ran = mk::conv2d_nchwc<Arch>(a, BlockedBiasRelu<Arch>{bpad.data(), Kb});
      if (ran != takes) std::printf("FAIL %s: ran %d, expected %d\n", what.c_str(), int(ran), int(takes)), ++ck.failures;
      if (!takes) {
        if (yb != untouched) std::printf("FAIL %s: a refused grouping wrote output\n", what.c_str()), ++ck.failures;
        if (!pw.w.empty()) std::printf("FAIL %s: a refused grouping packed weights\n", what.c_str()), ++ck.failures;
        continue;
      }
    }
    // Serial; a two-thread par-for; and serial again as if for 7 threads (which splits rows into
    // more tasks): the same result every time.
    std::vector<float> out[3];
    for (int par = 0; par < 3; ++par) {
      std::vector<float> yb(size_t(c.N * Kb * OH * OW * L));
      a.y = yb.data();
      if (par == 1) mk::conv2d_nchwc<Arch>(a, BlockedBiasRelu<Arch>{bpad.data(), Kb}, Two{});
      else mk::conv2d_nchwc<Arch>(a, BlockedBiasRelu<Arch>{bpad.data(), Kb}, SerialAs{par == 0 ? 1 : 7});
      out[par].resize(want.size());
      mk::nchwc_to_nchw(yb.data(), c.N, c.K, OH * OW, L, out[par].data());
    }
    ck.close(what.c_str(), out[0], want);
    ck.same(what.c_str(), out[0], out[1]);
    ck.same(what.c_str(), out[0], out[2]);
    // The instantiation of the case's shape class (as the generator classifies it, with K = 0 and
    // with K = 20 or 40 where the case has that K: other task shapes) gives the same result; a
    // class the case is outside of computes nothing and says so.
    const bool pointwise = !c.dw && c.KH == 1 && c.KW == 1 && c.p == 0 && (OH - 1) * c.s < c.H && (OW - 1) * c.s < c.W;
    const mk::ConvKind kind = c.dw ? mk::ConvKind::Depthwise : pointwise ? mk::ConvKind::Pointwise : mk::ConvKind::Spatial;
    const BlockedBiasRelu<Arch> ep{bpad.data(), Kb};
    std::vector<float> yc(size_t(c.N * Kb * OH * OW * L), -7.f), got(want.size());
    const std::vector<float> untouched = yc;
    a.y = yc.data();
    // As for 1 and 2 threads: a class's tiles (the pointwise one prefetches weight panels) in
    // both task orders (see conv_pixels_outermost).
    for (int64_t threads : {1, 2})
      for (int64_t k : {int64_t(0), c.K}) {
        if (k != 0 && k != 20 && k != 40) continue;
        const SerialAs par{threads};
        const bool ran = k == 0    ? conv_in_class<Arch, 0>(kind, a, ep, par)
                         : k == 20 ? conv_in_class<Arch, 20>(kind, a, ep, par)
                                   : conv_in_class<Arch, 40>(kind, a, ep, par);
        mk::nchwc_to_nchw(yc.data(), c.N, c.K, OH * OW, L, got.data());
        if (!ran) std::printf("FAIL %s: refused by its class (K %lld)\n", what.c_str(), (long long)k), ++ck.failures;
        ck.same((what + " class").c_str(), out[0], got);
        yc = untouched;
      }
    // Dense convs on 7- and 14-wide maps in a class of their width (narrow maps: AVX-512's 4 x 7
    // tile, one accumulator through the stack), at 1 and 2 threads; a class of the other width
    // refuses them.
    if (!c.dw && (c.W == 7 || c.W == 14))
      for (int64_t threads : {1, 2}) {
        const SerialAs par{threads};
        using Ep = BlockedBiasRelu<Arch>;
        const bool ran = c.W == 7 ? conv_in_class<Arch, 0, Ep, 0, 7>(kind, a, ep, par) : conv_in_class<Arch, 0, Ep, 0, 14>(kind, a, ep, par);
        mk::nchwc_to_nchw(yc.data(), c.N, c.K, OH * OW, L, got.data());
        if (!ran) std::printf("FAIL %s: refused by its width class\n", what.c_str()), ++ck.failures;
        ck.same((what + " width class").c_str(), out[0], got);
        yc = untouched;
        const bool ran_other =
            c.W == 7 ? conv_in_class<Arch, 0, Ep, 0, 14>(kind, a, ep, par) : conv_in_class<Arch, 0, Ep, 0, 7>(kind, a, ep, par);
        if (ran_other || yc != untouched) std::printf("FAIL %s: a class of another width ran\n", what.c_str()), ++ck.failures;
      }
    if (c.dw && (c.KW == 3 || c.KW == 5) && (c.s == 1 || c.s == 2)) {
      const bool ran = c.KW == 3 ? (c.s == 1 ? depthwise_in_class<Arch, 3, 1>(a, ep) : depthwise_in_class<Arch, 3, 2>(a, ep))
                                 : (c.s == 1 ? depthwise_in_class<Arch, 5, 1>(a, ep) : depthwise_in_class<Arch, 5, 2>(a, ep));
      mk::nchwc_to_nchw(yc.data(), c.N, c.K, OH * OW, L, got.data());
      if (!ran) std::printf("FAIL %s: refused by its depthwise class\n", what.c_str()), ++ck.failures;
      ck.same((what + " depthwise class").c_str(), out[0], got);
      yc = untouched;
      const bool ran_other = c.KW == 3 ? depthwise_in_class<Arch, 5, 1>(a, ep) : depthwise_in_class<Arch, 3, 2>(a, ep);
      if (ran_other || yc != untouched) std::printf("FAIL %s: a depthwise class of another width ran\n", what.c_str()), ++ck.failures;
    }
    if (c.dw && c.s == 2 && c.d == 1 && c.KW == 3 && c.W == 31) {
      const bool ran = depthwise_in_width_class<Arch, 3, 31, BlockedBiasRelu<Arch>, 2>(a, ep);
      mk::nchwc_to_nchw(yc.data(), c.N, c.K, OH * OW, L, got.data());
      if (!ran) std::printf("FAIL %s: refused by its stride-2 width class\n", what.c_str()), ++ck.failures;
      ck.same((what + " stride-2 width class").c_str(), out[0], got);
      yc = untouched;
      const bool ran_other = depthwise_in_width_class<Arch, 3, 31, BlockedBiasRelu<Arch>, 1>(a, ep) ||
                             depthwise_in_width_class<Arch, 3, 29, BlockedBiasRelu<Arch>, 2>(a, ep);
      if (ran_other || yc != untouched) std::printf("FAIL %s: a class of another stride or width ran\n", what.c_str()), ++ck.failures;
    }
    const bool w14 = c.KW == 5 && c.W == 14, w37 = c.KW == 3 && c.W == 37, w5 = c.KW == 3 && c.W == 5;
    if (c.dw && c.s == 1 && c.d == 1 && (w14 || w37 || w5)) {
      const bool ran = w14 ? depthwise_in_width_class<Arch, 5, 14>(a, ep)
                           : w37 ? depthwise_in_width_class<Arch, 3, 37>(a, ep) : depthwise_in_width_class<Arch, 3, 5>(a, ep);
      mk::nchwc_to_nchw(yc.data(), c.N, c.K, OH * OW, L, got.data());
      if (!ran) std::printf("FAIL %s: refused by its width class\n", what.c_str()), ++ck.failures;
      ck.same((what + " width class").c_str(), out[0], got);
      yc = untouched;
      const bool ran_other = w37 ? depthwise_in_width_class<Arch, 3, 5>(a, ep) : depthwise_in_width_class<Arch, 3, 37>(a, ep);
      if (ran_other || yc != untouched) std::printf("FAIL %s: a class of another input width ran\n", what.c_str()), ++ck.failures;
    }
    if ((c.g == 10 && c.K == 40) || (c.g == 2 && c.K == 64)) {
      // The generator's class names the groups (which fixes the task shapes it compiles): {Spatial,
      // 40, groups 10} (one block per window) and {Spatial, 64, groups 2} (several) run their
      // convs; the dense class of the same K refuses them.
      const bool ran = c.K == 40 ? conv_in_class<Arch, 40, BlockedBiasRelu<Arch>, 10>(kind, a, ep)
                                 : conv_in_class<Arch, 64, BlockedBiasRelu<Arch>, 2>(kind, a, ep);
      mk::nchwc_to_nchw(yc.data(), c.N, c.K, OH * OW, L, got.data());
      if (!ran) std::printf("FAIL %s: refused by its grouped class\n", what.c_str()), ++ck.failures;
      ck.same((what + " grouped class").c_str(), out[0], got);
      yc = untouched;
      const bool dense_ran = c.K == 40 ? conv_in_class<Arch, 40, BlockedBiasRelu<Arch>, 1>(kind, a, ep)
                                       : conv_in_class<Arch, 64, BlockedBiasRelu<Arch>, 1>(kind, a, ep);
      if (dense_ran || yc != untouched) std::printf("FAIL %s: the dense class ran a grouped conv\n", what.c_str()), ++ck.failures;
    }
    const mk::ConvKind other = kind == mk::ConvKind::Spatial ? mk::ConvKind::Pointwise : mk::ConvKind::Spatial;
    const bool ran_other = c.dw ? conv_in_class<Arch, 0>(other, a, ep) : c.K == 20 ? conv_in_class<Arch, 40>(kind, a, ep)
                                                                                   : conv_in_class<Arch, 20>(kind, a, ep);
    if (ran_other || yc != untouched)
      std::printf("FAIL %s: a class it is outside of ran\n", what.c_str()), ++ck.failures;
  }
  winograd_cases<Arch, 4>(ck);
  winograd_cases<Arch, 2>(ck);
  {  // Not applicable: strided, dilated, 5x5, depthwise.
    mk::ConvNchwcArgs a;
    a.C = a.K = 8, a.H = a.W = 8, a.OH = a.OW = 8, a.KH = a.KW = 3;
    bool ok = mk::conv_winograd_applicable(a);
    a.stride_h = 2, ok = ok && !mk::conv_winograd_applicable(a), a.stride_h = 1;
    a.dil_w = 2, ok = ok && !mk::conv_winograd_applicable(a), a.dil_w = 1;
    a.KH = 5, ok = ok && !mk::conv_winograd_applicable(a), a.KH = 3;
    a.depthwise = true, ok = ok && !mk::conv_winograd_applicable(a);
    if (!ok) std::printf("FAIL conv_winograd_applicable\n"), ++ck.failures;
  }
  // Pooling: max 3x3/2 pad 1, average with and without count_include_pad, global average.
  struct P { int64_t C, H, W, KH, KW, s, p; bool mx, cip; };
  // Wider max pools take the unchecked runs of 4 interior pixels: ResNet's stem pool, YOLO's
  // SPPF 5x5 stride 1, a 2x2 stride-2 pool without padding.
  for (P c : {P{19, 11, 13, 3, 3, 2, 1, true, false}, P{19, 11, 13, 3, 3, 2, 1, false, false}, P{5, 7, 8, 3, 2, 1, 1, false, true},
              P{21, 7, 7, 7, 7, 1, 0, false, false}, P{19, 9, 37, 3, 3, 2, 1, true, false}, P{17, 6, 29, 5, 5, 1, 2, true, false},
              P{16, 8, 22, 2, 2, 2, 0, true, false},
              // Global pools (one window over the plane) take the contiguous run: plane sizes with
              // and without a remainder after the 4 chains, max and average.
              P{37, 13, 11, 13, 11, 1, 0, true, false}, P{37, 13, 11, 13, 11, 1, 0, false, false},
              P{16, 5, 3, 5, 3, 1, 0, false, false}, P{9, 1, 2, 1, 2, 1, 0, false, false}}) {
    const int64_t OH = (c.H + 2 * c.p - c.KH) / c.s + 1, OW = (c.W + 2 * c.p - c.KW) / c.s + 1;
    auto x = rnd(size_t(c.C * c.H * c.W), 41);
    std::vector<double> want(size_t(c.C * OH * OW));
    for (int64_t ch = 0; ch < c.C; ++ch)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double m = -INFINITY, s = 0;
          int cnt = 0;
          for (int64_t kh = 0; kh < c.KH; ++kh)
            for (int64_t kw = 0; kw < c.KW; ++kw) {
              int64_t ih = oh * c.s - c.p + kh, iw = ow * c.s - c.p + kw;
              if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
              double v = x[size_t((ch * c.H + ih) * c.W + iw)];
              m = std::max(m, v), s += v, ++cnt;
            }
          if (c.cip) cnt = int(c.KH * c.KW);  // windows here never pass the padded border
          want[size_t((ch * OH + oh) * OW + ow)] = c.mx ? m : s / cnt;
        }
    auto xb = to_blocked(x, 1, c.C, c.H * c.W, L);
    mk::PoolNchwcArgs a;
    a.C = c.C, a.H = c.H, a.W = c.W, a.OH = OH, a.OW = OW, a.KH = c.KH, a.KW = c.KW, a.stride_h = a.stride_w = c.s;
    a.pad_top = a.pad_left = a.pad_bottom = a.pad_right = c.p, a.is_max = c.mx, a.count_include_pad = c.cip;
    a.x = xb.data();
    std::vector<float> yb(size_t(mk::nchwc_blocks(c.C, L) * OH * OW * L)), got(want.size());
    a.y = yb.data();
    mk::pool2d_nchwc<Arch>(a, mk::IdentityEpilogue{}, Two{});
    mk::nchwc_to_nchw(yb.data(), 1, c.C, OH * OW, L, got.data());
    std::string what = std::string("pool_nchwc ") + (c.mx ? "max" : c.cip ? "avg-include-pad" : "avg") + " k" + std::to_string(c.KH) +
                       "x" + std::to_string(c.KW) + " on " + std::to_string(c.H) + "x" + std::to_string(c.W);
    ck.close(what.c_str(), got, want);
  }
}

template <class Arch>
int run_all() {
  Checker ck;
  gemm_cases<Arch>(ck);
  conv_cases<Arch>(ck);
  pool_reduce_cases<Arch>(ck);
  nchwc_cases<Arch>(ck);
  std::printf("microkernel selftest (%s, %d-float batches): %d failure(s)\n", Arch::name(), int(mk::vfloat<Arch>::size),
              ck.failures);
  return ck.failures;
}

// --bench: single-thread GFLOP/s (thread CPU time, best of several runs, so a loaded machine
// does not skew it) of GEMM 512^3, the ResNet-50 3x3 64->64 56x56 conv, a depthwise 3x3 layer,
// and the FMA peak of this arch measured with independent FMA chains.
inline double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

template <class F>
double best_of(int reps, F&& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_seconds();
    f();
    best = std::min(best, thread_seconds() - t0);
  }
  return best;
}

template <class Arch>
void bench() {
  using V = mk::vfloat<Arch>;
  constexpr int64_t L = int64_t(V::size);
  {  // FMA peak: 12 independent chains hide the FMA latency.
    const int64_t n = 20000000;
    V acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = V(float(i) * 1e-3f);
    const V b(0.999f), c(1e-4f);
    const double t = best_of(3, [&] {
      V a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], a4 = acc[4], a5 = acc[5];
      V a6 = acc[6], a7 = acc[7], a8 = acc[8], a9 = acc[9], a10 = acc[10], a11 = acc[11];
      for (int64_t i = 0; i < n; ++i) {
        a0 = xsimd::fma(a0, b, c), a1 = xsimd::fma(a1, b, c), a2 = xsimd::fma(a2, b, c);
        a3 = xsimd::fma(a3, b, c), a4 = xsimd::fma(a4, b, c), a5 = xsimd::fma(a5, b, c);
        a6 = xsimd::fma(a6, b, c), a7 = xsimd::fma(a7, b, c), a8 = xsimd::fma(a8, b, c);
        a9 = xsimd::fma(a9, b, c), a10 = xsimd::fma(a10, b, c), a11 = xsimd::fma(a11, b, c);
      }
      acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3, acc[4] = a4, acc[5] = a5;
      acc[6] = a6, acc[7] = a7, acc[8] = a8, acc[9] = a9, acc[10] = a10, acc[11] = a11;
    });
    float sink = 0;
    for (int i = 0; i < 12; ++i) sink += xsimd::hadd(acc[i]);
    std::printf("fma peak                      %7.1f GFLOP/s  (checksum %g)\n", 2.0 * L * 12 * n / t * 1e-9, double(sink));
  }
  {
    const int64_t n = 512;
    auto A = rnd(size_t(n * n), 1), B = rnd(size_t(n * n), 2);
    std::vector<float> C(size_t(n * n));
    auto g = mk::GemmArgs::matmul(n, n, n, A.data(), false, B.data(), false, C.data());
    const double t = best_of(10, [&] { mk::gemm<Arch>(g); });
    std::printf("gemm 512x512x512              %7.1f GFLOP/s  (%.3f ms)\n", 2.0 * n * n * n / t * 1e-9, t * 1e3);
  }
  mk::Conv2dArgs a;
  a.C = 64, a.H = 56, a.W = 56, a.K = 64, a.OH = 56, a.OW = 56, a.KH = a.KW = 3, a.pad_top = a.pad_left = 1;
  a.set_contiguous();
  auto x = rnd(size_t(64 * 56 * 56), 3), w = rnd(size_t(64 * 64 * 9), 4);
  std::vector<float> y(size_t(64 * 56 * 56));
  a.x = x.data(), a.w = w.data(), a.y = y.data();
  const double conv_flops = 2.0 * 64 * 56 * 56 * 64 * 9;
  const double tg = best_of(5, [&] { mk::conv2d_gemm<Arch>(a); });
  std::printf("conv3x3 64->64 56x56 im2col   %7.1f GFLOP/s  (%.3f ms)\n", conv_flops / tg * 1e-9, tg * 1e3);
  const double td = best_of(3, [&] { mk::conv2d_direct<Arch>(a); });
  std::printf("conv3x3 64->64 56x56 direct   %7.1f GFLOP/s  (%.3f ms)\n", conv_flops / td * 1e-9, td * 1e3);
  for (int64_t s : {1, 2}) {
    mk::Conv2dArgs d = a;
    d.C = d.K = d.group = 144, d.stride_h = d.stride_w = s, d.OH = d.OW = 56 / s;
    d.set_contiguous();
    auto xd = rnd(size_t(144 * 56 * 56), 5), wd = rnd(size_t(144 * 9), 6);
    std::vector<float> yd(size_t(144 * d.OH * d.OW));
    d.x = xd.data(), d.w = wd.data(), d.y = yd.data();
    const double t = best_of(10, [&] { mk::conv2d_depthwise<Arch>(d); });
    std::printf("depthwise3x3/%ld 144ch 56x56   %7.1f GFLOP/s  (%.3f ms)\n", long(s),
                2.0 * 144 * d.OH * d.OW * 9 / t * 1e-9, t * 1e3);
  }
}

}  // namespace mkself

#ifdef MK_SELFTEST_MAIN
int main(int argc, char** argv) {
#if defined(__x86_64__) && defined(__AVX512F__)
  if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq")) {
    std::printf("skipped: this CPU has no AVX-512\n");
    return 77;
  }
#endif
  if (argc > 1 && std::string(argv[1]) == "--bench") {
    std::printf("single thread, %s\n", nnfuse::mk::arch::native::name());
    mkself::bench<nnfuse::mk::arch::native>();
    return 0;
  }
  return mkself::run_all<nnfuse::mk::arch::native>() == 0 ? 0 : 1;
}
#else
#include <catch2/catch.hpp>
TEST_CASE("standalone microkernel selftest against naive loops (AVX2)", "[microkernels][selftest]") {
  REQUIRE(mkself::run_all<nnfuse::mk::arch::x86_avx2>() == 0);
}
#endif
