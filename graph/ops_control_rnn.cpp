// Recurrent ops: LSTM, GRU, RNN (ONNX opset 7 and 14 semantics, layout attribute included).
//
// Reference kernels, but fast enough for the zoo's 4-layer LSTM with hidden 1024: the input
// projection X*W^T of every timestep is one matrix product done up front (row-by-row dot
// products of contiguous rows), and each recurrent step is a GEMV over contiguous rows of R.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "graph/ops_common.h"

namespace nnfuse {
namespace {

enum class RnnKind { Rnn, Gru, Lstm };

int num_gates(RnnKind k) { return k == RnnKind::Lstm ? 4 : k == RnnKind::Gru ? 3 : 1; }
int activations_per_direction(RnnKind k) { return k == RnnKind::Lstm ? 3 : k == RnnKind::Gru ? 2 : 1; }
int max_inputs(RnnKind k) { return k == RnnKind::Lstm ? 8 : 6; }

// ---- dot products -------------------------------------------------------------------------
// The build targets baseline x86-64; a Haswell clone (AVX2) is picked at load time where the CPU
// has it. GCC vector types make the vectorisation explicit rather than left to -O2.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NNFUSE_DOT_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define NNFUSE_DOT_CLONES
#endif

typedef float v8f __attribute__((vector_size(32)));

NNFUSE_DOT_CLONES float dot(const float* a, const float* b, int64_t n) {
  v8f acc0 = {0, 0, 0, 0, 0, 0, 0, 0}, acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    v8f x0, x1, x2, x3, y0, y1, y2, y3;
    std::memcpy(&x0, a + i, 32);
    std::memcpy(&x1, a + i + 8, 32);
    std::memcpy(&x2, a + i + 16, 32);
    std::memcpy(&x3, a + i + 24, 32);
    std::memcpy(&y0, b + i, 32);
    std::memcpy(&y1, b + i + 8, 32);
    std::memcpy(&y2, b + i + 16, 32);
    std::memcpy(&y3, b + i + 24, 32);
    acc0 += x0 * y0;
    acc1 += x1 * y1;
    acc2 += x2 * y2;
    acc3 += x3 * y3;
  }
  for (; i + 8 <= n; i += 8) {
    v8f x, y;
    std::memcpy(&x, a + i, 32);
    std::memcpy(&y, b + i, 32);
    acc0 += x * y;
  }
  v8f acc = (acc0 + acc1) + (acc2 + acc3);
  float s = 0;
  for (int k = 0; k < 8; ++k) s += acc[k];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

double dot(const double* a, const double* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// ---- activations --------------------------------------------------------------------------
struct Activation {
  enum Fn { Sigmoid, Tanh, Relu, HardSigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, Elu, Softsign, Softplus };
  Fn fn = Sigmoid;
  double alpha = 0, beta = 0;

  template <class T>
  T operator()(T x) const {
    switch (fn) {
      case Sigmoid: return x >= 0 ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x));
      case Tanh: return std::tanh(x);
      case Relu: return x > 0 ? x : T(0);
      case HardSigmoid: return std::max(T(0), std::min(T(1), T(alpha) * x + T(beta)));
      case Affine: return T(alpha) * x + T(beta);
      case LeakyRelu: return x >= 0 ? x : T(alpha) * x;
      case ThresholdedRelu: return x > T(alpha) ? x : T(0);
      case ScaledTanh: return T(alpha) * std::tanh(T(beta) * x);
      case Elu: return x >= 0 ? x : T(alpha) * (std::exp(x) - T(1));
      case Softsign: return x / (T(1) + std::abs(x));
      case Softplus: return x > 20 ? x : std::log1p(std::exp(x));
    }
    return x;
  }
};

struct ActivationInfo {
  const char* name;
  Activation::Fn fn;
  bool uses_alpha, uses_beta;
  double default_alpha, default_beta;
};

// Defaults are those of the ONNX operators of the same name (ScaledTanh/Affine as ONNX Runtime).
const ActivationInfo kActivations[] = {
    {"sigmoid", Activation::Sigmoid, false, false, 0, 0},
    {"tanh", Activation::Tanh, false, false, 0, 0},
    {"relu", Activation::Relu, false, false, 0, 0},
    {"hardsigmoid", Activation::HardSigmoid, true, true, 0.2, 0.5},
    {"affine", Activation::Affine, true, true, 1.0, 0.0},
    {"leakyrelu", Activation::LeakyRelu, true, false, 0.01, 0},
    {"thresholdedrelu", Activation::ThresholdedRelu, true, false, 1.0, 0},
    {"scaledtanh", Activation::ScaledTanh, true, true, 1.0, 1.0},
    {"elu", Activation::Elu, true, false, 1.0, 0},
    {"softsign", Activation::Softsign, false, false, 0, 0},
    {"softplus", Activation::Softplus, false, false, 0, 0},
};

// Everything the attributes say, validated once for inference and kernels alike.
struct RnnAttrs {
  RnnKind kind = RnnKind::Lstm;
  int direction = 0;  // 0 forward, 1 reverse, 2 bidirectional
  int num_directions = 1;
  int64_t hidden = -1;  // -1: from the weights
  double clip = 0;      // 0: no clip
  bool has_clip = false;
  int64_t layout = 0;
  bool linear_before_reset = false;
  bool input_forget = false;
  std::vector<Activation> acts;  // activations_per_direction * num_directions
};

template <class Err>
RnnAttrs parse_attrs(const Node& n, RnnKind kind, Err&& error) {
  RnnAttrs a;
  a.kind = kind;
  std::string dir = n.attrs.get_string("direction", "forward");
  if (dir == "forward") a.direction = 0;
  else if (dir == "reverse") a.direction = 1;
  else if (dir == "bidirectional") a.direction = 2;
  else error("direction '" + dir + "' is not one of forward, reverse, bidirectional");
  a.num_directions = a.direction == 2 ? 2 : 1;
  if (auto h = n.attrs.opt_int("hidden_size")) {
    if (*h <= 0) error("hidden_size must be positive, got " + std::to_string(*h));
    a.hidden = *h;
  }
  if (n.attrs.has("clip")) {
    a.has_clip = true;
    a.clip = n.attrs.get_float("clip", 0);
    if (!(a.clip > 0)) error("clip must be positive, got " + std::to_string(a.clip));
  }
  a.layout = n.attrs.get_int("layout", 0);
  if (a.layout != 0 && a.layout != 1) error("layout must be 0 or 1, got " + std::to_string(a.layout));
  a.linear_before_reset = n.attrs.get_int("linear_before_reset", 0) != 0;
  a.input_forget = n.attrs.get_int("input_forget", 0) != 0;

  const int per_dir = activations_per_direction(kind);
  std::vector<std::string> names;
  if (auto* at = n.attrs.find("activations")) names = at->strings;
  if (names.empty()) {
    static const char* lstm[] = {"Sigmoid", "Tanh", "Tanh"};
    static const char* gru[] = {"Sigmoid", "Tanh"};
    static const char* rnn[] = {"Tanh"};
    const char** d = kind == RnnKind::Lstm ? lstm : kind == RnnKind::Gru ? gru : rnn;
    for (int k = 0; k < a.num_directions; ++k)
      for (int j = 0; j < per_dir; ++j) names.push_back(d[j]);
  } else if (int(names.size()) == per_dir && a.num_directions == 2) {
    // One list for both directions (ONNX Runtime accepts this too).
    auto copy = names;
    names.insert(names.end(), copy.begin(), copy.end());
  } else if (int(names.size()) != per_dir * a.num_directions) {
    error("activations lists " + std::to_string(names.size()) + " functions; " + n.op_type + " with " +
          std::to_string(a.num_directions) + " direction(s) needs " + std::to_string(per_dir * a.num_directions));
  }
  std::vector<float> alphas = n.attrs.get_floats("activation_alpha"), betas = n.attrs.get_floats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;
  for (auto& name : names) {
    std::string lower;
    for (char ch : name) lower += char(std::tolower(static_cast<unsigned char>(ch)));
    const ActivationInfo* info = nullptr;
    for (auto& ai : kActivations)
      if (lower == ai.name) info = &ai;
    if (!info)
      error("activation '" + name + "' is not supported (supported: Relu, Tanh, Sigmoid, HardSigmoid, Affine, LeakyRelu, "
            "ThresholdedRelu, ScaledTanh, Elu, Softsign, Softplus)");
    Activation act;
    act.fn = info->fn;
    act.alpha = info->default_alpha;
    act.beta = info->default_beta;
    // activation_alpha/beta are consumed in order by the functions that take them.
    if (info->uses_alpha && next_alpha < alphas.size()) act.alpha = alphas[next_alpha++];
    if (info->uses_beta && next_beta < betas.size()) act.beta = betas[next_beta++];
    a.acts.push_back(act);
  }
  return a;
}

// ---- shape inference ----------------------------------------------------------------------
InferResult infer_rnn(const InferContext& c, RnnKind kind) {
  RnnAttrs a = parse_attrs(c.node, kind, [&](const std::string& m) { c.error(m); });
  const TensorType& x = c.input(0);
  const TensorType& w = c.input(1);
  const TensorType& r = c.input(2);
  const int G = num_gates(kind);
  if (x.has_shape && x.rank() != 3) c.error("X must have rank 3, got " + x.str());
  if (w.has_shape && w.rank() != 3) c.error("W must have rank 3 [num_directions, " + std::to_string(G) + "*hidden, input], got " + w.str());
  if (r.has_shape && r.rank() != 3) c.error("R must have rank 3 [num_directions, " + std::to_string(G) + "*hidden, hidden], got " + r.str());
  if (w.dtype != DType::Undefined && x.dtype != DType::Undefined && w.dtype != x.dtype)
    c.error(std::string("W is ") + dtype_name(w.dtype) + " but X is " + dtype_name(x.dtype));
  Dim hidden;
  if (a.hidden > 0) hidden = Dim(a.hidden);
  else if (r.has_shape && r.dims[2].known()) hidden = r.dims[2];
  else if (w.has_shape && w.dims[1].known()) hidden = Dim(w.dims[1].value / G);
  if (a.hidden > 0 && r.has_shape && r.dims[2].known() && r.dims[2].value != a.hidden)
    c.error("hidden_size is " + std::to_string(a.hidden) + " but R is " + r.str());
  if (w.has_shape && w.dims[0].known() && w.dims[0].value != a.num_directions)
    c.error("W has " + std::to_string(w.dims[0].value) + " directions but direction needs " + std::to_string(a.num_directions));
  if (w.has_shape && w.dims[1].known() && hidden.known() && w.dims[1].value != G * hidden.value)
    c.error("W's second dimension must be " + std::to_string(G) + "*hidden = " + std::to_string(G * hidden.value) + ", got " + w.str());
  Dim seq, batch;
  if (x.has_shape) {
    seq = a.layout == 0 ? x.dims[0] : x.dims[1];
    batch = a.layout == 0 ? x.dims[1] : x.dims[0];
  }
  Dim dirs(a.num_directions);
  InferResult res;
  DType dt = x.dtype;
  if (a.layout == 0) {
    res.outputs.push_back(TensorType(dt, {seq, dirs, batch, hidden}));
    res.outputs.push_back(TensorType(dt, {dirs, batch, hidden}));
  } else {
    res.outputs.push_back(TensorType(dt, {batch, seq, dirs, hidden}));
    res.outputs.push_back(TensorType(dt, {batch, dirs, hidden}));
  }
  if (kind == RnnKind::Lstm) res.outputs.push_back(res.outputs[1]);
  return res;
}

double rnn_flops(const Node& n, const std::vector<TensorType>& ins, RnnKind kind) {
  auto dim_or_1 = [](const TensorType& t, int i) -> double {
    return t.has_shape && i < t.rank() && t.dims[size_t(i)].known() ? double(t.dims[size_t(i)].value) : 1.0;
  };
  if (ins.size() < 3) return 0;
  int64_t layout = n.attrs.get_int("layout", 0);
  double seq = dim_or_1(ins[0], layout == 0 ? 0 : 1), batch = dim_or_1(ins[0], layout == 0 ? 1 : 0);
  double input = dim_or_1(ins[0], 2);
  double dirs = dim_or_1(ins[1], 0);
  double hidden = n.attrs.has("hidden_size") ? double(n.attrs.get_int("hidden_size", 1)) : dim_or_1(ins[2], 2);
  return 2.0 * seq * batch * num_gates(kind) * hidden * (input + hidden) * dirs;
}

// ---- kernels ------------------------------------------------------------------------------
// [a, b, c] -> [b, a, c] (layout 1 <-> layout 0), element size `es` bytes.
Tensor swap01(const Tensor& t) {
  const Shape& s = t.shape();
  Tensor out(t.dtype(), {s[1], s[0], s[2]});
  const size_t es = dtype_size(t.dtype());
  const size_t row = size_t(s[2]) * es;
  const char* src = static_cast<const char*>(t.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < s[0]; ++i)
    for (int64_t j = 0; j < s[1]; ++j) std::memcpy(dst + (j * s[0] + i) * row, src + (i * s[1] + j) * row, row);
  return out;
}

// Y [seq, dirs, batch, hidden] -> [batch, seq, dirs, hidden].
Tensor y_to_layout1(const Tensor& y) {
  const Shape& s = y.shape();
  int64_t S = s[0], D = s[1], B = s[2], H = s[3];
  Tensor out(y.dtype(), {B, S, D, H});
  const size_t row = size_t(H) * dtype_size(y.dtype());
  const char* src = static_cast<const char*>(y.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t t = 0; t < S; ++t)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t b = 0; b < B; ++b) std::memcpy(dst + ((b * S + t) * D + d) * row, src + ((t * D + d) * B + b) * row, row);
  return out;
}

template <class T>
std::vector<Tensor> run_rnn_typed(const KernelContext& c, const RnnAttrs& a, const std::vector<const Tensor*>& in) {
  const RnnKind kind = a.kind;
  const int G = num_gates(kind);
  const int D = a.num_directions;
  auto get = [&](size_t i) -> const Tensor* { return i < in.size() ? in[i] : nullptr; };
  const Tensor& X0 = *in[0];
  const Tensor& W = *in[1];
  const Tensor& R = *in[2];
  if (X0.rank() != 3) c.error("X must have rank 3, got " + shape_str(X0.shape()));
  Tensor X = a.layout == 0 ? X0 : swap01(X0);
  const int64_t S = X.dim(0), B = X.dim(1), I = X.dim(2);
  if (R.rank() != 3 || R.dim(0) != D || R.dim(1) % G != 0)
    c.error("R must be [" + std::to_string(D) + ", " + std::to_string(G) + "*hidden, hidden], got " + shape_str(R.shape()));
  const int64_t H = a.hidden > 0 ? a.hidden : R.dim(2);
  const int64_t GH = G * H;
  if (R.dim(1) != GH || R.dim(2) != H)
    c.error("R must be [" + std::to_string(D) + ", " + std::to_string(GH) + ", " + std::to_string(H) + "], got " + shape_str(R.shape()));
  if (W.rank() != 3 || W.dim(0) != D || W.dim(1) != GH || W.dim(2) != I)
    c.error("W must be [" + std::to_string(D) + ", " + std::to_string(GH) + ", " + std::to_string(I) + "] for X " +
            shape_str(X0.shape()) + ", got " + shape_str(W.shape()));
  for (const Tensor* t : {&W, &R})
    if (t->dtype() != X.dtype()) c.error(std::string("W and R must have X's dtype ") + dtype_name(X.dtype()));

  std::vector<T> bias(size_t(D * 2 * GH), T(0));
  if (const Tensor* Bt = get(3)) {
    if (Bt->rank() != 2 || Bt->dim(0) != D || Bt->dim(1) != 2 * GH)
      c.error("B must be [" + std::to_string(D) + ", " + std::to_string(2 * GH) + "], got " + shape_str(Bt->shape()));
    std::memcpy(bias.data(), Bt->data<T>(), bias.size() * sizeof(T));
  }
  std::vector<int64_t> lens(size_t(B), S);
  if (const Tensor* L = get(4)) {
    if (L->rank() != 1 || L->dim(0) != B) c.error("sequence_lens must be [" + std::to_string(B) + "], got " + shape_str(L->shape()));
    for (int64_t b = 0; b < B; ++b) {
      lens[size_t(b)] = L->as_int(b);
      if (lens[size_t(b)] < 0 || lens[size_t(b)] > S)
        c.error("sequence_lens[" + std::to_string(b) + "] = " + std::to_string(lens[size_t(b)]) + " is outside [0, " + std::to_string(S) + "]");
    }
  }
  // Initial states, as [dirs, batch, hidden].
  auto state = [&](size_t i, const char* what) {
    std::vector<T> v(size_t(D * B * H), T(0));
    if (const Tensor* t = get(i)) {
      Tensor s = a.layout == 0 ? *t : (t->rank() == 3 ? swap01(*t) : *t);
      if (s.rank() != 3 || s.dim(0) != D || s.dim(1) != B || s.dim(2) != H)
        c.error(std::string(what) + " must be " + (a.layout == 0 ? "[dirs, batch, hidden] = " : "[batch, dirs, hidden] = ") +
                (a.layout == 0 ? shape_str({D, B, H}) : shape_str({B, D, H})) + ", got " + shape_str(t->shape()));
      std::memcpy(v.data(), s.data<T>(), v.size() * sizeof(T));
    }
    return v;
  };
  std::vector<T> h_all = state(5, "initial_h");
  std::vector<T> c_all = kind == RnnKind::Lstm ? state(6, "initial_c") : std::vector<T>();
  std::vector<T> peep(size_t(D * 3 * H), T(0));
  if (kind == RnnKind::Lstm)
    if (const Tensor* P = get(7)) {
      if (P->rank() != 2 || P->dim(0) != D || P->dim(1) != 3 * H)
        c.error("P must be [" + std::to_string(D) + ", " + std::to_string(3 * H) + "], got " + shape_str(P->shape()));
      std::memcpy(peep.data(), P->data<T>(), peep.size() * sizeof(T));
    }

  Tensor Y(X.dtype(), {S, D, B, H});
  Tensor Yh(X.dtype(), {D, B, H});
  Tensor Yc(X.dtype(), {D, B, H});
  T* y = Y.data<T>();
  const T* x = X.data<T>();
  const T clip = T(a.clip);
  auto clipv = [&](T v) { return a.has_clip ? std::max(-clip, std::min(clip, v)) : v; };

  std::vector<T> xw(size_t(S * B * GH));
  std::vector<T> gates(static_cast<size_t>(GH)), tmp(static_cast<size_t>(H)), tmp2(static_cast<size_t>(H));
  for (int d = 0; d < D; ++d) {
    const bool reverse = a.direction == 1 || (a.direction == 2 && d == 1);
    const T* w = W.data<T>() + size_t(d) * GH * I;
    const T* r = R.data<T>() + size_t(d) * GH * H;
    const T* wb = bias.data() + size_t(d) * 2 * GH;
    const T* rb = wb + GH;
    const T* p = peep.data() + size_t(d) * 3 * H;
    const Activation* act = a.acts.data() + d * activations_per_direction(kind);
    // Input projection for every timestep at once: xw[t*B+b][g] = X[t,b,:] . W[g,:] + Wb[g].
    // Row g of W stays in cache while it meets every row of X.
    for (int64_t g = 0; g < GH; ++g) {
      const T* wrow = w + g * I;
      for (int64_t row = 0; row < S * B; ++row) xw[size_t(row * GH + g)] = dot(wrow, x + row * I, I) + wb[g];
    }
    for (int64_t b = 0; b < B; ++b) {
      T* h = h_all.data() + (size_t(d) * B + b) * H;
      T* cs = kind == RnnKind::Lstm ? c_all.data() + (size_t(d) * B + b) * H : nullptr;
      const int64_t len = lens[size_t(b)];
      for (int64_t step = 0; step < len; ++step) {
        const int64_t t = reverse ? len - 1 - step : step;
        const T* xg = xw.data() + size_t(t * B + b) * GH;
        if (kind == RnnKind::Lstm) {
          for (int64_t g = 0; g < GH; ++g) gates[size_t(g)] = xg[g] + rb[g] + dot(r + g * H, h, H);
          const T *gi = gates.data(), *go = gi + H, *gf = gi + 2 * H, *gc = gi + 3 * H;
          for (int64_t j = 0; j < H; ++j) {
            T it = act[0](clipv(gi[j] + p[j] * cs[j]));
            T ft = a.input_forget ? T(1) - it : act[0](clipv(gf[j] + p[2 * H + j] * cs[j]));
            T ct = act[1](clipv(gc[j]));
            T cn = ft * cs[j] + it * ct;
            T ot = act[0](clipv(go[j] + p[H + j] * cn));
            cs[j] = cn;
            h[j] = ot * act[2](cn);
          }
        } else if (kind == RnnKind::Gru) {
          for (int64_t g = 0; g < 2 * H; ++g) gates[size_t(g)] = act[0](clipv(xg[g] + rb[g] + dot(r + g * H, h, H)));
          const T *z = gates.data(), *rr = z + H;
          const T* rh_w = r + 2 * H * H;
          if (a.linear_before_reset) {
            for (int64_t j = 0; j < H; ++j)
              tmp[size_t(j)] = act[1](clipv(xg[2 * H + j] + rr[j] * (dot(rh_w + j * H, h, H) + rb[2 * H + j])));
          } else {
            for (int64_t j = 0; j < H; ++j) tmp2[size_t(j)] = rr[j] * h[j];
            for (int64_t j = 0; j < H; ++j)
              tmp[size_t(j)] = act[1](clipv(xg[2 * H + j] + dot(rh_w + j * H, tmp2.data(), H) + rb[2 * H + j]));
          }
          for (int64_t j = 0; j < H; ++j) h[j] = (T(1) - z[j]) * tmp[size_t(j)] + z[j] * h[j];
        } else {
          for (int64_t j = 0; j < H; ++j) tmp[size_t(j)] = act[0](clipv(xg[j] + rb[j] + dot(r + j * H, h, H)));
          std::copy(tmp.begin(), tmp.end(), h);
        }
        std::memcpy(y + ((size_t(t) * D + d) * B + b) * H, h, size_t(H) * sizeof(T));
      }
    }
  }
  std::memcpy(Yh.raw(), h_all.data(), h_all.size() * sizeof(T));
  if (kind == RnnKind::Lstm) std::memcpy(Yc.raw(), c_all.data(), c_all.size() * sizeof(T));
  if (a.layout == 1) {
    Y = y_to_layout1(Y);
    Yh = swap01(Yh);
    Yc = swap01(Yc);
  }
  if (kind == RnnKind::Lstm) return {Y, Yh, Yc};
  return {Y, Yh};
}

std::vector<Tensor> run_rnn(const KernelContext& c, RnnKind kind) {
  RnnAttrs a = parse_attrs(c.node, kind, [&](const std::string& m) { c.error(m); });
  std::vector<const Tensor*> in = c.inputs;
  in.resize(size_t(max_inputs(kind)), nullptr);
  const Tensor& X = c.input(0);
  c.input(1);
  c.input(2);
  switch (X.dtype()) {
    case DType::Float32: return run_rnn_typed<float>(c, a, in);
    case DType::Float64: return run_rnn_typed<double>(c, a, in);
    case DType::Float16:
    case DType::BFloat16: {
      // 16-bit inputs compute in float32 and round the outputs back.
      std::vector<Tensor> converted;
      converted.reserve(in.size());
      std::vector<const Tensor*> fin(in.size(), nullptr);
      for (size_t i = 0; i < in.size(); ++i)
        if (in[i]) {
          converted.push_back(i == 4 ? *in[i] : in[i]->cast(DType::Float32));
          fin[i] = &converted.back();
        }
      auto outs = run_rnn_typed<float>(c, a, fin);
      for (auto& o : outs) o = o.cast(X.dtype());
      return outs;
    }
    default: break;
  }
  c.unsupported(std::string(c.node.op_type) + " supports float16, bfloat16, float32 and float64, not " + dtype_name(X.dtype()));
}

OpSchema rnn_schema(const char* name, RnnKind kind) {
  OpSchema s;
  s.name = name;
  s.since = 1;
  s.until = 28;
  s.min_inputs = 3;
  s.max_inputs = max_inputs(kind);
  s.min_outputs = 0;
  s.max_outputs = kind == RnnKind::Lstm ? 3 : 2;
  s.mapping = MappingType::ManyToMany;
  s.family = "control";
  s.infer = [kind](const InferContext& c) { return infer_rnn(c, kind); };
  s.kernel = [kind](const KernelContext& c) { return run_rnn(c, kind); };
  s.flops = [kind](const Node& n, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
    return rnn_flops(n, ins, kind);
  };
  return s;
}

}  // namespace

void register_recurrent_ops(OpRegistry& r) {
  r.add(rnn_schema("LSTM", RnnKind::Lstm));
  r.add(rnn_schema("GRU", RnnKind::Gru));
  r.add(rnn_schema("RNN", RnnKind::Rnn));
}

}  // namespace nnfuse
