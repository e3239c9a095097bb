#include "rewrite/rule_passes.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

#include "rewrite/pass.h"

namespace nnfuse {

namespace fs = std::filesystem;

std::string shipped_rules_dir() {
  // $NNFUSE_DATA_DIR holds rules/ (and rules/pipelines/): the Python package points it at its data.
  if (const char* env = std::getenv("NNFUSE_DATA_DIR"); env && *env) return (fs::path(env) / "rules").string();
  if (const char* env = std::getenv("NNFUSE_RULES_DIR"); env && *env) return env;
  std::vector<fs::path> candidates;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path d = exe.parent_path();
    candidates.push_back(d / ".." / "share" / "nnfuse" / "rules");
    candidates.push_back(d / ".." / "rules");
    candidates.push_back(d / ".." / ".." / "rules");
  }
  // This file's own location: the source tree of a development build.
  candidates.push_back(fs::path(__FILE__).parent_path().parent_path() / "rules");
  for (auto& c : candidates)
    if (fs::exists(c / "algebraic.rules", ec)) return fs::weakly_canonical(c, ec).string();
  fail(ErrorKind::Io, "cannot find the shipped rule files (algebraic.rules); set NNFUSE_RULES_DIR");
}

const std::vector<std::string>& shipped_rule_groups() {
  static const std::vector<std::string> groups = {"algebraic", "data-movement", "recognition"};
  return groups;
}

const RuleSet& shipped_rules(const std::string& group) {
  static std::mutex mu;
  static std::map<std::string, RuleSet> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(group);
  if (it != cache.end()) return it->second;
  std::string file = group;
  for (auto& c : file)
    if (c == '-') c = '_';
  RuleSet rs = load_rule_file((fs::path(shipped_rules_dir()) / (file + ".rules")).string());
  return cache.emplace(group, std::move(rs)).first->second;
}

RuleSet all_shipped_rules() {
  RuleSet all;
  for (auto& g : shipped_rule_groups())
    for (auto& r : shipped_rules(g).rules) all.rules.push_back(r);
  return all;
}

namespace {

void run_rules(PassContext& ctx, const PassArgs& args, const RuleSet& rules) {
  RewriteOptions opt;
  opt.verify = ctx.verify;
  opt.strict = args.get_bool("strict", false);
  RewriteResult res = apply_rules(ctx.graph(), rules, opt);
  for (auto& [name, n] : res.fired) ctx.rules_fired[name] += n;
  if (res.loop_stopped) ctx.warnings.push_back(res.loop_message);
}

}  // namespace

void register_rule_passes() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const std::string& group : shipped_rule_groups()) {
      PassInfo info{"rules-" + group, "apply the shipped " + group + " rules (rules/" + group + ".rules) to a fixed point",
                    {"shapes"}, {"shapes"}, false};
      register_pass(info, [group](PassContext& ctx, const PassArgs& args) {
        // User rules named like a shipped rule of this group replace it here as well.
        RuleSet rules = shipped_rules(group);
        for (auto& f : ctx.user_rule_files) {
          RuleSet user = load_rule_file(f);
          for (auto& r : rules.rules)
            for (auto& u : user.rules)
              if (u.name == r.name) {
                ctx.warnings.push_back("rule '" + u.name + "' from " + u.file + ":" + std::to_string(u.line) +
                                       " replaces the shipped rule of that name (" + r.file + ":" + std::to_string(r.line) + ")");
                r = u;
              }
        }
        run_rules(ctx, args, rules);
      });
    }
    PassInfo user{"rules-user", "apply the user's rule files (--rules FILE) to a fixed point", {"shapes"}, {"shapes"}, false};
    register_pass(user, [](PassContext& ctx, const PassArgs& args) {
      // Overrides of shipped rules were applied (and warned about) by the shipped groups' passes;
      // here every user rule runs, a later file's rule replacing an earlier one of the same name.
      RuleSet mine;
      for (auto& f : ctx.user_rule_files) {
        RuleSet u = load_rule_file(f);
        for (auto& r : u.rules) {
          bool dup = false;
          for (auto& m : mine.rules)
            if (m.name == r.name) m = r, dup = true;
          if (!dup) mine.rules.push_back(r);
        }
      }
      run_rules(ctx, args, mine);
    });
  });
}

}  // namespace nnfuse
