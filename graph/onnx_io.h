#pragma once
// ONNX import and export (protobuf). Import accepts IR versions 3-14 and opsets 7-28: initializers
// also listed as inputs, Constant nodes, symbolic dims, external-data weights, If/Loop/Scan
// bodies; model-local functions are inlined. Export writes a model that passes onnx.checker
// (full_check) and that ONNX Runtime can run.
#include <map>
#include <string>

#include "graph/graph.h"

namespace nnfuse {

struct ImportOptions {
  std::map<std::string, Shape> input_shapes;  // --shape bindings
  bool infer_shapes = true;
  bool validate = true;
};

// Loads a model file. Errors (I/O, bad protobuf, unsupported op/opset, dangling edges, cycles)
// name the file and, where there is one, the node and op.
Model load_model(const std::string& path, const ImportOptions& opt = {});
// Loads from serialized bytes; `base_dir` resolves external-data files.
Model load_model_bytes(const std::string& bytes, const ImportOptions& opt = {}, const std::string& base_dir = "",
                       const std::string& label = "<bytes>");

struct SaveOptions {
  // Write initializers of at least `external_min_bytes` to "<file name>.data" next to the model
  // even when the model is under 2 GiB (models over 2 GiB always use external data).
  bool external_data = false;
  size_t external_min_bytes = 1024;
};

// Serializes to ONNX (weights embedded; models over 2 GiB are written with external data).
// Model::functions become model-local FunctionProtos (fused blocks of --export-fused).
std::string save_model_bytes(const Model& m);
void save_model(const Model& m, const std::string& path);
void save_model(const Model& m, const std::string& path, const SaveOptions& opt);

// One tensor as a serialized onnx.TensorProto, the form of ONNX test-data files (input_0.pb):
// every element type nnfuse holds, bfloat16, float8 and the packed 4/2-bit types included, which
// .npy cannot carry. `name` receives the proto's name field (may be empty).
Tensor load_tensor_pb(const std::string& path, std::string* name = nullptr);
// The same from bytes; `label` names them in errors, external data resolves against `base_dir`.
Tensor load_tensor_pb_bytes(const std::string& bytes, const std::string& label, const std::string& base_dir,
                            std::string* name = nullptr);
void save_tensor_pb(const Tensor& t, const std::string& name, const std::string& path);
// A value of any kind nnfuse holds as a .pb file: an onnx.TensorProto, an onnx.SequenceProto of
// tensors, or an onnx.OptionalProto (a tensor or a sequence, or empty). `want` is the value's
// declared type (its kind picks the message); a tensor type reads a TensorProto.
Tensor load_value_pb(const std::string& path, const TensorType& want);
void save_value_pb(const Tensor& t, const TensorType& declared, const std::string& name, const std::string& path);

}  // namespace nnfuse
