#pragma once
// The nnfuse commands. Each command lives in its own cmd_*.cpp and exposes one function returning
// its Command; commands.cpp lists them. Adding a command (optimize, compile, tune-pipeline, rules
// check) is one new file plus one line in that list.
#include <functional>
#include <string>
#include <vector>

#include "args.h"

namespace nnfuse::cli {

struct Command {
  CommandSpec spec;
  // Runs the command on parsed arguments; returns the exit code. Errors are thrown
  // (UsageError -> 2, nnfuse::Error and other std::exception -> 1) and printed by main.
  std::function<int(const ParsedArgs&)> run;
};

Command inspect_command();
Command convert_command();
Command run_command();
Command zoo_list_command();
Command zoo_export_command();
Command demo_command();
Command rules_check_command();
Command optimize_command();
Command compile_command();
Command ops_command();
Command tune_pipeline_command();

// Every command, in the order `nnfuse --help` lists them. Names with a space ("zoo list") are
// subcommands of a group ("zoo").
const std::vector<Command>& all_commands();

}  // namespace nnfuse::cli
