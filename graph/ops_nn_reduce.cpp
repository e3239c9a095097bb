// Reductions (ReduceSum ... ReduceSumSquare), ArgMax, ArgMin, CumSum, CumProd.
#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {
namespace {

// Runs f(T{}, inputs) for integer dtypes directly and for float dtypes through float_kernel.
template <class F>
std::vector<Tensor> numeric_kernel(const KernelContext& c, bool allow_narrow_ints, F&& f, bool allow_bool = false) {
  std::vector<const Tensor*> in(c.inputs.begin(), c.inputs.end());
  switch (c.input(0).dtype()) {
    case DType::Bool:
      if (allow_bool) return f(bool{}, in);
      break;
    case DType::Int32: return f(int32_t{}, in);
    case DType::Int64: return f(int64_t{}, in);
    case DType::UInt32: return f(uint32_t{}, in);
    case DType::UInt64: return f(uint64_t{}, in);
    case DType::Int8:
      if (allow_narrow_ints) return f(int8_t{}, in);
      break;
    case DType::UInt8:
      if (allow_narrow_ints) return f(uint8_t{}, in);
      break;
    case DType::Int16:
      if (allow_narrow_ints) return f(int16_t{}, in);
      break;
    case DType::UInt16:
      if (allow_narrow_ints) return f(uint16_t{}, in);
      break;
    default: return float_kernel(c, f);
  }
  c.unsupported(c.node.op_type + " does not support dtype " + dtype_name(c.input(0).dtype()));
}

// ---------------------------------------------------------------- Reduce*
enum class Red { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

struct ReduceInfo {
  const char* name;
  Red kind;
  int axes_input_since;  // opset from which axes is an input (and noop_with_empty_axes exists)
};

const ReduceInfo kReductions[] = {
    {"ReduceSum", Red::Sum, 13},       {"ReduceMean", Red::Mean, 18},         {"ReduceMax", Red::Max, 18},
    {"ReduceMin", Red::Min, 18},       {"ReduceProd", Red::Prod, 18},         {"ReduceL1", Red::L1, 18},
    {"ReduceL2", Red::L2, 18},         {"ReduceLogSum", Red::LogSum, 18},     {"ReduceLogSumExp", Red::LogSumExp, 18},
    {"ReduceSumSquare", Red::SumSquare, 18},
};

// The axes to reduce (normalized, sorted, unique), or nullopt when they are not known (a
// non-constant axes input during inference). `noop` is set when the op is an identity.
std::optional<std::vector<int64_t>> reduce_axes(const Node& n, int64_t opset, int axes_input_since, const Tensor* axes_value,
                                                bool axes_input_present, int64_t rank, bool& noop) {
  noop = false;
  std::vector<int64_t> axes;
  if (opset >= axes_input_since) {
    if (axes_input_present) {
      if (!axes_value) return std::nullopt;
      axes = axes_value->to_int_vector();
    }
    if (axes.empty() && n.attrs.get_int("noop_with_empty_axes", 0) != 0) {
      noop = true;
      return axes;
    }
  } else {
    axes = n.attrs.get_ints("axes", {});
  }
  if (axes.empty())
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  for (auto& a : axes) {
    if (a < -rank || a >= rank)
      fail(ErrorKind::Shape, "axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank), {"", 0, 0, n.label(), n.op_type, int(opset)});
    if (a < 0) a += rank;
  }
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  return axes;
}

InferResult infer_reduce(const InferContext& c, int axes_input_since) {
  const TensorType& x = c.input(0);
  bool keep = c.node.attrs.get_int("keepdims", 1) != 0;
  if (!x.has_shape) return infer_one(TensorType::unknown_shape(x.dtype));
  bool noop = false;
  bool has_axes_in = c.opset >= axes_input_since && c.has_input(1);
  std::optional<std::vector<int64_t>> axes;
  try {
    axes = reduce_axes(c.node, c.opset, axes_input_since, has_axes_in ? c.value(1) : nullptr, has_axes_in, x.rank(), noop);
  } catch (const Error& e) {
    c.error(c.node.op_type + ": " + e.detail());
  }
  if (noop) return infer_one(x);
  if (!axes) {
    if (!keep) return infer_one(TensorType::unknown_shape(x.dtype));
    return infer_one(TensorType(x.dtype, std::vector<Dim>(x.dims.size())));
  }
  std::vector<Dim> out;
  for (int64_t i = 0; i < x.rank(); ++i) {
    bool red = std::binary_search(axes->begin(), axes->end(), i);
    if (!red) out.push_back(x.dims[size_t(i)]);
    else if (keep) out.emplace_back(1);
  }
  return infer_one(TensorType(x.dtype, out));
}

template <class T>
Tensor reduce_typed(const KernelContext& c, const Tensor& X, Red kind, const std::vector<int64_t>& axes, bool keep) {
  // Integer sums and products accumulate in 64-bit integers; everything else in double.
  using Acc = std::conditional_t<std::is_integral_v<T>, std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>, double>;
  if constexpr (std::is_same_v<T, bool>)
    if (kind != Red::Max && kind != Red::Min) c.unsupported(c.node.op_type + " does not support dtype bool");
  Shape kept = X.shape(), out_shape;
  for (auto a : axes) kept[size_t(a)] = 1;
  for (int64_t i = 0; i < X.rank(); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), i)) out_shape.push_back(X.dim(i));
    else if (keep) out_shape.push_back(1);
  size_t m = size_t(shape_numel(kept));
  int64_t count = m ? X.numel() / int64_t(m) : 0;
  const T* x = X.data<T>();
  Tensor Y(DTypeOf<T>::value, out_shape);
  T* y = Y.data<T>();
  bool in_double = kind == Red::L2 || kind == Red::LogSum || kind == Red::LogSumExp || kind == Red::Mean;
  if (kind == Red::Max || kind == Red::Min) {
    using Slot = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;  // not vector<bool>
    std::vector<Slot> acc(m, Slot(kind == Red::Max ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max()));
    if constexpr (std::is_floating_point_v<T>)
      std::fill(acc.begin(), acc.end(), kind == Red::Max ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity());
    for_each_broadcast(X.shape(), {kept}, [&](int64_t i, const int64_t* off) {
      Slot& a = acc[size_t(off[0])];
      Slot v = Slot(x[i]);
      if (kind == Red::Max ? (v > a || v != v) : (v < a || v != v)) a = v;
    });
    std::copy(acc.begin(), acc.end(), y);
    return Y;
  }
  if (in_double) {
    std::vector<double> acc(m, 0.0), mx;
    if (kind == Red::LogSumExp) {
      mx.assign(m, -std::numeric_limits<double>::infinity());
      for_each_broadcast(X.shape(), {kept}, [&](int64_t i, const int64_t* off) { mx[size_t(off[0])] = std::max(mx[size_t(off[0])], double(x[i])); });
      for (auto& v : mx)
        if (std::isinf(v)) v = 0;  // empty or all -inf: keep exp() finite
    }
    for_each_broadcast(X.shape(), {kept}, [&](int64_t i, const int64_t* off) {
      double v = double(x[i]);
      double& a = acc[size_t(off[0])];
      switch (kind) {
        case Red::L2: a += v * v; break;
        case Red::LogSumExp: a += std::exp(v - mx[size_t(off[0])]); break;
        default: a += v; break;
      }
    });
    for (size_t k = 0; k < m; ++k) {
      double r = acc[k];
      switch (kind) {
        case Red::Mean:
          if constexpr (std::is_integral_v<T>) r = std::trunc(r / double(count));
          else r = count ? r / double(count) : std::numeric_limits<double>::quiet_NaN();
          break;
        case Red::L2: r = std::sqrt(r); break;
        case Red::LogSum: r = std::log(r); break;
        case Red::LogSumExp: r = std::log(r) + mx[k]; break;
        default: break;
      }
      y[k] = T(r);
    }
    return Y;
  }
  std::vector<Acc> acc(m, kind == Red::Prod ? Acc(1) : Acc(0));
  for_each_broadcast(X.shape(), {kept}, [&](int64_t i, const int64_t* off) {
    Acc v = Acc(x[i]);
    Acc& a = acc[size_t(off[0])];
    switch (kind) {
      case Red::Prod: a *= v; break;
      case Red::L1:
        if constexpr (std::is_signed_v<Acc>) a += v < 0 ? -v : v;
        else a += v;
        break;
      case Red::SumSquare: a += v * v; break;
      default: a += v; break;
    }
  });
  for (size_t k = 0; k < m; ++k) y[k] = T(acc[k]);
  (void)c;
  return Y;
}

std::vector<Tensor> reduce_kernel(const KernelContext& c, const ReduceInfo& info) {
  const Tensor& X = c.input(0);
  bool keep = c.node.attrs.get_int("keepdims", 1) != 0;
  bool noop = false;
  bool has_axes_in = c.opset >= info.axes_input_since && c.has_input(1);
  std::optional<std::vector<int64_t>> axes;
  try {
    axes = reduce_axes(c.node, c.opset, info.axes_input_since, has_axes_in ? c.inputs[1] : nullptr, has_axes_in, X.rank(), noop);
  } catch (const Error& e) {
    c.error(e.detail());
  }
  if (noop) return {X.clone()};
  bool minmax = info.kind == Red::Max || info.kind == Red::Min;
  // int8/uint8 from opset 18, bool from opset 20 (Max: any, Min: all).
  return numeric_kernel(c, minmax && c.opset >= 18, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
    using T = decltype(tag);
    return {reduce_typed<T>(c, *in[0], info.kind, *axes, keep)};
  }, minmax && c.opset >= 20);
}

// ---------------------------------------------------------------- ArgMax / ArgMin
InferResult infer_arg(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (!x.has_shape) return infer_one(TensorType::unknown_shape(DType::Int64));
  int64_t axis = c.node.attrs.get_int("axis", 0);
  if (axis < -x.rank() || axis >= std::max<int64_t>(1, x.rank()))
    c.error(c.node.op_type + ": axis " + std::to_string(axis) + " is out of range for " + x.str());
  if (axis < 0) axis += x.rank();
  bool keep = c.node.attrs.get_int("keepdims", 1) != 0;
  std::vector<Dim> out;
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (i != axis) out.push_back(x.dims[size_t(i)]);
    else if (keep) out.emplace_back(1);
  }
  return infer_one(TensorType(DType::Int64, out));
}

template <class T>
Tensor arg_typed(const KernelContext& c, const Tensor& X, bool is_max) {
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 0), X.rank(), c.node);
  bool keep = c.node.attrs.get_int("keepdims", 1) != 0;
  bool last = c.node.attrs.get_int("select_last_index", 0) != 0;
  Shape out_shape;
  int64_t outer = 1, n = X.dim(axis), inner = 1;
  for (int64_t i = 0; i < X.rank(); ++i) {
    if (i < axis) outer *= X.dim(i);
    if (i > axis) inner *= X.dim(i);
    if (i != axis) out_shape.push_back(X.dim(i));
    else if (keep) out_shape.push_back(1);
  }
  if (n == 0) c.error("cannot take " + c.node.op_type + " over an empty axis of " + shape_str(X.shape()));
  Tensor Y(DType::Int64, out_shape);
  const T* x = X.data<T>();
  int64_t* y = Y.data<int64_t>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      const T* xs = x + o * n * inner + j;
      int64_t best = 0;
      for (int64_t i = 1; i < n; ++i) {
        T v = xs[i * inner], b = xs[best * inner];
        bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
        if (better) best = i;
      }
      y[o * inner + j] = best;
    }
  return Y;
}

// ---------------------------------------------------------------- CumSum, CumProd
// A running sum (CumSum) or product (CumProd, opset 26); exclusive starts from the identity.
template <class T>
Tensor cumulate_typed(const KernelContext& c, const Tensor& X, const Tensor& axis_t, bool product) {
  if (axis_t.numel() != 1) c.error("axis must be a scalar, got shape " + shape_str(axis_t.shape()));
  int64_t axis = normalize_axis(axis_t.as_int(0), X.rank(), c.node);
  bool exclusive = c.node.attrs.get_int("exclusive", 0) != 0, reverse = c.node.attrs.get_int("reverse", 0) != 0;
  const auto [outer, n, inner] = split_at(X.shape(), axis);
  Tensor Y(DTypeOf<T>::value, X.shape());
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      const T* xs = x + o * n * inner + j;
      T* ys = y + o * n * inner + j;
      T acc = product ? T(1) : T(0);
      for (int64_t s = 0; s < n; ++s) {
        int64_t i = reverse ? n - 1 - s : s;
        if (exclusive) {
          ys[i * inner] = acc;
          acc = product ? T(acc * xs[i * inner]) : T(acc + xs[i * inner]);
        } else {
          acc = product ? T(acc * xs[i * inner]) : T(acc + xs[i * inner]);
          ys[i * inner] = acc;
        }
      }
    }
  return Y;
}

// Reductions count one FLOP per input element.
OpSchema reduce_schema(const std::string& name, int since, int min_in, int max_in) {
  OpSchema s = nn_schema(name, since, min_in, max_in);
  s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) { return numel_or0(ins[0]); };
  return s;
}

}  // namespace

void register_nn_reduce_ops(OpRegistry& r) {
  for (const ReduceInfo& info : kReductions) {
    OpSchema s = reduce_schema(info.name, 1, 1, 2);
    const ReduceInfo* ip = &info;
    s.infer = [ip](const InferContext& c) { return infer_reduce(c, ip->axes_input_since); };
    s.kernel = [ip](const KernelContext& c) { return reduce_kernel(c, *ip); };
    r.add(std::move(s));
  }
  for (bool is_max : {true, false}) {
    OpSchema s = reduce_schema(is_max ? "ArgMax" : "ArgMin", 1, 1, 1);
    s.infer = infer_arg;
    s.kernel = [is_max](const KernelContext& c) {
      return numeric_kernel(c, true, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
        using T = decltype(tag);
        return {arg_typed<T>(c, *in[0], is_max)};
      });
    };
    r.add(std::move(s));
  }
  for (bool product : {false, true}) {
    OpSchema s = reduce_schema(product ? "CumProd" : "CumSum", product ? 26 : 11, 2, 2);
    s.infer = [](const InferContext& c) { return infer_same_as(c, 0); };
    s.kernel = [product](const KernelContext& c) {
      return numeric_kernel(c, false, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
        using T = decltype(tag);
        return {cumulate_typed<T>(c, *in[0], *in[1], product)};
      });
    };
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::nn
