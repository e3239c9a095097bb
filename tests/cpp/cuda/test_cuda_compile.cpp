// The CUDA backend (kernels/cuda): NVRTC compile checks that need no GPU, and, where a CUDA
// device is present, a program built and run through the DeviceApi.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <thread>
#include <vector>

#include <unistd.h>

#include "graph/error.h"
#include "kernels/cuda/cuda_api.h"

using namespace nnfuse;
using namespace nnfuse::device;

namespace {

// Uses every prelude macro: a work-group array, a barrier, a helper function, float math.
const char* kMixKernel = R"(
NF_FN float gelu(float x) { return 0.5f * x * (1.0f + erf(x * 0.70710678f)); }
NF_KERNEL void nf_mix(NF_GLOBAL u8* p0, i64 o0, NF_GLOBAL u8* p1, i64 o1, NF_GLOBAL u8* p2, i64 o2, i64 n) {
  NF_LOCAL_ARRAY float tile[256];
  const float* NF_RESTRICT a = (const float*)(p0 + o0);
  const float* NF_RESTRICT b = (const float*)(p1 + o1);
  float* NF_RESTRICT y = (float*)(p2 + o2);
  i64 i = NF_GID;
  tile[NF_LID] = i < n ? a[i] : 0.0f;
  NF_SYNC();
  if (i >= n) return;
  float v = tile[(NF_LID + 1) % NF_LSIZE];
  float r = exp(v) + tanh(b[i]) + gelu(v) + sqrt(fabs(v)) + floor(v) * ceil(v) + rint(v) + trunc(v);
  r += sin(v) * cos(v) + pow(fabs(v), 0.5f) + log(fabs(v) + 1.0f) + (float)NF_GROUP;
  y[i] = fmin(fmax(r, -NF_INF), NF_INF) + (isnan(r) ? NF_NAN : 0.0f);
}
)";

// The GPU test's program: two kernels, buffers at byte offsets, an Int64 argument.
const char* kAddKernels = R"(
NF_KERNEL void nf_add(NF_GLOBAL u8* p0, i64 o0, NF_GLOBAL u8* p1, i64 o1, NF_GLOBAL u8* p2, i64 o2, i64 n) {
  i64 i = NF_GID;
  if (i < n) ((float*)(p2 + o2))[i] = ((const float*)(p0 + o0))[i] + ((const float*)(p1 + o1))[i];
}
NF_KERNEL void nf_scale(NF_GLOBAL u8* p0, i64 o0, i64 k, i64 n) {
  i64 i = NF_GID;
  if (i < n) ((float*)(p0 + o0))[i] *= (float)k;
}
)";

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The architecture the compile checks use: sm_70 (Volta) where an NVRTC 12 is found, else sm_80
// for an NVRTC 13 alone; "" without NVRTC.
std::string check_arch() {
  for (const char* a : {"sm_70", "sm_80"})
    if (cuda_nvrtc_available(a)) return a;
  return "";
}

}  // namespace

TEST_CASE("cuda_prelude spells every device macro", "[cuda]") {
  std::string p = cuda_prelude();
  for (const char* m : {"NF_KERNEL", "NF_FN", "NF_GLOBAL", "NF_LOCAL_ARRAY", "NF_GID", "NF_LID", "NF_GROUP", "NF_LSIZE",
                        "NF_SYNC()", "NF_INF", "NF_NAN", "NF_RESTRICT", "typedef long long i64"})
    CHECK(has(p, m));
  CHECK(has(p, "extern \"C\" __global__"));
}

TEST_CASE("parse_ptxas_log reads registers and spills per entry", "[cuda]") {
  // NVRTC 12.9's format; "helper" is a non-inlined device function (not an entry).
  std::string log =
      "nvrtc: warning: Architectures prior to '<compute/sm>_75' are deprecated\n"
      "ptxas info    : 24 bytes gmem, 8 bytes cmem[4]\n"
      "ptxas info    : Compiling entry function 'nf_a' for 'sm_70'\n"
      "ptxas info    : Function properties for nf_a\n"
      "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 24 registers, used 1 barriers, 8 bytes cumulative stack size, 1024 bytes smem, 408 bytes "
      "cmem[0], 8 bytes cmem[2]\n"
      "ptxas info    : Compile time = 13.648 ms\n"
      "ptxas info    : Function properties for helper\n"
      "ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Compiling entry function 'nf_b' for 'sm_70'\n"
      "ptxas info    : Function properties for nf_b\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 8 registers, used 0 barriers, 368 bytes cmem[0]\n"
      "ptxas info    : Compile time = 2.146 ms\n";
  auto ks = parse_ptxas_log(log);
  REQUIRE(ks.size() == 2);
  CHECK(ks[0].name == "nf_a");
  CHECK(ks[0].registers == 24);
  CHECK(ks[0].shared_bytes == 1024);
  CHECK(ks[0].stack_bytes == 8);
  CHECK(ks[0].spill_stores == 4);
  CHECK(ks[0].spill_loads == 12);
  CHECK(ks[1].name == "nf_b");
  CHECK(ks[1].registers == 8);
  CHECK(ks[1].shared_bytes == 0);
  CHECK(ks[1].stack_bytes == 0);
}

TEST_CASE("cuda_compile_check compiles a prelude kernel for sm_70", "[cuda]") {
  std::string src = cuda_prelude() + kMixKernel;
  CHECK_THROWS_MATCHES(cuda_compile_check(src, "volta"), Error,
                       Catch::Predicate<Error>([](const Error& e) { return e.kind() == ErrorKind::Invalid; }));
  if (!cuda_nvrtc_available("sm_70")) {
    // No NVRTC here that targets Volta: the check must say so, as Unsupported.
    try {
      cuda_compile_check(src, "sm_70");
      FAIL("cuda_compile_check succeeded without an NVRTC for sm_70");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::Unsupported);
      CHECK(has(e.what(), "NVRTC"));
    }
  }
  const std::string arch = check_arch();
  if (arch.empty()) return;
  CudaCompileReport r = cuda_compile_check(src, arch);
  INFO(r.log);
  CHECK(r.arch == arch);
  CHECK(has(r.nvrtc, "nvrtc"));
  REQUIRE(r.kernels.size() == 1);
  const CudaKernelReport& k = r.kernels[0];
  CHECK(k.name == "nf_mix");
  CHECK(k.registers > 0);
  CHECK(k.registers <= 255);
  CHECK(k.shared_bytes == 256 * 4);
  CHECK(k.spill_stores == 0);
  CHECK(k.spill_loads == 0);
  CHECK(has(r.log, "Compiling entry function 'nf_mix'"));
  CHECK(r.log.find('\0') == std::string::npos);
  CHECK(r.ms > 0);
  nlohmann::json j = to_json(r);
  CHECK(j["kernels"][0]["name"] == "nf_mix");
  CHECK(j["arch"] == arch);
}

TEST_CASE("cuda_compile_check reports the compiler's message", "[cuda]") {
  const std::string arch = check_arch();
  if (arch.empty()) return;  // covered by the Unsupported check above
  std::string src = cuda_prelude() + "NF_KERNEL void nf_bad(NF_GLOBAL u8* p0, i64 o0) { float x = undeclared_name + 1; }\n";
  try {
    cuda_compile_check(src, arch);
    FAIL("a kernel with an error compiled");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Runtime);
    CHECK(has(e.what(), "NVRTC"));
    CHECK(has(e.what(), "undeclared_name"));
  }
}

TEST_CASE("make_cuda_api runs a kernel or names what is missing", "[cuda]") {
  std::unique_ptr<DeviceApi> api;
  try {
    api = make_cuda_api();
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == ErrorKind::Unsupported);
    CHECK((has(e.what(), "libcuda") || has(e.what(), "device") || has(e.what(), "NVRTC")));
    // A machine with an NVIDIA GPU and NVRTC must get a working backend.
    CHECK_FALSE((std::filesystem::exists("/dev/nvidiactl") && std::filesystem::exists("/dev/nvidia0") &&
                 cuda_nvrtc_available()));
    return;
  }
  CHECK(api->backend() == "cuda");
  nlohmann::json info = api->device_info();
  INFO(info.dump());
  CHECK(info["arch"].get<std::string>().rfind("sm_", 0) == 0);
  CHECK(info["multiprocessors"].get<int>() > 0);
  CHECK(has(info["nvrtc"].get<std::string>(), "nvrtc"));

  // A private program cache: the first build compiles (and logs), the second loads the cubin.
  const std::string cache = "/tmp/nnfuse_cuda_test_cache_" + std::to_string(::getpid());
  ::setenv("NNFUSE_CACHE_DIR", cache.c_str(), 1);
  api->build(api->prelude() + kAddKernels, {"nf_add", "nf_scale"});
  CHECK_FALSE(api->build_cached());
  auto reported = parse_ptxas_log(api->build_log());
  CHECK(reported.size() == 2);
  api->build(api->prelude() + kAddKernels, {"nf_add", "nf_scale"});
  CHECK(api->build_cached());
  ::unsetenv("NNFUSE_CACHE_DIR");
  std::filesystem::remove_all(cache);

  const int64_t n = 100003;  // not a multiple of the block size
  std::vector<float> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.25f * float(i % 977) - 3.0f;
    b[i] = 1.5f - 0.125f * float(i % 331);
  }
  // a and b share one buffer (b at a byte offset); y starts 64 bytes into its own.
  const int64_t bytes = n * 4, yoff = 64;
  DeviceMemory ab = api->alloc(2 * bytes), y = api->alloc(yoff + bytes);
  api->upload(ab, 0, a.data(), bytes);
  api->upload(ab, bytes, b.data(), bytes);
  api->fill_zero(y);
  const int local = 128;
  const int64_t groups = (n + local - 1) / local;
  KernelArg n_arg{KernelArg::Int64, {}, n};
  api->launch(0, {{KernelArg::Buffer, ab, 0}, {KernelArg::Buffer, ab, bytes}, {KernelArg::Buffer, y, yoff}, n_arg}, groups,
              local);
  api->launch(1, {{KernelArg::Buffer, y, yoff}, {KernelArg::Int64, {}, 3}, n_arg}, groups, local);
  api->finish();

  std::vector<float> got(n + yoff / 4, -1.0f);
  // From another thread: every entry point makes the context current itself.
  std::thread([&] { api->download(y, 0, got.data(), yoff + bytes); }).join();
  for (int64_t i = 0; i < yoff / 4; ++i) REQUIRE(got[i] == 0.0f);  // fill_zero, untouched by the kernels
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i)
    if (got[yoff / 4 + i] != (a[i] + b[i]) * 3.0f) ++bad;
  CHECK(bad == 0);

  CHECK_THROWS_AS(api->launch(2, {}, 1, 1), Error);
  CHECK_THROWS_AS(api->build(api->prelude() + kAddKernels, {"nf_missing"}), Error);
  api->release(ab);
  api->release(y);
}
