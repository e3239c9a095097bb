// DeformConv (opsets 19, 22), 2-D: a convolution whose every tap reads the input at its regular
// position plus a learned offset, bilinearly interpolated (corners outside the image count as 0),
// optionally scaled by a mask. Inputs: X [N, C, H, W], W [OC, C / group, kH, kW], offset
// [N, offset_group * kH * kW * 2, oH, oW] (per tap: dy then dx), B [OC], mask
// [N, offset_group * kH * kW, oH, oW]. Input channel c uses offset group c / (C / offset_group).
// The output's spatial size is the offset's, which must be the convolution's.
#include <cmath>
#include <string>
#include <vector>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {

namespace {

struct DeformGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0, OC = 0, KH = 0, KW = 0, OH = 0, OW = 0;
  int64_t group = 1, offset_group = 1;
  int64_t sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0;
};

// The geometry from the input shapes and attributes, every constraint checked (fail names it).
template <class Fail>
DeformGeometry deform_geometry(const Node& node, const Shape& xs, const Shape& ws, const Shape& os, const Shape* bs, const Shape* ms,
                               const Fail& fail) {
  if (xs.size() != 4 || ws.size() != 4 || os.size() != 4)
    fail("only 2-D DeformConv is supported: X " + shape_str(xs) + ", W " + shape_str(ws) + " and offset " + shape_str(os) +
         " must be rank 4");
  DeformGeometry g;
  g.N = xs[0], g.C = xs[1], g.H = xs[2], g.W = xs[3], g.OC = ws[0], g.KH = ws[2], g.KW = ws[3], g.OH = os[2], g.OW = os[3];
  g.group = node.attrs.get_int("group", 1);
  g.offset_group = node.attrs.get_int("offset_group", 1);
  const std::vector<int64_t> k = node.attrs.get_ints("kernel_shape", {g.KH, g.KW});
  const std::vector<int64_t> s = node.attrs.get_ints("strides", {1, 1}), d = node.attrs.get_ints("dilations", {1, 1});
  const std::vector<int64_t> p = node.attrs.get_ints("pads", {0, 0, 0, 0});
  if (k.size() != 2 || s.size() != 2 || d.size() != 2 || p.size() != 4)
    fail("kernel_shape " + shape_str(k) + ", strides " + shape_str(s) + ", dilations " + shape_str(d) + " and pads " + shape_str(p) +
         " do not fit 2 spatial dims");
  if (k[0] != g.KH || k[1] != g.KW) fail("kernel_shape " + shape_str(k) + " differs from W " + shape_str(ws));
  for (int i = 0; i < 2; ++i)
    if (s[size_t(i)] <= 0 || d[size_t(i)] <= 0 || p[size_t(i)] < 0 || p[size_t(i) + 2] < 0 || k[size_t(i)] <= 0)
      fail("kernel_shape, strides, dilations (positive) and pads (non-negative) out of range");
  g.sh = s[0], g.sw = s[1], g.dh = d[0], g.dw = d[1], g.pt = p[0], g.pl = p[1];
  if (g.group <= 0 || g.C != ws[1] * g.group || g.OC % g.group != 0)
    fail("X has " + std::to_string(g.C) + " channels, W " + shape_str(ws) + " with group " + std::to_string(g.group) + " needs " +
         std::to_string(ws[1] * g.group) + " (and output channels a multiple of the group)");
  if (g.offset_group <= 0 || g.C % g.offset_group != 0)
    fail("offset_group " + std::to_string(g.offset_group) + " does not divide the " + std::to_string(g.C) + " input channels");
  const int64_t taps = g.KH * g.KW;
  if (os[0] != g.N || os[1] != g.offset_group * taps * 2)
    fail("offset " + shape_str(os) + " must be [" + std::to_string(g.N) + ", " + std::to_string(g.offset_group * taps * 2) + ", oH, oW]");
  const int64_t oh = (g.H + p[0] + p[2] - (g.KH - 1) * g.dh - 1) / g.sh + 1, ow = (g.W + p[1] + p[3] - (g.KW - 1) * g.dw - 1) / g.sw + 1;
  if (g.OH != oh || g.OW != ow)
    fail("offset's spatial size " + std::to_string(g.OH) + "x" + std::to_string(g.OW) + " is not the convolution's " + std::to_string(oh) +
         "x" + std::to_string(ow));
  if (bs && *bs != Shape{g.OC}) fail("B " + shape_str(*bs) + " must be [" + std::to_string(g.OC) + "]");
  if (ms && *ms != Shape{g.N, g.offset_group * taps, g.OH, g.OW})
    fail("mask " + shape_str(*ms) + " must be " + shape_str({g.N, g.offset_group * taps, g.OH, g.OW}));
  return g;
}

// Bilinear read of an H x W plane at (y, x); corners outside the plane count as 0.
template <class T>
double sample(const T* plane, int64_t H, int64_t W, double y, double x) {
  if (!(y > -1.0 && y < double(H) && x > -1.0 && x < double(W))) return 0.0;  // NaN included: all four corners outside
  const double fy = std::floor(y), fx = std::floor(x);
  const int64_t y0 = int64_t(fy), x0 = int64_t(fx);
  const double ly = y - fy, lx = x - fx;
  double v = 0.0;
  for (int dy = 0; dy < 2; ++dy)
    for (int dx = 0; dx < 2; ++dx) {
      const int64_t yy = y0 + dy, xx = x0 + dx;
      if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
      v += (dy ? ly : 1.0 - ly) * (dx ? lx : 1.0 - lx) * double(plane[yy * W + xx]);
    }
  return v;
}

template <class T, class Fail>
Tensor deform_conv_typed(const DeformGeometry& g, const Tensor& X, const Tensor& Wt, const Tensor& Off, const Tensor* B, const Tensor* M,
                         const Fail& fail) {
  Tensor Y(X.dtype(), {g.N, g.OC, g.OH, g.OW});
  const T *x = X.data<T>(), *w = Wt.data<T>(), *off = Off.data<T>();
  const T* b = B ? B->data<T>() : nullptr;
  const T* m = M ? M->data<T>() : nullptr;
  T* y = Y.data<T>();
  const int64_t taps = g.KH * g.KW, cpg = g.C / g.group, ocpg = g.OC / g.group, cpog = g.C / g.offset_group, plane = g.OH * g.OW;
  // The sampled input of one image: [C][taps][oH * oW] (the columns of an im2col), then a GEMM per group.
  int64_t ncols = 0;
  if (__builtin_mul_overflow(g.C * taps, plane, &ncols) || ncols > (int64_t(1) << 31))
    fail("the sampled columns (" + std::to_string(g.C) + " channels x " + std::to_string(taps) + " taps x " + std::to_string(plane) +
         " pixels) are too large for the reference kernel");
  std::vector<double> cols(static_cast<size_t>(ncols));
  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t c = 0; c < g.C; ++c) {
      const int64_t og = c / cpog;
      const T* xp = x + (n * g.C + c) * g.H * g.W;
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t kh = t / g.KW, kw = t % g.KW;
        const T* dy = off + ((n * g.offset_group + og) * taps * 2 + 2 * t) * plane;
        const T* dx = dy + plane;
        const T* mk = m ? m + ((n * g.offset_group + og) * taps + t) * plane : nullptr;
        double* col = cols.data() + (c * taps + t) * plane;
        for (int64_t i = 0; i < g.OH; ++i)
          for (int64_t j = 0; j < g.OW; ++j) {
            const int64_t q = i * g.OW + j;
            const double yy = double(i * g.sh - g.pt + kh * g.dh) + double(dy[q]), xx = double(j * g.sw - g.pl + kw * g.dw) + double(dx[q]);
            col[q] = sample(xp, g.H, g.W, yy, xx) * (mk ? double(mk[q]) : 1.0);
          }
      }
    }
    for (int64_t oc = 0; oc < g.OC; ++oc) {
      const int64_t c0 = oc / ocpg * cpg;
      for (int64_t q = 0; q < plane; ++q) {
        double acc = b ? double(b[oc]) : 0.0;
        for (int64_t ci = 0; ci < cpg; ++ci)
          for (int64_t t = 0; t < taps; ++t)
            acc += double(w[(oc * cpg + ci) * taps + t]) * cols[size_t(((c0 + ci) * taps + t) * plane + q)];
        y[(n * g.OC + oc) * plane + q] = T(acc);
      }
    }
  }
  return Y;
}

std::vector<Tensor> deform_conv_kernel(const KernelContext& c) {
  const Tensor* B = c.has_input(3) ? c.inputs[3] : nullptr;
  const Tensor* M = c.has_input(4) ? c.inputs[4] : nullptr;
  const DeformGeometry g = deform_geometry(c.node, c.input(0).shape(), c.input(1).shape(), c.input(2).shape(), B ? &B->shape() : nullptr,
                                           M ? &M->shape() : nullptr, [&](const std::string& m) { c.error(m); });
  return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
    using T = decltype(tag);
    return {deform_conv_typed<T>(g, *in[0], *in[1], *in[2], B ? in[3] : nullptr, M ? in[4] : nullptr,
                                 [&](const std::string& m) { c.error(m); })};
  });
}

InferResult infer_deform_conv(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (!is_floatish(x.dtype)) c.error(std::string("X must be a float tensor, got ") + dtype_name(x.dtype));
  for (size_t i = 1; i < c.num_inputs(); ++i)
    if (c.has_input(i) && c.input(i).dtype != x.dtype)
      c.error("input " + std::to_string(i) + " must have X's dtype " + dtype_name(x.dtype));
  InferResult r;
  const TensorType& w = c.input(1);
  const TensorType& off = c.input(2);
  // Known ranks are checked before any dim is read (a scalar X with a symbolic offset read X's
  // first dim out of an empty list: fuzz finding `deform-conv-scalar-x`).
  for (const auto& [name, t] : {std::pair<const char*, const TensorType*>{"X", &x}, {"W", &w}, {"offset", &off}})
    if (t->has_shape && t->rank() != 4)
      c.error(std::string("only 2-D DeformConv is supported: ") + name + " has rank " + std::to_string(t->rank()) + ", must be 4");
  const bool statics = x.is_static() && w.is_static() && off.is_static() && (!c.has_input(3) || c.input(3).is_static()) &&
                       (!c.has_input(4) || c.input(4).is_static());
  if (statics) {
    const Shape bs = c.has_input(3) ? c.input(3).static_shape() : Shape{}, ms = c.has_input(4) ? c.input(4).static_shape() : Shape{};
    const DeformGeometry g = deform_geometry(c.node, x.static_shape(), w.static_shape(), off.static_shape(), c.has_input(3) ? &bs : nullptr,
                                             c.has_input(4) ? &ms : nullptr, [&](const std::string& m) { c.error(m); });
    r.outputs.push_back(TensorType(x.dtype, {Dim(g.N), Dim(g.OC), Dim(g.OH), Dim(g.OW)}));
    return r;
  }
  r.outputs.push_back(TensorType(
      x.dtype, {x.has_shape ? x.dims[0] : Dim{}, w.has_shape ? w.dims[0] : Dim{}, off.has_shape ? off.dims[2] : Dim{},
                off.has_shape ? off.dims[3] : Dim{}}));
  return r;
}

}  // namespace

void register_nn_deform_conv_ops(OpRegistry& r) {
  OpSchema s = nn_schema("DeformConv", 19, 3, 5);
  s.infer = infer_deform_conv;
  s.kernel = deform_conv_kernel;
  // As a Conv (2 per multiply-add: out_elems * C/group * taps) plus a bilinear sample (8) per tap and input channel.
  s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
    if (ins.size() < 2 || !ins[1].is_static() || !ins[0].is_static()) return 0.0;
    const Shape ws = ins[1].static_shape(), xs = ins[0].static_shape();
    const double taps = double(ws[2] * ws[3]), out = numel_or0(outs[0]);
    const double planes = out / double(std::max<int64_t>(ws[0], 1));
    return 2.0 * out * double(ws[1]) * taps + 8.0 * planes * double(xs[1]) * taps;
  };
  r.add(std::move(s));
}

}  // namespace nnfuse::nn
