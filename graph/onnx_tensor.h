#pragma once
// onnx.TensorProto <-> Tensor: initializers, Constant values and tensor attributes for model
// import and export (graph/onnx_io.cpp), and the .pb tensor files (load_tensor_pb,
// save_tensor_pb). Internal to the two ONNX translation units, which alone include protobuf
// headers; the rest of nnfuse sees graph/onnx_io.h.
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <iosfwd>
#include <string>

#include "graph/error.h"
#include "graph/tensor.h"

namespace nnfuse::onnx_tensor {

ErrorContext in_file(const std::string& file);
// Whether nnfuse holds ONNX element type `t`, and its name (also for the ones it does not hold).
bool dtype_supported(int32_t t);
const char* onnx_dtype_name(int32_t t);

// Where a tensor is read from: `label` names the file in errors; external data is resolved
// against `base_dir` and must stay inside it.
struct Source {
  std::string label;
  std::string base_dir;
};
// `what` names the tensor in errors when the proto has no name.
Tensor from_proto(const onnx::TensorProto& tp, const std::string& what, const Source& src);
// Sparse tensors (Constant sparse_value, sparse initializers) become dense.
Tensor sparse_from_proto(const onnx::SparseTensorProto& sp, const std::string& what, const Source& src);

// Initializers bigger than this go to the external data file when a model needs one.
constexpr size_t kExternalMinBytes = 1024;

struct ExternalWriter {
  std::ofstream* out = nullptr;
  std::string location;  // file name relative to the model
  int64_t offset = 0;
  size_t min_bytes = kExternalMinBytes;
  // Constant-node tensors too: only when the model cannot be embedded otherwise (not every
  // runtime reads external data in attributes).
  bool attributes = false;
};
// Fills `tp`; with `external`, a tensor of at least external->min_bytes goes to its data file.
void to_proto(const Tensor& t, const std::string& name, onnx::TensorProto& tp, ExternalWriter* external);

// Serializes `msg` to `path`, streamed (a 2 GB model is not copied in memory); errors name the file
// as `kind` ("model file", "tensor file").
void write_message(const google::protobuf::MessageLite& msg, const std::string& path, const std::string& kind);

}  // namespace nnfuse::onnx_tensor
