#include "commands.h"

namespace nnfuse::cli {

const std::vector<Command>& all_commands() {
  static const std::vector<Command> commands = {
      inspect_command(),
      convert_command(),
      optimize_command(),
      run_command(),
      compile_command(),
      zoo_list_command(),
      zoo_export_command(),
      demo_command(),
      ops_command(),
      rules_check_command(),
      tune_pipeline_command(),
  };
  return commands;
}

}  // namespace nnfuse::cli
