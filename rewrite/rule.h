#pragma once
// Rewrite rules as data: the rule language's syntax tree, its parser, and the engine that applies
// a rule set to a graph until nothing more matches. The language is described (grammar, guards,
// examples) in rules/README.md.
//
// A rule is `rule NAME: PATTERN => REPLACEMENT [where GUARD, ...]`. The pattern is a tree of op
// terms rooted at one node; the replacement builds new nodes (or names an existing value) that
// take over every use of the root's output. Replacement subterms whose inputs are all constants
// are folded with the reference kernels (new constants computed from bound constants).
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace nnfuse {

// An expression in a guard or an attribute value of a replacement: a literal, a pattern variable,
// a bound attribute ($name), a call of a built-in function, or a comparison.
struct RuleExpr {
  enum class Kind { Number, String, List, Ident, AttrRef, Call, Compare, Not };
  Kind kind = Kind::Number;
  double number = 0;
  bool is_int = false;       // Number written without '.', 'e'
  std::string text;          // String / Ident / AttrRef name / Call name / Compare operator
  std::vector<RuleExpr> args;  // List items, Call arguments, Compare/Not operands
  int line = 0, col = 0;
};

struct RuleTerm;

// `name=EXPR` (pattern: EXPR is a literal or $binding) or `*NAME` (replacement: copy every
// attribute of the pattern node bound to NAME).
struct RuleAttr {
  std::string name;
  RuleExpr value;
  bool copy_all = false;  // `*NAME`: name is the bound op term
};

struct RuleTerm {
  enum class Kind { Var, Const, Op, Call };
  Kind kind = Kind::Var;
  std::string name;     // variable name, op type, or function name
  std::string binding;  // `d:Op(...)`: the op term's output is also bound to variable d
  double value = 0;     // Const
  std::vector<RuleTerm> args;
  std::vector<RuleAttr> attrs;
  std::vector<RuleExpr> call_args;  // Call (replacement functions)
  int line = 0, col = 0;
  std::string str() const;
};

struct Rule {
  std::string name;
  RuleTerm pattern;
  RuleTerm replacement;
  std::vector<RuleExpr> guards;
  std::string file;
  int line = 0;
  std::string text;  // source text of the rule (for reports)
  int pattern_depth() const;
};

struct RuleSet {
  std::vector<Rule> rules;
};

// Parses rule text. Errors: ErrorKind::Parse with file:line:col ("expected X, found Y"); an op
// name the registry does not know is an error naming the rule.
RuleSet parse_rules(const std::string& text, const std::string& file = "<rules>");
RuleSet load_rule_file(const std::string& path);

// Adds `extra` on top of `base`: a rule with the name of one in `base` replaces it (a warning is
// appended to `warnings`).
void merge_rules(RuleSet& base, const RuleSet& extra, std::vector<std::string>* warnings);

struct RewriteOptions {
  // Applications allowed before the loop guard stops: budget_per_node * nodes + budget_base.
  int64_t budget_per_node = 8;
  int64_t budget_base = 1000;
  bool strict = false;  // a stopped loop is an Error instead of a warning
  bool verify = false;  // validate the graph after every application
};

struct RewriteResult {
  int64_t applications = 0;
  std::map<std::string, int> fired;  // rule name -> applications
  bool loop_stopped = false;
  std::vector<std::string> loop_rules;  // rules firing when the loop guard stopped
  std::string loop_message;
};

// Applies the rules to a fixed point. The graph must have inferred types (infer_shapes).
RewriteResult apply_rules(Graph& g, const RuleSet& rules, const RewriteOptions& opt = {});

// Tries one rule at one node (no worklist); returns true if it was applied. For tests and the
// checker.
bool apply_rule_at(Graph& g, const Rule& rule, NodeId root);
// True if the rule's pattern and guards match at the node (nothing is changed).
bool rule_matches_at(const Graph& g, const Rule& rule, NodeId root);

// The rule checker (`nnfuse rules check`): random instances of each pattern, both sides run with
// the reference interpreter.
struct RuleCheckResult {
  std::string rule;
  std::string file;
  int line = 0;
  int instances = 0;  // instances built and matched (and compared)
  bool wrong = false;
  std::string counterexample;  // shapes/dtypes/values and max abs diff of a disagreeing instance
  double max_abs_diff = 0;
};
struct RuleCheckOptions {
  int attempts = 400;  // random instances tried per rule
  int want = 12;       // stop after this many compared instances
  uint64_t seed = 1;
};
std::vector<RuleCheckResult> check_rules(const RuleSet& rules, const RuleCheckOptions& opt = {});

}  // namespace nnfuse
