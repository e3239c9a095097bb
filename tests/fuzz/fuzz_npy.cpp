// The .npy reader (`nnfuse run --input NAME=file.npy`) on arbitrary bytes.
#include "fuzz_common.h"
#include "graph/npy.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  nnfuse::fuzz::set_fuzz_limits();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    nnfuse::Tensor t = nnfuse::load_npy_bytes(nnfuse::fuzz::as_string(data, size), "fuzz.npy");
  } catch (const nnfuse::Error&) {
  }
  return 0;
}
