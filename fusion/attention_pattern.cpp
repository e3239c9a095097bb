// Attention chains (attention_pattern.h): found from each Softmax outwards.
#include "fusion/attention_pattern.h"

#include <algorithm>
#include <set>

namespace nnfuse {

namespace {

// Links of the score transform: element-wise on the scores, other operands broadcast onto them.
// Cast (float to float) and Identity are links too: exporters upcast the scores before the softmax.
const std::set<std::string> kScoreOps = {"Add", "Sub", "Mul", "Div", "Where", "Tanh", "Max", "Min", "Cast", "Identity"};

bool static_float(const Graph& g, const std::string& v) {
  const TensorType& t = g.type(v);
  return t.dtype == DType::Float32 && t.is_static();
}

// The node consuming `v`, when `v` has exactly one use and is not a graph output.
NodeId only_use(const Graph& g, const std::string& v) {
  if (g.is_output(v)) return kNoNode;
  const auto& uses = g.consumers(v);
  return uses.size() == 1 ? uses[0].node : kNoNode;
}

bool plain_node(const Node& n) { return n.domain.empty() && n.outputs.size() == 1 && !n.outputs[0].empty(); }

// `in` broadcasts onto `out` (numpy rules) without changing it.
bool broadcasts_onto(const Shape& in, const Shape& out) {
  if (in.size() > out.size()) return false;
  for (size_t k = 0; k < in.size(); ++k) {
    int64_t a = in[in.size() - 1 - k], b = out[out.size() - 1 - k];
    if (a != 1 && a != b) return false;
  }
  return true;
}

// A node that passes its one float input through unchanged at inference: Identity, Cast to
// float32 of a float32 value, Dropout without a training_mode input or mask output.
bool identity_link(const Graph& g, const Node& n) {
  if (!plain_node(n) || n.inputs.empty() || n.inputs[0].empty() || !static_float(g, n.inputs[0])) return false;
  if (n.op_type == "Identity") return true;
  if (n.op_type == "Cast") return n.attrs.get_int("to", 0) == int64_t(DType::Float32);
  if (n.op_type == "Dropout") return n.inputs.size() < 3 || n.inputs[2].empty();
  return false;
}

// The NaN guard after a Softmax whose output is `p`, if `p` has exactly the two uses of
// Where(IsNaN(p), 0, p): returns the Where node (`isnan` gets the IsNaN node), else kNoNode.
NodeId nan_guard_of(const Graph& g, const std::string& p, NodeId* isnan) {
  if (g.is_output(p)) return kNoNode;
  const auto& uses = g.consumers(p);
  if (uses.size() != 2) return kNoNode;
  NodeId nan = kNoNode, where = kNoNode;
  for (const Use& u : uses) {
    const Node& n = g.node(u.node);
    if (!n.domain.empty()) return kNoNode;
    if (n.op_type == "IsNaN") nan = u.node;
    else if (n.op_type == "Where" && u.slot == 2) where = u.node;
  }
  if (nan == kNoNode || where == kNoNode) return kNoNode;
  const Node& w = g.node(where);
  const Node& in = g.node(nan);
  if (in.outputs.size() != 1 || w.inputs.size() != 3 || w.inputs[0] != in.outputs[0] || only_use(g, in.outputs[0]) != where) return kNoNode;
  const Tensor* zero = g.constant_value(w.inputs[1]);
  if (!zero || zero->numel() != 1 || zero->dtype() != DType::Float32 || zero->as_double(0) != 0.0) return kNoNode;
  if (isnan) *isnan = nan;
  return where;
}

}  // namespace

std::string after_softmax(const Graph& g, NodeId softmax, bool* guarded, std::vector<NodeId>* links) {
  std::string p = g.node(softmax).outputs[0];
  bool guard = false;
  for (int k = 0; k < 8; ++k) {
    NodeId isnan = kNoNode;
    if (NodeId w = guard ? kNoNode : nan_guard_of(g, p, &isnan); w != kNoNode) {
      guard = true;
      if (links) links->insert(links->end(), {isnan, w});
      p = g.node(w).outputs[0];
      continue;
    }
    const NodeId u = only_use(g, p);
    if (u == kNoNode || !identity_link(g, g.node(u))) break;
    if (links) links->push_back(u);
    p = g.node(u).outputs[0];
  }
  if (guarded) *guarded = guard;
  return p;
}

std::vector<AttentionChain> find_attention_chains(const Graph& g) {
  std::vector<AttentionChain> out;
  for (NodeId sid : g.topo_order()) {
    const Node& sm = g.node(sid);
    if (sm.op_type != "Softmax" || !plain_node(sm) || sm.inputs.empty()) continue;
    const std::string& s_in = sm.inputs[0];
    if (!static_float(g, s_in) || !static_float(g, sm.outputs[0])) continue;
    const Shape S = g.type(s_in).static_shape();
    const int64_t r = int64_t(S.size());
    if (r < 2) continue;
    // The last axis only (before opset 13 the axis flattens: the same when it is the last one).
    int64_t axis = sm.attrs.get_int("axis", g.opset() < 13 ? 1 : -1);
    if (axis < 0) axis += r;
    if (axis != r - 1) continue;

    AttentionChain c;
    c.softmax = sid;
    // After the softmax: the optional NaN guard and identity links, then MatMul(p, V).
    std::vector<NodeId> after;
    const std::string p = after_softmax(g, sid, &c.nan_guard, &after);
    if (!static_float(g, p) || g.type(p).static_shape() != S) continue;
    NodeId pv = only_use(g, p);
    if (pv == kNoNode) continue;
    const Node& pvn = g.node(pv);
    if (pvn.op_type != "MatMul" || !plain_node(pvn) || pvn.inputs.size() != 2 || pvn.inputs[0] != p || pvn.inputs[1] == p) continue;
    if (!static_float(g, pvn.inputs[1]) || !static_float(g, pvn.outputs[0])) continue;
    const Shape Vs = g.type(pvn.inputs[1]).static_shape(), O = g.type(pvn.outputs[0]).static_shape();
    // V is [.., Sk, Dv]; the output keeps the scores' batch dims (probabilities never broadcast).
    if (Vs.size() < 2 || Vs[Vs.size() - 2] != S.back() || O.size() != S.size() || !std::equal(S.begin(), S.end() - 1, O.begin()))
      continue;
    c.pv = pv;

    // Before the softmax: the score transform back to MatMul(Q, Kt).
    std::vector<NodeId> chain;
    std::string v = s_in;
    bool ok = true;
    for (int depth = 0; ok && depth < 16; ++depth) {
      auto pid = g.producer(v);
      if (!pid) { ok = false; break; }
      const Node& n = g.node(*pid);
      if (!plain_node(n) || !static_float(g, v) || g.type(v).static_shape() != S) { ok = false; break; }
      if (n.op_type == "MatMul") {
        if (n.inputs.size() != 2 || !static_float(g, n.inputs[0]) || !static_float(g, n.inputs[1])) { ok = false; break; }
        const Shape Q = g.type(n.inputs[0]).static_shape(), K = g.type(n.inputs[1]).static_shape();
        if (Q.size() < 2 || K.size() < 2 || Q[Q.size() - 1] != K[K.size() - 2]) { ok = false; break; }
        c.qk = *pid;
        break;
      }
      if (!kScoreOps.count(n.op_type)) { ok = false; break; }
      // Exactly one operand continues the chain: the one of the scores' shape whose producer is
      // a link (or the MatMul). Every other operand broadcasts onto the scores.
      int next = -1;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const std::string& in = n.inputs[i];
        if (in.empty()) { ok = false; break; }
        auto ip = g.producer(in);
        const bool candidate = ip && static_float(g, in) && g.type(in).static_shape() == S && only_use(g, in) == *pid &&
                               (g.node(*ip).op_type == "MatMul" || kScoreOps.count(g.node(*ip).op_type)) && !(n.op_type == "Where" && i == 0);
        if (candidate && next < 0) next = int(i);
        else if (!g.type(in).is_static() || !broadcasts_onto(g.type(in).static_shape(), S)) ok = false;
        else if (g.type(in).dtype != DType::Float32 && !(n.op_type == "Where" && i == 0 && g.type(in).dtype == DType::Bool)) ok = false;
      }
      if (!ok || next < 0) { ok = false; break; }
      chain.push_back(*pid);
      v = n.inputs[size_t(next)];
    }
    if (!ok || c.qk == kNoNode) continue;
    if (only_use(g, g.node(c.qk).outputs[0]) == kNoNode) continue;
    c.members.push_back(c.qk);
    c.members.insert(c.members.end(), chain.rbegin(), chain.rend());
    c.members.push_back(sid);
    c.members.insert(c.members.end(), after.begin(), after.end());
    c.members.push_back(pv);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace nnfuse
