#include "kernels/opencl/opencl_api.h"

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "graph/error.h"
#include "kernels/device/program_cache.h"

namespace nnfuse::device {

namespace {

// The entry points we use, resolved from the ICD loader at run time (no link dependency).
struct ClFns {
  void* lib = nullptr;
#define NF_CL_FN(name) decltype(&::name) name = nullptr;
  NF_CL_FN(clGetPlatformIDs)
  NF_CL_FN(clGetDeviceIDs)
  NF_CL_FN(clGetDeviceInfo)
  NF_CL_FN(clGetPlatformInfo)
  NF_CL_FN(clCreateContext)
  NF_CL_FN(clCreateCommandQueue)
  NF_CL_FN(clCreateProgramWithSource)
  NF_CL_FN(clCreateProgramWithBinary)
  NF_CL_FN(clGetProgramInfo)
  NF_CL_FN(clBuildProgram)
  NF_CL_FN(clGetProgramBuildInfo)
  NF_CL_FN(clCreateKernel)
  NF_CL_FN(clCreateBuffer)
  NF_CL_FN(clReleaseMemObject)
  NF_CL_FN(clEnqueueWriteBuffer)
  NF_CL_FN(clEnqueueReadBuffer)
  NF_CL_FN(clEnqueueFillBuffer)
  NF_CL_FN(clSetKernelArg)
  NF_CL_FN(clEnqueueNDRangeKernel)
  NF_CL_FN(clFinish)
  NF_CL_FN(clReleaseKernel)
  NF_CL_FN(clReleaseProgram)
  NF_CL_FN(clReleaseCommandQueue)
  NF_CL_FN(clReleaseContext)
#undef NF_CL_FN
};

const ClFns& cl() {
  static ClFns f;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libOpenCL.so.1", "libOpenCL.so"})
      if ((f.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!f.lib) return;
    bool ok = true;
#define NF_CL_LOAD(name) ok = ok && (f.name = reinterpret_cast<decltype(f.name)>(dlsym(f.lib, #name)));
    NF_CL_LOAD(clGetPlatformIDs)
    NF_CL_LOAD(clGetDeviceIDs)
    NF_CL_LOAD(clGetDeviceInfo)
    NF_CL_LOAD(clGetPlatformInfo)
    NF_CL_LOAD(clCreateContext)
    NF_CL_LOAD(clCreateCommandQueue)
    NF_CL_LOAD(clCreateProgramWithSource)
    NF_CL_LOAD(clCreateProgramWithBinary)
    NF_CL_LOAD(clGetProgramInfo)
    NF_CL_LOAD(clBuildProgram)
    NF_CL_LOAD(clGetProgramBuildInfo)
    NF_CL_LOAD(clCreateKernel)
    NF_CL_LOAD(clCreateBuffer)
    NF_CL_LOAD(clReleaseMemObject)
    NF_CL_LOAD(clEnqueueWriteBuffer)
    NF_CL_LOAD(clEnqueueReadBuffer)
    NF_CL_LOAD(clEnqueueFillBuffer)
    NF_CL_LOAD(clSetKernelArg)
    NF_CL_LOAD(clEnqueueNDRangeKernel)
    NF_CL_LOAD(clFinish)
    NF_CL_LOAD(clReleaseKernel)
    NF_CL_LOAD(clReleaseProgram)
    NF_CL_LOAD(clReleaseCommandQueue)
    NF_CL_LOAD(clReleaseContext)
#undef NF_CL_LOAD
    if (!ok) f.lib = nullptr;
  });
  if (!f.lib)
    fail(ErrorKind::Unsupported, "mali-opencl: no OpenCL ICD loader (libOpenCL.so.1) with the OpenCL 1.2 entry points; install "
                                 "ocl-icd-libopencl1 and a driver (pocl-opencl-icd runs OpenCL on the CPU)");
  return f;
}

void check(cl_int err, const std::string& what) {
  if (err != CL_SUCCESS) fail(ErrorKind::Runtime, "OpenCL: " + what + " failed with error " + std::to_string(err));
}

std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  cl().clGetDeviceInfo(d, what, 0, nullptr, &n);
  std::string s(n, '\0');
  cl().clGetDeviceInfo(d, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

template <class T>
T device_value(cl_device_id d, cl_device_info what) {
  T v{};
  cl().clGetDeviceInfo(d, what, sizeof v, &v, nullptr);
  return v;
}

class OpenClApi : public DeviceApi {
 public:
  OpenClApi() {
    const ClFns& f = cl();
    cl_uint np = 0;
    if (f.clGetPlatformIDs(0, nullptr, &np) != CL_SUCCESS || np == 0)
      fail(ErrorKind::Unsupported, "mali-opencl: no OpenCL platform (install a driver; pocl-opencl-icd runs OpenCL on the CPU)");
    std::vector<cl_platform_id> ps(np);
    f.clGetPlatformIDs(np, ps.data(), nullptr);
    // Every device of every platform, in order.
    std::vector<cl_device_id> all;
    for (auto p : ps) {
      cl_uint nd = 0;
      if (f.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS || nd == 0) continue;
      std::vector<cl_device_id> ds(nd);
      f.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, ds.data(), nullptr);
      all.insert(all.end(), ds.begin(), ds.end());
    }
    if (all.empty()) fail(ErrorKind::Unsupported, "mali-opencl: the OpenCL platforms list no device");
    if (const char* e = std::getenv("NNFUSE_OPENCL_DEVICE"); e && *e) {
      // An index into that list, or a case-insensitive part of the device's name.
      const std::string want = e;
      auto lower = [](std::string s) {
        for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
        return s;
      };
      char* end = nullptr;
      const long idx = std::strtol(e, &end, 10);
      if (end && !*end && idx >= 0 && size_t(idx) < all.size()) dev_ = all[size_t(idx)];
      for (size_t i = 0; !dev_ && i < all.size(); ++i)
        if (lower(device_string(all[i], CL_DEVICE_NAME)).find(lower(want)) != std::string::npos) dev_ = all[i];
      if (!dev_) {
        std::string list;
        for (size_t i = 0; i < all.size(); ++i) list += "\n  " + std::to_string(i) + ": " + device_string(all[i], CL_DEVICE_NAME);
        fail(ErrorKind::Invalid, "NNFUSE_OPENCL_DEVICE='" + want + "' matches no OpenCL device; the devices are:" + list);
      }
    } else {
      // A GPU first; else the first device of any type (PoCL's CPU device).
      for (auto d : all)
        if (!dev_ && (device_value<cl_device_type>(d, CL_DEVICE_TYPE) & CL_DEVICE_TYPE_GPU)) dev_ = d;
      if (!dev_) dev_ = all.front();
    }
    cl_int err = CL_SUCCESS;
    ctx_ = f.clCreateContext(nullptr, 1, &dev_, nullptr, nullptr, &err);
    check(err, "clCreateContext");
    queue_ = f.clCreateCommandQueue(ctx_, dev_, 0, &err);
    if (err != CL_SUCCESS) {
      f.clReleaseContext(ctx_);
      ctx_ = nullptr;
      check(err, "clCreateCommandQueue");
    }
  }
  ~OpenClApi() override {
    const ClFns& f = cl();
    for (auto k : kernels_) f.clReleaseKernel(k);
    if (prog_) f.clReleaseProgram(prog_);
    if (queue_) f.clReleaseCommandQueue(queue_);
    if (ctx_) f.clReleaseContext(ctx_);
  }

  std::string backend() const override { return "opencl"; }
  nlohmann::json device_info() const override {
    return {{"name", device_string(dev_, CL_DEVICE_NAME)},
            {"vendor", device_string(dev_, CL_DEVICE_VENDOR)},
            {"version", device_string(dev_, CL_DEVICE_VERSION)},
            {"compute_units", device_value<cl_uint>(dev_, CL_DEVICE_MAX_COMPUTE_UNITS)},
            {"global_memory_bytes", device_value<cl_ulong>(dev_, CL_DEVICE_GLOBAL_MEM_SIZE)},
            {"local_memory_bytes", device_value<cl_ulong>(dev_, CL_DEVICE_LOCAL_MEM_SIZE)},
            {"max_work_group_size", device_value<size_t>(dev_, CL_DEVICE_MAX_WORK_GROUP_SIZE)}};
  }
  std::string prelude() const override { return opencl_prelude(); }

  void build(const std::string& source, const std::vector<std::string>& names) override {
    const ClFns& f = cl();
    cl_int err = CL_SUCCESS;
    for (auto k : kernels_) f.clReleaseKernel(k);  // a new program replaces the last one
    kernels_.clear();
    if (prog_) f.clReleaseProgram(prog_);
    prog_ = nullptr;
    // The device's binary of this source, built before (kernels/device/program_cache.h): keyed by
    // the source, the build options and the device, its driver and platform versions.
    const char* options = "-cl-std=CL1.2";
    const std::string cached = "opencl-" + program_key({source, options, device_string(dev_, CL_DEVICE_NAME),
                                                        device_string(dev_, CL_DRIVER_VERSION), device_string(dev_, CL_DEVICE_VERSION)}) +
                               ".bin";
    std::string binary;
    cache_hit_ = false;
    if (load_cached_program(cached, binary)) {
      const size_t n = binary.size();
      const unsigned char* data = reinterpret_cast<const unsigned char*>(binary.data());
      cl_int status = CL_SUCCESS;
      cl_program p = f.clCreateProgramWithBinary(ctx_, 1, &dev_, &n, &data, &status, &err);
      if (err == CL_SUCCESS && status == CL_SUCCESS && f.clBuildProgram(p, 1, &dev_, options, nullptr, nullptr) == CL_SUCCESS) {
        prog_ = p;
        cache_hit_ = true;
      } else if (p) {
        f.clReleaseProgram(p);  // a stale or foreign binary: build from source
      }
    }
    if (cache_hit_) {
      try {
        create_kernels(names);
        log_.clear();
        return;
      } catch (const Error&) {  // a binary without our entry points: build from source
        for (auto k : kernels_) f.clReleaseKernel(k);
        kernels_.clear();
        f.clReleaseProgram(prog_);
        prog_ = nullptr;
        cache_hit_ = false;
      }
    }
    const char* text = source.c_str();
    const size_t len = source.size();
    prog_ = f.clCreateProgramWithSource(ctx_, 1, &text, &len, &err);
    check(err, "clCreateProgramWithSource");
    err = f.clBuildProgram(prog_, 1, &dev_, options, nullptr, nullptr);
    size_t n = 0;
    f.clGetProgramBuildInfo(prog_, dev_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
    log_.assign(n, '\0');
    f.clGetProgramBuildInfo(prog_, dev_, CL_PROGRAM_BUILD_LOG, n, log_.data(), nullptr);
    while (!log_.empty() && log_.back() == '\0') log_.pop_back();
    if (err != CL_SUCCESS) fail(ErrorKind::Runtime, "OpenCL: the program did not build (error " + std::to_string(err) + "):\n" + log_.substr(0, 4000));
    size_t bytes = 0;
    if (f.clGetProgramInfo(prog_, CL_PROGRAM_BINARY_SIZES, sizeof bytes, &bytes, nullptr) == CL_SUCCESS && bytes > 0) {
      binary.assign(bytes, '\0');
      unsigned char* data = reinterpret_cast<unsigned char*>(binary.data());
      if (f.clGetProgramInfo(prog_, CL_PROGRAM_BINARIES, sizeof data, &data, nullptr) == CL_SUCCESS) store_cached_program(cached, binary);
    }
    create_kernels(names);
  }
  std::string build_log() const override { return log_; }
  bool build_cached() const override { return cache_hit_; }

  DeviceMemory alloc(int64_t bytes) override {
    cl_int err = CL_SUCCESS;
    cl_mem m = cl().clCreateBuffer(ctx_, CL_MEM_READ_WRITE, size_t(bytes), nullptr, &err);
    check(err, "clCreateBuffer of " + std::to_string(bytes) + " bytes");
    return {reinterpret_cast<uint64_t>(m), bytes};
  }
  void release(DeviceMemory m) override {
    if (m.handle) cl().clReleaseMemObject(mem(m));
  }
  void upload(DeviceMemory dst, int64_t off, const void* src, int64_t bytes) override {
    if (bytes > 0) check(cl().clEnqueueWriteBuffer(queue_, mem(dst), CL_TRUE, size_t(off), size_t(bytes), src, 0, nullptr, nullptr), "upload");
  }
  void download(DeviceMemory src, int64_t off, void* dst, int64_t bytes) override {
    if (bytes > 0) check(cl().clEnqueueReadBuffer(queue_, mem(src), CL_TRUE, size_t(off), size_t(bytes), dst, 0, nullptr, nullptr), "download");
  }
  void fill_zero(DeviceMemory m) override {
    const cl_uchar zero = 0;
    check(cl().clEnqueueFillBuffer(queue_, mem(m), &zero, 1, 0, size_t(m.bytes), 0, nullptr, nullptr), "fill");
  }
  void launch(int kernel, const std::vector<KernelArg>& args, int64_t groups, int local) override {
    const ClFns& f = cl();
    cl_kernel k = kernels_.at(size_t(kernel));
    cl_uint i = 0;
    for (auto& a : args) {
      if (a.kind == KernelArg::Buffer) {
        cl_mem m = mem(a.mem);
        check(f.clSetKernelArg(k, i++, sizeof m, &m), "clSetKernelArg");
      }
      const cl_long v = a.value;  // a buffer's byte offset, or the integer
      check(f.clSetKernelArg(k, i++, sizeof v, &v), "clSetKernelArg");
    }
    const size_t global = size_t(groups) * size_t(local), lsize = size_t(local);
    check(f.clEnqueueNDRangeKernel(queue_, k, 1, nullptr, &global, &lsize, 0, nullptr, nullptr), "clEnqueueNDRangeKernel");
  }
  void finish() override { check(cl().clFinish(queue_), "clFinish"); }

 private:
  static cl_mem mem(DeviceMemory m) { return reinterpret_cast<cl_mem>(m.handle); }
  cl_device_id dev_ = nullptr;
  cl_context ctx_ = nullptr;
  cl_command_queue queue_ = nullptr;
  cl_program prog_ = nullptr;
  std::vector<cl_kernel> kernels_;
  std::string log_;
  bool cache_hit_ = false;

  void create_kernels(const std::vector<std::string>& names) {
    cl_int err = CL_SUCCESS;
    for (auto& name : names) {
      kernels_.push_back(cl().clCreateKernel(prog_, name.c_str(), &err));
      check(err, "clCreateKernel " + name);
    }
  }
};

}  // namespace

std::string opencl_prelude() {
  return R"(typedef char i8; typedef uchar u8; typedef short i16; typedef ushort u16;
typedef int i32; typedef uint u32; typedef long i64; typedef ulong u64;
#define NF_KERNEL __kernel
#define NF_FN static inline
#define NF_GLOBAL __global
#define NF_LOCAL_ARRAY __local
#define NF_GID ((i64)get_global_id(0))
#define NF_LID ((int)get_local_id(0))
#define NF_GROUP ((i64)get_group_id(0))
#define NF_LSIZE ((int)get_local_size(0))
#define NF_SYNC() barrier(CLK_LOCAL_MEM_FENCE)
#define NF_INF INFINITY
#define NF_NAN NAN
)";
}

std::unique_ptr<DeviceApi> make_opencl_api() { return std::make_unique<OpenClApi>(); }

}  // namespace nnfuse::device
