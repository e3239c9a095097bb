// The nnfuse command-line tool: a thin layer over the library calls.
//
// main() finds the command (or "group subcommand"), parses its arguments against its spec, runs it,
// and turns every failure into one line on stderr: usage errors exit 2 (with the usage line),
// model/input errors exit 1. Nothing escapes as an uncaught exception or an abort.
#include <exception>
#include <iostream>
#if __has_include(<malloc.h>)
#include <malloc.h>  // mallopt (glibc)
#endif
#include <new>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "graph/error.h"

#ifndef NNFUSE_VERSION
#define NNFUSE_VERSION "0.1.0"
#endif

namespace nnfuse::cli {
namespace {

const char* kMainUsage = "usage: nnfuse [--version] [--help] COMMAND [ARGS...]";

std::string group_of(const std::string& name) {
  auto sp = name.find(' ');
  return sp == std::string::npos ? "" : name.substr(0, sp);
}

void print_main_help() {
  std::cout << kMainUsage << "\n\n"
            << "nnfuse imports ONNX models into a graph IR, analyses them and runs them.\n\ncommands:\n";
  for (auto& c : all_commands()) {
    std::string left = "  " + c.spec.name;
    left += std::string(left.size() < 18 ? 18 - left.size() : 1, ' ');
    std::cout << left << c.spec.summary << "\n";
  }
  std::cout << "\nRun 'nnfuse COMMAND --help' for a command's options and an example.\n"
            << "Every command takes --json: stdout then holds exactly one JSON object.\n"
            << "Exit codes: 0 success, 1 model or input error, 2 usage error.\n";
}

std::string group_usage(const std::string& group) {
  std::string subs;
  for (auto& c : all_commands())
    if (group_of(c.spec.name) == group) subs += (subs.empty() ? "" : "|") + c.spec.name.substr(group.size() + 1);
  return "usage: nnfuse " + group + " {" + subs + "} [ARGS...]";
}

void print_group_help(const std::string& group) {
  std::cout << group_usage(group) << "\n\nsubcommands:\n";
  for (auto& c : all_commands())
    if (group_of(c.spec.name) == group) {
      std::string left = "  " + c.spec.name;
      left += std::string(left.size() < 18 ? 18 - left.size() : 1, ' ');
      std::cout << left << c.spec.summary << "\n";
    }
  std::cout << "\nRun 'nnfuse " << group << " SUBCOMMAND --help' for details.\n";
}

int dispatch(const std::vector<std::string>& argv) {
  if (argv.empty()) throw UsageError("no command given (try 'nnfuse --help')", kMainUsage);
  const std::string& first = argv[0];
  if (first == "--help" || first == "-h" || first == "help") {
    print_main_help();
    return 0;
  }
  if (first == "--version" || first == "-V") {
    std::cout << "nnfuse " << NNFUSE_VERSION << "\n";
    return 0;
  }
  std::set<std::string> groups;
  for (auto& c : all_commands())
    if (!group_of(c.spec.name).empty()) groups.insert(group_of(c.spec.name));

  std::string name = first;
  size_t consumed = 1;
  if (groups.count(first)) {
    if (argv.size() < 2) throw UsageError("'nnfuse " + first + "' needs a subcommand", group_usage(first));
    if (argv[1] == "--help" || argv[1] == "-h") {
      print_group_help(first);
      return 0;
    }
    name = first + " " + argv[1];
    consumed = 2;
  }
  const Command* cmd = nullptr;
  for (auto& c : all_commands())
    if (c.spec.name == name) cmd = &c;
  if (!cmd) {
    if (groups.count(first)) throw UsageError("unknown subcommand '" + argv[1] + "' for 'nnfuse " + first + "'", group_usage(first));
    if (first.size() > 1 && first[0] == '-') throw UsageError("unknown option '" + first + "'", kMainUsage);
    std::string known;
    for (auto& c : all_commands())
      if (group_of(c.spec.name).empty()) known += (known.empty() ? "" : ", ") + c.spec.name;
    for (auto& g : groups) known += ", " + g;
    throw UsageError("unknown command '" + first + "' (commands: " + known + ")", kMainUsage);
  }
  std::vector<std::string> rest(argv.begin() + long(consumed), argv.end());
  if (wants_help(rest)) {
    std::cout << cmd->spec.help_text();
    return 0;
  }
  ParsedArgs args = parse_args(cmd->spec, rest);
  return cmd->run(args);
}

// Error messages are printed on one line: a multi-line library message would break that contract.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

int cli_main(int argc, char** argv);
}  // namespace nnfuse::cli

// The whole tool as a function: the binary's main() and the Python module's `python -m nnfuse`
// (nnfuse._core.cli_main) both call it, so the two behave the same.
int nnfuse::cli::cli_main(int argc, char** argv) {
  using namespace nnfuse::cli;
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return dispatch(args);
  } catch (const UsageError& e) {
    std::cerr << "nnfuse: error: " << one_line(e.what()) << "\n";
    if (!e.usage().empty()) std::cerr << e.usage() << "\n";
    return 2;
  } catch (const nnfuse::Error& e) {
    std::cerr << "nnfuse: error: " << one_line(e.what()) << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "nnfuse: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "nnfuse: error: " << one_line(e.what()) << "\n";
    return 1;
  } catch (...) {
    std::cerr << "nnfuse: error: unexpected failure (unknown exception)\n";
    return 1;
  }
}

#ifndef NNFUSE_CLI_NO_MAIN  // defined when the CLI is compiled into the Python module
int main(int argc, char** argv) {
#ifdef M_MMAP_THRESHOLD
  // Rewrites replace weights by new ones of about the same size (folded BatchNorm, concatenated
  // Q/K/V, scaled MatMul weights). With glibc's defaults every buffer over its adaptive mmap
  // threshold is a fresh mmap, so each new weight page-faults in again (and the old one is
  // unmapped): on BERT-base that was half of the passes' CPU time. Serving buffers up to 32 MiB
  // (glibc's maximum here) from the heap and not trimming it lets a new weight reuse the pages of
  // the one just freed. Process-wide, so only the CLI sets it, not the library.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
  int rc = nnfuse::cli::cli_main(argc, argv);
  std::cout.flush();
  return rc;
}
#endif
