#include "kernels/device/program_cache.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

namespace nnfuse::device {

namespace fs = std::filesystem;

std::string device_cache_dir() {
  fs::path base;
  if (const char* e = std::getenv("NNFUSE_CACHE_DIR"); e && *e) base = e;
  else {
    const char* home = std::getenv("HOME");
    base = fs::path(home && *home ? home : "/tmp") / ".cache" / "nnfuse" / "kernels";
  }
  return (base / "device").string();
}

std::string program_key(const std::vector<std::string>& parts) {
  uint64_t h[2] = {1469598103934665603ull, 1099511628211ull * 31};
  for (const auto& p : parts)
    for (int k = 0; k < 2; ++k) {
      for (unsigned char c : p) h[k] = (h[k] ^ c) * 1099511628211ull;
      h[k] = (h[k] ^ 0xff) * 1099511628211ull;  // the boundary
    }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h[0]), static_cast<unsigned long long>(h[1]));
  return buf;
}

bool load_cached_program(const std::string& name, std::string& bytes) {
  std::ifstream f(fs::path(device_cache_dir()) / name, std::ios::binary);
  if (!f) return false;
  std::ostringstream o;
  o << f.rdbuf();
  bytes = o.str();
  return !bytes.empty();
}

void store_cached_program(const std::string& name, const std::string& bytes) {
  std::error_code ec;
  const fs::path dir = device_cache_dir();
  fs::create_directories(dir, ec);
  // Unique per process and thread: two threads may compile the same program at once.
  const fs::path tmp = dir / (name + ".tmp" + std::to_string(::getpid()) + "-" + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())));
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) return;
    f.write(bytes.data(), std::streamsize(bytes.size()));
    if (!f) {
      f.close();
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, dir / name, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace nnfuse::device
