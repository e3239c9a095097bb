#pragma once
// What the device runtime (device_model.h) needs from a GPU backend: compile one program of
// kernels, allocate and copy memory, launch a kernel over a 1-D range. kernels/opencl and
// kernels/cuda implement it over the OpenCL ICD loader and the CUDA driver API, both loaded with
// dlopen so that nnfuse builds and runs on machines without either. A backend never includes
// another backend; the device layer never includes a backend.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace nnfuse::device {

// A device allocation; opaque to the device layer (a cl_mem, a CUdeviceptr).
struct DeviceMemory {
  uint64_t handle = 0;
  int64_t bytes = 0;
};

// One kernel argument: a buffer (device memory + byte offset into it) or a 64-bit integer.
struct KernelArg {
  enum Kind { Buffer, Int64 } kind = Buffer;
  DeviceMemory mem;
  int64_t value = 0;  // Buffer: byte offset; Int64: the value
};

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;
  // "opencl" / "cuda"; the device's name and facts for reports (compute units, memory, arch).
  virtual std::string backend() const = 0;
  virtual nlohmann::json device_info() const = 0;
  // The text every program starts with: the dialect's spelling of the macros the device kernel
  // form uses (device_program.h lists them).
  virtual std::string prelude() const = 0;
  // Compiles the program (prelude included by the caller) and resolves the named kernels, in
  // order; kernel i is launched as launch(i, ...). Throws Runtime with the compiler's log.
  virtual void build(const std::string& source, const std::vector<std::string>& kernels) = 0;
  // The compiler's log of the last build (registers, spills, warnings); may be empty.
  virtual std::string build_log() const = 0;
  // Whether the last build loaded a program compiled before (kernels/device/program_cache.h).
  virtual bool build_cached() const { return false; }
  // Whether the device runs the prelude's tensor-core helpers (DeviceProgramOptions::tensor_cores).
  virtual bool tensor_cores() const { return false; }
  virtual DeviceMemory alloc(int64_t bytes) = 0;
  virtual void release(DeviceMemory m) = 0;
  virtual void upload(DeviceMemory dst, int64_t offset, const void* src, int64_t bytes) = 0;
  virtual void download(DeviceMemory src, int64_t offset, void* dst, int64_t bytes) = 0;
  virtual void fill_zero(DeviceMemory m) = 0;
  // Launches kernel `kernel` with `groups` work-groups (thread blocks) of `local` work-items each
  // (1-D), asynchronously in order with the other launches and copies.
  virtual void launch(int kernel, const std::vector<KernelArg>& args, int64_t groups, int local) = 0;
  // Waits for everything launched so far.
  virtual void finish() = 0;
  // Optional: one submission for a fixed sequence of launches (CUDA graphs). begin_capture()
  // returns false where the backend has none; otherwise the launches until end_capture() are
  // captured, not run, and each replay_capture() runs them in order, ordered like a launch with
  // the copies before and after it.
  virtual bool begin_capture() { return false; }
  virtual void end_capture() {}
  virtual void replay_capture() {}
};

}  // namespace nnfuse::device
