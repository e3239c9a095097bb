#pragma once
// Internals of the rule engine shared by the rewriter (rule_engine.cpp) and the checker
// (rule_check.cpp): match state and the matcher/rewriter entry points on one node.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rewrite/rule.h"

namespace nnfuse::rules_detail {

struct Match {
  std::string root_value;
  std::map<std::string, std::string> vars;                   // variable -> value name
  std::map<std::string, std::optional<Attribute>> attrs;     // $name -> attribute (nullopt: absent)
  std::map<std::string, NodeId> nodes;                       // `d:Op(...)` -> node
  std::vector<NodeId> matched;                               // root first
};

// Finds a match of the rule at `root` (pattern, implicit interior single-use, guards).
std::optional<Match> find_match(const Graph& g, const Rule& rule, NodeId root);

struct Applied {
  std::vector<NodeId> new_nodes;
  std::vector<std::string> touched_values;  // bound values whose uses changed
  std::string root_value;                   // the value now carrying the result
};
// Builds the replacement; returns nullopt (graph untouched) when it cannot be built or its type
// differs from the root's.
std::optional<Applied> apply_match(Graph& g, const Rule& rule, const Match& m);

// Names of variables a guard requires to be constant / non-negative / scalar (used by the checker
// to build instances).
struct GuardHints {
  std::set<std::string> constants, non_negative, scalars, ints;
};
GuardHints guard_hints(const Rule& rule);

// The `same_shape` guard: equal rank and every dim known and equal or the same symbol. Unlike
// same_type_strict, two unknown dims without a symbol are not equal (nothing proves them so).
bool provably_same_shape(const TensorType& a, const TensorType& b);

// Type equality for a replacement: dtype, rank and every dim equal (known and equal, the same
// symbol, or both unknown).
bool same_type_strict(const TensorType& a, const TensorType& b);

}  // namespace nnfuse::rules_detail
