// Signal ops (opset 17 on): DFT, STFT and the window functions a spectrogram front end builds
// before them. Reference kernels in double, a direct O(n^2) transform per line (the oracle, not a
// fast path).
//
// Window functions: HannWindow, HammingWindow, BlackmanWindow. Output [size] of the
// type `output_datatype` (float by default); periodic (the default) uses N = size, symmetric
// N = size - 1 in cos(2*pi*n/N). Spectrogram front ends build them before an STFT.
//
// MelWeightMatrix: the [dft_length / 2 + 1, num_mel_bins] matrix that maps a onesided spectrum's
// bins to mel bands, triangles between num_mel_bins + 2 points spaced evenly in mel
// (mel = 2595 log10(1 + hz / 700)) from lower_edge_hertz to upper_edge_hertz, each point rounded
// down to a spectrum bin, floor((dft_length + 1) hz / sample_rate), as the ONNX reference does.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "graph/ops_tensor_util.h"

namespace nnfuse::tensor_ops {

namespace {

enum class Window { Hann, Hamming, Blackman };

DType window_dtype(const Node& n, int64_t opset) {
  const DType t = DType(int32_t(n.attrs.get_int("output_datatype", 1)));
  if (t == DType::Undefined || dtype_size(t) == 0 || t == DType::Bool)
    fail(ErrorKind::Unsupported, "output_datatype " + std::to_string(int(t)) + " is not supported", {"", 0, 0, n.label(), n.op_type, int(opset)});
  return t;
}

int64_t window_size(const Tensor& s, const std::function<void(const std::string&)>& error) {
  if (s.numel() != 1) error("size must be a scalar, got shape " + shape_str(s.shape()));
  const int64_t n = s.as_int(0);
  if (n < 0) error("size " + std::to_string(n) + " is negative");
  return n;
}

KernelFn window_kernel(Window w) {
  return [w](const KernelContext& c) {
    const int64_t size = window_size(c.input(0), [&](const std::string& m) { c.error(m); });
    const bool periodic = c.node.attrs.get_int("periodic", 1) != 0;
    const double N = double(periodic ? size : size - 1);
    Tensor y(DType::Float64, {size});
    const double pi = 3.14159265358979323846;
    for (int64_t i = 0; i < size; ++i) {
      const double x = N > 0 ? 2 * pi * double(i) / N : 0.0;
      double v = 0;
      switch (w) {
        case Window::Hann: v = 0.5 - 0.5 * std::cos(x); break;
        case Window::Hamming: v = 25.0 / 46.0 - 21.0 / 46.0 * std::cos(x); break;
        case Window::Blackman: v = 0.42 - 0.5 * std::cos(x) + 0.08 * std::cos(2 * x); break;
      }
      y.data<double>()[i] = v;
    }
    return std::vector<Tensor>{y.cast(window_dtype(c.node, c.opset))};
  };
}

InferResult infer_window(const InferContext& c) {
  const DType t = window_dtype(c.node, c.opset);
  if (const Tensor* s = c.value(0)) return infer_one(TensorType(t, {Dim(window_size(*s, [&](const std::string& m) { c.error(m); }))}));
  return infer_one(TensorType(t, {Dim{}}));
}

// ---- DFT ---------------------------------------------------------------------------------
// x [..., 1 | 2] (real or complex as the last dim); the transform runs along `axis` (opset 17:
// attribute, default 1; opset 20: third input, default -2), dft_length points (zero padded or
// truncated; default the axis length, or 2 * (n - 1) for an inverse onesided one). Forward:
// complex output, the first L / 2 + 1 bins when onesided. Inverse: scaled by 1 / L; onesided
// reads a Hermitian half spectrum and gives a real [..., L, 1] signal (numpy's irfft).
struct Line {
  int64_t outer, n, inner;  // the axis splits x (without its last dim) into outer x n x inner
};

Line line_of(const Shape& s, int64_t axis) {
  Line l{1, s[size_t(axis)], 1};
  for (int64_t i = 0; i < axis; ++i) l.outer *= s[size_t(i)];
  for (size_t i = size_t(axis) + 1; i + 1 < s.size(); ++i) l.inner *= s[i];
  return l;
}

int64_t dft_axis(const KernelContext& c, int64_t rank) {
  int64_t axis = c.opset >= 20 ? (c.has_input(2) ? c.input(2).as_int(0) : -2) : c.node.attrs.get_int("axis", 1);
  if (axis < -rank || axis >= rank) c.error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  if (axis == rank - 1) c.error("axis must not be the last (real/imaginary) dim");
  return axis;
}

std::vector<Tensor> kernel_dft(const KernelContext& c) {
  const Tensor& X = c.input(0);
  if (X.rank() < 2 || (X.dim(X.rank() - 1) != 1 && X.dim(X.rank() - 1) != 2))
    c.error("input " + shape_str(X.shape()) + " must end in a dim of 1 (real) or 2 (complex)");
  if (!dtype_is_float(X.dtype())) c.unsupported(std::string("DFT on ") + dtype_name(X.dtype()) + " is not supported");
  const int64_t axis = dft_axis(c, X.rank());
  const bool inverse = c.node.attrs.get_int("inverse", 0) != 0, onesided = c.node.attrs.get_int("onesided", 0) != 0;
  const bool cplx = X.dim(X.rank() - 1) == 2;
  const Line ln = line_of(X.shape(), axis);
  int64_t L = inverse && onesided ? 2 * (ln.n - 1) : ln.n;
  if (c.has_input(1)) L = c.input(1).as_int(0);
  if (L <= 0) c.error("dft_length " + std::to_string(L) + " must be positive");
  const bool real_out = inverse && onesided;
  const int64_t bins = real_out ? L : (!inverse && onesided ? L / 2 + 1 : L);
  Shape os = X.shape();
  os[size_t(axis)] = bins;
  os.back() = real_out ? 1 : 2;
  const Tensor x = X.cast(DType::Float64);
  Tensor y(DType::Float64, os);
  const double* xp = x.data<double>();
  double* yp = y.data<double>();
  const int64_t ce = cplx ? 2 : 1, oe = real_out ? 1 : 2;
  const double pi = 3.14159265358979323846, sign = inverse ? 1.0 : -1.0;
  std::vector<double> re(static_cast<size_t>(L)), im(static_cast<size_t>(L));
  for (int64_t o = 0; o < ln.outer; ++o)
    for (int64_t j = 0; j < ln.inner; ++j) {
      // The line, zero padded or truncated to L points (an inverse onesided one: to L / 2 + 1).
      const int64_t take = real_out ? std::min(ln.n, L / 2 + 1) : std::min(ln.n, L);
      std::fill(re.begin(), re.end(), 0.0), std::fill(im.begin(), im.end(), 0.0);
      for (int64_t k = 0; k < take; ++k) {
        const double* e = xp + ((o * ln.n + k) * ln.inner + j) * ce;
        re[size_t(k)] = e[0], im[size_t(k)] = cplx ? e[1] : 0.0;
      }
      for (int64_t t = 0; t < bins; ++t) {
        double sr = 0, si = 0;
        if (real_out) {
          // Hermitian extension of bins 0..L/2: bin L-k is the conjugate of bin k.
          for (int64_t k = 0; k < L; ++k) {
            const int64_t h = k <= L / 2 ? k : L - k;
            double ar = re[size_t(h)], ai = k <= L / 2 ? im[size_t(h)] : -im[size_t(h)];
            if (k == 0 || (L % 2 == 0 && k == L / 2)) ai = 0;  // numpy drops these imaginary parts
            const double a = 2 * pi * double(k) * double(t) / double(L);
            sr += ar * std::cos(a) - ai * std::sin(a);
          }
        } else {
          for (int64_t k = 0; k < L; ++k) {
            const double a = sign * 2 * pi * double(k % L) * double(t) / double(L);
            sr += re[size_t(k)] * std::cos(a) - im[size_t(k)] * std::sin(a);
            si += re[size_t(k)] * std::sin(a) + im[size_t(k)] * std::cos(a);
          }
        }
        if (inverse) sr /= double(L), si /= double(L);
        double* out = yp + ((o * bins + t) * ln.inner + j) * oe;
        out[0] = sr;
        if (!real_out) out[1] = si;
      }
    }
  return {y.cast(X.dtype())};
}

InferResult infer_dft(const InferContext& c) {
  const TensorType& x = c.input(0);
  if (!x.has_shape || x.rank() < 2) return infer_one(TensorType::unknown_shape(x.dtype));
  const bool inverse = c.node.attrs.get_int("inverse", 0) != 0, onesided = c.node.attrs.get_int("onesided", 0) != 0;
  int64_t axis;
  if (c.opset >= 20) {
    if (c.has_input(2) && !c.value(2)) return infer_one(TensorType(x.dtype, std::vector<Dim>(size_t(x.rank()), Dim{})));
    axis = c.has_input(2) ? c.value(2)->as_int(0) : -2;
  } else {
    axis = c.node.attrs.get_int("axis", 1);
  }
  if (axis < -x.rank() || axis >= x.rank() - 1) c.error("axis " + std::to_string(axis) + " is out of range for " + x.str());
  if (axis < 0) axis += x.rank();
  std::vector<Dim> d = x.dims;
  Dim L = d[size_t(axis)];
  if (inverse && onesided) L = L.known() ? Dim(2 * (L.value - 1)) : Dim{};
  if (c.has_input(1)) L = c.value(1) ? Dim(c.value(1)->as_int(0)) : Dim{};
  const bool real_out = inverse && onesided;
  d[size_t(axis)] = (!inverse && onesided) ? (L.known() ? Dim(L.value / 2 + 1) : Dim{}) : L;
  d.back() = Dim(real_out ? 1 : 2);
  return infer_one(TensorType(x.dtype, d));
}

// ---- STFT --------------------------------------------------------------------------------
// signal [B, T, 1 | 2], frame_step, window [W] (optional), frame_length (optional): frames of
// frame_length (or W) samples every frame_step, each multiplied by the window and transformed;
// output [B, frames, bins, 2], bins = L / 2 + 1 when onesided (the default for real signals).
std::vector<Tensor> kernel_stft(const KernelContext& c) {
  const Tensor& S = c.input(0);
  if (S.rank() != 3 || (S.dim(2) != 1 && S.dim(2) != 2)) c.error("signal " + shape_str(S.shape()) + " must be [batch, length, 1 or 2]");
  const int64_t step = c.input(1).as_int(0);
  const Tensor* win = c.has_input(2) ? c.inputs[2] : nullptr;
  int64_t L = c.has_input(3) ? c.input(3).as_int(0) : win ? win->numel() : 0;
  if (L <= 0) c.error("frame_length must be given by the window or frame_length, and be positive");
  if (win && win->numel() != L) c.error("window has " + std::to_string(win->numel()) + " values for frames of " + std::to_string(L));
  if (step <= 0) c.error("frame_step " + std::to_string(step) + " must be positive");
  const bool onesided = c.node.attrs.get_int("onesided", 1) != 0;
  const bool cplx = S.dim(2) == 2;
  const int64_t B = S.dim(0), T = S.dim(1), frames = T >= L ? (T - L) / step + 1 : 0, bins = onesided ? L / 2 + 1 : L;
  const Tensor s = S.cast(DType::Float64);
  const Tensor w = win ? win->cast(DType::Float64) : Tensor();
  Tensor y(DType::Float64, {B, frames, bins, 2});
  const double pi = 3.14159265358979323846;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < frames; ++f)
      for (int64_t k = 0; k < bins; ++k) {
        double sr = 0, si = 0;
        for (int64_t t = 0; t < L; ++t) {
          const double* e = s.data<double>() + (b * T + f * step + t) * S.dim(2);
          const double wt = win ? w.data<double>()[t] : 1.0, xr = e[0] * wt, xi = cplx ? e[1] * wt : 0.0;
          const double a = -2 * pi * double(k) * double(t) / double(L);
          sr += xr * std::cos(a) - xi * std::sin(a);
          si += xr * std::sin(a) + xi * std::cos(a);
        }
        double* out = y.data<double>() + ((b * frames + f) * bins + k) * 2;
        out[0] = sr, out[1] = si;
      }
  return {y.cast(S.dtype())};
}

InferResult infer_stft(const InferContext& c) {
  const TensorType& s = c.input(0);
  const Tensor* step = c.value(1);
  const Tensor* flen = c.has_input(3) ? c.value(3) : nullptr;
  Dim L = flen ? Dim(flen->as_int(0)) : Dim{};
  if (!flen && c.has_input(2) && c.input(2).has_shape && c.input(2).rank() == 1) L = c.input(2).dims[0];
  Dim frames, bins;
  const bool onesided = c.node.attrs.get_int("onesided", 1) != 0;
  if (L.known()) bins = Dim(onesided ? L.value / 2 + 1 : L.value);
  if (L.known() && step && s.has_shape && s.rank() == 3 && s.dims[1].known() && step->as_int(0) > 0)
    frames = Dim(s.dims[1].value >= L.value ? (s.dims[1].value - L.value) / step->as_int(0) + 1 : 0);
  return infer_one(TensorType(s.dtype, {s.has_shape && s.rank() >= 1 ? s.dims[0] : Dim{}, frames, bins, Dim(2)}));
}

// ---- MelWeightMatrix ----------------------------------------------------------------------

struct MelParams {
  int64_t bins = 0, dft_length = 0, sample_rate = 0;
  double lower = 0, upper = 0;
};

MelParams mel_params(const std::vector<const Tensor*>& in, const std::function<void(const std::string&)>& error) {
  const char* names[] = {"num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"};
  for (int i = 0; i < 5; ++i)
    if (in[size_t(i)]->numel() != 1) error(std::string(names[i]) + " must be a scalar, got shape " + shape_str(in[size_t(i)]->shape()));
  MelParams p{in[0]->as_int(0), in[1]->as_int(0), in[2]->as_int(0), in[3]->as_double(0), in[4]->as_double(0)};
  if (p.bins < 0 || p.dft_length < 1 || p.sample_rate < 1)
    error("num_mel_bins " + std::to_string(p.bins) + ", dft_length " + std::to_string(p.dft_length) + " and sample_rate " +
          std::to_string(p.sample_rate) + ": expected num_mel_bins >= 0, dft_length and sample_rate >= 1");
  if (!(p.lower >= 0 && p.lower <= p.upper && std::isfinite(p.upper)))
    error("lower_edge_hertz " + std::to_string(p.lower) + " and upper_edge_hertz " + std::to_string(p.upper) +
          ": expected 0 <= lower <= upper, both finite");
  return p;
}

std::vector<Tensor> kernel_mel_weight_matrix(const KernelContext& c) {
  const MelParams p = mel_params(c.inputs, [&](const std::string& m) { c.error(m); });
  const int64_t spectrum = p.dft_length / 2 + 1;
  Tensor y(DType::Float64, {spectrum, p.bins});  // sized (and checked against the limit) first
  auto mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  const double lo = mel(p.lower), step = (mel(p.upper) - lo) / double(p.bins + 2);
  std::vector<int64_t> point(size_t(p.bins + 2));
  for (int64_t i = 0; i < p.bins + 2; ++i) {
    const double hz = 700.0 * (std::pow(10.0, (double(i) * step + lo) / 2595.0) - 1.0);
    point[size_t(i)] = int64_t(std::floor(double(p.dft_length + 1) * hz / double(p.sample_rate)));
  }
  double* out = y.data<double>();
  auto at = [&](int64_t j, int64_t i) -> double& {
    if (j < 0 || j >= spectrum)
      c.error("mel band " + std::to_string(i) + " reaches spectrum bin " + std::to_string(j) + " of " + std::to_string(spectrum) +
              ": upper_edge_hertz is above the Nyquist frequency of sample_rate " + std::to_string(p.sample_rate));
    return out[j * p.bins + i];
  };
  for (int64_t i = 0; i < p.bins; ++i) {
    const int64_t left = point[size_t(i)], center = point[size_t(i + 1)], right = point[size_t(i + 2)];
    if (center == left) at(center, i) = 1.0;
    for (int64_t j = left; center > left && j <= center; ++j) at(j, i) = double(j - left) / double(center - left);
    for (int64_t j = center; j < right; ++j) at(j, i) = double(right - j) / double(right - center);
  }
  return {y.cast(window_dtype(c.node, c.opset))};
}

InferResult infer_mel_weight_matrix(const InferContext& c) {
  const DType t = window_dtype(c.node, c.opset);
  for (size_t i = 0; i < 5; ++i)
    if (c.input(i).has_shape && c.input(i).rank() > 1) c.error("input " + std::to_string(i) + " must be a scalar");
  Dim spectrum, bins;
  if (const Tensor* v = c.value(1); v && v->numel() == 1) spectrum = Dim(v->as_int(0) / 2 + 1);
  if (const Tensor* v = c.value(0); v && v->numel() == 1) bins = Dim(v->as_int(0));
  return infer_one(TensorType(t, {spectrum, bins}));
}

}  // namespace

void register_tensor_signal_ops(OpRegistry& r) {
  {
    OpSchema s =
        data_movement_schema("MelWeightMatrix", 17, MappingType::ManyToMany, 5, 5, infer_mel_weight_matrix, kernel_mel_weight_matrix);
    s.flops = [](const Node&, const std::vector<TensorType>&, const std::vector<TensorType>& outs) {
      return outs.empty() || !outs[0].numel() ? 0.0 : double(*outs[0].numel());
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = data_movement_schema("DFT", 17, MappingType::ManyToMany, 1, 3, infer_dft, kernel_dft);
    s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>& outs) {
      return outs.empty() || !outs[0].numel() || !ins[0].numel() ? 0.0 : 8.0 * double(*ins[0].numel()) * double(*outs[0].numel()) / 4.0;
    };
    r.add(std::move(s));
  }
  {
    OpSchema s = data_movement_schema("STFT", 17, MappingType::ManyToMany, 2, 4, infer_stft, kernel_stft);
    s.flops = [](const Node&, const std::vector<TensorType>&, const std::vector<TensorType>& outs) {
      return outs.empty() || !outs[0].numel() ? 0.0 : 8.0 * double(*outs[0].numel());
    };
    r.add(std::move(s));
  }
  for (auto [name, w] : {std::pair{"HannWindow", Window::Hann}, std::pair{"HammingWindow", Window::Hamming},
                         std::pair{"BlackmanWindow", Window::Blackman}}) {
    OpSchema s = data_movement_schema(name, 17, MappingType::OneToOne, 1, 1, infer_window, window_kernel(w));
    s.flops = [](const Node&, const std::vector<TensorType>&, const std::vector<TensorType>& outs) {
      return outs.empty() || !outs[0].numel() ? 0.0 : 4.0 * double(*outs[0].numel());
    };
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::tensor_ops
