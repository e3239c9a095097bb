#include "rewrite/pass.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "graph/bgl.h"
#include "graph/shape_inference.h"

namespace nnfuse {

// ---------------------------------------------------------------- PassArgs
std::string PassArgs::get(const std::string& key, const std::string& dflt) const {
  auto it = values.find(key);
  return it == values.end() ? dflt : it->second;
}
int64_t PassArgs::get_int(const std::string& key, int64_t dflt) const {
  auto it = values.find(key);
  if (it == values.end()) return dflt;
  try {
    size_t used = 0;
    long long v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  fail(ErrorKind::Invalid, "pass argument " + key + "=" + it->second + " is not an integer");
}
bool PassArgs::get_bool(const std::string& key, bool dflt) const {
  auto it = values.find(key);
  if (it == values.end()) return dflt;
  if (it->second == "true" || it->second == "1" || it->second == "on") return true;
  if (it->second == "false" || it->second == "0" || it->second == "off") return false;
  fail(ErrorKind::Invalid, "pass argument " + key + "=" + it->second + " is not a boolean (true/false)");
}
std::string PassArgs::str() const {
  std::string r;
  for (auto& [k, v] : values) r += (r.empty() ? "" : " ") + k + "=" + v;
  return r;
}

std::vector<std::string> split_arg_list(const std::string& value) {
  std::vector<std::string> items;
  for (size_t start = 0;;) {
    size_t comma = value.find(',', start);
    items.push_back(value.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

// ---------------------------------------------------------------- registry
namespace {
class LambdaPass : public Pass {
 public:
  LambdaPass(PassInfo info, std::function<void(PassContext&, const PassArgs&)> fn) : info_(std::move(info)), fn_(std::move(fn)) {}
  const PassInfo& info() const override { return info_; }
  void run(PassContext& ctx, const PassArgs& args) override { fn_(ctx, args); }

 private:
  PassInfo info_;
  std::function<void(PassContext&, const PassArgs&)> fn_;
};

void register_builtin_passes(PassRegistry& r);
}  // namespace

PassRegistry& PassRegistry::global() {
  static PassRegistry* reg = [] {
    auto* r = new PassRegistry();
    register_builtin_passes(*r);
    return r;
  }();
  return *reg;
}

void PassRegistry::add(const std::string& name, PassFactory f) { passes_[name] = std::move(f); }
bool PassRegistry::has(const std::string& name) const { return passes_.count(name) != 0; }
std::unique_ptr<Pass> PassRegistry::create(const std::string& name) const {
  auto it = passes_.find(name);
  if (it == passes_.end()) {
    std::string known;
    for (auto& [k, v] : passes_) known += (known.empty() ? "" : ", ") + k;
    fail(ErrorKind::Invalid, "unknown pass '" + name + "' (passes: " + known + ")");
  }
  return it->second();
}
std::vector<std::string> PassRegistry::names() const {
  std::vector<std::string> r;
  for (auto& [k, v] : passes_) r.push_back(k);
  return r;
}
void PassRegistry::set_provider(const Property& p, const std::string& pass_name) { providers_[p] = pass_name; }
std::string PassRegistry::provider(const Property& p) const {
  auto it = providers_.find(p);
  return it == providers_.end() ? "" : it->second;
}

void register_pass(PassInfo info, std::function<void(PassContext&, const PassArgs&)> run) {
  std::string name = info.name;
  PassRegistry::global().add(name, [info, run] { return std::make_unique<LambdaPass>(info, run); });
}

namespace {
void register_builtin_passes(PassRegistry& r) {
  PassInfo infer{"infer-shapes", "infer every value's shape and dtype (binds nothing; see --shape)", {}, {}, false};
  r.add("infer-shapes", [infer] {
    return std::make_unique<LambdaPass>(infer, [](PassContext& ctx, const PassArgs&) {
      infer_shapes(ctx.graph());
      ctx.valid.insert("shapes");
    });
  });
  r.set_provider("shapes", "infer-shapes");
  PassInfo validate{"validate", "check every IR invariant (names the first broken one)", {}, {}, true};
  r.add("validate", [validate] {
    return std::make_unique<LambdaPass>(validate, [](PassContext& ctx, const PassArgs&) { ctx.graph().validate(); });
  });
}
}  // namespace

// ---------------------------------------------------------------- pipelines
Pipeline parse_pipeline(const std::string& text, const std::string& file) {
  Pipeline p;
  p.file = file;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  auto err = [&](int col, const std::string& msg) { fail(ErrorKind::Parse, msg, {file, lineno, col}); };
  while (std::getline(in, line)) {
    ++lineno;
    if (auto h = line.find('#'); h != std::string::npos) line = line.substr(0, h);
    std::vector<std::pair<std::string, int>> words;  // word, 1-based column
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      if (i >= line.size()) break;
      size_t j = i;
      while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
      words.push_back({line.substr(i, j - i), int(i) + 1});
      i = j;
    }
    if (words.empty()) continue;
    const std::string& kw = words[0].first;
    if (kw == "pipeline" || kw == "class") {
      if (words.size() != 2) err(words[0].second, "expected '" + kw + " NAME', found " + std::to_string(words.size() - 1) + " words after '" + kw + "'");
      (kw == "pipeline" ? p.name : p.network_class) = words[1].first;
    } else if (kw == "description") {
      p.description = line.substr(size_t(words[0].second - 1) + kw.size());
      while (!p.description.empty() && std::isspace(static_cast<unsigned char>(p.description.front()))) p.description.erase(0, 1);
    } else if (kw == "pass") {
      if (words.size() < 2) err(int(line.size()) + 1, "expected a pass name after 'pass'");
      PipelineStep s;
      s.pass = words[1].first;
      s.line = lineno;
      for (size_t k = 2; k < words.size(); ++k) {
        auto eq = words[k].first.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == words[k].first.size())
          err(words[k].second, "expected key=value, found '" + words[k].first + "'");
        s.args.values[words[k].first.substr(0, eq)] = words[k].first.substr(eq + 1);
      }
      p.steps.push_back(std::move(s));
    } else {
      err(words[0].second, "expected 'pipeline', 'class', 'description' or 'pass', found '" + kw + "'");
    }
  }
  if (p.name.empty()) fail(ErrorKind::Parse, "missing 'pipeline NAME' line", {file, 1, 1});
  return p;
}

PassArgs unite_step_args(const PassArgs& a, const PassArgs& b) {
  PassArgs out;
  for (auto& [key, value] : a.values) {
    auto it = b.values.find(key);
    if (it == b.values.end()) continue;
    if (it->second == value) {
      out.values[key] = value;
    } else if (key == "only") {
      std::vector<std::string> names;
      for (const std::string* list : {&value, &it->second})
        for (std::string& name : split_arg_list(*list))
          if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
      std::string joined;
      for (auto& n : names) joined += (joined.empty() ? "" : ",") + n;
      out.values[key] = joined;
    }
  }
  return out;
}

Pipeline load_pipeline_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::Io, "cannot read pipeline file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_pipeline(ss.str(), path);
}

// ---------------------------------------------------------------- hashing
namespace {
struct Hasher {
  // Word-at-a-time mixing (splitmix64 finaliser): hashing a 100k-node graph must stay well under
  // a pass's own cost, since the manager hashes around every pass.
  uint64_t h = 0x9e3779b97f4a7c15ull;
  static uint64_t mix(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  void u64(uint64_t v) { h = mix(h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2))); }
  void bytes(const void* p, size_t n) {
    // Contents (small weights, float attributes) in one call of the library's string hash, which
    // is cheaper per byte than mixing every word into the running state.
    u64(std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(p), n)) ^ (uint64_t(n) << 56));
  }
  void str(const std::string& s) { u64(std::hash<std::string>{}(s)); }
  void tensor(const Tensor& t) {
    u64(uint64_t(t.dtype()));
    for (auto d : t.shape()) u64(uint64_t(d));
    // Small tensors by content (folded constants are new buffers with equal data); large ones
    // by identity: a pass creates a new weight, or rewrites one in place through
    // Tensor::exclusive_raw, which moves its generation on.
    if (t.nbytes() <= 4096) bytes(t.raw(), t.nbytes());
    else u64(reinterpret_cast<uintptr_t>(t.raw())), u64(t.generation());
  }
};

// Value names -> small ids in order of first appearance, so that the hash does not depend on the
// names a pass invents. Open addressing over views of the graph's own strings (alive for the
// whole hash): the manager hashes around every pass, and a std::unordered_map<std::string, ...>
// here allocated a node and copied the name for every value of the graph, every time.
class FirstSeenIds {
 public:
  explicit FirstSeenIds(size_t expected) {
    size_t cap = 64;
    while (cap < expected * 2) cap <<= 1;
    slots_.resize(cap);
  }
  uint64_t id(std::string_view v) {
    if (v.empty()) return ~0ull;
    const size_t h = std::hash<std::string_view>{}(v);
    for (size_t mask = slots_.size() - 1, i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.id == kEmpty) {
        if ((count_ + 1) * 2 > slots_.size()) {
          grow();
          return id(v);
        }
        s = {v, h, count_++};
        return s.id;
      }
      if (s.hash == h && s.name == v) return s.id;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    std::string_view name;
    size_t hash = 0;
    uint64_t id = kEmpty;
  };
  std::vector<Slot> slots_;
  uint64_t count_ = 0;
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    const size_t mask = slots_.size() - 1;
    for (Slot& s : old) {
      if (s.id == kEmpty) continue;
      size_t i = s.hash & mask;
      while (slots_[i].id != kEmpty) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
};
}  // namespace

uint64_t structural_hash(const Graph& g) {
  Hasher H;
  const GraphImpl& impl = g.impl();
  FirstSeenIds ids(impl.values.size() + g.inputs().size() + 16);
  auto value_id = [&](const std::string& v) { return ids.id(v); };
  for (auto& i : g.inputs()) H.u64(value_id(i));
  for (auto& [w, t] : impl.initializers) {  // sorted by name, as initializer_names()
    H.u64(value_id(w));
    H.tensor(t);
  }
  for (NodeId n : g.topo_order()) {
    const Node& node = g.node(n);
    H.str(node.op_type);
    H.str(node.domain);
    for (auto& i : node.inputs) H.u64(value_id(i));
    H.u64(0xfeed);
    for (auto& o : node.outputs) H.u64(value_id(o));
    for (auto& [k, a] : node.attrs.all()) {
      H.str(k);
      H.u64(uint64_t(a.kind));
      switch (a.kind) {
        case Attribute::Kind::Float: H.bytes(&a.f, sizeof a.f); break;
        case Attribute::Kind::Int: H.u64(uint64_t(a.i)); break;
        case Attribute::Kind::String: H.str(a.s); break;
        case Attribute::Kind::Tensor: H.tensor(a.t); break;
        case Attribute::Kind::Graph: H.u64(a.g ? structural_hash(*a.g) : 0); break;
        case Attribute::Kind::Floats: H.bytes(a.floats.data(), a.floats.size() * sizeof(float)); break;
        case Attribute::Kind::Ints: for (auto v : a.ints) H.u64(uint64_t(v)); break;
        case Attribute::Kind::Strings: for (auto& s : a.strings) H.str(s); break;
        case Attribute::Kind::Tensors: for (auto& t : a.tensors) H.tensor(t); break;
        case Attribute::Kind::Graphs: for (auto& gg : a.graphs) H.u64(gg ? structural_hash(*gg) : 0); break;
        case Attribute::Kind::Type:
          if (a.type) H.str(a.type->str());
          break;
      }
    }
  }
  for (auto& o : g.outputs()) H.u64(value_id(o));
  return H.h;
}

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

// ---------------------------------------------------------------- manager
namespace {

// Runs `pass` inside every If/Loop/Scan body of ctx's graph, and inside the bodies nested in
// those. Each body runs as a graph of its own: what it reads from the enclosing graphs are values
// without a producer there, never constants (weights an exporter left outside a branch are not
// folded into it; copying them in would shadow the outer names). Its types are the ones the
// enclosing graph's shape inference gave it: a pass that needs shapes runs in bodies only when
// they are current. A changed body replaces the attribute's graph (copies of the model that
// share the old body keep it).
void run_in_bodies(Pass& pass, const PipelineStep& step, PassContext& ctx, bool shapes_valid) {
  const PassInfo& info = pass.info();
  const bool needs_shapes = std::find(info.requires_.begin(), info.requires_.end(), "shapes") != info.requires_.end();
  if (needs_shapes && !shapes_valid) return;
  Graph& g = ctx.graph();
  for (NodeId id : g.node_ids()) {
    std::vector<std::pair<std::string, int>> slots;  // attribute, index in a Graphs list (-1: Graph)
    for (auto& [k, a] : g.node(id).attrs.all()) {
      if (a.kind == Attribute::Kind::Graph && a.g) slots.push_back({k, -1});
      if (a.kind == Attribute::Kind::Graphs)
        for (size_t i = 0; i < a.graphs.size(); ++i)
          if (a.graphs[i]) slots.push_back({k, int(i)});
    }
    for (auto& [k, i] : slots) {
      const Attribute* a = g.node(id).attrs.find(k);
      const Graph& body = i < 0 ? *a->g : *a->graphs[size_t(i)];
      Model sub;
      sub.graph = body;
      sub.ir_version = ctx.model->ir_version;
      const uint64_t h0 = structural_hash(sub.graph);
      PassContext sctx;
      sctx.model = &sub;
      sctx.target = ctx.target;
      sctx.verify = ctx.verify;
      sctx.user_rule_files = ctx.user_rule_files;
      if (shapes_valid) sctx.valid.insert("shapes");
      try {
        pass.run(sctx, step.args);
        run_in_bodies(pass, step, sctx, shapes_valid);
      } catch (const Error& e) {
        ErrorContext c = e.context();
        throw Error(e.kind(), "in the " + k + " of node '" + g.node(id).label() + "': " + e.detail(), c);
      }
      for (auto& [rule, count] : sctx.rules_fired) ctx.rules_fired[rule] += count;
      ctx.warnings.insert(ctx.warnings.end(), sctx.warnings.begin(), sctx.warnings.end());
      if (structural_hash(sub.graph) == h0) continue;
      if (ctx.verify) sub.graph.validate();
      Attribute na = *a;
      auto fresh = std::make_shared<Graph>(std::move(sub.graph));
      if (i < 0) na.g = fresh;
      else na.graphs[size_t(i)] = fresh;
      g.attrs(id).set(k, std::move(na));
    }
  }
}

}  // namespace

void PassManager::run_step(const PipelineStep& step, PassContext& ctx, std::vector<PassRecord>& records) const {
  const PassRegistry& reg = PassRegistry::global();
  std::unique_ptr<Pass> pass = reg.create(step.pass);
  const PassInfo& info = pass->info();
  for (auto& req : info.requires_) {
    if (ctx.valid.count(req)) continue;
    std::string prov = reg.provider(req);
    if (prov.empty()) fail(ErrorKind::Invalid, "pass '" + info.name + "' requires '" + req + "', which no pass provides");
    if (prov == step.pass) continue;
    PipelineStep auto_step{prov, {}, step.line};
    size_t before = records.size();
    run_step(auto_step, ctx, records);
    for (size_t k = before; k < records.size(); ++k) records[k].auto_inserted = true;
  }
  PassRecord rec;
  rec.name = info.name;
  rec.args = step.args.str();
  rec.nodes_before = ctx.graph().num_nodes();
  uint64_t h0 = info.analysis ? 0 : (ctx.last_hash ? *ctx.last_hash : structural_hash(ctx.graph()));
  auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_ms();
  const bool shapes_valid = ctx.valid.count("shapes") != 0;
  try {
    pass->run(ctx, step.args);
    if (info.bodies && !info.analysis) run_in_bodies(*pass, step, ctx, shapes_valid);
  } catch (const Error& e) {
    ErrorContext c = e.context();
    throw Error(e.kind(), "in pass '" + info.name + "': " + e.detail(), c);
  }
  rec.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  rec.cpu_ms = thread_cpu_ms() - cpu0;
  if (!info.analysis) {
    uint64_t h1 = structural_hash(ctx.graph());
    rec.changed = h1 != h0;
    ctx.last_hash = h1;  // the next pass starts from this graph: no need to hash it again
  }
  rec.nodes_after = ctx.graph().num_nodes();
  if (rec.changed) {
    std::set<Property> keep;
    for (auto& p : info.preserves)
      if (ctx.valid.count(p)) keep.insert(p);
    if (reg.provider("shapes") == info.name) keep.insert("shapes");
    ctx.valid = keep;
  }
  if (ctx.verify) ctx.graph().validate();
  records.push_back(rec);
}

std::vector<PassRecord> PassManager::run(const Pipeline& p, PassContext& ctx) const {
  const PassRegistry& reg = PassRegistry::global();
  for (auto& s : p.steps)
    if (!reg.has(s.pass)) {
      std::string known;
      for (auto& n : reg.names()) known += (known.empty() ? "" : ", ") + n;
      fail(ErrorKind::Parse, "unknown pass '" + s.pass + "' (passes: " + known + ")", {p.file, s.line, 0});
    }
  // Arguments are checked before anything runs; the check's time is the step's (it may read the
  // pass's data, e.g. a rule file), so it is added to the step's record.
  std::vector<double> check_ms(p.steps.size(), 0.0), check_cpu_ms(p.steps.size(), 0.0);
  for (size_t k = 0; k < p.steps.size(); ++k) {
    const PipelineStep& s = p.steps[k];
    if (s.args.values.empty()) continue;
    std::unique_ptr<Pass> pass = reg.create(s.pass);
    if (!pass->info().check_args)  // a pass that declares no argument check takes none
      fail(ErrorKind::Parse, "pass '" + s.pass + "' takes no arguments, the pipeline gives it '" + s.args.str() + "'", {p.file, s.line, 0});
    auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = thread_cpu_ms();
    try {
      pass->info().check_args(s.args);
    } catch (const Error& e) {
      std::string prefix = "pass '" + s.pass + "': ";
      fail(ErrorKind::Parse, (e.detail().rfind(prefix, 0) == 0 ? "" : prefix) + e.detail(), {p.file, s.line, 0});
    }
    check_ms[k] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    check_cpu_ms[k] = thread_cpu_ms() - cpu0;
  }
  std::vector<PassRecord> records;
  for (size_t k = 0; k < p.steps.size(); ++k) {
    run_step(p.steps[k], ctx, records);
    records.back().ms += check_ms[k];  // the step's own record comes last (requirements run first)
    records.back().cpu_ms += check_cpu_ms[k];
  }
  return records;
}

}  // namespace nnfuse
