// Resize (opsets 10, 11, 13, 18, 19) and Upsample (7-9). The resampling is separable: each
// resized axis gets, per output index, a list of (input index, weight) taps, and the kernel runs
// one pass per axis. Nearest mode needs one tap of weight 1 per axis and so moves bytes (every
// dtype); linear and cubic compute in double.
#include <algorithm>
#include <cmath>

#include "graph/ops_tensor_util.h"
#include "graph/resampling.h"

namespace nnfuse::tensor_ops {

namespace {

struct ResizeAttrs {
  std::string mode = "nearest";      // nearest | linear | cubic
  std::string coord = "asymmetric";  // coordinate_transformation_mode
  std::string nearest = "simple";    // nearest_mode; "simple" is opset <= 10 (floor up, ceil down)
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0.0;
  bool antialias = false;
  std::string policy = "stretch";  // keep_aspect_ratio_policy
  std::vector<int64_t> axes;       // opset 18
};

bool is_upsample(const Node& n) { return n.op_type == "Upsample"; }

ResizeAttrs resize_attrs(const Node& n, int64_t opset) {
  ErrorContext ec{"", 0, 0, n.label(), n.op_type, int(opset)};
  ResizeAttrs a;
  const Attributes& at = n.attrs;
  a.mode = at.get_string("mode", "nearest");
  if (a.mode == "bilinear") a.mode = "linear";  // Upsample-7's spelling
  if (a.mode != "nearest" && a.mode != "linear" && !(a.mode == "cubic" && !is_upsample(n) && opset >= 11))
    fail(ErrorKind::Unsupported, "mode '" + a.mode + "' is not supported", ec);
  if (!is_upsample(n) && opset >= 11) {
    a.coord = at.get_string("coordinate_transformation_mode", "half_pixel");
    a.nearest = at.get_string("nearest_mode", "round_prefer_floor");
    a.cubic_a = at.get_float("cubic_coeff_a", -0.75f);
    a.exclude_outside = at.get_int("exclude_outside", 0) != 0;
    a.extrapolation = at.get_float("extrapolation_value", 0.0f);
    static const char* coords[] = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize",
                                   "half_pixel_symmetric", "tf_half_pixel_for_nn"};
    bool ok = false;
    for (auto* c : coords) ok |= a.coord == c;
    if (a.coord == "half_pixel_symmetric" && opset < 19) ok = false;
    if (!ok) fail(ErrorKind::Unsupported, "coordinate_transformation_mode '" + a.coord + "' is not supported", ec);
    if (a.nearest != "round_prefer_floor" && a.nearest != "round_prefer_ceil" && a.nearest != "floor" && a.nearest != "ceil")
      fail(ErrorKind::Unsupported, "nearest_mode '" + a.nearest + "' is not supported", ec);
  }
  if (!is_upsample(n) && opset >= 18) {
    a.antialias = at.get_int("antialias", 0) != 0;
    a.policy = at.get_string("keep_aspect_ratio_policy", "stretch");
    if (a.policy != "stretch" && a.policy != "not_larger" && a.policy != "not_smaller")
      fail(ErrorKind::Unsupported, "keep_aspect_ratio_policy '" + a.policy + "' is not supported", ec);
    a.axes = at.get_ints("axes");
  }
  return a;
}

// Where each input lives: (roi, scales, sizes) input indices, or -1 when this form has none.
struct ResizeInputs {
  int roi = -1, scales = -1, sizes = -1;
};
ResizeInputs resize_inputs(const Node& n, int64_t opset) {
  if (is_upsample(n)) return {-1, opset >= 9 ? 1 : -1, -1};
  if (opset < 11) return {-1, 1, -1};
  return {1, 2, 3};
}

// Output shape and the per-axis scales used by the coordinate transform.
struct ResizeShape {
  std::vector<Dim> out;
  std::vector<float> scales;  // per dim
  bool known = false;         // false: scales/sizes data unknown
};

ResizeShape resize_shape(const Node& n, int64_t opset, const ResizeAttrs& a, const std::vector<Dim>& in,
                         const std::optional<std::vector<float>>& scales_in, const std::optional<std::vector<int64_t>>& sizes_in,
                         bool scales_given, bool sizes_given) {
  ErrorContext ec{"", 0, 0, n.label(), n.op_type, int(opset)};
  const int64_t r = int64_t(in.size());
  ResizeShape rs;
  rs.out = in;
  rs.scales.assign(static_cast<size_t>(r), 1.0f);
  std::vector<int64_t> axes = a.axes;
  for (auto& x : axes) x = normalize_axis(x, r, n);
  if (axes.empty())
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  std::vector<float> scales;
  if (is_upsample(n) && opset < 9) {
    scales = n.attrs.get_floats("scales");
    scales_given = true;
  } else if (scales_given) {
    if (!scales_in) return rs;
    scales = *scales_in;
  }
  if (sizes_given) {
    if (!sizes_in) return rs;
    const auto& sz = *sizes_in;
    if (sz.size() != axes.size())
      fail(ErrorKind::Shape, "Resize: sizes has " + std::to_string(sz.size()) + " entries for " + std::to_string(axes.size()) + " axes", ec);
    if (a.policy == "stretch") {
      for (size_t i = 0; i < axes.size(); ++i) {
        size_t ax = size_t(axes[i]);
        rs.out[ax] = Dim(sz[i]);
        if (in[ax].known() && in[ax].value > 0) rs.scales[ax] = float(sz[i]) / float(in[ax].value);
      }
    } else {
      float s = a.policy == "not_larger" ? 1e30f : 0.0f;
      for (size_t i = 0; i < axes.size(); ++i) {
        size_t ax = size_t(axes[i]);
        if (!in[ax].known()) return rs;
        float v = float(sz[i]) / float(in[ax].value);
        s = a.policy == "not_larger" ? std::min(s, v) : std::max(s, v);
      }
      for (size_t i = 0; i < axes.size(); ++i) {
        size_t ax = size_t(axes[i]);
        rs.scales[ax] = s;
        rs.out[ax] = Dim(int64_t(std::nearbyint(double(s) * double(in[ax].value))));
      }
    }
    rs.known = true;
    return rs;
  }
  if (scales.empty()) fail(ErrorKind::Shape, "Resize: neither scales nor sizes is given", ec);
  if (scales.size() != axes.size())
    fail(ErrorKind::Shape, "Resize: scales has " + std::to_string(scales.size()) + " entries for " + std::to_string(axes.size()) + " axes", ec);
  for (size_t i = 0; i < axes.size(); ++i) {
    size_t ax = size_t(axes[i]);
    if (scales[i] <= 0) fail(ErrorKind::Shape, "Resize: scale " + std::to_string(scales[i]) + " must be positive", ec);
    rs.scales[ax] = scales[i];
    if (in[ax].known()) {
      // Checked before the conversion: a size past int64 (scale 1e30) converts to garbage.
      const double m = std::floor(double(float(in[ax].value) * scales[i]));
      if (!(m < 0x1p62))
        fail(ErrorKind::Shape, "Resize: axis " + std::to_string(ax) + " of size " + std::to_string(in[ax].value) + " times scale " +
                                   std::to_string(scales[i]) + " is past 2^62", ec);
      rs.out[ax] = Dim(int64_t(m));
    }
    else if (scales[i] != 1.0f) rs.out[ax] = Dim{};
  }
  rs.known = true;
  return rs;
}

std::optional<std::vector<float>> float_data(const Tensor* t) {
  if (!t) return std::nullopt;
  return t->to_float_vector();
}

InferResult infer_resize(const InferContext& c) {
  const TensorType& x = c.input(0);
  ResizeAttrs a = resize_attrs(c.node, c.opset);
  if (!x.has_shape) return unknown_rank(x.dtype);
  ResizeInputs ri = resize_inputs(c.node, c.opset);
  bool sizes_given = ri.sizes >= 0 && c.has_input(size_t(ri.sizes)) &&
                     !(c.inputs[size_t(ri.sizes)].has_shape && c.inputs[size_t(ri.sizes)].numel() == std::optional<int64_t>(0));
  bool scales_given = ri.scales >= 0 && c.has_input(size_t(ri.scales)) &&
                      !(c.inputs[size_t(ri.scales)].has_shape && c.inputs[size_t(ri.scales)].numel() == std::optional<int64_t>(0));
  if (sizes_given && scales_given && c.value(size_t(ri.scales)) && c.value(size_t(ri.scales))->numel() == 0) scales_given = false;
  if (sizes_given && c.value(size_t(ri.sizes)) && c.value(size_t(ri.sizes))->numel() == 0) sizes_given = false;
  std::optional<std::vector<int64_t>> sizes;
  if (sizes_given) sizes = const_ints(c, size_t(ri.sizes));
  auto scales = scales_given && !sizes_given ? float_data(c.value(size_t(ri.scales))) : std::nullopt;
  ResizeShape rs = resize_shape(c.node, c.opset, a, x.dims, scales, sizes, scales_given && !sizes_given, sizes_given);
  if (!rs.known && sizes_given && a.policy == "stretch" && a.axes.empty()) {
    // Sizes built from symbolic shape data (Concat(Shape(x)[:2], [64, 64])) give the dims as is.
    if (auto dims = const_dims(c, size_t(ri.sizes)); dims && dims->size() == x.dims.size())
      return infer_one(TensorType(x.dtype, *dims));
  }
  if (!rs.known) return infer_one(TensorType(x.dtype, std::vector<Dim>(x.dims.size(), Dim{})));
  return infer_one(TensorType(x.dtype, rs.out));
}

// ---------------------------------------------------------------- taps
struct Taps {
  // For output index o: taps[o] (input index, weight); empty with extrapolate[o] set means the
  // output takes the extrapolation value.
  std::vector<std::vector<std::pair<int64_t, double>>> taps;
  std::vector<bool> extrapolate;
};

// `out` is the resized length as a real number, in * scale, as the ONNX reference uses it (with
// sizes given, scale = sizes / in and it is the integer size).
double original_coord(const ResizeAttrs& a, double x, int64_t in, double out, int64_t out_int, double scale, double roi_start,
                      double roi_end) {
  const std::string& m = a.coord;
  if (m == "asymmetric") return x / scale;
  if (m == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (m == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (m == "align_corners") return out == 1 ? 0.0 : x * double(in - 1) / (out - 1);
  if (m == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (m == "half_pixel_symmetric") {
    double adjustment = double(out_int) / out;
    double center = double(in) / 2.0;
    double offset = center * (1.0 - adjustment);
    return offset + (x + 0.5) / scale - 0.5;
  }
  // tf_crop_and_resize
  if (out > 1) return roi_start * double(in - 1) + x * (roi_end - roi_start) * double(in - 1) / (out - 1);
  return 0.5 * (roi_start + roi_end) * double(in - 1);
}

int64_t nearest_index(const ResizeAttrs& a, double x, double scale) {
  const std::string& m = a.nearest;
  if (m == "simple") return scale < 1.0 ? int64_t(std::ceil(x)) : int64_t(x);
  if (m == "round_prefer_floor") return int64_t(std::ceil(x - 0.5));
  if (m == "round_prefer_ceil") return int64_t(std::floor(x + 0.5));
  if (m == "floor") return int64_t(std::floor(x));
  return int64_t(std::ceil(x));
}

double cubic_weight(double s, double A) {
  s = std::abs(s);
  if (s <= 1) return ((A + 2) * s - (A + 3)) * s * s + 1;
  if (s < 2) return ((A * s - 5 * A) * s + 8 * A) * s - 4 * A;
  return 0;
}

Taps make_taps(const ResizeAttrs& a, int64_t in, int64_t out, double scale, double roi_start, double roi_end) {
  Taps t;
  t.taps.resize(size_t(out));
  t.extrapolate.assign(size_t(out), false);
  const bool crop = a.coord == "tf_crop_and_resize";
  for (int64_t o = 0; o < out; ++o) {
    // tf_crop_and_resize spans the output grid, whose length is the integer size.
    double len = crop ? double(out) : double(in) * scale;
    double x = original_coord(a, double(o), in, len, out, scale, roi_start, roi_end);
    auto& tp = t.taps[size_t(o)];
    if (crop && (x < 0 || x > double(in - 1))) {
      t.extrapolate[size_t(o)] = true;
      continue;
    }
    if (a.mode == "nearest") {
      tp.push_back({std::clamp<int64_t>(nearest_index(a, x, scale), 0, in - 1), 1.0});
      continue;
    }
    if (a.antialias && scale < 1.0) {
      // The filter widens by 1/scale so each output averages every input it covers. Taps sit
      // at base + i with base = ceil(x) - 1 and ratio = x - base in (0, 1], as in the ONNX
      // reference; edge-clamped, or dropped with exclude_outside; weights normalised.
      double base = std::ceil(x) - 1, ratio = x - base;
      int64_t start = a.mode == "linear" ? int64_t(std::floor(-1.0 / scale)) + 1 : int64_t(std::floor(-2.0 / scale)) + 1;
      int64_t count = 2 - 2 * start;
      double total = 0;
      for (int64_t i = start; i < start + count; ++i) {
        double d = (double(i) - ratio) * scale;
        double w = a.mode == "linear" ? std::clamp(1.0 - std::abs(d), 0.0, 1.0) : cubic_weight(d, a.cubic_a);
        int64_t j = int64_t(base) + i;
        if (j < 0 || j >= in) {
          if (a.exclude_outside) continue;
          j = std::clamp<int64_t>(j, 0, in - 1);
        }
        tp.push_back({j, w});
        total += w;
      }
      if (total != 0)
        for (auto& [j, w] : tp) w /= total;
      continue;
    }
    if (a.mode == "linear") {
      double xc = std::clamp(x, 0.0, double(in - 1));
      int64_t x0 = std::min<int64_t>(int64_t(std::floor(xc)), in - 1), x1 = std::min<int64_t>(x0 + 1, in - 1);
      double f = xc - double(x0);
      if (x0 == x1) tp.push_back({x0, 1.0});
      else tp.insert(tp.end(), {{x0, 1.0 - f}, {x1, f}});
      continue;
    }
    // cubic: 4 taps around floor(x), edge-clamped unless exclude_outside drops them.
    double x0 = std::floor(x), f = x - x0;
    double total = 0;
    for (int k = -1; k <= 2; ++k) {
      int64_t j = int64_t(x0) + k;
      double w = cubic_weight(f - double(k), a.cubic_a);
      if (j < 0 || j >= in) {
        if (a.exclude_outside) continue;
        j = std::clamp<int64_t>(j, 0, in - 1);
      }
      tp.push_back({j, w});
      total += w;
    }
    if (a.exclude_outside && total != 0)
      for (auto& [j, w] : tp) w /= total;
  }
  return t;
}

}  // namespace

ResizeInputSlots resize_input_slots(const Node& n, int64_t opset) {
  ResizeInputs ri = resize_inputs(n, opset);
  return {ri.roi, ri.scales, ri.sizes};
}

ResizeTaps resize_taps(const Node& n, int64_t opset, const Shape& in_shape, const Tensor* roi_in, const Tensor* scales_in,
                       const Tensor* sizes_in) {
  ErrorContext ec{"", 0, 0, n.label(), n.op_type, int(opset)};
  ResizeAttrs a = resize_attrs(n, opset);
  auto given = [](const Tensor* t) { return t && t->numel() > 0; };
  bool sizes_given = given(sizes_in), scales_given = !sizes_given && given(scales_in);
  std::optional<std::vector<int64_t>> sizes;
  std::optional<std::vector<float>> scales;
  if (sizes_given) sizes = sizes_in->to_int_vector();
  if (scales_given) scales = scales_in->to_float_vector();
  ResizeShape rs = resize_shape(n, opset, a, dims_of(in_shape), scales, sizes, scales_given, sizes_given);
  const int64_t r = int64_t(in_shape.size());
  ResizeTaps t;
  t.mode = a.mode;
  t.extrapolation = a.extrapolation;
  t.out.assign(static_cast<size_t>(r), 0);
  for (int64_t d = 0; d < r; ++d) t.out[size_t(d)] = rs.out[size_t(d)].value;
  // roi: [starts..., ends...] over the resized axes (all axes unless `axes` is given).
  std::vector<double> roi_start(static_cast<size_t>(r), 0.0), roi_end(static_cast<size_t>(r), 1.0);
  if (a.coord == "tf_crop_and_resize" && given(roi_in)) {
    auto roi = roi_in->to_float_vector();
    std::vector<int64_t> axes = a.axes;
    for (auto& v : axes) v = normalize_axis(v, r, n);
    if (axes.empty())
      for (int64_t i = 0; i < r; ++i) axes.push_back(i);
    if (roi.size() != 2 * axes.size())
      fail(ErrorKind::Shape, "Resize: roi has " + std::to_string(roi.size()) + " entries, expected " + std::to_string(2 * axes.size()), ec);
    for (size_t i = 0; i < axes.size(); ++i) {
      roi_start[size_t(axes[i])] = roi[i];
      roi_end[size_t(axes[i])] = roi[i + axes.size()];
    }
  }
  t.axes.resize(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) {
    int64_t in = in_shape[size_t(d)], m = t.out[size_t(d)];
    if (m < 0) fail(ErrorKind::Shape, "Resize: negative output size", ec);
    bool identity = in == m && rs.scales[size_t(d)] == 1.0f && a.coord != "tf_crop_and_resize";
    if (identity) continue;
    if (in == 0 && m > 0) fail(ErrorKind::Shape, "Resize: cannot resize an empty dimension", ec);
    Taps tp = make_taps(a, in, m, double(rs.scales[size_t(d)]), roi_start[size_t(d)], roi_end[size_t(d)]);
    ResizeAxisTaps& ax = t.axes[size_t(d)];
    ax.active = true;
    ax.taps = std::move(tp.taps);
    ax.extrapolate = std::move(tp.extrapolate);
  }
  return t;
}

namespace {

std::vector<Tensor> kernel_resize(const KernelContext& c) {
  const Tensor& x = c.input(0);
  ResizeAttrs a = resize_attrs(c.node, c.opset);
  ResizeInputs ri = resize_inputs(c.node, c.opset);
  auto input = [&](int i) -> const Tensor* { return i >= 0 && c.has_input(size_t(i)) ? &c.input(size_t(i)) : nullptr; };
  ResizeTaps rt = resize_taps(c.node, c.opset, x.shape(), input(ri.roi), input(ri.scales), input(ri.sizes));
  const int64_t r = x.rank();
  const Shape& out = rt.out;
  std::vector<bool> active(static_cast<size_t>(r), false);
  std::vector<ResizeAxisTaps>& taps = rt.axes;
  for (int64_t d = 0; d < r; ++d) active[size_t(d)] = taps[size_t(d)].active;
  Tensor y(x.dtype(), out);
  if (y.numel() == 0) return {y};
  if (a.mode == "nearest") {
    auto st = shape_strides(x.shape());
    std::vector<std::vector<int64_t>> maps(static_cast<size_t>(r));
    for (int64_t d = 0; d < r; ++d) {
      auto& m = maps[size_t(d)];
      m.resize(size_t(out[size_t(d)]));
      for (int64_t o = 0; o < out[size_t(d)]; ++o) {
        if (!active[size_t(d)]) m[size_t(o)] = o * st[size_t(d)];
        else if (taps[size_t(d)].extrapolate[size_t(o)]) m[size_t(o)] = -1;
        else m[size_t(o)] = taps[size_t(d)].taps[size_t(o)][0].first * st[size_t(d)];
      }
    }
    Tensor fill = Tensor::scalar<double>(a.extrapolation).cast(x.dtype());
    gather_by_dim_maps(y.raw(), x.raw(), out, maps, elem_size(c, x), fill.raw());
    return {y};
  }
  // Linear / cubic: one separable pass per resized axis, in double.
  std::vector<double> cur(size_t(x.numel()));
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) cur[size_t(i)] = to_double(p[i]);
  });
  Shape shape = x.shape();
  for (int64_t d = 0; d < r; ++d) {
    if (!active[size_t(d)]) continue;
    int64_t outer = 1, inner = 1, n = shape[size_t(d)], m = out[size_t(d)];
    for (int64_t k = 0; k < d; ++k) outer *= shape[size_t(k)];
    for (int64_t k = d + 1; k < r; ++k) inner *= shape[size_t(k)];
    std::vector<double> next(size_t(outer * m * inner), 0.0);
    const ResizeAxisTaps& t = taps[size_t(d)];
    if (inner == 1) {
      // Last axis: one dot product of the taps per output element.
      for (int64_t o = 0; o < outer; ++o) {
        const double* src = &cur[size_t(o * n)];
        double* dst = &next[size_t(o * m)];
        for (int64_t j = 0; j < m; ++j) {
          if (t.extrapolate[size_t(j)]) { dst[j] = a.extrapolation; continue; }
          double acc = 0;
          for (auto [i, w] : t.taps[size_t(j)]) acc += w * src[i];
          dst[j] = acc;
        }
      }
      cur.swap(next);
      shape[size_t(d)] = m;
      continue;
    }
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < m; ++j) {
        double* dst = &next[size_t((o * m + j) * inner)];
        if (t.extrapolate[size_t(j)]) {
          std::fill(dst, dst + inner, a.extrapolation);
          continue;
        }
        for (auto [i, w] : t.taps[size_t(j)]) {
          const double* src = &cur[size_t((o * n + i) * inner)];
          for (int64_t k = 0; k < inner; ++k) dst[k] += w * src[k];
        }
      }
    cur.swap(next);
    shape[size_t(d)] = m;
  }
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = y.data<T>();
    for (int64_t i = 0; i < y.numel(); ++i) {
      double v = cur[size_t(i)];
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        v = std::nearbyint(v);
        v = std::clamp(v, double(std::numeric_limits<T>::lowest()), double(std::numeric_limits<T>::max()));
      }
      p[i] = from_double<T>(v);
    }
  });
  return {y};
}

MappingType resize_mapping(const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
  if (ins.empty() || outs.empty() || !ins[0].has_shape || !outs[0].has_shape || ins[0].dims.size() != outs[0].dims.size())
    return MappingType::OneToMany;
  if (ins[0].dims == outs[0].dims && ins[0].is_static()) return MappingType::OneToOne;
  std::string mode = n.attrs.get_string("mode", "nearest");
  bool smooth = mode != "nearest";
  for (size_t d = 0; d < ins[0].dims.size(); ++d) {
    const Dim &i = ins[0].dims[d], &o = outs[0].dims[d];
    // Downsampling with an interpolating filter reads several inputs per output.
    if (smooth && i.known() && o.known() && o.value < i.value) return MappingType::ManyToMany;
  }
  return MappingType::OneToMany;
}

}  // namespace

void register_tensor_resize_ops(OpRegistry& r) {
  for (const char* name : {"Resize", "Upsample"}) {
    OpSchema s;
    s.name = name;
    bool up = std::string(name) == "Upsample";
    s.since = up ? 7 : 10;
    s.until = up ? 9 : 22;  // Upsample is deprecated at opset 10 in favour of Resize
    s.min_inputs = 1;
    s.max_inputs = up ? 2 : 4;
    s.mapping = MappingType::OneToMany;
    s.mapping_fn = resize_mapping;
    s.infer = infer_resize;
    s.kernel = kernel_resize;
    // FLOPs: one multiply-add per tap per output element for linear/cubic (2^k / 4^k taps over
    // k resized axes is bounded by counting 2 per axis pass); nearest is pure data movement.
    s.flops = [](const Node& n, const std::vector<TensorType>&, const std::vector<TensorType>& outs) {
      std::string mode = n.attrs.get_string("mode", "nearest");
      if (mode == "nearest" || outs.empty()) return 0.0;
      auto k = outs[0].numel();
      return k ? double(*k) * (mode == "cubic" ? 8.0 : 4.0) : 0.0;
    };
    s.family = "tensor";
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::tensor_ops
