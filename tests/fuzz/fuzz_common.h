#pragma once
// Shared by the libFuzzer targets (tests/fuzz/README.md). Every target feeds its bytes to one
// entry point and accepts exactly one outcome besides success: an nnfuse::Error, the library's
// clear error naming the file, node, op, line or shape at fault. Anything else -- a crash, a
// sanitizer report, an uncaught std::exception (std::out_of_range from a map::at, a JSON type
// error, std::bad_alloc), a timeout or a blown memory limit -- is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "graph/error.h"

namespace nnfuse::fuzz {

// Limits the library's own caps so that a fuzzed size fails with an Error long before the
// fuzzer's -rss_limit_mb (2 GiB by default) would call it an out-of-memory crash.
inline void set_fuzz_limits() {
  setenv("NNFUSE_MAX_TENSOR_BYTES", "67108864", 0);  // 64 MiB per tensor and arena
  setenv("NNFUSE_MAX_LOOP_ITERATIONS", "10000", 0);
}

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace nnfuse::fuzz
