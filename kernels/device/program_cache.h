#pragma once
// Compiled device programs cached on disk by content, so that a model compiles its GPU kernels
// once per machine: <$NNFUSE_CACHE_DIR or ~/.cache/nnfuse/kernels>/device/<name>. Backends key a
// program by everything that decides the binary (source, architecture, compiler and its version).
#include <string>
#include <vector>

namespace nnfuse::device {

std::string device_cache_dir();
// 32 hex digits of two 64-bit FNV-1a hashes of the parts (a part boundary counts).
std::string program_key(const std::vector<std::string>& parts);
// False when absent or unreadable.
bool load_cached_program(const std::string& name, std::string& bytes);
// Best effort (a read-only or full disk only costs the next compile): written to a temporary file
// and renamed, so a reader never sees half a program.
void store_cached_program(const std::string& name, const std::string& bytes);

}  // namespace nnfuse::device
