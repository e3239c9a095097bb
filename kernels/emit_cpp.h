#pragma once
// The C++ emitter for CPU targets: one extern "C" entry point per kernel-IR stage
// (nf_<stage name>), grouped into translation units that compile independently.
// Elementwise loops are generic lambdas instantiated for xsimd batches and scalars; anchors call
// the microkernel templates (kernels/microkernels) with the epilogue inlined as a lambda.
#include <string>
#include <vector>

#include "lowering/kernel_ir.h"

namespace nnfuse {

struct SourceUnit {
  std::string name;                  // "unit3"
  std::string code;
  std::vector<std::string> symbols;  // entry points defined in it
  size_t implementations = 0;        // stage implementations compiled in it (stages with the same
                                     // code but for their buffers share one)
};

std::string stage_symbol(const Stage& s);
// An integer parameter of a stage (Stage::iparams); throws Invalid when the lowering did not set it.
int64_t stage_iparam(const Stage& s, const std::string& key);
// The prepare / release entry points of a stage whose weights are packed at load time: prepare
// allocates a `type` and calls its pack(pack_args) (B, the buffer pointers, in scope); release
// deletes it.
std::string emit_prepare_release(const Stage& s, const std::string& type, const std::string& pack_args);

// Emits the generated stages of a module (Fallback stages have no code) into at most `max_units`
// translation units (stages are spread by estimated compile cost; fewer units when the total cost
// is small, since each unit has a fixed compile price). Stages whose code differs only in the
// buffers they touch (a transformer's layers, a CNN's repeated blocks) share one implementation,
// which their entry points call with their own buffers.
std::vector<SourceUnit> emit_cpp(const KernelModule& m, int max_units);

}  // namespace nnfuse
