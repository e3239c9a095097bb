#include "args.h"

#include <sstream>

namespace nnfuse::cli {

std::string CommandSpec::usage_line() const {
  std::string u = "usage: nnfuse " + name;
  for (auto& p : positionals) u += " " + p.metavar;
  for (auto& o : options) {
    std::string item = o.short_name.empty() ? o.name : o.short_name;
    if (!o.metavar.empty()) item += " " + o.metavar;
    u += o.required ? " " + item : " [" + item + "]";
    if (o.repeatable) u += "...";
  }
  return u;
}

std::string CommandSpec::help_text() const {
  std::ostringstream s;
  s << usage_line() << "\n\n" << summary << "\n";
  if (!description.empty()) s << "\n" << description << "\n";
  if (!positionals.empty()) {
    s << "\narguments:\n";
    for (auto& p : positionals) s << "  " << p.metavar << std::string(p.metavar.size() < 26 ? 26 - p.metavar.size() : 1, ' ') << p.help << "\n";
  }
  s << "\noptions:\n";
  auto line = [&](std::string left, const std::string& help) {
    left = "  " + left;
    if (left.size() < 28) left += std::string(28 - left.size(), ' ');
    else left += "\n" + std::string(28, ' ');
    s << left << help << "\n";
  };
  for (auto& o : options) {
    std::string left = o.short_name.empty() ? o.name : o.short_name + ", " + o.name;
    if (!o.metavar.empty()) left += " " + o.metavar;
    line(left, o.help + (o.repeatable ? " (repeatable)" : "") + (o.required ? " (required)" : ""));
  }
  line("-h, --help", "show this help and exit");
  if (!examples.empty()) {
    s << "\nexample" << (examples.size() > 1 ? "s" : "") << ":\n";
    for (auto& e : examples) s << "  " << e << "\n";
  }
  return s.str();
}

std::string ParsedArgs::get(const std::string& option, const std::string& dflt) const {
  auto it = values_.find(option);
  return it == values_.end() || it->second.empty() ? dflt : it->second.back();
}

std::vector<std::string> ParsedArgs::all(const std::string& option) const {
  auto it = values_.find(option);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int64_t ParsedArgs::get_int(const std::string& option, int64_t dflt, int64_t min, int64_t max) const {
  if (!has(option)) return dflt;
  std::string v = get(option);
  std::string usage = spec ? spec->usage_line() : "";
  long long x = 0;
  try {
    size_t used = 0;
    x = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
  } catch (const std::exception&) {
    throw UsageError(option + " expects an integer, got '" + v + "'", usage);
  }
  if (x < min || x > max)
    throw UsageError(option + " " + v + " is out of range (" + std::to_string(min) + " to " + std::to_string(max) + ")", usage);
  return x;
}

bool wants_help(const std::vector<std::string>& args) {
  for (auto& a : args) {
    if (a == "--") return false;
    if (a == "-h" || a == "--help") return true;
  }
  return false;
}

ParsedArgs parse_args(const CommandSpec& spec, const std::vector<std::string>& args) {
  ParsedArgs r;
  r.spec = &spec;
  const std::string usage = spec.usage_line();
  auto find = [&](const std::string& name) -> const OptionSpec* {
    for (auto& o : spec.options)
      if (o.name == name || (!o.short_name.empty() && o.short_name == name)) return &o;
    return nullptr;
  };
  bool options_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!options_done && a == "--") { options_done = true; continue; }
    // "-" alone and negative-looking numbers are positionals; everything else starting with '-'
    // must be a declared option.
    if (options_done || a.size() < 2 || a[0] != '-') {
      r.positionals_.push_back(a);
      continue;
    }
    std::string name = a, inline_value;
    bool has_inline = false;
    if (a.rfind("--", 0) == 0) {
      auto eq = a.find('=');
      if (eq != std::string::npos) { name = a.substr(0, eq); inline_value = a.substr(eq + 1); has_inline = true; }
    }
    const OptionSpec* o = find(name);
    if (!o) throw UsageError("unknown option '" + name + "' for 'nnfuse " + spec.name + "'", usage);
    auto& slot = r.values_[o->name];
    if (!slot.empty() && !o->repeatable)
      throw UsageError("option " + o->name + " given more than once", usage);
    if (o->metavar.empty()) {
      if (has_inline) throw UsageError("option " + o->name + " takes no value", usage);
      slot.push_back("");
      continue;
    }
    if (has_inline) { slot.push_back(inline_value); continue; }
    // "--shape --json" is a forgotten value, not a value that happens to start with dashes.
    if (i + 1 >= args.size() || (args[i + 1].rfind("--", 0) == 0 && find(args[i + 1].substr(0, args[i + 1].find('=')))))
      throw UsageError("option " + name + " expects a value (" + o->metavar + ")", usage);
    slot.push_back(args[++i]);
  }
  for (auto& o : spec.options)
    if (o.required && !r.has(o.name))
      throw UsageError("missing option " + (o.short_name.empty() ? o.name : o.short_name + "/" + o.name) + " " + o.metavar, usage);
  if (r.positionals_.size() < spec.positionals.size())
    throw UsageError("missing argument " + spec.positionals[r.positionals_.size()].metavar, usage);
  if (r.positionals_.size() > spec.positionals.size())
    throw UsageError("unexpected argument '" + r.positionals_[spec.positionals.size()] + "'", usage);
  return r;
}

}  // namespace nnfuse::cli
