#include "kernels/artifact_plan.h"

#include "graph/error.h"

namespace nnfuse {

namespace {

using json = nlohmann::json;

struct PlanChecker {
  const std::string& path;

  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    fail(ErrorKind::Io, "'" + path + "': field '" + field + "' " + what + " (the artifact is damaged or was edited; rebuild it with nnfuse compile)");
  }
  const json& need(const json& obj, const std::string& key, const std::string& field) const {
    auto it = obj.find(key);
    if (it == obj.end()) bad(field, "is missing");
    return *it;
  }
  void string(const json& obj, const std::string& key, const std::string& field, bool required = true) const {
    if (!required && !obj.contains(key)) return;
    if (!need(obj, key, field).is_string()) bad(field, "must be a string");
  }
  int64_t integer(const json& obj, const std::string& key, const std::string& field, int64_t lo, int64_t hi,
                  bool required = true) const {
    if (!required && !obj.contains(key)) return lo;
    const json& v = need(obj, key, field);
    if (!v.is_number_integer()) bad(field, "must be an integer");
    int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) bad(field, "is " + std::to_string(x) + ", outside " + std::to_string(lo) + ".." + std::to_string(hi));
    return x;
  }
  void strings(const json& obj, const std::string& key, const std::string& field, bool required = true) const {
    if (!required && !obj.contains(key)) return;
    const json& v = need(obj, key, field);
    if (!v.is_array()) bad(field, "must be a list of strings");
    for (size_t i = 0; i < v.size(); ++i)
      if (!v[i].is_string()) bad(field + "[" + std::to_string(i) + "]", "must be a string");
  }
};

}  // namespace

void check_artifact_plan(const json& plan, const std::string& path) {
  PlanChecker c{path};
  if (!plan.is_object()) fail(ErrorKind::Io, "'" + path + "' is not a JSON object (the artifact is damaged; rebuild it with nnfuse compile)");
  for (const char* k : {"format", "target", "hash", "code_hash", "kernels_checksum"}) c.string(plan, k, k);
  for (const char* k : {"kind", "conv_algorithm", "program_checksum", "weights_checksum", "model_checksum"}) c.string(plan, k, k, false);
  c.integer(plan, "units", "units", 1, 4096);
  int64_t block = c.integer(plan, "layout_block", "layout_block", 0, 64, false);
  if (block != 0 && block != 4 && block != 8 && block != 16) c.bad("layout_block", "is " + std::to_string(block) + ", not 0, 4, 8 or 16");
  if (plan.contains("conv_algorithm")) {
    const std::string a = plan["conv_algorithm"];
    if (a != "auto" && a != "direct" && a != "winograd" && a != "winograd2") c.bad("conv_algorithm", "is '" + a + "', not auto, direct, winograd or winograd2");
  }
  if (plan.contains("conv_algorithm_measured")) {
    const json& m = plan["conv_algorithm_measured"];
    if (!m.is_object()) c.bad("conv_algorithm_measured", "must be an object");
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_number_integer()) c.bad("conv_algorithm_measured." + it.key(), "must be an integer");
  }
  if (plan.contains("conv_timings") && !plan["conv_timings"].is_object()) c.bad("conv_timings", "must be an object");
  if (plan.contains("int8_dot") && !plan["int8_dot"].is_boolean()) c.bad("int8_dot", "must be true or false");
  c.strings(plan, "stages", "stages");
  if (plan.contains("bodies")) {
    const json& br = plan["bodies"];
    if (!br.is_array()) c.bad("bodies", "must be a list");
    for (size_t i = 0; i < br.size(); ++i) {
      const std::string f = "bodies[" + std::to_string(i) + "]";
      if (!br[i].is_object()) c.bad(f, "must be an object");
      for (const char* k : {"node", "attr", "dir"}) c.string(br[i], k, f + "." + k);
    }
  }
  const json& blocks = c.need(plan, "blocks", "blocks");
  if (!blocks.is_array()) c.bad("blocks", "must be a list");
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string f = "blocks[" + std::to_string(i) + "]";
    const json& b = blocks[i];
    if (!b.is_object()) c.bad(f, "must be an object");
    c.integer(b, "id", f + ".id", 0, int64_t(1) << 40);
    c.string(b, "anchor", f + ".anchor");
    c.string(b, "mapping_type", f + ".mapping_type");
    for (const char* k : {"members", "inputs", "outputs"}) c.strings(b, k, f + "." + k);
    c.strings(b, "recomputed", f + ".recomputed", false);
    if (b.contains("pattern")) {
      c.string(b, "pattern", f + ".pattern");
      c.strings(b, "pattern_nodes", f + ".pattern_nodes");
      if (b["pattern_nodes"].size() != 3) c.bad(f + ".pattern_nodes", "must name 3 nodes");
    }
  }
}

}  // namespace nnfuse
