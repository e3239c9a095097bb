#include <cmath>
#include <cstring>

#include "graph/zoo_common.h"

namespace nnfuse::zoo {

Net::Net(const std::string& name, const ZooOptions& o) : b(name, o.opset, o.seed), opt(o), opset(o.opset) {
  // The forms below are written for opsets with Squeeze/Unsqueeze axes as inputs (13+); 21 is
  // the newest ai.onnx opset whose op forms we write.
  if (opset < 13 || opset > 21)
    fail(ErrorKind::Invalid, "zoo model '" + name + "': opset " + std::to_string(opset) + " is not supported (13 to 21)");
  if (opt.batch < 1) fail(ErrorKind::Invalid, "zoo model '" + name + "': batch must be >= 1");
  if (opt.seq_len < 0) fail(ErrorKind::Invalid, "zoo model '" + name + "': seq_len must be >= 0");
}

std::string Net::ints(const std::vector<int64_t>& v) {
  auto it = ints_.find(v);
  if (it != ints_.end()) return it->second;
  return ints_[v] = b.ints("const_ints", v);
}

std::string Net::int_scalar(int64_t v) {
  auto it = int_scalars_.find(v);
  if (it != int_scalars_.end()) return it->second;
  return int_scalars_[v] = b.constant("const_i", Tensor::scalar<int64_t>(v));
}

std::string Net::f(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  auto it = floats_.find(bits);
  if (it != floats_.end()) return it->second;
  return floats_[bits] = b.scalar("const_f", v);
}

std::string Net::named(const std::string& type, const std::vector<std::string>& ins, Attributes a,
                       const std::string& out_name) {
  Graph& g = b.graph();
  if (g.has_value(out_name)) fail(ErrorKind::Invalid, "zoo: value name '" + out_name + "' used twice");
  g.declare_value(out_name);
  g.add_node(type, ins, {out_name}, std::move(a), g.fresh_name(type + "_" + out_name));
  return out_name;
}

std::string Net::unsqueeze(const std::string& x, const std::vector<int64_t>& axes) {
  return op("Unsqueeze", {x, ints(axes)});
}

std::string Net::squeeze(const std::string& x, const std::vector<int64_t>& axes) {
  return op("Squeeze", {x, ints(axes)});
}

std::string Net::reduce_mean(const std::string& x, const std::vector<int64_t>& axes, bool keepdims) {
  // ReduceMean took axes as an attribute until opset 17 and as an input from 18.
  if (opset < 18) return op("ReduceMean", {x}, GraphBuilder::attrs({{"axes", A::is(axes)}, {"keepdims", A::i(keepdims)}}));
  return op("ReduceMean", {x, ints(axes)}, GraphBuilder::attrs({{"keepdims", A::i(keepdims)}}));
}

std::string Net::clip(const std::string& x, float lo, float hi) { return op("Clip", {x, f(lo), f(hi)}); }

std::string Net::dim_scalar(const std::string& x, int64_t axis, int64_t value) {
  if (!dynamic()) return int_scalar(value);
  std::string shape = op("Shape", {x});
  return op("Gather", {shape, int_scalar(axis)}, GraphBuilder::attrs({{"axis", A::i(0)}}));
}

std::string Net::target(const std::vector<TargetDim>& dims) {
  bool any_var = false;
  for (auto& d : dims) any_var |= !d.of.empty();
  if (!dynamic() || !any_var) {
    std::vector<int64_t> v;
    for (auto& d : dims) v.push_back(d.value);
    return ints(v);
  }
  // PyTorch reads each size separately: Shape -> Gather(index) -> Unsqueeze, then one Concat
  // with the constant parts.
  std::vector<std::string> parts;
  for (auto& d : dims) {
    if (d.of.empty()) parts.push_back(ints({d.value}));
    else parts.push_back(unsqueeze(dim_scalar(d.of, d.axis, d.value), {0}));
  }
  return op("Concat", parts, GraphBuilder::attrs({{"axis", A::i(0)}}));
}

std::string Net::reshape(const std::string& x, const std::vector<TargetDim>& dims, const std::string& hint) {
  return op("Reshape", {x, target(dims)}, {}, hint);
}

std::string Net::slice(const std::string& x, const std::vector<int64_t>& starts, const std::vector<TargetDim>& ends,
                       const std::vector<int64_t>& axes) {
  return op("Slice", {x, ints(starts), target(ends), ints(axes)});
}

std::string Net::conv(const std::string& x, int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t groups,
                      bool bias, const std::string& hint, float gain) {
  int64_t fan_in = (cin / groups) * k * k;
  std::string w = b.weight(hint + ".weight", {cout, cin / groups, k, k}, std::sqrt(gain / float(fan_in)));
  std::vector<std::string> ins = {x, w};
  if (bias) ins.push_back(b.weight(hint + ".bias", {cout}, 0.01f));
  int64_t p = k / 2;
  return op("Conv", ins,
            GraphBuilder::attrs({{"dilations", A::is({1, 1})},
                                 {"group", A::i(groups)},
                                 {"kernel_shape", A::is({k, k})},
                                 {"pads", A::is({p, p, p, p})},
                                 {"strides", A::is({stride, stride})}}),
            hint);
}

std::string Net::bn(const std::string& x, int64_t c, const std::string& hint, float gamma_scale) {
  std::string gamma = b.uniform(hint + ".weight", {c}, 0.8f * gamma_scale, 1.2f * gamma_scale);
  std::string beta = b.weight(hint + ".bias", {c}, 0.02f);
  std::string mean = b.weight(hint + ".running_mean", {c}, 0.02f);
  std::string var = b.uniform(hint + ".running_var", {c}, 0.8f, 1.2f);
  return op("BatchNormalization", {x, gamma, beta, mean, var},
            GraphBuilder::attrs({{"epsilon", A::f(1e-5f)}, {"momentum", A::f(0.9f)}}), hint);
}

std::string Net::linear(const std::string& x, int64_t in, int64_t out, float stddev, const std::string& hint) {
  std::string w = b.weight(hint + ".weight", {in, out}, stddev);
  std::string bias = b.weight(hint + ".bias", {out}, 0.01f);
  return op("Add", {op("MatMul", {x, w}, {}, hint + ".matmul"), bias}, {}, hint + ".add");
}

std::string Net::gemm(const std::string& x, int64_t in, int64_t out, float stddev, const std::string& hint,
                      const std::string& out_name) {
  std::string w = b.weight(hint + ".weight", {out, in}, stddev);
  std::string bias = b.weight(hint + ".bias", {out}, 0.01f);
  Attributes a = GraphBuilder::attrs({{"alpha", A::f(1.0f)}, {"beta", A::f(1.0f)}, {"transB", A::i(1)}});
  if (!out_name.empty()) return named("Gemm", {x, w, bias}, a, out_name);
  return op("Gemm", {x, w, bias}, a, hint);
}

std::string Net::layer_norm(const std::string& x, int64_t dim, float eps, const std::string& hint,
                            const std::string& out_name) {
  std::string gamma = b.uniform(hint + ".weight", {dim}, 0.9f, 1.1f);
  std::string beta = b.weight(hint + ".bias", {dim}, 0.02f);
  if (opset >= 17) {
    Attributes a = GraphBuilder::attrs({{"axis", A::i(-1)}, {"epsilon", A::f(eps)}});
    if (!out_name.empty()) return named("LayerNormalization", {x, gamma, beta}, a, out_name);
    return op("LayerNormalization", {x, gamma, beta}, a, hint);
  }
  // As torch.onnx writes layer_norm for opset < 17.
  std::string mean = reduce_mean(x, {-1}, true);
  std::string d = op("Sub", {x, mean});
  std::string var = reduce_mean(op("Pow", {d, f(2.0f)}), {-1}, true);
  std::string den = op("Sqrt", {op("Add", {var, f(eps)})});
  std::string scaled = op("Mul", {op("Div", {d, den}), gamma});
  if (!out_name.empty()) return named("Add", {scaled, beta}, {}, out_name);
  return op("Add", {scaled, beta}, {}, hint);
}

std::string Net::gelu(const std::string& x, bool tanh_form) {
  if (opset >= 20) return op("Gelu", {x}, GraphBuilder::attrs({{"approximate", A::s(tanh_form ? "tanh" : "none")}}));
  if (!tanh_form) {
    // torch.onnx: x * (erf(x / sqrt(2)) + 1) * 0.5
    std::string e = op("Erf", {op("Div", {x, f(1.41421356237f)})});
    return op("Mul", {op("Mul", {x, op("Add", {e, f(1.0f)})}), f(0.5f)});
  }
  // GPT-2's NewGELU: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
  std::string half = op("Mul", {f(0.5f), x});
  std::string cube = op("Pow", {x, f(3.0f)});
  std::string inner = op("Add", {x, op("Mul", {f(0.044715f), cube})});
  std::string t = op("Tanh", {op("Mul", {f(0.7978845608f), inner})});
  return op("Mul", {half, op("Add", {f(1.0f), t})});
}

std::string Net::swish(const std::string& x) { return op("Mul", {x, op("Sigmoid", {x})}); }

Model Net::finish(const std::string& description) {
  Model m = b.finish();
  m.producer_name = "nnfuse-zoo";
  m.doc = description;
  m.graph.doc = description;
  return m;
}

}  // namespace nnfuse::zoo
