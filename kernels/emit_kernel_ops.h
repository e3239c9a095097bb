#pragma once
// The emitter's code for kernel-only anchor stages (LSTM, NonMaxSuppression; see
// lowering/lower_kernel_ops.h): one microkernel call with the stage's buffers, plus a prepare /
// release pair where weights are packed at load time (LSTM); and the microkernel call of the
// ConvTranspose anchor (an epilogue-fusing anchor whose call emit_cpp.cpp delegates here).
#include <string>

#include "kernels/emit_cpp.h"

namespace nnfuse {

bool is_kernel_op_stage(const Stage& s);
std::string emit_kernel_op_stage(const Stage& s);

// The call of mk::conv_transpose2d for a ConvTranspose anchor stage (inside its entry point, after
// the epilogue `ep` and `par` are defined): input, weight and output buffer expressions.
std::string emit_conv_transpose_call(const Stage& st, const std::string& x, const std::string& w, const std::string& y);

}  // namespace nnfuse
