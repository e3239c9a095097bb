#include "graph/builder.h"

#include "graph/shape_inference.h"

namespace nnfuse {

GraphBuilder::GraphBuilder(const std::string& name, int64_t opset, uint64_t seed) : rng_(seed) {
  model_.graph.name = name;
  model_.graph.opset_imports[""] = opset;
  model_.ir_version = opset >= 23 ? 11 : opset >= 21 ? 10 : opset >= 19 ? 9 : opset >= 15 ? 8 : 7;
}

Attributes GraphBuilder::attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  Attributes a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}

std::string GraphBuilder::input(const std::string& name, DType dtype, std::vector<Dim> dims) {
  model_.graph.add_input(name, TensorType(dtype, std::move(dims)));
  return name;
}

std::string GraphBuilder::weight(const std::string& hint, const Shape& shape, float scale) {
  Tensor t(DType::Float32, shape);
  std::normal_distribution<float> d(0.0f, scale);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng_);
  return constant(hint, t);
}

std::string GraphBuilder::uniform(const std::string& hint, const Shape& shape, float lo, float hi) {
  Tensor t(DType::Float32, shape);
  std::uniform_real_distribution<float> d(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng_);
  return constant(hint, t);
}

std::string GraphBuilder::constant(const std::string& hint, const Tensor& t) {
  std::string n = model_.graph.fresh_name(hint);
  model_.graph.set_initializer(n, t);
  return n;
}

std::string GraphBuilder::constant_node(const std::string& hint, const Tensor& t) {
  std::string n = model_.graph.fresh_name(hint);
  model_.graph.add_node("Constant", {}, {n}, attrs({{"value", A::t(t)}}), model_.graph.fresh_name(hint + "_const"));
  model_.graph.set_type(n, TensorType::of(t.dtype(), t.shape()));
  return n;
}

std::string GraphBuilder::ints(const std::string& hint, const std::vector<int64_t>& v) {
  return constant(hint, Tensor::from_vector<int64_t>({int64_t(v.size())}, v));
}

std::string GraphBuilder::scalar(const std::string& hint, float v) { return constant(hint, Tensor::scalar<float>(v)); }

std::string GraphBuilder::op(const std::string& op_type, const std::vector<std::string>& inputs, Attributes a,
                             const std::string& hint) {
  return op_n(op_type, inputs, 1, std::move(a), hint)[0];
}

std::vector<std::string> GraphBuilder::op_n(const std::string& op_type, const std::vector<std::string>& inputs, int n,
                                            Attributes a, const std::string& hint) {
  std::string base = hint.empty() ? op_type + "_" + std::to_string(node_counter_++) : hint;
  std::string node_name = model_.graph.fresh_name(base);
  std::vector<std::string> outs;
  for (int k = 0; k < n; ++k) {
    std::string o = model_.graph.fresh_name(n == 1 ? node_name + "_out" : node_name + "_out" + std::to_string(k));
    model_.graph.declare_value(o);
    outs.push_back(o);
  }
  model_.graph.add_node(op_type, inputs, outs, std::move(a), node_name);
  return outs;
}

void GraphBuilder::output(const std::string& name) { model_.graph.add_output(name); }

Model GraphBuilder::finish() {
  infer_shapes(model_.graph);
  model_.graph.validate();
  return model_;
}

}  // namespace nnfuse
