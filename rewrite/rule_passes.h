#pragma once
// The shipped rule files as passes of the pass manager: `rules-algebraic`, `rules-data-movement`,
// `rules-recognition` (rules/<group>.rules) and `rules-user` (PassContext::user_rule_files; a user
// rule named like a shipped one replaces it, with a warning). Each pass requires "shapes", applies
// its rules to a fixed point and counts applications in PassContext::rules_fired.
#include <string>
#include <vector>

#include "rewrite/rule.h"

namespace nnfuse {

// Registers the rule passes with PassRegistry::global() (idempotent). Called by the optimize
// driver: explicit, because static libraries drop static initialisers.
void register_rule_passes();

// The directory holding the shipped *.rules files: $NNFUSE_RULES_DIR if set, else the first of
// <exe>/../share/nnfuse/rules, <exe>/../rules, <exe>/../../rules and the source tree's rules/.
std::string shipped_rules_dir();
// The shipped rule groups, in the order the `full` pipeline runs them.
const std::vector<std::string>& shipped_rule_groups();  // {"algebraic", "data-movement", "recognition"}
// Loads rules/<group with '-' as '_'>.rules (cached per process).
const RuleSet& shipped_rules(const std::string& group);
// Every shipped rule (all groups).
RuleSet all_shipped_rules();

}  // namespace nnfuse
