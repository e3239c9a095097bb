#pragma once
// The shipped rule files as passes of the pass manager: `rules-algebraic`, `rules-data-movement`,
// `rules-recognition` (rules/<group>.rules) and `rules-user` (PassContext::user_rule_files; a user
// rule named like a shipped one replaces it, with a warning). Each pass requires "shapes", applies
// its rules to a fixed point and counts applications in PassContext::rules_fired.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rewrite/pass.h"
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
// The names of a group's rules in file order, read from each `rule NAME:` line without parsing.
std::vector<std::string> shipped_rule_names(const std::string& group);
// Just the named rules of a group, in file order, each parsed on its own (cached per process):
// a pass with `only=` parses only the rules it runs, not the whole file.
RuleSet shipped_rules_named(const std::string& group, const std::set<std::string>& names);

// The rules a rule pass runs given its step's arguments (`pass rules-recognition only=a,b`):
// `only=a,b` keeps just the named rules, `skip=a,b` all but them (the group's order is kept; the
// engine indexes rules by root op, so a node is only matched against the kept rules of its op).
// A class pipeline uses `only=` to run just the rules that ever fired on its class. A name not in
// `rules`, an empty name, both keys at once, or any key other than only/skip/strict is an Invalid
// error naming the pass and listing the valid rule names.
RuleSet select_rules(const RuleSet& rules, const PassArgs& args, const std::string& pass_name);
// The same check on rule names alone: the names to keep, or nullopt when neither key is given.
std::optional<std::set<std::string>> selected_rule_names(const std::vector<std::string>& names, const PassArgs& args,
                                                        const std::string& pass_name);

}  // namespace nnfuse
