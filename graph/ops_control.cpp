// Control-flow ops: If, Loop, Scan. Their bodies are subgraphs (Graph::is_subgraph) held in graph
// attributes and run through KernelContext::run_subgraph, which the interpreter sets up so that
// the body sees the enclosing scope's values. The recurrent ops (LSTM, GRU, RNN) are in
// ops_control_rnn.cpp and registered from here.
#include <cstring>
#include <limits>
#include <optional>

#include "graph/ops_common.h"
#include "graph/shape_inference.h"

namespace nnfuse {

void register_recurrent_ops(OpRegistry& r);  // ops_control_rnn.cpp
void register_sequence_ops(OpRegistry& r);   // ops_sequence.cpp

namespace {

const Graph& body_attr(const Node& n, const char* name, const std::function<void(const std::string&)>& error) {
  const Attribute* a = n.attrs.find(name);
  if (!a || a->kind != Attribute::Kind::Graph || !a->g) error(std::string("needs a graph attribute '") + name + "'");
  return *a->g;
}

// Two types a value may have (If branches, Loop iterations): equal facts kept, the rest unknown.
TensorType merge_types(const TensorType& a, const TensorType& b) {
  auto untyped = [](const TensorType& t) { return t.is_tensor() && t.dtype == DType::Undefined && !t.has_shape; };
  if (a.kind != b.kind || (a.kind == ValueKind::Optional && a.optional_of != b.optional_of)) {
    // A side with no type at all (a branch that did not infer) gives way; an optional and the
    // value it may hold (Optional(x) in one branch, x in the other) merge to the optional. Other
    // mixes have no one type: an empty TensorType, which infer_if reports.
    if (untyped(a)) return b;
    if (untyped(b)) return a;
    if (a.kind == ValueKind::Optional && a.optional_of == b.kind) return a;
    if (b.kind == ValueKind::Optional && b.optional_of == a.kind) return b;
    return TensorType{};
  }
  if (!a.is_tensor()) {
    TensorType r = a;
    if (r.dtype == DType::Undefined) r.dtype = b.dtype;
    if (!(a.has_shape == b.has_shape && a.dims == b.dims)) r.has_shape = false, r.dims.clear();
    return r;
  }
  TensorType r;
  r.dtype = a.dtype == b.dtype ? a.dtype : (a.dtype == DType::Undefined ? b.dtype : a.dtype);
  if (!a.has_shape || !b.has_shape || a.dims.size() != b.dims.size()) return TensorType::unknown_shape(r.dtype);
  std::vector<Dim> dims;
  for (size_t i = 0; i < a.dims.size(); ++i) dims.push_back(a.dims[i] == b.dims[i] ? a.dims[i] : Dim());
  return TensorType(r.dtype, dims);
}

// A loop-carried value: typed as its initial value, keeping only the dims that the body's output
// (when its shape is known) agrees on.
TensorType carried_type(const TensorType& initial, const TensorType& from_body) {
  // An optional carried in and a value carried out (Loop with an empty optional at the start): the
  // outputs are what the body gives.
  if (from_body.kind != initial.kind && from_body.dtype != DType::Undefined) return from_body;
  if (!from_body.has_shape) {
    TensorType t = initial;
    if (t.dtype == DType::Undefined) t.dtype = from_body.dtype;
    return t;
  }
  return merge_types(initial, from_body);
}

TensorType body_output_type(const Graph& body, size_t k) {
  const std::string& o = body.outputs()[k];
  return body.has_value(o) ? body.type(o) : TensorType();
}

bool truthy(const Tensor& t, const KernelContext& c, const char* what) {
  if (!t.is_tensor()) c.error(std::string(what) + " must be a tensor, got " + t.kind_str());
  if (t.numel() != 1) c.error(std::string(what) + " must hold one element, got shape " + shape_str(t.shape()));
  return t.as_double(0) != 0;
}

// A scalar fed to a body input, shaped as the body declares it ([] or [1]).
Tensor body_scalar(const Tensor& scalar, const Graph& body, size_t input_index) {
  if (input_index < body.inputs().size()) {
    const TensorType& t = body.type(body.inputs()[input_index]);
    if (t.has_shape && t.rank() == 1) return scalar.reshaped({1});
  }
  return scalar;
}

// ---- If -----------------------------------------------------------------------------------
InferResult infer_if(const InferContext& c) {
  auto err = [&](const std::string& m) { c.error(m); };
  const Graph& then_b = body_attr(c.node, "then_branch", err);
  const Graph& else_b = body_attr(c.node, "else_branch", err);
  const TensorType& cond = c.input(0);
  if (cond.has_shape) {
    auto n = cond.numel();
    if (n && *n != 1) c.error("cond must be a single bool, got " + cond.str());
  }
  size_t n_out = c.node.outputs.size();
  if (then_b.outputs().size() != n_out || else_b.outputs().size() != n_out)
    c.error("then_branch gives " + std::to_string(then_b.outputs().size()) + " outputs and else_branch " +
            std::to_string(else_b.outputs().size()) + ", the node has " + std::to_string(n_out));
  InferResult r;
  for (size_t k = 0; k < n_out; ++k) {
    TensorType t = body_output_type(then_b, k), e = body_output_type(else_b, k);
    if (t.dtype != DType::Undefined && e.dtype != DType::Undefined && t.dtype != e.dtype)
      c.error("output " + std::to_string(k) + " is " + dtype_name(t.dtype) + " in then_branch but " + dtype_name(e.dtype) +
              " in else_branch");
    TensorType m = merge_types(t, e);
    if (m.is_tensor() && m.dtype == DType::Undefined && !m.has_shape && (!t.is_tensor() || !e.is_tensor()))
      c.error("output " + std::to_string(k) + " is " + t.str() + " in then_branch but " + e.str() + " in else_branch");
    r.outputs.push_back(m);
  }
  return r;
}

std::vector<Tensor> run_if(const KernelContext& c) {
  auto err = [&](const std::string& m) { c.error(m); };
  if (!c.run_subgraph) c.error("needs a subgraph runner (run it through the interpreter)");
  bool cond = truthy(c.input(0), c, "cond");
  const Graph& body = body_attr(c.node, cond ? "then_branch" : "else_branch", err);
  std::vector<Tensor> outs = c.run_subgraph(body, {});
  if (outs.size() != c.node.outputs.size())
    c.error(std::string(cond ? "then_branch" : "else_branch") + " gave " + std::to_string(outs.size()) + " outputs, the node has " +
            std::to_string(c.node.outputs.size()));
  return outs;
}

// ---- Loop ---------------------------------------------------------------------------------
// Stacks per-iteration tensors along a new leading axis.
Tensor stack(const std::vector<Tensor>& parts, const KernelContext& c, size_t which) {
  const Tensor& first = parts[0];
  if (!first.is_tensor()) c.error("scan output " + std::to_string(which) + " is " + first.kind_str() + "; scan outputs are tensors");
  Shape s = first.shape();
  s.insert(s.begin(), int64_t(parts.size()));
  Tensor out(first.dtype(), s);
  char* dst = static_cast<char*>(out.raw());
  const size_t n = first.nbytes();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i].is_tensor()) c.error("scan output " + std::to_string(which) + " is " + parts[i].kind_str() + " at iteration " + std::to_string(i) + "; scan outputs are tensors");
    if (parts[i].shape() != first.shape() || parts[i].dtype() != first.dtype())
      c.error("scan output " + std::to_string(which) + " changes from " + dtype_name(first.dtype()) + shape_str(first.shape()) +
              " to " + dtype_name(parts[i].dtype()) + shape_str(parts[i].shape()) + " at iteration " + std::to_string(i));
    std::memcpy(dst + i * n, parts[i].raw(), n);
  }
  return out;
}

InferResult infer_loop(const InferContext& c) {
  auto err = [&](const std::string& m) { c.error(m); };
  const Graph& body = body_attr(c.node, "body", err);
  const size_t n_carried = c.num_inputs() - 2;
  const size_t n_out = c.node.outputs.size();
  if (body.inputs().size() != n_carried + 2)
    c.error("body takes " + std::to_string(body.inputs().size()) + " inputs; it needs 2 + " + std::to_string(n_carried) +
            " loop-carried values");
  if (body.outputs().size() < n_carried + 1 || n_out != body.outputs().size() - 1)
    c.error("body gives " + std::to_string(body.outputs().size()) + " outputs: expected cond, " + std::to_string(n_carried) +
            " loop-carried values and one scan output per node output beyond those (" + std::to_string(n_out) + " node outputs)");
  // The trip count is M only when nothing can end the loop early: no cond input (or a constant
  // true one) and a body whose cond output is its cond input passed through.
  Dim trips;
  const Tensor* m = c.value(0);
  bool cond_always_true = !c.has_input(1) || (c.value(1) && c.value(1)->numel() == 1 && c.value(1)->as_double(0) != 0);
  if (m && m->numel() == 1 && cond_always_true && body.outputs()[0] == body.inputs()[1]) trips = Dim(m->as_int(0));
  InferResult r;
  // Exporters often declare the carried inputs with symbolic or no dims (tf2onnx: [unk__1, H]),
  // so the body's own output types lose what the initial values say. Inferred again with the
  // carried inputs typed as their initial values: when every carried value leaves the body with
  // the type it entered, that type holds at every iteration (the loop is shape-invariant), and
  // the carried outputs and scan elements get the types of that pass.
  std::optional<Graph> typed;
  try {
    Graph b = body;
    bool differs = false;
    for (size_t k = 0; k < n_carried; ++k) {
      const TensorType& init = c.input(2 + k);
      const std::string& in = body.inputs()[2 + k];
      if (!init.has_shape || b.type(in) == init) continue;
      b.set_type(in, init);
      differs = true;
    }
    if (differs) {
      infer_shapes(b);
      bool invariant = true;
      for (size_t k = 0; k < n_carried; ++k)
        invariant = invariant && body_output_type(b, 1 + k) == b.type(b.inputs()[2 + k]);
      if (invariant) typed = std::move(b);
    }
  } catch (const Error&) {
    // The body does not infer with these types: keep what it declares.
  }
  const Graph& tb = typed ? *typed : body;
  for (size_t k = 0; k < n_carried; ++k) r.outputs.push_back(carried_type(c.input(2 + k), body_output_type(tb, 1 + k)));
  for (size_t k = n_carried; k < n_out; ++k) {
    TensorType t = body_output_type(tb, 1 + k);
    if (t.has_shape) t.dims.insert(t.dims.begin(), trips);
    r.outputs.push_back(t);
  }
  return r;
}

std::vector<Tensor> run_loop(const KernelContext& c) {
  auto err = [&](const std::string& m) { c.error(m); };
  if (!c.run_subgraph) c.error("needs a subgraph runner (run it through the interpreter)");
  const Graph& body = body_attr(c.node, "body", err);
  const size_t n_carried = c.num_inputs() - 2;
  const size_t n_out = c.node.outputs.size();
  if (n_out < n_carried) c.error("has " + std::to_string(n_out) + " outputs for " + std::to_string(n_carried) + " loop-carried values");
  const size_t n_scan = n_out - n_carried;
  int64_t max_trips = std::numeric_limits<int64_t>::max();
  if (c.has_input(0)) {
    if (!c.input(0).is_tensor()) c.error("M must be a tensor, got " + c.input(0).kind_str());
    if (c.input(0).numel() != 1) c.error("M must be a scalar, got shape " + shape_str(c.input(0).shape()));
    max_trips = c.input(0).as_int(0);
  }
  bool cond = c.has_input(1) ? truthy(c.input(1), c, "cond") : true;
  std::vector<Tensor> carried;
  for (size_t k = 0; k < n_carried; ++k) carried.push_back(c.input(2 + k));
  std::vector<std::vector<Tensor>> scans(n_scan);
  int64_t i = 0;
  size_t scan_bytes = 0;  // what the scan outputs hold so far, against the tensor cap
  for (; i < max_trips && cond; ++i) {
    if (i == max_loop_iterations())
      c.error("is still running after " + std::to_string(i) + " iterations (trip count " +
              (c.has_input(0) ? std::to_string(max_trips) : std::string("not given")) +
              "; the limit is NNFUSE_MAX_LOOP_ITERATIONS)");
    std::vector<Tensor> ins;
    ins.push_back(body_scalar(Tensor::scalar<int64_t>(i), body, 0));
    ins.push_back(body_scalar(Tensor::scalar<bool>(cond), body, 1));
    for (auto& t : carried) ins.push_back(t);
    std::vector<Tensor> outs = c.run_subgraph(body, ins);
    if (outs.size() != 1 + n_carried + n_scan)
      c.error("body gave " + std::to_string(outs.size()) + " outputs, expected " + std::to_string(1 + n_carried + n_scan));
    cond = truthy(outs[0], c, "the body's cond output");
    for (size_t k = 0; k < n_carried; ++k) carried[k] = outs[1 + k];
    for (size_t k = 0; k < n_scan; ++k) {
      scans[k].push_back(outs[1 + n_carried + k]);
      scan_bytes += scans[k].back().nbytes();
    }
    if (scan_bytes > max_tensor_bytes())
      c.error("scan outputs hold " + std::to_string(scan_bytes) + " bytes after " + std::to_string(i + 1) +
              " iterations, over the limit of " + std::to_string(max_tensor_bytes()) + " (NNFUSE_MAX_TENSOR_BYTES)");
  }
  std::vector<Tensor> result = carried;
  for (size_t k = 0; k < n_scan; ++k) {
    if (!scans[k].empty()) {
      result.push_back(stack(scans[k], c, k));
      continue;
    }
    // No iteration ran: an empty stack shaped as the body declares its element, when it can.
    TensorType t = body_output_type(body, 1 + n_carried + k);
    Shape s{0};
    if (t.is_static())
      for (auto v : t.static_shape()) s.push_back(v);
    result.push_back(Tensor(t.dtype == DType::Undefined ? DType::Float32 : t.dtype, s));
  }
  return result;
}

// ---- Scan (opset 8 with a batch axis; opset 9+ without) ------------------------------
struct ScanAttrs {
  int64_t num_scan_inputs = 0;
  std::vector<int64_t> in_dirs, out_dirs, in_axes, out_axes;
};

ScanAttrs scan_attrs(const Node& n, size_t n_inputs, size_t n_outputs, size_t n_state,
                     const std::function<void(const std::string&)>& error) {
  ScanAttrs a;
  auto m = n.attrs.opt_int("num_scan_inputs");
  if (!m) error("needs the attribute num_scan_inputs");
  a.num_scan_inputs = *m;
  if (a.num_scan_inputs < 1 || size_t(a.num_scan_inputs) > n_inputs)
    error("num_scan_inputs is " + std::to_string(a.num_scan_inputs) + " but the node has " + std::to_string(n_inputs) + " inputs");
  const size_t n_scan_out = n_outputs - n_state;
  auto list = [&](const char* name, size_t count) {
    std::vector<int64_t> v = n.attrs.get_ints(name, std::vector<int64_t>(count, 0));
    if (v.size() != count)
      error(std::string(name) + " has " + std::to_string(v.size()) + " entries, expected " + std::to_string(count));
    return v;
  };
  a.in_dirs = list("scan_input_directions", size_t(a.num_scan_inputs));
  a.out_dirs = list("scan_output_directions", n_scan_out);
  a.in_axes = list("scan_input_axes", size_t(a.num_scan_inputs));
  a.out_axes = list("scan_output_axes", n_scan_out);
  return a;
}

InferResult infer_scan8(const InferContext& c, const Graph& body) {
  const size_t n_in = c.num_inputs(), n_out = c.node.outputs.size();
  auto m = c.node.attrs.opt_int("num_scan_inputs");
  if (!m || *m < 1 || size_t(*m) + 1 > n_in) c.error("num_scan_inputs must be between 1 and the number of inputs after sequence_lens");
  const size_t n_state = n_in - 1 - size_t(*m);
  if (n_out < n_state) c.error("has fewer outputs than state variables (" + std::to_string(n_state) + ")");
  Dim batch, seq;
  for (size_t j = 1 + n_state; j < n_in; ++j) {
    const TensorType& t = c.input(j);
    if (t.has_shape && t.rank() >= 2) {
      batch = t.dims[0];
      seq = t.dims[1];
      break;
    }
  }
  InferResult r;
  for (size_t k = 0; k < n_state; ++k) r.outputs.push_back(c.input(1 + k));
  for (size_t k = n_state; k < n_out; ++k) {
    TensorType t = k < body.outputs().size() ? body_output_type(body, k) : TensorType();
    if (t.has_shape) {
      t.dims.insert(t.dims.begin(), seq);
      t.dims.insert(t.dims.begin(), batch);
    }
    r.outputs.push_back(t);
  }
  return r;
}

InferResult infer_scan(const InferContext& c) {
  auto err = [&](const std::string& m) { c.error(m); };
  const Graph& body = body_attr(c.node, "body", err);
  if (c.opset < 9) return infer_scan8(c, body);
  const size_t n_in = c.num_inputs(), n_out = c.node.outputs.size();
  auto m = c.node.attrs.opt_int("num_scan_inputs");
  if (!m || *m < 1 || size_t(*m) > n_in) c.error("num_scan_inputs must be between 1 and the number of inputs");
  const size_t n_state = n_in - size_t(*m);
  if (n_out < n_state) c.error("has fewer outputs than state variables (" + std::to_string(n_state) + ")");
  ScanAttrs a = scan_attrs(c.node, n_in, n_out, n_state, err);
  if (body.inputs().size() != n_in) c.error("body takes " + std::to_string(body.inputs().size()) + " inputs, the node has " + std::to_string(n_in));
  if (body.outputs().size() != n_out) c.error("body gives " + std::to_string(body.outputs().size()) + " outputs, the node has " + std::to_string(n_out));
  Dim seq;
  for (size_t j = 0; j < size_t(a.num_scan_inputs); ++j) {
    const TensorType& t = c.input(n_state + j);
    if (!t.has_shape) continue;
    int64_t ax = normalize_axis(a.in_axes[j], t.rank(), c.node);
    const Dim& d = t.dims[size_t(ax)];
    if (j == 0 || (!seq.known() && d.known())) seq = d;
    else if (seq.known() && d.known() && seq.value != d.value)
      c.error("scan inputs disagree on the sequence length: " + std::to_string(seq.value) + " and " + std::to_string(d.value));
  }
  InferResult r;
  for (size_t k = 0; k < n_state; ++k) r.outputs.push_back(carried_type(c.input(k), body_output_type(body, k)));
  for (size_t k = n_state; k < n_out; ++k) {
    TensorType t = body_output_type(body, k);
    if (t.has_shape) {
      int64_t ax = normalize_axis(a.out_axes[k - n_state], t.rank() + 1, c.node);
      t.dims.insert(t.dims.begin() + ax, seq);
    }
    r.outputs.push_back(t);
  }
  return r;
}

// outer = product of dims before axis, inner = product after (in bytes for inner).
void split_at_axis(const Shape& s, int64_t axis, int64_t& outer, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= s[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < s.size(); ++i) inner *= s[i];
}

// Element `pos` of `t` along `axis` (that axis removed).
Tensor slice_along(const Tensor& t, int64_t axis, int64_t pos) {
  Shape s = t.shape();
  const int64_t len = s[size_t(axis)];
  int64_t outer, inner;
  split_at_axis(s, axis, outer, inner);
  s.erase(s.begin() + axis);
  Tensor slice(t.dtype(), s);
  const size_t chunk = size_t(inner) * dtype_size(t.dtype());
  const char* src = static_cast<const char*>(t.raw());
  char* dst = static_cast<char*>(slice.raw());
  for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + size_t(o) * chunk, src + (size_t(o) * size_t(len) + size_t(pos)) * chunk, chunk);
  return slice;
}

// Writes `e` as element `pos` of `out` along `axis`.
void put_along(Tensor& out, int64_t axis, int64_t pos, const Tensor& e) {
  const int64_t len = out.shape()[size_t(axis)];
  int64_t outer, inner;
  split_at_axis(out.shape(), axis, outer, inner);
  const size_t chunk = size_t(inner) * dtype_size(e.dtype());
  const char* src = static_cast<const char*>(e.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + (size_t(o) * size_t(len) + size_t(pos)) * chunk, src + size_t(o) * chunk, chunk);
}

// The scan loop shared by Scan-8 (once per batch entry) and Scan-9+: `seq` iterations over the
// scan inputs; scan outputs are `out_len` long along their axis (out_len >= seq: Scan-8 pads
// short sequences with zeros). Returns final states then scan outputs.
std::vector<Tensor> scan_loop(const KernelContext& c, const Graph& body, std::vector<Tensor> state,
                              const std::vector<Tensor>& scan_in, const std::vector<int64_t>& in_axis,
                              const std::vector<int64_t>& in_dirs, size_t n_scan_out, const std::vector<int64_t>& out_axes_attr,
                              const std::vector<int64_t>& out_dirs, int64_t seq, int64_t out_len) {
  const size_t n_state = state.size(), n_out = n_state + n_scan_out;
  std::vector<Tensor> outs_acc(n_scan_out);
  std::vector<int64_t> out_axis(n_scan_out);
  for (int64_t it = 0; it < seq; ++it) {
    std::vector<Tensor> ins = state;
    for (size_t j = 0; j < scan_in.size(); ++j) ins.push_back(slice_along(scan_in[j], in_axis[j], in_dirs[j] ? seq - 1 - it : it));
    std::vector<Tensor> outs = c.run_subgraph(body, ins);
    if (outs.size() != n_out) c.error("body gave " + std::to_string(outs.size()) + " outputs, expected " + std::to_string(n_out));
    for (size_t k = 0; k < n_state; ++k) state[k] = outs[k];
    for (size_t k = 0; k < n_scan_out; ++k) {
      const Tensor& e = outs[n_state + k];
      if (it == 0) {
        out_axis[k] = normalize_axis(out_axes_attr[k], e.rank() + 1, c.node);
        Shape s = e.shape();
        s.insert(s.begin() + out_axis[k], out_len);
        outs_acc[k] = Tensor(e.dtype(), s);
      }
      Shape expect = outs_acc[k].shape();
      expect.erase(expect.begin() + out_axis[k]);
      if (e.shape() != expect || e.dtype() != outs_acc[k].dtype())
        c.error("scan output " + std::to_string(k) + " changes from " + shape_str(expect) + " to " + shape_str(e.shape()) +
                " at iteration " + std::to_string(it));
      put_along(outs_acc[k], out_axis[k], out_dirs[k] ? seq - 1 - it : it, e);
    }
  }
  if (seq == 0)
    for (size_t k = 0; k < n_scan_out; ++k) {
      TensorType t = body_output_type(body, n_state + k);
      Shape s;
      if (t.is_static()) s = t.static_shape();
      int64_t ax = out_axes_attr[k] < 0 ? out_axes_attr[k] + int64_t(s.size()) + 1 : out_axes_attr[k];
      ax = std::max<int64_t>(0, std::min<int64_t>(ax, int64_t(s.size())));
      s.insert(s.begin() + ax, out_len);
      outs_acc[k] = Tensor(t.dtype == DType::Undefined ? DType::Float32 : t.dtype, s);
    }
  std::vector<Tensor> result = std::move(state);
  for (auto& t : outs_acc) result.push_back(std::move(t));
  return result;
}

// Scan-8: every input has a leading batch axis, scan inputs are [batch, seq, ...], and an
// optional first input sequence_lens gives each batch entry its own length.
std::vector<Tensor> run_scan8(const KernelContext& c, const Graph& body) {
  const size_t n_in = c.num_inputs(), n_out = c.node.outputs.size();
  auto m = c.node.attrs.opt_int("num_scan_inputs");
  if (!m || *m < 1 || size_t(*m) + 1 > n_in) c.error("num_scan_inputs must be between 1 and the number of inputs after sequence_lens");
  const size_t n_scan_in = size_t(*m), n_state = n_in - 1 - n_scan_in;
  if (n_out < n_state) c.error("has fewer outputs than state variables (" + std::to_string(n_state) + ")");
  const size_t n_scan_out = n_out - n_state;
  std::vector<int64_t> dirs = c.node.attrs.get_ints("directions", std::vector<int64_t>(n_scan_in, 0));
  if (dirs.size() != n_scan_in) c.error("directions has " + std::to_string(dirs.size()) + " entries for " + std::to_string(n_scan_in) + " scan inputs");
  int64_t batch = -1, seq = -1;
  for (size_t j = 1; j < n_in; ++j) {
    const Tensor& t = c.input(j);
    bool is_scan = j >= 1 + n_state;
    if (t.rank() < (is_scan ? 2 : 1)) c.error("input " + std::to_string(j) + " needs a batch axis" + (is_scan ? " and a sequence axis" : "") + ", got shape " + shape_str(t.shape()));
    if (batch < 0) batch = t.dim(0);
    else if (batch != t.dim(0)) c.error("inputs disagree on the batch size: " + std::to_string(batch) + " and " + std::to_string(t.dim(0)));
    if (is_scan) {
      if (seq < 0) seq = t.dim(1);
      else if (seq != t.dim(1)) c.error("scan inputs disagree on the sequence length: " + std::to_string(seq) + " and " + std::to_string(t.dim(1)));
    }
  }
  std::vector<int64_t> lens(size_t(batch), seq);
  if (c.has_input(0)) {
    const Tensor& L = c.input(0);
    if (L.numel() != batch) c.error("sequence_lens has " + std::to_string(L.numel()) + " entries for batch " + std::to_string(batch));
    for (int64_t b = 0; b < batch; ++b) {
      lens[size_t(b)] = L.as_int(b);
      if (lens[size_t(b)] < 0 || lens[size_t(b)] > seq) c.error("sequence_lens[" + std::to_string(b) + "] is outside [0, " + std::to_string(seq) + "]");
    }
  }
  std::vector<std::vector<Tensor>> per_batch;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> state, scan_in;
    for (size_t k = 0; k < n_state; ++k) state.push_back(slice_along(c.input(1 + k), 0, b));
    for (size_t j = 0; j < n_scan_in; ++j) {
      Tensor s = slice_along(c.input(1 + n_state + j), 0, b);
      if (lens[size_t(b)] < seq) {  // only the first len steps count (reversed within them)
        Shape sh = s.shape();
        sh[0] = lens[size_t(b)];
        Tensor cut(s.dtype(), sh);
        if (cut.nbytes()) std::memcpy(cut.raw(), s.raw(), cut.nbytes());
        s = cut;
      }
      scan_in.push_back(s);
    }
    per_batch.push_back(scan_loop(c, body, state, scan_in, std::vector<int64_t>(n_scan_in, 0), dirs, n_scan_out,
                                  std::vector<int64_t>(n_scan_out, 0), std::vector<int64_t>(n_scan_out, 0), lens[size_t(b)], seq));
  }
  std::vector<Tensor> result;
  for (size_t k = 0; k < n_out; ++k) {
    if (batch == 0) c.error("batch size 0 is not supported");
    Shape s = per_batch[0][k].shape();
    s.insert(s.begin(), batch);
    Tensor out(per_batch[0][k].dtype(), s);
    for (int64_t b = 0; b < batch; ++b) {
      const Tensor& e = per_batch[size_t(b)][k];
      if (e.shape() != per_batch[0][k].shape()) c.error("output " + std::to_string(k) + " has different shapes across the batch");
      put_along(out, 0, b, e);
    }
    result.push_back(out);
  }
  return result;
}

std::vector<Tensor> run_scan(const KernelContext& c) {
  auto err = [&](const std::string& m) { c.error(m); };
  if (!c.run_subgraph) c.error("needs a subgraph runner (run it through the interpreter)");
  const Graph& body = body_attr(c.node, "body", err);
  if (c.opset < 9) return run_scan8(c, body);
  const size_t n_in = c.num_inputs(), n_out = c.node.outputs.size();
  auto m = c.node.attrs.opt_int("num_scan_inputs");
  if (!m || *m < 1 || size_t(*m) > n_in) c.error("num_scan_inputs must be between 1 and the number of inputs");
  const size_t n_state = n_in - size_t(*m);
  if (n_out < n_state) c.error("has fewer outputs than state variables (" + std::to_string(n_state) + ")");
  ScanAttrs a = scan_attrs(c.node, n_in, n_out, n_state, err);
  const size_t n_scan_in = size_t(a.num_scan_inputs), n_scan_out = n_out - n_state;

  int64_t seq = -1;
  std::vector<int64_t> in_axis(n_scan_in);
  std::vector<Tensor> scan_in;
  for (size_t j = 0; j < n_scan_in; ++j) {
    const Tensor& t = c.input(n_state + j);
    if (t.rank() == 0) c.error("scan input " + std::to_string(j) + " is a scalar; it needs an axis to scan");
    in_axis[j] = normalize_axis(a.in_axes[j], t.rank(), c.node);
    int64_t len = t.dim(in_axis[j]);
    if (seq < 0) seq = len;
    else if (seq != len)
      c.error("scan inputs disagree on the sequence length: " + std::to_string(seq) + " and " + std::to_string(len) + " (input " +
              std::to_string(n_state + j) + ", shape " + shape_str(t.shape()) + ")");
    scan_in.push_back(t);
  }
  std::vector<Tensor> state;
  for (size_t k = 0; k < n_state; ++k) state.push_back(c.input(k));
  return scan_loop(c, body, state, scan_in, in_axis, a.in_dirs, n_scan_out, a.out_axes, a.out_dirs, seq, seq);
}

OpSchema control_schema(const char* name, int since, int min_in, int max_in, int min_out) {
  OpSchema s;
  s.name = name;
  s.since = since;
  s.until = 28;
  s.min_inputs = min_in;
  s.max_inputs = max_in;
  s.min_outputs = min_out;
  s.max_outputs = -1;
  s.mapping = MappingType::ManyToMany;
  s.family = "control";
  return s;
}

}  // namespace

void register_control_ops(OpRegistry& r) {
  register_recurrent_ops(r);
  register_sequence_ops(r);

  OpSchema if_op = control_schema("If", 1, 1, 1, 1);
  if_op.takes_any_value = true;  // a branch may give a sequence or an optional
  if_op.infer = infer_if;
  if_op.kernel = run_if;
  // A branch runs, not both: count the dearer one.
  if_op.flops = [](const Node& n, const std::vector<TensorType>&, const std::vector<TensorType>&) {
    double f = 0;
    for (const char* b : {"then_branch", "else_branch"})
      if (auto* a = n.attrs.find(b); a && a->g) f = std::max(f, graph_flops(*a->g));
    return f;
  };
  r.add(std::move(if_op));

  OpSchema loop = control_schema("Loop", 1, 2, -1, 0);
  loop.takes_any_value = true;  // carried values may be sequences or optionals
  loop.infer = infer_loop;
  loop.kernel = run_loop;
  // The trip count is data, unknown here: one iteration's worth.
  loop.flops = [](const Node& n, const std::vector<TensorType>&, const std::vector<TensorType>&) {
    auto* a = n.attrs.find("body");
    return a && a->g ? graph_flops(*a->g) : 0.0;
  };
  r.add(std::move(loop));

  OpSchema scan = control_schema("Scan", 8, 1, -1, 0);
  scan.infer = infer_scan;
  scan.kernel = run_scan;
  scan.flops = [](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
    auto* a = n.attrs.find("body");
    if (!a || !a->g) return 0.0;
    double trips = 1;
    int64_t m = n.attrs.get_int("num_scan_inputs", 0);
    std::vector<int64_t> axes = n.attrs.get_ints("scan_input_axes");
    if (m >= 1 && size_t(m) <= ins.size()) {
      const TensorType& t = ins[ins.size() - size_t(m)];
      int64_t ax = axes.empty() ? 0 : axes[0];
      if (t.has_shape && ax < 0) ax += t.rank();
      if (t.has_shape && ax >= 0 && ax < t.rank() && t.dims[size_t(ax)].known()) trips = double(t.dims[size_t(ax)].value);
    }
    return trips * graph_flops(*a->g);
  };
  r.add(std::move(scan));
}

}  // namespace nnfuse
