#pragma once
// Reading and writing numpy .npy files (version 1/2/3 headers, little-endian, C order).
#include <string>

#include "graph/tensor.h"

namespace nnfuse {

Tensor load_npy(const std::string& path);
// The same from the file's bytes; `path` names the file in errors.
Tensor load_npy_bytes(const std::string& bytes, const std::string& path);
void save_npy(const Tensor& t, const std::string& path);

}  // namespace nnfuse
