// decompose-rms-norm: RMSNormalization (opset 23) -> Mul(X, X), ReduceMean over the normalised
// axes, Add(epsilon), Sqrt, Div, Mul(scale): ops the code generator lowers (a reduction with its
// epilogue and elementwise stages), where the op itself has only its reference kernel.
// Condition: float32 X of known rank and float32 scale; the op's stash_type is float (its default, and what the
// decomposed form computes in). Apply: the chain above, the output keeping its name.
#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

bool apply(Graph& g, NodeId id) {
  const Node n = g.node(id);
  if (n.inputs.size() < 2 || n.outputs.empty() || n.outputs[0].empty()) return false;
  const TensorType& x = g.type(n.inputs[0]);
  // The spec lets scale's type differ from X's; the float32 Mul below would mix them.
  if (x.dtype != DType::Float32 || g.type(n.inputs[1]).dtype != DType::Float32 || !x.has_shape || x.rank() < 1) return false;
  if (n.attrs.get_int("stash_type", 1) != 1) return false;
  int64_t axis = n.attrs.get_int("axis", -1);
  if (axis < -x.rank() || axis >= x.rank()) return false;  // the op's own inference reports it
  if (axis < 0) axis += x.rank();
  const NodeMaker op{g, n.name.empty() ? "rms_norm" : n.name};
  std::vector<int64_t> axes;
  for (int64_t i = axis; i < x.rank(); ++i) axes.push_back(i);
  Attributes keep;
  keep.set("keepdims", Attribute::make_int(1));
  const std::string ms = op("ReduceMean", {op("Mul", {n.inputs[0], n.inputs[0]}), op.ints("axes", axes)}, keep);
  const std::string rms = op("Sqrt", {op("Add", {ms, op.scalar("epsilon", n.attrs.get_float("epsilon", 1e-5f))})});
  const std::string y = op("Mul", {op("Div", {n.inputs[0], rms}), n.inputs[1]});
  const std::string out = n.outputs[0];
  g.remove_node(id, /*drop_outputs=*/false);
  redirect(g, out, y);
  return true;
}

void run(PassContext& ctx, const PassArgs&) {
  if (ctx.graph().opset() < 18) return;  // ReduceMean takes its axes as an input from opset 18 (the op is 23+)
  rewrite_each(ctx, "RMSNormalization", "decompose-rms-norm", apply);
}

}  // namespace

void register_decompose_rms_norm_pass() {
  register_pass({"decompose-rms-norm", "RMSNormalization (opset 23) -> Mul, ReduceMean, Add, Sqrt, Div, Mul that the code generator lowers",
                 {"shapes"}, {}, false},
                run);
}

}  // namespace nnfuse::passes
