#include "kernels/toolchain.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "fusion/target.h"
#include "graph/error.h"

namespace fs = std::filesystem;

namespace nnfuse {

namespace {

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_file_atomic(const fs::path& p, const std::string& data) {
  fs::path tmp = p;
  tmp += ".tmp" + std::to_string(::getpid()) + "_" + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream f(tmp, std::ios::binary);
    f << data;
    if (!f) fail(ErrorKind::Io, "cannot write '" + tmp.string() + "'");
  }
  fs::rename(tmp, p);
}

std::string compiler_version(const std::string& cxx) {
  static std::mutex mu;
  static std::map<std::string, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(cxx);
  if (it != cache.end()) return it->second;
  std::string out;
  if (run_command(shell_quote(cxx) + " --version", out) != 0)
    fail(ErrorKind::Runtime, "C++ compiler '" + cxx + "' not found or not working (set NNFUSE_CXX): " + out.substr(0, 300));
  cache[cxx] = out.substr(0, out.find('\n'));
  return cache[cxx];
}

std::string support_headers_hash(const std::string& inc) {
  std::string all;
  for (auto& rel : {"gen_support.h", "exec_ctx.h", "driver_main.h"}) all += read_file((fs::path(inc) / rel).string());
  std::error_code ec;
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(fs::path(inc) / "microkernels", ec)) names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  for (auto& n : names) all += n + read_file(n);
  return content_hash(all);
}

// An exclusive advisory lock on a file, held for the object's lifetime (released on close, also
// when the process dies). Serialises building one precompiled header across processes.
class FileLock {
 public:
  explicit FileLock(const fs::path& p) : fd_(::open(p.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

// Where precompiled support headers live: $NNFUSE_PCH_DIR, else pch/ in the default kernel cache.
// Deliberately not CompileOptions::cache_dir: callers that isolate their kernel cache (tests,
// one cache per model) still share one precompiled header, which only changes compile time.
fs::path pch_root() {
  if (const char* e = std::getenv("NNFUSE_PCH_DIR"); e && *e) return e;
  return fs::path(default_cache_dir()) / "pch";
}

// Keeps the newest few precompiled headers (each is ~90 MB; a new one appears whenever the support
// headers, compiler or flags change).
void prune_pch(const fs::path& root, size_t keep) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> dirs;
  for (auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec)) dirs.emplace_back(fs::last_write_time(e.path(), ec), e.path());
  if (dirs.size() <= keep) return;
  std::sort(dirs.begin(), dirs.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = keep; i < dirs.size(); ++i) {
    fs::remove_all(dirs[i].second, ec);
    fs::remove(fs::path(dirs[i].second.string() + ".lock"), ec);
  }
}

// Every generated unit starts with #include "gen_support.h" (xsimd and the microkernel
// templates): parsing it is most of a small unit's compile time (1.1 s of 1.3 s CPU for a one-op
// elementwise unit on the dev machine; 0.2 s with the header precompiled). Returns a directory
// holding gen_support.h.gch for exactly these compiler and flags, building it once (under a lock,
// so concurrent builds wait instead of building it twice), or "" when PCHs are off
// (NNFUSE_PCH=0) or the compiler cannot make one. g++ looks for NAME.gch in each include
// directory before NAME, and silently ignores a PCH it cannot use, so putting this directory
// first on the include path is always safe.
std::string precompiled_header_dir(const std::string& cxx, const std::vector<std::string>& flags, const std::string& inc,
                                   const std::string& headers_hash, std::string& status) {
  if (const char* e = std::getenv("NNFUSE_PCH"); e && std::string(e) == "0") {
    status = "off";
    return "";
  }
  std::string key = compiler_version(cxx) + "\n" + cxx + "\n" + headers_hash + "\n";
  for (auto& f : flags) key += f + " ";
  fs::path root = pch_root(), dir = root / content_hash(key);
  fs::path gch = dir / "gen_support.h.gch", failed = dir / "FAILED";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) {
    status = "off (cannot create " + dir.string() + ")";
    return "";
  }
  auto usable = [&] { return fs::exists(gch, ec) ? dir.string() : std::string(); };
  if (fs::exists(failed, ec)) {
    status = "off (building it failed before; see " + failed.string() + ")";
    return "";
  }
  if (fs::exists(gch, ec)) {
    fs::last_write_time(dir, fs::file_time_type::clock::now(), ec);  // most recently used: kept by prune_pch
    status = "used";
    return dir.string();
  }
  FileLock lock(root / (dir.filename().string() + ".lock"));
  if (fs::exists(gch, ec)) {  // another process built it while this one waited
    status = "used";
    return usable();
  }
  fs::path tmp = dir / ("gen_support.h.gch.tmp" + std::to_string(::getpid()));
  std::string cmd = shell_quote(cxx);
  for (auto& f : flags) cmd += " " + f;
  cmd += " -x c++-header " + shell_quote((fs::path(inc) / "gen_support.h").string()) + " -o " + shell_quote(tmp.string());
  std::string out;
  if (run_command(cmd, out) != 0) {
    fs::remove(tmp, ec);
    std::ofstream(failed) << cmd << "\n" << out.substr(0, 4000);
    status = "off (building it failed)";
    return "";
  }
  fs::rename(tmp, gch, ec);
  if (ec) {
    status = "off (cannot publish " + gch.string() + ")";
    return "";
  }
  status = "built";
  prune_pch(root, 4);
  return usable();
}

}  // namespace

namespace {
// FNV-1a, 64-bit, fed in pieces.
struct Fnv1a {
  uint64_t h = 1469598103934665603ull;
  void add(const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<unsigned char>(p[i]);
      h *= 1099511628211ull;
    }
  }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};
}  // namespace

std::string content_hash(const std::string& data) {
  Fnv1a f;
  f.add(data.data(), data.size());
  return f.hex();
}

namespace {
// 4 lanes over 8-byte words (a multiply and a rotate per word, the lanes independent so the
// multiplies overlap), the tail bytes into lane 0, the lanes and the size mixed at the end. Not
// cryptographic, as FNV-1a was not: it catches truncated, corrupt and edited files. FNV-1a goes a
// byte at a time: checking ViT-B/16's 346 MB model.onnx took 0.45 s of every `nnfuse run`.
struct WordHash {
  static constexpr uint64_t kMul = 0x9e3779b97f4a7c15ull;
  uint64_t h[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
  static uint64_t mix(uint64_t x, uint64_t w) {
    x = (x ^ w) * kMul;
    return (x << 31) | (x >> 33);
  }
  // n a multiple of 32 except in the last call.
  void add(const char* p, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      uint64_t w[4];
      std::memcpy(w, p + i, 32);
      for (int k = 0; k < 4; ++k) h[k] = mix(h[k], w[k]);
    }
    for (; i < n; ++i) h[0] = mix(h[0], static_cast<unsigned char>(p[i]));
  }
  std::string hex(uint64_t size) const {
    uint64_t x = size * kMul;
    for (uint64_t v : h) x = mix(x, v);
    x ^= x >> 29;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
    return buf;
  }
};

// Streamed: reading a 440 MB model.onnx into a string (a growing stringstream, then its copy)
// took 2x its size and set the peak resident set of `nnfuse run` on an artifact (BERT-base:
// 897 MB, of which 440 MB are weights).
template <class Hash, class Finish>
std::string stream_hash(const std::string& path, Hash& f, const Finish& finish) {
  std::ifstream in(path, std::ios::binary);
  uint64_t size = 0;
  std::vector<char> buf(size_t(1) << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    const size_t n = size_t(in.gcount());
    f.add(buf.data(), n);
    size += n;
  }
  return finish(size);
}
}  // namespace

std::string file_checksum(const std::string& path) {
  WordHash f;
  return stream_hash(path, f, [&](uint64_t size) { return "w1:" + std::to_string(size) + ":" + f.hex(size); });
}

bool file_checksum_matches(const std::string& path, const std::string& want) {
  if (want.rfind("w1:", 0) == 0) return file_checksum(path) == want;
  // Written before the word hash (artifacts and cache entries of older builds): "size:fnv1a".
  Fnv1a f;
  return stream_hash(path, f, [&](uint64_t size) { return std::to_string(size) + ":" + f.hex(); }) == want;
}

std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

int run_command(const std::string& cmd, std::string& output) {
  output.clear();
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output.append(buf, n);
  int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string compiler_for(const ToolchainOptions& o) {
  if (!o.compiler.empty()) return o.compiler;
  if (const char* e = std::getenv("NNFUSE_CXX"); e && *e) return e;
#if !defined(__aarch64__)
  if (o.target == "arm-neon") return "aarch64-linux-gnu-g++";
#endif
  return "g++";
}

std::vector<std::string> target_flags(const std::string& target) {
  std::string t = target;
  bool vnni = false;
  if (t == "host") {
    const TargetDesc host = target_by_name("host");
    t = host.name;  // "host:x86-avx512"
    if (t.rfind("host:", 0) == 0) t = t.substr(5);
    vnni = t == "x86-avx512" && host.int8_dot;
  }
  std::vector<std::string> f;
  if (t == "x86-avx2") f = {"-mavx2", "-mfma"};
  else if (t == "x86-avx512") f = {"-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"};
  else if (t == "arm-neon") f = {"-march=armv8-a"};
  else fail(ErrorKind::Unsupported, "the CPU code generator has no flags for target '" + target + "' (CPU targets: host, x86-avx2, x86-avx512, arm-neon)");
  // The int8 kernels' VNNI: on the host only, where the CPU has it (the name x86-avx512 does not
  // promise it).
  if (vnni) f.push_back("-mavx512vnni");
  return f;
}

std::string default_cache_dir() {
  if (const char* e = std::getenv("NNFUSE_CACHE_DIR"); e && *e) return e;
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : "/tmp") / ".cache" / "nnfuse" / "kernels").string();
}

std::string kernel_include_dir() {
  if (const char* e = std::getenv("NNFUSE_KERNEL_INCLUDE"); e && *e) return e;
#ifdef NNFUSE_SOURCE_DIR
  const fs::path here = fs::path(NNFUSE_SOURCE_DIR) / "kernels";  // the source tree's (kernels/CMakeLists.txt)
#else
  const fs::path here = fs::path(__FILE__).parent_path();
#endif
  if (fs::exists(here / "gen_support.h")) return here.string();
  fail(ErrorKind::Runtime, "cannot find the kernel support headers (gen_support.h): set NNFUSE_KERNEL_INCLUDE to the kernels/ folder");
}

std::string kernel_headers_hash() { return support_headers_hash(kernel_include_dir()); }

BuildResult build_shared_object(const std::vector<SourceUnit>& units, const ToolchainOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  BuildResult r;
  const std::string cxx = compiler_for(o);
  const std::string inc = kernel_include_dir();
  std::vector<std::string> flags = {"-O3", "-std=c++20", "-fPIC", "-fno-math-errno", "-DNDEBUG"};
  for (auto& f : target_flags(o.target)) flags.push_back(f);
  // Extra flags for every generated unit and the link, e.g. the sanitizer job's
  // "-fsanitize=address,undefined" (docs/reliability.md); part of the cache key like all flags.
  if (const char* e = std::getenv("NNFUSE_KERNEL_CXXFLAGS"); e && *e) {
    std::istringstream extra(e);
    for (std::string f; extra >> f;) flags.push_back(f);
  }
  const fs::path dir = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  const bool cross = cxx.find("aarch64-linux-gnu") != std::string::npos;
  if (cross) {
    // A cross compiler does not search the host's /usr/include: expose xsimd's headers only.
    fs::path shim = dir / "cross-include";
    std::error_code sec;
    fs::create_directories(shim, sec);
    if (!fs::exists(shim / "xsimd")) fs::create_directory_symlink("/usr/include/xsimd", shim / "xsimd", sec);
    flags.push_back("-I" + shim.string());
  }
  const std::string headers_hash = support_headers_hash(inc);
  std::string key = compiler_version(cxx) + "\n" + cxx + "\n";
  for (auto& f : flags) key += f + " ";
  key += "\n" + headers_hash + "\n";
  if (o.static_executable) key += "static executable\n";
  for (auto& u : units) key += u.name + "\n" + u.code + "\n";
  r.hash = content_hash(key);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) fail(ErrorKind::Io, "kernel cache directory '" + dir.string() + "' cannot be created");
  const std::string ext = o.static_executable ? ".exe" : ".so";
  fs::path so = dir / (r.hash + ext), sum = dir / (r.hash + ".sum");
  r.so_path = so.string();
  if (fs::exists(so) || fs::exists(sum)) {
    std::string want = fs::exists(sum) ? read_file(sum.string()) : "";
    if (fs::exists(so) && !want.empty() && file_checksum_matches(so.string(), want)) {
      r.cache_hit = true;
      r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return r;
    }
    // Rebuilt below and published over it by rename; never removed here. A .so without its .sum
    // is also what another process's publish looks like between its two renames: removing it
    // then made that process's dlopen of the path fail (two test suites sharing the cache in CI:
    // "cannot load generated kernels ...: No such file or directory").
    r.rebuilt_corrupt = true;
  }
  // Compile every unit in a private work directory, in parallel, then link.
  fs::path work = dir / ("build-" + r.hash + "-" + std::to_string(::getpid()) + "-" +
                         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 100000));
  fs::create_directories(work, ec);
  // Cross builds (arm-neon) are rare and their flags name a per-cache include shim, which would
  // key one ~90 MB PCH per cache directory: they compile without one.
  if (cross) r.pch = "off (cross compiler)";
  const std::string pch = cross ? std::string() : precompiled_header_dir(cxx, flags, inc, headers_hash, r.pch);
  std::vector<std::string> objs(units.size()), errors(units.size());
  std::vector<std::string> cmds(units.size()), plain_cmds(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    fs::path src = work / (units[i].name + ".cpp");
    write_file_atomic(src, units[i].code);
    objs[i] = (work / (units[i].name + ".o")).string();
    std::string cmd = shell_quote(cxx);
    for (auto& f : flags) cmd += " " + f;
    std::string rest = " -I" + shell_quote(inc) + " -c " + shell_quote(src.string()) + " -o " + shell_quote(objs[i]);
    plain_cmds[i] = cmd + rest;
    cmds[i] = pch.empty() ? plain_cmds[i] : cmd + " -I" + shell_quote(pch) + rest;
  }
  std::atomic<bool> pch_broken{false};
  int jobs = o.jobs > 0 ? o.jobs : int(std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  size_t done = 0;
  std::mutex progress_mu;
  std::vector<std::thread> th;
  for (int j = 0; j < std::min<int>(jobs, int(units.size())); ++j)
    th.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < units.size();) {
        std::string out;
        if (run_command(cmds[i], out) != 0) {
          // g++ ignores a PCH built for other flags but stops at a damaged one ("cannot read PCH
          // file"): retry without it, and drop it below so that the next build makes a new one.
          if (!pch.empty() && run_command(plain_cmds[i], out) == 0) pch_broken = true;
          else errors[i] = out.empty() ? "compiler failed" : out;
        }
        if (o.progress) {
          std::lock_guard<std::mutex> lock(progress_mu);
          o.progress(++done, units.size());
        }
      }
    });
  for (auto& t : th) t.join();
  if (pch_broken) {
    fs::remove(fs::path(pch) / "gen_support.h.gch", ec);
    r.pch = "off (the precompiled header in " + pch + " failed; removed, rebuilt next time)";
  }
  for (size_t i = 0; i < units.size(); ++i)
    if (!errors[i].empty())
      fail(ErrorKind::Runtime, "compiling generated kernels failed (" + units[i].name + ", sources kept in " + work.string() +
                                   "):\n" + errors[i].substr(0, 4000));
  std::string link = shell_quote(cxx) + (o.static_executable ? " -static -pthread -o " : " -shared -o ") + shell_quote((work / "lib.so").string());
  for (auto& ob : objs) link += " " + shell_quote(ob);
  std::string out;
  if (run_command(link, out) != 0) fail(ErrorKind::Runtime, "linking generated kernels failed:\n" + out.substr(0, 4000));
  r.commands = cmds;
  r.commands.push_back(link);
  // Publish: .so first, then its checksum (an interrupted publish leaves no valid .sum), each by
  // an atomic rename, so the path always names a whole library (a reader that mapped the old
  // one keeps it).
  fs::path tmp_so = work.string() + ext + ".tmp";  // per process and thread, like the work directory
  fs::copy_file(work / "lib.so", tmp_so, fs::copy_options::overwrite_existing);
  fs::rename(tmp_so, so);
  write_file_atomic(sum, file_checksum(so.string()));
  fs::remove_all(work, ec);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

SharedObject::SharedObject(const std::string& path) : path_(path) {
  handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* e = ::dlerror();
    fail(ErrorKind::Runtime, "cannot load generated kernels '" + path + "': " + (e ? e : "dlopen failed"));
  }
}

SharedObject::~SharedObject() {
  if (handle_) ::dlclose(handle_);
}

void* SharedObject::symbol(const std::string& name) const {
  ::dlerror();
  void* s = ::dlsym(handle_, name.c_str());
  if (!s) fail(ErrorKind::Runtime, "generated kernels '" + path_ + "' lack the entry point '" + name + "' (stale artifact?)");
  return s;
}

}  // namespace nnfuse
