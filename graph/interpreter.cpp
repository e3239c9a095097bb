#include "graph/interpreter.h"

#include <random>
#include <unordered_map>

namespace nnfuse {

Interpreter::Interpreter(const Graph& g) : g_(g), order_(g.topo_order()) {
  const OpRegistry& reg = OpRegistry::global();
  for (NodeId id : order_) {
    const Node& n = g.node(id);
    reg.get(n, g.opset(n.domain));  // throws Unsupported naming the node
  }
}

static void check_feed(const Graph& g, const std::string& name, const Tensor& t) {
  const TensorType& want = g.type(name);
  if (!want.is_tensor() || !t.is_tensor()) {
    // A sequence, an optional (empty, or holding what it is declared to hold) or a tensor.
    const ValueKind held = want.kind == ValueKind::Optional ? want.optional_of : want.kind;
    const bool ok = (want.kind == ValueKind::Optional && t.is_none()) ||
                    (held == ValueKind::Sequence ? t.is_sequence() : t.is_tensor());
    if (!ok) fail(ErrorKind::Invalid, "input '" + name + "' expects " + want.str() + ", got " + t.kind_str());
    if (!t.is_tensor()) {
      if (t.is_none() || want.dtype == DType::Undefined || t.dtype() == want.dtype) return;
      fail(ErrorKind::Invalid, "input '" + name + "' expects " + want.str() + ", got " + t.kind_str());
    }
    // A tensor in an optional(tensor): checked as the tensor type below (dtype and dims are its).
  }
  if (want.dtype != DType::Undefined && want.dtype != t.dtype())
    fail(ErrorKind::Invalid, "input '" + name + "' expects " + dtype_name(want.dtype) + ", got " + dtype_name(t.dtype()));
  if (!want.has_shape) return;
  if (int64_t(want.dims.size()) != t.rank())
    fail(ErrorKind::Invalid, "input '" + name + "' expects shape " + want.str() + " (rank " + std::to_string(want.dims.size()) +
                                 "), got " + shape_str(t.shape()));
  for (size_t i = 0; i < want.dims.size(); ++i)
    if (want.dims[i].known() && want.dims[i].value != t.shape()[i])
      fail(ErrorKind::Invalid, "input '" + name + "' expects shape " + want.str() + ", got " + shape_str(t.shape()) +
                                   " (dimension " + std::to_string(i) + ")");
}

TensorMap Interpreter::run(const TensorMap& feeds, const std::vector<std::string>& outputs) const {
  return run_scoped(feeds, nullptr, outputs);
}

TensorMap Interpreter::run_scoped(const TensorMap& feeds, const TensorMap* outer,
                                  const std::vector<std::string>& outputs) const {
  const Graph& g = g_;
  std::unordered_map<std::string, Tensor> env;
  for (auto& name : g.initializer_names()) env[name] = g.initializer(name);
  for (auto& [name, t] : feeds) {
    if (!g.is_input(name)) {
      std::string known;
      for (auto& i : g.inputs()) known += (known.empty() ? "" : ", ") + i;
      fail(ErrorKind::Invalid, "'" + name + "' is not an input of the model (inputs: " + known + ")");
    }
    check_feed(g, name, t);
    env[name] = t;
  }
  for (auto& name : g.inputs())
    if (!feeds.count(name) && !g.is_initializer(name)) fail(ErrorKind::Invalid, "missing input '" + name + "' (" + g.type(name).str() + ")");

  const std::vector<std::string>& want = outputs.empty() ? g.outputs() : outputs;
  // Free each intermediate after its last use: full-size models would not fit otherwise.
  std::unordered_map<std::string, size_t> last_use;
  for (size_t k = 0; k < order_.size(); ++k) {
    const Node& n = g.node(order_[k]);
    for (auto& i : n.inputs)
      if (!i.empty()) last_use[i] = k;
    // Values that an If/Loop/Scan body reads from this scope live until that node has run.
    for (auto& [name, a] : n.attrs.all()) {
      if (a.kind == Attribute::Kind::Graph && a.g)
        for (auto& r : a.g->outer_references()) last_use[r] = k;
      if (a.kind == Attribute::Kind::Graphs)
        for (auto& body : a.graphs)
          for (auto& r : body->outer_references()) last_use[r] = k;
    }
  }
  std::unordered_map<std::string, bool> keep;
  for (auto& w : want) keep[w] = true;
  std::vector<std::vector<std::string>> free_after(order_.size());
  for (auto& [v, k] : last_use)
    if (!keep.count(v) && !g.is_initializer(v)) free_after[k].push_back(v);

  auto lookup = [&](const std::string& name) -> const Tensor* {
    auto it = env.find(name);
    if (it != env.end()) return &it->second;
    if (outer) {
      auto jt = outer->find(name);
      if (jt != outer->end()) return &jt->second;
    }
    return nullptr;
  };

  SubgraphRunner runner = [&](const Graph& body, const std::vector<Tensor>& ins) {
    // The body sees this graph's live values and our own outer scope.
    TensorMap scope = outer ? *outer : TensorMap{};
    for (auto& [k, v] : env) scope[k] = v;
    TensorMap body_feeds;
    if (ins.size() > body.inputs().size()) fail(ErrorKind::Model, "subgraph '" + body.name + "' takes " + std::to_string(body.inputs().size()) + " inputs, given " + std::to_string(ins.size()));
    for (size_t i = 0; i < ins.size(); ++i) body_feeds[body.inputs()[i]] = ins[i];
    Interpreter sub(body);
    TensorMap res = sub.run_scoped(body_feeds, &scope, body.outputs());
    std::vector<Tensor> r;
    for (auto& o : body.outputs()) r.push_back(res.at(o));
    return r;
  };

  for (size_t k = 0; k < order_.size(); ++k) {
    const Node& n = g.node(order_[k]);
    std::vector<const Tensor*> ins;
    ins.reserve(n.inputs.size());
    for (auto& i : n.inputs) {
      if (i.empty()) { ins.push_back(nullptr); continue; }
      const Tensor* t = lookup(i);
      if (!t) fail(ErrorKind::Model, "input '" + i + "' has no value when the node runs", {"", 0, 0, n.label(), n.op_type});
      ins.push_back(t);
    }
    std::vector<Tensor> outs = run_node(n, g.opset(n.domain), ins, runner);
    for (size_t j = 0; j < n.outputs.size() && j < outs.size(); ++j)
      if (!n.outputs[j].empty()) env[n.outputs[j]] = std::move(outs[j]);
    // Free every value whose last reader (a node input or a body's outer reference) was this node.
    for (auto& v : free_after[k]) env.erase(v);
  }

  TensorMap result;
  for (auto& w : want) {
    const Tensor* t = lookup(w);
    if (!t) fail(ErrorKind::Invalid, "'" + w + "' is not a value of the model");
    result[w] = *t;
  }
  return result;
}

TensorMap run_reference(const Graph& g, const TensorMap& feeds, const std::vector<std::string>& outputs) {
  return Interpreter(g).run(feeds, outputs);
}

TensorMap random_feeds(const Graph& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  TensorMap feeds;
  for (auto& name : g.inputs()) {
    if (g.is_initializer(name)) continue;
    const TensorType& t = g.type(name);
    if (!t.is_tensor())
      fail(ErrorKind::Invalid, "input '" + name + "' is " + t.str() + ": random inputs are tensors only; give it with --input " + name + "=FILE.pb");
    if (!t.is_static())
      fail(ErrorKind::Invalid, "input '" + name + "' has shape " + t.str() + ": bind its dims with --shape " + name + "=...");
    Tensor x;
    try {
      x = Tensor(t.dtype, t.static_shape());
    } catch (const Error& e) {
      fail(e.kind(), "input '" + name + "': " + e.detail());
    }
    if (dtype_is_low_precision(t.dtype)) {
      // float8/float4: uniform in [-1, 1) rounded to the type; int4/int2: uniform over the type's range.
      Tensor v(DType::Float64, t.static_shape());
      const bool integral = low_precision_is_integer(t.dtype);
      const auto range = integral ? low_precision_int_range(t.dtype) : std::pair<int64_t, int64_t>{0, 0};
      std::uniform_real_distribution<double> u(-1.0, 1.0);
      std::uniform_int_distribution<int64_t> ui(range.first, range.second);
      for (int64_t i = 0; i < v.numel(); ++i) v.data<double>()[i] = integral ? double(ui(rng)) : u(rng);
      feeds[name] = v.cast(t.dtype);
      continue;
    }
    dispatch_dtype(t.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* p = static_cast<T*>(x.raw());
      std::uniform_real_distribution<double> u(-1.0, 1.0);
      std::uniform_int_distribution<int> ui(0, 9);
      for (int64_t i = 0; i < x.numel(); ++i) {
        if constexpr (std::is_same_v<T, bool>) p[i] = ui(rng) & 1;
        else if constexpr (std::is_same_v<T, Half>) p[i] = Half{float_to_half(float(u(rng)))};
        else if constexpr (std::is_same_v<T, BFloat16>) p[i] = BFloat16{float_to_bf16(float(u(rng)))};
        else if constexpr (std::is_floating_point_v<T>) p[i] = T(u(rng));
        else p[i] = T(ui(rng));
      }
    });
    feeds[name] = x;
  }
  return feeds;
}

}  // namespace nnfuse
