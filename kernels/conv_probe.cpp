#include "kernels/conv_probe.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "graph/error.h"
#include "kernels/emit_cpp.h"
#include "kernels/toolchain.h"

namespace nnfuse {

namespace fs = std::filesystem;

namespace {

// The timing program. One geometry is 9 integers (N C H W K OH OW pad_top pad_left) and a mask of
// the algorithms to time (bit 0 direct, 1 F(4x4), 2 F(2x2)); it writes seconds per algorithm
// (-1 where not timed). Rounds alternate the algorithms, so a drift in clock speed or a neighbour's
// load hits them alike, and each keeps its best round. The data is random: the kernels' speed does
// not depend on values (no denormals from this range).
// Each algorithm's kernel is a unit of its own (kProbeKernels), so that the three compile in
// parallel: the program is built once per target and cache, on a first compile.
constexpr const char* kProbeSource = R"(// nnfuse convolution timing program (kernels/conv_probe.cpp): do not edit.
#include "gen_support.h"
#include <chrono>
#include <cstdint>

void nnfuse_probe_direct(const nnfuse::mk::ConvNchwcArgs& a);
void nnfuse_probe_f4(const nnfuse::mk::ConvNchwcArgs& a, const nnfuse::mk::PackedConvWinograd& p);
void nnfuse_probe_f2(const nnfuse::mk::ConvNchwcArgs& a, const nnfuse::mk::PackedConvWinograd2& p);

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void fill(std::vector<float>& v, uint32_t seed) {
  for (auto& x : v) { seed = seed * 1664525u + 1013904223u; x = float(int32_t(seed >> 9) - (1 << 22)) * (1.0f / float(1 << 22)); }
}
}  // namespace

extern "C" int nnfuse_conv_probe(const int64_t* g, int64_t n, double* out) {
  namespace mk = nnfuse::mk;
  for (int64_t i = 0; i < n; ++i, g += 10, out += 3) {
    mk::ConvNchwcArgs a;
    a.N = g[0], a.C = g[1], a.H = g[2], a.W = g[3], a.K = g[4], a.OH = g[5], a.OW = g[6];
    a.KH = a.KW = 3, a.pad_top = g[7], a.pad_left = g[8];
    const int64_t mask = g[9];
    std::vector<float> x(size_t(a.N * mk::nchwc_blocks(a.C, nf::L) * nf::L * a.H * a.W)), w(size_t(a.K * a.C * 9));
    std::vector<float> y(size_t(a.N * mk::nchwc_blocks(a.K, nf::L) * nf::L * a.OH * a.OW));
    fill(x, 1), fill(w, 2);
    a.x = x.data(), a.y = y.data();
    mk::PackedConvNchwc pd;
    mk::PackedConvWinograd p4;
    mk::PackedConvWinograd2 p2;
    if (mask & 1) pd.pack(w.data(), a.K, a.C, 3, 3, nf::L), a.w = pd.w.data();
    if (mask & 2) p4.pack(w.data(), a.K, a.C, nf::L);
    if (mask & 4) p2.pack(w.data(), a.K, a.C, nf::L);
    auto run = [&](int algo) {
      if (algo == 0) nnfuse_probe_direct(a);
      else if (algo == 1) nnfuse_probe_f4(a, p4);
      else nnfuse_probe_f2(a, p2);
    };
    double best[3] = {1e30, 1e30, 1e30};
    const double start = now_s();
    for (int round = 0; round < 9; ++round) {
      for (int algo = 0; algo < 3; ++algo) {
        if (!(mask >> algo & 1)) continue;
        const double t0 = now_s();
        run(algo);
        const double t = now_s() - t0;
        if (round > 0) best[algo] = t < best[algo] ? t : best[algo];  // round 0 warms caches and scratch
      }
      if (round >= 3 && now_s() - start > 0.15) break;
    }
    for (int algo = 0; algo < 3; ++algo) out[algo] = (mask >> algo & 1) ? best[algo] : -1.0;
  }
  return 0;
}
)";

// The kernels the timing program runs, one unit each: {unit name, source}, each after
// kProbeUnitPrelude. Each times the kernel the model would run: on a map up to kNarrowMapWidth
// wide the generator's class holds the width, which gives the narrow-map register tile (AVX-512's
// 4 x 7, for the direct conv and for Winograd's products alike), so the probe runs a narrow class
// there. The width in a class picks the tile only; one instantiation at kNarrowMapWidth serves
// every narrow width, the direct one entered past conv2d_nchwc's class check (which wants the
// exact width) since the geometry is ours.
constexpr const char* kProbeUnitPrelude = R"(#include "gen_support.h"
namespace {
namespace mk = nnfuse::mk;
constexpr mk::ConvClass kNarrow{mk::ConvKind::Spatial, 0, 0, 0, 0, mk::kNarrowMapWidth, 1};
template <class Packed>
void probe_winograd(const mk::ConvNchwcArgs& a, const Packed& p) {
  if (a.W <= mk::kNarrowMapWidth) mk::conv2d_nchwc_winograd<nf::A, kNarrow>(a, p);
  else mk::conv2d_nchwc_winograd<nf::A>(a, p);
}
}  // namespace
)";
constexpr const char* kProbeKernels[][2] = {
    {"conv_probe_direct", R"(
void nnfuse_probe_direct(const mk::ConvNchwcArgs& a) {
  if (a.W <= mk::kNarrowMapWidth) mk::detail::conv_nchwc_dense<nf::A, kNarrow>(a, mk::IdentityEpilogue{}, mk::SerialFor{});
  else mk::conv2d_nchwc<nf::A, mk::ConvClass{mk::ConvKind::Spatial, 0, 0, 0, 0, 0, 1}>(a, mk::IdentityEpilogue{});
}
)"},
    {"conv_probe_f4", R"(
void nnfuse_probe_f4(const mk::ConvNchwcArgs& a, const mk::PackedConvWinograd& p) { probe_winograd(a, p); }
)"},
    {"conv_probe_f2", R"(
void nnfuse_probe_f2(const mk::ConvNchwcArgs& a, const mk::PackedConvWinograd2& p) { probe_winograd(a, p); }
)"},
};

// Model name of the first CPU in /proc/cpuinfo ("" where there is none): the timing cache's key,
// with the target, since the same ISA runs at different speeds on different cores.
std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0 || line.rfind("Model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "";
}

nlohmann::json read_timings(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return nlohmann::json::object();
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    return j.is_object() ? j : nlohmann::json::object();
  } catch (const nlohmann::json::exception&) {
    return nlohmann::json::object();  // a damaged file is re-measured and rewritten
  }
}

void write_timings(const fs::path& p, const nlohmann::json& j) {
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  // Process and thread: background builds (compile(background=True)) of one process may write it at once.
  fs::path tmp = p.string() + ".tmp" + std::to_string(::getpid()) + "." +
                 std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream f(tmp);
    f << j.dump(1);
    if (!f) return;  // the cache is an optimisation: a read-only cache just re-measures next time
  }
  fs::rename(tmp, p, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace

ConvProbeResult choose_conv_algorithms_by_measurement(KernelModule& mod, const ToolchainOptions& to) {
  auto t0 = std::chrono::steady_clock::now();
  ConvProbeResult r;
  // Timings hold for this CPU, target and block, and for these kernels: measurements of other
  // kernel headers (an older or newer nnfuse, NNFUSE_KERNEL_INCLUDE) are not taken for these.
  const std::string machine =
      cpu_model_name() + " | " + to.target + " | L" + std::to_string(mod.layout_block) + " | kernels " + kernel_headers_hash();
  // One entry per geometry (its key includes the candidate mask): the stages that have it.
  struct Layer {
    std::vector<Stage*> stages;
    std::vector<int64_t> geo;
  };
  std::map<std::string, Layer> layers;
  for (auto& st : mod.stages) {
    const std::vector<int64_t> cand = conv_algorithm_candidates(st);
    if (cand.empty()) continue;
    int64_t mask = 0;
    for (int64_t c : cand) mask |= int64_t(1) << c;
    std::vector<int64_t> geo;
    for (const char* k : {"N", "C", "H", "W", "CO", "OH", "OW", "PH", "PW"}) geo.push_back(stage_iparam(st, k));
    geo.push_back(mask);
    std::string key = "conv3x3";
    for (int64_t v : geo) key += " " + std::to_string(v);
    auto& l = layers[key];
    l.geo = geo;
    l.stages.push_back(&st);
    ++r.layers;
  }
  if (layers.empty()) return r;
  const fs::path cache_file = fs::path(to.cache_dir.empty() ? default_cache_dir() : to.cache_dir) / "conv_timings.json";
  nlohmann::json cache = read_timings(cache_file);
  if (!cache.contains(machine) || !cache[machine].is_object()) cache[machine] = nlohmann::json::object();
  std::vector<std::string> missing;
  std::vector<int64_t> geos;
  for (auto& [key, l] : layers)
    if (!cache[machine].contains(key)) {
      missing.push_back(key);
      geos.insert(geos.end(), l.geo.begin(), l.geo.end());
    }
  if (!missing.empty()) {
    std::vector<SourceUnit> units(1);
    units[0].name = "conv_probe";
    units[0].code = kProbeSource;
    units[0].symbols = {"nnfuse_conv_probe"};
    for (auto& k : kProbeKernels) {
      SourceUnit u;
      u.name = k[0];
      u.code = std::string(kProbeUnitPrelude) + k[1];
      units.push_back(std::move(u));
    }
    BuildResult br = build_shared_object(units, to);
    SharedObject so(br.so_path);
    using ProbeFn = int (*)(const int64_t*, int64_t, double*);
    auto probe = reinterpret_cast<ProbeFn>(so.symbol("nnfuse_conv_probe"));
    std::vector<double> out(missing.size() * 3);
    if (probe(geos.data(), int64_t(missing.size()), out.data()) != 0) fail(ErrorKind::Runtime, "the convolution timing program failed");
    cache = read_timings(cache_file);  // another process may have added entries meanwhile
    if (!cache.contains(machine) || !cache[machine].is_object()) cache[machine] = nlohmann::json::object();
    for (size_t i = 0; i < missing.size(); ++i) {
      nlohmann::json t = nlohmann::json::object();
      for (int64_t algo = 0; algo < 3; ++algo)
        if (out[i * 3 + size_t(algo)] >= 0) t[conv_algorithm_name(algo)] = out[i * 3 + size_t(algo)] * 1e6;
      cache[machine][missing[i]] = t;
    }
    write_timings(cache_file, cache);
    r.measured = int(missing.size());
  }
  std::set<std::string> fresh(missing.begin(), missing.end());
  for (auto& [key, l] : layers) {
    const nlohmann::json& t = cache[machine][key];
    int64_t best = -1;
    double best_us = 0;
    for (int64_t algo = 0; algo < 3; ++algo) {
      const std::string name = conv_algorithm_name(algo);
      if (!t.contains(name) || !t[name].is_number()) continue;
      const double us = t[name].get<double>();
      if (best < 0 || us < best_us) best = algo, best_us = us;
    }
    if (best < 0) continue;  // a damaged entry: the cost model's choice stands
    for (Stage* st : l.stages) {
      st->iparams["ALGO"] = best;
      nlohmann::json rec = t;
      rec["source"] = fresh.count(key) ? "measured" : "cache";
      mod.conv_timings["b" + std::to_string(st->block)] = rec;
    }
  }
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace nnfuse
