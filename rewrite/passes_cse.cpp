// cse: common-subexpression elimination.
//
// Initializers first: two with the same dtype, shape and bytes become one (compared by content:
// the bucket key reads dtype, shape and a sample of kSampleElems strided elements plus the first
// and last bytes, so it costs the same for a 10 MB weight as for a bias; equals() confirms). Then nodes, in
// topological order, keyed by op, domain, inputs and attributes (by value): a node whose key was
// seen is merged into the first one, its readers rewired. Random ops and nodes with subgraphs are
// never merged. Graph outputs keep their names (a merge that would rename one is skipped).
#include <unordered_map>

#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

constexpr size_t kSampleElems = 64;
constexpr size_t kEdgeBytes = 64;

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 1099511628211ull;
  }
  return h;
}
uint64_t fnv_str(uint64_t h, const std::string& s) {
  uint64_t n = s.size();
  return fnv(fnv(h, &n, sizeof n), s.data(), s.size());
}

uint64_t tensor_key(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  int d = int(t.dtype());
  h = fnv(h, &d, sizeof d);
  for (int64_t x : t.shape()) h = fnv(h, &x, sizeof x);
  // Equal tensors always get equal keys (the key is a function of the bytes); unequal ones
  // rarely share one, and a shared key only costs a memcmp that stops at the first difference.
  const auto* bytes = static_cast<const unsigned char*>(t.raw());
  const size_t nbytes = t.nbytes(), esize = dtype_size(t.dtype());
  if (nbytes <= 2 * kEdgeBytes + kSampleElems * esize) return fnv(h, bytes, nbytes);
  h = fnv(h, bytes, kEdgeBytes);
  h = fnv(h, bytes + nbytes - kEdgeBytes, kEdgeBytes);
  const size_t n = nbytes / esize, step = n / kSampleElems;
  for (size_t i = 0; i < kSampleElems; ++i) h = fnv(h, bytes + i * step * esize, esize);
  return h;
}

int merge_initializers(Graph& g, const std::set<std::string>& body_reads) {
  std::unordered_map<uint64_t, std::vector<std::string>> buckets;
  int merged = 0;
  for (auto& name : g.initializer_names()) {
    if (g.is_input(name)) continue;  // an input may override it at run time
    const Tensor& t = g.initializer(name);
    auto& bucket = buckets[tensor_key(t)];
    std::string keep;
    for (auto& other : bucket)
      if (g.initializer(other).equals(t)) {
        keep = other;
        break;
      }
    if (keep.empty() || g.is_output(name) || body_reads.count(name)) {
      bucket.push_back(name);
      continue;
    }
    g.replace_all_uses(name, keep);
    g.remove_initializer(name);
    ++merged;
  }
  return merged;
}

std::string node_key(const Node& n) {
  uint64_t h = 1469598103934665603ull;
  h = fnv_str(h, n.op_type);
  h = fnv_str(h, n.domain);
  for (auto& [k, a] : n.attrs.all()) {
    h = fnv_str(h, k);
    int kind = int(a.kind);
    h = fnv(h, &kind, sizeof kind);
  }
  std::string key = std::to_string(h) + "|";
  for (auto& i : n.inputs) key += i + "|";
  key += std::to_string(n.outputs.size());
  return key;
}

bool same_node(const Node& a, const Node& b) {
  if (a.op_type != b.op_type || a.domain != b.domain || a.inputs != b.inputs || !(a.attrs == b.attrs)) return false;
  if (a.outputs.size() != b.outputs.size()) return false;
  for (size_t k = 0; k < a.outputs.size(); ++k)
    if (a.outputs[k].empty() != b.outputs[k].empty()) return false;  // optional outputs alike
  return true;
}

// Can every output of `dup` be redirected to the matching output of `keep`?
// (A graph-output duplicate renames the kept node's output, which a subgraph body may read.)
bool condition(const Graph& g, const Node& keep, const Node& dup, const std::set<std::string>& body_reads) {
  for (size_t k = 0; k < dup.outputs.size(); ++k) {
    if (dup.outputs[k].empty()) continue;
    if (!can_redirect(g, dup.outputs[k], keep.outputs[k])) return false;
    if (g.is_output(dup.outputs[k]) && body_reads.count(keep.outputs[k])) return false;
  }
  return true;
}

void apply(Graph& g, NodeId keep_id, NodeId dup_id) {
  Node dup = g.node(dup_id);
  g.remove_node(dup_id, /*drop_outputs=*/false);
  for (size_t k = 0; k < dup.outputs.size(); ++k) {
    if (dup.outputs[k].empty()) continue;
    // Re-read each time: a redirect may rebuild the kept node under a new id.
    redirect(g, dup.outputs[k], g.node(keep_id).outputs[k]);
    if (!g.has_node(keep_id)) keep_id = *g.producer(dup.outputs[k]);
  }
}

int merge_nodes(Graph& g, const std::set<std::string>& body_reads) {
  std::unordered_map<std::string, std::vector<NodeId>> seen;
  int merged = 0;
  for (NodeId id : g.topo_order()) {
    if (!g.has_node(id)) continue;
    const Node& n = g.node(id);
    if (is_random_op(n) || has_subgraph(n) || n.outputs.empty()) continue;
    auto& bucket = seen[node_key(n)];
    bool read_by_body = false;
    for (auto& o : n.outputs) read_by_body |= body_reads.count(o) != 0;
    if (read_by_body) {  // its names must stay: it can be kept, never merged away
      bucket.push_back(id);
      continue;
    }
    bool done = false;
    for (NodeId& other : bucket) {
      if (!g.has_node(other) || !same_node(g.node(other), n) || !condition(g, g.node(other), n, body_reads)) continue;
      Node keep_copy = g.node(other);
      apply(g, other, id);
      // The kept node may have been rebuilt (to keep a graph output's name): track its new id.
      for (auto& o : keep_copy.outputs)
        if (!o.empty() && g.has_value(o) && g.producer(o)) { other = *g.producer(o); break; }
      ++merged;
      done = true;
      break;
    }
    if (!done) bucket.push_back(id);
  }
  return merged;
}

// `initializers=false` / `nodes=false` skip one half: a class pipeline whose models never had equal
// initializers need not pay it (both halves report their merges separately for that choice).
void check_args(const PassArgs& args) {
  for (auto& [key, value] : args.values)
    if (key != "initializers" && key != "nodes") fail(ErrorKind::Invalid, "pass 'cse': unknown argument '" + key + "' (arguments: initializers=BOOL, nodes=BOOL)");
  args.get_bool("initializers", true), args.get_bool("nodes", true);
}

void run(PassContext& ctx, const PassArgs& args) {
  check_args(args);
  Graph& g = ctx.graph();
  std::set<std::string> body_reads = names_read_by_subgraphs(g);
  int inits = args.get_bool("initializers", true) ? merge_initializers(g, body_reads) : 0;
  int nodes = args.get_bool("nodes", true) ? merge_nodes(g, body_reads) : 0;
  if (inits + nodes) {
    g.prune_values();
    ctx.rules_fired["cse"] += inits + nodes;
    if (inits) ctx.rules_fired["cse-initializers"] += inits;
    if (nodes) ctx.rules_fired["cse-nodes"] += nodes;
  }
}

}  // namespace

void register_cse_pass() {
  PassInfo info{"cse", "merge nodes with equal op, attributes and inputs, and initializers with equal contents", {}, {"shapes"}, false};
  info.check_args = check_args;
  info.bodies = true;
  register_pass(info, run);
}

}  // namespace nnfuse::passes
