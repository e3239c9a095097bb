// Sequence and optional values: SequenceEmpty/Construct/At/Length/Insert/Erase, SplitToSequence,
// ConcatFromSequence, SequenceMap, Optional, OptionalHasElement, OptionalGetElement. A sequence
// is a Tensor::sequence (its elements are tensors of one element type), an optional holding a
// value is that value and an empty one Tensor::none(). These run in the reference interpreter
// (and so inside If/Loop bodies); the compiled targets take tensors only (lower_module says so).
#include "graph/onnx_tensor.h"
#include "graph/ops_common.h"
#include "graph/ops_tensor_util.h"

namespace nnfuse {

namespace {

const Tensor& sequence_input(const KernelContext& c, size_t i) {
  const Tensor& t = c.input(i);
  if (!t.is_sequence()) c.error("input " + std::to_string(i) + " must be a sequence, got " + t.kind_str());
  return t;
}

const Tensor& tensor_input(const KernelContext& c, size_t i) {
  const Tensor& t = c.input(i);
  if (!t.is_tensor()) c.error("input " + std::to_string(i) + " must be a tensor, got " + t.kind_str());
  return t;
}

// A position input (a scalar int32/int64), checked against [lo, hi] after negative wrap by `n`.
int64_t position(const KernelContext& c, size_t i, int64_t n, int64_t lo, int64_t hi) {
  const Tensor& p = tensor_input(c, i);
  if (p.numel() != 1 || (p.dtype() != DType::Int64 && p.dtype() != DType::Int32))
    c.error("position must be one int32 or int64, got " + std::string(dtype_name(p.dtype())) + shape_str(p.shape()));
  const int64_t raw = p.as_int(0);
  const int64_t k = raw < 0 ? raw + n : raw;
  if (k < lo || k > hi)
    c.error("position " + std::to_string(raw) + " is out of range for a sequence of " + std::to_string(n) + " (valid: " +
            std::to_string(lo - n) + " to " + std::to_string(hi) + ")");
  return k;
}

TensorType sequence_input_type(const InferContext& c, size_t i) {
  const TensorType& t = c.input(i);
  if (t.kind != ValueKind::Sequence && !(t.is_tensor() && t.dtype == DType::Undefined))
    c.error("input " + std::to_string(i) + " must be a sequence, got " + t.str());
  return TensorType::sequence_of(t.dtype);
}

std::vector<Tensor> split_to_sequence(const KernelContext& c) {
  const Tensor& x = tensor_input(c, 0);
  if (x.rank() == 0) c.error("input must have rank 1 or more to be split");
  const int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 0), x.rank(), c.node);
  const int64_t dim = x.dim(axis);
  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (!c.has_input(1)) {
    sizes.assign(size_t(dim), 1);
    squeeze = c.node.attrs.get_int("keepdims", 1) == 0;
  } else {
    const Tensor& sp = tensor_input(c, 1);
    if (sp.dtype() != DType::Int64 && sp.dtype() != DType::Int32) c.error("split must be int32 or int64, got " + std::string(dtype_name(sp.dtype())));
    if (sp.rank() == 0) {
      const int64_t chunk = sp.as_int(0);
      if (chunk <= 0) c.error("split must be positive, got " + std::to_string(chunk));
      for (int64_t at = 0; at < dim; at += chunk) sizes.push_back(std::min(chunk, dim - at));
    } else {
      if (sp.rank() != 1) c.error("split must be a scalar or 1-D, got shape " + shape_str(sp.shape()));
      int64_t total = 0;
      for (int64_t v : sp.to_int_vector()) {
        if (v < 0) c.error("split holds a negative size " + std::to_string(v));
        if (v > dim - total) c.error("split sizes add up to more than the axis " + std::to_string(axis) + " has (" + std::to_string(dim) + ")");
        sizes.push_back(v);
        total += v;
      }
      if (total != dim)
        c.error("split sizes add up to " + std::to_string(total) + ", the axis " + std::to_string(axis) + " has " + std::to_string(dim));
    }
  }
  std::vector<Tensor> parts = tensor_ops::split_along(c, x, axis, sizes);
  if (squeeze)
    for (Tensor& p : parts) {
      Shape s = p.shape();
      s.erase(s.begin() + axis);
      p = p.reshaped(s);
    }
  return {Tensor::sequence(x.dtype(), std::move(parts))};
}

std::vector<Tensor> concat_from_sequence(const KernelContext& c) {
  const Tensor& seq = sequence_input(c, 0);
  const auto& el = seq.elements();
  auto ax = c.node.attrs.opt_int("axis");
  if (!ax) c.error("needs the attribute axis");
  const bool new_axis = c.node.attrs.get_int("new_axis", 0) != 0;
  if (el.empty()) c.error("the sequence is empty: there is nothing to concatenate");
  const Shape& s0 = el[0].shape();
  const int64_t rank = int64_t(s0.size()) + (new_axis ? 1 : 0);
  if (rank == 0) c.error("cannot concatenate scalars without new_axis=1");
  const int64_t axis = normalize_axis(*ax, rank, c.node);
  // Stacking is concatenating the elements each with a 1 inserted at the axis (a view).
  auto placed = [&](const Shape& shape) {
    Shape s = shape;
    if (new_axis) s.insert(s.begin() + axis, 1);
    return s;
  };
  const Shape first = placed(s0);
  std::vector<Tensor> parts;
  for (size_t i = 0; i < el.size(); ++i) {
    const Shape s = placed(el[i].shape());
    if (s.size() != first.size()) c.error("element " + std::to_string(i) + " has shape " + shape_str(el[i].shape()) + ", element 0 " + shape_str(s0));
    for (size_t d = 0; d < s.size(); ++d)
      if (int64_t(d) != axis && s[d] != first[d])
        c.error("element " + std::to_string(i) + " has shape " + shape_str(el[i].shape()) + ", which does not match element 0's " +
                shape_str(s0) + " off the axis " + std::to_string(axis));
    parts.push_back(new_axis ? el[i].reshaped(s) : el[i]);
  }
  return {tensor_ops::concat_along(c, parts, axis)};
}

// SequenceMap: the body runs once per element of the first input; every other sequence input
// gives its element at the same position, a tensor input is passed whole. Each body output
// becomes a sequence.
std::vector<Tensor> sequence_map(const KernelContext& c) {
  const Attribute* a = c.node.attrs.find("body");
  if (!a || a->kind != Attribute::Kind::Graph || !a->g) c.error("needs a graph attribute 'body'");
  if (!c.run_subgraph) c.error("needs a subgraph runner (run it through the interpreter)");
  const Graph& body = *a->g;
  if (body.inputs().size() != c.num_inputs() || body.outputs().size() != c.node.outputs.size())
    c.error("body takes " + std::to_string(body.inputs().size()) + " inputs and gives " + std::to_string(body.outputs().size()) +
            " outputs; the node has " + std::to_string(c.num_inputs()) + " and " + std::to_string(c.node.outputs.size()));
  const size_t n = sequence_input(c, 0).elements().size();
  for (size_t j = 1; j < c.num_inputs(); ++j) {
    const Tensor& t = c.input(j);
    if (t.is_none()) c.error("input " + std::to_string(j) + " is an empty optional");
    if (t.is_sequence() && t.elements().size() != n)
      c.error("input " + std::to_string(j) + " is a sequence of " + std::to_string(t.elements().size()) + ", input 0 of " + std::to_string(n));
  }
  const size_t n_out = c.node.outputs.size();
  std::vector<std::vector<Tensor>> outs(n_out);
  for (size_t i = 0; i < n; ++i) {
    std::vector<Tensor> ins;
    for (size_t j = 0; j < c.num_inputs(); ++j) ins.push_back(c.input(j).is_sequence() ? c.input(j).elements()[i] : c.input(j));
    std::vector<Tensor> r = c.run_subgraph(body, ins);
    if (r.size() != n_out) c.error("body gave " + std::to_string(r.size()) + " outputs, the node has " + std::to_string(n_out));
    for (size_t k = 0; k < n_out; ++k) {
      if (!r[k].is_tensor()) c.error("body output " + std::to_string(k) + " is " + r[k].kind_str() + ", not a tensor");
      outs[k].push_back(std::move(r[k]));
    }
  }
  std::vector<Tensor> result;
  for (size_t k = 0; k < n_out; ++k) {
    DType dt = outs[k].empty() ? DType::Undefined : outs[k][0].dtype();
    if (dt == DType::Undefined) {
      const std::string& o = body.outputs()[k];
      dt = body.has_value(o) && body.type(o).dtype != DType::Undefined ? body.type(o).dtype : DType::Float32;
    }
    try {
      result.push_back(Tensor::sequence(dt, std::move(outs[k])));
    } catch (const Error& e) {
      c.error("output " + std::to_string(k) + ": " + e.detail());
    }
  }
  return result;
}

OpSchema sequence_schema(const char* name, int since, int min_in, int max_in) {
  OpSchema s;
  s.name = name;
  s.since = since;
  s.min_inputs = min_in;
  s.max_inputs = max_in;
  s.mapping = MappingType::ManyToMany;
  s.takes_any_value = true;
  s.flops = [](const Node&, const std::vector<TensorType>&, const std::vector<TensorType>&) { return 0.0; };
  s.family = "sequence";
  return s;
}

// SequenceEmpty's element type (float32 by default); `error` is the caller's (infer or kernel).
template <class Ctx>
DType empty_sequence_dtype(const Ctx& c) {
  const int64_t v = c.node.attrs.get_int("dtype", int64_t(DType::Float32));
  if (!onnx_tensor::dtype_supported(int32_t(v))) c.error("dtype " + std::to_string(v) + " is not a supported element type");
  return DType(v);
}

}  // namespace

void register_sequence_ops(OpRegistry& r) {
  {
    OpSchema s = sequence_schema("SequenceEmpty", 11, 0, 0);
    s.infer = [](const InferContext& c) { return infer_one(TensorType::sequence_of(empty_sequence_dtype(c))); };
    s.kernel = [](const KernelContext& c) { return std::vector<Tensor>{Tensor::sequence(empty_sequence_dtype(c), {})}; };
    r.add(std::move(s));
  }
  {
    OpSchema s = sequence_schema("SequenceConstruct", 11, 1, -1);
    s.infer = [](const InferContext& c) {
      DType dt = DType::Undefined;
      for (size_t i = 0; i < c.num_inputs(); ++i) {
        const TensorType& t = c.input(i);
        if (!t.is_tensor()) c.error("input " + std::to_string(i) + " must be a tensor, got " + t.str());
        if (dt != DType::Undefined && t.dtype != DType::Undefined && t.dtype != dt)
          c.error("input " + std::to_string(i) + " is " + dtype_name(t.dtype) + ", input 0 " + dtype_name(dt));
        if (dt == DType::Undefined) dt = t.dtype;
      }
      return infer_one(TensorType::sequence_of(dt));
    };
    s.kernel = [](const KernelContext& c) {
      std::vector<Tensor> el;
      for (size_t i = 0; i < c.num_inputs(); ++i) el.push_back(tensor_input(c, i));
      const DType dt = el[0].dtype();  // before el is moved from
      try {
        return std::vector<Tensor>{Tensor::sequence(dt, std::move(el))};
      } catch (const Error& e) {
        c.error(e.detail());
      }
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = sequence_schema("SequenceAt", 11, 2, 2);
    s.infer = [](const InferContext& c) { return infer_one(TensorType::unknown_shape(sequence_input_type(c, 0).dtype)); };
    s.kernel = [](const KernelContext& c) {
      const auto& el = sequence_input(c, 0).elements();
      const int64_t n = int64_t(el.size());
      return std::vector<Tensor>{el[size_t(position(c, 1, n, 0, n - 1))]};
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = sequence_schema("SequenceLength", 11, 1, 1);
    s.infer = [](const InferContext& c) {
      sequence_input_type(c, 0);
      return infer_one(TensorType(DType::Int64, std::vector<Dim>{}));
    };
    s.kernel = [](const KernelContext& c) {
      return std::vector<Tensor>{Tensor::scalar<int64_t>(int64_t(sequence_input(c, 0).elements().size()))};
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = sequence_schema("SequenceInsert", 11, 2, 3);
    s.infer = [](const InferContext& c) {
      TensorType t = sequence_input_type(c, 0);
      const TensorType& v = c.input(1);
      if (!v.is_tensor()) c.error("input 1 must be a tensor, got " + v.str());
      if (t.dtype != DType::Undefined && v.dtype != DType::Undefined && v.dtype != t.dtype)
        c.error("inserts a " + std::string(dtype_name(v.dtype)) + " tensor into a sequence of " + dtype_name(t.dtype));
      if (t.dtype == DType::Undefined) t.dtype = v.dtype;
      return infer_one(t);
    };
    s.kernel = [](const KernelContext& c) {
      const Tensor& seq = sequence_input(c, 0);
      const Tensor& v = tensor_input(c, 1);
      if (v.dtype() != seq.dtype())
        c.error("inserts a " + std::string(dtype_name(v.dtype())) + " tensor into a sequence of " + dtype_name(seq.dtype()));
      std::vector<Tensor> el = seq.elements();
      const int64_t n = int64_t(el.size());
      const int64_t at = c.has_input(2) ? position(c, 2, n, 0, n) : n;
      el.insert(el.begin() + at, v);
      return std::vector<Tensor>{Tensor::sequence(seq.dtype(), std::move(el))};
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = sequence_schema("SequenceErase", 11, 1, 2);
    s.infer = [](const InferContext& c) { return infer_one(sequence_input_type(c, 0)); };
    s.kernel = [](const KernelContext& c) {
      const Tensor& seq = sequence_input(c, 0);
      std::vector<Tensor> el = seq.elements();
      const int64_t n = int64_t(el.size());
      if (n == 0) c.error("erases from an empty sequence");
      const int64_t at = c.has_input(1) ? position(c, 1, n, 0, n - 1) : n - 1;
      el.erase(el.begin() + at);
      return std::vector<Tensor>{Tensor::sequence(seq.dtype(), std::move(el))};
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = sequence_schema("SplitToSequence", 11, 1, 2);
    s.infer = [](const InferContext& c) {
      if (!c.input(0).is_tensor()) c.error("input 0 must be a tensor, got " + c.input(0).str());
      return infer_one(TensorType::sequence_of(c.input(0).dtype));
    };
    s.kernel = split_to_sequence;
    r.add(std::move(s));
  }
  {
    OpSchema s = sequence_schema("ConcatFromSequence", 11, 1, 1);
    s.infer = [](const InferContext& c) { return infer_one(TensorType::unknown_shape(sequence_input_type(c, 0).dtype)); };
    s.kernel = concat_from_sequence;
    r.add(std::move(s));
  }
  {
    OpSchema s = sequence_schema("SequenceMap", 17, 1, -1);
    s.min_outputs = 1;
    s.max_outputs = -1;
    s.infer = [](const InferContext& c) {
      sequence_input_type(c, 0);
      const Attribute* a = c.node.attrs.find("body");
      if (!a || a->kind != Attribute::Kind::Graph || !a->g) c.error("needs a graph attribute 'body'");
      if (a->g->inputs().size() != c.num_inputs() || a->g->outputs().size() != c.node.outputs.size())
        c.error("body takes " + std::to_string(a->g->inputs().size()) + " inputs and gives " + std::to_string(a->g->outputs().size()) +
                " outputs; the node has " + std::to_string(c.num_inputs()) + " and " + std::to_string(c.node.outputs.size()));
      InferResult r;
      for (size_t k = 0; k < c.node.outputs.size(); ++k) {
        DType dt = DType::Undefined;
        if (k < a->g->outputs().size() && a->g->has_value(a->g->outputs()[k])) dt = a->g->type(a->g->outputs()[k]).dtype;
        r.outputs.push_back(TensorType::sequence_of(dt));
      }
      return r;
    };
    s.kernel = sequence_map;
    r.add(std::move(s));
  }
  {
    // Optional(input) holds input; Optional() is empty, typed by the `type` attribute.
    OpSchema s = sequence_schema("Optional", 15, 0, 1);
    s.infer = [](const InferContext& c) {
      TensorType t;
      if (c.has_input(0)) {
        t = c.input(0);
        if (t.kind == ValueKind::Optional) c.error("input is already an optional: " + t.str());
        t.optional_of = t.kind;
      } else {
        const Attribute* a = c.node.attrs.find("type");
        if (!a || a->kind != Attribute::Kind::Type || !a->type) c.error("without an input, needs the attribute type");
        t = *a->type;
        if (t.kind == ValueKind::Optional) c.error("type must be a tensor or sequence type, got " + t.str());
        t.optional_of = t.kind;
      }
      t.kind = ValueKind::Optional;
      return infer_one(t);
    };
    s.kernel = [](const KernelContext& c) { return std::vector<Tensor>{c.has_input(0) ? c.input(0) : Tensor::none()}; };
    r.add(std::move(s));
  }
  {
    // Opset 18: the input may be absent (false) or a plain tensor or sequence (true).
    OpSchema s = sequence_schema("OptionalHasElement", 15, 0, 1);
    s.infer = [](const InferContext& c) {
      if (c.opset < 18 && (!c.has_input(0) || c.input(0).kind != ValueKind::Optional))
        c.error("takes an optional input before opset 18 (got " + (c.has_input(0) ? c.input(0).str() : std::string("none")) + ")");
      return infer_one(TensorType(DType::Bool, std::vector<Dim>{}));
    };
    s.kernel = [](const KernelContext& c) {
      if (!c.has_input(0) && c.opset < 18) c.error("needs an input before opset 18");
      return std::vector<Tensor>{Tensor::scalar<bool>(c.has_input(0) && !c.input(0).is_none())};
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = sequence_schema("OptionalGetElement", 15, 1, 1);
    s.infer = [](const InferContext& c) {
      TensorType t = c.input(0);
      if (c.opset < 18 && t.kind != ValueKind::Optional && !(t.is_tensor() && t.dtype == DType::Undefined))
        c.error("takes an optional input before opset 18 (got " + t.str() + ")");
      if (t.kind == ValueKind::Optional) t.kind = t.optional_of;
      t.optional_of = ValueKind::Tensor;
      return infer_one(t);
    };
    s.kernel = [](const KernelContext& c) {
      if (c.input(0).is_none()) c.error("the optional is empty");
      return std::vector<Tensor>{c.input(0)};
    };
    r.add(std::move(s));
  }
}

}  // namespace nnfuse
