// nnfuse ops: the operators nnfuse supports, with their opsets, family and DNNFusion mapping type.
#include <iomanip>
#include <iostream>

#include "commands.h"
#include "graph/op_registry.h"
#include "report.h"

namespace nnfuse::cli {

namespace {

std::string mapping_of(const OpSchema& s) {
  return s.mapping_fn ? std::string("depends on the node (default ") + mapping_type_name(s.mapping) + ")" : mapping_type_name(s.mapping);
}

int run_ops(const ParsedArgs& args) {
  const auto all = OpRegistry::global().all();
  if (args.json()) {
    json ops = json::array();
    for (auto* s : all)
      ops.push_back({{"name", s->name}, {"domain", s->domain}, {"since", s->since}, {"until", s->until}, {"family", s->family},
                     {"mapping_type", mapping_type_name(s->mapping)}, {"mapping_depends_on_node", bool(s->mapping_fn)},
                     {"commutative", s->commutative}});
    print_json({{"count", all.size()}, {"ops", ops}});
    return 0;
  }
  std::cout << all.size() << " operators\n";
  for (auto* s : all)
    std::cout << "  " << std::left << std::setw(28) << s->name << std::setw(12) << s->family << "opsets " << std::setw(3) << s->since
              << "-" << std::setw(4) << s->until << mapping_of(*s) << "\n";
  return 0;
}

}  // namespace

Command ops_command() {
  CommandSpec s;
  s.name = "ops";
  s.summary = "list the supported operators with opsets, family and mapping type";
  s.options = {{"--json", "", "", "print one JSON object on stdout instead of text"}};
  s.description = "Every operator of the op registry: ONNX name, the opsets it covers, its family and its\nDNNFusion mapping type (some depend on the node's attributes and shapes).";
  s.examples = {"nnfuse ops --json"};
  return {s, run_ops};
}

}  // namespace nnfuse::cli
