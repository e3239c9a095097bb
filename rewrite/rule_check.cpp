// The rule checker: builds random instances of each rule's pattern (shapes, dtypes and opsets
// drawn at random; constants where a guard wants them, non-negative data where a guard wants it,
// index inputs such as Reshape targets or axes generated to fit the data they index), lets the real
// matcher decide whether the instance matches, applies the rule to a copy and compares both
// graphs' outputs with the reference interpreter. It proves nothing; it finds wrong rules.
#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "graph/interpreter.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"
#include "rewrite/rule_engine_internal.h"

namespace nnfuse {

using namespace rules_detail;

namespace {

struct Discard {};  // this random instance does not fit the pattern's ops: try another

class Instance {
 public:
  Instance(const Rule& r, std::mt19937_64& rng, const GuardHints& hints) : r_(r), rng_(rng), hints_(hints) {
    static const int64_t opsets[] = {11, 13, 17, 18, 20};
    opset_ = opsets[pick(5)];
    dtype_ = pick(4) == 0 ? DType::Float64 : DType::Float32;
    int rank_roll = pick(20);
    int rank = rank_roll == 0 ? 0 : rank_roll < 4 ? 1 : rank_roll < 10 ? 2 : rank_roll < 15 ? 3 : 4;
    for (int i = 0; i < rank; ++i) base_.push_back(1 + pick(4));
    g_.opset_imports[""] = opset_;
  }

  Graph& graph() { return g_; }
  std::string build() {
    std::string root = term(r_.pattern, "", -1, "");
    std::string out = "checked_output";
    g_.add_node("Identity", {root}, {out});
    g_.add_output(out);
    root_ = root;
    return root;
  }
  const std::string& root() const { return root_; }
  const TensorMap& feeds() const { return feeds_; }
  int64_t opset() const { return opset_; }

 private:
  int pick(int n) { return int(std::uniform_int_distribution<int>(0, n - 1)(rng_)); }
  double uni(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }

  Tensor random_tensor(DType dt, const Shape& s, double lo, double hi) {
    Tensor t(DType::Float64, s);
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = uni(lo, hi);
    return t.cast(dt);
  }
  Shape shape_of(const std::string& v) {
    const TensorType& t = g_.type(v);
    if (!t.is_static()) throw Discard{};
    return t.static_shape();
  }
  void infer_last() {
    // Types of the nodes added so far (role generators read the shapes of earlier arguments).
    try {
      infer_shapes(g_);
    } catch (const Error&) {
      throw Discard{};
    }
  }

  // A shape for a data variable: mostly the base shape, else a suffix, a scalar or a fresh shape.
  Shape data_shape(const std::string& var) {
    if (hints_.scalars.count(var)) return pick(2) ? Shape{} : Shape{1};
    int roll = pick(20);
    if (roll < 11) return base_;
    if (roll < 14 && !base_.empty()) return Shape(base_.begin() + 1 + pick(int(base_.size())), base_.end());
    if (roll < 15) return Shape{};
    Shape s;
    int rank = pick(5);
    for (int i = 0; i < rank; ++i) s.push_back(1 + pick(4));
    return s;
  }

  std::string add_const(const std::string& hint, const Tensor& t) {
    std::string n = g_.fresh_name(hint);
    g_.set_initializer(n, t);
    return n;
  }

  std::string make_var(const std::string& var, const std::string& parent_op, int slot, const std::string& first_arg,
                       const Node* parent_attrs) {
    // Index-like inputs are generated to fit the data they index.
    Shape d;
    if (!first_arg.empty() && slot > 0) d = shape_of(first_arg);
    int64_t r = int64_t(d.size());
    auto ints = [&](std::vector<int64_t> v) { return add_const(var, Tensor::from_vector<int64_t>({int64_t(v.size())}, v)); };
    auto range_r = [&] {
      std::vector<int64_t> v;
      for (int64_t i = 0; i < r; ++i) v.push_back(i);
      return v;
    };
    static const std::set<std::string> reduces = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"};
    if (slot == 1 && parent_op == "Reshape") {
      int64_t n = shape_numel(d);
      switch (pick(4)) {
        case 0: return ints({n});
        case 1: return ints({-1});
        case 2: { Shape s(d.rbegin(), d.rend()); return ints(s); }
        default: { Shape s = d; s.insert(s.begin() + pick(int(r) + 1), 1); return ints(s); }
      }
    }
    if (slot == 1 && parent_op == "Expand") {
      Shape s = d;
      if (pick(2)) s.insert(s.begin(), 2);
      return ints(s);
    }
    if (slot == 1 && parent_op == "Squeeze") {
      std::vector<int64_t> ones;
      for (int64_t i = 0; i < r; ++i)
        if (d[size_t(i)] == 1) ones.push_back(pick(2) ? i : i - r);
      if (ones.empty()) throw Discard{};
      return ints(ones);
    }
    if (slot == 1 && parent_op == "Unsqueeze") return ints({int64_t(pick(int(r) + 1))});
    if (slot >= 1 && slot <= 4 && parent_op == "Slice") {
      std::vector<int64_t> v;
      for (int64_t i = 0; i < r; ++i)
        v.push_back(slot == 1 ? (pick(4) == 0 ? 1 : 0) : slot == 2 ? (pick(2) ? d[size_t(i)] : 1000) : slot == 3 ? i : 1);
      return ints(v);
    }
    if (slot == 1 && parent_op == "Pad") {
      std::vector<int64_t> v(size_t(2 * r), 0);
      if (pick(3) == 0 && r > 0) v[size_t(pick(int(2 * r)))] = 1;
      return ints(v);
    }
    if (slot == 3 && parent_op == "Pad") return ints(range_r());
    if (slot == 1 && parent_op == "Tile") {
      std::vector<int64_t> v(size_t(r), 1);
      if (pick(3) == 0 && r > 0) v[size_t(pick(int(r)))] = 2;
      return ints(v);
    }
    if (slot == 1 && reduces.count(parent_op)) {
      if (r == 0) throw Discard{};
      return ints(pick(2) ? std::vector<int64_t>{-1} : std::vector<int64_t>{int64_t(pick(int(r)))});
    }
    Shape s;
    // non_negative() holds provably for constants >= 0: such variables are made constants.
    bool is_const = hints_.constants.count(var) != 0 || hints_.non_negative.count(var) != 0;
    if (parent_op == "Gemm" && slot == 1 && r != 2) throw Discard{};
    if ((parent_op == "MatMul" || parent_op == "Gemm") && slot == 1 && r >= 1) {
      bool tb = parent_attrs && parent_attrs->attrs.get_int("transB", 0) == 1;
      int64_t n = 1 + pick(4);
      if (parent_op == "Gemm") s = tb ? Shape{n, d.back()} : Shape{d.back(), n};
      else if (r >= 2 && pick(2)) { s = Shape(d.begin(), d.end() - 2); s.push_back(d.back()); s.push_back(n); }
      else s = {d.back(), n};
    } else if (parent_op == "Conv" && slot == 1) {
      if (r < 3) throw Discard{};
      s = {1 + pick(3), d[1]};
      for (int64_t i = 2; i < r; ++i) s.push_back(1 + pick(std::min<int>(3, int(d[size_t(i)]))));
      conv_out_ = s[0];
    } else if (parent_op == "Conv" && slot == 2) {
      s = {conv_out_};
    } else if (parent_op == "Gemm" && slot == 2) {
      const Node* p = parent_attrs;
      if (!p || p->inputs.size() < 2) throw Discard{};
      Shape w = shape_of(p->inputs[1]);
      if (w.size() != 2) throw Discard{};
      s = {p && p->attrs.get_int("transB", 0) == 1 ? w[0] : w[1]};
    } else if (parent_op == "BatchNormalization" && slot >= 1) {
      if (r < 2) throw Discard{};
      s = {d[1]};
    } else {
      s = data_shape(var);
    }
    double lo = -1, hi = 1;
    if (is_const) lo = 0.5, hi = 1.5;  // away from 0: constants are divided by in several rules
    if (hints_.non_negative.count(var)) lo = 0.1, hi = 2;
    Tensor t = random_tensor(dtype_, s, lo, hi);
    if (is_const) return add_const(var, t);
    std::string n = g_.fresh_name(var);
    g_.add_input(n, TensorType::of(dtype_, s));
    feeds_[n] = t;
    return n;
  }

  Attribute gen_attr(const std::string& attr, const std::string& binding, const std::string& first_arg,
                     const std::string& parent_op) {
    if (auto it = attrs_.find(binding); it != attrs_.end()) return it->second;
    int64_t r = first_arg.empty() ? 0 : int64_t(shape_of(first_arg).size());
    Attribute a;
    if (attr == "perm") {
      std::vector<int64_t> p(static_cast<size_t>(r));
      for (int64_t i = 0; i < r; ++i) p[size_t(i)] = i;
      std::shuffle(p.begin(), p.end(), rng_);
      a = Attribute::make_ints(p);
    } else if (attr == "axes") {
      if (r == 0) throw Discard{};
      // Rules relating two axes lists (Squeeze/Unsqueeze pairs) need them equal now and then.
      for (auto& [k, v] : attrs_)
        if (v.kind == Attribute::Kind::Ints && pick(2)) return attrs_[binding] = v;
      if (parent_op == "Squeeze") {
        Shape d = shape_of(first_arg);
        std::vector<int64_t> ones;
        for (size_t i = 0; i < d.size(); ++i)
          if (d[i] == 1) ones.push_back(int64_t(i));
        if (ones.empty()) throw Discard{};
        return attrs_[binding] = Attribute::make_ints(ones);
      }
      a = Attribute::make_ints(pick(2) ? std::vector<int64_t>{-1} : std::vector<int64_t>{int64_t(pick(int(r)))});
    } else if (attr == "axis") {
      a = Attribute::make_int(r ? pick(int(r)) : 0);
    } else if (attr == "to") {
      static const DType choices[] = {DType::Float32, DType::Float64, DType::Int32};
      a = Attribute::make_int(int64_t(choices[pick(3)]));
    } else if (attr == "epsilon") {
      a = Attribute::make_float(1e-5f);
    } else {
      a = Attribute::make_float(float(uni(0.1, 1.0)));
    }
    attrs_[binding] = a;
    return a;
  }

  std::string term(const RuleTerm& t, const std::string& parent_op, int slot, const std::string& first_arg,
                   const Node* parent = nullptr) {
    switch (t.kind) {
      case RuleTerm::Kind::Var: {
        if (auto it = vars_.find(t.name); it != vars_.end()) return it->second;
        std::string v = make_var(t.name, parent_op, slot, first_arg, parent);
        vars_[t.name] = v;
        return v;
      }
      case RuleTerm::Kind::Const: {
        // A literal in an index position (Pad(x, 0), Tile(x, 1), Slice steps) is an int64 vector
        // of that value, as long as the data's rank asks for.
        int64_t r = first_arg.empty() ? -1 : int64_t(shape_of(first_arg).size());
        int64_t len = -1;
        if (slot == 1 && parent_op == "Pad") len = 2 * r;
        else if ((slot == 1 && parent_op == "Tile") || (slot >= 1 && slot <= 4 && parent_op == "Slice") || (slot == 3 && parent_op == "Pad")) len = r;
        if (len >= 0)
          return add_const("lit", Tensor::from_vector<int64_t>({len}, std::vector<int64_t>(size_t(len), int64_t(t.value))));
        return add_const("lit", scalar_tensor(t.value));
      }
      case RuleTerm::Kind::Call: throw Discard{};
      case RuleTerm::Kind::Op: break;
    }
    if (!t.binding.empty())
      if (auto it = vars_.find(t.binding); it != vars_.end()) return it->second;
    Node attrs_holder;
    for (auto& a : t.attrs) {
      if (a.copy_all) continue;
      if (a.value.kind == RuleExpr::Kind::AttrRef) continue;  // after the first argument (needs its rank)
      attrs_holder.attrs.set(a.name, literal_attr(a.value));
    }
    std::vector<std::string> ins;
    for (size_t i = 0; i < t.args.size(); ++i) {
      attrs_holder.inputs = ins;
      ins.push_back(term(t.args[i], t.name, int(i), ins.empty() ? "" : ins[0], &attrs_holder));
      if (i == 0) infer_last();
    }
    for (auto& a : t.attrs)
      if (!a.copy_all && a.value.kind == RuleExpr::Kind::AttrRef)
        attrs_holder.attrs.set(a.name, gen_attr(a.name, a.value.text, ins.empty() ? "" : ins[0], t.name));
    std::string out = g_.fresh_name(t.name);
    g_.add_node(t.name, ins, {out}, attrs_holder.attrs);
    if (!t.binding.empty()) vars_[t.binding] = out;
    infer_last();
    return out;
  }

  Tensor scalar_tensor(double v) { return Tensor::from_vector<double>({}, {v}).cast(dtype_); }

  // An integer literal past int64 (1e116 written as digits) has no attribute value: the case is
  // discarded, as converting it would be undefined behaviour (found by fuzz_rules).
  static int64_t int_literal(double v) {
    if (!(std::fabs(v) < 9.2e18)) throw Discard{};
    return int64_t(v);
  }

  static Attribute literal_attr(const RuleExpr& e) {
    switch (e.kind) {
      case RuleExpr::Kind::Number: return e.is_int ? Attribute::make_int(int_literal(e.number)) : Attribute::make_float(float(e.number));
      case RuleExpr::Kind::String: return Attribute::make_string(e.text);
      case RuleExpr::Kind::List: {
        std::vector<int64_t> v;
        for (auto& x : e.args) v.push_back(int_literal(x.number));
        return Attribute::make_ints(v);
      }
      default: throw Discard{};
    }
  }

  const Rule& r_;
  std::mt19937_64& rng_;
  const GuardHints& hints_;
  Graph g_;
  int64_t opset_ = 17;
  DType dtype_ = DType::Float32;
  Shape base_;
  int64_t conv_out_ = 1;
  std::map<std::string, std::string> vars_;
  std::map<std::string, Attribute> attrs_;
  TensorMap feeds_;
  std::string root_;
};

std::string values_preview(const Tensor& t) {
  std::ostringstream o;
  o << dtype_name(t.dtype()) << shape_str(t.shape()) << " [";
  for (int64_t i = 0; i < std::min<int64_t>(t.numel(), 6); ++i) o << (i ? ", " : "") << t.as_double(i);
  if (t.numel() > 6) o << ", ...";
  o << "]";
  return o.str();
}

}  // namespace

std::vector<RuleCheckResult> check_rules(const RuleSet& rules, const RuleCheckOptions& opt) {
  std::vector<RuleCheckResult> results;
  for (const Rule& rule : rules.rules) {
    RuleCheckResult res;
    res.rule = rule.name;
    res.file = rule.file;
    res.line = rule.line;
    GuardHints hints = guard_hints(rule);
    std::mt19937_64 rng(opt.seed * 7919 + std::hash<std::string>{}(rule.name));
    for (int attempt = 0; attempt < opt.attempts && res.instances < opt.want && !res.wrong; ++attempt) {
      Instance inst(rule, rng, hints);
      try {
        inst.build();
      } catch (const Discard&) {
        continue;
      } catch (const Error&) {
        continue;
      }
      Graph& g = inst.graph();
      auto root = g.producer(inst.root());
      if (!root) continue;
      auto m = find_match(g, rule, *root);
      if (!m) continue;
      Graph rewritten = g;
      auto applied = apply_match(rewritten, rule, *m);
      if (!applied) continue;
      TensorMap before, after;
      try {
        before = run_reference(g, inst.feeds());
      } catch (const Error&) {
        continue;  // the pattern's own ops reject this instance
      }
      ++res.instances;
      try {
        after = run_reference(rewritten, inst.feeds());
      } catch (const Error& e) {
        res.wrong = true;
        res.counterexample = std::string("the rewritten graph fails to run: ") + e.what();
        break;
      }
      const Tensor& a = before.begin()->second;
      const Tensor& b = after.begin()->second;
      double maxdiff = 0;
      bool bad = a.shape() != b.shape() || a.dtype() != b.dtype();
      double rtol = a.dtype() == DType::Float64 ? 1e-7 : 1e-4, atol = a.dtype() == DType::Float64 ? 1e-9 : 1e-5;
      if (!bad) {
        for (int64_t i = 0; i < a.numel(); ++i) {
          double x = a.as_double(i), y = b.as_double(i);
          if (std::isnan(x) && std::isnan(y)) continue;
          double d = std::fabs(x - y);
          if (std::isnan(d)) d = INFINITY;
          maxdiff = std::max(maxdiff, d);
          if (!(d <= atol + rtol * std::fabs(x))) bad = true;
        }
      }
      if (bad) {
        res.wrong = true;
        res.max_abs_diff = maxdiff;
        std::ostringstream o;
        o << "opset " << inst.opset() << "; inputs:";
        for (auto& [n, t] : inst.feeds()) o << " " << n << "=" << values_preview(t);
        for (auto& w : g.initializer_names()) o << " " << w << "=" << values_preview(g.initializer(w));
        o << "; pattern gives " << values_preview(a) << ", replacement gives " << values_preview(b) << "; max abs diff " << maxdiff;
        res.counterexample = o.str();
      }
    }
    results.push_back(res);
  }
  return results;
}

}  // namespace nnfuse
