#pragma once
// The emitter's code for kernel-only anchor stages (LSTM, NonMaxSuppression; see
// lowering/lower_kernel_ops.h): one microkernel call with the stage's buffers, plus a prepare /
// release pair where weights are packed at load time (LSTM).
#include <string>

#include "kernels/emit_cpp.h"

namespace nnfuse {

bool is_kernel_op_stage(const Stage& s);
std::string emit_kernel_op_stage(const Stage& s);

}  // namespace nnfuse
