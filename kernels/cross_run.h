#pragma once
// Standalone programs for CPU targets the running machine cannot load code for (arm-neon on an
// x86 host). nnfuse's runtime is not cross-built; instead the emitter writes a driver for the
// model (kernels/driver_main.h: buffers at their planned offsets, stages called in order, a
// std::thread pool, .npy inputs and outputs), which the target's compiler links statically with
// the generated stages. The program reads the weights from a file (weights.bin), so one build
// serves any weights of the same lowering; on the host it runs under qemu-aarch64.
// Only modules whose blocks are all generated can run this way (no reference kernels on Arm).
#include <functional>
#include <string>

#include "graph/interpreter.h"
#include "kernels/toolchain.h"
#include "lowering/kernel_ir.h"

namespace nnfuse {

struct CrossRunOptions {
  std::string target = "arm-neon";
  std::string compiler;   // "" = the toolchain's choice ($NNFUSE_CXX, else aarch64-linux-gnu-g++ off Arm)
  std::string emulator;   // "" = $NNFUSE_QEMU, else qemu-aarch64 (none when the host runs the target's code)
  std::string sysroot = "/usr/aarch64-linux-gnu";
  std::string cache_dir;  // "" = the kernel cache
  int jobs = 0;           // parallel compiler processes
  int threads = 1;        // the program's --threads
  std::string workdir;    // "" = a fresh temp directory per run (removed afterwards)
  std::function<void(size_t done, size_t total)> progress;
};

// The feed for graph input `name` (held in buffer `buffer`); throws Invalid when it is missing or
// its dtype or shape differs from the one the module was compiled for.
const Tensor& checked_feed(const KernelModule& m, const TensorMap& feeds, const std::string& name, int buffer);

// True when code for `target` cannot run in this process (arm-neon off aarch64).
bool is_cross_target(const std::string& target);

// Throws Unsupported naming every block that has no generated code (fallback stages run the
// reference kernels, which exist only in nnfuse's own libraries) or a data-dependent buffer.
void check_standalone(const KernelModule& m, const std::string& target);

// The driver's C++ source (the model description and main; exposed for inspection and tests).
std::string emit_cross_driver(const KernelModule& m);

// Writes the weights file the driver reads (weights at 64-byte aligned offsets, buffer order);
// returns its size.
int64_t write_driver_weights(const KernelModule& m, const std::string& path);

// Compiles the generated stages and the driver into a static executable, cached by content hash
// like the shared objects (BuildResult::so_path is the executable).
BuildResult build_standalone(const KernelModule& m, const CrossRunOptions& o);

// Runs a built program on `feeds` (under the emulator when needed) and returns the graph outputs.
// Throws Unsupported when the emulator is missing, Runtime when the program fails.
TensorMap run_standalone(const KernelModule& m, const std::string& program, const std::string& weights, const TensorMap& feeds,
                         const CrossRunOptions& o);

// build_standalone + write_driver_weights + run_standalone in a temporary directory.
TensorMap cross_run(const KernelModule& m, const TensorMap& feeds, const CrossRunOptions& o = {});

}  // namespace nnfuse
