// QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear: per-tensor, per-axis and blocked
// parameters; 8- and 16-bit integers and the low-precision types (float8, float4, int4/uint4,
// int2/uint2; graph/low_precision.h), as the ONNX reference computes them.
#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {
namespace {

// ---------------------------------------------------------------- Quantize / Dequantize
// Per-tensor, per-axis or blocked parameters: maps flat element i to the index of its parameter.
struct AxisParams {
  int64_t count = 1, inner = 1;  // per-axis: parameter count, and the stride of the axis in the data
  int64_t block = 0, axis_len = 1, blocks = 1;  // blocked (opset 21): block size along the axis
  int64_t at(int64_t i) const {
    if (block > 0) {
      int64_t o = i / (axis_len * inner), a = (i / inner) % axis_len, j = i % inner;
      return (o * blocks + a / block) * inner + j;
    }
    return count == 1 ? 0 : (i / inner) % count;
  }
};

AxisParams axis_params(const KernelContext& c, const Tensor& x, const Tensor& scale) {
  AxisParams p;
  int64_t block = c.node.attrs.get_int("block_size", 0);
  if (block > 0) {
    // Blocked quantization: the scale has the input's rank, with ceil(D / block_size) along axis.
    int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 1), x.rank(), c.node);
    bool ok = scale.rank() == x.rank();
    for (int64_t d = 0; ok && d < x.rank(); ++d)
      ok = d == axis ? scale.dim(d) == (x.dim(d) + block - 1) / block : scale.dim(d) == x.dim(d);
    if (!ok)
      c.error("blocked scale " + shape_str(scale.shape()) + " does not match input " + shape_str(x.shape()) + " with block_size " +
              std::to_string(block) + " along axis " + std::to_string(axis));
    p.block = block;
    p.axis_len = x.dim(axis);
    p.blocks = scale.dim(axis);
    for (int64_t d = axis + 1; d < x.rank(); ++d) p.inner *= x.dim(d);
    p.count = scale.numel();
    return p;
  }
  if (scale.numel() == 1 && scale.rank() <= 1) return p;
  if (scale.rank() != 1) c.error("scale of shape " + shape_str(scale.shape()) + " must be a scalar or 1-D");
  int64_t axis = normalize_axis(c.node.attrs.get_int("axis", 1), x.rank(), c.node);
  if (x.dim(axis) != scale.numel())
    c.error("per-axis scale has " + std::to_string(scale.numel()) + " elements but input " + shape_str(x.shape()) +
            " has " + std::to_string(x.dim(axis)) + " along axis " + std::to_string(axis));
  p.count = scale.numel();
  for (int64_t d = axis + 1; d < x.rank(); ++d) p.inner *= x.dim(d);
  return p;
}

DType quantize_out_dtype(const Node& n, DType zp_dtype) {
  if (zp_dtype != DType::Undefined) return zp_dtype;
  int64_t od = n.attrs.get_int("output_dtype", 0);
  return od ? DType(od) : DType::UInt8;
}

// x / scale rounded half to even (division in float, then the default rounding mode, as the
// spec's ops do), shifted by the zero point and clamped to [lo, hi]; store(i, v) writes element i.
template <class Store>
void quantize_clamped(const float* x, int64_t n, const std::vector<float>& scale, const std::vector<double>& zp, const AxisParams& ap,
                      double lo, double hi, Store store) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = ap.at(i);
    const double v = double(std::nearbyint(x[i] / scale[size_t(k)])) + zp[size_t(k)];
    store(i, std::min(hi, std::max(lo, v)));
  }
}

template <class Q>
void quantize_into(const float* x, int64_t n, const std::vector<float>& scale, const std::vector<double>& zp,
                   const AxisParams& ap, Q* out) {
  quantize_clamped(x, n, scale, zp, ap, double(std::numeric_limits<Q>::lowest()), double(std::numeric_limits<Q>::max()),
                   [&](int64_t i, double v) { out[i] = Q(v); });
}

// To int4/uint4/int2/uint2: rounded, shifted by the zero point and clamped, like the 8-bit types.
// To float8: x / scale cast as Cast does (saturating unless `saturate` is 0); the zero point,
// which must be 0 there, is not added. To float4e2m1: x / scale + zero point, saturating.
void quantize_low_precision(const KernelContext& c, const float* x, int64_t n, const std::vector<float>& scale,
                            const std::vector<double>& zp, const AxisParams& ap, Tensor& out) {
  const DType od = out.dtype();
  auto* codes = static_cast<uint8_t*>(out.raw());
  if (low_precision_is_integer(od)) {
    const auto [lo, hi] = low_precision_int_range(od);
    quantize_clamped(x, n, scale, zp, ap, double(lo), double(hi),
                     [&](int64_t i, double v) { codes[i] = wrap_to_low_precision_int(od, int64_t(v)); });
    return;
  }
  if (od == DType::Float8E8M0) c.unsupported("QuantizeLinear does not support output dtype float8_e8m0fnu");
  LowPrecisionCast o;
  o.saturate = c.node.attrs.get_int("saturate", 1) != 0;
  const bool add_zero_point = od == DType::Float4E2M1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = ap.at(i);
    const float q = x[i] / scale[size_t(k)];
    codes[i] = float_to_low_precision(od, add_zero_point ? double(q) + zp[size_t(k)] : double(q), o);
  }
}

std::vector<Tensor> quantize_kernel(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& s = c.input(1);
  const Tensor* zp = c.has_input(2) ? c.inputs[2] : nullptr;
  if (!is_floatish(x.dtype()) && x.dtype() != DType::Int32)
    c.unsupported(std::string("QuantizeLinear does not support input dtype ") + dtype_name(x.dtype()));
  DType od = quantize_out_dtype(c.node, zp ? zp->dtype() : DType::Undefined);
  AxisParams ap = axis_params(c, x, s);
  if (zp && zp->numel() != s.numel()) c.error("zero point and scale have different sizes");
  Tensor xf = x.dtype() == DType::Float32 ? x : x.cast(DType::Float32);
  std::vector<float> scale = s.to_float_vector();
  std::vector<double> z(scale.size(), 0.0);
  if (zp)
    for (size_t i = 0; i < z.size(); ++i) z[i] = zp->as_double(int64_t(i));
  Tensor out(od, x.shape());
  if (dtype_is_low_precision(od)) {
    quantize_low_precision(c, xf.data<float>(), x.numel(), scale, z, ap, out);
    return {out};
  }
  switch (od) {
    case DType::UInt8: quantize_into(xf.data<float>(), x.numel(), scale, z, ap, out.data<uint8_t>()); break;
    case DType::Int8: quantize_into(xf.data<float>(), x.numel(), scale, z, ap, out.data<int8_t>()); break;
    case DType::UInt16: quantize_into(xf.data<float>(), x.numel(), scale, z, ap, out.data<uint16_t>()); break;
    case DType::Int16: quantize_into(xf.data<float>(), x.numel(), scale, z, ap, out.data<int16_t>()); break;
    default: c.unsupported(std::string("QuantizeLinear does not support output dtype ") + dtype_name(od));
  }
  return {out};
}

// The output type: the attribute output_dtype (opset 23 on) when set, else the scale's.
DType dequantize_out_dtype(const Node& n, int64_t opset, DType scale) {
  const int64_t od = opset >= 23 ? n.attrs.get_int("output_dtype", 0) : 0;
  if (od == 0) return scale == DType::Undefined ? DType::Float32 : scale;
  const DType t = DType(od);
  if (t != DType::Float32 && t != DType::Float16 && t != DType::BFloat16)
    fail(ErrorKind::Model, "DequantizeLinear: output_dtype " + std::to_string(od) + " is not float, float16 or bfloat16", {"", 0, 0, n.label(), n.op_type});
  return t;
}

std::vector<Tensor> dequantize_kernel(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& s = c.input(1);
  const Tensor* zp = c.has_input(2) ? c.inputs[2] : nullptr;
  DType xt = x.dtype();
  if (xt != DType::UInt8 && xt != DType::Int8 && xt != DType::Int32 && xt != DType::UInt16 && xt != DType::Int16 &&
      (!dtype_is_low_precision(xt) || xt == DType::Float8E8M0))
    c.unsupported(std::string("DequantizeLinear does not support input dtype ") + dtype_name(xt));
  if (!is_floatish(s.dtype())) c.unsupported(std::string("DequantizeLinear does not support scale dtype ") + dtype_name(s.dtype()));
  if (zp && zp->dtype() != xt)
    c.error(std::string("zero point dtype ") + dtype_name(zp->dtype()) + " differs from input dtype " + dtype_name(xt));
  AxisParams ap = axis_params(c, x, s);
  if (zp && zp->numel() != s.numel()) c.error("zero point and scale have different sizes");
  std::vector<float> scale = s.to_float_vector();
  std::vector<float> z(scale.size(), 0.f);
  if (zp)
    for (size_t i = 0; i < z.size(); ++i) z[i] = float(zp->as_double(int64_t(i)));
  Tensor out(DType::Float32, x.shape());
  float* o = out.data<float>();
  int64_t n = x.numel();
  if (dtype_is_low_precision(xt)) {
    const auto* codes = static_cast<const uint8_t*>(x.raw());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = ap.at(i);
      o[i] = (float(low_precision_to_double(xt, codes[i])) - z[size_t(k)]) * scale[size_t(k)];
    }
  } else dispatch_dtype(xt, [&](auto tag) {
    using Q = decltype(tag);
    if constexpr (std::is_integral_v<Q>) {
      const Q* p = x.data<Q>();
      for (int64_t i = 0; i < n; ++i) {
        int64_t k = ap.at(i);
        o[i] = (float(p[i]) - z[size_t(k)]) * scale[size_t(k)];
      }
    }
  });
  const DType od = dequantize_out_dtype(c.node, c.opset, s.dtype());
  if (od != DType::Float32) return {out.cast(od)};
  return {out};
}

// ---------------------------------------------------------------- DynamicQuantizeLinear
// uint8 with a scale and zero point from the data's range widened to hold 0: scale =
// (max(0, max x) - min(0, min x)) / 255 (1/255 when that range is empty), zero point =
// round(clamp(-min / scale, 0, 255)), y = clamp(round(x / scale) + zero point, 0, 255); rounding
// half to even. ONNX Runtime's quantize_dynamic writes it before every MatMulInteger.
std::vector<Tensor> dynamic_quantize_kernel(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (x.dtype() != DType::Float32) c.unsupported(std::string("DynamicQuantizeLinear does not support input dtype ") + dtype_name(x.dtype()));
  const float* p = x.data<float>();
  float lo = 0.f, hi = 0.f;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::isnan(p[i])) c.error("the input holds NaN, which has no quantized value");
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  const float scale = (hi == lo ? 1.0f : hi - lo) / 255.0f;
  const float zp = std::nearbyint(std::clamp(0.0f - lo / scale, 0.0f, 255.0f));
  Tensor y(DType::UInt8, x.shape());
  uint8_t* q = y.data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) q[i] = uint8_t(std::clamp(std::nearbyint(p[i] / scale) + zp, 0.0f, 255.0f));
  return {y, Tensor::scalar<float>(scale), Tensor::scalar<uint8_t>(uint8_t(zp))};
}

}  // namespace

void register_nn_quantize_ops(OpRegistry& r) {
  {
    OpSchema s = nn_schema("QuantizeLinear", 10, 2, 3, 1, 1, MappingType::OneToOne);
    s.infer = [](const InferContext& c) {
      DType zp = c.has_input(2) ? c.input(2).dtype : DType::Undefined;
      TensorType t = c.input(0);
      t.dtype = quantize_out_dtype(c.node, zp);
      return infer_one(t);
    };
    s.kernel = quantize_kernel;
    s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) { return 2 * numel_or0(ins[0]); };
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("DequantizeLinear", 10, 2, 3, 1, 1, MappingType::OneToOne);
    s.infer = [](const InferContext& c) {
      TensorType t = c.input(0);
      t.dtype = dequantize_out_dtype(c.node, c.opset, c.input(1).dtype);
      return infer_one(t);
    };
    s.kernel = dequantize_kernel;
    s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) { return 2 * numel_or0(ins[0]); };
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("DynamicQuantizeLinear", 11, 1, 1, 3, 3, MappingType::ManyToMany);
    s.infer = [](const InferContext& c) {
      if (c.input(0).dtype != DType::Float32 && c.input(0).dtype != DType::Undefined)
        fail(ErrorKind::Unsupported, std::string("DynamicQuantizeLinear does not support input dtype ") + dtype_name(c.input(0).dtype),
             ErrorContext{"", 0, 0, c.node.label(), c.node.op_type, int(c.opset)});
      InferResult r;
      TensorType y = c.input(0);
      y.dtype = DType::UInt8;
      r.outputs = {y, TensorType(DType::Float32, std::vector<Dim>{}), TensorType(DType::UInt8, std::vector<Dim>{})};
      return r;
    };
    s.kernel = dynamic_quantize_kernel;
    s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) { return 4 * numel_or0(ins[0]); };
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::nn
