// RoiAlign (opsets 10, 16): each region of interest [x1, y1, x2, y2] (scaled by spatial_scale)
// of image batch_indices[r] cut into output_height x output_width bins; each bin is the average
// (mode "avg") or the maximum ("max") of sampling_ratio^2 bilinear samples (sampling_ratio 0:
// ceil(roi size / bins) per axis) at the centres of a regular grid in the bin.
// coordinate_transformation_mode "half_pixel" (the default from opset 16) shifts the region by
// -0.5; "output_half_pixel" (opset 10's only behaviour) does not, and makes a region smaller than
// one pixel one pixel. A sample more than one pixel outside the image counts as 0; one within
// clamps to the border (a non-finite one counts as outside). "max" takes the largest of the four weighted corner values of each
// sample, as ONNX Runtime and the ONNX reference do (not the maximum of interpolated values).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {

namespace {

struct RoiParams {
  int64_t out_h = 1, out_w = 1, sampling = 0;
  double scale = 1.0;
  bool half_pixel = true, max_mode = false;
};

template <class Fail>
RoiParams roi_params(const Node& node, int64_t opset, const Fail& fail) {
  RoiParams p;
  p.out_h = node.attrs.get_int("output_height", 1);
  p.out_w = node.attrs.get_int("output_width", 1);
  p.sampling = node.attrs.get_int("sampling_ratio", 0);
  p.scale = node.attrs.get_float("spatial_scale", 1.0f);
  const std::string mode = node.attrs.get_string("mode", "avg");
  const std::string ctm = node.attrs.get_string("coordinate_transformation_mode", opset >= 16 ? "half_pixel" : "output_half_pixel");
  if (p.out_h <= 0 || p.out_w <= 0)
    fail("output_height and output_width must be positive, got " + std::to_string(p.out_h) + " x " + std::to_string(p.out_w));
  if (p.sampling < 0) fail("sampling_ratio must be >= 0, got " + std::to_string(p.sampling));
  if (mode != "avg" && mode != "max") fail("mode must be avg or max, got '" + mode + "'");
  if (ctm != "half_pixel" && ctm != "output_half_pixel")
    fail("coordinate_transformation_mode must be half_pixel or output_half_pixel, got '" + ctm + "'");
  p.max_mode = mode == "max";
  p.half_pixel = ctm == "half_pixel";
  return p;
}

// One bilinear sample: four positions in an H x W plane and their weights (all 0 outside).
struct Sample {
  int64_t pos[4] = {0, 0, 0, 0};
  double w[4] = {0, 0, 0, 0};
};

Sample bilinear_sample(double y, double x, int64_t H, int64_t W) {
  Sample s;
  if (!(y >= -1.0 && y <= double(H) && x >= -1.0 && x <= double(W))) return s;  // NaN included
  y = std::max(y, 0.0), x = std::max(x, 0.0);
  int64_t y0 = int64_t(y), x0 = int64_t(x);
  // At or past the last row (column) the sample is that row: both corners there, weight on one.
  if (y0 >= H - 1) y0 = H - 1, y = double(y0);
  if (x0 >= W - 1) x0 = W - 1, x = double(x0);
  const int64_t y1 = std::min(y0 + 1, H - 1), x1 = std::min(x0 + 1, W - 1);
  const double ly = y - double(y0), lx = x - double(x0), hy = 1.0 - ly, hx = 1.0 - lx;
  s.pos[0] = y0 * W + x0, s.pos[1] = y0 * W + x1, s.pos[2] = y1 * W + x0, s.pos[3] = y1 * W + x1;
  s.w[0] = hy * hx, s.w[1] = hy * lx, s.w[2] = ly * hx, s.w[3] = ly * lx;
  return s;
}

template <class T>
Tensor roi_align_typed(const KernelContext& c, const Tensor& X, const Tensor& rois, const std::vector<int64_t>& batch, const RoiParams& p) {
  const int64_t C = X.shape()[1], H = X.shape()[2], W = X.shape()[3], R = int64_t(batch.size());
  Tensor Y(X.dtype(), {R, C, p.out_h, p.out_w});
  const T* x = X.data<T>();
  const T* roi = rois.data<T>();
  T* y = Y.data<T>();
  const double offset = p.half_pixel ? 0.5 : 0.0;
  std::vector<Sample> samples;
  for (int64_t r = 0; r < R; ++r) {
    const double x1 = double(roi[r * 4 + 0]) * p.scale - offset, y1 = double(roi[r * 4 + 1]) * p.scale - offset;
    const double x2 = double(roi[r * 4 + 2]) * p.scale - offset, y2 = double(roi[r * 4 + 3]) * p.scale - offset;
    double rw = x2 - x1, rh = y2 - y1;
    if (!p.half_pixel) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
    const double bh = rh / double(p.out_h), bw = rw / double(p.out_w);
    // Samples per bin and axis: sampling_ratio, or ceil(bin size) (none for an inverted region).
    auto grid = [&](double bin, const char* axis) {
      const double g = p.sampling > 0 ? double(p.sampling) : std::ceil(bin);
      if (!(g <= double(1 << 20)))  // NaN included
        c.error("region " + std::to_string(r) + " needs " + std::to_string(g) + " samples per bin along " + axis +
                " (sampling_ratio, or a coordinate in rois, non-finite or too large)");
      return g <= 0 ? int64_t(0) : int64_t(g);
    };
    const int64_t gh = grid(bh, "y"), gw = grid(bw, "x");
    if (gh * gw > (int64_t(1) << 20))
      c.error("region " + std::to_string(r) + " needs a " + std::to_string(gh) + " x " + std::to_string(gw) + " sampling grid per bin");
    const double count = double(std::max<int64_t>(gh * gw, 1));
    for (int64_t ph = 0; ph < p.out_h; ++ph)
      for (int64_t pw = 0; pw < p.out_w; ++pw) {
        // The bin's samples, shared by all channels.
        samples.clear();
        for (int64_t iy = 0; iy < gh; ++iy)
          for (int64_t ix = 0; ix < gw; ++ix)
            samples.push_back(bilinear_sample(y1 + double(ph) * bh + (double(iy) + 0.5) * bh / double(gh),
                                              x1 + double(pw) * bw + (double(ix) + 0.5) * bw / double(gw), H, W));
        for (int64_t ch = 0; ch < C; ++ch) {
          const T* plane = x + (batch[size_t(r)] * C + ch) * H * W;
          double acc = 0.0;
          for (size_t k = 0; k < samples.size(); ++k) {
            const Sample& s = samples[k];
            if (p.max_mode) {
              double v = s.w[0] * double(plane[s.pos[0]]);
              for (int i = 1; i < 4; ++i) v = std::max(v, s.w[i] * double(plane[s.pos[i]]));
              acc = k == 0 ? v : std::max(acc, v);
            } else {
              for (int i = 0; i < 4; ++i) acc += s.w[i] * double(plane[s.pos[i]]);
            }
          }
          y[((r * C + ch) * p.out_h + ph) * p.out_w + pw] = T(p.max_mode ? acc : acc / count);
        }
      }
  }
  return Y;
}

std::vector<Tensor> roi_align_kernel(const KernelContext& c) {
  const Tensor& X = c.input(0);
  const Tensor& rois = c.input(1);
  const Tensor& bi = c.input(2);
  const RoiParams p = roi_params(c.node, c.opset, [&](const std::string& m) { c.error(m); });
  if (X.rank() != 4) c.error("X must be [N, C, H, W], got " + shape_str(X.shape()));
  const int64_t R = bi.rank() == 1 ? bi.shape()[0] : -1;
  if (R < 0 || rois.shape() != Shape{R, 4})
    c.error("rois must be [num_rois, 4] and batch_indices [num_rois], got " + shape_str(rois.shape()) + " and " + shape_str(bi.shape()));
  if (rois.dtype() != X.dtype()) c.error("rois must have X's dtype");
  const std::vector<int64_t> batch = bi.to_int_vector();
  for (int64_t r = 0; r < R; ++r) {
    if (batch[size_t(r)] < 0 || batch[size_t(r)] >= X.shape()[0])
      c.error("batch_indices[" + std::to_string(r) + "] = " + std::to_string(batch[size_t(r)]) + " is outside the batch of " +
              std::to_string(X.shape()[0]));
  }
  return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) -> std::vector<Tensor> {
    using T = decltype(tag);
    return {roi_align_typed<T>(c, *in[0], *in[1], batch, p)};
  });
}

InferResult infer_roi_align(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (!is_floatish(x.dtype)) c.error(std::string("X must be a float tensor, got ") + dtype_name(x.dtype));
  const DType bt = c.input(2).dtype;
  if (bt != DType::Int64 && bt != DType::Int32) c.error(std::string("batch_indices must be int64, got ") + dtype_name(bt));
  if (x.has_shape && x.rank() != 4) c.error("X must be [N, C, H, W], got rank " + std::to_string(x.rank()));
  const RoiParams p = roi_params(c.node, c.opset, [&](const std::string& m) { c.error(m); });
  const TensorType& b = c.input(2);
  InferResult r;
  r.outputs.push_back(
      TensorType(x.dtype, {b.has_shape && b.rank() == 1 ? b.dims[0] : Dim{}, x.has_shape ? x.dims[1] : Dim{}, Dim(p.out_h), Dim(p.out_w)}));
  return r;
}

}  // namespace

void register_nn_roi_ops(OpRegistry& r) {
  OpSchema s = nn_schema("RoiAlign", 10, 3, 3);
  s.infer = infer_roi_align;
  s.kernel = roi_align_kernel;
  // Per output element: the samples of its bin, 4 multiply-adds each (counted as one sample per
  // output element where the grid is data-dependent).
  s.flops = [](const Node& n, const std::vector<TensorType>&, const std::vector<TensorType>& outs) {
    const int64_t sr = std::max<int64_t>(n.attrs.get_int("sampling_ratio", 0), 1);
    return 8.0 * double(sr * sr) * numel_or0(outs[0]);
  };
  r.add(std::move(s));
}

}  // namespace nnfuse::nn
