#pragma once
// The CUDA backend of the device layer (kernels/device/device_api.h): the CUDA driver API
// (libcuda.so.1) runs the kernels, NVRTC (libnvrtc.so.12 / .so.13) compiles them. Both are loaded
// with dlopen, so nnfuse links and runs without a CUDA toolkit; what is missing is reported as
// ErrorKind::Unsupported when a CUDA device is asked for.
//
// NVRTC is searched in this order, and the first library whose supported architectures include
// the one asked for is used (NVRTC 13 no longer targets sm_70, NVRTC 12.x does):
//   1. $NNFUSE_NVRTC (a path to libnvrtc.so.*)
//   2. the pip wheels importable by `python3`: nvidia.cuda_nvrtc (nvidia-cuda-nvrtc-cu12,
//      lib/libnvrtc.so.12) and nvidia.cu13 (CUDA 13 wheels, lib/libnvrtc.so.13)
//   3. the loader's search path: libnvrtc.so.12, libnvrtc.so.13, libnvrtc.so
//   4. /usr/local/cuda/lib64 and /usr/local/cuda/lib
//
// cuda_compile_check needs NVRTC only (no driver, no GPU): it compiles a program to a cubin and
// reports ptxas's registers, spills and shared memory per kernel.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/device/device_api.h"

namespace nnfuse::device {

// A DeviceApi on CUDA device $NNFUSE_CUDA_DEVICE (default 0), in its primary context. Throws
// Unsupported naming what is missing: the driver (libcuda.so.1), a device, or NVRTC.
std::unique_ptr<DeviceApi> make_cuda_api();

// The CUDA C spelling of the device kernel macros (device_program.h); what prelude() returns.
std::string cuda_prelude();

// What ptxas reported for one entry point (-Xptxas -v).
struct CudaKernelReport {
  std::string name;
  int registers = 0;
  int64_t shared_bytes = 0;  // static __shared__ memory
  int64_t spill_stores = 0, spill_loads = 0, stack_bytes = 0;
};

struct CudaCompileReport {
  std::string arch;   // "sm_70"
  std::string nvrtc;  // the library used and its version: "/path/libnvrtc.so.12 (12.9)"
  std::string log;    // NVRTC's log (warnings, ptxas info lines)
  std::vector<CudaKernelReport> kernels;
  double ms = 0;      // compile time
};

// Compiles `source` (prelude included by the caller, e.g. cuda_prelude()) with NVRTC for `arch`
// to a cubin and reports each kernel. Needs NVRTC only. Throws Unsupported when no NVRTC that
// targets `arch` is found, Runtime with the compiler's log on a compile error.
CudaCompileReport cuda_compile_check(const std::string& source, const std::string& arch = "sm_70");

// True when an NVRTC can be loaded (loads it) that targets `arch` ("sm_70"; "": any); never throws.
bool cuda_nvrtc_available(const std::string& arch = "");

// The per-kernel lines of a ptxas -v log (exposed for tests).
std::vector<CudaKernelReport> parse_ptxas_log(const std::string& log);

nlohmann::json to_json(const CudaCompileReport& r);

}  // namespace nnfuse::device
