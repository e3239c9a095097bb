#pragma once
// A small convenience layer for building graphs in C++ (tests, the model zoo, rule checking).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace nnfuse {

class GraphBuilder {
 public:
  explicit GraphBuilder(const std::string& name, int64_t opset = 17, uint64_t seed = 0);

  std::string input(const std::string& name, DType dtype, std::vector<Dim> dims);
  // An initializer with values ~ N(0, scale^2), seeded (deterministic per builder seed and order).
  std::string weight(const std::string& hint, const Shape& shape, float scale = 0.05f);
  // An initializer with values uniform in [lo, hi).
  std::string uniform(const std::string& hint, const Shape& shape, float lo, float hi);
  std::string constant(const std::string& hint, const Tensor& t);       // as an initializer
  std::string constant_node(const std::string& hint, const Tensor& t);  // as a Constant node
  std::string ints(const std::string& hint, const std::vector<int64_t>& v);  // 1-D int64 initializer
  std::string scalar(const std::string& hint, float v);                      // 0-D float initializer

  // Adds a node with one output; returns the output name.
  std::string op(const std::string& op_type, const std::vector<std::string>& inputs, Attributes attrs = {},
                 const std::string& hint = "");
  // Adds a node with n outputs; returns their names.
  std::vector<std::string> op_n(const std::string& op_type, const std::vector<std::string>& inputs, int n,
                                Attributes attrs = {}, const std::string& hint = "");
  void output(const std::string& name);

  Graph& graph() { return model_.graph; }
  // Infers shapes, validates and returns the model.
  Model finish();

  // Attribute helpers: attrs({{"axis", Attribute::make_int(1)}}) reads poorly; these read well.
  static Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> kv);

 private:
  Model model_;
  std::mt19937_64 rng_;
  int node_counter_ = 0;
};

// Short attribute constructors for builders: A::i(1), A::f(0.5f), A::is({1,1}), A::s("NOTSET").
namespace A {
inline Attribute i(int64_t v) { return Attribute::make_int(v); }
inline Attribute f(float v) { return Attribute::make_float(v); }
inline Attribute s(std::string v) { return Attribute::make_string(std::move(v)); }
inline Attribute is(std::vector<int64_t> v) { return Attribute::make_ints(std::move(v)); }
inline Attribute fs(std::vector<float> v) { return Attribute::make_floats(std::move(v)); }
inline Attribute t(Tensor v) { return Attribute::make_tensor(std::move(v)); }
}  // namespace A

}  // namespace nnfuse
