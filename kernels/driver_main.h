#pragma once
// The main program of a standalone nnfuse model (the arm-neon deployable artifact; see
// kernels/cross_run.h). The generated driver.cpp describes the model (buffers at their planned
// offsets, inputs and outputs, the stage entry points in order) and calls nfd::driver_main.
// Needs only the C++ standard library, so it links statically with the generated stages.
//
// Command line of the built program:
//   model --input NAME=FILE.npy ... [--outputs DIR] [--weights FILE] [--runs N] [--threads T]
//   model --info
// Inputs are .npy files whose dtype and shape must match the model exactly. Outputs are written
// as DIR/NAME.npy (characters other than letters, digits, '.', '_', '-' become '_'). The weights
// default to weights.bin next to the program. stdout gets one JSON object: outputs (name, file,
// dtype, shape), runs, threads and latency_ms {median, min}; --info prints the inputs and outputs
// the model expects. Errors go to stderr with exit status 2.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "exec_ctx.h"

namespace nfd {

enum BufKind { kInput = 0, kOutput = 1, kWeight = 2, kActivation = 3, kPrepared = 4 };

struct Buf {
  int kind;
  int64_t bytes;
  int64_t offset;   // kWeight: in the weights file; kActivation: in the arena
  int row_count;    // a capacity buffer: the buffer holding its actual row count, else -1
};

struct Io {
  const char* name;
  int buffer;
  const char* dtype;  // nnfuse's name, for messages
  const char* descr;  // numpy type string ('<f4', '<i8', '|b1', ...)
  int64_t itemsize;
  int rank;
  int64_t dims[8];
};

struct Model {
  const char* name;
  int nbuffers;
  const Buf* buffers;
  int ninputs;
  const Io* inputs;
  int noutputs;
  const Io* outputs;
  int64_t arena_bytes, weights_bytes;
  void (*prepare)(void** B);
  void (*run)(const nnfuse_exec_ctx* ctx, void* const* B);
  void (*release)(void** B);
};

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------- thread pool
// Persistent workers; parallel_for splits [0, n) into one contiguous range per thread (the
// kernels' results do not depend on the split) and the calling thread runs the first one.
class Pool {
 public:
  explicit Pool(int threads) : threads_(std::max(1, threads)) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  nnfuse_exec_ctx ctx() {
    nnfuse_exec_ctx c{};
    c.pool = this;
    c.parallel_for = &Pool::parallel_for;
    c.threads = threads_;
    return c;
  }

 private:
  static void range(int part, int parts, int64_t n, int64_t& b, int64_t& e) {
    b = n * part / parts;
    e = n * (part + 1) / parts;
  }
  static void parallel_for(void* self, int64_t n, nnfuse_range_fn fn, void* arg) {
    auto* p = static_cast<Pool*>(self);
    const int parts = int(std::min<int64_t>(n, p->threads_));
    if (parts <= 1) {
      if (n > 0) fn(arg, 0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> l(p->mu_);
      p->n_ = n, p->fn_ = fn, p->arg_ = arg, p->parts_ = parts;
      p->pending_ = p->threads_ - 1;
      ++p->generation_;
    }
    p->cv_.notify_all();
    int64_t b, e;
    range(0, parts, n, b, e);
    fn(arg, b, e);
    std::unique_lock<std::mutex> l(p->mu_);
    p->done_.wait(l, [p] { return p->pending_ == 0; });
  }
  void work(int index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const int parts = parts_;
      const int64_t n = n_;
      nnfuse_range_fn fn = fn_;
      void* arg = arg_;
      l.unlock();
      if (index < parts) {
        int64_t b, e;
        range(index, parts, n, b, e);
        fn(arg, b, e);
      }
      l.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  uint64_t generation_ = 0;
  int pending_ = 0, parts_ = 0;
  bool stop_ = false;
  int64_t n_ = 0;
  nnfuse_range_fn fn_ = nullptr;
  void* arg_ = nullptr;
};

// ---------------------------------------------------------------- memory, files
struct Aligned {
  std::unique_ptr<char[]> raw;
  char* p = nullptr;
  explicit Aligned(int64_t bytes) : raw(new char[size_t(bytes) + 64]()) {
    p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw.get()) + 63) / 64 * 64);
  }
};

inline std::string read_all(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(std::string("cannot open ") + what + " '" + path + "'");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

inline std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

inline std::vector<int64_t> io_shape(const Io& io) { return std::vector<int64_t>(io.dims, io.dims + io.rank); }

// A .npy file (format 1.0-3.0, C order): returns the data and fills descr and shape.
inline std::string read_npy(const std::string& path, std::string& descr, std::vector<int64_t>& shape) {
  std::string b = read_all(path, "input file");
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0) throw Error("'" + path + "' is not a .npy file");
  const unsigned major = static_cast<unsigned char>(b[6]);
  size_t hlen, pos;
  if (major == 1) {
    hlen = size_t(static_cast<unsigned char>(b[8])) | size_t(static_cast<unsigned char>(b[9])) << 8;
    pos = 10;
  } else {
    if (b.size() < 12) throw Error("'" + path + "': truncated .npy header");
    hlen = 0;
    for (int i = 3; i >= 0; --i) hlen = hlen << 8 | size_t(static_cast<unsigned char>(b[size_t(8 + i)]));
    pos = 12;
  }
  if (pos + hlen > b.size()) throw Error("'" + path + "': truncated .npy header");
  const std::string h = b.substr(pos, hlen);
  auto value_at = [&](const char* key) {
    size_t k = h.find(key);
    if (k == std::string::npos) throw Error("'" + path + "': .npy header lacks " + key);
    return h.find(':', k) + 1;
  };
  size_t d = h.find('\'', value_at("'descr'"));
  descr = h.substr(d + 1, h.find('\'', d + 1) - d - 1);
  if (!descr.empty() && descr[0] == '=') descr[0] = '<';  // native order on a little-endian machine
  if (descr.size() == 3 && descr[2] == '1' && descr[0] == '<') descr[0] = '|';
  size_t fo = value_at("'fortran_order'");
  if (h.compare(h.find_first_not_of(' ', fo), 4, "True") == 0) throw Error("'" + path + "' is in Fortran order; save it in C order");
  size_t s = h.find('(', value_at("'shape'")), e = h.find(')', s);
  shape.clear();
  std::string dims = h.substr(s + 1, e - s - 1);
  for (size_t i = 0; i < dims.size();) {
    size_t j = dims.find(',', i);
    std::string tok = dims.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if (tok.find_first_not_of(' ') != std::string::npos) shape.push_back(std::stoll(tok));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return b.substr(pos + hlen);
}

inline void write_npy(const std::string& path, const char* descr, const std::vector<int64_t>& shape, const void* data, int64_t bytes) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";  // a 1-tuple: "(5,)"
  std::string h = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {char(h.size() & 0xff), char(h.size() >> 8)};
  f.write(len, 2);
  f << h;
  f.write(static_cast<const char*>(data), bytes);
  if (!f) throw Error("cannot write output file '" + path + "'");
}

inline std::string safe_name(const std::string& name) {
  std::string r;
  for (char c : name) r += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  if (r.empty()) r = "output";
  if (r[0] == '.') r[0] = '_';
  return r;
}

inline std::string json_str(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\', r += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      r += buf;
    } else r += c;
  }
  return r + "\"";
}

inline std::string io_json(const Io& io, const std::vector<int64_t>& shape) {
  std::string r = "{\"name\": " + json_str(io.name) + ", \"dtype\": " + json_str(io.dtype) + ", \"shape\": [";
  for (size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
  return r + "]}";
}

// ---------------------------------------------------------------- main
inline int run_main(const Model& m, int argc, char** argv) {
  std::string weights, outdir = ".";
  std::vector<std::pair<std::string, std::string>> feeds;
  int64_t runs = 1;
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  bool info = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(a + " needs a value");
      return argv[++i];
    };
    auto number = [&](int64_t lo) {
      std::string v = next();
      char* end = nullptr;
      long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end || x < lo) throw Error(a + " '" + v + "': expected an integer >= " + std::to_string(lo));
      return int64_t(x);
    };
    if (a == "--input") {
      std::string v = next();
      size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0) throw Error("--input '" + v + "': expected NAME=FILE.npy");
      feeds.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (a == "--outputs") outdir = next();
    else if (a == "--weights") weights = next();
    else if (a == "--runs") runs = number(1);
    else if (a == "--threads") threads = int(number(1));
    else if (a == "--info") info = true;
    else if (a == "--help" || a == "-h") {
      std::printf("usage: %s --input NAME=FILE.npy ... [--outputs DIR] [--weights FILE] [--runs N] [--threads T] | --info\n", argv[0]);
      return 0;
    } else throw Error("unknown argument '" + a + "' (see --help)");
  }
  if (info) {
    std::string r = "{\"model\": " + json_str(m.name) + ", \"inputs\": [";
    for (int i = 0; i < m.ninputs; ++i) r += (i ? ", " : "") + io_json(m.inputs[i], io_shape(m.inputs[i]));
    r += "], \"outputs\": [";
    for (int i = 0; i < m.noutputs; ++i) r += (i ? ", " : "") + io_json(m.outputs[i], io_shape(m.outputs[i]));
    std::printf("%s]}\n", r.c_str());
    return 0;
  }
  if (weights.empty()) {
    std::string self = argv[0];
    size_t slash = self.rfind('/');
    weights = (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) + "weights.bin";
  }
  std::vector<void*> B(size_t(std::max(1, m.nbuffers)), nullptr);
  std::vector<std::unique_ptr<Aligned>> owned;
  auto alloc = [&](int64_t bytes) {
    owned.push_back(std::make_unique<Aligned>(bytes));
    return static_cast<void*>(owned.back()->p);
  };
  Aligned wts(m.weights_bytes);
  {
    std::string w = read_all(weights, "weights file");
    if (int64_t(w.size()) != m.weights_bytes)
      throw Error("weights file '" + weights + "' has " + std::to_string(w.size()) + " bytes; this model needs " +
                  std::to_string(m.weights_bytes) + " (weights of another model?)");
    std::memcpy(wts.p, w.data(), w.size());
  }
  Aligned arena(m.arena_bytes);
  for (int i = 0; i < m.nbuffers; ++i) {
    const Buf& b = m.buffers[i];
    if (b.kind == kWeight) B[size_t(i)] = wts.p + b.offset;
    else if (b.kind == kActivation) B[size_t(i)] = arena.p + b.offset;
    else if (b.kind == kOutput || b.kind == kInput) B[size_t(i)] = alloc(std::max<int64_t>(b.bytes, 1));
  }
  std::set<std::string> given;
  for (auto& [name, file] : feeds) {
    const Io* io = nullptr;
    for (int i = 0; i < m.ninputs; ++i)
      if (name == m.inputs[i].name) io = &m.inputs[i];
    if (!io) {
      std::string names;
      for (int i = 0; i < m.ninputs; ++i) names += std::string(i ? ", " : "") + m.inputs[i].name;
      throw Error("--input names '" + name + "', which is not a model input (inputs: " + names + ")");
    }
    if (!given.insert(name).second) throw Error("--input given twice for '" + name + "'");
    std::string descr;
    std::vector<int64_t> shape;
    std::string data = read_npy(file, descr, shape);
    if (descr != io->descr || shape != io_shape(*io))
      throw Error("input '" + name + "' from '" + file + "' is " + descr + shape_str(shape) + "; the model expects " + io->dtype +
                  shape_str(io_shape(*io)) + " (numpy '" + io->descr + "')");
    const int64_t bytes = m.buffers[io->buffer].bytes;
    if (int64_t(data.size()) < bytes) throw Error("input file '" + file + "' is truncated");
    std::memcpy(B[size_t(io->buffer)], data.data(), size_t(bytes));
  }
  for (int i = 0; i < m.ninputs; ++i)
    if (!given.count(m.inputs[i].name))
      throw Error(std::string("missing --input ") + m.inputs[i].name + "=FILE.npy (" + m.inputs[i].dtype + shape_str(io_shape(m.inputs[i])) + ")");
  Pool pool(threads);
  nnfuse_exec_ctx ctx = pool.ctx();
  int32_t status = 0;  // stages flag bad data here (NNFUSE_STATUS_*); run() checks it
  ctx.status = &status;
  m.prepare(B.data());
  std::vector<double> ms;
  for (int64_t r = 0; r < runs; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    m.run(&ctx, B.data());
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms.size() % 2 ? ms[ms.size() / 2] : (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]) / 2;
  std::string r = "{\"model\": " + json_str(m.name) + ", \"outputs\": [";
  std::set<std::string> used;
  for (int i = 0; i < m.noutputs; ++i) {
    const Io& io = m.outputs[i];
    const Buf& b = m.buffers[io.buffer];
    std::vector<int64_t> shape = io_shape(io);
    if (b.row_count >= 0 && !shape.empty()) shape[0] = std::clamp<int64_t>(*static_cast<const int64_t*>(B[size_t(b.row_count)]), 0, shape[0]);
    int64_t bytes = io.itemsize;
    for (auto d : shape) bytes *= d;
    std::string base = safe_name(io.name), file = base + ".npy";
    for (int k = 1; used.count(file); ++k) file = base + "_" + std::to_string(k) + ".npy";
    used.insert(file);
    const std::string path = outdir + "/" + file;
    write_npy(path, io.descr, shape, B[size_t(io.buffer)], bytes);
    std::string e = io_json(io, shape);
    e.pop_back();
    r += (i ? ", " : "") + e + ", \"file\": " + json_str(path) + "}";
  }
  m.release(B.data());
  char tail[200];
  std::snprintf(tail, sizeof tail, "], \"runs\": %lld, \"threads\": %d, \"latency_ms\": {\"median\": %.6f, \"min\": %.6f}}\n",
                static_cast<long long>(runs), threads, median, ms.front());
  std::printf("%s%s", r.c_str(), tail);
  return 0;
}

inline int driver_main(const Model& m, int argc, char** argv) {
  try {
    return run_main(m, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", argc > 0 ? argv[0] : "model", e.what());
    return 2;
  }
}

}  // namespace nfd
