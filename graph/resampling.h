#pragma once
// Where Pad and Resize/Upsample read their input, as the reference kernels compute it
// (ops_tensor_move.cpp, ops_tensor_resize.cpp). Exposed so a code generator uses the very same
// input indices and weights as the reference interpreter instead of re-deriving them.
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"

namespace nnfuse::tensor_ops {

struct ResizeAxisTaps {
  bool active = false;  // false: the axis is not resized (output index = input index)
  // Per output index: the (input index, weight) pairs it sums; empty when extrapolate[o].
  std::vector<std::vector<std::pair<int64_t, double>>> taps;
  std::vector<bool> extrapolate;  // per output index: takes the extrapolation value
};

struct ResizeTaps {
  std::string mode;  // nearest | linear | cubic
  double extrapolation = 0.0;
  Shape out;
  std::vector<ResizeAxisTaps> axes;  // one per input dim
};

// Node n (Resize or Upsample at `opset`) on an input of shape `in`; roi/scales/sizes are the
// node's inputs in those roles, or null where absent (an empty tensor counts as absent).
// Throws the reference kernel's errors (bad roi/scales/sizes, unsupported attributes).
ResizeTaps resize_taps(const Node& n, int64_t opset, const Shape& in, const Tensor* roi, const Tensor* scales, const Tensor* sizes);

// Where Resize/Upsample at `opset` takes each of (roi, scales, sizes) among its inputs; -1: none.
struct ResizeInputSlots {
  int roi = -1, scales = -1, sizes = -1;
};
ResizeInputSlots resize_input_slots(const Node& n, int64_t opset);

// Pad node n at `opset` on an input of shape `in`, with its pads (and opset 18 axes) input, or
// null below opset 11 (attributes): per dim, for each output index, the input index it copies,
// or -1 where it takes the constant value (mode "constant"). Throws the reference kernel's errors.
struct PadSources {
  std::string mode;
  std::vector<std::vector<int64_t>> src;
};
PadSources pad_sources(const Node& n, int64_t opset, const Shape& in, const Tensor* pads, const Tensor* axes);

}  // namespace nnfuse::tensor_ops
