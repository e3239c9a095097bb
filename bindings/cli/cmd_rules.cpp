// nnfuse rules check FILE: tests every rule of a rule file on random instances with the reference
// interpreter (rewrite/rule_check.cpp) and exits 1 if a rule's two sides disagree.
#include <iostream>

#include "commands.h"
#include "report.h"
#include "rewrite/rule.h"

namespace nnfuse::cli {

namespace {

int run_rules_check(const ParsedArgs& args) {
  const std::string file = args.positional(0);
  RuleSet rules = load_rule_file(file);
  RuleCheckOptions opt;
  opt.seed = uint64_t(args.get_int("--seed", 1, 0, std::numeric_limits<int32_t>::max()));
  opt.attempts = int(args.get_int("--attempts", opt.attempts, 1, 1000000));
  std::vector<RuleCheckResult> res = check_rules(rules, opt);
  int wrong = 0, unmatched = 0;
  for (auto& r : res) {
    wrong += r.wrong;
    unmatched += !r.wrong && r.instances == 0;
  }
  if (args.json()) {
    json arr = json::array();
    for (auto& r : res) {
      json j{{"rule", r.rule}, {"line", r.line}, {"instances", r.instances},
             {"status", r.wrong ? "wrong" : r.instances == 0 ? "never-matched" : "ok"}};
      if (r.wrong) {
        j["counterexample"] = r.counterexample;
        j["max_abs_diff"] = r.max_abs_diff;
      }
      arr.push_back(j);
    }
    print_json(json{{"file", file}, {"rules", arr}, {"wrong", wrong}, {"never_matched", unmatched}, {"ok", wrong == 0}});
  } else {
    for (auto& r : res) {
      if (r.wrong)
        std::cout << "WRONG  " << r.rule << " (" << r.file << ":" << r.line << "): " << r.counterexample << "\n";
      else if (r.instances == 0)
        std::cout << "UNMATCHED " << r.rule << " (" << r.file << ":" << r.line << "): no random instance matched its pattern and guards\n";
      else
        std::cout << "ok     " << r.rule << " (" << r.instances << " instances)\n";
    }
    std::cout << res.size() << " rules: " << (res.size() - size_t(wrong) - size_t(unmatched)) << " ok, " << wrong << " wrong, "
              << unmatched << " never matched\n";
  }
  return wrong ? 1 : 0;
}

}  // namespace

Command rules_check_command() {
  CommandSpec s;
  s.name = "rules check";
  s.summary = "test each rule of a rule file on random instances with the reference interpreter";
  s.positionals = {{"FILE", "a .rules file (language: rules/README.md)"}};
  s.options = {
      {"--seed", "", "N", "seed of the random instances (default 1)"},
      {"--attempts", "", "N", "random instances tried per rule (default 400)"},
      {"--json", "", "", "print one JSON object on stdout instead of text"},
  };
  s.description = "For every rule: builds random instances of its pattern over several shapes, dtypes and opsets\n"
                  "(constants where a guard asks for them), rewrites them and compares both sides' outputs.\n"
                  "Reports rules whose sides disagree (with the counter-example) and rules that never matched.\n"
                  "Exits 1 if any rule is wrong. This tests; it does not prove.";
  s.examples = {"nnfuse rules check rules/algebraic.rules", "nnfuse rules check my.rules --json"};
  return {s, run_rules_check};
}

}  // namespace nnfuse::cli
