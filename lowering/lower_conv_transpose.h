#pragma once
// ConvTranspose as an anchor (lower_conv_transpose.cpp): the anchor parameters the emitter
// passes to mk::conv_transpose2d (kernels/microkernels/conv_transpose.h). Internal to lowering/.
#include <string>

#include "lowering/kernel_ir.h"

namespace nnfuse {

// Fills st's iparams (N C H W CO KH KW OH OW SH SW PH PW DH DW G), flops and width for
// ConvTranspose node n with input shape X, weight shape Wt and output shape O. Returns "" or why
// it is not lowered (the block then falls back).
std::string conv_transpose_params(const Node& n, const Shape& X, const Shape& Wt, const Shape& O, Stage& st);

}  // namespace nnfuse
