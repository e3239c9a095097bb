#include "kernels/cuda/cuda_api.h"
#include "kernels/device/program_cache.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <regex>
#include <sstream>

#include "graph/error.h"

namespace nnfuse::device {

namespace {

// ---- Loading shared libraries -------------------------------------------------------------------

// Resolves the first of `names` that `lib` exports into `f`; false when none is.
template <class F>
bool resolve(void* lib, F& f, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (void* s = ::dlsym(lib, n)) {
      f = reinterpret_cast<F>(s);
      return true;
    }
  return false;
}

// The file a dlopen handle came from (a bare soname resolves through the loader's search path).
std::string loaded_path(void* lib, const std::string& fallback) {
  link_map* lm = nullptr;
  if (::dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name) return lm->l_name;
  return fallback;
}

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// ---- NVRTC --------------------------------------------------------------------------------------

using nvrtcProgram = void*;

// One loaded NVRTC library (several may be: NVRTC 12 for sm_70, NVRTC 13 for newer devices).
struct Nvrtc {
  void* lib = nullptr;
  std::string path;
  int major = 0, minor = 0;
  std::vector<int> archs;  // the sm_XX it targets (empty: unknown, try)
  const char* (*GetErrorString)(int) = nullptr;
  int (*Version)(int*, int*) = nullptr;
  int (*GetNumSupportedArchs)(int*) = nullptr;
  int (*GetSupportedArchs)(int*) = nullptr;
  int (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  int (*CompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  int (*DestroyProgram)(nvrtcProgram*) = nullptr;
  int (*GetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  int (*GetProgramLog)(nvrtcProgram, char*) = nullptr;
  int (*GetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  int (*GetCUBIN)(nvrtcProgram, char*) = nullptr;
  int (*GetPTXSize)(nvrtcProgram, size_t*) = nullptr;
  int (*GetPTX)(nvrtcProgram, char*) = nullptr;

  bool targets(int sm) const { return sm <= 0 || archs.empty() || std::count(archs.begin(), archs.end(), sm) > 0; }
  std::string version() const { return std::to_string(major) + "." + std::to_string(minor); }
  std::string describe() const { return path + " (" + version() + ")"; }
};

// Opens the NVRTC at `name` (a path or a soname); null (and a reason appended to `why`) if it
// cannot be loaded or lacks an entry point.
std::unique_ptr<Nvrtc> open_nvrtc(const std::string& name, std::string& why) {
  void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    if (name.find('/') != std::string::npos) {  // a bare soname that is absent is not worth a line
      const char* e = ::dlerror();
      why += "\n  " + (e ? std::string(e) : name + ": dlopen failed");
    }
    return nullptr;
  }
  auto nv = std::make_unique<Nvrtc>();
  nv->lib = lib;
  nv->path = loaded_path(lib, name);
  bool ok = resolve(lib, nv->GetErrorString, {"nvrtcGetErrorString"}) && resolve(lib, nv->Version, {"nvrtcVersion"}) &&
            resolve(lib, nv->CreateProgram, {"nvrtcCreateProgram"}) && resolve(lib, nv->CompileProgram, {"nvrtcCompileProgram"}) &&
            resolve(lib, nv->DestroyProgram, {"nvrtcDestroyProgram"}) &&
            resolve(lib, nv->GetProgramLogSize, {"nvrtcGetProgramLogSize"}) &&
            resolve(lib, nv->GetProgramLog, {"nvrtcGetProgramLog"}) && resolve(lib, nv->GetCUBINSize, {"nvrtcGetCUBINSize"}) &&
            resolve(lib, nv->GetCUBIN, {"nvrtcGetCUBIN"}) && resolve(lib, nv->GetPTXSize, {"nvrtcGetPTXSize"}) &&
            resolve(lib, nv->GetPTX, {"nvrtcGetPTX"});
  if (!ok) {
    why += "\n  " + nv->path + ": not an NVRTC with cubin output (NVRTC >= 11.1 needed)";
    ::dlclose(lib);
    return nullptr;
  }
  nv->Version(&nv->major, &nv->minor);
  int n = 0;
  if (resolve(lib, nv->GetNumSupportedArchs, {"nvrtcGetNumSupportedArchs"}) &&
      resolve(lib, nv->GetSupportedArchs, {"nvrtcGetSupportedArchs"}) && nv->GetNumSupportedArchs(&n) == 0 && n > 0) {
    nv->archs.resize(n);
    if (nv->GetSupportedArchs(nv->archs.data()) != 0) nv->archs.clear();
  }
  return nv;
}

// The lib/ folders of the NVRTC pip wheels the default python3 can import; empty without python.
std::vector<std::string> python_wheel_dirs() {
  const char* cmd =
      "python3 -c 'import importlib, os\n"
      "for m in (\"nvidia.cuda_nvrtc\", \"nvidia.cu13\"):\n"
      "  try: ps = list(importlib.import_module(m).__path__)\n"
      "  except Exception: continue\n"
      "  for p in ps:\n"
      "    d = os.path.join(p, \"lib\")\n"
      "    if os.path.isdir(d): print(d)' 2>/dev/null";
  std::vector<std::string> dirs;
  FILE* p = ::popen(cmd, "r");
  if (!p) return dirs;
  std::string out;
  char buf[1024];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  std::istringstream lines(out);
  for (std::string l; std::getline(lines, l);)
    if (!l.empty()) dirs.push_back(l);
  return dirs;
}

// Every place NVRTC may be, in the order of the header's comment.
std::vector<std::string> nvrtc_candidates() {
  std::vector<std::string> c;
  if (const char* e = std::getenv("NNFUSE_NVRTC"); e && *e) c.push_back(e);
  for (const std::string& d : python_wheel_dirs())
    for (const char* f : {"libnvrtc.so.12", "libnvrtc.so.13"})
      if (file_exists(d + "/" + f)) c.push_back(d + "/" + f);
  for (const char* s : {"libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"}) c.push_back(s);
  for (const char* d : {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"})
    for (const char* f : {"libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"})
      if (file_exists(std::string(d) + "/" + f)) c.push_back(std::string(d) + "/" + f);
  return c;
}

// The NVRTC libraries, opened lazily in search order and kept for the process's lifetime.
struct NvrtcRegistry {
  std::mutex mu;
  bool listed = false;
  std::vector<std::string> candidates;
  size_t next = 0;                            // candidates[next..] not tried yet
  std::vector<std::unique_ptr<Nvrtc>> libs;  // the ones that loaded
  std::string why;                           // why the others did not
};

// The first NVRTC that targets sm_`sm` (any for sm <= 0). Throws Unsupported.
const Nvrtc& nvrtc_for(int sm) {
  static NvrtcRegistry reg;
  std::lock_guard<std::mutex> lock(reg.mu);
  if (!reg.listed) {
    reg.candidates = nvrtc_candidates();
    reg.listed = true;
  }
  for (size_t i = 0;;) {
    for (; i < reg.libs.size(); ++i)
      if (reg.libs[i]->targets(sm)) return *reg.libs[i];
    if (reg.next >= reg.candidates.size()) break;
    std::unique_ptr<Nvrtc> nv = open_nvrtc(reg.candidates[reg.next++], reg.why);
    if (!nv) continue;
    if (std::any_of(reg.libs.begin(), reg.libs.end(), [&](const auto& l) { return l->lib == nv->lib; }))
      ::dlclose(nv->lib);  // the same file under another name: drop the extra reference
    else
      reg.libs.push_back(std::move(nv));
  }
  if (reg.libs.empty())
    fail(ErrorKind::Unsupported,
         "NVRTC not found (pip install nvidia-cuda-nvrtc-cu12, or set NNFUSE_NVRTC=/path/libnvrtc.so.12)" + reg.why);
  std::string found;
  for (const auto& l : reg.libs) found += (found.empty() ? "" : ", ") + l->describe();
  fail(ErrorKind::Unsupported, "no NVRTC found that targets sm_" + std::to_string(sm) + " (found " + found +
                                   "; NVRTC 13 dropped sm_70: pip install nvidia-cuda-nvrtc-cu12, or set NNFUSE_NVRTC)");
}

// "sm_70" / "sm_90a" -> 70 / 90. Throws Invalid.
int parse_arch(const std::string& arch) {
  std::smatch m;
  if (!std::regex_match(arch, m, std::regex(R"(sm_(\d+)[a-z]?)")))
    fail(ErrorKind::Invalid, "CUDA architecture '" + arch + "' is not of the form sm_XX");
  return std::stoi(m[1]);
}

struct NvrtcOutput {
  std::string image;  // cubin, or PTX (NUL-terminated)
  std::string log;
};

constexpr int NVRTC_ERROR_INVALID_OPTION = 5;

// Compiles `source` for `arch`: "sm_XX" gives a cubin (with ptxas's -v report in the log),
// "compute_XX" PTX. Throws Runtime with the log on a compile error.
// The options that decide the binary besides the architecture (also part of the cache key).
constexpr const char* kNvrtcStd = "--std=c++17";

NvrtcOutput nvrtc_compile(const Nvrtc& nv, const std::string& source, const std::string& arch) {
  bool cubin = arch.rfind("sm_", 0) == 0;
  // No --use_fast_math: results must stay close to the CPU's (exact division, IEEE expf/erff).
  // --no-cache: NVRTC may answer a program it compiled before from its disk cache (seen with
  // NVRTC 13.0 on an H200 machine: 14 ms instead of 130), and then the log has no ptxas report.
  std::vector<std::string> opts = {"--gpu-architecture=" + arch, kNvrtcStd, "--no-cache"};
  if (cubin) opts.push_back("--ptxas-options=-v");
  for (;;) {
    nvrtcProgram prog = nullptr;
    if (int rc = nv.CreateProgram(&prog, source.c_str(), "nnfuse.cu", 0, nullptr, nullptr))
      fail(ErrorKind::Runtime, std::string("NVRTC: nvrtcCreateProgram failed: ") + nv.GetErrorString(rc));
    struct Guard {
      const Nvrtc& nv;
      nvrtcProgram& p;
      ~Guard() { nv.DestroyProgram(&p); }
    } guard{nv, prog};
    std::vector<const char*> argv;
    for (const std::string& o : opts) argv.push_back(o.c_str());
    int rc = nv.CompileProgram(prog, int(argv.size()), argv.data());
    auto no_cache = std::find(opts.begin(), opts.end(), "--no-cache");
    if (rc == NVRTC_ERROR_INVALID_OPTION && no_cache != opts.end()) {  // an NVRTC without a cache
      opts.erase(no_cache);
      continue;
    }
    NvrtcOutput out;
    size_t n = 0;
    if (nv.GetProgramLogSize(prog, &n) == 0 && n > 1) {
      out.log.resize(n);
      nv.GetProgramLog(prog, out.log.data());
      while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();  // the size counts NULs
    }
    if (rc)
      fail(ErrorKind::Runtime, "NVRTC: compiling for " + arch + " with " + nv.describe() + " failed (" +
                                   nv.GetErrorString(rc) + "):\n" + out.log.substr(0, 4000));
    n = 0;
    if ((cubin ? nv.GetCUBINSize(prog, &n) : nv.GetPTXSize(prog, &n)) != 0 || n == 0)
      fail(ErrorKind::Runtime, "NVRTC: " + nv.describe() + " produced no " + (cubin ? "cubin" : "PTX") + " for " + arch);
    out.image.resize(n);
    (cubin ? nv.GetCUBIN : nv.GetPTX)(prog, out.image.data());
    return out;
  }
}

// ---- The CUDA driver API ------------------------------------------------------------------------

using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;
using CUgraph = void*;
using CUgraphExec = void*;

constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;

struct Driver {
  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*DriverGetVersion)(int*) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*DeviceTotalMem)(size_t*, CUdevice) = nullptr;
  CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*PrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*CtxSynchronize)() = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleUnload)(CUmodule) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**) = nullptr;
  CUresult (*MemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*MemFree)(CUdeviceptr) = nullptr;
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t) = nullptr;
  // Graphs (CUDA 11.4+; optional: without them every run launches kernel by kernel).
  CUresult (*StreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*StreamDestroy)(CUstream) = nullptr;
  CUresult (*StreamBeginCapture)(CUstream, int) = nullptr;
  CUresult (*StreamEndCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*GraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*GraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*GraphExecDestroy)(CUgraphExec) = nullptr;
  CUresult (*GraphDestroy)(CUgraph) = nullptr;
  bool graphs() const {
    return StreamCreate && StreamDestroy && StreamBeginCapture && StreamEndCapture && GraphInstantiate && GraphLaunch && GraphExecDestroy &&
           GraphDestroy;
  }

  std::string error(CUresult r) const {
    const char* s = nullptr;
    if (GetErrorString) GetErrorString(r, &s);
    return s ? s : "CUDA error " + std::to_string(r);
  }
  void check(CUresult r, const char* what) const {
    if (r != 0) fail(ErrorKind::Runtime, std::string("CUDA: ") + what + " failed: " + error(r));
  }
};

// libcuda.so.1, loaded and initialised once per process. Throws Unsupported.
const Driver& driver() {
  static const Driver d = [] {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) fail(ErrorKind::Unsupported, "volta-cuda: libcuda.so.1 not found (no NVIDIA driver on this machine)");
    Driver d;
    std::string missing;
    auto need = [&](auto& f, std::initializer_list<const char*> names) {
      if (!resolve(lib, f, names)) missing += std::string(missing.empty() ? "" : ", ") + *names.begin();
    };
    need(d.Init, {"cuInit"});
    need(d.DriverGetVersion, {"cuDriverGetVersion"});
    need(d.GetErrorString, {"cuGetErrorString"});
    need(d.DeviceGetCount, {"cuDeviceGetCount"});
    need(d.DeviceGet, {"cuDeviceGet"});
    need(d.DeviceGetName, {"cuDeviceGetName"});
    need(d.DeviceGetAttribute, {"cuDeviceGetAttribute"});
    need(d.DeviceTotalMem, {"cuDeviceTotalMem_v2"});
    need(d.PrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"});
    need(d.PrimaryCtxRelease, {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"});
    need(d.CtxSetCurrent, {"cuCtxSetCurrent"});
    need(d.CtxSynchronize, {"cuCtxSynchronize"});
    need(d.ModuleLoadData, {"cuModuleLoadData"});
    need(d.ModuleUnload, {"cuModuleUnload"});
    need(d.ModuleGetFunction, {"cuModuleGetFunction"});
    need(d.LaunchKernel, {"cuLaunchKernel"});
    need(d.MemAlloc, {"cuMemAlloc_v2"});
    need(d.MemFree, {"cuMemFree_v2"});
    need(d.MemcpyHtoD, {"cuMemcpyHtoD_v2"});
    need(d.MemcpyDtoH, {"cuMemcpyDtoH_v2"});
    need(d.MemsetD8, {"cuMemsetD8_v2"});
    resolve(lib, d.StreamCreate, {"cuStreamCreate"});
    resolve(lib, d.StreamDestroy, {"cuStreamDestroy_v2", "cuStreamDestroy"});
    resolve(lib, d.StreamBeginCapture, {"cuStreamBeginCapture_v2"});
    resolve(lib, d.StreamEndCapture, {"cuStreamEndCapture"});
    resolve(lib, d.GraphInstantiate, {"cuGraphInstantiateWithFlags"});
    resolve(lib, d.GraphLaunch, {"cuGraphLaunch"});
    resolve(lib, d.GraphExecDestroy, {"cuGraphExecDestroy"});
    resolve(lib, d.GraphDestroy, {"cuGraphDestroy"});
    if (!missing.empty())
      fail(ErrorKind::Unsupported, "volta-cuda: libcuda.so.1 lacks " + missing + " (NVIDIA driver too old)");
    if (CUresult r = d.Init(0)) fail(ErrorKind::Unsupported, "no CUDA device (cuInit: " + d.error(r) + ")");
    return d;
  }();
  return d;
}

// While a blocking stream captures, the context's legacy default stream cannot be used: a copy,
// memset, launch or synchronize on it from another thread fails with
// CUDA_ERROR_STREAM_CAPTURE_IMPLICIT. Every CudaApi shares the device's primary context, so the
// calls that use the legacy stream (shared among themselves) and a whole capture (exclusive, from
// begin_capture to end_capture; the capturing thread's own launches take no lock) exclude each
// other.
std::shared_mutex& legacy_stream_mutex() {
  static std::shared_mutex m;
  return m;
}

class CudaApi final : public DeviceApi {
 public:
  explicit CudaApi(int ordinal) : d_(driver()) {
    int count = 0;
    d_.check(d_.DeviceGetCount(&count), "cuDeviceGetCount");
    if (count == 0) fail(ErrorKind::Unsupported, "no CUDA device");
    if (ordinal < 0 || ordinal >= count)
      fail(ErrorKind::Invalid, "CUDA device " + std::to_string(ordinal) + " does not exist (" + std::to_string(count) + " found)");
    d_.check(d_.DeviceGet(&dev_, ordinal), "cuDeviceGet");
    int major = 0, minor = 0, sms = 0, version = 0;
    d_.check(d_.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev_), "cuDeviceGetAttribute");
    d_.check(d_.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev_), "cuDeviceGetAttribute");
    d_.check(d_.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev_), "cuDeviceGetAttribute");
    d_.check(d_.DriverGetVersion(&version), "cuDriverGetVersion");
    char name[256] = {};
    d_.check(d_.DeviceGetName(name, sizeof name - 1, dev_), "cuDeviceGetName");
    size_t mem = 0;
    d_.check(d_.DeviceTotalMem(&mem, dev_), "cuDeviceTotalMem");
    sm_ = major * 10 + minor;
    nv_ = &nvrtc_for(sm_);  // before the context is retained: nothing to undo if it throws
    info_ = {{"backend", "cuda"},
             {"name", name},
             {"ordinal", ordinal},
             {"arch", "sm_" + std::to_string(sm_)},
             {"multiprocessors", sms},
             {"total_memory_bytes", int64_t(mem)},
             {"driver_version", std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10)},
             {"nvrtc", nv_->path},
             {"nvrtc_version", nv_->version()}};
    d_.check(d_.PrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain");
  }

  ~CudaApi() override {
    if (d_.CtxSetCurrent(ctx_) == 0) {
      if (exec_) d_.GraphExecDestroy(exec_);
      if (stream_) d_.StreamDestroy(stream_);
      if (mod_) d_.ModuleUnload(mod_);
    }
    d_.PrimaryCtxRelease(dev_);
  }

  std::string backend() const override { return "cuda"; }
  nlohmann::json device_info() const override { return info_; }
  std::string prelude() const override { return cuda_prelude(); }
  std::string build_log() const override { return log_; }

  void build(const std::string& source, const std::vector<std::string>& kernels) override {
    bind();
    CUmodule m = nullptr;
    // A cubin compiled before for this source, architecture and NVRTC (kernels/device/program_cache.h).
    const std::string arch = "sm_" + std::to_string(sm_);
    const std::string cached =
        "cuda-" + program_key({source, arch, kNvrtcStd, nv_->path, std::to_string(nv_->major) + "." + std::to_string(nv_->minor)}) + ".cubin";
    std::string image;
    if (load_cached_program(cached, image) && d_.ModuleLoadData(&m, image.data()) == 0) {
      try {
        bind_functions(m, kernels);  // unloads m when an entry point is missing
        log_.clear();
        cache_hit_ = true;
        return;
      } catch (const Error&) {
        // a foreign or stale binary under this key: compile
      }
    }
    m = nullptr;
    cache_hit_ = false;
    NvrtcOutput out = nvrtc_compile(*nv_, source, arch);
    if (CUresult r = d_.ModuleLoadData(&m, out.image.data())) {
      // A cubin this driver does not take: let the driver compile the PTX instead.
      NvrtcOutput ptx = nvrtc_compile(*nv_, source, "compute_" + std::to_string(sm_));
      if (CUresult r2 = d_.ModuleLoadData(&m, ptx.image.c_str()))
        fail(ErrorKind::Runtime, "CUDA: cuModuleLoadData failed for the cubin (" + d_.error(r) + ") and the PTX (" +
                                     d_.error(r2) + ")");
    }
    else store_cached_program(cached, out.image);
    bind_functions(m, kernels);
    log_ = out.log;
  }
  bool build_cached() const override { return cache_hit_; }
  bool tensor_cores() const override { return sm_ >= 70; }  // PTX wmma m16n16k16 f16: sm_70 and later

  // Resolves the entry points of a loaded module, which becomes the current program.
  void bind_functions(CUmodule m, const std::vector<std::string>& kernels) {
    std::vector<CUfunction> fns(kernels.size());
    for (size_t i = 0; i < kernels.size(); ++i)
      if (CUresult r = d_.ModuleGetFunction(&fns[i], m, kernels[i].c_str())) {
        d_.ModuleUnload(m);
        fail(ErrorKind::Runtime, "CUDA: kernel '" + kernels[i] + "' not found in the program (" + d_.error(r) + ")");
      }
    if (mod_) d_.ModuleUnload(mod_);
    mod_ = m;
    fns_ = std::move(fns);
  }

  DeviceMemory alloc(int64_t bytes) override {
    bind();
    CUdeviceptr p = 0;
    d_.check(d_.MemAlloc(&p, size_t(std::max<int64_t>(bytes, 1))), "cuMemAlloc");  // 0 bytes is an error
    return {p, bytes};
  }
  void release(DeviceMemory m) override {
    if (!m.handle) return;
    bind();
    d_.check(d_.MemFree(m.handle), "cuMemFree");
  }
  void upload(DeviceMemory dst, int64_t offset, const void* src, int64_t bytes) override {
    std::shared_lock<std::shared_mutex> lock(legacy_stream_mutex());
    check_range(dst, offset, bytes, "upload");
    if (bytes == 0) return;
    bind();
    d_.check(d_.MemcpyHtoD(dst.handle + offset, src, size_t(bytes)), "cuMemcpyHtoD");
  }
  // Synchronous, and after every launch before it (the legacy default stream orders them).
  void download(DeviceMemory src, int64_t offset, void* dst, int64_t bytes) override {
    std::shared_lock<std::shared_mutex> lock(legacy_stream_mutex());
    check_range(src, offset, bytes, "download");
    if (bytes == 0) return;
    bind();
    d_.check(d_.MemcpyDtoH(dst, src.handle + offset, size_t(bytes)), "cuMemcpyDtoH");
  }
  void fill_zero(DeviceMemory m) override {
    std::shared_lock<std::shared_mutex> lock(legacy_stream_mutex());
    if (m.bytes == 0) return;
    bind();
    d_.check(d_.MemsetD8(m.handle, 0, size_t(m.bytes)), "cuMemsetD8");
  }

  // Each buffer argument is two kernel parameters, (u8* p, i64 o); an Int64 one, one i64.
  void launch(int kernel, const std::vector<KernelArg>& args, int64_t groups, int local) override {
    if (kernel < 0 || size_t(kernel) >= fns_.size())
      fail(ErrorKind::Invalid, "CUDA: launch of kernel " + std::to_string(kernel) + " of " + std::to_string(fns_.size()));
    if (groups == 0) return;
    if (groups < 0 || groups > INT_MAX || local < 1 || local > 1024)
      fail(ErrorKind::Invalid, "CUDA: launch of " + std::to_string(groups) + " blocks of " + std::to_string(local) +
                                   " threads (1..2^31-1 blocks of 1..1024 threads)");
    std::shared_lock<std::shared_mutex> lock(legacy_stream_mutex(), std::defer_lock);
    if (!capturing_) lock.lock();  // a capture holds it exclusively
    std::vector<uint64_t> values;
    values.reserve(2 * args.size());  // no reallocation: params point into it
    std::vector<void*> params;
    for (const KernelArg& a : args) {
      if (a.kind == KernelArg::Buffer) {
        values.push_back(a.mem.handle);
        params.push_back(&values.back());
      }
      values.push_back(uint64_t(a.value));
      params.push_back(&values.back());
    }
    bind();
    d_.check(d_.LaunchKernel(fns_[kernel], unsigned(groups), 1, 1, unsigned(local), 1, 1, 0, capturing_ ? stream_ : nullptr, params.data(),
                             nullptr),
             "cuLaunchKernel");
  }

  // A CUDA graph: the launches are captured on a stream of our own, created blocking (flags 0) so
  // that it and the legacy default stream, which the copies and memsets use, wait for each other:
  // a replay starts after the inputs are uploaded, and the downloads wait for it.
  bool begin_capture() override {
    if (!d_.graphs()) return false;
    std::unique_lock<std::shared_mutex> lock(legacy_stream_mutex());  // held until end_capture
    bind();
    if (!stream_) d_.check(d_.StreamCreate(&stream_, 0), "cuStreamCreate");
    d_.check(d_.StreamBeginCapture(stream_, 1 /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */), "cuStreamBeginCapture");
    capturing_ = true;
    lock.release();
    return true;
  }
  void end_capture() override {
    if (!capturing_) return;
    // Adopts the lock begin_capture left held, released on every path out.
    std::unique_lock<std::shared_mutex> lock(legacy_stream_mutex(), std::adopt_lock);
    capturing_ = false;
    bind();
    CUgraph g = nullptr;
    d_.check(d_.StreamEndCapture(stream_, &g), "cuStreamEndCapture");
    if (exec_) d_.GraphExecDestroy(exec_);
    exec_ = nullptr;
    const CUresult r = d_.GraphInstantiate(&exec_, g, 0);
    d_.GraphDestroy(g);
    d_.check(r, "cuGraphInstantiateWithFlags");
  }
  void replay_capture() override {
    if (!exec_) fail(ErrorKind::Invalid, "CUDA: replay without a captured graph");
    std::shared_lock<std::shared_mutex> lock(legacy_stream_mutex());
    bind();
    d_.check(d_.GraphLaunch(exec_, stream_), "cuGraphLaunch");
  }

  void finish() override {
    std::shared_lock<std::shared_mutex> lock(legacy_stream_mutex());
    bind();
    d_.check(d_.CtxSynchronize(), "cuCtxSynchronize");
  }

 private:
  // The primary context is current per thread: every entry point makes it current first.
  void bind() const { d_.check(d_.CtxSetCurrent(ctx_), "cuCtxSetCurrent"); }
  static void check_range(const DeviceMemory& m, int64_t offset, int64_t bytes, const char* what) {
    if (offset < 0 || bytes < 0 || offset + bytes > m.bytes)
      fail(ErrorKind::Invalid, std::string("CUDA: ") + what + " of " + std::to_string(bytes) + " bytes at " +
                                   std::to_string(offset) + " outside a " + std::to_string(m.bytes) + "-byte buffer");
  }

  const Driver& d_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule mod_ = nullptr;
  std::vector<CUfunction> fns_;
  CUstream stream_ = nullptr;  // graphs: captured on and replayed into this stream
  CUgraphExec exec_ = nullptr;
  bool capturing_ = false;
  int sm_ = 0;
  const Nvrtc* nv_ = nullptr;
  nlohmann::json info_;
  std::string log_;
  bool cache_hit_ = false;
};

}  // namespace

std::unique_ptr<DeviceApi> make_cuda_api() {
  const char* e = std::getenv("NNFUSE_CUDA_DEVICE");
  return std::make_unique<CudaApi>(e && *e ? std::atoi(e) : 0);
}

std::string cuda_prelude() {
  return R"(typedef signed char i8; typedef unsigned char u8; typedef short i16; typedef unsigned short u16;
typedef int i32; typedef unsigned int u32; typedef long long i64; typedef unsigned long long u64;
#define NF_KERNEL extern "C" __global__
#define NF_FN __device__ static inline
#define NF_GLOBAL
#define NF_LOCAL_ARRAY __shared__
#define NF_GID ((i64)blockIdx.x * (i64)blockDim.x + (i64)threadIdx.x)
#define NF_LID ((int)threadIdx.x)
#define NF_GROUP ((i64)blockIdx.x)
#define NF_LSIZE ((int)blockDim.x)
#define NF_SYNC() __syncthreads()
#define NF_INF __int_as_float(0x7f800000)
#define NF_NAN __int_as_float(0x7fffffff)
#define NF_RESTRICT __restrict__
#ifndef NF_HOST_EMULATION
// Tensor cores through PTX's wmma instructions (sm_70+), so that no CUDA header is needed (the
// pip NVRTC has none). A host emulation defines NF_HOST_EMULATION and its own versions.
#define NF_ALIGN32 __align__(32)
#define NF_TC_BOUNDS __launch_bounds__(256, 2)
typedef struct { u32 x[8]; } nf_frag_ab;
typedef struct { float x[8]; } nf_frag_c;
__device__ static inline u16 nf_f2h(float v) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); return h; }
__device__ static inline void nf_mma_zero(nf_frag_c* c) {
  for (int i = 0; i < 8; ++i) c->x[i] = 0.0f;
}
__device__ static inline void nf_mma_load_a(nf_frag_ab* f, const u16* p, int ld) {
  asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
               : "=r"(f->x[0]), "=r"(f->x[1]), "=r"(f->x[2]), "=r"(f->x[3]), "=r"(f->x[4]), "=r"(f->x[5]), "=r"(f->x[6]), "=r"(f->x[7])
               : "l"(p), "r"(ld) : "memory");
}
__device__ static inline void nf_mma_load_b(nf_frag_ab* f, const u16* p, int ld) {
  asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"
               : "=r"(f->x[0]), "=r"(f->x[1]), "=r"(f->x[2]), "=r"(f->x[3]), "=r"(f->x[4]), "=r"(f->x[5]), "=r"(f->x[6]), "=r"(f->x[7])
               : "l"(p), "r"(ld) : "memory");
}
__device__ static inline void nf_mma(nf_frag_c* c, const nf_frag_ab* a, const nf_frag_ab* b) {
  asm volatile("wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32 {%0, %1, %2, %3, %4, %5, %6, %7}, "
               "{%8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19, %20, %21, %22, %23}, "
               "{%0, %1, %2, %3, %4, %5, %6, %7};"
               : "+f"(c->x[0]), "+f"(c->x[1]), "+f"(c->x[2]), "+f"(c->x[3]), "+f"(c->x[4]), "+f"(c->x[5]), "+f"(c->x[6]), "+f"(c->x[7])
               : "r"(a->x[0]), "r"(a->x[1]), "r"(a->x[2]), "r"(a->x[3]), "r"(a->x[4]), "r"(a->x[5]), "r"(a->x[6]), "r"(a->x[7]),
                 "r"(b->x[0]), "r"(b->x[1]), "r"(b->x[2]), "r"(b->x[3]), "r"(b->x[4]), "r"(b->x[5]), "r"(b->x[6]), "r"(b->x[7]));
}
__device__ static inline void nf_mma_store(float* p, const nf_frag_c* c, int ld) {
  asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.f32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;"
               :: "l"(p), "f"(c->x[0]), "f"(c->x[1]), "f"(c->x[2]), "f"(c->x[3]), "f"(c->x[4]), "f"(c->x[5]), "f"(c->x[6]), "f"(c->x[7]),
                  "r"(ld) : "memory");
}
#endif
)";
}

bool cuda_nvrtc_available(const std::string& arch) {
  try {
    nvrtc_for(arch.empty() ? 0 : parse_arch(arch));
    return true;
  } catch (const Error&) {
    return false;
  }
}

// ptxas -v, through NVRTC 12.9, writes per entry point (smem only when the kernel has some):
//   ptxas info    : Compiling entry function 'nf_mix' for 'sm_70'
//   ptxas info    : Function properties for nf_mix
//   ptxas         .     32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//   ptxas info    : Used 24 registers, used 1 barriers, 32 bytes cumulative stack size, 1024 bytes smem, 408 bytes cmem[0], 8 bytes cmem[2]
//   ptxas info    : Compile time = 13.648 ms
// ("Function properties" also comes for non-inlined device functions; those are skipped.)
std::vector<CudaKernelReport> parse_ptxas_log(const std::string& log) {
  static const std::regex entry(R"(Compiling entry function '([^']+)')"), props(R"(Function properties for (\S+))"),
      frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)"),
      regs(R"(Used (\d+) registers)"), smem(R"((\d+) bytes smem)");
  std::vector<CudaKernelReport> ks;
  auto find = [&](const std::string& n) {
    for (size_t i = 0; i < ks.size(); ++i)
      if (ks[i].name == n) return int(i);
    return -1;
  };
  int cur = -1;       // the entry being compiled
  int frame_of = -1;  // the entry the next stack-frame line is about
  std::istringstream lines(log);
  std::smatch m;
  for (std::string l; std::getline(lines, l);) {
    if (std::regex_search(l, m, entry)) {
      if ((cur = find(m[1])) < 0) {
        cur = int(ks.size());
        ks.push_back({m[1]});
      }
    } else if (std::regex_search(l, m, props)) {
      frame_of = find(m[1]);
    } else if (std::regex_search(l, m, frame)) {
      if (frame_of >= 0) {
        ks[frame_of].stack_bytes = std::stoll(m[1]);
        ks[frame_of].spill_stores = std::stoll(m[2]);
        ks[frame_of].spill_loads = std::stoll(m[3]);
      }
      frame_of = -1;
    } else if (cur >= 0 && std::regex_search(l, m, regs)) {
      ks[cur].registers = std::stoi(m[1]);
      if (std::regex_search(l, m, smem)) ks[cur].shared_bytes = std::stoll(m[1]);
    }
  }
  return ks;
}

CudaCompileReport cuda_compile_check(const std::string& source, const std::string& arch) {
  const Nvrtc& nv = nvrtc_for(parse_arch(arch));
  auto t0 = std::chrono::steady_clock::now();
  NvrtcOutput out = nvrtc_compile(nv, source, arch);
  CudaCompileReport r;
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.arch = arch;
  r.nvrtc = nv.describe();
  r.log = out.log;
  r.kernels = parse_ptxas_log(out.log);
  return r;
}

nlohmann::json to_json(const CudaCompileReport& r) {
  nlohmann::json ks = nlohmann::json::array();
  for (const auto& k : r.kernels)
    ks.push_back({{"name", k.name},
                  {"registers", k.registers},
                  {"shared_bytes", k.shared_bytes},
                  {"spill_stores", k.spill_stores},
                  {"spill_loads", k.spill_loads},
                  {"stack_bytes", k.stack_bytes}});
  return {{"arch", r.arch}, {"nvrtc", r.nvrtc}, {"ms", r.ms}, {"kernels", ks}, {"log", r.log}};
}

}  // namespace nnfuse::device
