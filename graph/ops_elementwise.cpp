// The elementwise op family: its shared helpers, and Where, Cast, CastLike, Identity, Dropout.
// Unary math is in ops_elementwise_unary.cpp, activations (and Clip) in
// ops_elementwise_activation.cpp, binary/variadic/comparison ops in ops_elementwise_binary.cpp.
//
// FLOP convention for the whole family: one FLOP per output element, whatever the op computes
// (Exp counts 1, Gelu counts 1), because the fusion cost model compares memory traffic against
// work and elementwise ops are memory-bound either way. Exceptions: variadic ops count one per
// output element per extra input (Sum of 3 inputs: 2), and Identity/Dropout, which compute
// nothing, count 0.
#include <cstring>

#include "graph/ops_elementwise_impl.h"

namespace nnfuse {

namespace ew {

std::string mask_str(unsigned mask) {
  std::string r;
  auto add = [&](unsigned bit, const char* name) {
    if (mask & bit) r += (r.empty() ? "" : ", ") + std::string(name);
  };
  add(kFloat, "float");
  add(kSigned, "signed integer");
  add(kUnsigned, "unsigned integer");
  add(kBool, "bool");
  return r;
}

void unsupported_dtype(const Node& n, int64_t opset, DType t, const std::string& role, unsigned mask) {
  fail(ErrorKind::Unsupported,
       n.op_type + " does not support dtype " + dtype_name(t) + " for its " + role + " (supported: " + mask_str(mask) + ")",
       node_ctx(n, opset));
}

Shape kernel_broadcast(const KernelContext& c, const std::vector<const Tensor*>& ins) {
  std::vector<Shape> shapes;
  for (auto* t : ins)
    if (t) shapes.push_back(t->shape());
  try {
    return broadcast_shapes(shapes);
  } catch (const Error& e) {
    fail(ErrorKind::Shape, e.detail(), node_ctx(c.node, c.opset));
  }
}

TensorType broadcast_type(const InferContext& c, DType out_dtype) {
  std::vector<std::vector<Dim>> shapes;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (!c.has_input(i)) continue;
    if (!c.inputs[i].has_shape) return TensorType::unknown_shape(out_dtype);
    shapes.push_back(c.inputs[i].dims);
  }
  return TensorType(out_dtype, broadcast_dims(shapes, c));
}

DType common_dtype(const InferContext& c, size_t first, size_t last) {
  DType t = DType::Undefined;
  size_t where = 0;
  for (size_t i = first; i < c.num_inputs() && i < last; ++i) {
    if (!c.has_input(i)) continue;
    DType u = c.inputs[i].dtype;
    if (u == DType::Undefined) continue;
    if (t == DType::Undefined) {
      t = u;
      where = i;
    } else if (u != t) {
      c.error("inputs " + std::to_string(where) + " and " + std::to_string(i) + " must have the same dtype, got " +
              dtype_name(t) + " and " + dtype_name(u));
    }
  }
  return t;
}

void check_dtype(const InferContext& c, DType t, unsigned mask, const std::string& role) {
  if (t != DType::Undefined && !accepts(mask, t)) unsupported_dtype(c.node, c.opset, t, role, mask);
}

MappingType broadcast_mapping(const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
  if (outs.empty() || !outs[0].has_shape) return MappingType::OneToOne;
  for (auto& t : ins) {
    if (t.dtype == DType::Undefined && !t.has_shape) continue;  // absent
    if (!t.has_shape) continue;
    if (t.dims != outs[0].dims) return MappingType::OneToMany;
  }
  return MappingType::OneToOne;
}

std::optional<std::vector<SymInt>> sym_elements(const InferContext& c, size_t i) {
  if (!c.has_input(i)) return std::nullopt;
  const TensorType& t = c.inputs[i];
  if (t.dtype != DType::Undefined && !dtype_is_integer(t.dtype) && t.dtype != DType::Bool) return std::nullopt;
  if (t.has_shape && t.dims.size() > 1) return std::nullopt;
  std::vector<SymInt> r;
  if (const Tensor* v = c.value(i)) {
    if (v->rank() > 1 || v->numel() > 64 || (!dtype_is_integer(v->dtype()) && v->dtype() != DType::Bool)) return std::nullopt;
    for (int64_t k = 0; k < v->numel(); ++k) r.push_back(SymInt::of(v->as_int(k)));
    return r;
  }
  const auto& dv = c.dims_of_value(i);
  if (!dv) return std::nullopt;
  for (auto& d : *dv) r.push_back(SymInt::of(d));
  return r;
}

// ---- Where ---------------------------------------------------------------------------------

static InferResult infer_where(const InferContext& c) {
  DType cond = c.input(0).dtype;
  if (cond != DType::Undefined && cond != DType::Bool) c.error(std::string("condition must be bool, got ") + dtype_name(cond));
  DType t = common_dtype(c, 1, 3);
  InferResult r = infer_one(broadcast_type(c, t));
  if (dtype_is_integer(t) && (!r.outputs[0].has_shape || r.outputs[0].rank() <= 1)) {
    r.dim_values.push_back(sym_map(c, {0, 1, 2}, [](const std::vector<SymInt>& a) {
      if (!a[0].value) return SymInt();
      return *a[0].value ? a[1] : a[2];
    }));
  }
  return r;
}

static std::vector<Tensor> kernel_where(const KernelContext& c) {
  const Tensor& cond = c.input(0);
  const Tensor& x = c.input(1);
  const Tensor& y = c.input(2);
  if (cond.dtype() != DType::Bool) c.error(std::string("condition must be bool, got ") + dtype_name(cond.dtype()));
  if (x.dtype() != y.dtype())
    c.error(std::string("X and Y must have the same dtype, got ") + dtype_name(x.dtype()) + " and " + dtype_name(y.dtype()));
  Tensor out(x.dtype(), kernel_broadcast(c, {&cond, &x, &y}));
  const bool* pc = cond.data<bool>();
  // Where only moves elements: copy them as bytes of their size.
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw());
    const T* py = static_cast<const T*>(y.raw());
    T* po = static_cast<T*>(out.raw());
    for_each_run<3>(out.shape(), {&cond.shape(), &x.shape(), &y.shape()},
                    [&](int64_t o, const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st, int64_t n) {
                      const bool* cc = pc + off[0];
                      const T* xx = px + off[1];
                      const T* yy = py + off[2];
                      T* z = po + o;
                      if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
                        for (int64_t i = 0; i < n; ++i) z[i] = cc[i] ? xx[i] : yy[i];
                      } else {
                        for (int64_t i = 0; i < n; ++i) z[i] = cc[i * st[0]] ? xx[i * st[1]] : yy[i * st[2]];
                      }
                    });
  };
  switch (dtype_size(x.dtype())) {
    case 1: run(uint8_t{}); break;
    case 2: run(uint16_t{}); break;
    case 4: run(uint32_t{}); break;
    case 8: run(uint64_t{}); break;
    default: unsupported_dtype(c.node, c.opset, x.dtype(), "X/Y", kAny);
  }
  return {out};
}

// ---- Cast, CastLike ------------------------------------------------------------------------

static bool castable(DType t) { return t != DType::Undefined && dtype_size(t) != 0; }

static DType cast_target(const Node& n, int64_t opset) {
  auto to = n.attrs.opt_int("to");
  if (!to) fail(ErrorKind::Model, "Cast needs the attribute 'to'", node_ctx(n, opset));
  DType t = DType(int32_t(*to));
  if (!castable(t))
    fail(ErrorKind::Unsupported,
         "Cast to ONNX dtype " + std::to_string(*to) + " (" + dtype_name(t) + ") is not supported", node_ctx(n, opset));
  return t;
}

// BitCast (opset 26): the same bytes read as dtype `to`, which must have the input's width (bool
// has a byte, as in ONNX's storage).
static DType bitcast_target(const Node& n, int64_t opset, DType from) {
  auto to = n.attrs.opt_int("to");
  if (!to) fail(ErrorKind::Model, "BitCast needs the attribute 'to'", node_ctx(n, opset));
  const DType t = DType(int32_t(*to));
  if (!castable(t) || dtype_packed_bits(t) != 8 * int(dtype_size(t)) || (from != DType::Undefined && dtype_packed_bits(from) < 8))
    fail(ErrorKind::Unsupported, "BitCast to ONNX dtype " + std::to_string(*to) + " (" + dtype_name(t) + ")" +
                                     (from != DType::Undefined ? std::string(" from ") + dtype_name(from) : std::string()) + " is not supported",
         node_ctx(n, opset));
  if (from != DType::Undefined && dtype_size(from) != dtype_size(t))
    fail(ErrorKind::Model,
         std::string("BitCast from ") + dtype_name(from) + " to " + dtype_name(t) + ": the widths differ (" + std::to_string(8 * dtype_size(from)) +
             " and " + std::to_string(8 * dtype_size(t)) + " bits)",
         node_ctx(n, opset));
  return t;
}

static std::optional<std::vector<Dim>> passthrough_dims(const InferContext& c, DType out) {
  if (!dtype_is_integer(out)) return std::nullopt;
  if (!c.dims_of_value(0)) return std::nullopt;
  return c.dims_of_value(0);
}

static InferResult infer_cast(const InferContext& c) {
  DType to = cast_target(c.node, c.opset);
  DType from = c.input(0).dtype;
  if (from != DType::Undefined && !castable(from)) unsupported_dtype(c.node, c.opset, from, "input", kAny);
  TensorType t = c.input(0);
  t.dtype = to;
  InferResult r = infer_one(t);
  if (dtype_is_integer(from) || from == DType::Undefined) r.dim_values.push_back(passthrough_dims(c, to));
  return r;
}

// Cast's `saturate` (opset 19; float8 targets) and `round_mode` (opset 24; float8e8m0 targets).
static LowPrecisionCast cast_options(const Node& n, int64_t opset) {
  LowPrecisionCast o;
  o.saturate = n.attrs.get_int("saturate", 1) != 0;
  const std::string mode = n.attrs.get_string("round_mode", "up");
  if (mode == "up") o.e8m0 = E8M0Rounding::Up;
  else if (mode == "down") o.e8m0 = E8M0Rounding::Down;
  else if (mode == "nearest") o.e8m0 = E8M0Rounding::Nearest;
  else fail(ErrorKind::Model, "round_mode '" + mode + "' is not one of up, down, nearest", node_ctx(n, opset));
  return o;
}

static std::vector<Tensor> cast_kernel(const KernelContext& c, DType to) {
  const Tensor& x = c.input(0);
  if (!castable(x.dtype())) unsupported_dtype(c.node, c.opset, x.dtype(), "input", kAny);
  if (!castable(to)) unsupported_dtype(c.node, c.opset, to, "target", kAny);
  if (x.dtype() == to) return {x};
  return {x.cast(to, cast_options(c.node, c.opset))};
}

static InferResult infer_castlike(const InferContext& c) {
  DType to = c.input(1).dtype;
  DType from = c.input(0).dtype;
  if (from != DType::Undefined && !castable(from)) unsupported_dtype(c.node, c.opset, from, "input", kAny);
  if (to != DType::Undefined && !castable(to)) unsupported_dtype(c.node, c.opset, to, "target", kAny);
  TensorType t = c.input(0);
  t.dtype = to;
  InferResult r = infer_one(t);
  if (dtype_is_integer(from)) r.dim_values.push_back(passthrough_dims(c, to));
  return r;
}

// ---- Identity, Dropout ---------------------------------------------------------------------

static InferResult infer_identity(const InferContext& c) {
  // Sequences from opset 14, optionals from 16.
  if ((c.input(0).kind == ValueKind::Sequence && c.opset < 14) || (c.input(0).kind == ValueKind::Optional && c.opset < 16))
    c.error("takes " + c.input(0).str() + " only from opset " + (c.input(0).kind == ValueKind::Sequence ? "14" : "16"));
  InferResult r = infer_same_as(c, 0);
  r.dim_values.push_back(c.dims_of_value(0));
  return r;
}

// Dropout at inference: output = input. From opset 12 `training_mode` (input 2) may turn on
// training: each element is dropped with probability `ratio` (input 1, default 0.5) and the kept
// ones scaled by 1 / (1 - ratio). That is random, and not supported, unless the ratio is 0: then
// nothing is dropped and training mode is Identity with an all-true mask, as at inference.
// Returns whether the node would draw random numbers. `mode` and `ratio` are the values of inputs
// 2 and 1, nullptr when absent or not known yet (shape inference on a non-constant input); an
// unknown value is taken as not random there, and the kernel asks again with the run-time values.
static bool dropout_random(const Node& n, int64_t opset, const Tensor* mode, bool ratio_given, const Tensor* ratio) {
  if (opset < 12 || !mode) return false;
  if (mode->numel() != 1) fail(ErrorKind::Shape, "training_mode must be a scalar", node_ctx(n, opset));
  if (mode->as_double(0) == 0) return false;
  if (!ratio_given) return true;  // the default ratio, 0.5
  if (!ratio) return false;
  if (ratio->numel() != 1) fail(ErrorKind::Shape, "ratio must be a scalar", node_ctx(n, opset));
  return ratio->as_double(0) != 0;
}

static const char* kDropoutRandom =
    "Dropout with training_mode=true and a nonzero ratio draws a random mask; only inference or ratio 0 is supported";

static InferResult infer_dropout(const InferContext& c) {
  if (c.opset < 12 && c.num_inputs() > 1)
    fail(ErrorKind::Model, "Dropout takes one input before opset 12", node_ctx(c.node, c.opset));
  if (dropout_random(c.node, c.opset, c.has_input(2) ? c.value(2) : nullptr, c.has_input(1), c.has_input(1) ? c.value(1) : nullptr))
    fail(ErrorKind::Unsupported, kDropoutRandom, node_ctx(c.node, c.opset));
  const TensorType& x = c.input(0);
  check_dtype(c, x.dtype, kFloat);
  InferResult r;
  r.outputs.push_back(x);
  if (c.node.outputs.size() > 1) {
    TensorType mask = x;
    mask.dtype = c.opset >= 10 ? DType::Bool : x.dtype;  // the mask was of the input's type before opset 10
    r.outputs.push_back(mask);
  }
  return r;
}

static std::vector<Tensor> kernel_dropout(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (!accepts(kFloat, x.dtype())) unsupported_dtype(c.node, c.opset, x.dtype(), "input", kFloat);
  if (dropout_random(c.node, c.opset, c.has_input(2) ? c.inputs[2] : nullptr, c.has_input(1), c.has_input(1) ? c.inputs[1] : nullptr))
    c.unsupported(kDropoutRandom);
  std::vector<Tensor> out{x};
  if (c.node.outputs.size() > 1 && !c.node.outputs[1].empty()) {
    if (c.opset >= 10) {
      Tensor mask(DType::Bool, x.shape());
      std::memset(mask.raw(), 1, mask.nbytes());
      out.push_back(mask);
    } else {
      Tensor ones(x.dtype(), x.shape());
      dispatch_dtype(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (accepts<kFloat, T>()) {
          T* p = ones.data<T>();
          for (int64_t i = 0; i < ones.numel(); ++i) p[i] = store<T>(1.0f);
        }
      });
      out.push_back(ones);
    }
  }
  return out;
}

static double no_flops(const Node&, const std::vector<TensorType>&, const std::vector<TensorType>&) { return 0; }

void register_misc_ops(OpRegistry& r) {
  {
    OpSchema s;
    s.name = "Where";
    s.since = 9;
    s.min_inputs = s.max_inputs = 3;
    s.mapping_fn = broadcast_mapping;
    s.infer = infer_where;
    s.kernel = kernel_where;
    s.family = "elementwise";
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.name = "Cast";
    s.since = 7;
    s.infer = infer_cast;
    s.kernel = [](const KernelContext& c) { return cast_kernel(c, cast_target(c.node, c.opset)); };
    s.family = "elementwise";
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.name = "BitCast";
    s.since = 26;
    s.infer = [](const InferContext& c) {
      TensorType t = c.input(0);
      t.dtype = bitcast_target(c.node, c.opset, t.dtype);
      return infer_one(t);
    };
    s.kernel = [](const KernelContext& c) {
      const Tensor& x = c.input(0);
      Tensor y = Tensor::uninitialized(bitcast_target(c.node, c.opset, x.dtype()), x.shape());
      if (x.nbytes()) std::memcpy(y.raw(), x.raw(), x.nbytes());
      if (y.dtype() == DType::Bool)  // a bool holds 0 or 1: any other byte is not a bool value
        for (int64_t i = 0; i < y.numel(); ++i) y.data<bool>()[i] = static_cast<const uint8_t*>(x.raw())[i] != 0;
      return std::vector<Tensor>{y};
    };
    s.flops = no_flops;
    s.family = "elementwise";
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.name = "CastLike";
    s.since = 15;
    s.min_inputs = s.max_inputs = 2;
    s.infer = infer_castlike;
    s.kernel = [](const KernelContext& c) { return cast_kernel(c, c.input(1).dtype()); };
    s.family = "elementwise";
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.name = "Identity";
    s.since = 7;
    s.infer = infer_identity;
    s.takes_any_value = true;  // opset 14: sequences, 16: optionals
    s.kernel = [](const KernelContext& c) { return std::vector<Tensor>{c.input(0)}; };
    s.flops = no_flops;
    s.family = "elementwise";
    r.add(std::move(s));
  }
  {
    OpSchema s;
    s.name = "Dropout";
    s.since = 7;
    s.min_inputs = 1;
    s.max_inputs = 3;
    s.min_outputs = 1;
    s.max_outputs = 2;
    s.infer = infer_dropout;
    s.kernel = kernel_dropout;
    s.flops = no_flops;
    s.family = "elementwise";
    r.add(std::move(s));
  }
}

}  // namespace ew

void register_elementwise_ops(OpRegistry& r) {
  ew::register_unary_ops(r);
  ew::register_activation_ops(r);
  ew::register_binary_ops(r);
  ew::register_misc_ops(r);
}

}  // namespace nnfuse
