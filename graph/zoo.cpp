#include "graph/zoo.h"

namespace nnfuse {

const std::vector<ZooEntry>& zoo_models() {
  static const std::vector<ZooEntry> models = {};
  return models;
}

Model build_zoo_model(const std::string& name, const ZooOptions& opt) {
  std::string known;
  for (auto& e : zoo_models()) {
    if (e.name == name) return e.build(opt);
    known += (known.empty() ? "" : ", ") + e.name;
  }
  fail(ErrorKind::Invalid, "unknown zoo model '" + name + "' (known: " + known + ")");
}

}  // namespace nnfuse
