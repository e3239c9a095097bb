// Data-movement, selection and conversion ops as index maps and expressions (see
// lower_data_movement.h). Each op here is a map from its output index to its inputs' indices,
// so the block's stages read the producers' buffers directly: no copy kernels.
#include "lowering/lower_data_movement.h"

#include <algorithm>
#include <array>
#include <set>

#include "graph/op_registry.h"

namespace nnfuse::dm {

bool exact_dtype(DType d) {
  return d == DType::Float32 || d == DType::Bool || d == DType::Int8 || d == DType::UInt8 || d == DType::Int16 || d == DType::UInt16;
}

namespace {

const std::set<std::string> kCompare = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"};
const std::set<std::string> kLogic = {"And", "Or", "Xor", "Not"};
// Float predicates (bool results as 0/1): the NaN guards of exported attention masks
// (Where(IsNaN(softmax), 0, softmax) from the dynamo exporter) and inf checks.
const std::set<std::string> kPredicate = {"IsNaN", "IsInf"};

int64_t norm_axis(int64_t axis, size_t rank) { return axis < 0 ? axis + int64_t(rank) : axis; }

// A constant integer input (starts, ends, repeats, ...), or nullopt.
std::optional<std::vector<int64_t>> const_ints(ExprHost& h, const Node& n, size_t i) {
  if (i >= n.inputs.size() || n.inputs[i].empty()) return std::nullopt;
  const Tensor* t = h.constant(n.inputs[i]);
  if (!t) return std::nullopt;
  return t->to_int_vector();
}

bool generated_dtype(DType d) {
  switch (d) {
    case DType::Float32:
    case DType::Int64:
    case DType::Int32:
    case DType::Int16:
    case DType::Int8:
    case DType::UInt64:
    case DType::UInt32:
    case DType::UInt16:
    case DType::UInt8:
    case DType::Bool: return true;
    default: return false;
  }
}

// The range [lo, hi] that coordinate k of m's codomain takes over m's domain (an
// over-approximation through Reshape and Gather steps: the whole dim).
std::pair<int64_t, int64_t> coord_range(const IndexMap& m, size_t k) {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (auto d : m.domain) r.push_back({0, d - 1});
  for (auto& s : m.steps) {
    std::vector<std::pair<int64_t, int64_t>> nr(s.to.size(), {0, 0});
    if (s.kind == IndexStep::Select) {
      for (size_t j = 0; j < s.to.size(); ++j)
        if (s.src[j] >= 0) nr[j] = r[size_t(s.src[j])];
    } else if (s.kind == IndexStep::Offset) {
      for (size_t j = 0; j < s.to.size(); ++j) {
        int64_t st = s.stride.empty() ? 1 : s.stride[j];
        int64_t a = r[j].first * st + s.off[j], b = r[j].second * st + s.off[j];
        nr[j] = {std::min(a, b), std::max(a, b)};
      }
    } else {
      for (size_t j = 0; j < s.to.size(); ++j) nr[j] = {0, s.to[j] - 1};
      // A Gather step keeps the dims outside its axis.
      if (s.kind == IndexStep::Gather)
        for (size_t j = 0; j < s.to.size(); ++j) {
          if (j < size_t(s.axis)) nr[j] = r[j];
          if (j > size_t(s.axis)) nr[j] = r[j + size_t(s.q) - 1];
        }
    }
    r = std::move(nr);
  }
  return r.at(k);
}

int gather_expr(ExprHost& h, const Node& n, const IndexMap& m) {
  const std::string &data = n.inputs.at(0), &ind = n.inputs.at(1);
  Shape D = h.shape_of(data), Q = h.shape_of(ind), O = h.shape_of(n.outputs[0]);
  int64_t axis = norm_axis(n.attrs.get_int("axis", 0), D.size());
  if (axis < 0 || axis >= int64_t(D.size())) h.no_lowering(n, "axis out of range");
  const Tensor* c = h.constant(ind);
  if (c && Q.empty()) {
    // One constant index: the axis disappears and the data is read at a fixed offset.
    int64_t i = c->to_int_vector().at(0);
    if (i < 0) i += D[size_t(axis)];
    if (i < 0 || i >= D[size_t(axis)]) h.no_lowering(n, "constant index out of range");  // the reference kernel reports it
    std::vector<int> src;
    for (int64_t k = 0; k < int64_t(D.size()); ++k) src.push_back(k < axis ? int(k) : k == axis ? -1 : int(k - 1));
    std::vector<int64_t> off(D.size(), 0);
    off[size_t(axis)] = i;
    return h.expr_of(data, h.then(h.then(m, select_step(O, D, std::move(src))), offset_step(D, D, off)));
  }
  if (h.in_block(ind)) h.no_lowering(n, "indices computed in the same block");
  int ib = h.buffer_for(ind);
  const KBuffer& B = h.buffer(ib);
  if (B.dynamic) h.no_lowering(n, "indices of data-dependent shape");
  if (B.dtype != DType::Int64 && B.dtype != DType::Int32) h.no_lowering(n, std::string("indices of type ") + dtype_name(B.dtype));
  IndexStep s;
  s.kind = IndexStep::Gather;
  s.from = O;
  s.to = D;
  s.axis = int(axis);
  s.q = int(Q.size());
  s.index_buffer = ib;
  return h.expr_of(data, h.then(m, s));
}

int slice_expr(ExprHost& h, const Node& n, const IndexMap& m) {
  Shape in = h.shape_of(n.inputs.at(0)), out = h.shape_of(n.outputs[0]);
  std::vector<int64_t> starts, axes, steps;
  if (h.graph().opset() < 10) {
    starts = n.attrs.get_ints("starts", {});
    axes = n.attrs.get_ints("axes", {});
  } else {
    auto s = const_ints(h, n, 1);
    if (!s) h.no_lowering(n, "non-constant starts");
    starts = *s;
    if (n.inputs.size() > 3 && !n.inputs[3].empty()) {
      auto a = const_ints(h, n, 3);
      if (!a) h.no_lowering(n, "non-constant axes");
      axes = *a;
    }
    if (n.inputs.size() > 4 && !n.inputs[4].empty()) {
      auto st = const_ints(h, n, 4);
      if (!st) h.no_lowering(n, "non-constant steps");
      steps = *st;
    }
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size()) h.no_lowering(n, "starts, axes and steps differ in length");
  std::vector<int64_t> off(in.size(), 0), stride(in.size(), 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = norm_axis(axes[i], in.size());
    if (a < 0 || a >= int64_t(in.size()) || steps[i] == 0) h.no_lowering(n, "bad axes or steps");
    int64_t d = in[size_t(a)], st = starts[i];
    // ONNX clamping: a start past either end is moved to the nearest valid position.
    if (st < 0) st += d;
    st = steps[i] > 0 ? std::clamp<int64_t>(st, 0, d) : std::clamp<int64_t>(st, 0, d - 1);
    off[size_t(a)] = st;
    stride[size_t(a)] = steps[i];
  }
  if (shape_numel(out) == 0) h.no_lowering(n, "empty slice");
  return h.expr_of(n.inputs[0], h.then(m, offset_step(out, in, off, stride)));
}

int concat_expr(ExprHost& h, const Node& n, const IndexMap& m) {
  Shape out = h.shape_of(n.outputs[0]);
  size_t axis = size_t(norm_axis(n.attrs.get_int("axis", 0), out.size()));
  auto [lo, hi] = coord_range(m, axis);
  int64_t start = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i].empty()) continue;
    Shape in = h.shape_of(n.inputs[i]);
    int64_t len = in[axis];
    if (lo >= start && hi < start + len) {
      std::vector<int64_t> off(out.size(), 0);
      off[axis] = -start;
      return h.expr_of(n.inputs[i], h.then(m, offset_step(out, in, off)));
    }
    start += len;
  }
  // Reads spanning several inputs: the block materialises the Concat first (each input stored
  // into its window), so this only happens in shapes the lowering does not plan for.
  h.no_lowering(n, "a read spans several inputs");
  return -1;  // not reached (g++ does not see [[noreturn]] through the virtual call)
}

int tile_expr(ExprHost& h, const Node& n, const IndexMap& m) {
  Shape in = h.shape_of(n.inputs.at(0)), out = h.shape_of(n.outputs[0]);
  // out[k] = reps[k] * in[k]: viewed as [reps0, in0, reps1, in1, ...], the input index is every
  // second coordinate.
  Shape split;
  std::vector<int> src;
  for (size_t k = 0; k < in.size(); ++k) {
    if (in[k] == 0 || out[k] % in[k] != 0) h.no_lowering(n, "output is not a whole number of tiles");
    split.push_back(out[k] / in[k]);
    split.push_back(in[k]);
    src.push_back(int(2 * k + 1));
  }
  return h.expr_of(n.inputs[0], h.then(h.then(m, reshape_step(out, split)), select_step(split, in, std::move(src))));
}

int arg(ExprHost& h, const Node& n, size_t i, const IndexMap& m, bool as_float) {
  Shape out = h.shape_of(n.outputs[0]), in = h.shape_of(n.inputs.at(i));
  if (in.size() > out.size()) h.no_lowering(n, "input of higher rank than its output");
  IndexMap mi = h.then(m, broadcast_step(out, in));
  return as_float ? h.expr_of_as_float(n.inputs[i], mi) : h.expr_of(n.inputs[i], mi);
}

// Float, or an integer type whose every value float holds exactly (bool, 8 and 16 bits).
bool float_exact(ExprHost& h, const std::string& v) { return exact_dtype(h.graph().type(v).dtype); }

// A comparison of 32/64-bit integers, exactly: each operand as three parts that float holds
// exactly (bits [44, 64) signed, [22, 44), [0, 22): Expr::part), compared from the top part down.
// In float, two int64 values a sample-rate test tells apart (16000 against 16001) are exact, but
// values past 2^24 could round to equal. nullopt when an operand is not such an integer read
// from a buffer or a constant (its parts are then not at hand).
std::optional<int> wide_int_compare(ExprHost& h, const Node& n, const IndexMap& m) {
  const Graph& g = h.graph();
  if (n.inputs.size() != 2 || !wide_int_dtype(g.type(n.inputs[0]).dtype) || !wide_int_dtype(g.type(n.inputs[1]).dtype))
    return std::nullopt;
  Shape out = h.shape_of(n.outputs[0]);
  std::array<std::array<int, 3>, 2> p{};
  for (size_t i = 0; i < 2; ++i) {
    Shape in = h.shape_of(n.inputs[i]);
    if (in.size() > out.size()) h.no_lowering(n, "input of higher rank than its output");
    const IndexMap mi = h.then(m, broadcast_step(out, in));
    for (int k = 0; k < 3; ++k) {
      auto e = h.int_part(n.inputs[i], mi, k);
      if (!e) return std::nullopt;
      p[i][size_t(k)] = *e;
    }
  }
  auto bin = [&](const char* op, int a, int b) {
    Expr e;
    e.kind = Expr::Binary;
    e.op = op;
    e.args = {a, b};
    return h.push(std::move(e));
  };
  auto unary_not = [&](int a) {
    Expr e;
    e.kind = Expr::Unary;
    e.op = "Not";
    e.args = {a};
    return h.push(std::move(e));
  };
  // x < y over the parts, top first: x2 < y2, or x2 == y2 and (x1 < y1, or x1 == y1 and x0 < y0).
  auto less = [&](const std::array<int, 3>& x, const std::array<int, 3>& y) {
    int r = bin("Less", x[0], y[0]);
    for (int k = 1; k < 3; ++k) r = bin("Or", bin("Less", x[size_t(k)], y[size_t(k)]), bin("And", bin("Equal", x[size_t(k)], y[size_t(k)]), r));
    return r;
  };
  const std::string& op = n.op_type;
  if (op == "Equal") return bin("And", bin("And", bin("Equal", p[0][2], p[1][2]), bin("Equal", p[0][1], p[1][1])), bin("Equal", p[0][0], p[1][0]));
  if (op == "Less") return less(p[0], p[1]);
  if (op == "Greater") return less(p[1], p[0]);
  if (op == "LessOrEqual") return unary_not(less(p[1], p[0]));
  return unary_not(less(p[0], p[1]));  // GreaterOrEqual
}

int cast_expr(ExprHost& h, const Node& n, const IndexMap& m) {
  const Graph& g = h.graph();
  DType from = g.type(n.inputs.at(0)).dtype, to = DType(n.attrs.get_int("to", 0));
  if (!generated_dtype(from) || !generated_dtype(to)) h.no_lowering(n, std::string("cast ") + dtype_name(from) + " -> " + dtype_name(to));
  auto push_unary = [&](const char* op, int a) {
    Expr e;
    e.kind = Expr::Unary;
    e.op = op;
    e.args = {a};
    return h.push(std::move(e));
  };
  if (from == DType::Float32) {
    int x = arg(h, n, 0, m, false);
    if (to == DType::Float32) return x;
    return push_unary(to == DType::Bool ? "NotZero" : "Trunc", x);
  }
  // To bool, from any integer: a nonzero integer never converts to 0.0f, so NotZero of the
  // loaded float is exact (integer attention masks cast to bool).
  if (to == DType::Bool) return push_unary("NotZero", arg(h, n, 0, m, true));
  // From an integer or bool: to float the conversion on load is the cast. Between integer
  // types only values exact in float pass (bools, 8/16-bit types, results of comparisons or of
  // float casts).
  auto pit = g.producer(n.inputs[0]);
  bool exact = exact_dtype(from) || (h.in_block(n.inputs[0]) && pit && exact_in_float(g, g.node(*pit)));
  if (to == DType::Float32) return arg(h, n, 0, m, true);
  // Narrowing integer casts wrap around, which a float round trip does not reproduce.
  auto range = [](DType d) -> std::pair<double, double> {
    switch (d) {
      case DType::Bool: return {0, 1};
      case DType::Int8: return {-128, 127};
      case DType::UInt8: return {0, 255};
      case DType::Int16: return {-32768, 32767};
      case DType::UInt16: return {0, 65535};
      case DType::Int32: return {-2147483648.0, 2147483647.0};
      case DType::UInt32: return {0, 4294967295.0};
      case DType::Int64: return {-9.3e18, 9.3e18};
      default: return {0, 1.8e19};  // UInt64
    }
  };
  bool widens = (range(to).first <= range(from).first && range(to).second >= range(from).second);
  if (!exact || !widens) h.no_lowering(n, std::string("integer cast ") + dtype_name(from) + " -> " + dtype_name(to));
  return arg(h, n, 0, m, true);
}

}  // namespace

bool lowers_op(const std::string& op) {
  return op == "Gather" || op == "Slice" || op == "Concat" || op == "Tile" || op == "Where" || op == "Cast" || op == "Pad" ||
         op == "Resize" || op == "Upsample" || kCompare.count(op) || kLogic.count(op) || kPredicate.count(op);
}

bool elementwise_op(const std::string& op) { return op == "Where" || kCompare.count(op) || kLogic.count(op) || kPredicate.count(op); }

bool moves_data(const std::string& op) {
  static const std::set<std::string> ops = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Split",
                                            "Identity", "Gather", "Slice", "Concat", "Tile"};
  return ops.count(op) != 0;
}

bool wide_int_dtype(DType d) { return d == DType::Int64 || d == DType::Int32 || d == DType::UInt64 || d == DType::UInt32; }

bool exact_in_float(const Graph& g, const Node& n) {
  if (!n.domain.empty()) return false;
  if (kCompare.count(n.op_type) || kLogic.count(n.op_type) || kPredicate.count(n.op_type)) return true;
  if (n.op_type != "Cast") return false;
  const DType from = g.type(n.inputs.at(0)).dtype;
  return from == DType::Float32 || from == DType::Bool || DType(n.attrs.get_int("to", 0)) == DType::Bool;
}

IndexStep concat_window(const Graph& g, const Node& n, size_t i) {
  Shape out = g.type(n.outputs[0]).static_shape();
  size_t axis = size_t(norm_axis(n.attrs.get_int("axis", 0), out.size()));
  int64_t start = 0;
  for (size_t j = 0; j < i; ++j)
    if (!n.inputs[j].empty()) start += g.type(n.inputs[j]).static_shape()[axis];
  std::vector<int64_t> off(out.size(), 0);
  off[axis] = start;
  return offset_step(g.type(n.inputs[i]).static_shape(), out, off);
}

std::optional<int> lower_expr(ExprHost& h, const Node& n, const std::string& v, const IndexMap& m) {
  const std::string& op = n.op_type;
  if (!n.domain.empty() || !lowers_op(op)) return std::nullopt;
  (void)v;
  if (op == "Gather") return gather_expr(h, n, m);
  if (op == "Slice") return slice_expr(h, n, m);
  if (op == "Concat") return concat_expr(h, n, m);
  if (op == "Tile") return tile_expr(h, n, m);
  if (op == "Cast") return cast_expr(h, n, m);
  if (op == "Pad") return pad_expr(h, n, m);
  if (op == "Resize" || op == "Upsample") return resize_expr(h, n, m);
  Expr e;
  if (op == "Where") {
    if (h.graph().type(n.inputs.at(1)).dtype != DType::Float32) h.no_lowering(n, "non-float values");
    e.kind = Expr::Where;
    e.args = {arg(h, n, 0, m, true), arg(h, n, 1, m, false), arg(h, n, 2, m, false)};
    return h.push(std::move(e));
  }
  if (kPredicate.count(op)) {
    if (h.graph().type(n.inputs.at(0)).dtype != DType::Float32) h.no_lowering(n, "non-float input");
    e.kind = Expr::Unary;
    e.op = op;
    if (op == "IsInf") {
      const bool pos = n.attrs.get_int("detect_positive", 1) != 0, neg = n.attrs.get_int("detect_negative", 1) != 0;
      if (!pos && !neg) h.no_lowering(n, "detect_positive = detect_negative = 0");
      e.op = pos && neg ? "IsInf" : pos ? "IsPosInf" : "IsNegInf";
    }
    e.args = {arg(h, n, 0, m, false)};
    return h.push(std::move(e));
  }
  if (kCompare.count(op)) {
    if (auto r = wide_int_compare(h, n, m)) return *r;
  }
  // Comparisons and logic: operands float holds exactly (wider integers could round).
  for (auto& in : n.inputs)
    if (!float_exact(h, in)) h.no_lowering(n, std::string("operands of type ") + dtype_name(h.graph().type(in).dtype));
  e.op = op;
  if (op == "Not") {
    e.kind = Expr::Unary;
    e.args = {arg(h, n, 0, m, true)};
  } else {
    e.kind = Expr::Binary;
    e.args = {arg(h, n, 0, m, true), arg(h, n, 1, m, true)};
  }
  return h.push(std::move(e));
}

}  // namespace nnfuse::dm
