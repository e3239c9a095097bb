// Col2Im (opset 18) and MaxUnpool (9, 11): the inverses of im2col and MaxPool, which scatter
// columns of patches, or pooled values at their argmax positions, back into an image.
//
// Col2Im: input [N, C * prod(block_shape), L] with image_shape and block_shape as 1-D int64 inputs
// (n spatial dims); column l is the patch at block position l of the sliding grid (row-major over
// the n dims), channel c * prod(block) + b its element b (row-major over block_shape). Output
// [N, C, image_shape...], overlapping patches summed, taps falling in the padding dropped.
// MaxUnpool: output zeros of the inferred shape (or of output_shape, input 2), then y[I[i]] = x[i]
// with I the flattened indices MaxPool writes (over the whole output tensor, N and C included).
#include <string>
#include <vector>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {

namespace {

// A 1-D int64 tensor's values (Col2Im's image_shape and block_shape, MaxUnpool's output_shape).
template <class Fail>
std::vector<int64_t> int_values(const Tensor& t, const char* what, const Fail& fail) {
  if (t.dtype() != DType::Int64 || t.rank() != 1)
    fail(std::string(what) + " must be a 1-D int64 tensor, got " + dtype_name(t.dtype()) + " " + shape_str(t.shape()));
  return t.to_int_vector();
}

// Col2Im's geometry: spatial rank n, the sliding grid per dim, with the attributes checked.
struct FoldGeometry {
  std::vector<int64_t> image, block, dil, pads, strides, grid;
  int64_t block_size = 1, positions = 1;
};

template <class Fail>
FoldGeometry fold_geometry(const Node& node, const std::vector<int64_t>& image, const std::vector<int64_t>& block, const Fail& fail) {
  FoldGeometry g;
  const size_t n = image.size();
  if (n == 0 || block.size() != n)
    fail("image_shape " + shape_str(image) + " and block_shape " + shape_str(block) + " must be non-empty and of one length");
  g.image = image, g.block = block;
  g.dil = node.attrs.get_ints("dilations", std::vector<int64_t>(n, 1));
  g.pads = node.attrs.get_ints("pads", std::vector<int64_t>(2 * n, 0));
  g.strides = node.attrs.get_ints("strides", std::vector<int64_t>(n, 1));
  if (g.dil.size() != n || g.pads.size() != 2 * n || g.strides.size() != n)
    fail("dilations " + shape_str(g.dil) + ", pads " + shape_str(g.pads) + " and strides " + shape_str(g.strides) + " do not fit " +
         std::to_string(n) + " spatial dims");
  for (size_t i = 0; i < n; ++i) {
    if (image[i] <= 0 || block[i] <= 0 || g.dil[i] <= 0 || g.strides[i] <= 0 || g.pads[i] < 0 || g.pads[i + n] < 0)
      fail("image_shape " + shape_str(image) + ", block_shape " + shape_str(block) +
           ", dilations, strides (positive) and pads (non-negative) out of range");
    int64_t span = 0, padded = 0, grid = 0;
    if (__builtin_mul_overflow(g.dil[i], block[i] - 1, &span) || __builtin_add_overflow(span, 1, &span) ||
        __builtin_add_overflow(image[i], g.pads[i], &padded) || __builtin_add_overflow(padded, g.pads[i + n], &padded))
      fail("image_shape " + shape_str(image) + ", block_shape " + shape_str(block) + ", dilations and pads overflow 64 bits");
    if (span > padded) fail("block " + shape_str(block) + " with dilations " + shape_str(g.dil) + " is larger than the padded image");
    grid = (padded - span) / g.strides[i] + 1;
    g.grid.push_back(grid);
    if (__builtin_mul_overflow(g.block_size, block[i], &g.block_size) || __builtin_mul_overflow(g.positions, grid, &g.positions))
      fail("block_shape " + shape_str(block) + " or the sliding grid over image_shape " + shape_str(image) +
           " has more than 2^63 elements");
  }
  return g;
}

template <class T>
Tensor col2im_typed(const Tensor& X, const FoldGeometry& g) {
  const Shape& xs = X.shape();
  const int64_t N = xs[0], C = xs[1] / g.block_size, L = xs[2];
  Shape ys = {N, C};
  ys.insert(ys.end(), g.image.begin(), g.image.end());
  Tensor Y(X.dtype(), ys);
  T* y = Y.data<T>();
  const T* x = X.data<T>();
  for (int64_t i = 0, e = Y.numel(); i < e; ++i) y[i] = T(0);
  const size_t n = g.image.size();
  int64_t plane = 1;
  for (int64_t d : g.image) plane *= d;
  std::vector<int64_t> b(n), p(n);
  for (int64_t nc = 0; nc < N * C; ++nc) {
    T* yp = y + nc * plane;
    for (int64_t bi = 0; bi < g.block_size; ++bi) {
      for (int64_t r = bi, k = int64_t(n) - 1; k >= 0; --k) b[size_t(k)] = r % g.block[size_t(k)], r /= g.block[size_t(k)];
      const T* xp = x + (nc * g.block_size + bi) * L;
      for (int64_t l = 0; l < L; ++l) {
        int64_t off = 0;
        bool inside = true;
        for (int64_t r = l, k = int64_t(n) - 1; k >= 0; --k) {
          const size_t d = size_t(k);
          p[d] = r % g.grid[d], r /= g.grid[d];
          const int64_t at = p[d] * g.strides[d] - g.pads[d] + b[d] * g.dil[d];
          inside = inside && at >= 0 && at < g.image[d];
        }
        if (!inside) continue;
        for (size_t d = 0; d < n; ++d) off = off * g.image[d] + (p[d] * g.strides[d] - g.pads[d] + b[d] * g.dil[d]);
        yp[off] = yp[off] + xp[l];
      }
    }
  }
  return Y;
}

std::vector<Tensor> col2im_kernel(const KernelContext& c) {
  const Tensor& X = c.input(0);
  if (X.rank() != 3) c.error("input must be [N, C * prod(block_shape), L], got rank " + std::to_string(X.rank()));
  auto fail = [&](const std::string& m) { c.error(m); };
  const FoldGeometry g =
      fold_geometry(c.node, int_values(c.input(1), "image_shape", fail), int_values(c.input(2), "block_shape", fail), fail);
  if (X.shape()[1] % g.block_size != 0)
    c.error("input channels " + std::to_string(X.shape()[1]) +
            " are not a multiple of prod(block_shape) = " + std::to_string(g.block_size));
  if (X.shape()[2] != g.positions)
    c.error("input has " + std::to_string(X.shape()[2]) + " columns, the sliding grid over image_shape has " + std::to_string(g.positions));
  return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
    using T = decltype(tag);
    return {col2im_typed<T>(*in[0], g)};
  });
}

InferResult infer_col2im(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (!is_floatish(x.dtype)) c.error(std::string("Col2Im takes a float tensor, got ") + dtype_name(x.dtype));
  if (x.has_shape && x.rank() != 3) c.error("input must be [N, C * prod(block_shape), L], got rank " + std::to_string(x.rank()));
  InferResult r;
  const Tensor* image = c.value(1);
  const Tensor* block = c.value(2);
  if (!image || !block) {
    // The output's rank is that of image_shape's length, when its shape is known.
    const TensorType& it = c.input(1);
    if (it.has_shape && it.rank() == 1 && it.dims[0].known())
      r.outputs.push_back(TensorType(x.dtype, std::vector<Dim>(size_t(it.dims[0].value + 2))));
    else
      r.outputs.push_back(TensorType::unknown_shape(x.dtype));
    return r;
  }
  auto fail = [&](const std::string& m) { c.error(m); };
  const FoldGeometry g = fold_geometry(c.node, int_values(*image, "image_shape", fail), int_values(*block, "block_shape", fail), fail);
  std::vector<Dim> d = {x.has_shape ? x.dims[0] : Dim{}, Dim{}};
  if (x.has_shape && x.dims[1].known()) {
    if (x.dims[1].value % g.block_size != 0)
      c.error("input channels " + std::to_string(x.dims[1].value) +
              " are not a multiple of prod(block_shape) = " + std::to_string(g.block_size));
    d[1] = Dim(x.dims[1].value / g.block_size);
  }
  if (x.has_shape && x.dims[2].known() && x.dims[2].value != g.positions)
    c.error("input has " + std::to_string(x.dims[2].value) + " columns, the sliding grid over image_shape has " +
            std::to_string(g.positions));
  for (int64_t v : g.image) d.push_back(Dim(v));
  r.outputs.push_back(TensorType(x.dtype, d));
  return r;
}

// MaxUnpool's output shape from X's: (in - 1) * stride + kernel - pad_begin - pad_end per
// spatial dim.
template <class Fail>
std::vector<Dim> unpool_shape(const Node& node, const std::vector<Dim>& xd, const Fail& fail) {
  const size_t n = xd.size() - 2;
  const std::vector<int64_t> k = node.attrs.get_ints("kernel_shape");
  const std::vector<int64_t> pads = node.attrs.get_ints("pads", std::vector<int64_t>(2 * n, 0));
  const std::vector<int64_t> strides = node.attrs.get_ints("strides", std::vector<int64_t>(n, 1));
  if (k.size() != n || pads.size() != 2 * n || strides.size() != n)
    fail("kernel_shape " + shape_str(k) + ", pads " + shape_str(pads) + " and strides " + shape_str(strides) + " do not fit " +
         std::to_string(n) + " spatial dims");
  std::vector<Dim> out = {xd[0], xd[1]};
  for (size_t i = 0; i < n; ++i) {
    if (k[i] <= 0 || strides[i] <= 0 || pads[i] < 0 || pads[i + n] < 0)
      fail("kernel_shape, strides (positive) and pads (non-negative) out of range");
    if (!xd[i + 2].known()) {
      out.push_back(Dim{});
      continue;
    }
    int64_t v = 0;
    if (__builtin_mul_overflow(xd[i + 2].value - 1, strides[i], &v) || __builtin_add_overflow(v, k[i], &v) ||
        __builtin_sub_overflow(v, pads[i], &v) || __builtin_sub_overflow(v, pads[i + n], &v))
      fail("the unpooled size of spatial dim " + std::to_string(i) + " overflows 64 bits");
    if (v <= 0) fail("the unpooled dim " + std::to_string(i) + " would be " + std::to_string(v));
    out.push_back(Dim(v));
  }
  return out;
}

std::vector<Tensor> maxunpool_kernel(const KernelContext& c) {
  const Tensor& X = c.input(0);
  const Tensor& I = c.input(1);
  if (X.rank() < 3) c.error("X must be [N, C, spatial...], got rank " + std::to_string(X.rank()));
  if (I.dtype() != DType::Int64 || I.shape() != X.shape())
    c.error("I must be int64 of X's shape " + shape_str(X.shape()) + ", got " + shape_str(I.shape()));
  // The indices address the inferred shape; output_shape, when given, pads it with zeros at the
  // end of each dim (as the ONNX reference does).
  Shape inferred;
  std::vector<Dim> xd;
  for (int64_t v : X.shape()) xd.push_back(Dim(v));
  for (const Dim& d : unpool_shape(c.node, xd, [&](const std::string& m) { c.error(m); })) inferred.push_back(d.value);
  Shape ys = inferred;
  if (c.has_input(2)) {
    ys = int_values(c.input(2), "output_shape", [&](const std::string& m) { c.error(m); });
    if (ys.size() != size_t(X.rank())) c.error("output_shape " + shape_str(ys) + " must have X's rank " + std::to_string(X.rank()));
    for (size_t d = 0; d < ys.size(); ++d)
      if (ys[d] < inferred[d]) c.error("output_shape " + shape_str(ys) + " is smaller than the unpooled shape " + shape_str(inferred));
  }
  const int64_t total = shape_numel(inferred), count = X.numel();
  const int64_t* idx = I.data<int64_t>();
  for (int64_t i = 0; i < count; ++i)
    if (idx[i] < 0 || idx[i] >= total)
      c.error("index " + std::to_string(idx[i]) + " at I[" + std::to_string(i) + "] is outside the unpooled shape's " +
              std::to_string(total) + " elements");
  Tensor Y(X.dtype(), ys);
  return dispatch_dtype(X.dtype(), [&](auto tag) -> std::vector<Tensor> {
    using T = decltype(tag);
    T* y = Y.data<T>();
    const T* x = X.data<T>();
    for (int64_t i = 0, e = Y.numel(); i < e; ++i) y[i] = T{};
    for (int64_t i = 0; i < count; ++i) {
      // Element idx of the inferred shape, at the same coordinates in Y.
      int64_t off = 0, stride = 1, r = idx[i];
      for (size_t d = inferred.size(); d-- > 0;) {
        off += (r % inferred[d]) * stride;
        r /= inferred[d];
        stride *= ys[d];
      }
      y[off] = x[i];
    }
    return {Y};
  });
}

InferResult infer_maxunpool(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (c.input(1).dtype != DType::Int64) c.error(std::string("I must be int64, got ") + dtype_name(c.input(1).dtype));
  InferResult r;
  if (c.has_input(2)) {
    if (const Tensor* os = c.value(2)) {
      std::vector<Dim> d;
      const std::vector<int64_t> vals = int_values(*os, "output_shape", [&](const std::string& m) { c.error(m); });
      for (int64_t v : vals) {
        if (v < 0) c.error("output_shape " + shape_str(vals) + " has a negative dim");
        d.push_back(Dim(v));
      }
      r.outputs.push_back(TensorType(x.dtype, d));
    } else {
      r.outputs.push_back(x.has_shape ? TensorType(x.dtype, std::vector<Dim>(size_t(x.rank()))) : TensorType::unknown_shape(x.dtype));
    }
    return r;
  }
  if (!x.has_shape) {
    r.outputs.push_back(TensorType::unknown_shape(x.dtype));
    return r;
  }
  if (x.rank() < 3) c.error("X must be [N, C, spatial...], got rank " + std::to_string(x.rank()));
  r.outputs.push_back(TensorType(x.dtype, unpool_shape(c.node, x.dims, [&](const std::string& m) { c.error(m); })));
  return r;
}

}  // namespace

void register_nn_fold_ops(OpRegistry& r) {
  {
    OpSchema s = nn_schema("Col2Im", 18, 3, 3);
    s.infer = infer_col2im;
    s.kernel = col2im_kernel;
    s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) { return numel_or0(ins[0]); };
    r.add(std::move(s));
  }
  {
    OpSchema s = nn_schema("MaxUnpool", 9, 2, 3);
    s.infer = infer_maxunpool;
    s.kernel = maxunpool_kernel;
    s.flops = [](const Node&, const std::vector<TensorType>&, const std::vector<TensorType>& outs) { return numel_or0(outs[0]); };
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::nn
