#pragma once
// Command-line parsing for the nnfuse tool. Each command declares its options and positionals in a
// CommandSpec; the parser rejects anything not declared (unknown options are errors, never
// ignored) and the same spec renders the command's usage line and --help text.
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace nnfuse::cli {

// A usage error (exit code 2): unknown command/option, missing or malformed argument.
// `usage` is the usage line of the command at fault, printed under the error.
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& message, std::string usage = "")
      : std::runtime_error(message), usage_(std::move(usage)) {}
  const std::string& usage() const { return usage_; }

 private:
  std::string usage_;
};

struct OptionSpec {
  std::string name;        // "--shape"
  std::string short_name;  // "-o", or empty
  std::string metavar;     // "NAME=DIMS"; empty: a flag that takes no value
  std::string help;
  bool repeatable = false;
  bool required = false;  // shown without brackets; absence is a usage error
};

struct PositionalSpec {
  std::string metavar;  // "MODEL"
  std::string help;
};

struct CommandSpec {
  std::string name;     // "inspect", "zoo export"
  std::string summary;  // one line for `nnfuse --help`
  std::vector<PositionalSpec> positionals;  // all required
  std::vector<OptionSpec> options;          // --help is implicit
  std::string description;                  // paragraph(s) for `nnfuse CMD --help`
  std::vector<std::string> examples;

  std::string usage_line() const;  // "usage: nnfuse inspect MODEL [--shape NAME=DIMS]... [--json]"
  std::string help_text() const;   // usage, description, positionals, options, examples
};

class ParsedArgs {
 public:
  bool has(const std::string& option) const { return values_.count(option) != 0; }
  // The value of a single-valued option, or `dflt` when absent.
  std::string get(const std::string& option, const std::string& dflt = "") const;
  // Every value of a repeatable option, in command-line order.
  std::vector<std::string> all(const std::string& option) const;
  const std::string& positional(size_t i) const { return positionals_.at(i); }
  bool json() const { return has("--json"); }

  // Integer option values; a malformed or out-of-range value is a usage error naming the option.
  int64_t get_int(const std::string& option, int64_t dflt, int64_t min, int64_t max) const;

  const CommandSpec* spec = nullptr;

 private:
  friend ParsedArgs parse_args(const CommandSpec& spec, const std::vector<std::string>& args);
  std::map<std::string, std::vector<std::string>> values_;  // flags hold one empty string
  std::vector<std::string> positionals_;
};

// Parses the arguments after the command name. Throws UsageError (with the command's usage line).
ParsedArgs parse_args(const CommandSpec& spec, const std::vector<std::string>& args);

// True if the arguments ask for help (-h/--help before any "--").
bool wants_help(const std::vector<std::string>& args);

}  // namespace nnfuse::cli
