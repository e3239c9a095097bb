// The CUDA spelling of the device kernels, run on the host (issue 17: testable without a GPU).
// The program DeviceModel builds for volta-cuda (cuda_prelude() + the device kernel form) is
// compiled by the host C++ compiler after an emulation header that spells CUDA's names in C++:
// each thread block's threads are host threads, __syncthreads() a barrier among them,
// __shared__ arrays function statics (one block runs at a time), blockIdx/threadIdx thread-locals.
// The kernels then run through the same DeviceModel as on a GPU and are checked against the
// reference interpreter.
//
// What this cannot catch: warp scheduling and anything that depends on it (there are no warp
// intrinsics in the kernels yet), the GPU memory model across blocks (blocks run one after
// another here), NVRTC-only spelling (the sm_70 compile test covers that), timing and resources
// (registers, shared memory: the ptxas report covers those), and fast-math differences of the
// device's libm.
#include <catch2/catch.hpp>

#include <barrier>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <set>
#include <fstream>
#include <thread>
#include <unistd.h>

#include "fusion/planner.h"
#include "fusion/target.h"
#include "graph/error.h"
#include "graph/interpreter.h"
#include "graph/zoo.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/device/device_model.h"
#include "tests/cpp/device/device_test_util.h"

using namespace nnfuse;
using namespace nnfuse::device;
using nnfuse::device_test::check_close;
using nnfuse::device_test::check_close_scaled;
using nnfuse::device_test::kTinyZoo;
using nnfuse::device_test::plan_for;
using nnfuse::device_test::ScopedEnv;

namespace {

// Spells the CUDA names cuda_prelude() and the kernels use, for a host C++ compiler.
const char* kEmulationHeader = R"(#include <cmath>
#include <cstring>
using namespace std;  // CUDA's float overloads (exp, tanh, erf, rint, ...) are std's here
struct nf_dim3 { unsigned x, y, z; };
static thread_local nf_dim3 threadIdx, blockIdx, blockDim;
#define __global__
#define __device__
#define __shared__ static
#define __restrict__ __restrict
static void (*nf_sync)(void);
static inline void __syncthreads() { nf_sync(); }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
extern "C" void nf_emu_set_sync(void (*f)(void)) { nf_sync = f; }
extern "C" void nf_emu_set_ids(unsigned t, unsigned b, unsigned n) { threadIdx = {t, 0, 0}; blockIdx = {b, 0, 0}; blockDim = {n, 0, 0}; }
// Tensor-core tiles: each thread holds the warp's whole 16 x 16 fragment (the hardware spreads it
// over the 32 lanes in an unspecified layout, which the kernels never read element-wise), so
// loads and products are computed by every lane alike and the store is lane 0's alone; the
// kernels' barrier after the store orders it before other lanes read the tile, as on a GPU.
#define NF_HOST_EMULATION
#define NF_ALIGN32 __attribute__((aligned(32)))
#define NF_TC_BOUNDS
typedef struct { float v[256]; } nf_frag_ab;
typedef struct { float v[256]; } nf_frag_c;
static inline unsigned short nf_f2h(float f) {  // round to nearest even, as cvt.rn.f16.f32
  unsigned x; memcpy(&x, &f, 4);
  const unsigned sign = (x >> 16) & 0x8000u, man = x & 0x7fffffu;
  const int exp = int((x >> 23) & 0xffu), e = exp - 112;
  if (exp == 255) return (unsigned short)(sign | 0x7c00u | (man ? 0x200u : 0u));
  if (e >= 31) return (unsigned short)(sign | 0x7c00u);
  unsigned h, rem, halfway;
  if (e <= 0) {  // a subnormal half (or zero)
    if (e < -10) return (unsigned short)sign;
    const int shift = 14 - e;
    h = (man | 0x800000u) >> shift, rem = (man | 0x800000u) & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  } else {
    h = (unsigned(e) << 10) | (man >> 13), rem = man & 0x1fffu, halfway = 0x1000u;
  }
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;  // a carry may round up into the exponent
  return (unsigned short)(sign | h);
}
static inline float nf_h2f(unsigned short h) {
  const int e = (h >> 10) & 0x1f;
  const unsigned m = h & 0x3ffu;
  const float f = e == 0 ? ldexp(float(m), -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(float(m | 0x400u), e - 25);
  return (h & 0x8000u) ? -f : f;
}
static inline void nf_mma_zero(nf_frag_c* c) { for (int i = 0; i < 256; ++i) c->v[i] = 0.0f; }
static inline void nf_mma_load_a(nf_frag_ab* f, const unsigned short* p, int ld) {
  for (int i = 0; i < 256; ++i) f->v[i] = nf_h2f(p[(i / 16) * ld + i % 16]);
}
static inline void nf_mma_load_b(nf_frag_ab* f, const unsigned short* p, int ld) { nf_mma_load_a(f, p, ld); }
static inline void nf_mma(nf_frag_c* c, const nf_frag_ab* a, const nf_frag_ab* b) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c->v[i * 16 + j];
      for (int k = 0; k < 16; ++k) s += a->v[i * 16 + k] * b->v[k * 16 + j];
      c->v[i * 16 + j] = s;
    }
}
static inline void nf_mma_store(float* p, const nf_frag_c* c, int ld) {
  if (threadIdx.x % 32 != 0) return;
  for (int i = 0; i < 256; ++i) p[(i / 16) * ld + i % 16] = c->v[i];
}
)";

std::barrier<>* g_block_barrier = nullptr;  // the running launch's barrier (one launch at a time)
void block_sync() { g_block_barrier->arrive_and_wait(); }

class CudaEmulationApi final : public DeviceApi {
 public:
  CudaEmulationApi() {
    dir_ = std::filesystem::temp_directory_path() / ("nnfuse_cuda_emu_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
  }
  ~CudaEmulationApi() override {
    if (lib_) ::dlclose(lib_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string backend() const override { return "cuda-emulation"; }
  nlohmann::json device_info() const override { return {{"name", "CUDA emulation on the host"}}; }
  std::string prelude() const override { return std::string(kEmulationHeader) + cuda_prelude(); }
  std::string build_log() const override { return log_; }
  bool tensor_cores() const override { return true; }  // the header's nf_mma_* helpers

  // Compiles the program with one trampoline per kernel, which takes its parameters as an array
  // of 64-bit words (every kernel parameter is a pointer or an i64: device_program.cpp).
  void build(const std::string& source, const std::vector<std::string>& kernels) override {
    std::string text = source;
    std::set<std::string> seen;  // stages that share an entry point name it once each
    for (const auto& name : kernels) {
      if (!seen.insert(name).second) continue;
      std::string head = "NF_KERNEL void " + name + "(";
      if (source.find(head) == std::string::npos) head = "NF_KERNEL void NF_TC_BOUNDS " + name + "(";
      const size_t at = source.find(head);
      if (at == std::string::npos) fail(ErrorKind::Runtime, "emulation: kernel " + name + " not in the program");
      const size_t end = source.find(')', at);
      std::string call;
      size_t start = at + head.size();
      for (int i = 0; start < end; ++i) {
        size_t comma = source.find(',', start);
        if (comma == std::string::npos || comma > end) comma = end;
        const std::string param = source.substr(start, comma - start);
        call += std::string(i ? ", " : "") + (param.find('*') != std::string::npos ? "(u8*)a[" : "(i64)a[") + std::to_string(i) + "]";
        start = comma + 1;
      }
      text += "extern \"C\" void " + name + "_emu(const unsigned long long* a) { " + name + "(" + call + "); }\n";
    }
    const auto src = dir_ / "program.cpp", so = dir_ / ("program" + std::to_string(builds_++) + ".so"), log = dir_ / "build.log";
    std::ofstream(src) << text;
    const char* cxx = std::getenv("NNFUSE_CXX");
    const std::string cmd = std::string(cxx && *cxx ? cxx : "g++") + " -std=c++17 -O1 -shared -fPIC -w -o " + so.string() + " " + src.string() +
                            " > " + log.string() + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream in(log);
    log_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (rc != 0) fail(ErrorKind::Runtime, "emulation: the host compiler refused the CUDA program:\n" + log_.substr(0, 4000));
    if (lib_) ::dlclose(lib_);
    lib_ = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib_) fail(ErrorKind::Runtime, std::string("emulation: dlopen: ") + ::dlerror());
    auto sym = [&](const std::string& n) {
      void* p = ::dlsym(lib_, n.c_str());
      if (!p) fail(ErrorKind::Runtime, "emulation: no symbol " + n);
      return p;
    };
    reinterpret_cast<void (*)(void (*)(void))>(sym("nf_emu_set_sync"))(&block_sync);
    set_ids_ = reinterpret_cast<void (*)(unsigned, unsigned, unsigned)>(sym("nf_emu_set_ids"));
    fns_.clear();
    for (const auto& name : kernels) fns_.push_back(reinterpret_cast<void (*)(const unsigned long long*)>(sym(name + "_emu")));
  }

  DeviceMemory alloc(int64_t bytes) override {
    auto* p = static_cast<uint8_t*>(std::calloc(size_t(std::max<int64_t>(bytes, 1)), 1));
    return {reinterpret_cast<uint64_t>(p), bytes};
  }
  void release(DeviceMemory m) override { std::free(reinterpret_cast<void*>(m.handle)); }
  void upload(DeviceMemory dst, int64_t offset, const void* src, int64_t bytes) override {
    REQUIRE(offset + bytes <= dst.bytes);
    if (bytes) std::memcpy(reinterpret_cast<uint8_t*>(dst.handle) + offset, src, size_t(bytes));
  }
  void download(DeviceMemory src, int64_t offset, void* dst, int64_t bytes) override {
    REQUIRE(offset + bytes <= src.bytes);
    if (bytes) std::memcpy(dst, reinterpret_cast<const uint8_t*>(src.handle) + offset, size_t(bytes));
  }
  void fill_zero(DeviceMemory m) override { std::memset(reinterpret_cast<void*>(m.handle), 0, size_t(m.bytes)); }

  // Capture as a CUDA graph would: launches recorded, then replayed in order (DeviceModel's graph
  // path; what a real graph adds, one submission, has nothing to check here).
  bool begin_capture() override {
    recording_ = true;
    recorded_.clear();
    return true;
  }
  void end_capture() override { recording_ = false; }
  void replay_capture() override {
    for (auto& l : recorded_) run(l.kernel, l.args, l.groups, l.local);
  }

  void launch(int kernel, const std::vector<KernelArg>& args, int64_t groups, int local) override {
    if (recording_) recorded_.push_back({kernel, args, groups, local});
    else run(kernel, args, groups, local);
  }

  // The block's `local` threads run it together; blocks run one after another (a barrier at the
  // end of each keeps the function-static __shared__ arrays to one block at a time).
  void run(int kernel, const std::vector<KernelArg>& args, int64_t groups, int local) {
    std::vector<unsigned long long> words;
    for (const KernelArg& a : args) {
      if (a.kind == KernelArg::Buffer) words.push_back(a.mem.handle);
      words.push_back(static_cast<unsigned long long>(a.value));
    }
    std::barrier<> bar(local);
    g_block_barrier = &bar;
    auto fn = fns_.at(size_t(kernel));
    std::vector<std::thread> threads;
    for (int t = 0; t < local; ++t)
      threads.emplace_back([&, t] {
        for (int64_t b = 0; b < groups; ++b) {
          set_ids_(unsigned(t), unsigned(b), unsigned(local));
          fn(words.data());
          bar.arrive_and_wait();
        }
      });
    for (auto& th : threads) th.join();
    g_block_barrier = nullptr;
  }
  void finish() override {}

 private:
  struct Launch {
    int kernel;
    std::vector<KernelArg> args;
    int64_t groups;
    int local;
  };
  bool recording_ = false;
  std::vector<Launch> recorded_;
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  void* lib_ = nullptr;
  int builds_ = 0;
  std::string log_;
  void (*set_ids_)(unsigned, unsigned, unsigned) = nullptr;
  std::vector<void (*)(const unsigned long long*)> fns_;
};

}  // namespace

TEST_CASE("cuda emulation: every tiny zoo model's CUDA C runs on the host and matches the reference", "[device][cuda]") {
  for (const std::string& name : kTinyZoo) {
    Model m = build_zoo_model(name, ZooOptions{});
    FusionPlan plan = plan_for(m.graph, "volta-cuda");
    auto dm = DeviceModel::build(m.graph, &plan, std::make_unique<CudaEmulationApi>(), "volta-cuda");
    INFO(name << ": " << dm->info().dump());
    CHECK(dm->info()["kernels"].get<int>() > 0);
    // The first run records the launches (no host stage) and replays them, the second replays.
    for (int run = 0; run < 2; ++run) {
      TensorMap feeds = random_feeds(m.graph, 9 + run);
      check_close(dm->run(feeds), run_reference(m.graph, feeds), name + " run " + std::to_string(run));
    }
    CHECK(dm->info()["graph_replay"].get<bool>() == (dm->info()["host_stages"].get<int>() == 0));
  }
}

TEST_CASE("cuda emulation: tiled kernels with 4 x 4 register blocks, split-K and barriers match the reference", "[device][cuda]") {
  // BERT-tiny's products and ResNet-tiny's convs at R = 4 and k tiles of 8: several
  // __syncthreads per block, partial tiles, split-K sums.
  const ScopedEnv rb("NNFUSE_DEVICE_REGISTER_BLOCK", "4"), kt("NNFUSE_DEVICE_K_TILE", "8"), sk("NNFUSE_DEVICE_SPLIT_K", "64");
  for (const char* name : {"bert_tiny", "resnet_tiny"}) {
    Model m = build_zoo_model(name, ZooOptions{});
    FusionPlan plan = plan_for(m.graph, "volta-cuda");
    auto dm = DeviceModel::build(m.graph, &plan, std::make_unique<CudaEmulationApi>(), "volta-cuda");
    INFO(name << ": " << dm->info().dump());
    CHECK(dm->info()["register_blocks"].contains("4"));
    const auto forms = dm->info()["kernel_forms"];
    CHECK((forms.contains("tiled_gemm_split_sum") || forms.contains("implicit_gemm_conv_split_sum")));
    TensorMap feeds = random_feeds(m.graph, 10);
    check_close(dm->run(feeds), run_reference(m.graph, feeds), name);
  }
}

TEST_CASE("cuda emulation: fp16 tensor-core tiles match the reference within fp16 rounding", "[device][cuda]") {
  // Every GEMM and conv of 8+ output channels per group on the nf_mma_* helpers (emulated above:
  // fp16 operands, fp32 products), with and without split-K.
  const ScopedEnv all("NNFUSE_DEVICE_TENSOR_CORE_GROUPS", "0");  // the tiny models' products are all small
  for (const char* split : {"512", "0"}) {
    const ScopedEnv sk("NNFUSE_DEVICE_SPLIT_K", split);
    for (const char* name : {"bert_tiny", "resnet_tiny", "mobilenet_tiny"}) {
      Model m = build_zoo_model(name, ZooOptions{});
      FusionPlan plan = plan_for(m.graph, "volta-cuda");
      auto dm = DeviceModel::build(m.graph, &plan, std::make_unique<CudaEmulationApi>(), "volta-cuda", "fp16");
      const auto info = dm->info();
      INFO(name << " split-K " << split << ": " << info.dump());
      CHECK(info["tensor_core_kernels"].get<int>() > 0);
      TensorMap feeds = random_feeds(m.graph, 11);
      const TensorMap want = run_reference(m.graph, feeds);
      const TensorMap got = dm->run(feeds);
      check_close_scaled(got, want, name, 2e-2);
      // fp16 operands do change the results: the tiles are not fp32 ones under another name.
      bool differs = false;
      for (auto& [n, w] : want)
        if (w.dtype() == DType::Float32)
          for (int64_t i = 0; i < w.numel() && !differs; ++i) differs = got.at(n).data<float>()[i] != w.data<float>()[i];
      CHECK(differs);
    }
  }
}
