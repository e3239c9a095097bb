// Conv, ConvTranspose and the pooling ops. Every kernel works on 3 spatial dims: 1-D and 2-D
// inputs are viewed with leading spatial dims of size 1 (kernel 1, stride 1, no padding), so one
// code path serves 1-D, 2-D and 3-D.
#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {
namespace {

std::string ints_str(const std::vector<int64_t>& v) {
  std::string r = "[";
  for (size_t i = 0; i < v.size(); ++i) r += (i ? "," : "") + std::to_string(v[i]);
  return r + "]";
}

// Geometry of a sliding window over the spatial dims. Sizes of -1 are unknown (inference only).
struct Window {
  size_t nsp = 0;
  std::vector<int64_t> in, k, stride, dil, pad_b, pad_e, out;
};

// Reads strides/dilations/pads/auto_pad and computes output sizes. `ceil_mode` only for pools.
Window make_window(const Node& n, const std::vector<int64_t>& in, const std::vector<int64_t>& k, bool ceil_mode,
                   const std::function<void(const std::string&)>& error) {
  Window w;
  w.nsp = in.size();
  w.in = in;
  w.k = k;
  if (k.size() != w.nsp) error("kernel_shape " + ints_str(k) + " does not match " + std::to_string(w.nsp) + " spatial dims");
  w.stride = n.attrs.get_ints("strides", std::vector<int64_t>(w.nsp, 1));
  w.dil = n.attrs.get_ints("dilations", std::vector<int64_t>(w.nsp, 1));
  if (w.stride.empty()) w.stride.assign(w.nsp, 1);
  if (w.dil.empty()) w.dil.assign(w.nsp, 1);
  if (w.stride.size() != w.nsp) error("strides " + ints_str(w.stride) + " do not match " + std::to_string(w.nsp) + " spatial dims");
  if (w.dil.size() != w.nsp) error("dilations " + ints_str(w.dil) + " do not match " + std::to_string(w.nsp) + " spatial dims");
  for (size_t i = 0; i < w.nsp; ++i)
    if (w.stride[i] < 1 || w.dil[i] < 1 || w.k[i] < 1) error("strides, dilations and kernel sizes must be positive");
  std::string ap = n.attrs.get_string("auto_pad", "NOTSET");
  w.pad_b.assign(w.nsp, 0);
  w.pad_e.assign(w.nsp, 0);
  w.out.assign(w.nsp, -1);
  if (ap == "NOTSET" || ap.empty()) {
    auto pads = n.attrs.get_ints("pads", std::vector<int64_t>(2 * w.nsp, 0));
    if (pads.empty()) pads.assign(2 * w.nsp, 0);
    if (pads.size() != 2 * w.nsp) error("pads " + ints_str(pads) + " must have " + std::to_string(2 * w.nsp) + " values");
    for (size_t i = 0; i < w.nsp; ++i) {
      w.pad_b[i] = pads[i];
      w.pad_e[i] = pads[i + w.nsp];
    }
    for (size_t i = 0; i < w.nsp; ++i) {
      if (in[i] < 0) continue;
      int64_t dk = (k[i] - 1) * w.dil[i] + 1;
      int64_t span = in[i] + w.pad_b[i] + w.pad_e[i] - dk;
      if (span < 0) error("kernel extent " + std::to_string(dk) + " exceeds padded input " + std::to_string(in[i] + w.pad_b[i] + w.pad_e[i]));
      int64_t o = (ceil_mode ? (span + w.stride[i] - 1) / w.stride[i] : span / w.stride[i]) + 1;
      // A window may not start in the end padding.
      if (ceil_mode && (o - 1) * w.stride[i] >= in[i] + w.pad_b[i]) --o;
      w.out[i] = o;
    }
  } else if (ap == "VALID") {
    for (size_t i = 0; i < w.nsp; ++i) {
      if (in[i] < 0) continue;
      int64_t dk = (k[i] - 1) * w.dil[i] + 1;
      if (in[i] < dk) error("kernel extent " + std::to_string(dk) + " exceeds input " + std::to_string(in[i]));
      int64_t span = in[i] - dk;
      w.out[i] = (ceil_mode ? (span + w.stride[i] - 1) / w.stride[i] : span / w.stride[i]) + 1;
    }
  } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    for (size_t i = 0; i < w.nsp; ++i) {
      if (in[i] < 0) continue;
      int64_t dk = (k[i] - 1) * w.dil[i] + 1;
      int64_t o = (in[i] + w.stride[i] - 1) / w.stride[i];
      int64_t total = std::max<int64_t>(0, (o - 1) * w.stride[i] + dk - in[i]);
      w.pad_b[i] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.pad_e[i] = total - w.pad_b[i];
      w.out[i] = o;
    }
  } else {
    error("unknown auto_pad '" + ap + "'");
  }
  return w;
}

// The window padded to exactly 3 spatial dims (leading dims of size 1).
Window to3d(const Window& w) {
  Window r = w;
  size_t extra = 3 - w.nsp;
  auto pad = [&](std::vector<int64_t>& v, int64_t fill) { v.insert(v.begin(), extra, fill); };
  pad(r.in, 1);
  pad(r.k, 1);
  pad(r.stride, 1);
  pad(r.dil, 1);
  pad(r.pad_b, 0);
  pad(r.pad_e, 0);
  pad(r.out, 1);
  r.nsp = 3;
  return r;
}

std::vector<int64_t> spatial_of(const std::vector<Dim>& d) {
  std::vector<int64_t> r;
  for (size_t i = 2; i < d.size(); ++i) r.push_back(d[i].known() ? d[i].value : -1);
  return r;
}

std::vector<int64_t> spatial_of(const Shape& s) { return Shape(s.begin() + 2, s.end()); }

// ---------------------------------------------------------------- Conv
std::vector<int64_t> conv_kernel_shape(const Node& n, const std::vector<Dim>* wdims, const Shape* wshape) {
  if (auto ks = n.attrs.opt_ints("kernel_shape")) return *ks;
  std::vector<int64_t> k;
  if (wshape) return Shape(wshape->begin() + 2, wshape->end());
  if (wdims)
    for (size_t i = 2; i < wdims->size(); ++i) k.push_back((*wdims)[i].known() ? (*wdims)[i].value : -1);
  return k;
}

InferResult infer_conv(const InferContext& c) {
  const TensorType& x = c.input(0);
  const TensorType& w = c.input(1);
  if (!x.has_shape) return infer_one(TensorType::unknown_shape(x.dtype));
  if (x.rank() < 3) c.error("Conv: input " + x.str() + " must have rank >= 3 (N, C, spatial...)");
  if (x.dtype != w.dtype && w.dtype != DType::Undefined)
    c.error(std::string("Conv: input is ") + dtype_name(x.dtype) + " but weight is " + dtype_name(w.dtype));
  int64_t group = c.node.attrs.get_int("group", 1);
  if (group < 1) c.error("Conv: group must be >= 1");
  Dim cout;
  if (w.has_shape) {
    if (w.rank() != x.rank()) c.error("Conv: weight " + w.str() + " must have the rank of the input " + x.str());
    cout = w.dims[0];
    const Dim& cin = x.dims[1];
    const Dim& cw = w.dims[1];
    if (cin.known() && cw.known() && cin.value != cw.value * group)
      c.error("Conv: input has " + std::to_string(cin.value) + " channels but weight expects " + std::to_string(cw.value * group) +
              " (group=" + std::to_string(group) + ")");
    if (cout.known() && cout.value % group != 0)
      c.error("Conv: " + std::to_string(cout.value) + " output channels are not divisible by group=" + std::to_string(group));
  }
  if (c.has_input(2) && c.input(2).has_shape) {
    const TensorType& b = c.input(2);
    if (b.rank() != 1 || (b.dims[0].known() && cout.known() && b.dims[0].value != cout.value))
      c.error("Conv: bias " + b.str() + " must be 1-D with " + cout.str() + " elements");
  }
  std::vector<int64_t> k = conv_kernel_shape(c.node, w.has_shape ? &w.dims : nullptr, nullptr);
  std::vector<Dim> out{x.dims[0], cout};
  size_t nsp = size_t(x.rank() - 2);
  bool k_known = k.size() == nsp && std::all_of(k.begin(), k.end(), [](int64_t v) { return v > 0; });
  if (!k_known) {
    if (!k.empty() && k.size() != nsp) c.error("Conv: kernel_shape " + ints_str(k) + " does not match input " + x.str());
    for (size_t i = 0; i < nsp; ++i) out.emplace_back();
    return infer_one(TensorType(x.dtype, out));
  }
  Window win = make_window(c.node, spatial_of(x.dims), k, false, [&](const std::string& m) { c.error("Conv: " + m); });
  for (size_t i = 0; i < nsp; ++i) out.push_back(win.out[i] >= 0 ? Dim(win.out[i]) : Dim());
  return infer_one(TensorType(x.dtype, out));
}

template <class T>
void im2col3d(const T* x, int64_t C, const Window& w, T* col) {
  const int64_t ID = w.in[0], IH = w.in[1], IW = w.in[2];
  const int64_t OD = w.out[0], OH = w.out[1], OW = w.out[2];
  const int64_t osp = OD * OH * OW;
  int64_t row = 0;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t kd = 0; kd < w.k[0]; ++kd)
      for (int64_t kh = 0; kh < w.k[1]; ++kh)
        for (int64_t kw = 0; kw < w.k[2]; ++kw, ++row) {
          T* dst = col + row * osp;
          // Valid output column range for this kernel column: 0 <= ow*s - p + kw*d < IW.
          const int64_t off_w = kw * w.dil[2] - w.pad_b[2];
          int64_t ow_lo = off_w >= 0 ? 0 : (-off_w + w.stride[2] - 1) / w.stride[2];
          int64_t ow_hi = IW - off_w <= 0 ? 0 : (IW - off_w - 1) / w.stride[2] + 1;
          ow_lo = std::min(ow_lo, OW);
          ow_hi = std::max(ow_lo, std::min(ow_hi, OW));
          for (int64_t od = 0; od < OD; ++od) {
            int64_t id = od * w.stride[0] - w.pad_b[0] + kd * w.dil[0];
            for (int64_t oh = 0; oh < OH; ++oh, dst += OW) {
              int64_t ih = oh * w.stride[1] - w.pad_b[1] + kh * w.dil[1];
              if (id < 0 || id >= ID || ih < 0 || ih >= IH) {
                std::fill(dst, dst + OW, T(0));
                continue;
              }
              const T* src = x + ((c * ID + id) * IH + ih) * IW + off_w;
              std::fill(dst, dst + ow_lo, T(0));
              if (w.stride[2] == 1)
                std::copy(src + ow_lo, src + ow_hi, dst + ow_lo);
              else
                for (int64_t ow = ow_lo; ow < ow_hi; ++ow) dst[ow] = src[ow * w.stride[2]];
              std::fill(dst + ow_hi, dst + OW, T(0));
            }
          }
        }
}

template <class T>
Tensor conv_typed(const KernelContext& c, const Tensor& X, const Tensor& W, const Tensor* B) {
  if (X.rank() < 3 || X.rank() > 5) c.unsupported("Conv with input rank " + std::to_string(X.rank()) + " (supported: 1-D to 3-D spatial)");
  if (W.rank() != X.rank()) c.error("weight " + shape_str(W.shape()) + " must have the rank of the input " + shape_str(X.shape()));
  int64_t group = c.node.attrs.get_int("group", 1);
  int64_t N = X.dim(0), Cin = X.dim(1), Cout = W.dim(0), Cin_g = W.dim(1);
  if (group < 1 || Cin != Cin_g * group)
    c.error("input has " + std::to_string(Cin) + " channels but weight expects " + std::to_string(Cin_g * group) +
            " (group=" + std::to_string(group) + ")");
  if (Cout % group != 0) c.error(std::to_string(Cout) + " output channels are not divisible by group=" + std::to_string(group));
  std::vector<int64_t> k = conv_kernel_shape(c.node, nullptr, &W.shape());
  if (k != spatial_of(W.shape())) c.error("kernel_shape " + ints_str(k) + " does not match weight " + shape_str(W.shape()));
  if (B && (B->rank() != 1 || B->numel() != Cout)) c.error("bias " + shape_str(B->shape()) + " must be 1-D with " + std::to_string(Cout) + " elements");
  Window w = make_window(c.node, spatial_of(X.shape()), k, false, [&](const std::string& m) { c.error(m); });
  Shape out_shape{N, Cout};
  for (auto o : w.out) out_shape.push_back(o);
  Tensor Y(DTypeOf<T>::value, out_shape);
  Window w3 = to3d(w);
  const int64_t Cout_g = Cout / group;
  const int64_t isp = w3.in[0] * w3.in[1] * w3.in[2], osp = w3.out[0] * w3.out[1] * w3.out[2];
  const int64_t kvol = w3.k[0] * w3.k[1] * w3.k[2];
  const T* x = X.data<T>();
  const T* wt = W.data<T>();
  T* y = Y.data<T>();
  if (Cin_g == 1 && group > 1) {
    // Depthwise: a direct loop; as a GEMM it would be a 1-row product per channel.
    for (int64_t n = 0; n < N; ++n)
      for (int64_t co = 0; co < Cout; ++co) {
        const T* xc = x + (n * Cin + co / Cout_g) * isp;
        const T* wk = wt + co * kvol;
        T* yc = y + (n * Cout + co) * osp;
        for (int64_t od = 0; od < w3.out[0]; ++od)
          for (int64_t oh = 0; oh < w3.out[1]; ++oh)
            for (int64_t ow = 0; ow < w3.out[2]; ++ow) {
              T acc = T(0);
              for (int64_t kd = 0; kd < w3.k[0]; ++kd) {
                int64_t id = od * w3.stride[0] - w3.pad_b[0] + kd * w3.dil[0];
                if (id < 0 || id >= w3.in[0]) continue;
                for (int64_t kh = 0; kh < w3.k[1]; ++kh) {
                  int64_t ih = oh * w3.stride[1] - w3.pad_b[1] + kh * w3.dil[1];
                  if (ih < 0 || ih >= w3.in[1]) continue;
                  const T* xr = xc + (id * w3.in[1] + ih) * w3.in[2];
                  const T* wr = wk + (kd * w3.k[1] + kh) * w3.k[2];
                  for (int64_t kw = 0; kw < w3.k[2]; ++kw) {
                    int64_t iw = ow * w3.stride[2] - w3.pad_b[2] + kw * w3.dil[2];
                    if (iw >= 0 && iw < w3.in[2]) acc += xr[iw] * wr[kw];
                  }
                }
              }
              yc[(od * w3.out[1] + oh) * w3.out[2] + ow] = acc;
            }
      }
  } else {
    bool pointwise = kvol == 1 && osp == isp;
    for (size_t i = 0; i < 3; ++i) pointwise = pointwise && w3.stride[i] == 1 && w3.pad_b[i] == 0;
    const int64_t Kdim = Cin_g * kvol;
    std::vector<T> col(pointwise ? 0 : size_t(Kdim * osp));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < group; ++g) {
        const T* xg = x + (n * Cin + g * Cin_g) * isp;
        const T* colp = xg;
        if (!pointwise) {
          im2col3d(xg, Cin_g, w3, col.data());
          colp = col.data();
        }
        gemm<T>(Cout_g, osp, Kdim, wt + g * Cout_g * Kdim, Kdim, 1, colp, osp, 1, y + (n * Cout + g * Cout_g) * osp, osp, false);
      }
  }
  if (B) {
    const T* b = B->data<T>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t co = 0; co < Cout; ++co) {
        T* yc = y + (n * Cout + co) * osp;
        for (int64_t i = 0; i < osp; ++i) yc[i] += b[co];
      }
  }
  return Y;
}

double conv_flops(const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
  if (ins.size() < 2 || !ins[1].is_static() || outs.empty()) return 0;
  double kv = 1;
  for (size_t i = 1; i < ins[1].dims.size(); ++i) kv *= double(ins[1].dims[i].value);  // (Cin/group) * prod(kernel)
  return 2.0 * numel_or0(outs[0]) * kv;
}

// ---------------------------------------------------------------- ConvInteger / QLinearConv
// x - x_zp (scalar zero point), or w - w_zp (scalar or one per output channel), widened to int32.
Tensor widen_int8(const KernelContext& c, const Tensor& t, const Tensor* zp, const char* what) {
  if (t.dtype() != DType::UInt8 && t.dtype() != DType::Int8)
    c.unsupported(c.node.op_type + " does not support dtype " + dtype_name(t.dtype()) + " for " + what);
  if (zp && zp->dtype() != t.dtype())
    c.error(std::string(what) + " zero point dtype " + dtype_name(zp->dtype()) + " differs from " + dtype_name(t.dtype()));
  int64_t per = 1, n = t.numel();
  if (zp && zp->numel() != 1) {
    if (zp->numel() != t.dim(0)) c.error(std::string(what) + " zero point " + shape_str(zp->shape()) + " must have 1 or " + std::to_string(t.dim(0)) + " elements");
    per = t.dim(0);
  }
  int64_t inner = per > 1 ? n / per : n;
  Tensor out(DType::Int32, t.shape());
  int32_t* o = out.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    int32_t z = zp ? int32_t(zp->as_int(per > 1 ? i / inner : 0)) : 0;
    o[i] = int32_t(t.dtype() == DType::UInt8 ? int32_t(t.data<uint8_t>()[i]) : int32_t(t.data<int8_t>()[i])) - z;
  }
  return out;
}

std::vector<Tensor> conv_integer_kernel(const KernelContext& c) {
  Tensor x = widen_int8(c, c.input(0), c.has_input(2) ? c.inputs[2] : nullptr, "x");
  Tensor w = widen_int8(c, c.input(1), c.has_input(3) ? c.inputs[3] : nullptr, "w");
  if (c.has_input(2) && c.input(2).numel() != 1) c.unsupported("ConvInteger with a per-channel input zero point");
  return {conv_typed<int32_t>(c, x, w, nullptr)};
}

std::vector<Tensor> qlinear_conv_kernel(const KernelContext& c) {
  if (c.input(2).numel() != 1 || c.input(1).numel() != 1) c.unsupported("QLinearConv with a per-channel input scale or zero point");
  Tensor x = widen_int8(c, c.input(0), &c.input(2), "x");
  Tensor w = widen_int8(c, c.input(3), &c.input(5), "w");
  Tensor acc = conv_typed<int32_t>(c, x, w, nullptr);
  int64_t M = acc.dim(1), sp = acc.numel() / std::max<int64_t>(1, acc.dim(0) * M);
  std::vector<float> ws = c.input(4).to_float_vector();
  if (ws.size() != 1 && int64_t(ws.size()) != M) c.error("w_scale must have 1 or " + std::to_string(M) + " elements");
  const Tensor* B = c.has_input(8) ? c.inputs[8] : nullptr;
  if (B && (B->dtype() != DType::Int32 || B->numel() != M)) c.error("bias must be int32 with " + std::to_string(M) + " elements");
  double xs = c.input(1).as_double(0), ys = c.input(6).as_double(0);
  const Tensor& yzp = c.input(7);
  if (yzp.numel() != 1 || c.input(6).numel() != 1) c.unsupported("QLinearConv with a per-channel output scale");
  double z = yzp.as_double(0);
  Tensor Y(yzp.dtype(), acc.shape());
  const int32_t* p = acc.data<int32_t>();
  auto emit = [&](auto tag) {
    using Q = decltype(tag);
    Q* y = Y.data<Q>();
    const double lo = double(std::numeric_limits<Q>::lowest()), hi = double(std::numeric_limits<Q>::max());
    for (int64_t i = 0; i < acc.numel(); ++i) {
      int64_t m = (i / sp) % M;
      double v = double(p[i]) + (B ? double(B->data<int32_t>()[m]) : 0.0);
      v = std::nearbyint(v * xs * double(ws[ws.size() == 1 ? 0 : size_t(m)]) / ys) + z;
      y[i] = Q(std::min(hi, std::max(lo, v)));
    }
  };
  if (yzp.dtype() == DType::UInt8) emit(uint8_t{});
  else if (yzp.dtype() == DType::Int8) emit(int8_t{});
  else c.unsupported(std::string("QLinearConv does not support output dtype ") + dtype_name(yzp.dtype()));
  return {Y};
}

// Inference of the integer convolutions: Conv's shapes with another output dtype.
InferResult infer_conv_as(const InferContext& c, size_t w_index, DType out) {
  std::vector<TensorType> ins{c.input(0), c.input(w_index)};
  ins[1].dtype = ins[0].dtype;
  Node n = c.node;
  n.inputs = {c.node.inputs[0], c.node.inputs[w_index]};
  InferContext sub{n, c.opset, ins, {nullptr, nullptr}, {std::nullopt, std::nullopt}};
  InferResult r = infer_conv(sub);
  r.outputs[0].dtype = out;
  return r;
}

// ---------------------------------------------------------------- ConvTranspose
// Output sizes and pads of a transposed convolution (the spec's formulas).
Window convtranspose_window(const Node& n, const std::vector<int64_t>& in, const std::vector<int64_t>& k,
                            const std::function<void(const std::string&)>& error) {
  Window w;
  w.nsp = in.size();
  w.in = in;
  w.k = k;
  auto get = [&](const char* name, int64_t dflt) {
    auto v = n.attrs.get_ints(name, std::vector<int64_t>(w.nsp, dflt));
    if (v.empty()) v.assign(w.nsp, dflt);
    if (v.size() != w.nsp) error(std::string(name) + " " + ints_str(v) + " does not match " + std::to_string(w.nsp) + " spatial dims");
    return v;
  };
  w.stride = get("strides", 1);
  w.dil = get("dilations", 1);
  std::vector<int64_t> opad = get("output_padding", 0);
  std::string ap = n.attrs.get_string("auto_pad", "NOTSET");
  auto out_shape = n.attrs.opt_ints("output_shape");
  w.pad_b.assign(w.nsp, 0);
  w.pad_e.assign(w.nsp, 0);
  w.out.assign(w.nsp, -1);
  if (out_shape && out_shape->size() > w.nsp) out_shape = std::vector<int64_t>(out_shape->end() - int64_t(w.nsp), out_shape->end());
  if (out_shape && out_shape->size() != w.nsp) error("output_shape " + ints_str(*out_shape) + " does not match " + std::to_string(w.nsp) + " spatial dims");
  bool same = ap == "SAME_UPPER" || ap == "SAME_LOWER";
  if (!out_shape && !same) {
    auto pads = n.attrs.get_ints("pads", std::vector<int64_t>(2 * w.nsp, 0));
    if (pads.empty()) pads.assign(2 * w.nsp, 0);
    if (ap != "VALID" && pads.size() != 2 * w.nsp) error("pads " + ints_str(pads) + " must have " + std::to_string(2 * w.nsp) + " values");
    for (size_t i = 0; i < w.nsp; ++i) {
      if (ap != "VALID") {
        w.pad_b[i] = pads[i];
        w.pad_e[i] = pads[i + w.nsp];
      }
      if (in[i] >= 0) w.out[i] = w.stride[i] * (in[i] - 1) + opad[i] + (k[i] - 1) * w.dil[i] + 1 - w.pad_b[i] - w.pad_e[i];
    }
    return w;
  }
  for (size_t i = 0; i < w.nsp; ++i) {
    if (in[i] < 0) continue;
    int64_t o = out_shape ? (*out_shape)[i] : in[i] * w.stride[i];
    int64_t total = w.stride[i] * (in[i] - 1) + opad[i] + (k[i] - 1) * w.dil[i] + 1 - o;
    if (total < 0) total = 0;  // the output extends past the last window: the rest stays bias-only
    if (ap == "SAME_UPPER") {
      w.pad_b[i] = total / 2;
      w.pad_e[i] = total - total / 2;
    } else {
      w.pad_b[i] = total - total / 2;
      w.pad_e[i] = total / 2;
    }
    w.out[i] = o;
  }
  return w;
}

InferResult infer_convtranspose(const InferContext& c) {
  const TensorType& x = c.input(0);
  const TensorType& w = c.input(1);
  if (!x.has_shape) return infer_one(TensorType::unknown_shape(x.dtype));
  if (x.rank() < 3) c.error("ConvTranspose: input " + x.str() + " must have rank >= 3");
  int64_t group = c.node.attrs.get_int("group", 1);
  if (group < 1) c.error("ConvTranspose: group must be >= 1");
  if (x.dims[1].known() && group > std::max<int64_t>(x.dims[1].value, 1))
    c.error("ConvTranspose: group=" + std::to_string(group) + " exceeds the " + x.dims[1].str() + " input channels");
  Dim cout;
  if (w.has_shape) {
    if (w.rank() != x.rank()) c.error("ConvTranspose: weight " + w.str() + " must have the rank of the input " + x.str());
    if (x.dims[1].known() && w.dims[0].known() && x.dims[1].value != w.dims[0].value)
      c.error("ConvTranspose: input has " + x.dims[1].str() + " channels but weight expects " + w.dims[0].str());
    cout = dim_mul(w.dims[1], Dim(group));
  }
  std::vector<int64_t> k = conv_kernel_shape(c.node, w.has_shape ? &w.dims : nullptr, nullptr);
  size_t nsp = size_t(x.rank() - 2);
  std::vector<Dim> out{x.dims[0], cout};
  if (k.size() != nsp || std::any_of(k.begin(), k.end(), [](int64_t v) { return v <= 0; })) {
    for (size_t i = 0; i < nsp; ++i) out.emplace_back();
    return infer_one(TensorType(x.dtype, out));
  }
  Window win = convtranspose_window(c.node, spatial_of(x.dims), k, [&](const std::string& m) { c.error("ConvTranspose: " + m); });
  for (size_t i = 0; i < nsp; ++i) out.push_back(win.out[i] >= 0 ? Dim(win.out[i]) : Dim());
  return infer_one(TensorType(x.dtype, out));
}

template <class T>
Tensor convtranspose_typed(const KernelContext& c, const Tensor& X, const Tensor& W, const Tensor* B) {
  if (X.rank() < 3 || X.rank() > 5) c.unsupported("ConvTranspose with input rank " + std::to_string(X.rank()));
  if (W.rank() != X.rank()) c.error("weight " + shape_str(W.shape()) + " must have the rank of the input " + shape_str(X.shape()));
  int64_t group = c.node.attrs.get_int("group", 1);
  // group divides the input channels, so it is at most their number (or 1 for none): the output
  // channels Cout_g * group then cannot overflow.
  if (group < 1 || group > std::max<int64_t>(X.dim(1), 1))
    c.error("group=" + std::to_string(group) + " must be between 1 and the " + std::to_string(X.dim(1)) + " input channels");
  int64_t N = X.dim(0), Cin = X.dim(1), Cout_g = W.dim(1), Cout = Cout_g * group;
  if (W.dim(0) != Cin || Cin % group != 0)
    c.error("input has " + std::to_string(Cin) + " channels but weight " + shape_str(W.shape()) + " expects " +
            std::to_string(W.dim(0)) + " (group=" + std::to_string(group) + ")");
  int64_t Cin_g = Cin / group;
  std::vector<int64_t> k = conv_kernel_shape(c.node, nullptr, &W.shape());
  if (k != spatial_of(W.shape())) c.error("kernel_shape " + ints_str(k) + " does not match weight " + shape_str(W.shape()));
  if (B && B->numel() != Cout) c.error("bias " + shape_str(B->shape()) + " must have " + std::to_string(Cout) + " elements");
  Window w = convtranspose_window(c.node, spatial_of(X.shape()), k, [&](const std::string& m) { c.error(m); });
  Shape out_shape{N, Cout};
  for (auto o : w.out) {
    if (o < 0) c.error("output size would be negative");
    out_shape.push_back(o);
  }
  Tensor Y(DTypeOf<T>::value, out_shape);
  Window w3 = to3d(w);
  const int64_t isp = w3.in[0] * w3.in[1] * w3.in[2], osp = w3.out[0] * w3.out[1] * w3.out[2];
  const int64_t kvol = w3.k[0] * w3.k[1] * w3.k[2];
  const int64_t rows = Cout_g * kvol;
  std::vector<T> col(size_t(rows * isp));
  const T* x = X.data<T>();
  const T* wt = W.data<T>();
  T* y = Y.data<T>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < group; ++g) {
      // col[Cout_g*kvol, isp] = W_g^T · X_g with W_g = [Cin_g, Cout_g*kvol].
      gemm<T>(rows, isp, Cin_g, wt + g * Cin_g * rows, 1, rows, x + (n * Cin + g * Cin_g) * isp, isp, 1, col.data(), isp, false);
      // col2im: scatter-add each column entry to the output position it contributes to.
      for (int64_t co = 0; co < Cout_g; ++co) {
        T* yc = y + (n * Cout + g * Cout_g + co) * osp;
        for (int64_t kd = 0; kd < w3.k[0]; ++kd)
          for (int64_t kh = 0; kh < w3.k[1]; ++kh)
            for (int64_t kw = 0; kw < w3.k[2]; ++kw) {
              const T* cr = col.data() + (((co * w3.k[0] + kd) * w3.k[1] + kh) * w3.k[2] + kw) * isp;
              for (int64_t id = 0; id < w3.in[0]; ++id) {
                int64_t od = id * w3.stride[0] - w3.pad_b[0] + kd * w3.dil[0];
                if (od < 0 || od >= w3.out[0]) continue;
                for (int64_t ih = 0; ih < w3.in[1]; ++ih) {
                  int64_t oh = ih * w3.stride[1] - w3.pad_b[1] + kh * w3.dil[1];
                  if (oh < 0 || oh >= w3.out[1]) continue;
                  const T* src = cr + (id * w3.in[1] + ih) * w3.in[2];
                  T* dst = yc + (od * w3.out[1] + oh) * w3.out[2];
                  for (int64_t iw = 0; iw < w3.in[2]; ++iw) {
                    int64_t ow = iw * w3.stride[2] - w3.pad_b[2] + kw * w3.dil[2];
                    if (ow >= 0 && ow < w3.out[2]) dst[ow] += src[iw];
                  }
                }
              }
            }
      }
    }
  if (B) {
    const T* b = B->data<T>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t co = 0; co < Cout; ++co) {
        T* yc = y + (n * Cout + co) * osp;
        for (int64_t i = 0; i < osp; ++i) yc[i] += b[co];
      }
  }
  return Y;
}

double convtranspose_flops(const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
  if (ins.size() < 2 || !ins[1].is_static() || !ins[0].is_static()) return 0;
  double kv = 1;
  for (size_t i = 1; i < ins[1].dims.size(); ++i) kv *= double(ins[1].dims[i].value);  // (Cout/group) * prod(kernel)
  return 2.0 * numel_or0(ins[0]) * kv;
}

// ---------------------------------------------------------------- pooling
enum class PoolKind { Max, Average, Lp };

InferResult infer_pool(const InferContext& c, bool has_indices) {
  const TensorType& x = c.input(0);
  InferResult r;
  if (!x.has_shape) {
    r.outputs.push_back(TensorType::unknown_shape(x.dtype));
    if (has_indices) r.outputs.push_back(TensorType::unknown_shape(DType::Int64));
    return r;
  }
  if (x.rank() < 3) c.error(c.node.op_type + ": input " + x.str() + " must have rank >= 3 (N, C, spatial...)");
  auto k = c.node.attrs.opt_ints("kernel_shape");
  if (!k) c.error(c.node.op_type + ": kernel_shape is required");
  bool ceil_mode = c.node.attrs.get_int("ceil_mode", 0) != 0;
  Window w = make_window(c.node, spatial_of(x.dims), *k, ceil_mode, [&](const std::string& m) { c.error(c.node.op_type + ": " + m); });
  std::vector<Dim> out{x.dims[0], x.dims[1]};
  for (auto o : w.out) out.push_back(o >= 0 ? Dim(o) : Dim());
  r.outputs.push_back(TensorType(x.dtype, out));
  if (has_indices) r.outputs.push_back(TensorType(DType::Int64, out));
  return r;
}

// Per spatial dim and output position: the input positions of the window that lie inside the
// input, and how many positions lie inside the input or its padding (count_include_pad divisor).
struct WindowTaps {
  std::vector<std::vector<std::vector<int64_t>>> valid;  // [dim][out] -> input positions
  std::vector<std::vector<int64_t>> with_pad;            // [dim][out] -> count
};

WindowTaps window_taps(const Window& w3) {
  WindowTaps t;
  t.valid.resize(3);
  t.with_pad.resize(3);
  for (size_t d = 0; d < 3; ++d)
    for (int64_t o = 0; o < w3.out[d]; ++o) {
      std::vector<int64_t> v;
      int64_t incl = 0;
      for (int64_t j = 0; j < w3.k[d]; ++j) {
        int64_t p = o * w3.stride[d] - w3.pad_b[d] + j * w3.dil[d];
        if (p >= 0 && p < w3.in[d]) v.push_back(p);
        if (p >= -w3.pad_b[d] && p < w3.in[d] + w3.pad_e[d]) ++incl;
      }
      t.valid[d].push_back(std::move(v));
      t.with_pad[d].push_back(incl);
    }
  return t;
}

template <class T>
std::vector<Tensor> pool_typed(const KernelContext& c, const Tensor& X, PoolKind kind, bool want_indices) {
  if (X.rank() < 3 || X.rank() > 5) c.unsupported(c.node.op_type + " with input rank " + std::to_string(X.rank()));
  auto k = c.node.attrs.opt_ints("kernel_shape");
  if (!k) c.error("kernel_shape is required");
  bool ceil_mode = c.node.attrs.get_int("ceil_mode", 0) != 0;
  bool include_pad = c.node.attrs.get_int("count_include_pad", 0) != 0;
  bool col_major = c.node.attrs.get_int("storage_order", 0) != 0;
  double p = double(c.node.attrs.get_int("p", 2));
  Window w = make_window(c.node, spatial_of(X.shape()), *k, ceil_mode, [&](const std::string& m) { c.error(m); });
  Shape out_shape{X.dim(0), X.dim(1)};
  for (auto o : w.out) out_shape.push_back(o);
  Tensor Y(DTypeOf<T>::value, out_shape);
  Tensor I = want_indices ? Tensor(DType::Int64, out_shape) : Tensor();
  Window w3 = to3d(w);
  WindowTaps taps = window_taps(w3);
  const int64_t NC = X.dim(0) * X.dim(1);
  const int64_t ID = w3.in[0], IH = w3.in[1], IW = w3.in[2];
  const int64_t isp = ID * IH * IW;
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  int64_t* idx = want_indices ? I.data<int64_t>() : nullptr;
  int64_t oi = 0;
  for (int64_t nc = 0; nc < NC; ++nc) {
    const T* xc = x + nc * isp;
    for (int64_t od = 0; od < w3.out[0]; ++od)
      for (int64_t oh = 0; oh < w3.out[1]; ++oh)
        for (int64_t ow = 0; ow < w3.out[2]; ++ow, ++oi) {
          const auto& vd = taps.valid[0][size_t(od)];
          const auto& vh = taps.valid[1][size_t(oh)];
          const auto& vw = taps.valid[2][size_t(ow)];
          if (kind == PoolKind::Max) {
            T best = std::numeric_limits<T>::lowest();
            if constexpr (std::is_floating_point_v<T>) best = -std::numeric_limits<T>::infinity();
            int64_t at = -1;
            for (int64_t id : vd)
              for (int64_t ih : vh)
                for (int64_t iw : vw) {
                  T v = xc[(id * IH + ih) * IW + iw];
                  if (at < 0 || v > best) {
                    best = v;
                    at = col_major ? id + ID * (ih + IH * iw) : (id * IH + ih) * IW + iw;
                  }
                }
            y[oi] = best;
            if (idx) idx[oi] = nc * isp + std::max<int64_t>(at, 0);
          } else {
            double acc = 0;
            for (int64_t id : vd)
              for (int64_t ih : vh)
                for (int64_t iw : vw) {
                  double v = double(xc[(id * IH + ih) * IW + iw]);
                  acc += kind == PoolKind::Lp ? std::pow(std::fabs(v), p) : v;
                }
            if (kind == PoolKind::Lp) {
              y[oi] = T(std::pow(acc, 1.0 / p));
            } else {
              int64_t n = include_pad ? taps.with_pad[0][size_t(od)] * taps.with_pad[1][size_t(oh)] * taps.with_pad[2][size_t(ow)]
                                      : int64_t(vd.size() * vh.size() * vw.size());
              y[oi] = n > 0 ? T(acc / double(n)) : T(0);
            }
          }
        }
  }
  std::vector<Tensor> r{Y};
  if (want_indices) r.push_back(I);
  return r;
}

std::vector<Tensor> pool_kernel(const KernelContext& c, PoolKind kind) {
  bool want_indices = c.node.outputs.size() > 1 && !c.node.outputs[1].empty();
  DType dt = c.input(0).dtype();
  if (kind == PoolKind::Max && dt == DType::Int8) return pool_typed<int8_t>(c, c.input(0), kind, want_indices);
  if (kind == PoolKind::Max && dt == DType::UInt8) return pool_typed<uint8_t>(c, c.input(0), kind, want_indices);
  return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
    using T = decltype(tag);
    return pool_typed<T>(c, *in[0], kind, want_indices);
  });
}

double pool_flops(const Node& n, const std::vector<TensorType>&, const std::vector<TensorType>& outs) {
  double kv = 1;
  for (auto k : n.attrs.get_ints("kernel_shape", {})) kv *= double(k);
  return outs.empty() ? 0 : numel_or0(outs[0]) * kv;
}

// Global pools: one value per (n, c) over all spatial positions.
InferResult infer_global_pool(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (!x.has_shape) return infer_one(TensorType::unknown_shape(x.dtype));
  if (x.rank() < 2) c.error(c.node.op_type + ": input " + x.str() + " must have rank >= 2 (N, C, spatial...)");
  std::vector<Dim> out{x.dims[0], x.dims[1]};
  for (int64_t i = 2; i < x.rank(); ++i) out.emplace_back(1);
  return infer_one(TensorType(x.dtype, out));
}

template <class T>
Tensor global_pool_typed(const KernelContext& c, const Tensor& X, PoolKind kind) {
  if (X.rank() < 2) c.error("input " + shape_str(X.shape()) + " must have rank >= 2");
  Shape out_shape{X.dim(0), X.dim(1)};
  for (int64_t i = 2; i < X.rank(); ++i) out_shape.push_back(1);
  Tensor Y(DTypeOf<T>::value, out_shape);
  int64_t NC = X.dim(0) * X.dim(1), sp = NC ? X.numel() / NC : 0;
  double p = double(c.node.attrs.get_int("p", 2));
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  for (int64_t i = 0; i < NC; ++i) {
    const T* xc = x + i * sp;
    if (kind == PoolKind::Max) {
      T best = sp ? xc[0] : T(0);
      for (int64_t j = 1; j < sp; ++j) best = xc[j] > best ? xc[j] : best;
      y[i] = best;
    } else if (kind == PoolKind::Average) {
      double acc = 0;
      for (int64_t j = 0; j < sp; ++j) acc += double(xc[j]);
      y[i] = T(sp ? acc / double(sp) : 0.0);
    } else {
      double acc = 0;
      for (int64_t j = 0; j < sp; ++j) acc += std::pow(std::fabs(double(xc[j])), p);
      y[i] = T(std::pow(acc, 1.0 / p));
    }
  }
  return Y;
}


}  // namespace

void register_nn_conv_ops(OpRegistry& r) {
  {
    OpSchema s = nn_schema("Conv", 1, 2, 3, 1, 1);
    s.infer = infer_conv;
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
        using T = decltype(tag);
        return {conv_typed<T>(c, *in[0], *in[1], in.size() > 2 ? in[2] : nullptr)};
      });
    };
    s.flops = conv_flops;
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("ConvInteger", 10, 2, 4, 1, 1);
    s.infer = [](const InferContext& c) { return infer_conv_as(c, 1, DType::Int32); };
    s.kernel = conv_integer_kernel;
    s.flops = [](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
      return conv_flops(n, {ins[0], ins[1]}, outs);
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("QLinearConv", 10, 8, 9, 1, 1);
    s.infer = [](const InferContext& c) { return infer_conv_as(c, 3, c.input(7).dtype); };
    s.kernel = qlinear_conv_kernel;
    s.flops = [](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
      return ins.size() > 3 ? conv_flops(n, {ins[0], ins[3]}, outs) : 0.0;
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("ConvTranspose", 1, 2, 3, 1, 1);
    s.infer = infer_convtranspose;
    s.kernel = [](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
        using T = decltype(tag);
        return {convtranspose_typed<T>(c, *in[0], *in[1], in.size() > 2 ? in[2] : nullptr)};
      });
    };
    s.flops = convtranspose_flops;
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("MaxPool", 1, 1, 1, 1, 2);
    s.infer = [](const InferContext& c) { return infer_pool(c, c.node.outputs.size() > 1); };
    s.kernel = [](const KernelContext& c) { return pool_kernel(c, PoolKind::Max); };
    s.flops = pool_flops;
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("AveragePool", 1, 1, 1, 1, 1);
    s.infer = [](const InferContext& c) { return infer_pool(c, false); };
    s.kernel = [](const KernelContext& c) { return pool_kernel(c, PoolKind::Average); };
    s.flops = pool_flops;
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("LpPool", 1, 1, 1, 1, 1);
    s.infer = [](const InferContext& c) { return infer_pool(c, false); };
    s.kernel = [](const KernelContext& c) { return pool_kernel(c, PoolKind::Lp); };
    s.flops = pool_flops;
    r.add(std::move(s));
  }
  auto global = [&](const char* name, PoolKind kind) {
    OpSchema s = nn_schema(name, 1, 1, 1, 1, 1);
    s.infer = infer_global_pool;
    s.kernel = [kind](const KernelContext& c) {
      return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
        using T = decltype(tag);
        return {global_pool_typed<T>(c, *in[0], kind)};
      });
    };
    s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) { return numel_or0(ins[0]); };
    r.add(std::move(s));
  };
  global("GlobalAveragePool", PoolKind::Average);
  global("GlobalMaxPool", PoolKind::Max);
  global("GlobalLpPool", PoolKind::Lp);
}

}  // namespace nnfuse::nn
