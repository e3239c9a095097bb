// Sampling grids: AffineGrid (opset 20) makes one from affine matrices, GridSample (opsets 16,
// 20, 22) reads an input at it.
//
// GridSample samples X [N, C, D1..Dr] at the normalised coordinates of
// grid [N, O1..Or, r] (grid[..., 0] indexes the last axis, as x indexes width). Modes nearest,
// linear and cubic (opset 16's names bilinear and bicubic too), padding zeros, border or
// reflection, align_corners; any number of spatial axes. Computes in double, following the
// spec's reference implementation (onnx.reference op_grid_sample) step for step: a coordinate
// outside the border is clamped or reflected before the taps are taken, and each tap again.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "graph/ops_tensor_util.h"

namespace nnfuse::tensor_ops {

namespace {

struct GridSampleArgs {
  enum Mode { Nearest, Linear, Cubic } mode = Linear;
  enum Pad { Zeros, Border, Reflection } pad = Zeros;
  bool align = false;
};

GridSampleArgs grid_sample_args(const Node& n, int64_t opset) {
  GridSampleArgs a;
  const std::string mode = n.attrs.get_string("mode", opset >= 20 ? "linear" : "bilinear");
  const std::string pad = n.attrs.get_string("padding_mode", "zeros");
  auto bad = [&](const std::string& what) { fail(ErrorKind::Model, "GridSample: " + what, {"", 0, 0, n.label(), n.op_type, int(opset)}); };
  if (mode == "nearest") a.mode = GridSampleArgs::Nearest;
  else if (mode == "linear" || mode == "bilinear") a.mode = GridSampleArgs::Linear;
  else if (mode == "cubic" || mode == "bicubic") a.mode = GridSampleArgs::Cubic;
  else bad("mode '" + mode + "' is not nearest, linear or cubic");
  if (pad == "zeros") a.pad = GridSampleArgs::Zeros;
  else if (pad == "border") a.pad = GridSampleArgs::Border;
  else if (pad == "reflection") a.pad = GridSampleArgs::Reflection;
  else bad("padding_mode '" + pad + "' is not zeros, border or reflection");
  a.align = n.attrs.get_int("align_corners", 0) != 0;
  return a;
}

// Reflects x by the nearer border until it lies within [lo, hi]. The count of reflections stays a
// double: a far coordinate (a grid value of 1e30) would overflow an integer. A one-point extent
// (one pixel with align_corners) reflects everything onto it.
double reflect(double x, double lo, double hi) {
  const double rng = hi - lo;
  if (x >= lo && x <= hi) return x;
  if (!(rng > 0)) return lo;
  const double dx = x < lo ? lo - x : x - hi;
  const double k = std::floor(dx / rng), r = std::min(std::max(dx - k * rng, 0.0), rng);
  const bool even = std::fmod(k, 2.0) == 0;
  if (x < lo) return even ? lo + r : hi - r;
  return even ? hi - r : lo + r;
}

void cubic_coeffs(double x, double (&c)[4]) {
  const double A = -0.75;
  x = std::fabs(x);
  c[0] = ((A * (x + 1) - 5 * A) * (x + 1) + 8 * A) * (x + 1) - 4 * A;
  c[1] = ((A + 2) * x - (A + 3)) * x * x + 1;
  c[2] = ((A + 2) * (1 - x) - (A + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = ((A * (2 - x) - 5 * A) * (2 - x) + 8 * A) * (2 - x) - 4 * A;
}

template <class T>
Tensor grid_sample_typed(const KernelContext& c, const Tensor& X, const Tensor& G, const GridSampleArgs& a) {
  const int64_t r = X.rank() - 2;
  if (r < 1 || G.rank() != r + 2 || G.dim(0) != X.dim(0) || G.dim(G.rank() - 1) != r)
    c.error("grid " + shape_str(G.shape()) + " does not match input " + shape_str(X.shape()) + " (expected [N, O1..O" + std::to_string(r) + ", " +
            std::to_string(r) + "])");
  const int64_t N = X.dim(0), C = X.dim(1);
  Shape ys{N, C};
  int64_t P = 1;
  for (int64_t i = 1; i <= r; ++i) ys.push_back(G.dim(i)), P *= G.dim(i);
  std::vector<int64_t> dims(static_cast<size_t>(r)), xstride(static_cast<size_t>(r));
  int64_t S = 1;
  for (int64_t i = r - 1; i >= 0; --i) dims[size_t(i)] = X.dim(2 + i), xstride[size_t(i)] = S, S *= dims[size_t(i)];
  std::vector<double> lo(static_cast<size_t>(r)), hi(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i)
    lo[size_t(i)] = a.align ? 0.0 : -0.5, hi[size_t(i)] = a.align ? double(dims[size_t(i)] - 1) : double(dims[size_t(i)]) - 0.5;
  Tensor Y(X.dtype(), ys);
  if (S == 0 && P > 0 && N * C > 0) {
    // No pixel to sample: zero padding reads zeros everywhere; border and reflection have nothing
    // to clamp or reflect onto.
    if (a.pad != GridSampleArgs::Zeros) c.error("input " + shape_str(X.shape()) + " has no pixels for border or reflection padding to read");
    std::fill(Y.data<T>(), Y.data<T>() + Y.numel(), T(0));
    return Y;
  }
  const T* x = X.data<T>();
  const T* g = G.data<T>();
  T* y = Y.data<T>();
  // The value at integer index idx[i] per axis, with the padding mode's rule per axis.
  auto pixel = [&](const T* plane, const std::vector<int64_t>& idx) -> double {
    int64_t off = 0;
    for (int64_t i = 0; i < r; ++i) {
      int64_t k = idx[size_t(i)];
      const int64_t d = dims[size_t(i)];
      if (a.pad == GridSampleArgs::Zeros) {
        if (k < 0 || k >= d) return 0.0;
      } else if (a.pad == GridSampleArgs::Border) {
        k = std::min(std::max<int64_t>(k, 0), d - 1);
      } else {
        k = int64_t(reflect(double(k), lo[size_t(i)], hi[size_t(i)]));
      }
      off += k * xstride[size_t(i)];
    }
    return double(plane[off]);
  };
  const int taps = a.mode == GridSampleArgs::Cubic ? 4 : a.mode == GridSampleArgs::Linear ? 2 : 1;
  int64_t corners = 1;
  for (int64_t i = 0; i < r; ++i) corners *= taps;
  std::vector<double> pos(static_cast<size_t>(r));
  std::vector<int64_t> base(static_cast<size_t>(r)), idx(static_cast<size_t>(r));
  std::vector<std::array<double, 4>> w(static_cast<size_t>(r));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p = 0; p < P; ++p) {
      const T* gp = g + (n * P + p) * r;
      bool nan_point = false;
      for (int64_t i = 0; i < r; ++i) {
        const double v = double(gp[r - 1 - i]);  // grid's last component is the first axis
        const double d = double(dims[size_t(i)]);
        double u = a.align ? (v + 1) / 2.0 * (d - 1) : ((v + 1) * d - 1) / 2.0;
        if (a.mode == GridSampleArgs::Nearest) u = std::nearbyint(u);  // half to even, as np.rint
        if (u < lo[size_t(i)] || u > hi[size_t(i)]) {
          if (a.pad == GridSampleArgs::Border) u = std::min(std::max(u, 0.0), d - 1);
          else if (a.pad == GridSampleArgs::Reflection) u = reflect(u, lo[size_t(i)], hi[size_t(i)]);
        }
        // Past any tap's reach of the input, zero padding reads zeros whatever the distance: clamp
        // there so that the index arithmetic below stays in range (a grid value of 1e30 or inf).
        // A NaN coordinate (or an infinite one reflected) has no position: NaN out.
        if (std::isnan(u)) {
          nan_point = true;
          break;
        }
        u = std::min(std::max(u, lo[size_t(i)] - 8), hi[size_t(i)] + 8);
        pos[size_t(i)] = u;
        if (a.mode == GridSampleArgs::Nearest) {
          base[size_t(i)] = int64_t(u);
          w[size_t(i)] = {1.0, 0, 0, 0};
        } else {
          const double f = std::floor(u), t = u - f;
          base[size_t(i)] = int64_t(f) - (a.mode == GridSampleArgs::Cubic ? 1 : 0);
          if (a.mode == GridSampleArgs::Linear) {
            w[size_t(i)] = {1 - t, t, 0, 0};
          } else {
            double cc[4];
            cubic_coeffs(t, cc);
            w[size_t(i)] = {cc[0], cc[1], cc[2], cc[3]};
          }
        }
      }
      if (nan_point) {
        for (int64_t ch = 0; ch < C; ++ch) y[(n * C + ch) * P + p] = T(std::numeric_limits<double>::quiet_NaN());
        continue;
      }
      for (int64_t ch = 0; ch < C; ++ch) {
        const T* plane = x + (n * C + ch) * S;
        double acc = 0;
        for (int64_t k = 0; k < corners; ++k) {
          double wk = 1;
          for (int64_t i = r - 1, rest = k; i >= 0; --i, rest /= taps) {
            const int t = int(rest % taps);
            idx[size_t(i)] = base[size_t(i)] + t;
            wk *= w[size_t(i)][size_t(t)];
          }
          if (wk != 0) acc += wk * pixel(plane, idx);
        }
        y[(n * C + ch) * P + p] = T(acc);
      }
    }
  return Y;
}

InferResult infer_grid_sample(const InferContext& c) {
  const TensorType &x = c.input(0), &g = c.input(1);
  grid_sample_args(c.node, c.opset);
  if (!x.has_shape || !g.has_shape) return infer_one(TensorType::unknown_shape(x.dtype));
  if (x.rank() < 3 || g.rank() != x.rank()) c.error("grid " + g.str() + " does not match input " + x.str());
  std::vector<Dim> d{x.dims[0], x.dims[1]};
  for (int64_t i = 1; i + 1 < g.rank(); ++i) d.push_back(g.dims[size_t(i)]);
  return infer_one(TensorType(x.dtype, d));
}

std::vector<Tensor> kernel_grid_sample(const KernelContext& c) {
  const GridSampleArgs a = grid_sample_args(c.node, c.opset);
  const Tensor& X = c.input(0);
  const Tensor& G = c.input(1);
  if (X.dtype() == DType::Float64 && G.dtype() == DType::Float64) return {grid_sample_typed<double>(c, X, G, a)};
  if (!dtype_is_float(X.dtype()) || !dtype_is_float(G.dtype()))
    c.unsupported(std::string("GridSample on ") + dtype_name(X.dtype()) + " input and " + dtype_name(G.dtype()) + " grid is not supported");
  Tensor y = grid_sample_typed<float>(c, X.cast(DType::Float32), G.cast(DType::Float32), a);
  return {X.dtype() == DType::Float32 ? y : y.cast(X.dtype())};
}

// AffineGrid: theta [N, 2, 3] and size [N, C, H, W] give grid [N, H, W, 2] (3-D: theta
// [N, 3, 4], size [N, C, D, H, W], grid [N, D, H, W, 3]); grid = theta x (x, y[, z], 1) with
// the coordinates of pixel centres in [-1, 1] (align_corners: of the corner pixels).
std::vector<int64_t> affine_sizes(const Tensor& size, const KernelContext* c, const Node& n) {
  std::vector<int64_t> s;
  for (int64_t i = 0; i < size.numel(); ++i) s.push_back(size.as_int(i));
  if (s.size() != 4 && s.size() != 5) {
    const std::string m = "size must hold 4 (N, C, H, W) or 5 (N, C, D, H, W) values, got " + std::to_string(s.size());
    if (c) c->error(m);
    fail(ErrorKind::Model, m, {"", 0, 0, n.label(), n.op_type});
  }
  return s;
}

std::vector<Tensor> kernel_affine_grid(const KernelContext& c) {
  const Tensor& theta = c.input(0);
  const std::vector<int64_t> size = affine_sizes(c.input(1), &c, c.node);
  const int64_t r = int64_t(size.size()) - 2;  // spatial axes
  if (theta.rank() != 3 || theta.dim(0) != size[0] || theta.dim(1) != r || theta.dim(2) != r + 1)
    c.error("theta " + shape_str(theta.shape()) + " must be [" + std::to_string(size[0]) + ", " + std::to_string(r) + ", " + std::to_string(r + 1) + "]");
  const bool align = c.node.attrs.get_int("align_corners", 0) != 0;
  Shape out{size[0]};
  int64_t P = 1;
  for (int64_t i = 0; i < r; ++i) out.push_back(size[size_t(2 + i)]), P *= size[size_t(2 + i)];
  out.push_back(r);
  const Tensor th = theta.cast(DType::Float64);
  Tensor y(DType::Float64, out);
  // Coordinate of index i on an axis of n pixels.
  auto coord = [&](int64_t i, int64_t n) { return align ? (n > 1 ? -1.0 + 2.0 * double(i) / double(n - 1) : -1.0) : -1.0 + (2.0 * double(i) + 1.0) / double(n); };
  for (int64_t b = 0; b < size[0]; ++b)
    for (int64_t p = 0; p < P; ++p) {
      double h[4] = {0, 0, 0, 1};  // (x, y[, z], 1): x along the last axis
      for (int64_t i = r - 1, rest = p; i >= 0; --i) {
        const int64_t n = size[size_t(2 + i)];
        h[r - 1 - i] = coord(rest % n, n);
        rest /= n;
      }
      h[r] = 1;
      for (int64_t k = 0; k < r; ++k) {
        double acc = 0;
        for (int64_t j = 0; j <= r; ++j) acc += th.data<double>()[(b * r + k) * (r + 1) + j] * h[j];
        y.data<double>()[(b * P + p) * r + k] = acc;
      }
    }
  return {y.cast(theta.dtype())};
}

InferResult infer_affine_grid(const InferContext& c) {
  const TensorType& theta = c.input(0);
  const Tensor* size = c.value(1);
  if (!size) {
    const TensorType& st = c.input(1);
    if (st.has_shape && st.rank() == 1 && st.dims[0].known()) {
      const int64_t r = st.dims[0].value - 2;
      return infer_one(TensorType(theta.dtype, std::vector<Dim>(size_t(r + 2), Dim{})));
    }
    return infer_one(TensorType::unknown_shape(theta.dtype));
  }
  const std::vector<int64_t> s = affine_sizes(*size, nullptr, c.node);
  std::vector<Dim> d{Dim(s[0])};
  for (size_t i = 2; i < s.size(); ++i) d.push_back(Dim(s[i]));
  d.push_back(Dim(int64_t(s.size()) - 2));
  return infer_one(TensorType(theta.dtype, d));
}

}  // namespace

void register_tensor_grid_sample_ops(OpRegistry& r) {
  {
    OpSchema s = data_movement_schema("AffineGrid", 20, MappingType::ManyToMany, 2, 2, infer_affine_grid, kernel_affine_grid);
    s.flops = [](const Node&, const std::vector<TensorType>&, const std::vector<TensorType>& outs) {
      return outs.empty() ? 0.0 : 8.0 * (outs[0].numel() ? double(*outs[0].numel()) : 0.0);
    };
    r.add(std::move(s));
  }
  OpSchema s = data_movement_schema("GridSample", 16, MappingType::ManyToMany, 2, 2, infer_grid_sample, kernel_grid_sample);
  // Taps per output value: 1, 2^r or 4^r reads and multiply-adds (counted as 2 per tap).
  s.flops = [](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
    if (outs.empty() || !outs[0].numel() || !ins[0].has_shape) return 0.0;
    const std::string mode = n.attrs.get_string("mode", "linear");
    const double per = mode == "nearest" ? 1.0 : std::pow(mode == "cubic" || mode == "bicubic" ? 4.0 : 2.0, double(ins[0].rank() - 2));
    return 2.0 * per * double(*outs[0].numel());
  };
  r.add(std::move(s));
}

}  // namespace nnfuse::tensor_ops
