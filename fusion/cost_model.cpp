#include "fusion/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <vector>
#include <unistd.h>

#include "graph/op_registry.h"

namespace nnfuse {

const char* fused_access_name(FusedAccess a) {
  switch (a) {
    case FusedAccess::Free: return "free";
    case FusedAccess::Strided: return "strided";
    case FusedAccess::IndexArith: return "index-arith";
    case FusedAccess::Broadcast: return "broadcast";
  }
  return "?";
}

double PairEstimate::ratio() const {
  return penalty_us <= 0 ? std::numeric_limits<double>::infinity() : saved_us / penalty_us;
}

namespace {
int64_t bytes_of(const TensorType& t) {
  auto n = t.numel();
  return n ? *n * int64_t(std::max<size_t>(1, dtype_size(t.dtype))) : 0;
}

// Bandwidth for a tensor of `bytes`: from L2 when it fits, else from memory (GB/s = bytes/ns).
double bandwidth_gbps(int64_t bytes, const TargetDesc& t) { return t.mem_gbps * (bytes <= t.l2_bytes ? 4.0 : 1.0); }
double launch_us(const TargetDesc& t) { return t.family == "cuda" || t.family == "opencl" ? 5.0 : 1.0; }

// A Transpose whose permutation keeps the last axis last only reorders rows: contiguous runs
// survive and the fused access stays cheap.
int64_t shuffle_inner_stride(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.op_type != "Transpose" || n.inputs.empty()) return 1;
  const TensorType& in = g.type(n.inputs[0]);
  if (!in.is_static()) return 1;
  Shape s = in.static_shape();
  std::vector<int64_t> perm = n.attrs.get_ints("perm");
  if (perm.empty())
    for (int64_t i = int64_t(s.size()) - 1; i >= 0; --i) perm.push_back(i);
  if (perm.empty() || perm.back() == int64_t(s.size()) - 1) return 1;
  return shape_strides(s)[size_t(perm.back())];
}
}  // namespace

PairEstimate estimate_pair(const Graph& g, NodeId first, NodeId second, const TargetDesc& t) {
  PairEstimate e;
  const Node& a = g.node(first);
  const Node& b = g.node(second);
  for (auto& o : a.outputs)
    if (!o.empty() && std::find(b.inputs.begin(), b.inputs.end(), o) != b.inputs.end()) e.intermediate_bytes += bytes_of(g.type(o));
  for (auto& o : b.outputs)
    if (!o.empty())
      if (auto n = g.type(o).numel()) e.elements += *n;
  // Memory round trip: written once, read once; from cache when it fits in L2.
  e.saved_us = 2.0 * double(e.intermediate_bytes) / (bandwidth_gbps(e.intermediate_bytes, t) * 1e3) + launch_us(t);

  MappingType ma = node_mapping_type(g, first), mb = node_mapping_type(g, second);
  double flops_per_us = t.peak_gflops * 1e3;
  auto shuffle_penalty = [&](NodeId shuffle) {
    e.inner_stride = shuffle_inner_stride(g, shuffle);
    if (e.inner_stride == 1) return;
    e.access = FusedAccess::Strided;
    // A strided access touches a cache line per element instead of per vector of elements.
    double lines = double(e.elements) * (1.0 - double(sizeof(float)) / 64.0);
    e.penalty_us = lines * 64.0 / (t.mem_gbps * 1e3) * (e.intermediate_bytes <= t.l2_bytes ? 0.25 : 1.0);
  };
  if (mb == MappingType::Shuffle) shuffle_penalty(second);
  else if (ma == MappingType::Shuffle) shuffle_penalty(first);
  bool one_to_many = ma == MappingType::OneToMany || mb == MappingType::OneToMany;
  bool reorganize = ma == MappingType::Reorganize || mb == MappingType::Reorganize;
  if (e.access == FusedAccess::Free && one_to_many && (reorganize || ma == MappingType::Shuffle || mb == MappingType::Shuffle)) {
    // Composing a broadcast with a reshape needs a div/mod per element (~20 flop-equivalents).
    e.access = FusedAccess::IndexArith;
    e.penalty_us = double(e.elements) * 20.0 / flops_per_us;
  } else if (e.access == FusedAccess::Free && ma == MappingType::ManyToMany && mb == MappingType::OneToMany) {
    // The anchor's epilogue writes each result several times, scattered.
    e.access = FusedAccess::Broadcast;
    e.penalty_us = double(e.elements) * 4.0 / flops_per_us;
  }
  return e;
}

RecomputeEstimate estimate_recompute(const Graph& g, const std::vector<NodeId>& chain, int consumers, const TargetDesc& t,
                                     bool own_kernel) {
  RecomputeEstimate e;
  e.consumers = consumers;
  std::unordered_set<NodeId> inside(chain.begin(), chain.end());
  std::unordered_set<std::string> produced, read;
  double flops = 0;
  int64_t elements = 0;
  for (NodeId id : chain) {
    flops += node_flops(g, id);
    for (auto& o : g.node(id).outputs)
      if (!o.empty()) produced.insert(o);
  }
  for (NodeId id : chain) {
    for (auto& i : g.node(id).inputs)
      if (!i.empty() && !produced.count(i) && read.insert(i).second) e.input_bytes += bytes_of(g.type(i));
    for (auto& o : g.node(id).outputs) {
      if (o.empty()) continue;
      bool outside = g.is_output(o);
      for (auto& u : g.consumers(o)) outside |= !inside.count(u.node);
      if (!outside) continue;
      e.output_bytes += bytes_of(g.type(o));
      elements = std::max<int64_t>(elements, g.type(o).numel().value_or(0));
    }
  }
  e.flops_per_element = elements > 0 ? flops / double(elements) : flops;
  double in_us = double(e.input_bytes) / (bandwidth_gbps(e.input_bytes, t) * 1e3);
  double out_us = double(e.output_bytes) / (bandwidth_gbps(e.output_bytes, t) * 1e3);
  double compute_us = flops / (t.peak_gflops * 1e3);
  e.materialise_us = (own_kernel ? launch_us(t) + in_us + compute_us : 0.0) + out_us + double(consumers) * out_us;
  e.recompute_us = double(consumers) * (in_us + compute_us);
  return e;
}

Verdict judge(const PairEstimate& e) {
  double r = e.ratio();
  if (r >= 2.0) return Verdict::Fuse;
  if (r <= 0.5) return Verdict::Split;
  return Verdict::Unsure;
}

std::string pair_signature(const Graph& g, NodeId first, NodeId second, const PairEstimate& e, const TargetDesc& t) {
  const Node& a = g.node(first);
  const Node& b = g.node(second);
  std::string s = a.op_type + "(" + mapping_type_name(node_mapping_type(g, first)) + ")>" + b.op_type + "(" +
                  mapping_type_name(node_mapping_type(g, second)) + ")";
  s += "|bytes=" + std::to_string(e.intermediate_bytes) + "|elems=" + std::to_string(e.elements);
  s += "|access=" + std::string(fused_access_name(e.access)) + "|stride=" + std::to_string(e.inner_stride);
  return s + "|target=" + t.name;
}

// ---------------------------------------------------------------- measurement
namespace {
template <class F>
double best_us(F&& f, int reps = 3) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return best;
}
volatile float g_sink;
}  // namespace

ProfileResult measure_pair(const PairEstimate& e) {
  // Cap the working set so a measurement stays within a few milliseconds.
  const int64_t n = std::clamp<int64_t>(std::max(e.intermediate_bytes / 4, e.elements), 1024, 1 << 22);
  std::vector<float> src(static_cast<size_t>(n), 1.0f), dst(static_cast<size_t>(n));
  ProfileResult r;
  r.materialise_us = best_us([&] {
    for (int64_t i = 0; i < n; ++i) dst[size_t(i)] = src[size_t(i)] * 1.0001f;  // write the intermediate
    float acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += dst[size_t(i)];                      // read it back
    g_sink = acc;
  });
  double fused_base = best_us([&] {
    float acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += src[size_t(i)];
    g_sink = acc;
  });
  double fused = fused_base;
  if (e.access == FusedAccess::Strided) {
    int64_t stride = std::max<int64_t>(e.inner_stride, 2);
    int64_t rows = std::max<int64_t>(1, n / stride);
    fused = best_us([&] {
      float acc = 0;
      for (int64_t j = 0; j < stride; ++j)
        for (int64_t i = 0; i < rows; ++i) acc += src[size_t(i * stride + j)];
      g_sink = acc;
    });
  } else if (e.access == FusedAccess::IndexArith) {
    int64_t inner = 7;  // a non-power-of-two divisor, as reshapes of real shapes have
    fused = best_us([&] {
      float acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += src[size_t((i / inner) * inner + i % inner)];
      g_sink = acc;
    });
  } else if (e.access == FusedAccess::Broadcast) {
    fused = best_us([&] {
      for (int64_t i = 0; i < n; ++i) dst[size_t(i)] = src[size_t(i / 2)];
      g_sink = dst[size_t(n - 1)];
    });
  }
  r.penalty_us = std::max(0.0, fused - fused_base);
  r.fuse = r.penalty_us <= r.materialise_us;
  return r;
}

// ---------------------------------------------------------------- cache
ProfileCache::ProfileCache(std::string path) : path_(std::move(path)) {
  std::ifstream in(path_);
  if (!in) return;
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    if (!j.is_object() || !j.contains("entries") || !j["entries"].is_object()) return;
    for (auto& [k, v] : j["entries"].items())
      entries_[k] = ProfileResult{v.at("fuse").get<bool>(), v.at("materialise_us").get<double>(), v.at("penalty_us").get<double>()};
  } catch (const std::exception&) {
    entries_.clear();  // a corrupt cache is rebuilt, never trusted
  }
}

std::string ProfileCache::default_path() {
  if (const char* p = std::getenv("NNFUSE_PROFILE_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/nnfuse/profile.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/nnfuse/profile.json";
  return ".nnfuse-profile.json";
}

std::optional<ProfileResult> ProfileCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void ProfileCache::put(const std::string& key, const ProfileResult& r) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = r;
}

size_t ProfileCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void ProfileCache::save() const {
  nlohmann::json j;
  j["version"] = 1;
  j["entries"] = nlohmann::json::object();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [k, v] : entries_) j["entries"][k] = {{"fuse", v.fuse}, {"materialise_us", v.materialise_us}, {"penalty_us", v.penalty_us}};
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(path_);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  std::string tmp = path_ + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!out) fail(ErrorKind::Io, "cannot write the profile cache '" + tmp + "'");
    out << j.dump(1) << "\n";
  }
  fs::rename(tmp, p, ec);
  if (ec) fail(ErrorKind::Io, "cannot write the profile cache '" + path_ + "': " + ec.message());
}

}  // namespace nnfuse
