#include "graph/attribute.h"

#include "graph/graph.h"

namespace nnfuse {

const char* attribute_kind_name(Attribute::Kind k) {
  switch (k) {
    case Attribute::Kind::Float: return "float";
    case Attribute::Kind::Int: return "int";
    case Attribute::Kind::String: return "string";
    case Attribute::Kind::Tensor: return "tensor";
    case Attribute::Kind::Graph: return "graph";
    case Attribute::Kind::Floats: return "floats";
    case Attribute::Kind::Ints: return "ints";
    case Attribute::Kind::Strings: return "strings";
    case Attribute::Kind::Tensors: return "tensors";
    case Attribute::Kind::Graphs: return "graphs";
    case Attribute::Kind::Type: return "type";
  }
  return "?";
}

bool Attribute::operator==(const Attribute& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case Kind::Float: return f == o.f;
    case Kind::Int: return i == o.i;
    case Kind::String: return s == o.s;
    case Kind::Tensor: return t.equals(o.t);
    case Kind::Graph: return g == o.g;
    case Kind::Floats: return floats == o.floats;
    case Kind::Ints: return ints == o.ints;
    case Kind::Strings: return strings == o.strings;
    case Kind::Tensors:
      if (tensors.size() != o.tensors.size()) return false;
      for (size_t k = 0; k < tensors.size(); ++k)
        if (!tensors[k].equals(o.tensors[k])) return false;
      return true;
    case Kind::Graphs: return graphs == o.graphs;
    case Kind::Type: return type && o.type ? *type == *o.type : type == o.type;
  }
  return false;
}

Attribute Attribute::make_type(const TensorType& v) {
  Attribute a;
  a.kind = Kind::Type;
  a.type = std::make_shared<const TensorType>(v);
  return a;
}

const Attribute* Attributes::find(const std::string& name) const {
  auto it = map_.find(name);
  return it == map_.end() ? nullptr : &it->second;
}

static const Attribute* expect(const Attributes& a, const std::string& name, Attribute::Kind k) {
  const Attribute* at = a.find(name);
  if (at && at->kind != k)
    fail(ErrorKind::Model, "attribute '" + name + "' is " + attribute_kind_name(at->kind) + ", expected " + attribute_kind_name(k));
  return at;
}

int64_t Attributes::get_int(const std::string& name, int64_t dflt) const {
  auto* a = expect(*this, name, Attribute::Kind::Int);
  return a ? a->i : dflt;
}
float Attributes::get_float(const std::string& name, float dflt) const {
  const Attribute* a = find(name);
  if (a && a->kind == Attribute::Kind::Int) return float(a->i);  // tolerate exporters writing ints
  a = expect(*this, name, Attribute::Kind::Float);
  return a ? a->f : dflt;
}
std::string Attributes::get_string(const std::string& name, const std::string& dflt) const {
  auto* a = expect(*this, name, Attribute::Kind::String);
  return a ? a->s : dflt;
}
std::vector<int64_t> Attributes::get_ints(const std::string& name, const std::vector<int64_t>& dflt) const {
  auto* a = expect(*this, name, Attribute::Kind::Ints);
  return a ? a->ints : dflt;
}
std::vector<float> Attributes::get_floats(const std::string& name, const std::vector<float>& dflt) const {
  auto* a = expect(*this, name, Attribute::Kind::Floats);
  return a ? a->floats : dflt;
}
std::optional<int64_t> Attributes::opt_int(const std::string& name) const {
  auto* a = expect(*this, name, Attribute::Kind::Int);
  if (!a) return std::nullopt;
  return a->i;
}
std::optional<std::vector<int64_t>> Attributes::opt_ints(const std::string& name) const {
  auto* a = expect(*this, name, Attribute::Kind::Ints);
  if (!a) return std::nullopt;
  return a->ints;
}

}  // namespace nnfuse
