// The input readers of `nnfuse run --input NAME=FILE` on arbitrary bytes: .npy, and the same bytes
// as an onnx.TensorProto (.pb; external data resolves against a folder that does not exist).
#include "fuzz_common.h"
#include "graph/npy.h"
#include "graph/onnx_io.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  nnfuse::fuzz::set_fuzz_limits();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = nnfuse::fuzz::as_string(data, size);
  try {
    nnfuse::Tensor t = nnfuse::load_npy_bytes(bytes, "fuzz.npy");
  } catch (const nnfuse::Error&) {
  }
  try {
    nnfuse::Tensor t = nnfuse::load_tensor_pb_bytes(bytes, "fuzz.pb", "/nonexistent-nnfuse-fuzz");
  } catch (const nnfuse::Error&) {
  }
  return 0;
}
