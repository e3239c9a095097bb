#pragma once
// The toolchain step: compiles generated translation units with the system C++ compiler into a
// shared object (units in parallel), caches it by content hash, and loads it with dlopen.
// A cache entry is <hash>.so plus <hash>.sum (size and checksum of the .so): a truncated or
// altered .so, or a missing .sum, is detected and rebuilt.
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/emit_cpp.h"

namespace nnfuse {

struct ToolchainOptions {
  std::string target = "host";   // host, x86-avx2, x86-avx512, arm-neon
  std::string cache_dir;         // "" = $NNFUSE_CACHE_DIR or ~/.cache/nnfuse/kernels
  int jobs = 0;                  // parallel compiler processes (0: hardware threads)
  std::string compiler;          // "" = $NNFUSE_CXX or g++ (aarch64-linux-gnu-g++ for arm-neon off Arm)
  // Called after each translation unit compiles (done, total); calls are serialised.
  std::function<void(size_t done, size_t total)> progress;
  // Link the units into a static executable (<hash>.exe; one unit defines main) instead of a
  // shared object: the standalone programs of cross targets (kernels/cross_run.h).
  bool static_executable = false;
};

// Compiler flags for a target (ISA flags included); "host" resolves to the running CPU.
std::vector<std::string> target_flags(const std::string& target);
std::string default_cache_dir();
// Where gen_support.h and microkernels/ live ($NNFUSE_KERNEL_INCLUDE, else this source tree).
std::string kernel_include_dir();
// A hash of the kernel support headers build_shared_object compiles against (kernel_include_dir's
// gen_support.h, exec_ctx.h, driver_main.h and microkernels/): part of every build's cache key,
// and of cached measurements of those kernels (the conv-algorithm timings).
std::string kernel_headers_hash();
// A 64-bit FNV-1a hash, hex.
std::string content_hash(const std::string& data);
std::string file_checksum(const std::string& path);
// Whether the file has checksum `want`: one of file_checksum's ("w1:size:hash") or, from older
// builds, "size:fnv1a".
bool file_checksum_matches(const std::string& path, const std::string& want);
// The C++ compiler a build uses: ToolchainOptions::compiler, else $NNFUSE_CXX, else g++
// (aarch64-linux-gnu-g++ for arm-neon off Arm).
std::string compiler_for(const ToolchainOptions& o);
// Runs a shell command; returns its exit status (-1 when it did not exit normally) and its
// combined stdout and stderr in `output`.
int run_command(const std::string& cmd, std::string& output);
// `s` single-quoted for the shell.
std::string shell_quote(const std::string& s);

struct BuildResult {
  std::string so_path;
  std::string hash;
  bool cache_hit = false;
  bool rebuilt_corrupt = false;  // a cache entry existed but failed its check
  double ms = 0;                 // wall time of the whole step (lookup, compile, link)
  // Precompiled support header for this build: "used", "built" (first build with these flags),
  // "off ..." (NNFUSE_PCH=0 or it could not be made); "" on a cache hit (nothing compiled).
  std::string pch;
  std::vector<std::string> commands;
};

// Builds (or finds in the cache) the shared object (or static executable) for these units.
BuildResult build_shared_object(const std::vector<SourceUnit>& units, const ToolchainOptions& o);

// A loaded shared object; dlclose on destruction.
class SharedObject {
 public:
  explicit SharedObject(const std::string& path);  // throws Runtime with dlerror()
  ~SharedObject();
  SharedObject(const SharedObject&) = delete;
  SharedObject& operator=(const SharedObject&) = delete;
  void* symbol(const std::string& name) const;     // throws Runtime naming the symbol
  const std::string& path() const { return path_; }

 private:
  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace nnfuse
