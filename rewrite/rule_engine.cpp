// The rule engine: a backtracking matcher over the graph IR (commutative ops tried in both operand
// orders), guard evaluation, replacement building (new constants folded with the reference
// kernels, new values typed with the registry's inference) and a worklist rewriter that re-matches
// only around what changed, with a budget that stops rule sets that would rewrite forever.
#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "graph/op_registry.h"
#include "rewrite/passes_util.h"
#include "rewrite/rule_engine_internal.h"

namespace nnfuse {
namespace rules_detail {

namespace {

// ---------------------------------------------------------------- attribute defaults
// An attribute absent from a node has its ONNX default; a pattern `<transA=0>` must match it.
std::optional<Attribute> attr_default(const std::string& op, const std::string& attr, int64_t opset) {
  static const std::map<std::pair<std::string, std::string>, Attribute> table = [] {
    std::map<std::pair<std::string, std::string>, Attribute> t;
    auto F = [](float v) { return Attribute::make_float(v); };
    auto I = [](int64_t v) { return Attribute::make_int(v); };
    t[{"Gemm", "alpha"}] = F(1);
    t[{"Gemm", "beta"}] = F(1);
    t[{"Gemm", "transA"}] = I(0);
    t[{"Gemm", "transB"}] = I(0);
    for (auto r : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1",
                   "ReduceSumSquare", "ReduceLogSumExp"}) {
      t[{r, "keepdims"}] = I(1);
      t[{r, "noop_with_empty_axes"}] = I(0);
    }
    t[{"BatchNormalization", "epsilon"}] = F(1e-5f);
    t[{"BatchNormalization", "training_mode"}] = I(0);
    t[{"LayerNormalization", "axis"}] = I(-1);
    t[{"LayerNormalization", "epsilon"}] = F(1e-5f);
    t[{"LeakyRelu", "alpha"}] = F(0.01f);
    t[{"HardSigmoid", "alpha"}] = F(0.2f);
    t[{"HardSigmoid", "beta"}] = F(0.5f);
    t[{"Gelu", "approximate"}] = Attribute::make_string("none");
    t[{"Conv", "group"}] = I(1);
    t[{"Pad", "mode"}] = Attribute::make_string("constant");
    t[{"Elu", "alpha"}] = F(1);
    t[{"Cast", "saturate"}] = I(1);
    return t;
  }();
  if ((op == "Softmax" || op == "LogSoftmax") && attr == "axis") return Attribute::make_int(opset >= 13 ? -1 : 1);
  auto it = table.find({op, attr});
  if (it == table.end()) return std::nullopt;
  return it->second;
}

bool close(double a, double b) {
  if (a == b) return true;
  if (std::isnan(a) || std::isnan(b)) return false;
  // Relative only: a literal 0 matches exactly 0 (an epsilon such as 1e-6 is not zero).
  return std::fabs(a - b) <= 1e-6 * std::max(std::fabs(a), std::fabs(b));
}

// ---------------------------------------------------------------- guard values
struct GV {
  enum class K { None, Num, List, Str, Val, Bool } k = K::None;
  double num = 0;
  bool is_int = false;
  std::vector<double> list;
  bool list_int = true;
  std::string s;  // Str or Val (value name)
  bool b = false;
  static GV none() { return {}; }
  static GV number(double v, bool i) { GV g; g.k = K::Num; g.num = v; g.is_int = i; return g; }
  static GV boolean(bool v) { GV g; g.k = K::Bool; g.b = v; return g; }
  static GV value(std::string n) { GV g; g.k = K::Val; g.s = std::move(n); return g; }
  static GV ints(const std::vector<int64_t>& v) {
    GV g;
    g.k = K::List;
    for (auto x : v) g.list.push_back(double(x));
    return g;
  }
};

// Guards failing for a reason of data (a shape not static, a value not constant) simply do not
// match; a guard misused by the rule author (unknown function, wrong argument) is an Error.
struct NoMatch {};

class Evaluator {
 public:
  Evaluator(const Graph& g, const Rule& r, const Match& m) : g_(g), r_(r), m_(m) {}

  [[noreturn]] void bad(const RuleExpr& e, const std::string& msg) const {
    fail(ErrorKind::Invalid, "rule '" + r_.name + "': " + msg, {r_.file, e.line, e.col});
  }

  GV eval(const RuleExpr& e) const {
    switch (e.kind) {
      case RuleExpr::Kind::Number: return GV::number(e.number, e.is_int);
      case RuleExpr::Kind::String: { GV g; g.k = GV::K::Str; g.s = e.text; return g; }
      case RuleExpr::Kind::List: {
        GV g;
        g.k = GV::K::List;
        for (auto& a : e.args) {
          GV v = eval(a);
          if (v.k != GV::K::Num) bad(a, "list items must be numbers");
          g.list.push_back(v.num);
          g.list_int = g.list_int && v.is_int;
        }
        return g;
      }
      case RuleExpr::Kind::Ident: {
        if (auto it = m_.vars.find(e.text); it != m_.vars.end()) return GV::value(it->second);
        if (e.text == "root") return GV::value(m_.root_value);
        if (e.text == "true" || e.text == "false") return GV::boolean(e.text == "true");
        DType t = dtype_from_name(e.text);
        if (t != DType::Undefined) return GV::number(double(int(t)), true);
        bad(e, "unknown name '" + e.text + "' (not a pattern variable or dtype)");
      }
      case RuleExpr::Kind::AttrRef: {
        auto it = m_.attrs.find(e.text);
        if (it == m_.attrs.end()) bad(e, "$" + e.text + " is not bound by the pattern");
        if (!it->second) return GV::none();
        return from_attr(*it->second);
      }
      case RuleExpr::Kind::Not: return GV::boolean(!truth(e.args[0]));
      case RuleExpr::Kind::Compare: return GV::boolean(compare(e));
      case RuleExpr::Kind::Call: return call(e);
    }
    return GV::none();
  }

  bool truth(const RuleExpr& e) const {
    GV v = eval(e);
    if (v.k != GV::K::Bool) bad(e, "a guard must be a predicate or a comparison");
    return v.b;
  }

  static GV from_attr(const Attribute& a) {
    GV g;
    switch (a.kind) {
      case Attribute::Kind::Int: return GV::number(double(a.i), true);
      case Attribute::Kind::Float: return GV::number(double(a.f), false);
      case Attribute::Kind::String: g.k = GV::K::Str; g.s = a.s; return g;
      case Attribute::Kind::Ints: return GV::ints(a.ints);
      case Attribute::Kind::Floats:
        g.k = GV::K::List;
        g.list_int = false;
        for (auto f : a.floats) g.list.push_back(f);
        return g;
      default: return g;
    }
  }

 private:
  const TensorType& type_of(const RuleExpr& e, const GV& v) const {
    if (v.k != GV::K::Val) bad(e, "expected a pattern variable");
    return g_.type(v.s);
  }
  std::string val(const RuleExpr& call, size_t i) const {
    if (i >= call.args.size()) bad(call, call.text + "() needs more arguments");
    GV v = eval(call.args[i]);
    if (v.k != GV::K::Val) bad(call.args[i], call.text + "(): argument " + std::to_string(i + 1) + " must be a pattern variable");
    return v.s;
  }
  Shape static_shape(const std::string& v) const {
    const TensorType& t = g_.type(v);
    if (!t.is_static()) throw NoMatch{};
    return t.static_shape();
  }
  // A list from an attribute binding, a list literal or a constant variable.
  std::vector<int64_t> int_list(const RuleExpr& e) const {
    GV v = eval(e);
    if (v.k == GV::K::List) {
      std::vector<int64_t> r;
      for (auto d : v.list) r.push_back(int64_t(d));
      return r;
    }
    if (v.k == GV::K::Num) return {int64_t(v.num)};
    if (v.k == GV::K::Val) {
      const Tensor* t = g_.constant_value(v.s);
      if (!t) throw NoMatch{};
      return t->to_int_vector();
    }
    throw NoMatch{};
  }
  static std::vector<int64_t> normalize(std::vector<int64_t> axes, int64_t rank) {
    for (auto& a : axes) {
      if (a < -rank || a >= rank) throw NoMatch{};
      if (a < 0) a += rank;
    }
    std::sort(axes.begin(), axes.end());
    return axes;
  }
  bool compare(const RuleExpr& e) const {
    GV a = eval(e.args[0]), b = eval(e.args[1]);
    const std::string& op = e.text;
    if (a.k == GV::K::None || b.k == GV::K::None) return op == "!=" ? a.k != b.k : (op == "==" && a.k == b.k);
    if (a.k == GV::K::Num && b.k == GV::K::Num) {
      if (op == "==") return close(a.num, b.num);
      if (op == "!=") return !close(a.num, b.num);
      if (op == "<") return a.num < b.num;
      if (op == ">") return a.num > b.num;
      if (op == "<=") return a.num <= b.num;
      return a.num >= b.num;
    }
    bool eq;
    if (a.k == GV::K::List && b.k == GV::K::List) {
      eq = a.list.size() == b.list.size();
      for (size_t i = 0; eq && i < a.list.size(); ++i) eq = close(a.list[i], b.list[i]);
    } else if (a.k == GV::K::Str && b.k == GV::K::Str) {
      eq = a.s == b.s;
    } else if (a.k == GV::K::Bool && b.k == GV::K::Bool) {
      eq = a.b == b.b;
    } else {
      bad(e, "cannot compare these values");
    }
    if (op == "==") return eq;
    if (op == "!=") return !eq;
    bad(e, "only == and != compare lists, strings and booleans");
  }

  GV call(const RuleExpr& e) const {
    const std::string& f = e.text;
    auto nargs = [&](size_t n) {
      if (e.args.size() != n) bad(e, f + "() takes " + std::to_string(n) + " argument(s)");
    };
    if (f == "const") {
      for (size_t i = 0; i < e.args.size(); ++i)
        if (!g_.constant_value(val(e, i))) return GV::boolean(false);
      return GV::boolean(true);
    }
    if (f == "is_scalar") {
      for (size_t i = 0; i < e.args.size(); ++i) {
        auto n = g_.type(val(e, i)).numel();
        if (!n || *n != 1) return GV::boolean(false);
      }
      return GV::boolean(true);
    }
    if (f == "scalar") {
      nargs(2);
      const Tensor* t = g_.constant_value(val(e, 0));
      GV want = eval(e.args[1]);
      if (!t || t->numel() != 1 || want.k != GV::K::Num) return GV::boolean(false);
      return GV::boolean(close(t->as_double(0), want.num));
    }
    if (f == "value") {
      nargs(1);
      const Tensor* t = g_.constant_value(val(e, 0));
      if (!t || t->numel() != 1) throw NoMatch{};
      return GV::number(t->as_double(0), !dtype_is_float(t->dtype()));
    }
    if (f == "rank") {
      nargs(1);
      auto r = g_.type(val(e, 0)).rank();
      if (r < 0) throw NoMatch{};
      return GV::number(double(r), true);
    }
    if (f == "numel") {
      nargs(1);
      auto n = g_.type(val(e, 0)).numel();
      if (!n) throw NoMatch{};
      return GV::number(double(*n), true);
    }
    if (f == "dim" || f == "last_dim") {
      nargs(f == "dim" ? 2 : 1);
      const TensorType& t = g_.type(val(e, 0));
      if (t.rank() <= 0) throw NoMatch{};
      int64_t i = f == "dim" ? int64_t(eval(e.args[1]).num) : -1;
      if (i < 0) i += t.rank();
      if (i < 0 || i >= t.rank() || !t.dims[size_t(i)].known()) throw NoMatch{};
      return GV::number(double(t.dims[size_t(i)].value), true);
    }
    if (f == "same_shape") {
      nargs(2);
      return GV::boolean(provably_same_shape(g_.type(val(e, 0)), g_.type(val(e, 1))));
    }
    if (f == "broadcastable" || f == "broadcastable_to") {
      nargs(2);
      Shape a = static_shape(val(e, 0)), b = static_shape(val(e, 1));
      bool uni = f == "broadcastable_to";
      if (uni && a.size() > b.size()) return GV::boolean(false);
      for (size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
        int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1, db = k < b.size() ? b[b.size() - 1 - k] : 1;
        if (da == db || da == 1 || (!uni && db == 1)) continue;
        return GV::boolean(false);
      }
      return GV::boolean(true);
    }
    if (f == "dtype") {
      nargs(1);
      return GV::number(double(int(g_.type(val(e, 0)).dtype)), true);
    }
    if (f == "is_float") {
      for (size_t i = 0; i < e.args.size(); ++i)
        if (!dtype_is_float(g_.type(val(e, i)).dtype)) return GV::boolean(false);
      return GV::boolean(true);
    }
    if (f == "single_use") {
      for (size_t i = 0; i < e.args.size(); ++i) {
        std::string v = val(e, i);
        if (g_.consumers(v).size() != 1 || g_.is_output(v)) return GV::boolean(false);
      }
      return GV::boolean(true);
    }
    if (f == "non_negative") {
      for (size_t i = 0; i < e.args.size(); ++i)
        if (!non_negative(val(e, i), 4)) return GV::boolean(false);
      return GV::boolean(true);
    }
    if (f == "opset") {
      nargs(0);
      return GV::number(double(g_.opset("")), true);
    }
    if (f == "has_attr") {
      nargs(1);
      return GV::boolean(eval(e.args[0]).k != GV::K::None);
    }
    if (f == "len") {
      nargs(1);
      return GV::number(double(int_list(e.args[0]).size()), true);
    }
    if (f == "compose_perm") {  // Transpose<perm=q>(Transpose<perm=p>(x)) == Transpose<perm=p[q[i]]>(x)
      nargs(2);
      auto p = int_list(e.args[0]), q = int_list(e.args[1]);
      if (p.size() != q.size()) throw NoMatch{};
      std::vector<int64_t> r;
      for (auto i : q) {
        if (i < 0 || i >= int64_t(p.size())) throw NoMatch{};
        r.push_back(p[size_t(i)]);
      }
      return GV::ints(r);
    }
    if (f == "is_identity_perm") {
      nargs(1);
      GV v = eval(e.args[0]);
      if (v.k == GV::K::None) return GV::boolean(false);
      auto p = int_list(e.args[0]);
      for (size_t i = 0; i < p.size(); ++i)
        if (p[i] != int64_t(i)) return GV::boolean(false);
      return GV::boolean(true);
    }
    if (f == "same_values") {
      nargs(2);
      return GV::boolean(int_list(e.args[0]) == int_list(e.args[1]));
    }
    if (f == "same_axes") {  // two axis lists naming the same axes of a tensor of rank(x)
      nargs(3);
      auto r = g_.type(val(e, 2)).rank();
      if (r < 0) throw NoMatch{};
      return GV::boolean(normalize(int_list(e.args[0]), r) == normalize(int_list(e.args[1]), r));
    }
    if (f == "no_zero") {  // a Reshape target without 0 entries (0 copies an input dim)
      nargs(1);
      auto v = int_list(e.args[0]);
      return GV::boolean(std::find(v.begin(), v.end(), 0) == v.end());
    }
    if (f == "trailing_axes") {  // axes are the last len(axes) axes of x
      nargs(2);
      auto r = g_.type(val(e, 1)).rank();
      if (r < 0) throw NoMatch{};
      auto a = normalize(int_list(e.args[0]), r);
      if (a.empty()) return GV::boolean(false);
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != r - int64_t(a.size()) + int64_t(i)) return GV::boolean(false);
      return GV::boolean(true);
    }
    if (f == "first_axis") {
      nargs(2);
      auto r = g_.type(val(e, 1)).rank();
      if (r < 0) throw NoMatch{};
      auto a = normalize(int_list(e.args[0]), r);
      if (a.empty()) throw NoMatch{};
      return GV::number(double(a.front()), true);
    }
    if (f == "trailing_shape") {  // shape(a) == the last k dims of x
      nargs(3);
      Shape a = static_shape(val(e, 0)), x = static_shape(val(e, 1));
      int64_t k = int64_t(eval(e.args[2]).num);
      if (k > int64_t(x.size()) || int64_t(a.size()) != k) return GV::boolean(false);
      return GV::boolean(std::equal(a.begin(), a.end(), x.end() - k));
    }
    if (f == "single_axis") {
      nargs(1);
      auto a = int_list(e.args[0]);
      if (a.size() != 1) throw NoMatch{};
      return GV::number(double(a[0]), true);
    }
    if (f == "same_attrs") {  // two bound op terms with equal attributes
      nargs(2);
      auto a = g_.producer(val(e, 0)), b = g_.producer(val(e, 1));
      if (!a || !b) bad(e, "same_attrs() takes two bound op terms (d:Op(...))");
      return GV::boolean(g_.node(*a).attrs == g_.node(*b).attrs);
    }
    if (f == "is_static") {
      for (size_t i = 0; i < e.args.size(); ++i)
        if (!g_.type(val(e, i)).is_static()) return GV::boolean(false);
      return GV::boolean(true);
    }
    bad(e, "unknown function '" + f + "'");
  }

  // Produced by an op whose results are never negative, or a constant >= 0 (NaN excluded).
  bool non_negative(const std::string& v, int depth) const {
    if (const Tensor* t = g_.constant_value(v)) {
      if (!dtype_is_float(t->dtype()) && !dtype_is_integer(t->dtype())) return false;
      for (int64_t i = 0; i < t->numel(); ++i)
        if (!(t->as_double(i) >= 0)) return false;
      return true;
    }
    auto p = g_.producer(v);
    if (!p || depth == 0) return false;
    const Node& n = g_.node(*p);
    static const std::set<std::string> nonneg = {"Relu", "Sqrt", "Exp", "Abs", "Sigmoid", "Softplus", "Softmax",
                                                  "HardSigmoid", "ReduceL2", "ReduceSumSquare", "Shape", "Size"};
    if (!n.domain.empty()) return false;
    if (nonneg.count(n.op_type)) return true;
    if (n.op_type == "Mul" && n.inputs.size() == 2 && n.inputs[0] == n.inputs[1]) return true;  // x*x
    if ((n.op_type == "Add" || n.op_type == "Mul" || n.op_type == "Div") && n.inputs.size() == 2)
      return non_negative(n.inputs[0], depth - 1) && non_negative(n.inputs[1], depth - 1);
    if (n.op_type == "Clip" && n.inputs.size() >= 2 && !n.inputs[1].empty()) return non_negative(n.inputs[1], 0);
    return false;
  }

  const Graph& g_;
  const Rule& r_;
  const Match& m_;
};

// ---------------------------------------------------------------- matcher
class Matcher {
 public:
  Matcher(const Graph& g, const Rule& r) : g_(g), r_(r) {}

  std::optional<Match> run(NodeId root) {
    const Node& n = g_.node(root);
    if (n.outputs.empty() || n.outputs[0].empty()) return std::nullopt;
    m_ = Match{};
    m_.root_value = n.outputs[0];
    std::optional<Match> found;
    match_term(r_.pattern, n.outputs[0], [&] {
      if (!interior_ok()) return false;
      try {
        Evaluator ev(g_, r_, m_);
        for (auto& gd : r_.guards)
          if (!ev.truth(gd)) return false;
      } catch (const NoMatch&) {
        return false;
      }
      found = m_;
      return true;
    });
    return found;
  }

 private:
  using K = std::function<bool()>;

  bool match_term(const RuleTerm& t, const std::string& v, const K& k) {
    if (v.empty()) return false;
    switch (t.kind) {
      case RuleTerm::Kind::Var: {
        if (t.name == "_") return k();
        auto it = m_.vars.find(t.name);
        if (it != m_.vars.end()) return it->second == v && k();
        m_.vars[t.name] = v;
        if (k()) return true;
        m_.vars.erase(t.name);
        return false;
      }
      case RuleTerm::Kind::Const: {
        const Tensor* c = g_.constant_value(v);
        if (!c || c->numel() == 0 || c->dtype() == DType::String) return false;
        for (int64_t i = 0; i < c->numel(); ++i)
          if (!close(c->as_double(i), t.value)) return false;
        return k();
      }
      case RuleTerm::Kind::Call: return false;
      case RuleTerm::Kind::Op: break;
    }
    auto p = g_.producer(v);
    if (!p) return false;
    const Node& n = g_.node(*p);
    if (n.op_type != t.name || !n.domain.empty() || n.outputs[0] != v) return false;
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (!n.outputs[o].empty() && (!g_.consumers(n.outputs[o]).empty() || g_.is_output(n.outputs[o]))) return false;
    size_t present = n.inputs.size();
    while (present > 0 && n.inputs[present - 1].empty()) --present;
    if (present != t.args.size()) return false;
    // Attributes: literals compare (absent = ONNX default), $bindings bind or compare.
    std::vector<std::string> newly_bound_attrs;
    auto undo = [&] {
      for (auto& a : newly_bound_attrs) m_.attrs.erase(a);
    };
    for (auto& a : t.attrs) {
      const Attribute* have = n.attrs.find(a.name);
      std::optional<Attribute> val = have ? std::optional<Attribute>(*have) : attr_default(n.op_type, a.name, g_.opset(""));
      if (a.value.kind == RuleExpr::Kind::AttrRef) {
        auto it = m_.attrs.find(a.value.text);
        if (it != m_.attrs.end()) {
          bool same = (!it->second && !val) || (it->second && val && *it->second == *val);
          if (!same) return undo(), false;
        } else {
          m_.attrs[a.value.text] = val;
          newly_bound_attrs.push_back(a.value.text);
        }
      } else if (!attr_equals(val, a.value)) {
        return undo(), false;
      }
    }
    bool new_node = std::find(m_.matched.begin(), m_.matched.end(), *p) == m_.matched.end();
    if (new_node) m_.matched.push_back(*p);
    bool bound_name = false;
    if (!t.binding.empty()) {
      auto it = m_.vars.find(t.binding);
      if (it != m_.vars.end() && it->second != v) {
        if (new_node) m_.matched.pop_back();
        return undo(), false;
      }
      if (it == m_.vars.end()) {
        m_.vars[t.binding] = v;
        m_.nodes[t.binding] = *p;
        bound_name = true;
      }
    }
    const OpSchema* s = OpRegistry::global().find("", n.op_type);
    std::vector<size_t> order(t.args.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    bool ok = match_args(t, n, order, 0, k);
    if (!ok && s && s->commutative && t.args.size() == 2) {
      order = {1, 0};
      ok = match_args(t, n, order, 0, k);
    }
    if (!ok) {
      if (bound_name) {
        m_.vars.erase(t.binding);
        m_.nodes.erase(t.binding);
      }
      if (new_node) m_.matched.pop_back();
      undo();
    }
    return ok;
  }

  bool match_args(const RuleTerm& t, const Node& n, const std::vector<size_t>& order, size_t i, const K& k) {
    if (i == t.args.size()) return k();
    return match_term(t.args[i], n.inputs[order[i]], [&] { return match_args(t, n, order, i + 1, k); });
  }

  static bool attr_equals(const std::optional<Attribute>& a, const RuleExpr& e) {
    if (!a) return false;
    switch (e.kind) {
      case RuleExpr::Kind::Number:
        if (a->kind == Attribute::Kind::Int) return close(double(a->i), e.number);
        if (a->kind == Attribute::Kind::Float) return close(double(a->f), e.number);
        return false;
      case RuleExpr::Kind::String: return a->kind == Attribute::Kind::String && a->s == e.text;
      case RuleExpr::Kind::List: {
        std::vector<double> v;
        if (a->kind == Attribute::Kind::Ints)
          for (auto x : a->ints) v.push_back(double(x));
        else if (a->kind == Attribute::Kind::Floats)
          for (auto x : a->floats) v.push_back(double(x));
        else
          return false;
        if (v.size() != e.args.size()) return false;
        for (size_t i = 0; i < v.size(); ++i)
          if (e.args[i].kind != RuleExpr::Kind::Number || !close(v[i], e.args[i].number)) return false;
        return true;
      }
      default: return false;
    }
  }

  // Every node of the match but the root must be used only inside the match (the rewrite removes
  // them; a node used elsewhere would be computed twice).
  bool interior_ok() const {
    for (size_t i = 1; i < m_.matched.size(); ++i) {
      const Node& n = g_.node(m_.matched[i]);
      for (auto& o : n.outputs) {
        if (o.empty()) continue;
        if (g_.is_output(o)) return false;
        for (auto& u : g_.consumers(o))
          if (std::find(m_.matched.begin(), m_.matched.end(), u.node) == m_.matched.end()) return false;
      }
    }
    return true;
  }

  const Graph& g_;
  const Rule& r_;
  Match m_;
};

// ---------------------------------------------------------------- replacement
struct PVal {
  std::string name;       // existing or planned value ("" for an unmaterialized constant)
  bool is_const = false;  // constant data known
  Tensor t;
  bool literal = false;   // untyped number: dtype from its siblings
  double lit = 0;
  TensorType type;
};

Tensor scalar_of(DType dt, double v) {
  return dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    Tensor t(dt, {});
    if constexpr (std::is_same_v<T, Half>) t.data<Half>()[0] = Half{float_to_half(float(v))};
    else if constexpr (std::is_same_v<T, BFloat16>) t.data<BFloat16>()[0] = BFloat16{float_to_bf16(float(v))};
    else if constexpr (std::is_same_v<T, bool>) t.data<bool>()[0] = v != 0;
    else t.data<T>()[0] = T(v);
    return t;
  });
}

class Builder {
 public:
  Builder(Graph& g, const Rule& r, const Match& m) : g_(g), r_(r), m_(m), ev_(g, r, m) {}

  std::optional<Applied> run() {
    PVal root;
    try {
      root = build(r_.replacement);
      if (root.literal) root = as_const(root, g_.type(m_.root_value).dtype);
    } catch (const NoMatch&) {
      return std::nullopt;
    } catch (const Error& e) {
      // Inference or folding rejected the new nodes (shapes that do not fit): not a match. An
      // Invalid error is the rule author's mistake and surfaces.
      if (e.kind() == ErrorKind::Invalid) throw;
      return std::nullopt;
    }
    const TensorType& want = g_.type(m_.root_value);
    TensorType have = root.is_const && root.name.empty() ? TensorType::of(root.t.dtype(), root.t.shape()) : root.type;
    if (!same_type_strict(have, want)) return std::nullopt;
    bool is_planned_root = !planned_.empty() && !root.name.empty() && planned_.back().outputs[0] == root.name;
    if (!is_planned_root && g_.is_output(m_.root_value)) return std::nullopt;  // would rename a graph output
    if (!is_planned_root && root.name == m_.root_value) return std::nullopt;   // nothing changes

    // ---- commit
    Applied out;
    for (auto& [name, t] : inits_) g_.set_initializer(name, t);
    std::string const_root;
    if (root.is_const && root.name.empty()) {
      const_root = fresh(r_.name + "_const");
      g_.set_initializer(const_root, root.t);
    }
    for (size_t i = 0; i + (is_planned_root ? 1 : 0) < planned_.size(); ++i) {
      const Node& pn = planned_[i];
      NodeId id = g_.add_node(pn.op_type, pn.inputs, pn.outputs, pn.attrs, fresh_node_name(pn.op_type));
      g_.set_type(pn.outputs[0], types_[i]);
      out.new_nodes.push_back(id);
    }
    NodeId old_root = g_.producer(m_.root_value).value();
    std::string old_name = g_.node(old_root).name;
    // Inputs of the matched nodes: weights among them that nothing reads afterwards are dropped
    // (a folded weight replaces the old one; keeping both would double the model's size).
    std::set<std::string> matched_inputs;
    for (NodeId id : m_.matched)
      for (auto& i : g_.node(id).inputs)
        if (!i.empty()) matched_inputs.insert(i);
    if (is_planned_root) {
      g_.remove_node(old_root, /*drop_outputs=*/false);
      const Node& pn = planned_.back();
      NodeId id = g_.add_node(pn.op_type, pn.inputs, {m_.root_value}, pn.attrs, old_name.empty() ? fresh_node_name(pn.op_type) : old_name);
      g_.set_type(m_.root_value, types_.back());
      out.new_nodes.push_back(id);
      out.root_value = m_.root_value;
    } else {
      std::string to = const_root.empty() ? root.name : const_root;
      g_.replace_all_uses(m_.root_value, to);
      g_.remove_node(old_root, /*drop_outputs=*/true);
      out.root_value = to;
    }
    // Matched interior nodes nobody reads any more go; the rest stay for their other readers.
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 1; i < m_.matched.size(); ++i) {
        NodeId id = m_.matched[i];
        if (!g_.has_node(id)) continue;
        bool used = false;
        for (auto& o : g_.node(id).outputs)
          if (!o.empty() && (!g_.consumers(o).empty() || g_.is_output(o))) used = true;
        if (!used) {
          g_.remove_node(id, /*drop_outputs=*/true);
          changed = true;
        }
      }
    }
    // A weight no node reads any more is dropped, unless an If/Loop/Scan body still reads it by
    // name (node test test_affine_grid_*_expanded: a folded Slice's bound is read in an If branch).
    std::optional<std::set<std::string>> body_reads;
    for (auto& i : matched_inputs)
      if (g_.is_initializer(i) && g_.consumers(i).empty() && !g_.is_output(i) && !g_.is_input(i)) {
        if (!body_reads) body_reads = passes::names_read_by_subgraphs(g_);
        if (!body_reads->count(i)) g_.remove_initializer(i);
      }
    for (auto& [k, v] : m_.vars)
      if (g_.has_value(v)) out.touched_values.push_back(v);
    if (g_.has_value(out.root_value)) out.touched_values.push_back(out.root_value);
    return out;
  }

 private:
  std::string fresh(const std::string& hint) {
    for (;;) {
      std::string c = hint + "_rw" + std::to_string(counter()++);
      if (!g_.has_value(c) && !reserved_.count(c)) {
        reserved_.insert(c);
        return c;
      }
    }
  }
  std::string fresh_node_name(const std::string& op) { return r_.name + "/" + op + "_" + std::to_string(counter()++); }
  static uint64_t& counter() {
    static thread_local uint64_t c = 0;
    return c;
  }

  PVal as_const(const PVal& v, DType dt) const {
    PVal r;
    r.is_const = true;
    r.t = scalar_of(dt == DType::Undefined ? DType::Float32 : dt, v.lit);
    r.type = TensorType::of(r.t.dtype(), r.t.shape());
    return r;
  }

  std::string materialize(PVal& v) {
    if (!v.name.empty()) return v.name;
    v.name = fresh(r_.name + "_const");
    inits_.push_back({v.name, v.t});
    return v.name;
  }

  Attribute to_attr(const RuleExpr& e) const {
    if (e.kind == RuleExpr::Kind::AttrRef) {
      auto it = m_.attrs.find(e.text);
      if (it != m_.attrs.end() && it->second) return *it->second;
    }
    GV v = ev_.eval(e);
    switch (v.k) {
      case GV::K::Num: return v.is_int ? Attribute::make_int(int64_t(v.num)) : Attribute::make_float(float(v.num));
      case GV::K::Str: return Attribute::make_string(v.s);
      case GV::K::List: {
        if (v.list_int) {
          std::vector<int64_t> r;
          for (auto d : v.list) r.push_back(int64_t(d));
          return Attribute::make_ints(r);
        }
        std::vector<float> r;
        for (auto d : v.list) r.push_back(float(d));
        return Attribute::make_floats(r);
      }
      default: throw NoMatch{};
    }
  }

  PVal call(const RuleTerm& t) {
    PVal r;
    const std::string& f = t.name;
    auto arg_value = [&](size_t i) {
      if (i >= t.call_args.size()) ev_.bad(t.call_args.empty() ? RuleExpr{} : t.call_args.back(), f + "() needs more arguments");
      GV v = ev_.eval(t.call_args[i]);
      if (v.k != GV::K::Val) ev_.bad(t.call_args[i], f + "(): expected a pattern variable");
      return v.s;
    };
    if (f == "scalar") {  // a number computed from attributes/constants; dtype from its siblings
      if (t.call_args.size() != 1) ev_.bad(RuleExpr{}, "scalar() takes one argument");
      GV v = ev_.eval(t.call_args[0]);
      if (v.k != GV::K::Num) throw NoMatch{};
      r.literal = true;
      r.lit = v.num;
      return r;
    }
    Tensor out;
    if (f == "ints") {
      std::vector<int64_t> vals;
      for (auto& a : t.call_args) {
        GV v = ev_.eval(a);
        if (v.k == GV::K::Num) vals.push_back(int64_t(v.num));
        else if (v.k == GV::K::List) for (auto d : v.list) vals.push_back(int64_t(d));
        else throw NoMatch{};
      }
      out = Tensor::from_vector<int64_t>({int64_t(vals.size())}, vals);
    } else if (f == "channel_shape") {  // [-1, 1, ..., 1] of rank(w): broadcasts a per-channel vector over w
      auto rk = g_.type(arg_value(0)).rank();
      if (rk < 1) throw NoMatch{};
      std::vector<int64_t> vals(size_t(rk), 1);
      vals[0] = -1;
      out = Tensor::from_vector<int64_t>({rk}, vals);
    } else if (f == "shape_of") {
      const TensorType& tt = g_.type(arg_value(0));
      if (!tt.is_static()) throw NoMatch{};
      Shape s = tt.static_shape();
      out = Tensor::from_vector<int64_t>({int64_t(s.size())}, s);
    } else if (f == "zeros_like") {
      const TensorType& tt = g_.type(arg_value(0));
      if (!tt.is_static() || dtype_size(tt.dtype) == 0) throw NoMatch{};
      out = Tensor(tt.dtype, tt.static_shape());
    } else {
      ev_.bad(RuleExpr{}, "unknown replacement function '" + f + "'");
    }
    r.is_const = true;
    r.t = out;
    r.type = TensorType::of(out.dtype(), out.shape());
    return r;
  }

  PVal build(const RuleTerm& t) {
    PVal r;
    switch (t.kind) {
      case RuleTerm::Kind::Var: {
        auto it = m_.vars.find(t.name);
        if (it == m_.vars.end())
          fail(ErrorKind::Invalid, "rule '" + r_.name + "': variable '" + t.name + "' of the replacement is not bound by the pattern",
               {r_.file, t.line, t.col});
        r.name = it->second;
        r.type = g_.type(r.name);
        if (const Tensor* c = g_.constant_value(r.name)) {
          r.is_const = true;
          r.t = *c;
        }
        return r;
      }
      case RuleTerm::Kind::Const:
        r.literal = true;
        r.lit = t.value;
        return r;
      case RuleTerm::Kind::Call: return call(t);
      case RuleTerm::Kind::Op: break;
    }
    std::vector<PVal> args;
    for (auto& a : t.args) args.push_back(build(a));
    DType dt = DType::Undefined;
    for (auto& a : args)
      if (!a.literal) {
        dt = a.is_const && a.name.empty() ? a.t.dtype() : a.type.dtype;
        if (a.is_const && !a.name.empty()) dt = a.t.dtype();
        break;
      }
    if (dt == DType::Undefined) dt = g_.type(m_.root_value).dtype;
    bool all_const = true;
    for (auto& a : args) {
      if (a.literal) a = as_const(a, dt);
      all_const = all_const && a.is_const;
    }
    Node n;
    n.op_type = t.name;
    for (auto& a : t.attrs) {
      if (a.copy_all) {
        auto it = m_.nodes.find(a.name);
        if (it == m_.nodes.end())
          fail(ErrorKind::Invalid, "rule '" + r_.name + "': *" + a.name + " does not name a bound op term", {r_.file, t.line, t.col});
        for (auto& [k, v] : g_.node(it->second).attrs.all()) n.attrs.set(k, v);
      } else {
        n.attrs.set(a.name, to_attr(a.value));
      }
    }
    int64_t opset = g_.opset("");
    if (all_const) {
      std::vector<const Tensor*> ins;
      for (auto& a : args) {
        ins.push_back(&a.t);
        n.inputs.push_back("c");
      }
      n.outputs = {"folded"};
      n.name = r_.name + "/fold";
      std::vector<Tensor> res = run_node(n, opset, ins);
      r.is_const = true;
      r.t = res.at(0);
      r.type = TensorType::of(r.t.dtype(), r.t.shape());
      return r;
    }
    std::vector<TensorType> in_types;
    std::vector<const Tensor*> in_values;
    for (auto& a : args) {
      n.inputs.push_back(materialize(a));
      in_types.push_back(a.type);
      in_values.push_back(a.is_const ? &keep(a.t) : nullptr);
    }
    n.outputs = {fresh(r_.name + "_" + t.name)};
    const OpSchema& s = OpRegistry::global().get(n, opset);
    InferContext ic{n, opset, in_types, in_values, {}};
    InferResult ir = s.infer(ic);
    if (ir.outputs.empty()) throw NoMatch{};
    planned_.push_back(n);
    types_.push_back(ir.outputs[0]);
    r.name = n.outputs[0];
    r.type = ir.outputs[0];
    return r;
  }

  const Tensor& keep(const Tensor& t) {
    kept_.push_back(t);
    return kept_.back();
  }

  Graph& g_;
  const Rule& r_;
  const Match& m_;
  Evaluator ev_;
  std::vector<Node> planned_;
  std::vector<TensorType> types_;
  std::vector<std::pair<std::string, Tensor>> inits_;
  std::set<std::string> reserved_;
  std::deque<Tensor> kept_;
};

void collect_guard_vars(const RuleExpr& e, const std::string& fn, GuardHints& h) {
  if (e.kind == RuleExpr::Kind::Not) return;  // `not const(x)`: x must not be made a constant
  if (e.kind == RuleExpr::Kind::Call) {
    for (auto& a : e.args) {
      if (a.kind == RuleExpr::Kind::Ident) {
        if (e.text == "const") h.constants.insert(a.text);
        if (e.text == "non_negative") h.non_negative.insert(a.text);
        if (e.text == "is_scalar" || e.text == "scalar" || e.text == "value") h.scalars.insert(a.text);
        if (e.text == "scalar" || e.text == "value") h.constants.insert(a.text);
      }
      collect_guard_vars(a, e.text, h);
    }
  } else {
    for (auto& a : e.args) collect_guard_vars(a, fn, h);
  }
}

}  // namespace

bool provably_same_shape(const TensorType& a, const TensorType& b) {
  if (!a.has_shape || !b.has_shape || a.dims.size() != b.dims.size()) return false;
  for (size_t i = 0; i < a.dims.size(); ++i) {
    const Dim &x = a.dims[i], &y = b.dims[i];
    // Two unknown dims ("?") of different values say nothing about each other: Slice(x, 2, 5)
    // of a shape vector of unknown length is "?" like x, yet drops two elements.
    bool equal = x.known() ? y.known() && x.value == y.value : !y.known() && !x.symbol.empty() && x.symbol == y.symbol;
    if (!equal) return false;
  }
  return true;
}

bool same_type_strict(const TensorType& a, const TensorType& b) {
  if (!a.is_tensor() || !b.is_tensor()) return false;  // rules rewrite tensors
  if (a.dtype != b.dtype || !a.has_shape || !b.has_shape || a.dims.size() != b.dims.size()) return false;
  for (size_t i = 0; i < a.dims.size(); ++i) {
    const Dim &x = a.dims[i], &y = b.dims[i];
    if (x.known() != y.known()) return false;
    // Unknown dims ("?", no symbol) compare equal: inference on both sides is the same registry
    // function, and a broadcast against a known dim > 1 makes the dim known, so a replacement
    // that drops a broadcast shows up as a known-vs-unknown mismatch.
    if (x.known() ? x.value != y.value : x.symbol != y.symbol) return false;
  }
  return true;
}

std::optional<Match> find_match(const Graph& g, const Rule& rule, NodeId root) { return Matcher(g, rule).run(root); }

std::optional<Applied> apply_match(Graph& g, const Rule& rule, const Match& m) { return Builder(g, rule, m).run(); }

GuardHints guard_hints(const Rule& rule) {
  GuardHints h;
  for (auto& gd : rule.guards) collect_guard_vars(gd, "", h);
  return h;
}

}  // namespace rules_detail

using namespace rules_detail;

bool rule_matches_at(const Graph& g, const Rule& rule, NodeId root) { return find_match(g, rule, root).has_value(); }

bool apply_rule_at(Graph& g, const Rule& rule, NodeId root) {
  auto m = find_match(g, rule, root);
  if (!m) return false;
  return apply_match(g, rule, *m).has_value();
}

RewriteResult apply_rules(Graph& g, const RuleSet& rules, const RewriteOptions& opt) {
  RewriteResult res;
  std::unordered_map<std::string, std::vector<const Rule*>> by_op;
  int depth = 1;
  for (auto& r : rules.rules) {
    by_op[r.pattern.name].push_back(&r);
    depth = std::max(depth, r.pattern_depth());
  }
  const int64_t budget = opt.budget_per_node * int64_t(g.num_nodes()) + opt.budget_base;

  std::deque<NodeId> work;
  std::vector<uint8_t> queued;
  auto push = [&](NodeId id) {
    if (id >= queued.size()) queued.resize(size_t(id) * 2 + 16, 0);
    if (queued[id]) return;
    queued[id] = 1;
    work.push_back(id);
  };
  for (NodeId id : g.topo_order()) push(id);

  // The last applications, to name the rules involved when the budget runs out.
  std::deque<const Rule*> recent;
  const size_t recent_window = 64;

  // Nodes whose patterns may see a change at `id`: the node and its consumers up to `depth` levels.
  auto push_around = [&](NodeId id) {
    std::vector<NodeId> frontier{id};
    std::set<NodeId> seen{id};
    for (int d = 0; d <= depth && !frontier.empty(); ++d) {
      std::vector<NodeId> next;
      for (NodeId n : frontier) {
        if (!g.has_node(n)) continue;
        push(n);
        if (d == depth) continue;
        for (auto& o : g.node(n).outputs) {
          if (o.empty()) continue;
          for (auto& u : g.consumers(o))
            if (seen.insert(u.node).second) next.push_back(u.node);
        }
      }
      frontier = std::move(next);
    }
  };

  while (!work.empty()) {
    NodeId id = work.front();
    work.pop_front();
    queued[id] = 0;
    if (!g.has_node(id)) continue;
    auto it = by_op.find(g.node(id).op_type);
    if (it == by_op.end() || !g.node(id).domain.empty()) continue;
    for (const Rule* r : it->second) {
      auto m = find_match(g, *r, id);
      if (!m) continue;
      auto applied = apply_match(g, *r, *m);
      if (!applied) continue;
      ++res.applications;
      ++res.fired[r->name];
      recent.push_back(r);
      if (recent.size() > recent_window) recent.pop_front();
      if (opt.verify) {
        try {
          g.validate();
        } catch (const Error& e) {
          fail(ErrorKind::Model, "rule '" + r->name + "' left an invalid graph: " + e.detail(), {r->file, r->line, 0});
        }
      }
      for (NodeId n : applied->new_nodes) push_around(n);
      // A bound value lost readers: patterns needing it single-use (as an interior node, or by a
      // single_use guard) may match now at its remaining readers. A widely read value (a shared
      // constant) cannot have become single-use: re-queueing its readers would make big graphs
      // quadratic.
      for (auto& v : applied->touched_values) {
        if (!g.has_value(v)) continue;
        auto p = g.producer(v);
        if (!p || g.consumers(v).size() > 4) continue;
        push_around(*p);
      }
      if (res.applications >= budget) {
        std::map<std::string, int> counts;
        for (auto* rr : recent) ++counts[rr->name];
        std::string names;
        for (auto& [n, c] : counts) {
          res.loop_rules.push_back(n);
          names += (names.empty() ? "" : ", ") + n;
        }
        res.loop_stopped = true;
        res.loop_message = "rewriting stopped after " + std::to_string(res.applications) +
                           " rule applications (budget for " + std::to_string(g.num_nodes()) +
                           " nodes): the rules keep rewriting each other's results, probably a loop among: " + names;
        if (opt.strict) fail(ErrorKind::Invalid, res.loop_message);
        return res;
      }
      break;  // the node is gone or changed: its remaining rules are tried when it is re-queued
    }
  }
  g.prune_values();
  return res;
}

}  // namespace nnfuse
