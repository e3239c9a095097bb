#pragma once
// Passes and the pass manager (in the manner of TVM's pass infrastructure and ONNX Runtime's
// graph transformers): every transform is a named pass with declared requirements; a pipeline is
// data (an ordered list of pass names with arguments); the manager satisfies requirements, times
// each pass and decides whether it changed the IR by a structural hash, not by the pass's word.
//
// Passes register by name in the PassRegistry, so the manager never includes the folders above
// it (fusion planning and layout choice register themselves from fusion/ and lowering/).
#include <any>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace nnfuse {

// Properties a pass may require; the manager runs the provider pass when one is not current.
// "shapes": every value's type inferred from the current graph (provider: infer-shapes).
using Property = std::string;

struct PassArgs {
  std::map<std::string, std::string> values;
  std::string get(const std::string& key, const std::string& dflt = "") const;
  int64_t get_int(const std::string& key, int64_t dflt) const;  // Invalid error on a non-integer
  bool get_bool(const std::string& key, bool dflt) const;
  std::string str() const;  // "k=v k2=v2"
};

// The items of a comma-separated argument value (`only=a,b` -> {"a", "b"}; empty items kept).
std::vector<std::string> split_arg_list(const std::string& value);

// State shared by the passes of one optimisation run.
struct PassContext {
  Model* model = nullptr;
  std::string target = "host";
  bool verify = false;  // validate the graph after every pass (tests, debug builds)
  std::set<Property> valid;  // properties currently true
  std::map<std::string, int> rules_fired;  // rule name -> applications
  std::vector<std::string> warnings;
  // Results passes leave for later stages and reports (e.g. "fusion_plan"); typed by the producer.
  std::map<std::string, std::any> artifacts;
  // Extra rule files given by the user (--rules), loaded by the rule passes.
  std::vector<std::string> user_rule_files;
  // Structural hash of the graph after the last pass the manager ran (reset it after editing the
  // graph outside the manager).
  std::optional<uint64_t> last_hash;
  Graph& graph() { return model->graph; }
};

struct PassInfo {
  std::string name;
  std::string description;
  std::vector<Property> requires_;     // must hold before the pass runs
  std::vector<Property> preserves;     // still hold after it changed the IR (others are invalidated)
  bool analysis = false;               // never changes the IR (e.g. fusion planning)
  // Checks a step's arguments before the pipeline runs (unknown keys, unknown rule names), so a
  // bad pipeline file fails naming its line before any pass has touched the graph. Optional.
  std::function<void(const PassArgs&)> check_args;
  // Also runs inside If/Loop/Scan bodies (recursively), each body as a graph of its own: for
  // rewrites that look at one graph at a time (rules, folding, CSE, DCE). See PassManager.
  bool bodies = false;
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual const PassInfo& info() const = 0;
  // Runs on ctx.graph(); the return value is ignored for change detection (the manager hashes).
  virtual void run(PassContext& ctx, const PassArgs& args) = 0;
};

using PassFactory = std::function<std::unique_ptr<Pass>()>;

class PassRegistry {
 public:
  static PassRegistry& global();
  void add(const std::string& name, PassFactory f);  // replaces an existing entry of that name
  bool has(const std::string& name) const;
  std::unique_ptr<Pass> create(const std::string& name) const;  // Invalid error listing known names
  std::vector<std::string> names() const;
  // The pass that establishes a property ("shapes" -> "infer-shapes").
  void set_provider(const Property& p, const std::string& pass_name);
  std::string provider(const Property& p) const;

 private:
  std::map<std::string, PassFactory> passes_;
  std::map<Property, std::string> providers_;
};

// Registers a pass from a lambda (small passes need no class of their own).
void register_pass(PassInfo info, std::function<void(PassContext&, const PassArgs&)> run);

struct PipelineStep {
  std::string pass;
  PassArgs args;
  int line = 0;  // in the pipeline file
};

struct Pipeline {
  std::string name;
  std::string network_class;  // the class it is tuned for ("" = any)
  std::string description;
  std::vector<PipelineStep> steps;
  std::string file;
};

// Pipeline files: `#` comments; `pipeline NAME`, `class CLASS`, `description TEXT`, and one
// `pass NAME [key=value ...]` per line. Errors give file:line:col and what was expected.
Pipeline parse_pipeline(const std::string& text, const std::string& file = "<pipeline>");
// The arguments of one pass listed by two pipelines that a hybrid unites: it runs what either
// runs. A key both give alike stays; two `only=` lists are united; any other key (including an
// `only=` or a `part=false` given by one side alone) is dropped, back to the pass's default.
PassArgs unite_step_args(const PassArgs& a, const PassArgs& b);
Pipeline load_pipeline_file(const std::string& path);

struct PassRecord {
  std::string name;
  std::string args;
  double ms = 0;      // wall time
  double cpu_ms = 0;  // this thread's CPU time (user + system, so page faults count): on a shared,
                      // loaded machine it is what the pass itself cost, without waiting for a core
  bool changed = false;
  bool auto_inserted = false;  // run to satisfy a requirement, not listed in the pipeline
  size_t nodes_before = 0, nodes_after = 0;
};

// A structural hash of the graph: op types, attributes, wiring and initializer identities, in
// topological order with canonical value numbering (independent of value names and node ids).
uint64_t structural_hash(const Graph& g);

// CPU time of the calling thread in ms (CLOCK_THREAD_CPUTIME_ID).
double thread_cpu_ms();

class PassManager {
 public:
  // Runs the pipeline; unknown pass names fail before anything runs (naming the file and line).
  std::vector<PassRecord> run(const Pipeline& p, PassContext& ctx) const;
  // Runs one pass with its requirements satisfied first.
  void run_step(const PipelineStep& step, PassContext& ctx, std::vector<PassRecord>& records) const;
};

}  // namespace nnfuse
