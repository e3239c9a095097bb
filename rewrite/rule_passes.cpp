#include "rewrite/rule_passes.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "rewrite/pass.h"

namespace nnfuse {

namespace fs = std::filesystem;

static std::string find_shipped_rules_dir();

std::string shipped_rules_dir() {
  // $NNFUSE_DATA_DIR holds rules/ (and rules/pipelines/): the Python package points it at its data.
  if (const char* env = std::getenv("NNFUSE_DATA_DIR"); env && *env) return (fs::path(env) / "rules").string();
  if (const char* env = std::getenv("NNFUSE_RULES_DIR"); env && *env) return env;
  // Without either variable the answer depends only on where this executable and source tree
  // are: found once (each lookup is several file-system calls, and every optimize asks).
  static const std::string found = find_shipped_rules_dir();
  return found;
}

std::string find_shipped_rules_dir() {
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
#ifdef NNFUSE_SOURCE_DIR
  candidates.push_back(fs::path(NNFUSE_SOURCE_DIR) / "rules");  // rewrite/CMakeLists.txt
#else
  candidates.push_back(fs::path(__FILE__).parent_path().parent_path() / "rules");
#endif
  for (auto& c : candidates)
    if (fs::exists(c / "algebraic.rules", ec)) return fs::weakly_canonical(c, ec).string();
  fail(ErrorKind::Io, "cannot find the shipped rule files (algebraic.rules); set NNFUSE_RULES_DIR");
}

const std::vector<std::string>& shipped_rule_groups() {
  static const std::vector<std::string> groups = {"algebraic", "data-movement", "recognition"};
  return groups;
}

namespace {
std::string group_file(const std::string& group) {
  std::string file = group;
  for (auto& c : file)
    if (c == '-') c = '_';
  return (fs::path(shipped_rules_dir()) / (file + ".rules")).string();
}

}  // namespace

const RuleSet& shipped_rules(const std::string& group) {
  static std::mutex mu;
  static std::map<std::string, RuleSet> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(group);
  if (it != cache.end()) return it->second;
  RuleSet rs = load_rule_file(group_file(group));
  return cache.emplace(group, std::move(rs)).first->second;
}

namespace {

// One rule of a shipped file as text: the lines from its `rule NAME:` line (at column 0, as every
// shipped rule starts) to the next such line, so a class pipeline's `only=` parses just its rules.
struct RuleChunk {
  std::string name;
  int line = 0;  // of the `rule` line in the file
  std::string text;
};

struct GroupChunks {
  std::string path;
  std::vector<RuleChunk> chunks;
  std::map<std::string, Rule> parsed;  // rule name -> the rule, parsed on first use
};

std::mutex chunks_mu;

GroupChunks& group_chunks(const std::string& group) {  // chunks_mu held
  static std::map<std::string, GroupChunks> cache;
  auto it = cache.find(group);
  if (it != cache.end()) return it->second;
  GroupChunks gc;
  gc.path = group_file(group);
  std::ifstream in(gc.path);
  if (!in) fail(ErrorKind::Io, "cannot read rule file '" + gc.path + "'");
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.rfind("rule ", 0) == 0) {
      RuleChunk c;
      c.line = lineno;
      size_t end = line.find_first_of(": \t", 5);
      c.name = line.substr(5, end == std::string::npos ? std::string::npos : end - 5);
      gc.chunks.push_back(std::move(c));
    }
    if (!gc.chunks.empty()) gc.chunks.back().text += line + "\n";
  }
  return cache.emplace(group, std::move(gc)).first->second;
}

}  // namespace

std::vector<std::string> shipped_rule_names(const std::string& group) {
  std::lock_guard<std::mutex> lock(chunks_mu);
  std::vector<std::string> names;
  for (auto& c : group_chunks(group).chunks) names.push_back(c.name);
  return names;
}

RuleSet shipped_rules_named(const std::string& group, const std::set<std::string>& names) {
  std::lock_guard<std::mutex> lock(chunks_mu);
  GroupChunks& gc = group_chunks(group);
  RuleSet rs;
  for (auto& c : gc.chunks) {
    if (!names.count(c.name)) continue;
    auto it = gc.parsed.find(c.name);
    if (it == gc.parsed.end()) {
      // Blank lines before the chunk keep parse errors and Rule::line at the file's line numbers.
      RuleSet one = parse_rules(std::string(size_t(c.line - 1), '\n') + c.text, gc.path);
      if (one.rules.size() != 1 || one.rules[0].name != c.name)
        fail(ErrorKind::Parse, "rule '" + c.name + "': expected exactly one rule from its `rule` line to the next", {gc.path, c.line, 1});
      it = gc.parsed.emplace(c.name, std::move(one.rules[0])).first;
    }
    rs.rules.push_back(it->second);
  }
  return rs;
}

RuleSet all_shipped_rules() {
  RuleSet all;
  for (auto& g : shipped_rule_groups())
    for (auto& r : shipped_rules(g).rules) all.rules.push_back(r);
  return all;
}

std::optional<std::set<std::string>> selected_rule_names(const std::vector<std::string>& names, const PassArgs& args,
                                                        const std::string& pass_name) {
  auto bad = [&](const std::string& msg) { fail(ErrorKind::Invalid, "pass '" + pass_name + "': " + msg); };
  for (auto& [key, value] : args.values)
    if (key != "only" && key != "skip" && key != "strict") bad("unknown argument '" + key + "' (arguments: only=RULE,..., skip=RULE,..., strict=BOOL)");
  const bool only = args.values.count("only") != 0, skip = args.values.count("skip") != 0;
  if (only && skip) bad("give only= or skip=, not both");
  if (!only && !skip) return std::nullopt;
  const std::string key = only ? "only" : "skip";
  std::set<std::string> named;
  for (const std::string& name : split_arg_list(args.get(key))) {
    if (name.empty()) bad(key + "=" + args.get(key) + ": empty rule name");
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      std::string all;
      for (auto& n : names) all += (all.empty() ? "" : ", ") + n;
      bad(key + "=: unknown rule '" + name + "' (rules of this pass: " + (all.empty() ? "none" : all) + ")");
    }
    named.insert(name);
  }
  if (only) return named;
  std::set<std::string> kept;
  for (auto& n : names)
    if (!named.count(n)) kept.insert(n);
  return kept;
}

RuleSet select_rules(const RuleSet& rules, const PassArgs& args, const std::string& pass_name) {
  std::vector<std::string> names;
  for (auto& r : rules.rules) names.push_back(r.name);
  auto keep = selected_rule_names(names, args, pass_name);
  if (!keep) return rules;
  RuleSet kept;
  for (auto& r : rules.rules)
    if (keep->count(r.name)) kept.rules.push_back(r);
  return kept;
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
      // User rules only replace shipped rules of the same name, so the names are known up front.
      info.check_args = [group](const PassArgs& args) { selected_rule_names(shipped_rule_names(group), args, "rules-" + group); };
      info.bodies = true;
      register_pass(info, [group](PassContext& ctx, const PassArgs& args) {
        if (ctx.user_rule_files.empty()) {
          // `only=`/`skip=`: parse and match just the selected rules (no copy of the group without).
          auto keep = selected_rule_names(shipped_rule_names(group), args, "rules-" + group);
          return run_rules(ctx, args, keep ? shipped_rules_named(group, *keep) : shipped_rules(group));
        }
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
        run_rules(ctx, args, select_rules(rules, args, "rules-" + group));
      });
    }
    PassInfo user{"rules-user", "apply the user's rule files (--rules FILE) to a fixed point", {"shapes"}, {"shapes"}, false};
    user.bodies = true;
    // Names in only=/skip= are checked when the pass runs, against the user's rules.
    user.check_args = [](PassArgs args) {
      args.values.erase("only"), args.values.erase("skip");
      selected_rule_names({}, args, "rules-user");
    };
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
      run_rules(ctx, args, select_rules(mine, args, "rules-user"));
    });
  });
}

}  // namespace nnfuse
