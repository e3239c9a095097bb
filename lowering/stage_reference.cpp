#include "lowering/stage_reference.h"

#include <map>

#include "graph/error.h"
#include "graph/interpreter.h"

namespace nnfuse {

void run_stage_reference(const KernelModule& mod, const Stage& st, const std::vector<int>& outputs,
                         const std::function<Tensor(int)>& input, const std::function<void(int, const Tensor&)>& output,
                         const BodyRunner& body_runner) {
  const Graph& g = mod.graph;
  std::map<std::string, Tensor> local;
  auto value = [&](const std::string& v) -> const Tensor* {
    auto it = local.find(v);
    if (it != local.end()) return &it->second;
    int b = mod.buffer_id(v);
    if (b < 0) {
      if (const Tensor* c = g.constant_value(v)) return c;
      fail(ErrorKind::Runtime, "stage " + st.name + ": value '" + v + "' has no buffer");
    }
    return &(local[v] = input(b));
  };
  // What each body reads from outside, found once per stage run (a Loop asks at every iteration).
  std::map<const Graph*, std::vector<std::string>> reads;
  SubgraphRunner sub = [&](const Graph& body, const std::vector<Tensor>& inputs) {
    TensorMap feeds;
    const auto& names = body.inputs();
    for (size_t i = 0; i < names.size() && i < inputs.size(); ++i) feeds[names[i]] = inputs[i];
    // A body reads values of the enclosing graph by name (the planner lists them as block inputs).
    TensorMap scope;
    auto rit = reads.find(&body);
    if (rit == reads.end()) rit = reads.emplace(&body, body.outer_references()).first;
    for (auto& r : rit->second)
      if (g.has_value(r)) scope[r] = *value(r);
    if (body_runner) {
      TensorMap all = feeds;
      all.insert(scope.begin(), scope.end());
      if (auto outs = body_runner(body, all)) return std::move(*outs);
    }
    Interpreter it(body);
    TensorMap out = it.run_scoped(feeds, &scope, body.outputs());
    std::vector<Tensor> res;
    for (auto& o : body.outputs()) res.push_back(out.at(o));
    return res;
  };
  for (NodeId id : st.nodes) {
    const Node& n = g.node(id);
    std::vector<const Tensor*> ins;
    for (auto& v : n.inputs) ins.push_back(v.empty() ? nullptr : value(v));
    std::vector<Tensor> outs = run_node(n, g.opset(n.domain), ins, sub);
    for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i)
      if (!n.outputs[i].empty()) local[n.outputs[i]] = outs[i];
  }
  for (int b : outputs) {
    const KBuffer& B = mod.buffers[size_t(b)];
    auto it = local.find(B.value);
    if (it == local.end()) fail(ErrorKind::Runtime, "stage " + st.name + " did not produce '" + B.value + "'");
    output(b, it->second);
  }
}

}  // namespace nnfuse
