#include "graph/graph.h"

#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_set>

#include "graph/bgl.h"

namespace nnfuse {

// ---------------------------------------------------------------- TensorType
TensorType TensorType::of(DType t, const Shape& s) {
  std::vector<Dim> d;
  for (auto v : s) d.emplace_back(v);
  return TensorType(t, std::move(d));
}
bool TensorType::is_static() const {
  // A sequence's or optional's dims describe what it holds, not a buffer: never static.
  if (!has_shape || kind != ValueKind::Tensor) return false;
  for (auto& d : dims)
    if (!d.known()) return false;
  return true;
}
Shape TensorType::static_shape() const {
  if (!is_static()) fail(ErrorKind::Shape, "shape " + str() + " is not static");
  Shape s;
  for (auto& d : dims) s.push_back(d.value);
  return s;
}
std::optional<int64_t> TensorType::numel() const {
  if (!is_static()) return std::nullopt;
  return shape_numel(static_shape());
}
std::string TensorType::str() const {
  if (kind == ValueKind::Sequence || kind == ValueKind::Optional) {
    TensorType elem = *this;
    elem.kind = kind == ValueKind::Optional ? optional_of : ValueKind::Tensor;
    elem.optional_of = ValueKind::Tensor;
    return (kind == ValueKind::Sequence ? "seq(" : "optional(") + elem.str() + ")";
  }
  std::string r = dtype_name(dtype);
  if (!has_shape) return r + "[?]";
  r += "[";
  for (size_t i = 0; i < dims.size(); ++i) r += (i ? "," : "") + dims[i].str();
  return r + "]";
}

int Node::num_present_inputs() const {
  int n = 0;
  for (auto& i : inputs) n += !i.empty();
  return n;
}

// ---------------------------------------------------------------- Graph
uint64_t next_graph_revision() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

namespace {
// The If/Loop/Scan bodies a node holds in its graph attributes.
std::vector<const Graph*> bodies_of(const Node& n) {
  std::vector<const Graph*> bodies;
  for (auto& [name, a] : n.attrs.all()) {
    if (a.kind == Attribute::Kind::Graph && a.g) bodies.push_back(a.g.get());
    if (a.kind == Attribute::Kind::Graphs)
      for (auto& b : a.graphs)
        if (b) bodies.push_back(b.get());
  }
  return bodies;
}

bool holds_bodies(const Node& n) {
  for (auto& [name, a] : n.attrs.all())
    if (a.kind == Attribute::Kind::Graph || a.kind == Attribute::Kind::Graphs) return true;
  return false;
}

// The revisions of `g` and of every body nested in it: equal stamps, same body reads (revisions
// are never reused, so a body replaced by another one changes the stamp too).
void stamp_of(const Graph& g, std::vector<uint64_t>& out) {
  const GraphImpl& I = g.impl();
  out.push_back(I.revision);
  for (NodeId id : I.body_holders) {
    auto it = I.vertex_of.find(id);
    if (it == I.vertex_of.end()) continue;
    for (const Graph* b : bodies_of(I.g[it->second])) stamp_of(*b, out);
  }
}

// The body-read edges of `g`, or null when no node of it holds a body (the common case, one test).
// The result stays valid until the graph is edited.
const BodyReadEdges* body_read_edges(const Graph& g) {
  const GraphImpl& I = g.impl();
  if (I.body_holders.empty()) return nullptr;
  std::vector<uint64_t> stamp;
  stamp_of(g, stamp);
  std::lock_guard<std::mutex> lock(I.body_reads_mutex);
  BodyReadEdges& e = I.body_reads;
  if (e.stamp == stamp) return &e;
  e.readers.clear();
  e.producers.clear();
  for (NodeId id : I.body_holders) {
    auto vx = I.vertex_of.find(id);
    if (vx == I.vertex_of.end()) continue;
    std::set<NodeId> from;
    for (const Graph* b : bodies_of(I.g[vx->second]))
      for (auto& ref : b->outer_references()) {  // nested bodies' reads included
        auto it = I.values.find(ref);
        if (it != I.values.end() && it->second.producer != kNoNode) from.insert(it->second.producer);
      }
    if (from.empty()) continue;
    for (NodeId p : from) e.readers[p].push_back(id);  // ids ascending: each list stays sorted
    e.producers[id].assign(from.begin(), from.end());
  }
  e.stamp = std::move(stamp);
  return &e;
}

const std::vector<NodeId>& edges_at(const BodyReadEdges* e, bool readers, NodeId id) {
  static const std::vector<NodeId> none;
  if (!e) return none;
  auto& m = readers ? e->readers : e->producers;
  auto it = m.find(id);
  return it == m.end() ? none : it->second;
}
}  // namespace

Vertex GraphImpl::vertex(NodeId id) const {
  auto it = vertex_of.find(id);
  if (it == vertex_of.end()) fail(ErrorKind::Invalid, "no node with id " + std::to_string(id));
  return it->second;
}

Graph::Graph() : impl_(std::make_unique<GraphImpl>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

Graph::Graph(const Graph& o) : impl_(std::make_unique<GraphImpl>()) { *this = o; }

Graph& Graph::operator=(const Graph& o) {
  if (this == &o) return *this;
  name = o.name;
  doc = o.doc;
  is_subgraph = o.is_subgraph;
  opset_imports = o.opset_imports;
  auto fresh = std::make_unique<GraphImpl>();
  const GraphImpl& s = *o.impl_;
  fresh->values = s.values;
  fresh->inputs = s.inputs;
  fresh->outputs = s.outputs;
  fresh->initializers = s.initializers;
  fresh->next_id = s.next_id;
  fresh->name_counter = s.name_counter;
  // Rebuild vertices and edges: descriptors of the source are meaningless here.
  std::vector<NodeId> ids;
  for (auto& [id, v] : s.vertex_of) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (NodeId id : ids) {
    Node n = s.g[s.vertex_of.at(id)];
    // Subgraph bodies are owned by their node: deep-copy them too.
    for (auto& [k, a] : n.attrs.all()) {
      if (a.kind == Attribute::Kind::Graph && a.g) {
        Attribute c = a;
        c.g = std::make_shared<Graph>(*a.g);
        n.attrs.set(k, c);
      } else if (a.kind == Attribute::Kind::Graphs) {
        Attribute c = a;
        for (auto& gg : c.graphs) gg = std::make_shared<Graph>(*gg);
        n.attrs.set(k, c);
      }
    }
    if (holds_bodies(n)) fresh->body_holders.insert(id);
    fresh->vertex_of[id] = boost::add_vertex(n, fresh->g);
  }
  fresh->nodes_by_name = s.nodes_by_name;
  for (auto e : boost::make_iterator_range(boost::edges(s.g))) {
    NodeId a = s.g[boost::source(e, s.g)].id, b = s.g[boost::target(e, s.g)].id;
    boost::add_edge(fresh->vertex_of[a], fresh->vertex_of[b], s.g[e], fresh->g);
  }
  impl_ = std::move(fresh);
  return *this;
}

int64_t Graph::opset(const std::string& domain) const {
  auto it = opset_imports.find(domain);
  if (it == opset_imports.end() && domain.empty()) it = opset_imports.find("ai.onnx");
  return it == opset_imports.end() ? 0 : it->second;
}

bool Graph::has_value(const std::string& n) const { return impl_->values.count(n) != 0; }

const Value* Graph::find_value(const std::string& n) const {
  auto it = impl_->values.find(n);
  return it == impl_->values.end() ? nullptr : &it->second;
}

const Value& Graph::value(const std::string& n) const {
  auto it = impl_->values.find(n);
  if (it == impl_->values.end()) fail(ErrorKind::Model, "no tensor named '" + n + "' in the graph");
  return it->second;
}

void Graph::set_type(const std::string& n, TensorType t) {
  auto it = impl_->values.find(n);
  if (it == impl_->values.end()) fail(ErrorKind::Model, "no tensor named '" + n + "' in the graph");
  it->second.type = std::move(t);
}

void Graph::declare_value(const std::string& n, TensorType t) {
  if (n.empty()) fail(ErrorKind::Invalid, "tensor names must not be empty");
  auto [it, inserted] = impl_->values.try_emplace(n);
  if (inserted) it->second.name = n;
  if (t.dtype != DType::Undefined || t.has_shape) it->second.type = std::move(t);
}

std::string Graph::fresh_name(const std::string& hint) {
  std::string base = hint.empty() ? "t" : hint;
  if (!has_value(base) && find_node(base) == kNoNode) return base;
  for (;;) {
    std::string c = base + "_" + std::to_string(++impl_->name_counter);
    if (!has_value(c)) return c;
  }
}

std::vector<std::string> Graph::value_names() const {
  std::vector<std::string> r;
  for (auto& [k, v] : impl_->values) r.push_back(k);
  std::sort(r.begin(), r.end());
  return r;
}

const std::vector<std::string>& Graph::inputs() const { return impl_->inputs; }
const std::vector<std::string>& Graph::outputs() const { return impl_->outputs; }

void Graph::add_input(const std::string& n, TensorType t) {
  if (is_input(n)) fail(ErrorKind::Model, "graph input '" + n + "' is listed twice");
  declare_value(n, std::move(t));
  if (impl_->values[n].producer != kNoNode) fail(ErrorKind::Model, "graph input '" + n + "' is also produced by a node");
  impl_->inputs.push_back(n);
  impl_->touch();
}

void Graph::add_output(const std::string& n) {
  declare_value(n);
  impl_->outputs.push_back(n);
}

void Graph::set_outputs(std::vector<std::string> names) {
  for (auto& n : names) declare_value(n);
  impl_->outputs = std::move(names);
}

void Graph::remove_input(const std::string& n) {
  auto& v = impl_->inputs;
  v.erase(std::remove(v.begin(), v.end(), n), v.end());
  impl_->touch();
}

bool Graph::is_input(const std::string& n) const {
  return std::find(impl_->inputs.begin(), impl_->inputs.end(), n) != impl_->inputs.end();
}
bool Graph::is_output(const std::string& n) const {
  return std::find(impl_->outputs.begin(), impl_->outputs.end(), n) != impl_->outputs.end();
}

void Graph::set_initializer(const std::string& n, Tensor t) {
  declare_value(n, TensorType::of(t.dtype(), t.shape()));
  impl_->initializers[n] = std::move(t);
  impl_->touch();
}
void Graph::remove_initializer(const std::string& n) {
  impl_->initializers.erase(n);
  impl_->touch();
}
bool Graph::is_initializer(const std::string& n) const { return impl_->initializers.count(n) != 0; }
const Tensor& Graph::initializer(const std::string& n) const {
  auto it = impl_->initializers.find(n);
  if (it == impl_->initializers.end()) fail(ErrorKind::Model, "no initializer named '" + n + "'");
  return it->second;
}
const Tensor* Graph::find_initializer(const std::string& n) const {
  auto it = impl_->initializers.find(n);
  return it == impl_->initializers.end() ? nullptr : &it->second;
}
void* Graph::initializer_data_for_update(const std::string& n) {
  auto it = impl_->initializers.find(n);
  return it == impl_->initializers.end() ? nullptr : it->second.exclusive_raw();
}
std::vector<std::string> Graph::initializer_names() const {
  std::vector<std::string> r;
  for (auto& [k, v] : impl_->initializers) r.push_back(k);
  return r;
}

const Tensor* Graph::constant_value(const std::string& n) const {
  if (n.empty()) return nullptr;
  if (auto* t = find_initializer(n)) return is_input(n) ? nullptr : t;  // an input may override it
  auto it = impl_->values.find(n);
  if (it == impl_->values.end() || it->second.producer == kNoNode) return nullptr;
  const Node& p = node(it->second.producer);
  if (p.op_type != "Constant" || !p.domain.empty()) return nullptr;
  if (auto* a = p.attrs.find("value"); a && a->kind == Attribute::Kind::Tensor) return &a->t;
  return nullptr;
}

NodeId Graph::add_node(const std::string& op_type, const std::vector<std::string>& ins,
                       const std::vector<std::string>& outs, Attributes attrs, const std::string& nm,
                       const std::string& domain) {
  GraphImpl& I = *impl_;
  for (auto& o : outs) {
    if (o.empty()) continue;
    auto it = I.values.find(o);
    if (it != I.values.end() && it->second.producer != kNoNode)
      fail(ErrorKind::Model, "tensor '" + o + "' is produced twice (by node '" + node(it->second.producer).label() +
                                 "' and by a new " + op_type + " node '" + nm + "')");
    if (is_input(o) || is_initializer(o))
      fail(ErrorKind::Model, "tensor '" + o + "' is a graph input or initializer and cannot be produced by node '" + nm + "'");
  }
  for (auto& i : ins)
    if (!i.empty() && !I.values.count(i))
      fail(ErrorKind::Model, "input '" + i + "' of " + op_type + " node '" + nm + "' does not exist", {"", 0, 0, nm, op_type});
  Node n;
  n.id = I.next_id++;
  n.name = nm;
  n.op_type = op_type;
  n.domain = domain == "ai.onnx" ? "" : domain;
  n.inputs = ins;
  n.outputs = outs;
  n.attrs = std::move(attrs);
  if (holds_bodies(n)) I.body_holders.insert(n.id);
  I.touch();
  Vertex v = boost::add_vertex(n, I.g);
  I.vertex_of[n.id] = v;
  if (!nm.empty()) I.nodes_by_name[nm].push_back(n.id);
  for (size_t k = 0; k < outs.size(); ++k) {
    if (outs[k].empty()) continue;
    declare_value(outs[k]);
    Value& val = I.values[outs[k]];
    val.producer = n.id;
    val.producer_slot = int(k);
    // Uses that were wired before the producer existed (importers add in file order) get edges now.
    for (auto& u : val.uses) boost::add_edge(v, I.vertex(u.node), EdgeData{outs[k], u.slot}, I.g);
  }
  for (size_t k = 0; k < ins.size(); ++k) {
    if (ins[k].empty()) continue;
    Value& val = I.values[ins[k]];
    val.uses.push_back({n.id, int(k)});
    if (val.producer != kNoNode) boost::add_edge(I.vertex(val.producer), v, EdgeData{ins[k], int(k)}, I.g);
  }
  return n.id;
}

static void unindex_name(GraphImpl& I, const std::string& name, NodeId id) {
  if (name.empty()) return;
  auto it = I.nodes_by_name.find(name);
  if (it == I.nodes_by_name.end()) return;
  auto& ids = it->second;
  ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
  if (ids.empty()) I.nodes_by_name.erase(it);
}

static void erase_use(Value& v, NodeId id, int slot) {
  auto& u = v.uses;
  u.erase(std::remove(u.begin(), u.end(), Use{id, slot}), u.end());
}

void Graph::remove_node(NodeId id, bool drop_outputs) {
  GraphImpl& I = *impl_;
  Vertex v = I.vertex(id);
  Node n = I.g[v];
  for (size_t k = 0; k < n.inputs.size(); ++k)
    if (!n.inputs[k].empty()) erase_use(I.values[n.inputs[k]], id, int(k));
  for (auto& o : n.outputs) {
    if (o.empty()) continue;
    Value& val = I.values[o];
    val.producer = kNoNode;
    val.producer_slot = -1;
    if (drop_outputs && val.uses.empty() && !is_output(o)) I.values.erase(o);
  }
  boost::clear_vertex(v, I.g);
  boost::remove_vertex(v, I.g);
  I.vertex_of.erase(id);
  I.body_holders.erase(id);
  I.touch();
  unindex_name(I, n.name, id);
  // Inputs that nothing uses any more and that are plain intermediate values are dropped lazily
  // by prune_values(); they may be reused by the caller.
}

bool Graph::has_node(NodeId id) const { return impl_->vertex_of.count(id) != 0; }
const Node& Graph::node(NodeId id) const { return impl_->g[impl_->vertex(id)]; }
Attributes& Graph::attrs(NodeId id) {
  Vertex v = impl_->vertex(id);
  // The caller may add, replace or drop a body: count the node as a holder and drop the cache.
  impl_->body_holders.insert(id);
  impl_->touch();
  return impl_->g[v].attrs;
}
void Graph::set_node_name(NodeId id, const std::string& nm) {
  Node& n = impl_->g[impl_->vertex(id)];
  unindex_name(*impl_, n.name, id);
  n.name = nm;
  if (!nm.empty()) impl_->nodes_by_name[nm].push_back(id);
}
void Graph::set_node_doc(NodeId id, const std::string& doc) { impl_->g[impl_->vertex(id)].doc = doc; }
size_t Graph::num_nodes() const { return impl_->vertex_of.size(); }

std::vector<NodeId> Graph::node_ids() const {
  std::vector<NodeId> r;
  r.reserve(impl_->vertex_of.size());
  for (auto& [id, v] : impl_->vertex_of) r.push_back(id);
  std::sort(r.begin(), r.end());
  return r;
}

NodeId Graph::find_node(const std::string& nm) const {
  if (nm.empty()) return kNoNode;
  auto it = impl_->nodes_by_name.find(nm);
  if (it == impl_->nodes_by_name.end() || it->second.empty()) return kNoNode;
  return *std::min_element(it->second.begin(), it->second.end());
}

static void remove_edge_for(GraphImpl& I, NodeId consumer, int slot) {
  Vertex v = I.vertex(consumer);
  boost::remove_in_edge_if(v, [&](const Edge& e) { return I.g[e].slot == slot; }, I.g);
}

void Graph::set_input(NodeId id, int slot, const std::string& value) {
  GraphImpl& I = *impl_;
  Vertex v = I.vertex(id);
  Node& n = I.g[v];
  if (slot < 0 || size_t(slot) >= n.inputs.size())
    fail(ErrorKind::Invalid, "node '" + n.label() + "' has no input slot " + std::to_string(slot));
  if (!value.empty() && !I.values.count(value)) fail(ErrorKind::Model, "no tensor named '" + value + "'");
  const std::string old = n.inputs[size_t(slot)];
  if (!old.empty()) {
    erase_use(I.values[old], id, slot);
    remove_edge_for(I, id, slot);
  }
  n.inputs[size_t(slot)] = value;
  I.touch();
  if (!value.empty()) {
    Value& val = I.values[value];
    val.uses.push_back({id, slot});
    if (val.producer != kNoNode) boost::add_edge(I.vertex(val.producer), v, EdgeData{value, slot}, I.g);
  }
}

void Graph::add_node_input(NodeId id, const std::string& value) {
  Node& n = impl_->g[impl_->vertex(id)];
  n.inputs.push_back("");
  set_input(id, int(n.inputs.size()) - 1, value);
}

void Graph::replace_all_uses(const std::string& from, const std::string& to) {
  if (from == to) return;
  if (!has_value(to)) fail(ErrorKind::Model, "no tensor named '" + to + "'");
  std::vector<Use> uses = value(from).uses;
  for (auto& u : uses) set_input(u.node, u.slot, to);
  for (auto& o : impl_->outputs)
    if (o == from) o = to;
}

NodeId Graph::replace_node(NodeId id, const std::string& op_type, const std::vector<std::string>& ins, Attributes a,
                           const std::string& domain) {
  Node old = node(id);
  remove_node(id, /*drop_outputs=*/false);
  return add_node(op_type, ins, old.outputs, std::move(a), old.name, domain);
}

std::optional<NodeId> Graph::producer(const std::string& v) const {
  auto it = impl_->values.find(v);
  if (it == impl_->values.end() || it->second.producer == kNoNode) return std::nullopt;
  return it->second.producer;
}

const std::vector<Use>& Graph::consumers(const std::string& v) const { return value(v).uses; }

std::vector<NodeId> Graph::predecessors(NodeId id) const {
  std::set<NodeId> s;
  for (auto e : boost::make_iterator_range(boost::in_edges(impl_->vertex(id), impl_->g)))
    s.insert(impl_->g[boost::source(e, impl_->g)].id);
  for (NodeId p : edges_at(body_read_edges(*this), false, id)) s.insert(p);
  return {s.begin(), s.end()};
}

std::vector<NodeId> Graph::successors(NodeId id) const {
  std::set<NodeId> s;
  for (auto e : boost::make_iterator_range(boost::out_edges(impl_->vertex(id), impl_->g)))
    s.insert(impl_->g[boost::target(e, impl_->g)].id);
  for (NodeId r : edges_at(body_read_edges(*this), true, id)) s.insert(r);
  return {s.begin(), s.end()};
}

// Kahn's algorithm with a min-heap on ids: deterministic, and keeps import order where it can.
// Body-read edges count like the others.
static std::vector<NodeId> kahn(const Graph& graph, std::vector<NodeId>* leftover) {
  const GraphImpl& I = graph.impl();
  const BodyReadEdges* body = body_read_edges(graph);
  std::unordered_map<NodeId, size_t> indeg;
  indeg.reserve(I.vertex_of.size());
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<NodeId>> ready;
  for (auto& [id, v] : I.vertex_of) {
    size_t d = boost::in_degree(v, I.g) + edges_at(body, false, id).size();
    indeg[id] = d;
    if (d == 0) ready.push(id);
  }
  std::vector<NodeId> order;
  order.reserve(I.vertex_of.size());
  while (!ready.empty()) {
    NodeId id = ready.top();
    ready.pop();
    order.push_back(id);
    for (auto e : boost::make_iterator_range(boost::out_edges(I.vertex_of.at(id), I.g))) {
      NodeId t = I.g[boost::target(e, I.g)].id;
      if (--indeg[t] == 0) ready.push(t);
    }
    for (NodeId t : edges_at(body, true, id))
      if (--indeg[t] == 0) ready.push(t);
  }
  if (leftover && order.size() != I.vertex_of.size())
    for (auto& [id, d] : indeg)
      if (d > 0) leftover->push_back(id);
  return order;
}

// The graph's stamp now; `order` receives topo_order's cached result when it was computed for it.
static std::vector<uint64_t> cached_topo(const Graph& g, std::vector<NodeId>* order, bool* hit) {
  std::vector<uint64_t> stamp;
  stamp_of(g, stamp);
  const GraphImpl& I = g.impl();
  std::lock_guard<std::mutex> lock(I.topo_mutex);
  *hit = I.topo_stamp == stamp;
  if (*hit && order) *order = I.topo;
  return stamp;
}

std::vector<NodeId> Graph::topo_order() const {
  const GraphImpl& I = *impl_;
  std::vector<NodeId> cached;
  bool hit = false;
  std::vector<uint64_t> stamp = cached_topo(*this, &cached, &hit);
  if (hit) return cached;
  std::vector<NodeId> left;
  auto order = kahn(*this, &left);
  if (left.empty()) {
    std::lock_guard<std::mutex> lock(I.topo_mutex);
    I.topo = order;
    I.topo_stamp = std::move(stamp);
  } else {
    std::vector<NodeId> cyc;
    has_cycle(&cyc);
    const Node& n = node(cyc.empty() ? left.front() : cyc.front());
    std::string path;
    for (NodeId c : cyc) path += (path.empty() ? "" : " -> ") + node(c).label();
    fail(ErrorKind::Model, "the graph has a cycle through " + path, {"", 0, 0, n.label(), n.op_type});
  }
  return order;
}

bool Graph::has_cycle(std::vector<NodeId>* cycle) const {
  bool hit = false;
  cached_topo(*this, nullptr, &hit);
  if (hit) return false;  // a topological order exists for this very graph
  std::vector<NodeId> left;
  kahn(*this, &left);
  if (left.empty()) return false;
  if (cycle) {
    // Walk predecessors inside the leftover set until a node repeats: that loop is a cycle.
    std::unordered_set<NodeId> in_left(left.begin(), left.end());
    std::sort(left.begin(), left.end());
    std::unordered_map<NodeId, size_t> seen;
    std::vector<NodeId> walk;
    NodeId cur = left.front();
    while (!seen.count(cur)) {
      seen[cur] = walk.size();
      walk.push_back(cur);
      NodeId next = kNoNode;
      for (NodeId p : predecessors(cur))
        if (in_left.count(p)) { next = p; break; }
      if (next == kNoNode) break;
      cur = next;
    }
    cycle->clear();
    if (seen.count(cur)) {
      for (size_t k = seen[cur]; k < walk.size(); ++k) cycle->push_back(walk[k]);
      std::reverse(cycle->begin(), cycle->end());
    }
  }
  return true;
}

bool Graph::reaches(NodeId from, NodeId to) const {
  if (from == to) return true;
  const BodyReadEdges* body = body_read_edges(*this);
  std::unordered_set<NodeId> seen{from};
  std::vector<NodeId> stack{from};
  auto visit = [&](NodeId t) {
    if (t == to) return true;
    if (seen.insert(t).second) stack.push_back(t);
    return false;
  };
  while (!stack.empty()) {
    NodeId c = stack.back();
    stack.pop_back();
    for (auto e : boost::make_iterator_range(boost::out_edges(impl_->vertex(c), impl_->g)))
      if (visit(impl_->g[boost::target(e, impl_->g)].id)) return true;
    for (NodeId t : edges_at(body, true, c))
      if (visit(t)) return true;
  }
  return false;
}

std::vector<std::string> Graph::outer_references() const {
  std::set<std::string> r;
  for (auto& [k, v] : impl_->values)
    if (v.producer == kNoNode && !v.uses.empty() && !is_input(k) && !is_initializer(k)) r.insert(k);
  // Bodies nested in this graph's nodes may read further out, past this graph.
  for (auto& [id, vx] : impl_->vertex_of)
    for (const Graph* b : bodies_of(impl_->g[vx]))
      for (auto& ref : b->outer_references()) {
        auto it = impl_->values.find(ref);
        bool local = it != impl_->values.end() && (it->second.producer != kNoNode || is_input(ref) || is_initializer(ref));
        if (!local) r.insert(ref);
      }
  return {r.begin(), r.end()};
}

Graph Graph::extract(const std::vector<NodeId>& ids) const {
  Graph sub;
  sub.name = name + "_sub";
  sub.is_subgraph = is_subgraph;
  sub.opset_imports = opset_imports;
  std::set<NodeId> inside(ids.begin(), ids.end());
  std::vector<NodeId> order;
  for (NodeId id : topo_order())
    if (inside.count(id)) order.push_back(id);
  std::set<std::string> produced;
  for (NodeId id : order)
    for (auto& o : node(id).outputs)
      if (!o.empty()) produced.insert(o);
  for (NodeId id : order) {
    // What a node reads: its inputs, and the values its If/Loop/Scan bodies read from this graph.
    std::vector<std::string> reads = node(id).inputs;
    for (const Graph* b : bodies_of(node(id)))
      for (auto& r : b->outer_references())
        if (has_value(r)) reads.push_back(r);  // else it is read from further out than this graph
    for (auto& i : reads) {
      if (i.empty() || produced.count(i) || sub.has_value(i)) continue;
      if (auto* t = find_initializer(i); t && !is_input(i)) sub.set_initializer(i, *t);
      else sub.add_input(i, type(i));
    }
  }
  for (NodeId id : order) {
    const Node& n = node(id);
    sub.add_node(n.op_type, n.inputs, n.outputs, n.attrs, n.name, n.domain);
    for (auto& o : n.outputs)
      if (!o.empty()) sub.set_type(o, type(o));
  }
  for (NodeId id : order)
    for (auto& o : node(id).outputs) {
      if (o.empty()) continue;
      bool outside = is_output(o);
      for (auto& u : consumers(o)) outside |= !inside.count(u.node);
      if (outside) sub.add_output(o);
    }
  return sub;
}

void Graph::validate() const {
  const GraphImpl& I = *impl_;
  auto ctx = [&](const Node& n) { return ErrorContext{"", 0, 0, n.label(), n.op_type}; };
  // Every node input exists; every use is recorded on the value; every output has this producer.
  std::unordered_map<std::string, size_t> use_count;
  size_t op_edges = 0;
  for (auto& [id, v] : I.vertex_of) {
    const Node& n = I.g[v];
    if (n.id != id) fail(ErrorKind::Model, "node id mismatch in vertex table", ctx(n));
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const std::string& in = n.inputs[k];
      if (in.empty()) continue;
      auto it = I.values.find(in);
      if (it == I.values.end()) fail(ErrorKind::Model, "input " + std::to_string(k) + " '" + in + "' is not a tensor of the graph (dangling edge)", ctx(n));
      const Value& val = it->second;
      if (std::find(val.uses.begin(), val.uses.end(), Use{id, int(k)}) == val.uses.end())
        fail(ErrorKind::Model, "use of '" + in + "' at input " + std::to_string(k) + " is not recorded", ctx(n));
      ++use_count[in];
      if (val.producer != kNoNode) ++op_edges;
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const std::string& o = n.outputs[k];
      if (o.empty()) continue;
      auto it = I.values.find(o);
      if (it == I.values.end() || it->second.producer != id || it->second.producer_slot != int(k))
        fail(ErrorKind::Model, "output '" + o + "' does not record this node as its producer", ctx(n));
    }
    // Each in-edge carries a value this node reads at that slot from that producer.
    for (auto e : boost::make_iterator_range(boost::in_edges(v, I.g))) {
      const EdgeData& ed = I.g[e];
      const Node& src = I.g[boost::source(e, I.g)];
      if (ed.slot < 0 || size_t(ed.slot) >= n.inputs.size() || n.inputs[size_t(ed.slot)] != ed.value ||
          I.values.at(ed.value).producer != src.id)
        fail(ErrorKind::Model, "edge from '" + src.label() + "' carrying '" + ed.value + "' does not match the node's inputs", ctx(n));
    }
  }
  if (op_edges != boost::num_edges(I.g))
    fail(ErrorKind::Model, "the edge set has " + std::to_string(boost::num_edges(I.g)) + " edges but node inputs imply " + std::to_string(op_edges));
  for (auto& [name, val] : I.values) {
    if (val.name != name) fail(ErrorKind::Model, "tensor table entry '" + name + "' is named '" + val.name + "'");
    if (val.uses.size() != use_count[name]) fail(ErrorKind::Model, "tensor '" + name + "' records uses that no node has");
    if (val.producer != kNoNode && !I.vertex_of.count(val.producer))
      fail(ErrorKind::Model, "tensor '" + name + "' names a producer that is not in the graph");
    if (val.producer != kNoNode && (is_input(name) || is_initializer(name)))
      fail(ErrorKind::Model, "tensor '" + name + "' is a graph input or initializer but is also produced by node '" + node(val.producer).label() + "'");
  }
  for (auto& o : I.outputs) {
    auto it = I.values.find(o);
    if (it == I.values.end()) fail(ErrorKind::Model, "graph output '" + o + "' is not a tensor of the graph");
    if (!is_subgraph && it->second.producer == kNoNode && !is_input(o) && !is_initializer(o))
      fail(ErrorKind::Model, "graph output '" + o + "' is produced by no node and is not an input or initializer");
  }
  if (!is_subgraph) {
    auto dangling = outer_references();
    if (!dangling.empty()) {
      const Use& u = value(dangling.front()).uses.front();
      fail(ErrorKind::Model, "input '" + dangling.front() + "' is produced by no node and is not a graph input or initializer (dangling edge)", ctx(node(u.node)));
    }
  }
  std::vector<NodeId> cyc;
  if (has_cycle(&cyc)) {
    std::string path;
    for (NodeId c : cyc) path += (path.empty() ? "" : " -> ") + node(c).label();
    fail(ErrorKind::Model, "the graph has a cycle through " + path, cyc.empty() ? ErrorContext{} : ctx(node(cyc.front())));
  }
}

void Graph::prune_values() {
  for (auto it = impl_->values.begin(); it != impl_->values.end();) {
    const Value& v = it->second;
    if (v.producer == kNoNode && v.uses.empty() && !is_input(it->first) && !is_output(it->first) &&
        !is_initializer(it->first))
      it = impl_->values.erase(it);
    else
      ++it;
  }
}

}  // namespace nnfuse
