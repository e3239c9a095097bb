// combine-parallel-matmul / combine-parallel-conv: branches that read the same activation with
// their own constant weights (BERT's Q, K and V projections; Inception-style 1x1 Convs) become one
// wider op on concatenated weights, followed by a Split that gives each branch its old output:
//   MatMul(x, W1) [+ b1], MatMul(x, W2) [+ b2]  ->  Split(MatMul(x, [W1 W2]) [+ [b1 b2]])
//   Gemm(x, B1, C1), Gemm(x, B2, C2)            ->  Split(Gemm(x, [B1 B2], [C1 C2]))
//   Conv(x, W1, b1), Conv(x, W2, b2)            ->  Split(Conv(x, [W1; W2], [b1; b2]), axis 1)
// Every output element is computed by the same dot product as before, so the result is exactly
// equal. Condition: >= 2 branches with float32 constant weights of matching shapes and equal
// attributes; bias Adds are taken in only when every branch has one (constant, over the last axis
// only, its MatMul output read by nothing else). The Split is written for the model's opset
// (sizes as an input from opset 13, as an attribute before).
#include <cstring>
#include <map>

#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

const Tensor* float_const(const Graph& g, const std::string& v) {
  if (v.empty()) return nullptr;
  const Tensor* t = g.constant_value(v);
  return t && t->dtype() == DType::Float32 ? t : nullptr;
}

// Concatenates float tensors along `axis` (all other dims equal).
Tensor concat(const std::vector<const Tensor*>& parts, int64_t axis) {
  Shape s = parts[0]->shape();
  int64_t total = 0;
  for (auto* p : parts) total += p->dim(axis);
  s[size_t(axis)] = total;
  Tensor out = Tensor::uninitialized(DType::Float32, s);  // the parts below cover every element
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= s[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < s.size(); ++i) inner *= s[i];
  float* o = out.data<float>();
  int64_t off = 0;
  for (auto* p : parts) {
    const float* src = p->data<float>();
    int64_t w = p->dim(axis) * inner;
    for (int64_t r = 0; r < outer; ++r)
      std::copy(src + r * w, src + (r + 1) * w, o + r * total * inner + off);
    off += w;
  }
  return out;
}

// Adds Split(y) along `axis` with the given sizes, producing `outs` (existing names).
void add_split(Graph& g, const std::string& y, int64_t axis, const std::vector<int64_t>& sizes,
               const std::vector<std::string>& outs, const std::string& name) {
  Attributes a;
  a.set("axis", Attribute::make_int(axis));
  if (g.opset() >= 13) {
    std::string split = add_initializer(g, y + "_split", Tensor::from_vector<int64_t>({int64_t(sizes.size())}, sizes));
    g.add_node("Split", {y, split}, outs, a, name);
  } else {
    a.set("split", Attribute::make_ints(sizes));
    g.add_node("Split", {y}, outs, a, name);
  }
}

// ---------------------------------------------------------------- MatMul / Gemm
struct DenseBranch {
  NodeId mm = kNoNode;
  NodeId add = kNoNode;  // bias Add, when taken in
  const Tensor* w = nullptr;
  const Tensor* bias = nullptr;  // Gemm C or the Add's constant
  int64_t n = 0;                 // output features
};

// Bias of a MatMul branch: its output's single reader is Add(out, const) with the const over the last axis.
std::pair<NodeId, const Tensor*> bias_add(const Graph& g, const std::string& out, int64_t n) {
  if (!single_use(g, out)) return {kNoNode, nullptr};
  NodeId a = g.consumers(out)[0].node;
  const Node& add = g.node(a);
  if (add.op_type != "Add" || !add.domain.empty() || add.inputs.size() != 2) return {kNoNode, nullptr};
  const Tensor* b = float_const(g, add.inputs[add.inputs[0] == out ? 1 : 0]);
  if (!b || b->rank() < 1 || b->numel() != n || b->dim(-1) != n) return {kNoNode, nullptr};
  if (add.inputs[0] == add.inputs[1]) return {kNoNode, nullptr};
  // The Add must not broadcast to a higher rank than the MatMul output.
  if (b->rank() > g.type(out).rank()) return {kNoNode, nullptr};
  return {a, b};
}

// Exact float identity for grouping keys (printing would merge nearby values).
std::string float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return std::to_string(u);
}

int combine_dense(Graph& g, const std::string& x) {
  const TensorType& xt = g.type(x);
  if (xt.dtype != DType::Float32 || xt.rank() < 2) return 0;
  // Groups: MatMul, and Gemms keyed by their attributes (alpha, beta, transB) and bias presence.
  std::map<std::string, std::vector<DenseBranch>> groups;
  for (auto& u : g.consumers(x)) {
    if (u.slot != 0) continue;
    const Node& n = g.node(u.node);
    if (!n.domain.empty() || n.outputs.size() != 1) continue;
    if (n.inputs.size() > 1 && n.inputs[1] == x) continue;
    const Tensor* w = n.inputs.size() > 1 ? float_const(g, n.inputs[1]) : nullptr;
    if (!w || w->rank() != 2) continue;
    if (n.op_type == "MatMul") {
      groups["MatMul"].push_back({u.node, kNoNode, w, nullptr, w->dim(1)});
    } else if (n.op_type == "Gemm" && xt.rank() == 2 && n.attrs.get_int("transA", 0) == 0) {
      bool tb = n.attrs.get_int("transB", 0) != 0;
      DenseBranch b{u.node, kNoNode, w, nullptr, tb ? w->dim(0) : w->dim(1)};
      bool has_c = n.inputs.size() > 2 && !n.inputs[2].empty();
      if (has_c) {
        b.bias = float_const(g, n.inputs[2]);
        if (!b.bias || b.bias->rank() != 1 || b.bias->numel() != b.n) continue;  // per-feature 1-D bias only
      }
      std::string key = "Gemm|" + float_bits(n.attrs.get_float("alpha", 1.f)) + "|" +
                        float_bits(n.attrs.get_float("beta", 1.f)) + "|" + (tb ? "T" : "N") + (has_c ? "C" : "");
      groups[key].push_back(b);
    }
  }
  int combined = 0;
  for (auto& [key, branches] : groups) {
    if (branches.size() < 2) continue;
    bool gemm = key != "MatMul";
    bool transB = gemm && key.find("|T") != std::string::npos;
    int64_t k = transB ? branches[0].w->dim(1) : branches[0].w->dim(0);
    bool ok = true;
    for (auto& b : branches)
      if ((transB ? b.w->dim(1) : b.w->dim(0)) != k) ok = false;
    if (!ok) continue;
    // Bias Adds of MatMuls: all or none.
    bool with_bias = !gemm;
    if (!gemm)
      for (auto& b : branches) {
        auto [a, t] = bias_add(g, g.node(b.mm).outputs[0], b.n);
        b.add = a;
        b.bias = t;
        if (a == kNoNode) with_bias = false;
      }
    bool gemm_bias = gemm && branches[0].bias != nullptr;
    // Outputs each branch hands on, in order.
    std::vector<std::string> outs;
    std::vector<int64_t> sizes;
    std::vector<const Tensor*> ws, bs;
    for (auto& b : branches) {
      outs.push_back(with_bias ? g.node(b.add).outputs[0] : g.node(b.mm).outputs[0]);
      sizes.push_back(b.n);
      ws.push_back(b.w);
      if (with_bias || gemm_bias) bs.push_back(b.bias);
    }
    Tensor wc = concat(ws, transB ? 0 : 1);
    std::vector<Tensor> bias_parts;
    std::vector<const Tensor*> bias_ptrs;
    Tensor bc;
    if (!bs.empty()) {
      for (auto* b : bs) bias_parts.push_back(b->reshaped({b->numel()}));
      for (auto& b : bias_parts) bias_ptrs.push_back(&b);
      bc = concat(bias_ptrs, 0);
    }
    const Node first = g.node(branches[0].mm);
    TensorType yt = g.type(first.outputs[0]);
    int64_t total = 0;
    for (auto s : sizes) total += s;
    if (yt.has_shape) yt.dims.back() = Dim(total);
    int64_t axis = yt.has_shape ? yt.rank() - 1 : xt.rank() - 1;
    // Remove the branches (outputs kept as values: the Split produces them again).
    for (auto& b : branches) {
      if (with_bias) g.remove_node(b.add, /*drop_outputs=*/false);
      g.remove_node(b.mm, /*drop_outputs=*/false);
    }
    std::string wname = add_initializer(g, first.inputs[1] + "_combined", wc);
    std::string y = g.fresh_name(first.outputs[0] + "_combined");
    if (gemm) {
      std::vector<std::string> ins{x, wname};
      if (gemm_bias) ins.push_back(add_initializer(g, first.inputs[2] + "_combined", bc));
      g.add_node("Gemm", ins, {y}, first.attrs, first.name + "_combined");
    } else {
      g.add_node("MatMul", {x, wname}, {y}, {}, first.name + "_combined");
    }
    g.set_type(y, yt);
    if (with_bias) {
      std::string yb = g.fresh_name(y + "_bias");
      g.add_node("Add", {y, add_initializer(g, wname + "_bias", bc)}, {yb}, {}, first.name + "_combined_bias");
      g.set_type(yb, yt);
      y = yb;
    }
    add_split(g, y, axis, sizes, outs, first.name + "_split");
    ++combined;
  }
  return combined;
}

// ---------------------------------------------------------------- Conv
// Whether combining Convs `s` (equal attributes, reading x) saves memory traffic. Combined, the
// input is read once instead of s.size() times, but the Split then copies every output element
// once more (read and write). So combine only where the outputs are no larger than the input
// reads saved: an SSD's class and box heads on one feature map (few channels out of many), Inception's
// narrow 1x1 branches. ResNet-50's first block reads 64 channels into 64 + 256 (conv1 and the
// downsample): combined it ran 1.63 ms against 0.18 + 0.86 ms apart (the 4 MB Split copy;
// bench/RESULTS.md, session 23). With a spatial size unknown, channels alone are compared.
bool conv_combine_pays(const Graph& g, const std::string& x, const std::vector<NodeId>& s) {
  const TensorType& xt = g.type(x);
  const TensorType& yt = g.type(g.node(s[0]).outputs[0]);
  if (xt.rank() < 3 || yt.rank() != xt.rank() || !xt.dims[1].known()) return false;
  int64_t out_channels = 0;
  for (NodeId c : s) out_channels += g.constant_value(g.node(c).inputs[1])->dim(0);
  // Elements per channel of x and of each output; 1 and 1 where a spatial dim is unknown.
  double xs = 1, ys = 1;
  for (size_t i = 2; i < xt.dims.size(); ++i) {
    if (!xt.dims[i].known() || !yt.dims[i].known()) {
      xs = ys = 1;
      break;
    }
    xs *= double(xt.dims[i].value), ys *= double(yt.dims[i].value);
  }
  return double(out_channels) * ys <= double(xt.dims[1].value) * xs * double(s.size() - 1);
}

int combine_conv(Graph& g, const std::string& x) {
  std::vector<NodeId> convs;
  for (auto& u : g.consumers(x)) {
    if (u.slot != 0) continue;
    const Node& n = g.node(u.node);
    if (n.op_type != "Conv" || !n.domain.empty() || n.outputs.size() != 1 || n.inputs.size() < 2) continue;
    if (n.attrs.get_int("group", 1) != 1 || n.inputs[1] == x) continue;
    const Tensor* w = float_const(g, n.inputs[1]);
    if (!w || w->rank() < 3) continue;
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
      const Tensor* b = float_const(g, n.inputs[2]);
      if (!b || b->numel() != w->dim(0)) continue;
    }
    convs.push_back(u.node);
  }
  // Group by attributes and kernel geometry (weight shape except the output channels).
  std::map<std::string, std::vector<NodeId>> groups;
  for (NodeId c : convs) {
    const Node& n = g.node(c);
    const Tensor* w = g.constant_value(n.inputs[1]);
    std::string key;
    for (size_t i = 1; i < w->shape().size(); ++i) key += std::to_string(w->shape()[i]) + ",";
    groups[key].push_back(c);
  }
  int combined = 0;
  for (auto& [key, group] : groups) {
    // Split further by equal attributes (strides, pads, dilations, auto_pad, kernel_shape).
    std::vector<std::vector<NodeId>> same;
    for (NodeId c : group) {
      bool placed = false;
      for (auto& s : same)
        if (g.node(s[0]).attrs == g.node(c).attrs) {
          s.push_back(c);
          placed = true;
          break;
        }
      if (!placed) same.push_back({c});
    }
    for (auto& s : same) {
      if (s.size() < 2 || !conv_combine_pays(g, x, s)) continue;
      bool any_bias = false;
      std::vector<const Tensor*> ws;
      std::vector<Tensor> biases;
      std::vector<int64_t> sizes;
      std::vector<std::string> outs;
      for (NodeId c : s) {
        const Node& n = g.node(c);
        const Tensor* w = g.constant_value(n.inputs[1]);
        ws.push_back(w);
        sizes.push_back(w->dim(0));
        outs.push_back(n.outputs[0]);
        bool has_b = n.inputs.size() > 2 && !n.inputs[2].empty();
        any_bias |= has_b;
        biases.push_back(has_b ? g.constant_value(n.inputs[2])->reshaped({w->dim(0)}) : Tensor(DType::Float32, {w->dim(0)}));
      }
      Tensor wc = concat(ws, 0);
      std::vector<const Tensor*> bp;
      for (auto& b : biases) bp.push_back(&b);
      const Node first = g.node(s[0]);
      TensorType yt = g.type(first.outputs[0]);
      int64_t total = 0;
      for (auto v : sizes) total += v;
      if (yt.rank() >= 2) yt.dims[1] = Dim(total);
      for (NodeId c : s) g.remove_node(c, /*drop_outputs=*/false);
      std::vector<std::string> ins{x, add_initializer(g, first.inputs[1] + "_combined", wc)};
      if (any_bias) ins.push_back(add_initializer(g, first.inputs[1] + "_combined_bias", concat(bp, 0)));
      std::string y = g.fresh_name(first.outputs[0] + "_combined");
      g.add_node("Conv", ins, {y}, first.attrs, first.name + "_combined");
      g.set_type(y, yt);
      add_split(g, y, 1, sizes, outs, first.name + "_split");
      ++combined;
    }
  }
  return combined;
}

// Activations read by two or more nodes: the candidates.
std::vector<std::string> shared_values(const Graph& g) {
  std::vector<std::string> r;
  for (auto& v : g.value_names())
    if (g.consumers(v).size() >= 2 && !g.constant_value(v)) r.push_back(v);
  return r;
}

void drop_unused_initializers(Graph& g, const std::vector<std::string>& candidates, const std::set<std::string>& body_reads) {
  for (auto& w : candidates)
    if (g.is_initializer(w) && !g.is_input(w) && !g.is_output(w) && g.consumers(w).empty() && !body_reads.count(w))
      g.remove_initializer(w);
}

// Constant inputs of the nodes reading x: the weights a combine at x may replace.
std::vector<std::string> weights_read_after(const Graph& g, const std::string& x) {
  std::vector<std::string> r;
  for (auto& u : g.consumers(x)) {
    const Node& n = g.node(u.node);
    for (auto& i : n.inputs)
      if (!i.empty() && g.is_initializer(i)) r.push_back(i);
    // A MatMul branch's bias Add.
    for (auto& o : n.outputs)
      if (!o.empty())
        for (auto& v : g.consumers(o))
          for (auto& i : g.node(v.node).inputs)
            if (!i.empty() && g.is_initializer(i)) r.push_back(i);
  }
  return r;
}

template <class Combine>
void run_combine(PassContext& ctx, const char* name, Combine combine) {
  Graph& g = ctx.graph();
  const std::set<std::string> body_reads = names_read_by_subgraphs(g);  // this pass adds no subgraph
  int combined = 0;
  for (auto& x : shared_values(g)) {
    if (!g.has_value(x)) continue;
    std::vector<std::string> old = weights_read_after(g, x);
    if (int c = combine(g, x)) {
      combined += c;
      // The weights just concatenated go now, not at the end of the pass: the next group's
      // concatenation can then reuse their memory instead of faulting in fresh pages
      // (ssd_mobilenet's heads: 28.5 -> 20 ms CPU).
      drop_unused_initializers(g, old, body_reads);
    }
  }
  if (combined) {
    drop_unused_initializers(g, g.initializer_names(), body_reads);  // as before: any weight left unread
    g.prune_values();
    ctx.rules_fired[name] += combined;
  }
}

}  // namespace

void register_combine_parallel_passes() {
  register_pass({"combine-parallel-matmul",
                 "MatMuls/Gemms sharing their activation with constant weights -> one MatMul on concatenated weights + Split",
                 {"shapes"},
                 {"shapes"},
                 false},
                [](PassContext& ctx, const PassArgs&) { run_combine(ctx, "combine-parallel-matmul", combine_dense); });
  register_pass({"combine-parallel-conv",
                 "Convs sharing their input with equal kernel geometry -> one Conv on concatenated weights + Split",
                 {"shapes"},
                 {"shapes"},
                 false},
                [](PassContext& ctx, const PassArgs&) { run_combine(ctx, "combine-parallel-conv", combine_conv); });
}

}  // namespace nnfuse::passes
