#include "kernels/toolchain.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

// Runs a command; returns its exit status and combined output.
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
  if (const char* e = std::getenv("NNFUSE_CXX")) return e;
#if !defined(__aarch64__)
  if (o.target == "arm-neon") return "aarch64-linux-gnu-g++";
#endif
  return "g++";
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
  for (auto& rel : {"gen_support.h", "exec_ctx.h"}) all += read_file((fs::path(inc) / rel).string());
  std::error_code ec;
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(fs::path(inc) / "microkernels", ec)) names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  for (auto& n : names) all += n + read_file(n);
  return content_hash(all);
}

}  // namespace

std::string content_hash(const std::string& data) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string file_checksum(const std::string& path) {
  std::string d = read_file(path);
  return std::to_string(d.size()) + ":" + content_hash(d);
}

std::vector<std::string> target_flags(const std::string& target) {
  std::string t = target;
  if (t == "host") {
    t = target_by_name("host").name;  // "host:x86-avx512"
    if (t.rfind("host:", 0) == 0) t = t.substr(5);
  }
  if (t == "x86-avx2") return {"-mavx2", "-mfma"};
  if (t == "x86-avx512") return {"-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"};
  if (t == "arm-neon") return {"-march=armv8-a"};
  fail(ErrorKind::Unsupported, "the CPU code generator has no flags for target '" + target + "' (CPU targets: host, x86-avx2, x86-avx512, arm-neon)");
}

std::string default_cache_dir() {
  if (const char* e = std::getenv("NNFUSE_CACHE_DIR"); e && *e) return e;
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : "/tmp") / ".cache" / "nnfuse" / "kernels").string();
}

std::string kernel_include_dir() {
  if (const char* e = std::getenv("NNFUSE_KERNEL_INCLUDE"); e && *e) return e;
  fs::path here = fs::path(__FILE__).parent_path();  // the kernels/ folder of the source tree
  if (fs::exists(here / "gen_support.h")) return here.string();
  fail(ErrorKind::Runtime, "cannot find the kernel support headers (gen_support.h): set NNFUSE_KERNEL_INCLUDE to the kernels/ folder");
}

BuildResult build_shared_object(const std::vector<SourceUnit>& units, const ToolchainOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  BuildResult r;
  const std::string cxx = compiler_for(o);
  const std::string inc = kernel_include_dir();
  std::vector<std::string> flags = {"-O3", "-std=c++20", "-fPIC", "-fno-math-errno", "-DNDEBUG"};
  for (auto& f : target_flags(o.target)) flags.push_back(f);
  fs::path cache_root = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  if (cxx.find("aarch64-linux-gnu") != std::string::npos) {
    // A cross compiler does not search the host's /usr/include: expose xsimd's headers only.
    fs::path shim = cache_root / "cross-include";
    std::error_code sec;
    fs::create_directories(shim, sec);
    if (!fs::exists(shim / "xsimd")) fs::create_directory_symlink("/usr/include/xsimd", shim / "xsimd", sec);
    flags.push_back("-I" + shim.string());
  }
  std::string key = compiler_version(cxx) + "\n" + cxx + "\n";
  for (auto& f : flags) key += f + " ";
  key += "\n" + support_headers_hash(inc) + "\n";
  for (auto& u : units) key += u.name + "\n" + u.code + "\n";
  r.hash = content_hash(key);
  fs::path dir = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) fail(ErrorKind::Io, "kernel cache directory '" + dir.string() + "' cannot be created");
  fs::path so = dir / (r.hash + ".so"), sum = dir / (r.hash + ".sum");
  r.so_path = so.string();
  if (fs::exists(so) || fs::exists(sum)) {
    std::string want = fs::exists(sum) ? read_file(sum.string()) : "";
    if (fs::exists(so) && !want.empty() && file_checksum(so.string()) == want) {
      r.cache_hit = true;
      r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return r;
    }
    r.rebuilt_corrupt = true;
    fs::remove(so, ec);
    fs::remove(sum, ec);
  }
  // Compile every unit in a private work directory, in parallel, then link.
  fs::path work = dir / ("build-" + r.hash + "-" + std::to_string(::getpid()) + "-" +
                         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 100000));
  fs::create_directories(work, ec);
  std::vector<std::string> objs(units.size()), errors(units.size());
  std::vector<std::string> cmds(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    fs::path src = work / (units[i].name + ".cpp");
    write_file_atomic(src, units[i].code);
    objs[i] = (work / (units[i].name + ".o")).string();
    std::string cmd = shell_quote(cxx);
    for (auto& f : flags) cmd += " " + f;
    cmd += " -I" + shell_quote(inc) + " -c " + shell_quote(src.string()) + " -o " + shell_quote(objs[i]);
    cmds[i] = cmd;
  }
  int jobs = o.jobs > 0 ? o.jobs : int(std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  size_t done = 0;
  std::mutex progress_mu;
  std::vector<std::thread> th;
  for (int j = 0; j < std::min<int>(jobs, int(units.size())); ++j)
    th.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < units.size();) {
        std::string out;
        if (run_command(cmds[i], out) != 0) errors[i] = out.empty() ? "compiler failed" : out;
        if (o.progress) {
          std::lock_guard<std::mutex> lock(progress_mu);
          o.progress(++done, units.size());
        }
      }
    });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < units.size(); ++i)
    if (!errors[i].empty())
      fail(ErrorKind::Runtime, "compiling generated kernels failed (" + units[i].name + ", sources kept in " + work.string() +
                                   "):\n" + errors[i].substr(0, 4000));
  std::string link = shell_quote(cxx) + " -shared -o " + shell_quote((work / "lib.so").string());
  for (auto& ob : objs) link += " " + shell_quote(ob);
  std::string out;
  if (run_command(link, out) != 0) fail(ErrorKind::Runtime, "linking generated kernels failed:\n" + out.substr(0, 4000));
  r.commands = cmds;
  r.commands.push_back(link);
  // Publish: .so first, then its checksum (an interrupted publish leaves no valid .sum).
  fs::path tmp_so = dir / (r.hash + ".so.tmp" + std::to_string(::getpid()));
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
