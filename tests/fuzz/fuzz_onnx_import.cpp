// The ONNX importer, shape inference and the validator on arbitrary bytes (load_model_bytes runs
// all three). Seeds: the ONNX node tests' models, the malformed models of tests/data/models.
#include "fuzz_common.h"
#include "graph/onnx_io.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  nnfuse::fuzz::set_fuzz_limits();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    nnfuse::Model m = nnfuse::load_model_bytes(nnfuse::fuzz::as_string(data, size), {}, "", "fuzz.onnx");
  } catch (const nnfuse::Error&) {
  }
  return 0;
}
