// Activation functions (One-to-One): Relu ... Shrink, and Clip. Attribute defaults are ONNX's.
// Formulas that overflow when written naively (Sigmoid, Softplus, Mish) use the stable forms;
// they agree with the naive ones wherever those are finite.
#include <cmath>
#include <limits>

#include "graph/ops_elementwise_impl.h"

namespace nnfuse::ew {

namespace {

template <class C>
constexpr bool is_float_v = std::is_floating_point_v<C>;

Params alpha_param(const Node& n, float dflt) {
  Params p;
  p.a = n.attrs.get_float("alpha", dflt);
  return p;
}

template <class C>
C sigmoid(C x) {
  if (x >= C(0)) return C(1) / (C(1) + std::exp(-x));
  C e = std::exp(x);
  return e / (C(1) + e);
}

template <class C>
C softplus(C x) {
  // log(1 + exp(x)) without overflow for large x.
  return x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

// ---- Clip ----------------------------------------------------------------------------------
// Before opset 11 the bounds are attributes; from 11 they are optional scalar inputs. Integer
// dtypes are allowed from opset 12. A missing bound is no bound. When min > max every element
// becomes max (ONNX's rule), which is what clamping to min and then to max gives.

unsigned clip_mask(int64_t opset) { return opset >= 12 ? kNum : kFloat; }

InferResult infer_clip(const InferContext& c) {
  if (c.opset < 11 && c.num_inputs() > 1)
    fail(ErrorKind::Model, "Clip takes its bounds as attributes before opset 11, not as inputs", node_ctx(c.node, c.opset));
  if (c.opset >= 11 && (c.node.attrs.has("min") || c.node.attrs.has("max")))
    fail(ErrorKind::Model, "Clip takes its bounds as inputs from opset 11, not as attributes", node_ctx(c.node, c.opset));
  DType t = common_dtype(c);
  check_dtype(c, t, clip_mask(c.opset));
  for (size_t i = 1; i < c.num_inputs(); ++i)
    if (c.has_input(i) && c.inputs[i].has_shape && c.inputs[i].rank() > 1)
      c.error(std::string(i == 1 ? "min" : "max") + " must be a scalar");
  return infer_same_as(c, 0);
}

std::vector<Tensor> kernel_clip(const KernelContext& c) {
  const Tensor& x = c.input(0);
  Tensor out(x.dtype(), x.shape());
  const unsigned mask = clip_mask(c.opset);
  dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (accepts<kNum, T>()) {
      if (!accepts(mask, x.dtype())) unsupported_dtype(c.node, c.opset, x.dtype(), "input", mask);
      using C = compute_t<T>;
      C lo, hi;
      if constexpr (is_float_v<C>) {
        lo = -std::numeric_limits<C>::infinity();
        hi = std::numeric_limits<C>::infinity();
      } else {
        lo = std::numeric_limits<C>::lowest();
        hi = std::numeric_limits<C>::max();
      }
      if (c.opset < 11) {
        if (auto* a = c.node.attrs.find("min")) lo = C(c.node.attrs.get_float("min", 0)), (void)a;
        if (auto* a = c.node.attrs.find("max")) hi = C(c.node.attrs.get_float("max", 0)), (void)a;
      } else {
        for (size_t i = 1; i < 3; ++i) {
          if (!c.has_input(i)) continue;
          const Tensor& b = *c.inputs[i];
          if (b.dtype() != x.dtype())
            c.error(std::string(i == 1 ? "min" : "max") + " has dtype " + dtype_name(b.dtype()) + ", input has " +
                    dtype_name(x.dtype()));
          if (b.numel() != 1) c.error(std::string(i == 1 ? "min" : "max") + " must be a scalar, got shape " + shape_str(b.shape()));
          (i == 1 ? lo : hi) = load(b.data<T>()[0]);
        }
      }
      const T* in = x.data<T>();
      T* o = out.data<T>();
      for (int64_t i = 0, n = x.numel(); i < n; ++i) {
        C v = load(in[i]);
        v = v < lo ? lo : v;  // NaN fails both tests and stays NaN
        v = v > hi ? hi : v;
        o[i] = store<T>(v);
      }
    } else {
      unsupported_dtype(c.node, c.opset, x.dtype(), "input", mask);
    }
  });
  return {out};
}

}  // namespace

void register_activation_ops(OpRegistry& r) {
  r.add(unary_schema<kSignedNum>("Relu", 7, [](auto v, const Params&) { return v > decltype(v)(0) ? v : decltype(v)(0); }));
  r.add(unary_schema<kFloat>(
      "LeakyRelu", 7, [](auto v, const Params& p) { return v < 0 ? decltype(v)(p.a) * v : v; },
      [](const Node& n, int64_t) { return alpha_param(n, 0.01f); }));
  r.add(unary_schema<kFloat>(
      "Elu", 7, [](auto v, const Params& p) { return v < 0 ? decltype(v)(p.a) * (std::exp(v) - 1) : v; },
      [](const Node& n, int64_t) { return alpha_param(n, 1.0f); }));
  r.add(unary_schema<kFloat>(
      "Selu", 7,
      [](auto v, const Params& p) {
        using C = decltype(v);
        return C(p.b) * (v <= 0 ? C(p.a) * (std::exp(v) - 1) : v);
      },
      [](const Node& n, int64_t) {
        Params p;
        p.a = n.attrs.get_float("alpha", 1.67326319217681884765625f);
        p.b = n.attrs.get_float("gamma", 1.05070102214813232421875f);
        return p;
      }));
  r.add(unary_schema<kFloat>(
      "Celu", 12,
      [](auto v, const Params& p) {
        using C = decltype(v);
        const C alpha = C(p.a);
        return std::max(C(0), v) + std::min(C(0), alpha * (std::exp(v / alpha) - 1));
      },
      [](const Node& n, int64_t) { return alpha_param(n, 1.0f); }));
  r.add(unary_schema<kFloat>("Sigmoid", 7, [](auto v, const Params&) { return sigmoid(v); }));
  r.add(unary_schema<kFloat>(
      "HardSigmoid", 7,
      [](auto v, const Params& p) {
        using C = decltype(v);
        return std::max(C(0), std::min(C(1), C(p.a) * v + C(p.b)));
      },
      [](const Node& n, int64_t) {
        Params p;
        p.a = n.attrs.get_float("alpha", 0.2f);
        p.b = n.attrs.get_float("beta", 0.5f);
        return p;
      }));
  r.add(unary_schema<kFloat>("HardSwish", 14, [](auto v, const Params&) {
    using C = decltype(v);
    return v * std::max(C(0), std::min(C(1), v * C(1.0 / 6.0) + C(0.5)));
  }));
  // Swish (opset 24): x * Sigmoid(alpha * x); alpha 1 is SiLU.
  r.add(unary_schema<kFloat>(
      "Swish", 24, [](auto v, const Params& p) { return v * sigmoid(decltype(v)(p.a) * v); },
      [](const Node& n, int64_t) { return alpha_param(n, 1.0f); }));
  {
    // SwiGLU (opset 28): Swish_alpha(A) * B over two inputs of one shape (no broadcasting).
    OpSchema s;
    s.name = "SwiGLU";
    s.since = 28;
    s.min_inputs = s.max_inputs = 2;
    s.family = "elementwise";
    s.infer = [](const InferContext& c) {
      const TensorType &a = c.input(0), &b = c.input(1);
      check_dtype(c, a.dtype, kFloat);
      if (a.dtype != b.dtype) c.error(std::string("A and B differ in dtype: ") + dtype_name(a.dtype) + " and " + dtype_name(b.dtype));
      if (a.has_shape && b.has_shape && a.rank() != b.rank()) c.error("A " + a.str() + " and B " + b.str() + " must have one shape");
      return infer_one(a);
    };
    s.kernel = [](const KernelContext& c) {
      const Tensor &a = c.input(0), &b = c.input(1);
      if (a.shape() != b.shape() || a.dtype() != b.dtype())
        c.error("A " + shape_str(a.shape()) + " and B " + shape_str(b.shape()) + " must have one shape and dtype (SwiGLU does not broadcast)");
      const double alpha = c.node.attrs.get_float("alpha", 1.0f);
      Tensor y = Tensor::uninitialized(a.dtype(), a.shape());
      dispatch_dtype(a.dtype(), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (accepts<kFloat, T>()) {
          using C = compute_t<T>;
          const T *pa = a.data<T>(), *pb = b.data<T>();
          T* py = y.data<T>();
          for (int64_t i = 0; i < a.numel(); ++i) {
            const C va = load(pa[i]);
            py[i] = store<T>(C(va * sigmoid(C(alpha) * va) * load(pb[i])));
          }
        } else {
          unsupported_dtype(c.node, c.opset, a.dtype(), "inputs", kFloat);
        }
      });
      return std::vector<Tensor>{y};
    };
    s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) {
      return ins[0].numel() ? 6.0 * double(*ins[0].numel()) : 0.0;
    };
    r.add(std::move(s));
  }
  r.add(unary_schema<kFloat>("Tanh", 7, [](auto v, const Params&) { return std::tanh(v); }));
  r.add(unary_schema<kFloat>("Softplus", 7, [](auto v, const Params&) { return softplus(v); }));
  r.add(unary_schema<kFloat>("Softsign", 7, [](auto v, const Params&) { return v / (decltype(v)(1) + std::fabs(v)); }));
  r.add(unary_schema<kFloat>("Mish", 18, [](auto v, const Params&) { return v * std::tanh(softplus(v)); }));
  r.add(unary_schema<kFloat>(
      "Gelu", 20,
      [](auto v, const Params& p) {
        using C = decltype(v);
        if (p.a != 0) {
          const C k = C(0.7978845608028654);  // sqrt(2 / pi)
          return C(0.5) * v * (C(1) + std::tanh(k * (v + C(0.044715) * v * v * v)));
        }
        return C(0.5) * v * (C(1) + std::erf(v * C(0.7071067811865476)));  // erf(x / sqrt(2))
      },
      [](const Node& n, int64_t opset) {
        std::string mode = n.attrs.get_string("approximate", "none");
        if (mode != "none" && mode != "tanh")
          fail(ErrorKind::Model, "Gelu approximate must be \"none\" or \"tanh\", got \"" + mode + "\"", node_ctx(n, opset));
        Params p;
        p.a = mode == "tanh" ? 1 : 0;
        return p;
      }));
  r.add(unary_schema<kFloat>(
      "ThresholdedRelu", 10, [](auto v, const Params& p) { return v > decltype(v)(p.a) ? v : decltype(v)(0); },
      [](const Node& n, int64_t) { return alpha_param(n, 1.0f); }));
  r.add(unary_schema<kNum>(
      "Shrink", 9,
      [](auto v, const Params& p) {
        using C = decltype(v);
        // Integers are compared and shifted in double: -lambd does not exist in unsigned types.
        const double x = double(v), lambd = p.a, bias = p.b;
        if constexpr (is_float_v<C>) return v < C(-lambd) ? v + C(bias) : v > C(lambd) ? v - C(bias) : C(0);
        else return C(x < -lambd ? x + bias : x > lambd ? x - bias : 0.0);
      },
      [](const Node& n, int64_t) {
        Params p;
        p.a = n.attrs.get_float("lambd", 0.5f);
        p.b = n.attrs.get_float("bias", 0.0f);
        return p;
      }));
  {
    OpSchema s;
    s.name = "Clip";
    s.since = 7;
    s.min_inputs = 1;
    s.max_inputs = 3;
    s.infer = infer_clip;
    s.kernel = kernel_clip;
    s.family = "elementwise";
    r.add(std::move(s));
  }
}

}  // namespace nnfuse::ew
