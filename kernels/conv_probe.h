#pragma once
// Convolution algorithm by measurement. The lowering's cost model (lowering/conv_algorithm.cpp)
// picks direct or Winograd from FLOP and tile counts alone, and the best choice moves per machine:
// on a 7x7 map F(2x2,3x3) is 1.15x faster than direct on a Zen 4 core and 0.92x on a Xeon.
// Here each blocked 3x3 stride-1 conv with a choice is timed on this machine under every algorithm
// it can run, with its own geometry, and the fastest is kept.
//
// The timing program (a fixed source, compiled once per target and cached like generated code)
// takes geometries at run time. Timings live in <kernel cache>/conv_timings.json, keyed by the
// CPU's model name, the target and the geometry, so a layer shape is timed once per machine and
// every later compile of any model reuses it. Measurements run on one thread.
#include <string>

#include "kernels/toolchain.h"
#include "lowering/kernel_ir.h"

namespace nnfuse {

struct ConvProbeResult {
  int layers = 0;    // stages with a choice
  int measured = 0;  // geometries timed now (the rest came from the timing cache)
  double ms = 0;     // wall time, the timing program's compile included
};

// Re-chooses Stage::iparams["ALGO"] of every conv stage with more than one candidate
// (conv_algorithm_candidates) by timing, and records the timings in mod.conv_timings. Only for
// the host target: a cross target's code cannot run here. `to` names the target, the cache and
// the compiler, as for the model's own kernels.
ConvProbeResult choose_conv_algorithms_by_measurement(KernelModule& mod, const ToolchainOptions& to);

}  // namespace nnfuse
