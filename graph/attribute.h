#pragma once
// Node attributes as ONNX defines them. Subgraph attributes (If/Loop/Scan bodies) hold a Graph.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/tensor.h"

namespace nnfuse {

class Graph;
struct TensorType;

struct Attribute {
  enum class Kind { Float, Int, String, Tensor, Graph, Floats, Ints, Strings, Tensors, Graphs, Type };
  Kind kind = Kind::Int;
  float f = 0;
  int64_t i = 0;
  std::string s;
  nnfuse::Tensor t;
  std::shared_ptr<nnfuse::Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<nnfuse::Tensor> tensors;
  std::vector<std::shared_ptr<nnfuse::Graph>> graphs;
  std::shared_ptr<const nnfuse::TensorType> type;  // Kind::Type (ONNX TYPE_PROTO: Optional's `type`)

  static Attribute make_float(float v) { Attribute a; a.kind = Kind::Float; a.f = v; return a; }
  static Attribute make_int(int64_t v) { Attribute a; a.kind = Kind::Int; a.i = v; return a; }
  static Attribute make_string(std::string v) { Attribute a; a.kind = Kind::String; a.s = std::move(v); return a; }
  static Attribute make_tensor(nnfuse::Tensor v) { Attribute a; a.kind = Kind::Tensor; a.t = std::move(v); return a; }
  static Attribute make_graph(std::shared_ptr<nnfuse::Graph> v) { Attribute a; a.kind = Kind::Graph; a.g = std::move(v); return a; }
  static Attribute make_floats(std::vector<float> v) { Attribute a; a.kind = Kind::Floats; a.floats = std::move(v); return a; }
  static Attribute make_ints(std::vector<int64_t> v) { Attribute a; a.kind = Kind::Ints; a.ints = std::move(v); return a; }
  static Attribute make_strings(std::vector<std::string> v) { Attribute a; a.kind = Kind::Strings; a.strings = std::move(v); return a; }

  static Attribute make_type(const nnfuse::TensorType& v);

  bool operator==(const Attribute& o) const;  // by value (tensors by contents, graphs by identity)
};

const char* attribute_kind_name(Attribute::Kind k);

// Ordered so that iteration (export, hashing, printing) is deterministic.
class Attributes {
 public:
  bool has(const std::string& name) const { return map_.count(name) != 0; }
  const Attribute* find(const std::string& name) const;
  void set(const std::string& name, Attribute a) { map_[name] = std::move(a); }
  void erase(const std::string& name) { map_.erase(name); }
  // Typed getters with defaults; a present attribute of the wrong kind is a Model error.
  int64_t get_int(const std::string& name, int64_t dflt) const;
  float get_float(const std::string& name, float dflt) const;
  std::string get_string(const std::string& name, const std::string& dflt) const;
  std::vector<int64_t> get_ints(const std::string& name, const std::vector<int64_t>& dflt = {}) const;
  std::vector<float> get_floats(const std::string& name, const std::vector<float>& dflt = {}) const;
  std::optional<int64_t> opt_int(const std::string& name) const;
  std::optional<std::vector<int64_t>> opt_ints(const std::string& name) const;
  const std::map<std::string, Attribute>& all() const { return map_; }
  size_t size() const { return map_.size(); }
  bool operator==(const Attributes& o) const { return map_ == o.map_; }

 private:
  std::map<std::string, Attribute> map_;
};

}  // namespace nnfuse
