#include "graph/shape_inference.h"

#include <optional>
#include <sstream>
#include <unordered_map>

#include "graph/op_registry.h"

namespace nnfuse {

namespace {

// Ops whose value must not be folded at inference time (random, or with subgraphs).
bool never_fold(const Node& n) {
  static const char* ops[] = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                              "Bernoulli", "If", "Loop", "Scan", "Dropout"};
  for (auto* o : ops)
    if (n.op_type == o) return true;
  return !n.domain.empty();
}

std::optional<std::vector<Dim>> dims_from_tensor(const Tensor& t) {
  if (t.rank() > 1 || !dtype_is_integer(t.dtype()) || t.numel() > 64) return std::nullopt;
  std::vector<Dim> d;
  for (int64_t i = 0; i < t.numel(); ++i) d.emplace_back(t.as_int(i));
  return d;
}

// Merges an inferred type into a declared one: inferred facts win, declared facts fill gaps.
TensorType merge(const TensorType& declared, const TensorType& inferred, const Node& n, const std::string& name,
                 bool strict) {
  if (!inferred.is_tensor() || !declared.is_tensor()) {
    // A sequence or optional: what inference found, or the declaration where it found nothing.
    auto untyped = [](const TensorType& t) { return t.is_tensor() && t.dtype == DType::Undefined && !t.has_shape; };
    if (untyped(inferred)) return declared;
    if (untyped(declared) || declared.kind == inferred.kind) {
      TensorType r = inferred;
      if (r.dtype == DType::Undefined && declared.kind == r.kind) r.dtype = declared.dtype;
      return r;
    }
    // Declared optional(K), found a K: the value fits the optional.
    if (declared.kind == ValueKind::Optional && declared.optional_of == inferred.kind) return declared;
    // Anything else would let a sequence reach code planned for a tensor (or the reverse).
    fail(ErrorKind::Model, "output '" + name + "' is declared " + declared.str() + " but is " + inferred.str(), {"", 0, 0, n.label(), n.op_type});
  }
  TensorType r = inferred;
  if (r.dtype == DType::Undefined) r.dtype = declared.dtype;
  if (!r.has_shape && declared.has_shape) return TensorType(r.dtype, declared.dims);
  if (r.has_shape && declared.has_shape && declared.dims.size() == r.dims.size()) {
    for (size_t i = 0; i < r.dims.size(); ++i) {
      const Dim& d = declared.dims[i];
      if (!r.dims[i].known() && d.known()) r.dims[i] = d;
      else if (!r.dims[i].known() && r.dims[i].symbol.empty()) r.dims[i] = d;
      else if (strict && r.dims[i].known() && d.known() && r.dims[i].value != d.value)
        fail(ErrorKind::Shape, "output '" + name + "' is declared " + declared.str() + " but inferred " + inferred.str(),
             {"", 0, 0, n.label(), n.op_type});
    }
  } else if (strict && r.has_shape && declared.has_shape) {
    fail(ErrorKind::Shape, "output '" + name + "' is declared " + declared.str() + " but inferred " + inferred.str(),
         {"", 0, 0, n.label(), n.op_type});
  }
  return r;
}

}  // namespace

// A body input declared without an element type (legal for Loop and Scan bodies: the node's
// operands give it) takes it from the node before the body is inferred: a Loop's iteration number
// and condition, the dtype of its carried values and of a Scan's state values (their shapes may
// change from one iteration to the next: infer_loop works out whether they do), and a Scan's
// scan input elements whole (the scan axis removed: the same every iteration). Declared types
// are kept.
static void type_open_body_inputs(const Graph& g, const Node& n, int64_t opset, Graph& body) {
  const auto& ins = body.inputs();
  auto open = [&](size_t k) { return k < ins.size() && body.type(ins[k]).dtype == DType::Undefined; };
  auto operand = [&](size_t j) -> std::optional<TensorType> {
    if (j >= n.inputs.size() || n.inputs[j].empty() || !g.has_value(n.inputs[j])) return std::nullopt;
    return g.type(n.inputs[j]);
  };
  if (n.op_type == "Loop" && n.domain.empty()) {
    if (open(0)) body.set_type(ins[0], TensorType(DType::Int64, std::vector<Dim>{}));
    if (open(1)) body.set_type(ins[1], TensorType(DType::Bool, std::vector<Dim>{}));
    for (size_t k = 2; k < ins.size(); ++k)
      if (auto t = operand(k); open(k) && t && t->dtype != DType::Undefined) {
        TensorType u = *t;  // a carried sequence stays one
        u.has_shape = false;
        u.dims.clear();
        body.set_type(ins[k], u);
      }
  } else if (n.op_type == "Scan" && n.domain.empty() && opset >= 9) {
    const int64_t m = n.attrs.get_int("num_scan_inputs", 0);
    if (m < 1 || size_t(m) > n.inputs.size() || ins.size() != n.inputs.size()) return;  // the Scan's inference says why
    const size_t n_state = n.inputs.size() - size_t(m);
    const std::vector<int64_t> axes = n.attrs.get_ints("scan_input_axes", std::vector<int64_t>(size_t(m), 0));
    for (size_t k = 0; k < ins.size(); ++k) {
      auto t = operand(k);
      if (!open(k) || !t || t->dtype == DType::Undefined) continue;
      if (k < n_state || !t->has_shape) {
        body.set_type(ins[k], TensorType::unknown_shape(t->dtype));
        continue;
      }
      const size_t j = k - n_state;
      int64_t ax = j < axes.size() ? axes[j] : 0;
      if (ax < 0) ax += t->rank();
      if (ax < 0 || ax >= t->rank()) continue;  // the Scan's inference says why
      t->dims.erase(t->dims.begin() + ax);
      body.set_type(ins[k], *t);
    }
  }
}

void infer_shapes(Graph& g, const InferOptions& opt) {
  const OpRegistry& reg = OpRegistry::global();
  std::unordered_map<std::string, Tensor> known;  // values learned by folding
  std::unordered_map<std::string, std::vector<Dim>> dimvals;
  for (NodeId id : g.topo_order()) {
    const Node& n = g.node(id);
    int64_t opset = g.opset(n.domain);
    const OpSchema& s = reg.get(n, opset);
    int present = int(n.inputs.size());
    if (present < s.min_inputs || (s.max_inputs >= 0 && present > s.max_inputs))
      fail(ErrorKind::Model, "has " + std::to_string(present) + " inputs; " + n.op_type + " takes " + std::to_string(s.min_inputs) +
                                 (s.max_inputs < 0 ? " or more" : s.max_inputs == s.min_inputs ? "" : " to " + std::to_string(s.max_inputs)),
           {"", 0, 0, n.label(), n.op_type, int(opset)});
    if (int(n.outputs.size()) < s.min_outputs || (s.max_outputs >= 0 && int(n.outputs.size()) > s.max_outputs))
      fail(ErrorKind::Model, "has " + std::to_string(n.outputs.size()) + " outputs; " + n.op_type + " gives " +
                                 std::to_string(s.min_outputs) + (s.max_outputs < 0 ? " or more" : " to " + std::to_string(s.max_outputs)),
           {"", 0, 0, n.label(), n.op_type, int(opset)});
    // Bodies first: they need the types of the outer values they read. An If's two branches are
    // alternatives: one may not hold for these shapes (Silero VAD's 8 kHz branch with a 16 kHz
    // input), which is an error only if it runs. While the condition is not known, a branch that
    // fails here keeps its declared types (the If's outputs then take the other branch's), and
    // running it reports the error; both failing is an error now.
    const bool alternatives = n.op_type == "If" && n.domain.empty() && !n.inputs.empty() && !n.inputs[0].empty() &&
                              !g.constant_value(n.inputs[0]) && !known.count(n.inputs[0]);
    std::optional<Error> branch_error;
    int failed_branches = 0;
    for (auto& [k, a] : n.attrs.all()) {
      std::vector<std::shared_ptr<Graph>> bodies;
      if (a.kind == Attribute::Kind::Graph && a.g) bodies.push_back(a.g);
      if (a.kind == Attribute::Kind::Graphs) bodies = a.graphs;
      for (auto& body : bodies) {
        type_open_body_inputs(g, n, opset, *body);
        for (auto& r : body->outer_references())
          if (g.has_value(r)) body->declare_value(r, g.type(r));
        if (body->opset_imports.empty()) body->opset_imports = g.opset_imports;
        if (!alternatives) {
          infer_shapes(*body, opt);
          continue;
        }
        try {
          infer_shapes(*body, opt);
        } catch (const Error& e) {
          if (!branch_error) branch_error = e;
          ++failed_branches;
          for (auto& o : body->outputs()) body->set_type(o, TensorType{});
        }
      }
    }
    if (failed_branches > 1) throw *branch_error;
    InferContext ctx{n, opset, {}, {}, {}};
    bool all_const = true;
    int64_t const_elems = 0;
    for (auto& in : n.inputs) {
      if (in.empty()) {
        ctx.inputs.emplace_back();
        ctx.values.push_back(nullptr);
        ctx.dim_values.emplace_back();
        continue;
      }
      ctx.inputs.push_back(g.type(in));
      const Tensor* v = g.constant_value(in);
      if (!v) {
        auto it = known.find(in);
        if (it != known.end()) v = &it->second;
      }
      ctx.values.push_back(v);
      if (!v) all_const = false;
      else const_elems += v->numel();
      auto dv = dimvals.find(in);
      if (dv != dimvals.end()) ctx.dim_values.emplace_back(dv->second);
      else if (v) ctx.dim_values.push_back(dims_from_tensor(*v));
      else ctx.dim_values.emplace_back();
    }
    if (!s.takes_any_value)
      for (size_t k = 0; k < ctx.inputs.size(); ++k)
        if (!ctx.inputs[k].is_tensor())
          fail(ErrorKind::Model, "input " + std::to_string(k) + " '" + n.inputs[k] + "' is " + ctx.inputs[k].str() + "; " + n.op_type + " takes tensors",
               {"", 0, 0, n.label(), n.op_type, int(opset)});
    InferResult res;
    try {
      res = s.infer(ctx);
    } catch (const Error& e) {
      rethrow_in(e, {"", 0, 0, n.label(), n.op_type, int(opset)});  // e.g. an attribute of the wrong type
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const std::string& o = n.outputs[k];
      if (o.empty() || k >= res.outputs.size()) continue;
      // A static shape whose element count passes 2^63 (an Expand, Tile or Range asking for it)
      // is refused here, where the node is known; later it would wrap around in sizes and plans.
      if (res.outputs[k].is_static()) {
        try {
          (void)res.outputs[k].numel();
        } catch (const Error& e) {
          fail(e.kind(), "output '" + o + "': " + e.detail(), {"", 0, 0, n.label(), n.op_type, int(opset)});
        }
      }
      g.set_type(o, merge(g.type(o), res.outputs[k], n, o, opt.strict));
      if (k < res.dim_values.size() && res.dim_values[k]) {
        dimvals[o] = *res.dim_values[k];
        bool all_known = true;
        for (auto& d : *res.dim_values[k]) all_known &= d.known();
        if (all_known && !known.count(o)) {
          std::vector<int64_t> v;
          for (auto& d : *res.dim_values[k]) v.push_back(d.value);
          // A 0-D output (Gather of one dim, Size) carries its single element as a scalar.
          bool scalar = res.outputs[k].has_shape && res.outputs[k].dims.empty() && v.size() == 1;
          Tensor t = Tensor::from_vector<int64_t>(scalar ? Shape{} : Shape{int64_t(v.size())}, v);
          // Dim values of a bool/int32 output (Equal on shapes, Cast) keep that output's dtype.
          DType want = res.outputs[k].dtype;
          known[o] = (want != DType::Int64 && (dtype_is_integer(want) || want == DType::Bool)) ? t.cast(want) : t;
        }
      }
    }
    // Fold small all-constant nodes so that shape-like inputs downstream have data.
    if (opt.max_fold_elements > 0 && all_const && const_elems <= opt.max_fold_elements && !never_fold(n) &&
        n.op_type != "Constant") {
      try {
        auto outs = run_node(n, opset, ctx.values);
        bool tensors = true;
        for (auto& t : outs) tensors &= t.is_tensor();
        if (!tensors) continue;  // a sequence or optional has no constant form
        for (size_t k = 0; k < n.outputs.size() && k < outs.size(); ++k) {
          if (n.outputs[k].empty()) continue;
          g.set_type(n.outputs[k], merge(g.type(n.outputs[k]), TensorType::of(outs[k].dtype(), outs[k].shape()), n, n.outputs[k], opt.strict));
          if (outs[k].numel() <= opt.max_fold_elements) known[n.outputs[k]] = outs[k];
        }
      } catch (const Error&) {
        // Folding is an optimisation of inference; a kernel that cannot run here (e.g. an
        // unsupported dtype) leaves the types as inferred.
      }
    }
  }
}

void bind_input_shapes(Graph& g, const std::map<std::string, Shape>& shapes) {
  std::map<std::string, int64_t> symbols;
  for (auto& [name, shape] : shapes) {
    if (!g.is_input(name)) {
      std::string known;
      for (auto& i : g.inputs()) known += (known.empty() ? "" : ", ") + i;
      fail(ErrorKind::Invalid, "--shape names '" + name + "', which is not a model input (inputs: " + known + ")");
    }
    const TensorType& t = g.type(name);
    if (!t.is_tensor()) fail(ErrorKind::Invalid, "--shape names '" + name + "', which is " + t.str() + ", not a tensor");
    if (t.has_shape && t.dims.size() != shape.size())
      fail(ErrorKind::Invalid, "--shape " + name + "=" + shape_str(shape) + " has rank " + std::to_string(shape.size()) +
                                   " but the input is " + t.str());
    if (t.has_shape)
      for (size_t i = 0; i < shape.size(); ++i) {
        const Dim& d = t.dims[i];
        if (d.known() && d.value != shape[i])
          fail(ErrorKind::Invalid, "--shape " + name + "=" + shape_str(shape) + " conflicts with the model's " + t.str() +
                                       " at dimension " + std::to_string(i));
        if (!d.known() && !d.symbol.empty()) {
          auto [it, ins] = symbols.emplace(d.symbol, shape[i]);
          if (!ins && it->second != shape[i])
            fail(ErrorKind::Invalid, "dimension '" + d.symbol + "' is bound to both " + std::to_string(it->second) + " and " + std::to_string(shape[i]));
        }
      }
    g.set_type(name, TensorType::of(t.dtype, shape));
  }
  // Symbols bound through one input apply to every value that uses them.
  for (auto& vname : g.value_names()) {
    TensorType t = g.type(vname);
    bool changed = false;
    for (auto& d : t.dims)
      if (!d.known() && symbols.count(d.symbol)) { d.value = symbols[d.symbol]; changed = true; }
    if (changed) g.set_type(vname, t);
  }
  // Everything below the inputs is re-derived from the bound shapes.
  for (auto& vname : g.value_names())
    if (g.producer(vname) && !g.is_output(vname)) {
      TensorType u = g.type(vname);
      u.has_shape = false;
      u.dims.clear();
      g.set_type(vname, u);
    }
  infer_shapes(g);
}

std::pair<std::string, Shape> parse_shape_binding(const std::string& s) {
  auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    fail(ErrorKind::Invalid, "--shape '" + s + "': expected NAME=D1,D2,... (for example input=1,3,224,224)");
  std::string name = s.substr(0, eq);
  Shape shape;
  std::stringstream ss(s.substr(eq + 1));
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument("");
      shape.push_back(v);
    } catch (const std::exception&) {
      fail(ErrorKind::Invalid, "--shape '" + s + "': '" + item + "' is not a non-negative integer");
    }
  }
  return {name, shape};
}

}  // namespace nnfuse
