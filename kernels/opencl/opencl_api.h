#pragma once
// The OpenCL backend of the device runtime (kernels/device/device_api.h): the ICD loader
// (libOpenCL.so.1) opened with dlopen, the first GPU device (else the first device of any type:
// PoCL's CPU device, the stand-in for a Mali GPU in tests), programs built from OpenCL C source.
#include <memory>

#include "kernels/device/device_api.h"

namespace nnfuse::device {

// Throws Unsupported naming what is missing (no ICD loader, no platform, no device).
std::unique_ptr<DeviceApi> make_opencl_api();
// The OpenCL C spelling of the device kernel form's macros (device_program.h).
std::string opencl_prelude();

}  // namespace nnfuse::device
