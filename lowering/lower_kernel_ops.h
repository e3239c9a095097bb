#pragma once
// Ops lowered to a single microkernel call with no fused members (the planner keeps them in
// blocks of their own: fusion/target.cpp lists them as unfusable): LSTM, GRU and RNN
// (lower_rnn.cpp, kernels/microkernels/lstm.h, gru.h, rnn.h) and NonMaxSuppression (lower_nms.cpp, microkernels/nms.h).
// Each becomes one Anchor stage whose anchor_op names the op; the emitter's code for it is in
// kernels/emit_kernel_ops.cpp. Internal to lowering/ and kernels/.
#include <functional>
#include <string>

#include "lowering/kernel_ir.h"

namespace nnfuse {

// What the block lowering lends a kernel-op lowering.
struct KernelOpContext {
  const Graph& g;
  KernelModule& mod;
  // The buffer of a graph value (made on first use: weight, input, output or activation).
  std::function<int(const std::string& value)> buffer;
  // A new buffer holding no graph value.
  std::function<int(DType dt, const Shape& shape, BufferKind kind)> new_buffer;
  // The value of a constant (initializer, Constant node or folded at lowering time), or null.
  std::function<const Tensor*(const std::string& value)> constant;
};

bool is_kernel_op(const Node& n);
// LSTM, GRU or RNN: a kernel-only stage whose prepare entry point packs inputs 1 and 2 (W, R).
bool is_recurrent_op(const std::string& op_type);

// Fills `st` (kind, anchor_op, anchor_inputs, kernel_outputs, parameters, prepared slot) for the
// op `n`; returns "" on success, else why the op cannot be lowered (the block then falls back).
std::string lower_kernel_op(const Node& n, KernelOpContext& cx, Stage& st);
std::string lower_recurrent(const Node& n, KernelOpContext& cx, Stage& st);  // LSTM, GRU, RNN
std::string lower_nms(const Node& n, KernelOpContext& cx, Stage& st);

}  // namespace nnfuse
