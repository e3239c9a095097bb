// fold-transpose-into-gemm: Gemm(Transpose(A), B) -> Gemm(A, B, transA = !transA), likewise for B.
// Condition: the operand is produced by a 2-D Transpose (perm [1, 0], or no perm on a 2-D input).
// Apply: the Gemm reads the Transpose's input with its trans flag flipped; the Transpose goes
// when nothing else reads it.
#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

// The input of a 2-D transpose producing `v`, or "" when `v` is not one.
std::string transposed_source(const Graph& g, const std::string& v) {
  auto p = g.producer(v);
  if (!p) return "";
  const Node& t = g.node(*p);
  if (t.op_type != "Transpose" || !t.domain.empty() || t.inputs.empty() || t.inputs[0].empty()) return "";
  if (g.type(t.inputs[0]).rank() != 2) return "";
  auto perm = t.attrs.opt_ints("perm");
  if (perm && *perm != std::vector<int64_t>{1, 0}) return "";
  return t.inputs[0];
}

int apply(Graph& g, NodeId gemm_id, const std::set<std::string>& body_reads) {
  int folded = 0;
  for (int slot = 0; slot < 2; ++slot) {
    const Node& gemm = g.node(gemm_id);
    if (size_t(slot) >= gemm.inputs.size()) break;
    std::string operand = gemm.inputs[size_t(slot)];
    std::string src = transposed_source(g, operand);
    if (src.empty()) continue;
    const char* flag = slot == 0 ? "transA" : "transB";
    int64_t was = g.node(gemm_id).attrs.get_int(flag, 0);
    g.attrs(gemm_id).set(flag, Attribute::make_int(was ? 0 : 1));
    g.set_input(gemm_id, slot, src);
    NodeId t = *g.producer(operand);
    if (g.consumers(operand).empty() && !g.is_output(operand) && !body_reads.count(operand))
      g.remove_node(t, /*drop_outputs=*/true);
    ++folded;
  }
  return folded;
}

void run(PassContext& ctx, const PassArgs&) {
  Graph& g = ctx.graph();
  int folded = 0;
  std::set<std::string> body_reads = names_read_by_subgraphs(g);
  for (NodeId id : g.topo_order())
    if (g.has_node(id) && g.node(id).op_type == "Gemm" && g.node(id).domain.empty()) folded += apply(g, id, body_reads);
  if (folded) {
    g.prune_values();
    ctx.rules_fired["fold-transpose-into-gemm"] += folded;
  }
}

}  // namespace

void register_fold_transpose_into_gemm_pass() {
  PassInfo info{"fold-transpose-into-gemm", "fold a 2-D Transpose on a Gemm operand into transA/transB", {"shapes"}, {"shapes"}, false};
  info.bodies = true;
  register_pass(info,
                run);
}

}  // namespace nnfuse::passes
