// The rule-file parser and, for what parses, the rule checker (`nnfuse rules check`: random
// instances of each pattern run through both sides with the reference interpreter), with few
// instances per rule so that an execution stays in the milliseconds. Seeds: the shipped rules.
#include "fuzz_common.h"
#include "rewrite/rule.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  nnfuse::fuzz::set_fuzz_limits();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;  // a rule file of thousands of rules checks for minutes
  try {
    nnfuse::RuleSet rules = nnfuse::parse_rules(nnfuse::fuzz::as_string(data, size), "fuzz.rules");
    if (rules.rules.size() > 8) return 0;
    nnfuse::RuleCheckOptions o;
    o.attempts = 6;
    o.want = 2;
    (void)nnfuse::check_rules(rules, o);
  } catch (const nnfuse::Error&) {
  }
  return 0;
}
