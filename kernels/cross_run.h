#pragma once
// Running generated kernels for another CPU (arm-neon on an x86 host): the runtime is not
// cross-built; instead the emitter writes a standalone C++ driver for the model (buffers at their
// planned arena offsets, stages called in order, single-threaded), which is cross-compiled
// statically with the target's compiler together with the generated stages and run under qemu.
// Only models whose blocks are all generated (no fallback stages) can run this way.
#include <string>

#include "graph/interpreter.h"
#include "lowering/kernel_ir.h"

namespace nnfuse {

struct CrossRunOptions {
  std::string target = "arm-neon";
  std::string compiler = "aarch64-linux-gnu-g++";
  std::string emulator = "qemu-aarch64";
  std::string sysroot = "/usr/aarch64-linux-gnu";
  std::string workdir;  // "" = a fresh temp directory
};

// The driver's C++ source for a module (exposed for inspection and tests).
std::string emit_cross_driver(const KernelModule& m);

// Cross-compiles and runs the module on `feeds` under the emulator; returns the graph outputs.
// Throws Unsupported when the module has fallback stages or the tools are missing.
TensorMap cross_run(const KernelModule& m, const TensorMap& feeds, const CrossRunOptions& o = {});

}  // namespace nnfuse
