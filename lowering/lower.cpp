// Lowering of fused blocks to the kernel IR (see kernel_ir.h), and the static memory plan.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>

#include "fusion/attention_pattern.h"
#include "graph/error.h"
#include "graph/op_registry.h"
#include "lowering/kernel_ir.h"
#include "lowering/lower_conv_transpose.h"
#include "lowering/lower_data_movement.h"
#include "lowering/lower_kernel_ops.h"
#include "rewrite/passes_util.h"

namespace nnfuse {

const char* buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::Input: return "input";
    case BufferKind::Output: return "output";
    case BufferKind::Weight: return "weight";
    case BufferKind::Activation: return "activation";
  }
  return "?";
}

std::string stage_node_list(const Graph& g, const Stage& st) {
  std::string r;
  for (NodeId id : st.nodes) r += (r.empty() ? "" : ", ") + g.node(id).op_type + " " + g.node(id).label();
  return r;
}

const char* stage_kind_name(StageKind k) {
  switch (k) {
    case StageKind::Elementwise: return "elementwise";
    case StageKind::Anchor: return "anchor";
    case StageKind::Fallback: return "fallback";
  }
  return "?";
}

int KernelModule::buffer_id(const std::string& value) const {
  for (auto& b : buffers)
    if (!b.value.empty() && b.value == value) return b.id;
  return -1;
}

nlohmann::json KernelModule::summary() const {
  nlohmann::json j;
  j["blocks"] = blocks;
  j["stages"] = stages.size();
  j["fallback_blocks"] = fallback_blocks;
  j["fallback_ops"] = fallback_ops;
  // Why each fallback block could not be lowered (the first member that failed), so a report
  // says what to lower next.
  j["fallback_reasons"] = nlohmann::json::array();
  for (auto& s : stages)
    if (s.kind == StageKind::Fallback) j["fallback_reasons"].push_back({{"stage", s.name}, {"reason", s.fallback_reason}});
  j["generated_blocks"] = blocks - fallback_blocks;
  j["peak_activation_bytes"] = arena_bytes;
  j["naive_activation_bytes"] = naive_bytes;
  j["inplace_buffers"] = inplace_count;
  j["constant_blocks_folded"] = folded_blocks;
  j["layout"] = layout_summary(*this);
  j["conv_algorithms"] = conv_algorithm_summary(*this);
  j["int8_kernels"] = int8_summary(*this);
  return j;
}

FusionPlan singleton_plan(const Graph& g) {
  FusionPlan p;
  p.target = "host";
  for (NodeId id : g.topo_order()) {
    const Node& n = g.node(id);
    if (n.op_type == "Constant" && n.domain.empty()) {
      p.constants.push_back(id);
      continue;
    }
    FusionBlock b;
    b.id = int(p.blocks.size());
    b.members = {id};
    b.type = node_mapping_type(g, id);
    if (b.type == MappingType::ManyToMany) b.anchor = id;
    std::vector<std::string> reads = n.inputs;
    // An If/Loop/Scan body reads values by name: they are inputs too, so that they stay live
    // until this block runs (the fallback stage hands them to the body as its outer scope).
    for (auto& v : passes::subgraph_reads(n))
      if (g.has_value(v)) reads.push_back(v);
    for (auto& v : reads)
      if (!v.empty() && std::find(b.inputs.begin(), b.inputs.end(), v) == b.inputs.end()) b.inputs.push_back(v);
    for (auto& v : n.outputs)
      if (!v.empty()) b.outputs.push_back(v);
    p.blocks.push_back(b);
  }
  return p;
}

namespace {

// Thrown inside block lowering when a member has no lowering (the block then falls back).
struct NoLowering {
  std::string reason;
  std::string op;
};
[[noreturn]] void no_lowering(const Node& n, const std::string& why) { throw NoLowering{n.op_type + " (" + n.label() + "): " + why, n.op_type}; }

// A 1-D convolution or pooling over [N, C, L] is the 2-D one over [N, C, 1, L]: the same memory,
// and the same (n*C + c, l) epilogue view. X, the kernel shape W ([K, Cg, k], or [1, 1, k] for
// pooling) and the output shape O4 get a unit height; the attributes a leading 1 (pads: none at
// the top and bottom). False when an attribute does not have its 1-D size.
bool as_2d(Shape& X, Shape& W, Shape& O4, std::vector<int64_t>& strides, std::vector<int64_t>& dil, std::vector<int64_t>& pads) {
  if (X.size() != 3 || W.size() != 3 || O4.size() != 3 || strides.size() != 1 || dil.size() != 1 || pads.size() != 2) return false;
  X = {X[0], X[1], 1, X[2]};
  W = {W[0], W[1], 1, W[2]};
  O4 = {O4[0], O4[1], 1, O4[2]};
  strides = {1, strides[0]};
  dil = {1, dil[0]};
  pads = {0, pads[0], 0, pads[1]};
  return true;
}

const std::set<std::string> kUnary = {"Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Sqrt", "Neg", "Abs", "Log", "Reciprocal",
                                      "Identity", "Dropout", "LeakyRelu", "HardSigmoid", "HardSwish", "Softplus", "Elu",
                                      "Floor", "Ceil", "Round", "Sin", "Cos", "Gelu"};
const std::set<std::string> kBinary = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"};
const std::set<std::string> kReorg = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"};
const std::set<std::string> kAnchors = {"MatMul", "Gemm", "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
                                        "GlobalMaxPool", "Softmax", "LayerNormalization", "ReduceMean", "ReduceSum",
                                        "ReduceMax"};

// Appends a step to a map, composing with the previous step where possible.
IndexMap then(IndexMap m, IndexStep s) {
  if (s.kind == IndexStep::Offset) {
    // Windows compose (a Concat window read back through its inverse cancels out).
    auto unit = [](const IndexStep& o) {
      for (size_t k = 0; k < o.off.size(); ++k)
        if (o.off[k] != 0 || (!o.stride.empty() && o.stride[k] != 1)) return false;
      return o.from == o.to;
    };
    if (!m.steps.empty() && m.steps.back().kind == IndexStep::Offset) {
      IndexStep& p = m.steps.back();
      std::vector<int64_t> stride(s.to.size(), 1);
      for (size_t k = 0; k < s.to.size(); ++k) {
        int64_t s1 = p.stride.empty() ? 1 : p.stride[k], s2 = s.stride.empty() ? 1 : s.stride[k];
        stride[k] = s1 * s2;
        p.off[k] = p.off[k] * s2 + s.off[k];
      }
      p.stride = stride;
      p.to = s.to;
      if (unit(p)) m.steps.pop_back();
      return m;
    }
    if (unit(s)) return m;
  }
  if (s.kind == IndexStep::Reshape) {
    if (s.from == s.to) return m;
    // A reshape that only inserts or removes size-1 dims is a Select.
    Shape a, b;
    for (auto d : s.from)
      if (d != 1) a.push_back(d);
    for (auto d : s.to)
      if (d != 1) b.push_back(d);
    if (a == b) {
      std::vector<int> src(s.to.size(), -1);
      size_t j = 0;
      for (size_t k = 0; k < s.to.size(); ++k) {
        if (s.to[k] == 1) continue;
        while (s.from[j] == 1) ++j;
        src[k] = int(j++);
      }
      s = select_step(s.from, s.to, std::move(src));
    } else if (!m.steps.empty() && m.steps.back().kind == IndexStep::Reshape) {
      m.steps.back().to = s.to;
      if (m.steps.back().from == m.steps.back().to) m.steps.pop_back();
      return m;
    }
  }
  if (s.kind == IndexStep::Select) {
    bool ident = s.from.size() == s.to.size();
    for (size_t k = 0; ident && k < s.src.size(); ++k)
      if (!(s.src[k] == int(k) || (s.src[k] < 0 && s.to[k] == 1 && s.from[k] == 1))) ident = false;
    if (ident) return m;
    if (!m.steps.empty() && m.steps.back().kind == IndexStep::Select) {
      IndexStep& p = m.steps.back();
      std::vector<int> src(s.to.size(), -1);
      for (size_t k = 0; k < s.to.size(); ++k) src[k] = s.src[k] < 0 ? -1 : p.src[size_t(s.src[k])];
      p.src = src;
      p.to = s.to;
      bool id2 = p.from.size() == p.to.size();
      for (size_t k = 0; id2 && k < p.src.size(); ++k)
        if (!(p.src[k] == int(k) || (p.src[k] < 0 && p.to[k] == 1 && p.from[k] == 1))) id2 = false;
      if (id2) m.steps.pop_back();
      return m;
    }
  }
  m.steps.push_back(std::move(s));
  return m;
}


IndexMap identity_map(const Shape& s) {
  IndexMap m;
  m.domain = s;
  return m;
}

struct Lowerer {
  const Graph& g;
  const FusionPlan& plan;
  const LowerOptions& opt;
  KernelModule mod;
  std::map<std::string, int> buf_of;  // graph value -> buffer
  std::map<std::string, Tensor> folded;  // values computed from constants at lowering time
  std::set<NodeId> folded_nodes;

  Lowerer(const Graph& graph, const FusionPlan& p, const LowerOptions& o) : g(graph), plan(p), opt(o) {}

  Shape shape_of(const std::string& v) const {
    const TensorType& t = g.type(v);
    if (!t.is_static()) {
      // Model inputs must be bound; a value whose shape depends on data (NonMaxSuppression,
      // NonZero) can only be handled by fallback blocks.
      if (g.is_input(v))
        fail(ErrorKind::Shape, "model input '" + v + "' has type " + t.str() +
                                   ": compiled targets need static shapes; bind the dynamic input dims with --shape NAME=DIMS");
      throw NoLowering{"value '" + v + "' has a data-dependent shape " + t.str(), "dynamic-shape"};
    }
    return t.static_shape();
  }

  int add_buffer(const std::string& value, DType dt, Shape shape, BufferKind kind) {
    KBuffer b;
    b.id = int(mod.buffers.size());
    b.value = value;
    b.dtype = dt;
    b.shape = std::move(shape);
    b.kind = kind;
    try {
      b.bytes = int64_t(tensor_bytes_checked(dt, b.shape));
    } catch (const Error& e) {
      fail(e.kind(), "value '" + value + "': " + e.detail());
    }
    mod.buffers.push_back(b);
    if (!value.empty()) buf_of[value] = b.id;
    return b.id;
  }

  // The value of a constant: folded at lowering time, an initializer or a Constant; else null.
  const Tensor* constant(const std::string& v) const {
    auto it = folded.find(v);
    if (it != folded.end()) return &it->second;
    if (const Tensor* t = g.constant_value(v)) return t;
    // An initializer also listed as a graph input (IR < 4 exports) is overridable in ONNX, but
    // the compiled model takes no such input (run() skips them): its initializer is the value.
    return g.find_initializer(v);
  }

  int buffer_for(const std::string& v) {
    auto it = buf_of.find(v);
    if (it != buf_of.end()) return it->second;
    if (const Tensor* c = constant(v)) {
      int id = add_buffer(v, c->dtype(), c->shape(), BufferKind::Weight);
      mod.buffers[size_t(id)].data = *c;
      return id;
    }
    BufferKind k = g.is_output(v) ? BufferKind::Output : g.is_input(v) ? BufferKind::Input : BufferKind::Activation;
    if (!g.is_input(v) && !g.type(v).is_static()) {
      int id = add_buffer(v, g.type(v).dtype, {}, k);
      mod.buffers[size_t(id)].dynamic = true;
      mod.buffers[size_t(id)].bytes = 0;
      return id;
    }
    return add_buffer(v, g.type(v).dtype, shape_of(v), k);
  }

  int weight_buffer(Tensor t) {
    int id = add_buffer("", t.dtype(), t.shape(), BufferKind::Weight);
    mod.buffers[size_t(id)].data = std::move(t);
    return id;
  }

  // ---------------------------------------------------------------- one block
  struct BlockCtx {
    const FusionBlock* block = nullptr;
    std::set<NodeId> members;
    std::map<std::string, NodeId> producer;  // values produced inside the block
    std::set<std::string> available;         // in-block values materialised by an earlier stage
  };

  struct StageBuilder {
    Stage st;
    std::map<std::string, int> memo;  // value + map -> expr
    NodeId anchor = kNoNode;
    std::string anchor_value;
    int anchor_expr = -1;  // the anchor's value with its bias/scale folded in
  };

  // Set while building a Cast-to-float operand (or a bool condition): integer/bool buffers load
  // as float and data-movement members pass integer values through (lower_data_movement.h).
  bool int_as_float = false;

  // The expression builder as lower_data_movement.cpp sees it.
  struct DMHost final : dm::ExprHost {
    Lowerer& l;
    StageBuilder& sb;
    BlockCtx& bc;
    DMHost(Lowerer& lw, StageBuilder& s, BlockCtx& b) : l(lw), sb(s), bc(b) {}
    const Graph& graph() const override { return l.g; }
    Shape shape_of(const std::string& v) override { return l.shape_of(v); }
    const Tensor* constant(const std::string& v) override { return l.constant(v); }
    int buffer_for(const std::string& v) override { return l.buffer_for(v); }
    int weight_buffer(Tensor t) override { return l.weight_buffer(std::move(t)); }
    const KBuffer& buffer(int id) const override { return l.mod.buffers.at(size_t(id)); }
    bool in_block(const std::string& v) const override { return bc.producer.count(v) && !bc.available.count(v); }
    int expr_of(const std::string& v, const IndexMap& m) override { return l.expr_of(sb, bc, v, m); }
    int expr_of_as_float(const std::string& v, const IndexMap& m) override {
      bool was = l.int_as_float;
      l.int_as_float = true;
      try {
        int r = l.expr_of(sb, bc, v, m);
        l.int_as_float = was;
        return r;
      } catch (...) {
        l.int_as_float = was;
        throw;
      }
    }
    int push(Expr e) override { return l.push(sb, std::move(e)); }
    std::optional<int> int_part(const std::string& v, const IndexMap& m, int k) override {
      if (const Tensor* c = l.constant(v); c && c->numel() == 1) {
        // The raw value (as_int goes through double for other types than int64: a uint64 past
        // 2^53 would round).
        const DType dt = c->dtype();
        const bool is_signed = dt == DType::Int64 || dt == DType::Int32;
        const int64_t x = dt == DType::Int64    ? c->data<int64_t>()[0]
                          : dt == DType::Int32  ? int64_t(c->data<int32_t>()[0])
                          : dt == DType::UInt32 ? int64_t(c->data<uint32_t>()[0])
                                                : int64_t(c->data<uint64_t>()[0]);
        const double part = k < 2 ? double((uint64_t(x) >> (22 * k)) & 0x3fffff)
                                  : is_signed ? double(x >> 44) : double(uint64_t(x) >> 44);
        return l.cnst(sb, part);
      }
      if (in_block(v)) return std::nullopt;  // computed in the block: no buffer to read parts from
      return l.load(sb, l.buffer_for(v), m, k);
    }
    IndexMap then(const IndexMap& m, const IndexStep& s) const override { return nnfuse::then(m, s); }
    [[noreturn]] void no_lowering(const Node& n, const std::string& why) const override { nnfuse::no_lowering(n, why); }
  };

  int push(StageBuilder& sb, Expr e) {
    sb.st.exprs.push_back(std::move(e));
    return int(sb.st.exprs.size()) - 1;
  }
  // part >= 0: one of the three exact parts of a wide integer (Expr::part).
  int load(StageBuilder& sb, int buffer, const IndexMap& m, int part = -1) {
    const KBuffer& b = mod.buffers[size_t(buffer)];
    if (b.dynamic) throw NoLowering{"reads '" + b.value + "', whose shape depends on data", "dynamic-shape"};
    // Bool and 8/16-bit values load exactly; whatever makes a non-float value from them is
    // checked where it is produced (expr_uncached). Wider integers only inside a float Cast, or
    // in parts.
    if (part >= 0 && !dm::wide_int_dtype(b.dtype))
      fail(ErrorKind::Invalid, "lowering: integer parts of a " + std::string(dtype_name(b.dtype)) + " buffer");
    if (part < 0 && b.dtype != DType::Float32 && !int_as_float && !dm::exact_dtype(b.dtype))
      throw NoLowering{"loads " + std::string(dtype_name(b.dtype)) + " value '" + b.value + "'", "dtype"};
    if (m.codomain() != b.shape) fail(ErrorKind::Invalid, "lowering: map " + m.str() + " does not reach buffer shape " + shape_str(b.shape));
    Expr e;
    e.kind = Expr::Load;
    e.buffer = buffer;
    e.map = m;
    e.part = part;
    return push(sb, std::move(e));
  }
  int cnst(StageBuilder& sb, double v) {
    Expr e;
    e.kind = Expr::Const;
    e.value = v;
    return push(sb, std::move(e));
  }
  int unary(StageBuilder& sb, const std::string& op, int a, double p0 = 0, double p1 = 0) {
    Expr e;
    e.kind = Expr::Unary;
    e.op = op;
    e.args = {a};
    e.lo = p0;
    e.hi = p1;
    return push(sb, std::move(e));
  }
  int binary(StageBuilder& sb, const std::string& op, int a, int b) {
    Expr e;
    e.kind = Expr::Binary;
    e.op = op;
    e.args = {a, b};
    return push(sb, std::move(e));
  }

  std::optional<double> scalar_const(const std::string& v) {
    if (v.empty()) return std::nullopt;
    const Tensor* t = constant(v);
    if (!t || t->numel() != 1) return std::nullopt;
    return t->as_double(0);
  }

  // The expression for value v at index map m (driver index -> v's index).
  int expr_of(StageBuilder& sb, BlockCtx& bc, const std::string& v, const IndexMap& m) {
    std::string key = v + "@" + m.str() + (int_as_float ? "#f" : "");
    auto it = sb.memo.find(key);
    if (it != sb.memo.end()) return it->second;
    int r = expr_uncached(sb, bc, v, m);
    sb.memo[key] = r;
    return r;
  }

  // Split output v is the window of the input at the summed sizes of the outputs before it along
  // the axis: that start times `sign` on the axis, 0 elsewhere (+1: v's index to the input's,
  // -1: the input's index to v's).
  std::vector<int64_t> split_window_start(const Node& n, const std::string& v, int64_t sign) {
    const Shape in = shape_of(n.inputs[0]);
    int64_t axis = n.attrs.get_int("axis", 0);
    if (axis < 0) axis += int64_t(in.size());
    int64_t start = 0;
    for (auto& o : n.outputs) {
      if (o == v) break;
      if (o.empty()) no_lowering(n, "absent output");
      start += shape_of(o)[size_t(axis)];
    }
    std::vector<int64_t> off(in.size(), 0);
    off[size_t(axis)] = sign * start;
    return off;
  }

  int expr_uncached(StageBuilder& sb, BlockCtx& bc, const std::string& v, const IndexMap& m) {
    if (!sb.anchor_value.empty() && v == sb.anchor_value) {
      if (!m.is_identity()) throw NoLowering{"anchor output read through a non-identity map " + m.str(), "epilogue"};
      return sb.anchor_expr;
    }
    auto pit = bc.producer.find(v);
    if (pit == bc.producer.end() || bc.available.count(v)) {
      if (auto c = scalar_const(v)) return cnst(sb, *c);
      return load(sb, buffer_for(v), m);
    }
    const Node& n = g.node(pit->second);
    if (n.op_type == "Constant") return load(sb, buffer_for(v), m);
    // Integer/bool values only where float holds them exactly (lower_data_movement.h): made by a
    // comparison or a float cast, or moved by data movement (bool and 8/16-bit values always,
    // wider integers inside a Cast to float).
    const bool exact_move = dm::moves_data(n.op_type) && (int_as_float || dm::exact_dtype(g.type(v).dtype));
    if (g.type(v).dtype != DType::Float32 && !dm::exact_in_float(g, n) && !exact_move)
      no_lowering(n, std::string("produces ") + dtype_name(g.type(v).dtype));
    {
      DMHost h(*this, sb, bc);
      if (auto r = dm::lower_expr(h, n, v, m)) return *r;
    }
    Shape out = shape_of(v);
    auto in_expr = [&](size_t i) {
      const std::string& x = n.inputs.at(i);
      Shape in = shape_of(x);
      if (in.size() > out.size()) no_lowering(n, "input of higher rank than its output");
      return expr_of(sb, bc, x, then(m, broadcast_step(out, in)));
    };
    const std::string& op = n.op_type;
    if (!n.domain.empty()) no_lowering(n, "domain " + n.domain);
    if (n.outputs.size() > 1) {
      for (size_t i = 1; i < n.outputs.size(); ++i)
        if (!n.outputs[i].empty() && op != "Dropout" && op != "Split") no_lowering(n, "has several outputs");
    }
    if (op == "Dropout") {
      // Inference Dropout is Identity. Training mode draws a random mask, and the mask output is
      // a second value this expression cannot give: both stay with the reference kernel (which
      // refuses training mode by name). The rewriter removes the plain form before this.
      if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
        const Tensor* mode = g.constant_value(n.inputs[2]);
        if (!mode || mode->numel() != 1 || mode->as_double(0) != 0) no_lowering(n, "training_mode is not a constant false");
      }
      if (n.outputs.size() > 1 && !n.outputs[1].empty() && (!g.consumers(n.outputs[1]).empty() || g.is_output(n.outputs[1])))
        no_lowering(n, "its mask output is used");
    }
    if (kUnary.count(op)) {
      int a = in_expr(0);
      if (op == "Identity" || op == "Dropout") return a;
      double p0 = 0, p1 = 0;
      if (op == "LeakyRelu") p0 = n.attrs.get_float("alpha", 0.01f);
      if (op == "Elu") p0 = n.attrs.get_float("alpha", 1.0f);
      if (op == "HardSigmoid") {
        p0 = n.attrs.get_float("alpha", 0.2f);
        p1 = n.attrs.get_float("beta", 0.5f);
      }
      if (op == "Gelu") {
        const std::string form = n.attrs.get_string("approximate", "none");
        if (form == "tanh") return unary(sb, "GeluTanh", a);
        if (form != "none") no_lowering(n, "approximate=" + form);
      }
      return unary(sb, op, a, p0, p1);
    }
    if (kBinary.count(op)) {
      if (n.inputs.size() != 2) no_lowering(n, "not binary");
      if (op == "PRelu") {
        int x = in_expr(0), s = in_expr(1);
        return binary(sb, "PRelu", x, s);
      }
      if (op == "Pow") {
        if (auto e = scalar_const(n.inputs[1])) {
          int x = in_expr(0);
          // Small integer exponents as products: the tanh GELU that exporters write (GPT-2,
          // "gelu_new") cubes its input, and a general pow (log, exp and the sign rules of a
          // negative base) cost ~5 ms of an 8.4 ms GPT-2 FC1 kernel on a Zen 3 core.
          if (*e == 2.0) return binary(sb, "Mul", x, x);
          if (*e == 3.0) return binary(sb, "Mul", binary(sb, "Mul", x, x), x);
          if (*e == 4.0) {
            int x2 = binary(sb, "Mul", x, x);
            return binary(sb, "Mul", x2, x2);
          }
          if (*e == 1.0) return x;
          if (*e == -1.0) return unary(sb, "Reciprocal", x);
          if (*e == 0.5) return unary(sb, "Sqrt", x);
        }
      }
      int a = in_expr(0), b = in_expr(1);
      return binary(sb, op, a, b);
    }
    if (op == "Clip") {
      double lo = -INFINITY, hi = INFINITY;
      if (g.opset() < 11) {
        lo = n.attrs.get_float("min", -INFINITY);
        hi = n.attrs.get_float("max", INFINITY);
      } else {
        if (n.inputs.size() > 1 && !n.inputs[1].empty()) {
          auto c = scalar_const(n.inputs[1]);
          if (!c) no_lowering(n, "non-constant min");
          lo = *c;
        }
        if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
          auto c = scalar_const(n.inputs[2]);
          if (!c) no_lowering(n, "non-constant max");
          hi = *c;
        }
      }
      Expr e;
      e.kind = Expr::Clip;
      e.args = {in_expr(0)};
      e.lo = lo;
      e.hi = hi;
      return push(sb, std::move(e));
    }
    if (op == "BatchNormalization") {
      if (n.attrs.get_int("training_mode", 0) != 0) no_lowering(n, "training mode");
      if (out.size() < 2) no_lowering(n, "rank < 2");
      const Tensor *s = constant(n.inputs[1]), *b = constant(n.inputs[2]), *mu = constant(n.inputs[3]), *var = constant(n.inputs[4]);
      if (!s || !b || !mu || !var || s->dtype() != DType::Float32) no_lowering(n, "non-constant parameters");
      int64_t C = out[1];
      if (s->numel() != C || b->numel() != C || mu->numel() != C || var->numel() != C) no_lowering(n, "parameter sizes");
      // Folded to y = x * a + c per channel (as the reference kernel computes it).
      double eps = n.attrs.get_float("epsilon", 1e-5f);
      std::vector<float> av(static_cast<size_t>(C), 0.f), cv(static_cast<size_t>(C), 0.f);
      auto sv = s->to_float_vector(), bv = b->to_float_vector(), mv = mu->to_float_vector(), vv = var->to_float_vector();
      for (int64_t c = 0; c < C; ++c) {
        double a = double(sv[size_t(c)]) / std::sqrt(double(vv[size_t(c)]) + eps);
        av[size_t(c)] = float(a);
        cv[size_t(c)] = float(double(bv[size_t(c)]) - double(mv[size_t(c)]) * a);
      }
      std::string key = n.label() + "#bn";
      int ab, cb;
      auto f = bn_cache.find(key);
      if (f != bn_cache.end()) {
        ab = f->second.first;
        cb = f->second.second;
      } else {
        ab = weight_buffer(Tensor::from_vector<float>({C}, av));
        cb = weight_buffer(Tensor::from_vector<float>({C}, cv));
        bn_cache[key] = {ab, cb};
      }
      int x = in_expr(0);
      std::vector<int> src = {1};
      IndexMap cm = then(m, select_step(out, {C}, src));
      int a = load(sb, ab, cm), c = load(sb, cb, cm);
      return binary(sb, "Add", binary(sb, "Mul", x, a), c);
    }
    if (kReorg.count(op)) {
      Shape in = shape_of(n.inputs[0]);
      return expr_of(sb, bc, n.inputs[0], then(m, reshape_step(out, in)));
    }
    if (op == "Transpose") {
      Shape in = shape_of(n.inputs[0]);
      std::vector<int64_t> perm = n.attrs.get_ints("perm", {});
      if (perm.empty())
        for (int64_t k = int64_t(in.size()); k-- > 0;) perm.push_back(k);
      std::vector<int> src(in.size(), -1);
      for (size_t k = 0; k < perm.size(); ++k) src[size_t(perm[k])] = int(k);
      return expr_of(sb, bc, n.inputs[0], then(m, select_step(out, in, src)));
    }
    if (op == "Expand") {
      Shape in = shape_of(n.inputs[0]);
      return expr_of(sb, bc, n.inputs[0], then(m, broadcast_step(out, in)));
    }
    if (op == "Split") {
      Shape in = shape_of(n.inputs[0]);
      return expr_of(sb, bc, n.inputs[0], then(m, offset_step(out, in, split_window_start(n, v, +1))));
    }
    no_lowering(n, "no lowering for this op yet");
  }
  std::map<std::string, std::pair<int, int>> bn_cache;

  // Finishes a stage: view, access classification, vectorizability.
  void finish_stage(Stage& st) {
    st.rows = st.width ? shape_numel(st.driver) / std::max<int64_t>(1, st.width) : 0;
    st.vectorizable = true;
    for (auto& e : st.exprs) {
      if (e.kind != Expr::Load) continue;
      e.access = classify_access(e.map, st.rows, st.width);
      if (!vectorizable_load(e.access)) st.vectorizable = false;
    }
    for (auto& s : st.stores) {
      if (s.windowed()) {
        // Windows exist only over a width that is the driver's last dim (the Split's axis).
        if (st.driver.empty() || st.width != st.driver.back())
          throw NoLowering{"a Split window in a stage of width " + std::to_string(st.width), "epilogue"};
        if (s.window_lo % kStoreWindowAlign || s.window_hi % kStoreWindowAlign) st.vectorizable = false;
      }
      s.access = classify_access(s.map, st.rows, s.width_in(st.width));
      if (!s.access.affine || s.access.col_stride != 1) st.vectorizable = false;
    }
  }

  // The anchor kernel writes its output in its own rows x width layout: into the buffer of a
  // store that has exactly that layout, else into a scratch buffer (the stores then scatter).
  void pick_anchor_output(Stage& st) {
    int64_t numel = st.rows * st.width;
    for (size_t i = 0; i < st.stores.size(); ++i) {
      auto& s = st.stores[i];
      const auto& b = mod.buffers[size_t(s.buffer)];
      if (s.access.affine && s.access.base == 0 && s.access.col_stride == 1 && (s.access.row_stride == st.width || st.rows == 1) &&
          shape_numel(b.shape) == numel) {
        st.primary_store = int(i);
        st.anchor_output = s.buffer;
        return;
      }
    }
    st.anchor_output = add_buffer("", DType::Float32, st.driver, BufferKind::Activation);
  }

  // Picks the widest rows x width view (trailing dims) in which every access stays affine.
  void choose_view(Stage& st) {
    const Shape& d = st.driver;
    std::vector<int64_t> widths;
    int64_t w = 1;
    for (size_t k = d.size(); k-- > 0;) {
      w *= d[k];
      widths.push_back(w);
    }
    if (widths.empty()) widths.push_back(1);
    std::reverse(widths.begin(), widths.end());  // widest first
    for (size_t i = 0; i < widths.size(); ++i) {
      st.width = widths[i];
      finish_stage(st);
      if (st.vectorizable && (st.width >= 64 || i + 1 == widths.size())) return;
      if (st.vectorizable && st.rows > 1) return;
    }
    st.width = d.empty() ? 1 : d.back();
    finish_stage(st);
  }

  std::vector<std::string> present_outputs(const Node& n) {
    std::vector<std::string> r;
    for (auto& o : n.outputs)
      if (!o.empty()) r.push_back(o);
    return r;
  }

  // Elementwise stages computing `values` (grouped by shape).
  void elementwise_stages(BlockCtx& bc, const std::vector<std::string>& values, std::vector<Stage>& out, const std::string& tag) {
    std::set<std::string> done = materialise_concats(bc, values, out, tag);
    std::map<Shape, std::vector<std::string>> by_shape;
    std::vector<Shape> order;
    for (auto& v : values) {
      if (done.count(v)) continue;
      Shape s = shape_of(v);
      if (!by_shape.count(s)) order.push_back(s);
      by_shape[s].push_back(v);
    }
    for (auto& s : order) {
      StageBuilder sb;
      sb.st.kind = StageKind::Elementwise;
      sb.st.driver = s;
      for (auto& v : by_shape[s]) {
        int e = expr_of(sb, bc, v, identity_map(s));
        Store st;
        st.buffer = buffer_for(v);
        auto pit = bc.producer.find(v);
        // Made exactly (a comparison, a float cast), or any value of a type float holds exactly.
        bool exact = (pit != bc.producer.end() && !bc.available.count(v) && dm::exact_in_float(g, g.node(pit->second))) ||
                     dm::exact_dtype(mod.buffers[size_t(st.buffer)].dtype);
        if (mod.buffers[size_t(st.buffer)].dtype != DType::Float32 && !exact) throw NoLowering{"stores non-float value '" + v + "'", "dtype"};
        st.expr = e;
        st.map = identity_map(s);
        sb.st.stores.push_back(st);
      }
      choose_view(sb.st);
      sb.st.name = tag + "_e" + std::to_string(out.size());
      out.push_back(std::move(sb.st));
    }
    for (auto& v : values) bc.available.insert(v);
  }

  // In-block Concats that `values` read are materialised first: one stage per input computes it
  // and stores it into its window of the Concat's buffer (Offset store map), so a Concat costs
  // no copy of its own when its inputs are computed in the block. Returns the Concats done.
  std::set<std::string> materialise_concats(BlockCtx& bc, const std::vector<std::string>& values, std::vector<Stage>& out, const std::string& tag) {
    std::vector<NodeId> order;  // producers first
    std::set<std::string> seen, done;
    std::function<void(const std::string&)> visit = [&](const std::string& v) {
      auto it = bc.producer.find(v);
      if (it == bc.producer.end() || bc.available.count(v) || !seen.insert(v).second) return;
      const Node& n = g.node(it->second);
      for (auto& in : n.inputs)
        if (!in.empty()) visit(in);
      if (n.op_type == "Concat" && n.domain.empty()) order.push_back(n.id);
    };
    for (auto& v : values) visit(v);
    for (NodeId id : order) {
      const Node& n = g.node(id);
      const std::string& cv = n.outputs[0];
      int cb = buffer_for(cv);
      if (mod.buffers[size_t(cb)].dtype != DType::Float32) no_lowering(n, "non-float values");
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        if (n.inputs[i].empty() || shape_numel(shape_of(n.inputs[i])) == 0) continue;
        StageBuilder sb;
        sb.st.kind = StageKind::Elementwise;
        sb.st.driver = shape_of(n.inputs[i]);
        Store st;
        st.buffer = cb;
        st.map = then(identity_map(sb.st.driver), dm::concat_window(g, n, i));
        st.expr = expr_of(sb, bc, cv, st.map);
        sb.st.stores.push_back(st);
        choose_view(sb.st);
        sb.st.name = tag + "_c" + std::to_string(out.size());
        out.push_back(std::move(sb.st));
      }
      bc.available.insert(cv);
      done.insert(cv);
    }
    return done;
  }

  // Stages writing the windows of in-block Concats on the anchor's epilogue path that come from
  // other inputs: each such input drives a stage storing the block outputs it reaches.
  void concat_source_stages(BlockCtx& bc, const std::string& O, const std::vector<std::string>& post_outs,
                            std::map<std::string, std::optional<IndexMap>>& fmemo, std::vector<Stage>& out, const std::string& tag) {
    for (auto& [v, f] : std::map<std::string, std::optional<IndexMap>>(fmemo)) {
      auto pit = bc.producer.find(v);
      if (!f || pit == bc.producer.end() || g.node(pit->second).op_type != "Concat") continue;
      for (auto& x : g.node(pit->second).inputs) {
        if (x.empty() || forward_map(bc, x, O, fmemo) || shape_numel(shape_of(x)) == 0) continue;
        StageBuilder sb;
        sb.st.kind = StageKind::Elementwise;
        sb.st.driver = shape_of(x);
        std::map<std::string, std::optional<IndexMap>> memo;
        for (auto& o : post_outs) {
          auto fo = forward_map(bc, o, x, memo);
          if (!fo) continue;
          // x through a Split of the Concat: part of x lands outside the output.
          if (has_escaping_offset(*fo, 0)) throw NoLowering{"Concat input " + x + " read back through a Split", "epilogue"};
          Store st;
          st.buffer = buffer_for(o);
          st.map = *fo;
          st.expr = expr_of(sb, bc, o, *fo);
          sb.st.stores.push_back(st);
        }
        if (sb.st.stores.empty()) continue;
        choose_view(sb.st);
        sb.st.name = tag + "_s" + std::to_string(out.size());
        out.push_back(std::move(sb.st));
      }
    }
  }

  // Forward map from the anchor output's index to v's index, when v derives from the anchor
  // output through bijective members only. nullopt: not derived; throws when not forward-mappable.
  std::optional<IndexMap> forward_map(BlockCtx& bc, const std::string& v, const std::string& O, std::map<std::string, std::optional<IndexMap>>& memo) {
    if (v == O) return identity_map(shape_of(O));
    auto mit = memo.find(v);
    if (mit != memo.end()) return mit->second;
    auto pit = bc.producer.find(v);
    std::optional<IndexMap> res;
    if (pit != bc.producer.end() && !bc.available.count(v)) {
      const Node& n = g.node(pit->second);
      Shape out = shape_of(v);
      if (n.op_type == "Concat" && n.domain.empty()) {
        // The input derived from the anchor output lands in its window; the other inputs'
        // windows are written by their own stages (concat_source_stages).
        int derived = 0;
        for (size_t i = 0; i < n.inputs.size(); ++i)
          if (!n.inputs[i].empty())
            if (auto f = forward_map(bc, n.inputs[i], O, memo)) {
              // A Split window composed with a Concat window would lose its bounds (then() merges
              // the two Offset steps).
              if (has_escaping_offset(*f, 0)) throw NoLowering{"epilogue Concat " + n.label() + " of a Split window", "epilogue"};
              res = then(*f, dm::concat_window(g, n, i));
              ++derived;
            }
        if (derived > 1) throw NoLowering{"epilogue Concat " + n.label() + " joins several parts of the anchor output", "epilogue"};
        memo[v] = res;
        return res;
      }
      std::vector<IndexMap> ins;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        if (n.inputs[i].empty()) continue;
        auto f = forward_map(bc, n.inputs[i], O, memo);
        if (f) ins.push_back(*f);
      }
      if (!ins.empty()) {
        const std::string& op = n.op_type;
        if (kReorg.count(op)) {
          res = then(ins[0], reshape_step(shape_of(n.inputs[0]), out));
        } else if (op == "Transpose") {
          Shape in = shape_of(n.inputs[0]);
          std::vector<int64_t> perm = n.attrs.get_ints("perm", {});
          if (perm.empty())
            for (int64_t k = int64_t(in.size()); k-- > 0;) perm.push_back(k);
          std::vector<int> src(perm.begin(), perm.end());
          res = then(ins[0], select_step(in, out, src));
        } else if (op == "Split" && n.domain.empty()) {
          // An escaping Offset step: the epilogue stores v in its window only (epilogue_store_window).
          res = then(ins[0], offset_step(shape_of(n.inputs[0]), out, split_window_start(n, v, -1)));
        } else if (kUnary.count(op) || kBinary.count(op) || op == "Clip" || op == "BatchNormalization" || op == "Cast" || dm::elementwise_op(op)) {
          for (auto& f : ins)
            if (f.codomain() != out || f.str() != ins[0].str())
              throw NoLowering{"epilogue member " + n.label() + " broadcasts the anchor output", "epilogue"};
          res = ins[0];
        } else {
          throw NoLowering{"epilogue member " + n.label() + " (" + op + ") is not elementwise", "epilogue"};
        }
      }
    }
    memo[v] = res;
    return res;
  }

  // Anchor parameters; returns the anchor's own output shape (before epilogue).
  void anchor_params(StageBuilder& sb, BlockCtx& bc, const Node& n) {
    Stage& st = sb.st;
    st.anchor = n.id;
    st.anchor_op = n.op_type;
    const std::string& op = n.op_type;
    Shape O = shape_of(n.outputs[0]);
    for (size_t i = 1; i < n.outputs.size(); ++i)
      if (!n.outputs[i].empty()) no_lowering(n, "optional outputs are used");
    auto need_float = [&](const std::string& v) {
      if (g.type(v).dtype != DType::Float32) no_lowering(n, std::string("dtype ") + dtype_name(g.type(v).dtype));
    };
    need_float(n.inputs[0]);
    st.driver = O;
    int anchor_raw = -1;
    {
      Expr e;
      e.kind = Expr::AnchorValue;
      anchor_raw = push(sb, e);
    }
    int value = anchor_raw;
    auto data_in = [&](size_t i) { return buffer_for(n.inputs.at(i)); };
    if (op == "MatMul" || op == "Gemm") {
      Shape A = shape_of(n.inputs[0]), B = shape_of(n.inputs[1]);
      need_float(n.inputs[1]);
      int64_t tA = 0, tB = 0;
      double alpha = 1, beta = 1;
      if (op == "Gemm") {
        tA = n.attrs.get_int("transA", 0);
        tB = n.attrs.get_int("transB", 0);
        alpha = n.attrs.get_float("alpha", 1.0f);
        beta = n.attrs.get_float("beta", 1.0f);
        if (A.size() != 2 || B.size() != 2) no_lowering(n, "Gemm operands must be 2-D");
      }
      if (A.size() < 2 || B.size() < 2) no_lowering(n, "1-D MatMul operand");
      int64_t M = tA ? A[A.size() - 1] : A[A.size() - 2], K = tA ? A[A.size() - 2] : A[A.size() - 1];
      int64_t N = tB ? B[B.size() - 2] : B[B.size() - 1];
      // Batch offsets of A and B per output batch (broadcast batch dims).
      Shape ob(O.begin(), O.end() - 2);
      int64_t batch = shape_numel(ob);
      const std::vector<int64_t> aoff = batch_offsets(ob, A, M * K), boff = batch_offsets(ob, B, K * N);
      st.anchor_inputs = {data_in(0), data_in(1)};
      st.iparams = {{"M", M}, {"N", N}, {"K", K}, {"batch", batch}, {"transA", tA}, {"transB", tB}};
      // Constant B shared by every batch: packed once at load time.
      bool b_shared = std::all_of(boff.begin(), boff.end(), [](int64_t o) { return o == 0; });
      if (b_shared && mod.buffers[size_t(st.anchor_inputs[1])].kind == BufferKind::Weight) {
        int slot = add_buffer("", DType::Float32, {}, BufferKind::Weight);
        mod.buffers[size_t(slot)].prepared_by = int(mod.stages.size());  // fixed up when stages are placed
        st.prepared = slot;
      }
      st.vparams = {{"a_off", aoff}, {"b_off", boff}};
      st.fparams = {{"alpha", alpha}};
      st.flops = 2.0 * double(batch) * double(M) * double(N) * double(K);
      st.width = N;
      if (op == "Gemm" && n.inputs.size() > 2 && !n.inputs[2].empty() && beta != 0) {
        need_float(n.inputs[2]);
        Shape C = shape_of(n.inputs[2]);
        int c = expr_of(sb, bc, n.inputs[2], then(identity_map(O), broadcast_step(O, C)));
        if (beta != 1) c = binary(sb, "Mul", cnst(sb, beta), c);
        value = binary(sb, "Add", value, c);
      }
    } else if (op == "Conv") {
      Shape X = shape_of(n.inputs[0]), W = shape_of(n.inputs[1]);
      need_float(n.inputs[1]);
      if (X.size() != 4 && X.size() != 3) no_lowering(n, "only 1-D and 2-D convolution is lowered");
      int64_t group = n.attrs.get_int("group", 1);
      const bool one_d = X.size() == 3;
      auto strides = n.attrs.get_ints("strides", one_d ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 1});
      auto dil = n.attrs.get_ints("dilations", one_d ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 1});
      auto pads = n.attrs.get_ints("pads", one_d ? std::vector<int64_t>{0, 0} : std::vector<int64_t>{0, 0, 0, 0});
      std::string ap = n.attrs.get_string("auto_pad", "NOTSET");
      Shape O4 = O;
      if (one_d && !as_2d(X, W, O4, strides, dil, pads)) no_lowering(n, "attribute sizes");
      int64_t KH = W[2], KW = W[3], OH = O4[2], OW = O4[3];
      if (ap == "VALID") pads = {0, 0, 0, 0};
      else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
        int64_t th = std::max<int64_t>(0, (OH - 1) * strides[0] + (KH - 1) * dil[0] + 1 - X[2]);
        int64_t tw = std::max<int64_t>(0, (OW - 1) * strides[1] + (KW - 1) * dil[1] + 1 - X[3]);
        if (ap == "SAME_UPPER") pads = {th / 2, tw / 2, th - th / 2, tw - tw / 2};
        else pads = {th - th / 2, tw - tw / 2, th / 2, tw / 2};
      } else if (ap != "NOTSET") no_lowering(n, "auto_pad " + ap);
      if (pads.size() != 4 || strides.size() != 2 || dil.size() != 2) no_lowering(n, "attribute sizes");
      st.anchor_inputs = {data_in(0), data_in(1)};
      st.iparams = {{"N", X[0]}, {"C", X[1]}, {"H", X[2]}, {"W", X[3]}, {"CO", O[1]}, {"KH", KH}, {"KW", KW},
                    {"OH", OH}, {"OW", OW}, {"SH", strides[0]}, {"SW", strides[1]}, {"PH", pads[0]}, {"PW", pads[1]},
                    {"DH", dil[0]}, {"DW", dil[1]}, {"G", group}};
      st.flops = 2.0 * double(shape_numel(O)) * double(X[1] / group) * double(KH * KW);
      st.width = OH * OW;
      if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
        int b = expr_of(sb, bc, n.inputs[2], then(identity_map(O), select_step(O, {O[1]}, {1})));
        value = binary(sb, "Add", value, b);
      }
    } else if (op == "ConvTranspose") {
      need_float(n.inputs[1]);
      if (auto why = conv_transpose_params(n, shape_of(n.inputs[0]), shape_of(n.inputs[1]), O, st); !why.empty()) no_lowering(n, why);
      st.anchor_inputs = {data_in(0), data_in(1)};
      if (n.inputs.size() > 2 && !n.inputs[2].empty())
        value = binary(sb, "Add", value, expr_of(sb, bc, n.inputs[2], then(identity_map(O), select_step(O, {O[1]}, {1}))));
    } else if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool") {
      Shape X = shape_of(n.inputs[0]);
      if (X.size() != 4 && X.size() != 3) no_lowering(n, "only 1-D and 2-D pooling is lowered");
      bool global = op.rfind("Global", 0) == 0;
      const bool one_d = X.size() == 3;
      const std::vector<int64_t> ones(X.size() - 2, 1), zeros(2 * (X.size() - 2), 0);
      std::vector<int64_t> k = global ? std::vector<int64_t>(X.begin() + 2, X.end()) : n.attrs.get_ints("kernel_shape", {});
      auto strides = global ? ones : n.attrs.get_ints("strides", ones);
      auto dil = global ? ones : n.attrs.get_ints("dilations", ones);
      auto pads = global ? zeros : n.attrs.get_ints("pads", zeros);
      Shape O4 = O;
      if (one_d) {
        Shape K = {1, 1, k.size() == 1 ? k[0] : -1};
        if (k.size() != 1 || !as_2d(X, K, O4, strides, dil, pads)) no_lowering(n, "attribute sizes");
        k = {1, K[3]};
      }
      std::string ap = n.attrs.get_string("auto_pad", "NOTSET");
      if (!global && ap != "NOTSET" && ap != "VALID") {
        int64_t th = std::max<int64_t>(0, (O4[2] - 1) * strides[0] + (k[0] - 1) * dil[0] + 1 - X[2]);
        int64_t tw = std::max<int64_t>(0, (O4[3] - 1) * strides[1] + (k[1] - 1) * dil[1] + 1 - X[3]);
        if (ap == "SAME_UPPER") pads = {th / 2, tw / 2, th - th / 2, tw - tw / 2};
        else pads = {th - th / 2, tw - tw / 2, th / 2, tw / 2};
      } else if (ap == "VALID") pads = {0, 0, 0, 0};
      if (k.size() != 2 || pads.size() != 4) no_lowering(n, "attribute sizes");
      bool is_max = op.find("Max") != std::string::npos;
      int64_t cip = n.attrs.get_int("count_include_pad", 0);
      st.anchor_op = "Pool";
      st.anchor_inputs = {data_in(0)};
      st.iparams = {{"N", X[0]}, {"C", X[1]}, {"H", X[2]}, {"W", X[3]}, {"KH", k[0]}, {"KW", k[1]}, {"OH", O4[2]},
                    {"OW", O4[3]}, {"SH", strides[0]}, {"SW", strides[1]}, {"PH", pads[0]}, {"PW", pads[1]},
                    {"PH1", pads[2]}, {"PW1", pads[3]}, {"DH", dil[0]}, {"DW", dil[1]}, {"MAX", is_max}, {"CIP", cip}};
      st.flops = double(shape_numel(O)) * double(k[0] * k[1]);
      st.width = O4[2] * O4[3];
    } else if (op == "Softmax" || op == "LayerNormalization") {
      Shape X = shape_of(n.inputs[0]);
      int64_t r = int64_t(X.size());
      bool legacy = op == "Softmax" && g.opset() < 13;
      int64_t axis = n.attrs.get_int("axis", op == "Softmax" && legacy ? 1 : -1);
      if (axis < 0) axis += r;
      if (r == 0 || axis < 0 || axis >= r) no_lowering(n, "axis");
      int64_t inner = 1;
      for (int64_t d = axis; d < r; ++d) inner *= X[size_t(d)];
      st.anchor_inputs = {data_in(0)};
      st.iparams = {{"rows", shape_numel(X) / std::max<int64_t>(1, inner)}, {"n", inner}};
      st.width = inner;
      if (op == "Softmax" && !legacy && inner != X[size_t(axis)]) {
        // Over a non-last axis: X viewed as [outer, n, inner] (gen_support softmax_axis); the
        // epilogue sees the output as [outer * n, inner].
        int64_t n_ax = X[size_t(axis)], in_ax = inner / std::max<int64_t>(1, n_ax);
        st.iparams = {{"outer", shape_numel(X) / std::max<int64_t>(1, inner)}, {"n", n_ax}, {"inner", in_ax}};
        st.width = in_ax;
      }
      st.flops = 5.0 * double(shape_numel(X));
      if (op == "LayerNormalization") {
        st.fparams = {{"eps", n.attrs.get_float("epsilon", 1e-5f)}};
        if (n.attrs.get_int("stash_type", 1) != 1) no_lowering(n, "stash_type");
        Shape sc = shape_of(n.inputs[1]);
        int s = expr_of(sb, bc, n.inputs[1], then(identity_map(O), broadcast_step(O, sc)));
        value = binary(sb, "Mul", value, s);
        if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
          Shape bs = shape_of(n.inputs[2]);
          int b = expr_of(sb, bc, n.inputs[2], then(identity_map(O), broadcast_step(O, bs)));
          value = binary(sb, "Add", value, b);
        }
      }
    } else if (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax") {
      Shape X = shape_of(n.inputs[0]);
      int64_t r = int64_t(X.size());
      int since = op == "ReduceSum" ? 13 : 18;
      std::vector<int64_t> axes;
      if (g.opset() >= since) {
        if (n.inputs.size() > 1 && !n.inputs[1].empty()) {
          const Tensor* a = g.constant_value(n.inputs[1]);
          if (!a) no_lowering(n, "non-constant axes");
          axes = a->to_int_vector();
        }
        if (axes.empty() && n.attrs.get_int("noop_with_empty_axes", 0)) no_lowering(n, "noop reduction");
      } else {
        axes = n.attrs.get_ints("axes", {});
      }
      if (axes.empty())
        for (int64_t i = 0; i < r; ++i) axes.push_back(i);
      for (auto& a : axes)
        if (a < 0) a += r;
      std::sort(axes.begin(), axes.end());
      axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
      // Reduced axes must be one contiguous run: input viewed as [outer, red, inner].
      for (size_t i = 1; i < axes.size(); ++i)
        if (axes[i] != axes[i - 1] + 1) no_lowering(n, "non-contiguous reduction axes");
      int64_t outer = 1, red = 1, inner = 1;
      for (int64_t d = 0; d < r; ++d) {
        if (d < axes.front()) outer *= X[size_t(d)];
        else if (d <= axes.back()) red *= X[size_t(d)];
        else inner *= X[size_t(d)];
      }
      st.anchor_op = "Reduce";
      st.anchor_inputs = {data_in(0)};
      st.iparams = {{"outer", outer}, {"red", red}, {"inner", inner}, {"mode", op == "ReduceMean" ? 1 : op == "ReduceSum" ? 0 : 2}};
      st.flops = double(shape_numel(X));
      st.width = inner;  // the epilogue sees the output as [outer, inner] (gen_support.h reduce)
    } else {
      no_lowering(n, "no anchor lowering");
    }
    sb.anchor = n.id;
    sb.anchor_value = n.outputs[0];
    sb.anchor_expr = value;
  }

  Stage kernel_op_stage(const FusionBlock& b) {
    const Node& n = g.node(b.members[0]);
    KernelOpContext cx{g, mod, [this](const std::string& v) { return buffer_for(v); },
                       [this](DType dt, const Shape& s, BufferKind k) { return add_buffer("", dt, s, k); },
                       [this](const std::string& v) { return constant(v); }};
    Stage st;
    std::string why = lower_kernel_op(n, cx, st);
    if (!why.empty()) no_lowering(n, why);
    st.name = "b" + std::to_string(b.id) + "_k";
    return st;
  }

  // The last value of the chain of unary members that map the anchor output O one to one: each
  // the only in-block use of the one before, same shape as O, float, and not itself a block output
  // (except the last). A block whose epilogue cannot be scattered from the anchor's index (a
  // broadcast expands the anchor output) materialises this value instead of O, so that the chain
  // runs once per anchor element rather than once per expanded element: squeeze-excitation's
  // Sigmoid on a [1,C,1,1] conv output was computed for each of the C*H*W elements it scales.
  std::string one_to_one_tail(const BlockCtx& bc, const FusionBlock& b, const std::string& O) {
    auto is_output = [&](const std::string& v) { return std::find(b.outputs.begin(), b.outputs.end(), v) != b.outputs.end(); };
    std::string m = O;
    while (!is_output(m)) {
      NodeId next = kNoNode;
      int uses = 0;
      for (NodeId id : bc.members)
        for (auto& in : g.node(id).inputs) uses += in == m ? (next = id, 1) : 0;
      if (uses != 1) break;
      const Node& n = g.node(next);
      if (!kUnary.count(n.op_type) || n.outputs.size() != 1 || n.outputs[0].empty()) break;
      const std::string& v = n.outputs[0];
      if (shape_of(v) != shape_of(O) || g.type(v).dtype != DType::Float32) break;
      m = v;
    }
    return m;
  }

  // One store per post value: the value's expression (through its forward map from the anchor
  // output) written through that map.
  void add_epilogue_stores(StageBuilder& sb, BlockCtx& bc, const std::vector<std::string>& post_outs, std::map<std::string, IndexMap>& fwd) {
    for (auto& v : post_outs) {
      Store s;
      s.buffer = buffer_for(v);
      if (mod.buffers[size_t(s.buffer)].dtype != DType::Float32) throw NoLowering{"non-float output", "dtype"};
      s.map = fwd[v];
      s.expr = expr_of(sb, bc, v, fwd[v]);
      epilogue_store_window(s, sb.st.anchor_op);
      sb.st.stores.push_back(s);
    }
    // A value after an epilogue Split that reads another buffer (a bias added to one output)
    // would read it at every anchor column, outside its window too: past the buffer's end. Such
    // a load's map starts with the Split's step, on the anchor's index space.
    const bool windows = std::any_of(sb.st.stores.begin(), sb.st.stores.end(), [](const Store& x) { return x.windowed(); });
    if (!windows) return;
    for (auto& e : sb.st.exprs)
      if (e.kind == Expr::Load && !e.map.steps.empty() && escaping_offset(e.map.steps[0]) && e.map.steps[0].from == e.map.domain)
        throw NoLowering{"epilogue reads " + mod.buffers[size_t(e.buffer)].value + " after a Split of the anchor output", "epilogue"};
  }

  // A forward map through a Split (forward_map) has an Offset step that maps part of its index
  // space outside its codomain: indices outside the window land outside the output. Checked on
  // the step's whole range, so that a Split window merged with a Concat's (then() adds the
  // offsets: Offset(+64) over [M, 64] -> [M, 64]) is caught too.
  static bool escaping_offset(const IndexStep& s) {
    if (s.kind != IndexStep::Offset) return false;
    for (size_t k = 0; k < s.to.size(); ++k) {
      if (s.from[k] <= 0) continue;
      const int64_t stride = s.stride.empty() ? 1 : s.stride[k];
      const int64_t a = s.off[k], b = s.off[k] + (s.from[k] - 1) * stride;
      if (std::min(a, b) < 0 || std::max(a, b) >= s.to[k]) return true;
    }
    return false;
  }
  static bool has_escaping_offset(const IndexMap& m, size_t from_step) {
    for (size_t i = from_step; i < m.steps.size(); ++i)
      if (escaping_offset(m.steps[i])) return true;
    return false;
  }

  // An epilogue store through a Split of the anchor output's last axis: the map's first step is
  // the window (unit stride, only the last axis shrinks). The store becomes a column window
  // (Store::window_lo/hi) with the rest of the map over the window's index space. Any other
  // escaping step (a Split of another axis, or after a Transpose) is not lowered as a window.
  // Only MatMul/Gemm epilogues take windows: a conv or pooling stage may run in the blocked
  // layout, whose stores know nothing of them.
  void epilogue_store_window(Store& s, const std::string& anchor_op) {
    if (s.map.steps.empty() || !escaping_offset(s.map.steps[0])) {
      if (has_escaping_offset(s.map, 0)) throw NoLowering{"epilogue store through a Split window " + s.map.str(), "epilogue"};
      return;
    }
    if (anchor_op != "MatMul" && anchor_op != "Gemm") throw NoLowering{"a Split window in a " + anchor_op + " epilogue", "epilogue"};
    const IndexStep& w = s.map.steps[0];
    const size_t last = w.from.size() - 1;
    bool ok = !w.from.empty() && w.to.size() == w.from.size() && (w.stride.empty() || std::all_of(w.stride.begin(), w.stride.end(), [](int64_t x) { return x == 1; }));
    for (size_t k = 0; ok && k < last; ++k) ok = w.from[k] == w.to[k] && w.off[k] == 0;
    const int64_t lo = ok ? -w.off[last] : 0, hi = lo + (ok ? w.to[last] : 0);
    ok = ok && lo >= 0 && hi <= w.from[last] && hi > lo;
    if (!ok || has_escaping_offset(s.map, 1)) throw NoLowering{"epilogue store through a Split window " + s.map.str(), "epilogue"};
    IndexMap rest;
    rest.domain = w.to;
    rest.steps.assign(s.map.steps.begin() + 1, s.map.steps.end());
    s.map = std::move(rest);
    s.window_lo = lo, s.window_hi = hi;
  }

  // Offsets of a batched operand per element of the output batch `ob` (broadcast batch dims
  // repeat), in units of its matrices of `mat` elements.
  std::vector<int64_t> batch_offsets(const Shape& ob, const Shape& operand, int64_t mat) {
    Shape bb(operand.begin(), operand.end() - 2);
    IndexMap m = then(identity_map(ob), broadcast_step(ob, bb));
    std::vector<int64_t> off, idx(ob.size(), 0);
    for (int64_t b = 0, n = shape_numel(ob); b < n; ++b) {
      int64_t e = b;
      for (size_t k = ob.size(); k-- > 0;) {
        idx[k] = e % ob[k];
        e /= ob[k];
      }
      off.push_back(m.offset(idx) * mat);
    }
    return off;
  }

  // An attention block (FusionBlock::pattern): one Anchor stage "Attention" (kernel_ir.h). Q, Kt
  // and V are read as they lie; block members computing them (recomputed chains) run first, as
  // any anchor's prologue. The members between the MatMuls become the score transform, those
  // after MatMul(p, V) its epilogue (or, when they cannot be scattered from its index, stages of
  // their own after it).
  std::vector<Stage> lower_attention(const FusionBlock& b, BlockCtx& bc, const std::string& tag) {
    const Node& qk = g.node(b.pattern_nodes.at(0));
    const Node& sm = g.node(b.pattern_nodes.at(1));
    const Node& pv = g.node(b.anchor);
    std::vector<Stage> stages;
    std::vector<std::string> pro_values;
    for (const std::string& v : {qk.inputs[0], qk.inputs[1], pv.inputs[1]})
      if (bc.producer.count(v) && std::find(pro_values.begin(), pro_values.end(), v) == pro_values.end()) pro_values.push_back(v);
    for (auto& v : pro_values) buffer_for(v);
    if (!pro_values.empty()) elementwise_stages(bc, pro_values, stages, tag + "_pro");

    const std::string O = pv.outputs[0];
    std::map<std::string, std::optional<IndexMap>> fmemo;
    std::vector<std::string> post_outs, side_outs;
    std::map<std::string, IndexMap> fwd;
    bool fused = true;
    try {
      for (auto& v : b.outputs) {
        if (std::find(pro_values.begin(), pro_values.end(), v) != pro_values.end()) continue;
        if (auto f = forward_map(bc, v, O, fmemo)) {
          // Split windows are stored by GEMM epilogues only.
          if (has_escaping_offset(*f, 0)) throw NoLowering{"Split after attention", "epilogue"};
          post_outs.push_back(v);
          fwd[v] = *f;
        } else {
          side_outs.push_back(v);
        }
      }
    } catch (const NoLowering&) {
      fused = false;
    }
    if (!fused) {  // materialise the attention output; the members after it run as stages
      post_outs = {O};
      fwd = {{O, identity_map(shape_of(O))}};
      side_outs.clear();
    } else {
      if (!side_outs.empty()) elementwise_stages(bc, side_outs, stages, tag + "_side");
      concat_source_stages(bc, O, post_outs, fmemo, stages, tag);
    }

    StageBuilder sb;
    Stage& st = sb.st;
    st.kind = StageKind::Anchor;
    st.anchor = pv.id;
    st.anchor_op = "Attention";
    const Shape S = shape_of(qk.outputs[0]), Qs = shape_of(qk.inputs[0]), Ks = shape_of(qk.inputs[1]), Vs = shape_of(pv.inputs[1]);
    const size_t r = S.size();
    const int64_t Sq = S[r - 2], Sk = S[r - 1], D = Qs.back(), Dv = Vs.back();
    Expr raw;
    raw.kind = Expr::AnchorValue;
    // The score transform, on the scores' index space: AnchorValue is one raw score.
    st.driver = S;
    sb.anchor = qk.id;
    sb.anchor_value = qk.outputs[0];
    sb.anchor_expr = push(sb, raw);
    st.score_expr = expr_of(sb, bc, sm.inputs[0], identity_map(S));
    st.score_exprs = int(st.exprs.size());
    st.score_width = Sk;
    // The epilogue, on the output's index space: AnchorValue is one output element.
    sb.memo.clear();
    st.driver = shape_of(O);
    sb.anchor = pv.id;
    sb.anchor_value = O;
    sb.anchor_expr = push(sb, raw);
    const Shape ob(S.begin(), S.end() - 2);
    const int64_t batch = shape_numel(ob);
    st.anchor_inputs = {buffer_for(qk.inputs[0]), buffer_for(qk.inputs[1]), buffer_for(pv.inputs[1])};
    st.iparams = {{"batch", batch}, {"Sq", Sq}, {"Sk", Sk}, {"D", D}, {"Dv", Dv},
                  {"nan_guard", [&] { bool guard = false; after_softmax(g, sm.id, &guard); return guard ? 1 : 0; }()}};
    st.vparams = {{"q_off", batch_offsets(ob, Qs, Sq * D)}, {"k_off", batch_offsets(ob, Ks, D * Sk)}, {"v_off", batch_offsets(ob, Vs, Sk * Dv)}};
    st.flops = double(batch) * double(Sq) * double(Sk) * (2.0 * double(D + Dv) + 5.0);
    add_epilogue_stores(sb, bc, post_outs, fwd);
    st.width = Dv;
    finish_stage(st);
    // finish_stage classified every load on the output's view: the score loads live on the
    // scores' view, and only the epilogue's decide whether the epilogue runs on vectors.
    st.vectorizable = true;
    for (size_t i = 0; i < st.exprs.size(); ++i) {
      Expr& e = st.exprs[i];
      if (e.kind != Expr::Load) continue;
      if (int(i) < st.score_exprs) e.access = classify_access(e.map, st.rows, Sk);
      else if (!vectorizable_load(e.access)) st.vectorizable = false;
    }
    for (auto& s : st.stores)
      if (!s.access.affine || s.access.col_stride != 1) st.vectorizable = false;
    pick_anchor_output(st);
    st.name = tag + "_a";
    stages.push_back(std::move(sb.st));
    if (!fused) {
      bc.available.insert(O);
      std::vector<std::string> rest;
      for (auto& v : b.outputs)
        if (v != O && std::find(pro_values.begin(), pro_values.end(), v) == pro_values.end()) rest.push_back(v);
      if (!rest.empty()) elementwise_stages(bc, rest, stages, tag + "_post");
    }
    return stages;
  }

  // Lowers one block into stages; throws NoLowering when a member cannot be lowered.
  std::vector<Stage> lower_block(const FusionBlock& b, bool fuse_epilogue) {
    // Outputs folded at lowering time are weights already: never stored by a stage.
    for (auto& v : b.outputs)
      if (folded.count(v)) {
        FusionBlock nb = b;
        nb.outputs.erase(std::remove_if(nb.outputs.begin(), nb.outputs.end(), [&](const std::string& o) { return folded.count(o) != 0; }),
                         nb.outputs.end());
        return lower_block(nb, fuse_epilogue);
      }
    // LSTM / NonMaxSuppression (blocks of their own): one kernel-only stage (lower_kernel_ops.h).
    if (b.members.size() == 1 && is_kernel_op(g.node(b.members[0]))) return {kernel_op_stage(b)};
    BlockCtx bc;
    bc.block = &b;
    for (NodeId id : b.members) {
      if (folded_nodes.count(id)) continue;
      bc.members.insert(id);
      for (auto& o : g.node(id).outputs)
        if (!o.empty()) bc.producer[o] = id;
    }
    std::string tag = "b" + std::to_string(b.id);
    std::vector<Stage> stages;
    if (b.pattern == "attention") return lower_attention(b, bc, tag);
    // A Many-to-Many member that is an expression (a linearly downscaling Resize) anchors no kernel.
    if (b.anchor == kNoNode || dm::lowers_op(g.node(b.anchor).op_type)) {
      for (NodeId id : b.members) {
        if (folded_nodes.count(id)) continue;
        const Node& n = g.node(id);
        if (kAnchors.count(n.op_type) || (!kUnary.count(n.op_type) && !kBinary.count(n.op_type) && !kReorg.count(n.op_type) &&
                                          n.op_type != "Transpose" && n.op_type != "Expand" && n.op_type != "Clip" && n.op_type != "Split" &&
                                          n.op_type != "BatchNormalization" && n.op_type != "Cast" && !dm::lowers_op(n.op_type)))
          no_lowering(n, "no lowering for this op yet");
      }
      elementwise_stages(bc, b.outputs, stages, tag);
      return stages;
    }
    const Node& an = g.node(b.anchor);
    if (!kAnchors.count(an.op_type) || !an.domain.empty()) no_lowering(an, "no anchor lowering yet");
    // Prologue: members the anchor depends on.
    std::set<NodeId> pre;
    std::function<void(NodeId)> up = [&](NodeId id) {
      for (auto& in : g.node(id).inputs) {
        auto it = bc.producer.find(in);
        if (it != bc.producer.end() && !pre.count(it->second)) {
          pre.insert(it->second);
          up(it->second);
        }
      }
    };
    up(b.anchor);
    // Values the anchor reads from inside the block, and prologue values used outside: materialised.
    std::vector<std::string> pro_values;
    std::set<std::string> outs(b.outputs.begin(), b.outputs.end());
    for (auto& in : an.inputs)
      if (bc.producer.count(in) && std::find(pro_values.begin(), pro_values.end(), in) == pro_values.end()) pro_values.push_back(in);
    for (NodeId id : pre)
      for (auto& o : g.node(id).outputs)
        if (outs.count(o) && std::find(pro_values.begin(), pro_values.end(), o) == pro_values.end()) pro_values.push_back(o);
    for (auto& v : pro_values) buffer_for(v);
    if (!pro_values.empty()) elementwise_stages(bc, pro_values, stages, tag + "_pro");

    // Epilogue: block outputs that derive from the anchor output, scattered from its index.
    const std::string O = an.outputs[0];
    std::vector<std::string> post_outs, side_outs;
    std::map<std::string, std::optional<IndexMap>> fmemo;
    bool fused = fuse_epilogue;
    std::map<std::string, IndexMap> fwd;
    for (auto& v : b.outputs) {
      if (std::find(pro_values.begin(), pro_values.end(), v) != pro_values.end()) continue;
      if (v == O) {
        post_outs.push_back(v);
        fwd[v] = identity_map(shape_of(O));
        continue;
      }
      std::optional<IndexMap> f;
      if (fused) {
        try {
          f = forward_map(bc, v, O, fmemo);
        } catch (const NoLowering&) {
          fused = false;
        }
      }
      if (!fused) break;
      if (f) {
        post_outs.push_back(v);
        fwd[v] = *f;
      } else {
        side_outs.push_back(v);
      }
    }
    if (fused) {
      try {
        if (!side_outs.empty()) elementwise_stages(bc, side_outs, stages, tag + "_side");
        concat_source_stages(bc, O, post_outs, fmemo, stages, tag);
        StageBuilder sb;
        sb.st.kind = StageKind::Anchor;
        anchor_params(sb, bc, an);
        add_epilogue_stores(sb, bc, post_outs, fwd);
        finish_stage(sb.st);
        pick_anchor_output(sb.st);
        sb.st.name = tag + "_a";
        stages.push_back(std::move(sb.st));
        return stages;
      } catch (const NoLowering&) {
        if (!fuse_epilogue) throw;
        return lower_block(b, false);
      }
    }
    // Materialise the anchor output, then the members after it as elementwise stages.
    StageBuilder sb;
    sb.st.kind = StageKind::Anchor;
    anchor_params(sb, bc, an);
    const std::string M = one_to_one_tail(bc, b, O);
    Store s;
    s.map = identity_map(shape_of(O));
    s.buffer = buffer_for(M);
    s.expr = M == O ? sb.anchor_expr : expr_of(sb, bc, M, s.map);
    sb.st.stores.push_back(s);
    finish_stage(sb.st);
    pick_anchor_output(sb.st);
    sb.st.name = tag + "_a";
    stages.push_back(std::move(sb.st));
    bc.available.insert(M);
    std::vector<std::string> rest;
    for (auto& v : b.outputs)
      if (v != O && v != M && std::find(pro_values.begin(), pro_values.end(), v) == pro_values.end()) rest.push_back(v);
    if (!rest.empty()) elementwise_stages(bc, rest, stages, tag + "_post");
    return stages;
  }

  void run() {
    mod.graph = g;
    mod.opset = g.opset();
    mod.model_name = g.name;
    for (auto& in : g.inputs()) {
      if (g.is_initializer(in)) continue;
      shape_of(in);
      mod.graph_inputs.push_back({in, buffer_for(in)});
    }
    fold_constants();
    std::map<NodeId, size_t> topo_pos;
    for (NodeId id : g.topo_order()) topo_pos.emplace(id, topo_pos.size());
    for (auto& b : plan.blocks) {
      ++mod.blocks;
      if (fold_constant_block(b)) continue;
      size_t buffers_before = mod.buffers.size();
      auto saved_buf_of = buf_of;
      std::vector<Stage> stages;
      try {
        stages = lower_block(b, opt.fuse_epilogues);
      } catch (const NoLowering& e) {
        // Undo buffers made for internal values of the failed attempt.
        mod.buffers.resize(buffers_before);
        buf_of = saved_buf_of;
        bn_cache.clear();
        Stage st;
        st.kind = StageKind::Fallback;
        st.name = "b" + std::to_string(b.id) + "_f";
        for (NodeId id : b.members)
          if (!folded_nodes.count(id)) st.nodes.push_back(id);
        // In graph order: the reference kernels run one node after another, and a block lists
        // its anchor first (a LayerNorm's ReduceMean came before the Adds it reads).
        std::sort(st.nodes.begin(), st.nodes.end(), [&](NodeId a, NodeId b2) { return topo_pos.at(a) < topo_pos.at(b2); });
        st.fallback_reason = e.reason;
        for (auto& v : b.inputs) st.inputs.push_back(buffer_for(v));
        // Values of members folded at compile time (fold_constants) that the remaining members
        // read: weights of this stage, not block inputs.
        std::set<std::string> made;
        for (NodeId id : st.nodes)
          for (auto& o : g.node(id).outputs) made.insert(o);
        for (NodeId id : st.nodes)
          for (auto& v : g.node(id).inputs)
            if (!v.empty() && !made.count(v) && folded.count(v) &&
                std::find(b.inputs.begin(), b.inputs.end(), v) == b.inputs.end())
              st.inputs.push_back(buffer_for(v));
        for (auto& v : b.outputs) st.outputs.push_back(buffer_for(v));
        for (NodeId id : b.members) st.flops += node_flops(g, id);
        stages = {st};
        ++mod.fallback_blocks;
        if (std::find(mod.fallback_ops.begin(), mod.fallback_ops.end(), e.op) == mod.fallback_ops.end()) mod.fallback_ops.push_back(e.op);
      }
      for (auto& st : stages) {
        st.block = b.id;
        st.mapping = mapping_type_name(b.type);
        if (st.kind != StageKind::Fallback) {
          st.nodes = b.members;
          std::set<int> rd, wr;
          for (auto& e : st.exprs)
            if (e.kind == Expr::Load) {
              rd.insert(e.buffer);
              for (int ib : e.map.index_buffers()) rd.insert(ib);
            }
          for (int a : st.anchor_inputs)
            if (a >= 0) rd.insert(a);
          for (auto& s : st.stores) wr.insert(s.buffer);
          if (st.anchor_output >= 0) wr.insert(st.anchor_output);
          wr.insert(st.kernel_outputs.begin(), st.kernel_outputs.end());
          st.inputs.assign(rd.begin(), rd.end());
          st.outputs.assign(wr.begin(), wr.end());
          if (st.kind == StageKind::Elementwise) st.flops = double(shape_numel(st.driver)) * double(st.exprs.size());
        }
        if (st.prepared >= 0) mod.buffers[size_t(st.prepared)].prepared_by = int(mod.stages.size());
        mod.stages.push_back(std::move(st));
      }
    }
    // Per stage flops: the anchor's; elementwise members counted by expression nodes (approximate).
    for (auto& out : g.outputs()) mod.graph_outputs.push_back({out, buffer_for(out)});
    if (opt.layout_block > 0) assign_layouts(mod, opt.layout_block);
    choose_conv_algorithms(mod, opt.conv_algorithm);
    choose_int8_kernels(mod, opt.int8_dot);
    mark_prepare_only_inputs();
    plan_memory();
  }

  // Stage::prepare_only: the anchor inputs a stage's prepare entry point packs and its body
  // never reads again (the emitters read the packed slot: kernels/emit_cpp.cpp for MatMul/Gemm
  // and blocked Conv, kernels/emit_kernel_ops.cpp for LSTM). Filled after the layouts are final,
  // since assign_layouts gives blocked Conv stages their prepared slot.
  void mark_prepare_only_inputs() {
    for (auto& st : mod.stages) {
      st.prepare_only.clear();
      if (st.kind != StageKind::Anchor || st.prepared < 0) continue;
      std::vector<size_t> packed;
      if (st.anchor_op == "MatMul" || st.anchor_op == "Gemm" || (st.anchor_op == "Conv" && st.layout_block > 0)) packed = {1};
      else if (is_recurrent_op(st.anchor_op)) packed = {1, 2};
      for (size_t k : packed)
        if (k < st.anchor_inputs.size() && st.anchor_inputs[k] >= 0 && mod.buffers[size_t(st.anchor_inputs[k])].kind == BufferKind::Weight)
          st.prepare_only.push_back(st.anchor_inputs[k]);
    }
  }

  // Nodes whose inputs are all constants (a Transpose of a weight that the pipeline left in
  // place) are evaluated once here with the reference kernels; their outputs become weights.
  void fold_constants() {
    for (NodeId id : g.topo_order()) {
      const Node& n = g.node(id);
      if (n.op_type == "Constant" || !n.domain.empty() || n.inputs.empty()) continue;
      bool all = true;
      for (auto& v : n.inputs)
        if (!v.empty() && !folded.count(v) && !g.constant_value(v)) all = false;
      for (auto& o : n.outputs)
        if (!o.empty() && (g.is_output(o) || !g.type(o).is_static() || g.type(o).numel().value_or(0) > (int64_t(1) << 27))) all = false;
      if (!all) continue;
      std::vector<const Tensor*> ins;
      for (auto& v : n.inputs) ins.push_back(v.empty() ? nullptr : folded.count(v) ? &folded[v] : g.constant_value(v));
      try {
        auto outs = run_node(n, g.opset(), ins);
        for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i)
          if (!n.outputs[i].empty()) folded[n.outputs[i]] = outs[i];
        folded_nodes.insert(id);
      } catch (const Error&) {
      }
    }
  }

  // A block that reads only constants (a Transpose of a weight the rewriter left in place) is
  // evaluated once here with the reference kernels; its outputs become weights.
  bool fold_constant_block(const FusionBlock& b) {
    if (b.inputs.empty()) return false;
    for (auto& v : b.inputs)
      if (!g.constant_value(v)) return false;
    for (auto& v : b.outputs)
      if (g.is_output(v) || !g.type(v).is_static()) return false;
    std::map<std::string, Tensor> local;
    try {
      for (NodeId id : b.members) {
        const Node& n = g.node(id);
        if (!n.domain.empty()) return false;
        std::vector<const Tensor*> ins;
        for (auto& v : n.inputs) ins.push_back(v.empty() ? nullptr : local.count(v) ? &local[v] : g.constant_value(v));
        auto outs = run_node(n, g.opset(), ins);
        for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i)
          if (!n.outputs[i].empty()) local[n.outputs[i]] = outs[i];
      }
    } catch (const Error&) {
      return false;  // left to run time, where the error names the node again
    }
    for (auto& v : b.outputs) {
      auto it = local.find(v);
      if (it == local.end() || it->second.shape() != g.type(v).static_shape()) return false;
    }
    for (auto& v : b.outputs) {
      int id = add_buffer(v, local[v].dtype(), local[v].shape(), BufferKind::Weight);
      mod.buffers[size_t(id)].data = local[v];
    }
    ++mod.folded_blocks;
    return true;
  }

  // ---------------------------------------------------------------- memory plan
  void plan_memory() {
    int ns = int(mod.stages.size());
    for (int s = 0; s < ns; ++s) {
      for (int b : mod.stages[size_t(s)].outputs) {
        auto& B = mod.buffers[size_t(b)];
        if (B.first < 0) B.first = s;
        B.last = std::max(B.last, s);
      }
      for (int b : mod.stages[size_t(s)].inputs) {
        auto& B = mod.buffers[size_t(b)];
        if (B.first < 0) B.first = s;
        B.last = std::max(B.last, s);
      }
    }
    // Greedy first-fit over stage order; a buffer frees after its last stage.
    struct Block {
      int64_t off, size;
      int buf;
    };
    std::vector<Block> live;
    auto align = [](int64_t x) { return (x + 63) / 64 * 64; };
    int64_t peak = 0;
    for (int s = 0; s < ns; ++s) {
      Stage& st = mod.stages[size_t(s)];
      // In place: an elementwise stage whose output has the same size as an input dying here,
      // read and written at the same index only.
      std::map<int, int> inplace;  // output -> input
      if (opt.allow_inplace && st.kind == StageKind::Elementwise) {
        for (auto& store : st.stores) {
          auto& O = mod.buffers[size_t(store.buffer)];
          if (O.kind != BufferKind::Activation || O.dynamic || O.first != s) continue;
          for (int in : st.inputs) {
            auto& I = mod.buffers[size_t(in)];
            // Same dtype: also keeps a Gather's index buffer (read by no Load) from being reused.
            if (I.kind != BufferKind::Activation || I.last != s || I.bytes != O.bytes || I.dtype != O.dtype || I.inplace_of == -2) continue;
            auto ident = [&](const Access& a) { return a.affine && a.base == 0 && a.col_stride == 1 && (a.row_stride == st.width || st.rows == 1); };
            bool same_index = ident(store.access);
            for (auto& e : st.exprs)
              if (e.kind == Expr::Load && e.buffer == in && !ident(e.access)) same_index = false;
            // Another store reading this input after it is overwritten would be wrong: one store only.
            if (st.stores.size() != 1) same_index = false;
            bool taken = false;
            for (auto& [o, i] : inplace)
              if (i == in) taken = true;
            if (same_index && !taken) {
              inplace[store.buffer] = in;
              break;
            }
          }
        }
      }
      // Allocate outputs first starting here.
      for (int b : st.outputs) {
        auto& B = mod.buffers[size_t(b)];
        if (B.kind != BufferKind::Activation || B.dynamic || B.first != s || B.offset >= 0) continue;
        if (inplace.count(b)) {
          auto& I = mod.buffers[size_t(inplace[b])];
          B.offset = I.offset;
          B.inplace_of = I.id;
          I.inplace_of = I.inplace_of < 0 ? -2 : I.inplace_of;  // -2: storage handed on
          ++mod.inplace_count;
          for (auto& l : live)
            if (l.buf == I.id) l.buf = b;
          continue;
        }
        int64_t size = align(std::max<int64_t>(B.bytes, 1));
        std::sort(live.begin(), live.end(), [](const Block& a, const Block& c) { return a.off < c.off; });
        int64_t off = 0;
        for (auto& l : live) {
          if (l.off - off >= size) break;
          off = std::max(off, l.off + l.size);
        }
        B.offset = off;
        live.push_back({off, size, b});
        peak = std::max(peak, off + size);
      }
      // Free what dies here (and buffers never read: outputs of this stage used nowhere else).
      live.erase(std::remove_if(live.begin(), live.end(), [&](const Block& l) { return mod.buffers[size_t(l.buf)].last <= s; }),
                 live.end());
    }
    if (uint64_t(peak) > max_tensor_bytes())
      fail(ErrorKind::Shape, "the activations need an arena of " + std::to_string(peak) + " bytes, over the limit of " +
                                 std::to_string(max_tensor_bytes()) + " (physical memory, or NNFUSE_MAX_TENSOR_BYTES)");
    mod.arena_bytes = peak;
    mod.naive_bytes = 0;
    for (auto& B : mod.buffers)
      if (B.kind == BufferKind::Activation) mod.naive_bytes += B.bytes;
  }
};

}  // namespace

KernelModule lower_module(const Graph& g, const FusionPlan& plan, const LowerOptions& opt) {
  // A plan whose blocks read a value before a block writes it (e.g. a producer planned after the
  // If/Loop body that reads it) would compile to a kernel reading unwritten memory: refuse it.
  check_plan(g, plan);
  // Buffers, stages and the runtime hold tensors; sequences and optionals (graph/ops_sequence.cpp)
  // run in the reference interpreter only.
  for (const std::string& v : g.value_names())
    if (!g.type(v).is_tensor())
      fail(ErrorKind::Unsupported, "value '" + v + "' is " + g.type(v).str() +
                                       ": sequence and optional values are not supported on the compiled targets (they run on --target reference)");
  Lowerer l(g, plan, opt);
  l.run();
  return std::move(l.mod);
}

}  // namespace nnfuse
