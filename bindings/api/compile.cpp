#include "api/compile.h"

#include <mutex>
#include <optional>
#include <vector>

#include "fusion/planner.h"

namespace nnfuse {

namespace {

class ReferenceExecutable : public Executable {
 public:
  ReferenceExecutable(const Model& m, const FusionPlan* plan) : model_(m) {
    if (plan) plan_ = *plan;
    if (!plan_) interp_ = std::make_unique<Interpreter>(model_.graph);
  }
  TensorMap run(const TensorMap& feeds) const override {
    if (plan_) return run_plan_reference(model_.graph, *plan_, feeds);
    return interp_->run(feeds);
  }
  nlohmann::json info() const override {
    return {{"target", "reference"},
            {"kernels", plan_ ? plan_->kernels() : model_.graph.num_nodes()},
            {"executor", plan_ ? "fusion plan, block by block, reference kernels" : "reference interpreter"}};
  }

 private:
  Model model_;
  std::optional<FusionPlan> plan_;
  std::unique_ptr<Interpreter> interp_;
};

std::mutex g_mu;
std::vector<Backend>& backends() {
  static std::vector<Backend> b;
  return b;
}

}  // namespace

void register_backend(Backend b) {
  std::lock_guard<std::mutex> lock(g_mu);
  backends().push_back(std::move(b));
}

std::unique_ptr<Executable> compile(const Model& m, const FusionPlan* plan, const CompileOptions& o) {
  if (o.target == "reference") return std::make_unique<ReferenceExecutable>(m, plan);
  target_by_name(o.target);  // unknown names fail with the list of targets
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& b : backends())
    if (b.handles(o.target)) return b.compile(m, plan, o);
  fail(ErrorKind::Unsupported, "no code generator for target '" + o.target + "' yet (available: reference)");
}

}  // namespace nnfuse
