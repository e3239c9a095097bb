// Microbenchmark of the CPU microkernels against the machine's measured FMA peak (issue 21).
//
//   g++ -O3 -std=c++20 -fno-math-errno -DNDEBUG -march=native -I. bench/kernels_bench.cpp -o kernels_bench -pthread
//   ./kernels_bench [--threads 1] [--reps 5] [--only gemm|gemv|conv|mobile|nchw|math] [--cold-weights]
//
// --cold-weights: each conv call reads the next of several copies of its packed weights (together
// past 3x a 4 MiB L2), as in a model, where the other layers' weights pass through the cache
// between two calls of a layer; the input stays warm, as the layer before just wrote it.
// (-march=native: the best ISA of this machine, as `--target host` compiles generated kernels.)
// Prints one line per case: shape, best-of-reps milliseconds, GFLOP/s and the percentage of the
// peak measured here in the same process (a register-only FMA loop over as many independent
// accumulators as the ISA has registers, times the thread count).
//
// GEMM: packed B (constant weights, the form generated MatMul/Gemm stages use) over large squares
// and the transformer shapes of BERT-base/ViT; conv: NCHW<L>c direct convolution over the distinct
// layers of ResNet-50 and YOLOv8n (320x320) with their FLOP counts, and for every 3x3 stride-1
// layer also Winograd F(4x4,3x3) (conv_winograd.h): its speed-up over direct and its largest
// difference from the direct result relative to the output's scale. nchw: the blocked kernel
// against the NCHW one (conv.h: im2col + GEMM per group) on the layers that used to stay NCHW:
// grouped convs (ResNeXt-50 32x4d, RegNet, ShuffleNet), convs between plain buffers, 1-D convs
// (Whisper's stem, a spectrogram front end), both from a plain NCHW input, as a lone conv reads it.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/microkernels/conv.h"
#include "kernels/microkernels/conv_nchwc.h"
#include "kernels/microkernels/conv_winograd.h"
#include "kernels/microkernels/gemm.h"
#include "kernels/microkernels/math.h"

using namespace nnfuse;
using Arch = mk::arch::native;
using V = mk::vfloat<Arch>;
constexpr int64_t L = int64_t(V::size);

namespace {
bool g_cold_weights = false;

// A par-for over std::threads: contiguous chunks, the caller takes the first (the runtime's pool
// has the same shape; a fresh set of threads per call costs ~20 us, negligible at these sizes).
struct ThreadFor {
  int threads = 1;
  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    if (n <= 0) return;
    const int64_t t = std::min<int64_t>(threads, n);
    if (t <= 1) return fn(int64_t(0), n);
    std::vector<std::thread> ws;
    for (int64_t i = 1; i < t; ++i) ws.emplace_back([&, i] { fn(n * i / t, n * (i + 1) / t); });
    fn(int64_t(0), n / t);
    for (auto& w : ws) w.join();
  }
};

double seconds_of(const std::function<void()>& f, int reps) {
  f();  // warm caches and scratch buffers
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// FMA peak of one core: independent accumulator chains (enough to cover latency x ports), all
// in registers: 24 on 32 vector registers (AVX-512, NEON), 12 on AVX2's 16. (24 on AVX2 spilled
// to the stack and measured half the peak: a Zen 3 "peak" of 51-78 GFLOP/s under a GEMM at 92.)
constexpr int kPeakChains = L == 8 ? 12 : 24;
__attribute__((noinline)) float fma_loop(int64_t iters, float seed) {
  constexpr int A = kPeakChains;
  V acc[A];
  for (int i = 0; i < A; ++i) acc[i] = V(seed + float(i));
  const V m(0.999999f), c(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 24
    for (int i = 0; i < A; ++i) acc[i] = xsimd::fma(acc[i], m, c);
  V s(0.f);
  for (int i = 0; i < A; ++i) s += acc[i];
  return xsimd::hadd(s);
}

double peak_gflops(int threads) {
  const int64_t iters = 20'000'000;
  volatile float sink = 0;
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ws;
    for (int i = 1; i < threads; ++i) ws.emplace_back([&] { sink = sink + fma_loop(iters, 1.f); });
    sink = sink + fma_loop(iters, 2.f);
    for (auto& w : ws) w.join();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * double(L) * kPeakChains * double(iters) * threads / best * 1e-9;
}

std::vector<float> random_vec(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

void report(const char* kind, const std::string& shape, double flops, double sec, double peak) {
  const double gf = flops / sec * 1e-9;
  std::printf("%-5s %-44s %9.3f ms %8.1f GFLOP/s %6.1f%% of peak\n", kind, shape.c_str(), sec * 1e3, gf, 100.0 * gf / peak);
}

void bench_gemm(int64_t M, int64_t N, int64_t K, const ThreadFor& par, int reps, double peak, std::vector<double>& eff) {
  auto A = random_vec(size_t(M * K), 1), B = random_vec(size_t(K * N), 2);
  std::vector<float> C(size_t(M * N));
  mk::PackedB<Arch> pb;
  pb.pack(K, N, B.data(), N, 1);
  mk::GemmArgs g = mk::GemmArgs::matmul(M, N, K, A.data(), false, B.data(), false, C.data());
  const double s = seconds_of([&] { mk::gemm_packed<Arch>(g, pb, mk::IdentityEpilogue{}, par); }, reps);
  const double fl = 2.0 * double(M) * double(N) * double(K);
  report("gemm", "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K), fl, s, peak);
  eff.push_back(fl / s * 1e-9 / peak);
}

// As bench_gemm with B coming from memory, as a model's weights do (each layer's are read once
// per inference and the whole set is far larger than L3): calls rotate over copies of B that
// together exceed 3x a 32 MiB L3. Mean time per call, since every call pays the cold B.
void bench_gemm_cold_b(int64_t M, int64_t N, int64_t K, const ThreadFor& par, int reps, double peak, std::vector<double>& eff) {
  auto A = random_vec(size_t(M * K), 1), B = random_vec(size_t(K * N), 2);
  std::vector<float> C(size_t(M * N));
  const double bbytes = double(K) * double(N) * 4;
  const int copies = int(std::ceil(96e6 * 1.05 / bbytes)) + 1;
  std::vector<std::unique_ptr<mk::PackedB<Arch>>> pbs;
  for (int i = 0; i < copies; ++i) {
    pbs.push_back(std::make_unique<mk::PackedB<Arch>>());
    pbs.back()->pack(K, N, B.data(), N, 1);
  }
  mk::GemmArgs g = mk::GemmArgs::matmul(M, N, K, A.data(), false, B.data(), false, C.data());
  for (auto& pb : pbs) mk::gemm_packed<Arch>(g, *pb, mk::IdentityEpilogue{}, par);
  const int calls = std::max(reps, 1) * copies;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) mk::gemm_packed<Arch>(g, *pbs[size_t(i % copies)], mk::IdentityEpilogue{}, par);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
  const double fl = 2.0 * double(M) * double(N) * double(K);
  report("gemm", "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " B from memory", fl, s,
         peak);
  eff.push_back(fl / s * 1e-9 / peak);
}

// Batch-1 (and 2, 4) matrix-vector products against packed weights: bound by reading B, so the
// figure is GB/s of B read, against a read-only stream of the same size measured here (B stays in L3 when
// it fits: the LSTM's recurrent weights are read once per time step, so that is its regime).
// Read-only stream of `bytes` (a vector sum over 8 accumulators): what a GEMV's B stream can
// reach at best from wherever a buffer of that size lives between reps (L2, L3 or memory).
double stream_gbs(size_t bytes, int reps) {
  auto src = random_vec(bytes / sizeof(float), 5);
  volatile float sink = 0;
  const double s = seconds_of([&] {
    V acc[8];
    for (auto& a : acc) a = V(0.f);
    const float* p = src.data();
    const size_t n = src.size() / (8 * L) * (8 * L);
    for (size_t i = 0; i < n; i += 8 * L)
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] += V::load_unaligned(p + i + size_t(j) * L);
    V t(0.f);
    for (auto& a : acc) t += a;
    sink = sink + xsimd::hadd(t);
  }, reps);
  return double(bytes) / s * 1e-9;
}

void bench_gemv(int64_t M, int64_t N, int64_t K, const char* what, const ThreadFor& par, int reps, double peak) {
  auto A = random_vec(size_t(M * K), 3), B = random_vec(size_t(K * N), 4);
  std::vector<float> C(size_t(M * N));
  mk::PackedB<Arch> pb;
  pb.pack(K, N, B.data(), N, 1);
  mk::GemmArgs g = mk::GemmArgs::matmul(M, N, K, A.data(), false, B.data(), false, C.data());
  const double s = seconds_of([&] { mk::gemm_packed<Arch>(g, pb, mk::IdentityEpilogue{}, par); }, reps * 4);
  const double bytes = double(K) * double(N) * 4, fl = 2.0 * double(M) * double(N) * double(K);
  const double copy = stream_gbs(size_t(bytes), reps * 4);
  std::printf("gemv  %-44s %9.3f ms %6.1f GB/s of B (read stream of %.0f MB: %5.1f GB/s, %3.0f%%) %5.1f%% of FMA peak\n",
              (std::string(what) + " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K)).c_str(), s * 1e3,
              bytes / s * 1e-9, bytes * 1e-6, copy, 100.0 * bytes / s * 1e-9 / copy, 100.0 * fl / s * 1e-9 / peak);
}

template <int M>
double bench_winograd(mk::ConvNchwcArgs a, const std::vector<float>& w, const std::vector<float>& y, double s, double fl,
                      const ThreadFor& par, int reps, double peak);

struct ConvCase {
  const char* model;
  int64_t C, H, W, K, KH, stride;
  int times;  // how often the layer occurs in the model (for the weighted summary)
};

void bench_conv(const ConvCase& cc, const ThreadFor& par, int reps, double peak, double& total_fl, double& total_s,
                bool depthwise = false) {
  mk::ConvNchwcArgs a;
  a.N = 1, a.C = cc.C, a.H = cc.H, a.W = cc.W, a.K = cc.K, a.KH = a.KW = cc.KH;
  a.stride_h = a.stride_w = cc.stride;
  a.pad_top = a.pad_left = cc.KH / 2;
  a.OH = (cc.H + 2 * a.pad_top - cc.KH) / cc.stride + 1;
  a.OW = (cc.W + 2 * a.pad_left - cc.KH) / cc.stride + 1;
  a.depthwise = depthwise;
  const int64_t Cg = depthwise ? 1 : cc.C;
  auto x = random_vec(size_t(mk::nchwc_blocks(cc.C, L) * L * cc.H * cc.W), 3);
  auto w = random_vec(size_t(cc.K * Cg * cc.KH * cc.KH), 4);
  mk::PackedConvNchwc pw;
  pw.pack(w.data(), cc.K, Cg, cc.KH, cc.KH, L, 1, depthwise);
  std::vector<float> y(size_t(mk::nchwc_blocks(cc.K, L) * L * a.OH * a.OW));
  a.x = x.data(), a.w = pw.w.data(), a.y = y.data();
  std::vector<decltype(pw.w)> copies;  // the packed type: aligned as the kernels get it
  size_t next_copy = 0;
  if (g_cold_weights) {
    const size_t bytes = pw.w.size() * sizeof(float), want = (size_t(12) << 20) / std::max<size_t>(bytes, 1) + 1;
    for (size_t i = 0; i < std::max<size_t>(want, 2); ++i) copies.push_back(pw.w);
  }
  auto rotate = [&] {
    if (!copies.empty()) a.w = copies[next_copy++ % copies.size()].data();
  };
  // A 1x1 layer runs the pointwise class, as the generated stage calls it (the Any class takes
  // the checked general tile for short tiles).
  constexpr mk::ConvClass pointwise{mk::ConvKind::Pointwise};
  const bool is_pw = !depthwise && mk::conv_pointwise_geometry(a);
  const double s = seconds_of([&] {
    rotate();
    if (is_pw) mk::conv2d_nchwc<Arch, pointwise>(a, mk::IdentityEpilogue{}, par);
    else mk::conv2d_nchwc<Arch>(a, mk::IdentityEpilogue{}, par);
  }, reps);
  const double fl = 2.0 * double(cc.K) * double(Cg) * double(cc.KH * cc.KH) * double(a.OH * a.OW);
  char shape[96];
  std::snprintf(shape, sizeof shape, "%s %lldx%lldx%lld k%lld s%lld -> %lld (x%d)", cc.model, (long long)cc.C, (long long)cc.H,
                (long long)cc.W, (long long)cc.KH, (long long)cc.stride, (long long)cc.K, cc.times);
  report("conv", shape, fl, s, peak);
  double best = s;
  if (mk::conv_winograd_applicable(a)) best = std::min({best, bench_winograd<4>(a, w, y, s, fl, par, reps, peak),
                                                        bench_winograd<2>(a, w, y, s, fl, par, reps, peak)});
  total_fl += fl * cc.times, total_s += best * cc.times;
}

// Winograd F(MxM, 3x3) on the same layer: its time, speed-up over direct (s) and largest
// difference from the direct result y relative to the output's scale.
template <int M>
double bench_winograd(mk::ConvNchwcArgs a, const std::vector<float>& w, const std::vector<float>& y, double s, double fl,
                      const ThreadFor& par, int reps, double peak) {
  {
    mk::PackedConvWinogradM<M> pu;
    pu.pack(w.data(), a.K, a.C, L);
    std::vector<float> y2(y.size());
    a.y = y2.data();
    const double sw = seconds_of([&] { mk::conv2d_nchwc_winograd<Arch>(a, pu, mk::IdentityEpilogue{}, par); }, reps);
    // Largest difference from the direct kernel, relative to the output's largest magnitude.
    double err = 0, mag = 0;
    for (int64_t k = 0; k < a.K; ++k)
      for (int64_t p = 0; p < a.OH * a.OW; ++p) {
        const size_t i = size_t(((k / L) * a.OH * a.OW + p) * L + k % L);
        err = std::max(err, double(std::fabs(y[i] - y2[i]))), mag = std::max(mag, double(std::fabs(y[i])));
      }
    char wshape[128];
    std::snprintf(wshape, sizeof wshape, "  winograd F(%dx%d,3x3): %.2fx direct, err %.1e", M, M, s / sw, err / mag);
    report("wino", wshape, fl, sw, peak);
    return sw;
  }
}

}  // namespace

// One layer both ways: NCHW (conv2d: what an NCHW stage runs) and NCHW<L>c from a plain input.
struct NchwCase {
  const char* what;
  int64_t N, C, H, W, K, KH, KW, stride, pad_h, pad_w, G;
};

void bench_nchw_vs_blocked(const NchwCase& c, const ThreadFor& par, int reps, double peak) {
  const int64_t OH = (c.H + 2 * c.pad_h - c.KH) / c.stride + 1, OW = (c.W + 2 * c.pad_w - c.KW) / c.stride + 1;
  const int64_t Cg = c.C / c.G;
  auto x = random_vec(size_t(c.N * c.C * c.H * c.W), 5), w = random_vec(size_t(c.K * Cg * c.KH * c.KW), 6);
  std::vector<float> y(size_t(c.N * c.K * OH * OW)), yb(size_t(c.N * mk::nchwc_blocks(c.K, L) * L * OH * OW)), yc(y.size());
  mk::Conv2dArgs a;
  a.N = c.N, a.C = c.C, a.H = c.H, a.W = c.W, a.K = c.K, a.KH = c.KH, a.KW = c.KW, a.OH = OH, a.OW = OW;
  a.stride_h = c.H == 1 ? 1 : c.stride, a.stride_w = c.stride, a.pad_top = c.pad_h, a.pad_left = c.pad_w, a.group = c.G;
  a.x = x.data(), a.w = w.data(), a.y = y.data();
  a.x_sn = c.C * c.H * c.W, a.x_sc = c.H * c.W, a.x_sh = c.W, a.y_sn = c.K * OH * OW, a.y_sc = OH * OW, a.y_sh = OW;
  mk::PackedConvNchwc pw;
  pw.pack(w.data(), c.K, Cg, c.KH, c.KW, L, c.G);
  mk::ConvNchwcArgs b;
  b.N = c.N, b.C = c.C, b.H = c.H, b.W = c.W, b.K = c.K, b.KH = c.KH, b.KW = c.KW, b.OH = OH, b.OW = OW;
  b.stride_h = a.stride_h, b.stride_w = c.stride, b.pad_top = c.pad_h, b.pad_left = c.pad_w, b.group = c.G;
  b.x = x.data(), b.x_blocked = false, b.w = pw.w.data(), b.y = yb.data();
  const double t_nchw = seconds_of([&] { mk::conv2d<Arch>(a, mk::IdentityEpilogue{}, par); }, reps);
  bool taken = true;
  const double t_blk = seconds_of([&] { taken = mk::conv2d_nchwc<Arch>(b, mk::IdentityEpilogue{}, par); }, reps);
  const double fl = 2.0 * double(c.N * c.K * Cg * c.KH * c.KW * OH * OW);
  char shape[96];
  std::snprintf(shape, sizeof shape, "%s %lldx%lldx%lld k%lldx%lld s%lld g%lld -> %lld", c.what, (long long)c.C, (long long)c.H,
                (long long)c.W, (long long)c.KH, (long long)c.KW, (long long)c.stride, (long long)c.G, (long long)c.K);
  report("nchw", shape, fl, t_nchw, peak);
  if (!taken) {
    std::printf("blk   %-44s (grouping not taken at L = %lld)\n", shape, (long long)L);
    return;
  }
  mk::nchwc_to_nchw(yb.data(), c.N, c.K, OH * OW, L, yc.data());
  double err = 0, mag = 0;
  for (size_t i = 0; i < y.size(); ++i) err = std::max(err, double(std::fabs(y[i] - yc[i]))), mag = std::max(mag, double(std::fabs(y[i])));
  report("blk", shape, fl, t_blk, peak);
  std::printf("      blocked / NCHW speed-up %.2fx, largest difference %.1e of the output scale\n", t_nchw / t_blk, err / mag);
}

int main(int argc, char** argv) {
  int threads = 1, reps = 5;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--cold-weights") g_cold_weights = true;
    else {
      std::fprintf(stderr, "usage: %s [--threads T] [--reps N] [--only gemm|gemv|conv|mobile|nchw|math] [--cold-weights]\n", argv[0]);
      return 2;
    }
  }
  const ThreadFor par{threads};
  const double peak = peak_gflops(threads);
  std::printf("vector width %lld floats, %d thread(s), measured FMA peak %.1f GFLOP/s\n", (long long)L, threads, peak);
  if (only.empty() || only == "nchw") {
    for (const NchwCase& c : {NchwCase{"resnext50", 1, 128, 56, 56, 128, 3, 3, 1, 1, 1, 32},
                              NchwCase{"resnext50", 1, 256, 56, 56, 256, 3, 3, 2, 1, 1, 32},
                              NchwCase{"resnext50", 1, 256, 28, 28, 256, 3, 3, 1, 1, 1, 32},
                              NchwCase{"resnext50", 1, 512, 14, 14, 512, 3, 3, 1, 1, 1, 32},
                              NchwCase{"resnext50", 1, 1024, 7, 7, 1024, 3, 3, 1, 1, 1, 32},
                              NchwCase{"regnet", 1, 104, 28, 28, 104, 3, 3, 1, 1, 1, 13},
                              NchwCase{"regnet", 1, 48, 56, 56, 48, 3, 3, 1, 1, 1, 2},
                              NchwCase{"shufflenet", 1, 240, 28, 28, 240, 1, 1, 1, 0, 0, 3},
                              NchwCase{"resnext-export", 2, 16, 8, 7, 16, 3, 3, 1, 1, 1, 4},
                              NchwCase{"lone", 2, 16, 10, 9, 8, 3, 3, 1, 0, 0, 1},
                              NchwCase{"lone", 1, 64, 20, 20, 24, 3, 3, 1, 1, 1, 1},
                              NchwCase{"lone", 1, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1},
                              NchwCase{"lone", 1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1},
                              NchwCase{"lone", 1, 16, 112, 112, 16, 3, 3, 1, 1, 1, 1},
                              NchwCase{"whisper-stem", 1, 80, 1, 3000, 384, 1, 3, 1, 0, 1, 1},
                              NchwCase{"whisper-stem", 1, 384, 1, 3000, 384, 1, 3, 2, 0, 1, 1},
                              NchwCase{"stft", 1, 1, 1, 16000, 64, 1, 400, 160, 0, 0, 1},
                              NchwCase{"conv1d", 1, 64, 1, 500, 64, 1, 5, 1, 0, 2, 1}})
      bench_nchw_vs_blocked(c, par, reps, peak);
    if (only == "nchw") return 0;
  }
  if (only.empty() || only == "gemm") {
    std::vector<double> big, shapes;
    for (int64_t n : {512, 1024, 2048}) bench_gemm(n, n, n, par, reps, peak, big);
    // BERT-base / ViT-B at 128 and 197 tokens: QKV, attention output, MLP up and down.
    for (int64_t m : {128, 197}) {
      bench_gemm(m, 2304, 768, par, reps, peak, shapes);
      bench_gemm(m, 768, 768, par, reps, peak, shapes);
      bench_gemm(m, 3072, 768, par, reps, peak, shapes);
      bench_gemm(m, 768, 3072, par, reps, peak, shapes);
    }
    std::vector<double> cold;
    for (int64_t m : {128, 197}) {
      bench_gemm_cold_b(m, 2304, 768, par, reps, peak, cold);
      bench_gemm_cold_b(m, 768, 768, par, reps, peak, cold);
      bench_gemm_cold_b(m, 3072, 768, par, reps, peak, cold);
      bench_gemm_cold_b(m, 768, 3072, par, reps, peak, cold);
    }
    auto geo = [](const std::vector<double>& v) {
      double l = 0;
      for (double e : v) l += std::log(e);
      return 100 * std::exp(l / double(v.size()));
    };
    std::printf("gemm geomean: large squares %.1f%% of peak, transformer shapes %.1f%% (B from memory: %.1f%%)\n", geo(big),
                geo(shapes), geo(cold));
  }
  if (only.empty() || only == "math") {
    // A GELU written with Erf (as the legacy exporter writes it for ViT and BERT) over ViT-B/16's
    // 197 x 3072 FC1 output, one thread: mk::verf against xsimd::erf, which it replaced.
    auto x = random_vec(size_t(197 * 3072), 9);
    std::vector<float> y(x.size());
    for (auto& v : x) v *= 3.f;
    auto gelu_with = [&](auto erf_fn) {
      return seconds_of([&] {
        for (size_t i = 0; i + L <= x.size(); i += L) {
          const V v = V::load_unaligned(&x[i]);
          (V(0.5f) * v * (erf_fn(v * V(0.70710678f)) + V(1.f))).store_unaligned(&y[i]);
        }
      }, reps);
    };
    const double ours = gelu_with([](const V& v) { return mk::verf<Arch>(v); });
    const double xs = gelu_with([](const V& v) { return xsimd::erf(v); });
    std::printf("math  gelu by erf, 197 x 3072 floats: mk::verf %.3f ms, xsimd::erf %.3f ms (%.2fx)\n", ours * 1e3, xs * 1e3,
                xs / ours);
  }
  if (only.empty() || only == "gemv") {
    for (int64_t m : {1, 2, 4}) {
      bench_gemv(m, 4096, 1024, "lstm-recurrent", par, reps, peak);  // LSTM H=1024: h . R^T
      bench_gemv(m, 3072, 768, "gpt2-mlp-up", par, reps, peak);       // one decoded token
      bench_gemv(m, 1000, 2048, "resnet-fc", par, reps, peak);        // classifier head
      bench_gemv(m, 8000, 1024, "vocab-head", par, reps, peak);       // seq2seq output projection
    }
  }
  if (only.empty() || only == "conv" || only == "mobile") {
    const ConvCase cases[] = {
        // ResNet-50 (224x224): stem, then each stage's 1x1 reduce, 3x3, 1x1 expand and the
        // strided 3x3 / projection of its first block (the counts make the weighted total).
        {"r50", 3, 224, 224, 64, 7, 2, 1},
        {"r50", 64, 56, 56, 64, 1, 1, 0},   {"r50", 64, 56, 56, 64, 3, 1, 3},   {"r50", 64, 56, 56, 256, 1, 1, 3},
        {"r50", 64, 56, 56, 320, 1, 1, 1},  // the first block's reduce + projection, combined by combine-parallel
        {"r50", 256, 56, 56, 64, 1, 1, 2},  {"r50", 256, 56, 56, 128, 1, 1, 1}, {"r50", 128, 56, 56, 128, 3, 2, 1},
        {"r50", 128, 28, 28, 512, 1, 1, 4}, {"r50", 512, 28, 28, 128, 1, 1, 3}, {"r50", 128, 28, 28, 128, 3, 1, 3},
        {"r50", 512, 28, 28, 256, 1, 1, 1}, {"r50", 256, 28, 28, 256, 3, 2, 1}, {"r50", 256, 14, 14, 1024, 1, 1, 6},
        {"r50", 1024, 14, 14, 256, 1, 1, 5}, {"r50", 256, 14, 14, 256, 3, 1, 5}, {"r50", 1024, 14, 14, 512, 1, 1, 1},
        {"r50", 512, 14, 14, 512, 3, 2, 1}, {"r50", 512, 7, 7, 2048, 1, 1, 3},  {"r50", 2048, 7, 7, 512, 1, 1, 2},
        {"r50", 512, 7, 7, 512, 3, 1, 2},
        // ResNet-50 v1.5's stride-2 1x1 projections (the first block of stages 2-4).
        {"r50", 256, 56, 56, 512, 1, 2, 1}, {"r50", 512, 28, 28, 1024, 1, 2, 1}, {"r50", 1024, 14, 14, 2048, 1, 2, 1},
        // YOLOv8n at 320x320: stem and downsampling 3x3 s2 convs, C2f bottleneck 3x3s, 1x1s.
        {"yolo", 3, 320, 320, 16, 3, 2, 1},  {"yolo", 16, 160, 160, 32, 3, 2, 1}, {"yolo", 16, 80, 80, 16, 3, 1, 2},
        {"yolo", 32, 80, 80, 64, 3, 2, 1},   {"yolo", 32, 40, 40, 32, 3, 1, 4},   {"yolo", 64, 40, 40, 128, 3, 2, 1},
        {"yolo", 64, 20, 20, 64, 3, 1, 4},   {"yolo", 128, 20, 20, 256, 3, 2, 1}, {"yolo", 128, 10, 10, 128, 3, 1, 2},
        {"yolo", 96, 40, 40, 64, 1, 1, 2},   {"yolo", 64, 40, 40, 64, 3, 1, 4},   {"yolo", 384, 10, 10, 256, 1, 1, 2},
    };
    // Depthwise layers of MobileNetV2 / EfficientNet-B0 (224x224).
    const ConvCase dw_cases[] = {
        {"dw", 32, 112, 112, 32, 3, 1, 1},  {"dw", 96, 112, 112, 96, 3, 2, 1}, {"dw", 144, 56, 56, 144, 3, 1, 1},
        {"dw", 144, 56, 56, 144, 5, 2, 1},  {"dw", 240, 28, 28, 240, 5, 1, 1}, {"dw", 480, 14, 14, 480, 3, 1, 1},
        {"dw", 672, 14, 14, 672, 5, 1, 1},  {"dw", 1152, 7, 7, 1152, 5, 1, 1},
        // MobileNetV2's other shapes: stride 2 from L2-sized inputs, 28- to 7-wide rows.
        {"dw", 144, 56, 56, 144, 3, 2, 1},  {"dw", 192, 28, 28, 192, 3, 1, 1}, {"dw", 192, 28, 28, 192, 3, 2, 1},
        {"dw", 576, 14, 14, 576, 3, 2, 1},  {"dw", 960, 7, 7, 960, 3, 1, 1},
    };
    // Pointwise (1x1) layers of EfficientNet-B0 / MobileNetV2 (224x224): expansions from few
    // channels, projections to few, and the 7x7 head; few FMAs per output, so tile overheads show.
    const ConvCase pw_cases[] = {
        {"mb", 16, 112, 112, 96, 1, 1, 1}, {"mb", 24, 56, 56, 144, 1, 1, 2}, {"mb", 144, 56, 56, 24, 1, 1, 1},
        {"mb", 40, 28, 28, 240, 1, 1, 2},  {"mb", 240, 28, 28, 40, 1, 1, 1}, {"mb", 80, 14, 14, 480, 1, 1, 3},
        {"mb", 480, 14, 14, 112, 1, 1, 1}, {"mb", 1152, 7, 7, 320, 1, 1, 1}, {"mb", 320, 7, 7, 1280, 1, 1, 1},
        {"mb", 960, 7, 7, 160, 1, 1, 1},   {"mb", 160, 7, 7, 960, 1, 1, 1},   {"mb", 32, 112, 112, 16, 1, 1, 1},
    };
    double df = 0, ds = 0;
    for (const auto& c : dw_cases) bench_conv(c, par, reps, peak, df, ds, true);
    std::printf("depthwise weighted: %.1f GFLOP/s (%.3f ms)\n", df / ds * 1e-9, ds * 1e3);
    double pf = 0, ps = 0;
    for (const auto& c : pw_cases) bench_conv(c, par, reps, peak, pf, ps);
    std::printf("mobile pointwise weighted: %.1f%% of peak (%.3f ms)\n", 100 * pf / ps * 1e-9 / peak, ps * 1e3);
    if (only == "mobile") return 0;  // the depthwise and pointwise layers alone
    double rf = 0, rs = 0, yf = 0, ys = 0;
    for (const auto& c : cases) {
      if (std::strcmp(c.model, "r50") == 0) bench_conv(c, par, reps, peak, rf, rs);
      else bench_conv(c, par, reps, peak, yf, ys);
    }
    std::printf("conv weighted (best algorithm per layer, FLOPs counted as direct): ResNet-50 layers %.1f%% of peak (%.1f ms), YOLOv8n layers %.1f%% (%.1f ms)\n",
                100 * rf / rs * 1e-9 / peak, rs * 1e3, 100 * yf / ys * 1e-9 / peak, ys * 1e3);
  }
  return 0;
}
