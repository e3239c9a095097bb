// Pad and Resize/Upsample as index maps and expressions (see lower_data_movement.h).
//
// Both are separable: along each dim, output index o reads input index src[o] (Pad: any mode;
// Resize nearest: one tap) or a weighted pair of them (Resize linear), or takes a constant
// (Pad's value, Resize's extrapolation value). The per-dim tables come from the reference
// kernels' own functions (graph/resampling.h), so the generated code reads exactly the indices
// and weights the reference interpreter does. A dim whose table is a shifted identity (a crop)
// is an Offset step and stays affine; any other is a Gather step reading an int64 table of
// output-dim length, and a constant-filled position is a Where on a 0/1 mask table.
#include <algorithm>
#include <exception>
#include <map>

#include "graph/resampling.h"
#include "lowering/lower_data_movement.h"

namespace nnfuse::dm {

namespace {

// One input read through per-dim tables: for each dim d with a table, the output index along d
// is replaced by table[o] (tables[d] empty: the index passes unchanged).
struct TableRead {
  std::vector<std::vector<int64_t>> index;  // per dim: input index per output index, or empty
};

// Weight buffers made for tables, by content: a linear Resize reads each tap table in several
// tap combinations, and each is stored once.
struct TableBuffers {
  std::map<std::vector<int64_t>, int> index;
  std::map<std::vector<float>, int> weight;
  int of(ExprHost& h, const std::vector<int64_t>& t) {
    auto it = index.find(t);
    if (it != index.end()) return it->second;
    return index[t] = h.weight_buffer(Tensor::from_vector<int64_t>({int64_t(t.size())}, t));
  }
  int of(ExprHost& h, const std::vector<float>& t) {
    auto it = weight.find(t);
    if (it != weight.end()) return it->second;
    return weight[t] = h.weight_buffer(Tensor::from_vector<float>({int64_t(t.size())}, t));
  }
};

// The map from the driver through m (onto the op's output) to the input, dim by dim.
IndexMap read_map(ExprHost& h, TableBuffers& tb, IndexMap m, const Shape& out, const Shape& in, const TableRead& t) {
  Shape cur = out;
  for (size_t d = 0; d < out.size(); ++d) {
    const auto& tab = t.index[d];
    if (tab.empty()) continue;
    Shape next = cur;
    next[d] = in[d];
    // A shifted identity inside the input (a crop, or no change) is an Offset step: affine.
    bool shifted = !tab.empty();
    for (size_t o = 0; shifted && o < tab.size(); ++o) shifted = tab[o] == tab[0] + int64_t(o);
    if (shifted) {
      std::vector<int64_t> off(cur.size(), 0);
      off[d] = tab[0];
      m = h.then(m, offset_step(cur, next, std::move(off)));
    } else {
      IndexStep s;
      s.kind = IndexStep::Gather;
      s.from = cur;
      s.to = next;
      s.axis = int(d);
      s.q = 1;
      s.index_buffer = tb.of(h, tab);
      m = h.then(m, s);
    }
    cur = next;
  }
  return m;
}

// A per-output-index float table along dim d of `out`, loaded at m.
int dim_table(ExprHost& h, TableBuffers& tb, const IndexMap& m, const Shape& out, size_t d, const std::vector<float>& values) {
  int b = tb.of(h, values);
  Expr e;
  e.kind = Expr::Load;
  e.buffer = b;
  e.map = h.then(m, select_step(out, {out[d]}, {int(d)}));
  return h.push(std::move(e));
}

int binary(ExprHost& h, const char* op, int a, int b) {
  if (a < 0) return b;
  Expr e;
  e.kind = Expr::Binary;
  e.op = op;
  e.args = {a, b};
  return h.push(std::move(e));
}

// value where every masked dim's mask is 1, else fill. masks[d]: empty, or 1/0 per output index.
int with_fill(ExprHost& h, TableBuffers& tb, const IndexMap& m, const Shape& out, const std::vector<std::vector<float>>& masks, int value, double fill) {
  int mask = -1;
  for (size_t d = 0; d < masks.size(); ++d)
    if (!masks[d].empty()) mask = binary(h, "Mul", mask, dim_table(h, tb, m, out, d, masks[d]));
  if (mask < 0) return value;
  Expr c;
  c.kind = Expr::Const;
  c.value = fill;
  Expr w;
  w.kind = Expr::Where;
  w.args = {mask, value, h.push(std::move(c))};
  return h.push(std::move(w));
}

// A scalar constant input (Pad's value), or `dflt` when absent.
double scalar_input(ExprHost& h, const Node& n, size_t i, double dflt) {
  if (i >= n.inputs.size() || n.inputs[i].empty()) return dflt;
  const Tensor* t = h.constant(n.inputs[i]);
  if (!t) h.no_lowering(n, "non-constant input " + std::to_string(i));
  if (t->numel() == 0) return dflt;
  if (t->numel() != 1) h.no_lowering(n, "input " + std::to_string(i) + " is not a scalar");
  return t->as_double(0);
}

const Tensor* const_input(ExprHost& h, const Node& n, int i) {
  if (i < 0 || size_t(i) >= n.inputs.size() || n.inputs[size_t(i)].empty()) return nullptr;
  const Tensor* t = h.constant(n.inputs[size_t(i)]);
  if (!t) h.no_lowering(n, "non-constant input " + std::to_string(i));
  return t;
}

void check_float(ExprHost& h, const Node& n) {
  if (h.graph().type(n.inputs.at(0)).dtype != DType::Float32) h.no_lowering(n, "non-float data");
}

}  // namespace

int pad_expr(ExprHost& h, const Node& n, const IndexMap& m) {
  check_float(h, n);
  const std::string& x = n.inputs.at(0);
  Shape in = h.shape_of(x), out = h.shape_of(n.outputs[0]);
  const int64_t opset = h.graph().opset();
  tensor_ops::PadSources ps;
  try {
    ps = tensor_ops::pad_sources(n, opset, in, opset >= 11 ? const_input(h, n, 1) : nullptr, opset >= 18 ? const_input(h, n, 3) : nullptr);
  } catch (const std::exception& e) {
    h.no_lowering(n, e.what());  // the reference kernel reports it at run time
  }
  double fill = opset < 11 ? n.attrs.get_float("value", 0.0f) : scalar_input(h, n, 2, 0.0);
  TableRead t;
  t.index.resize(in.size());
  std::vector<std::vector<float>> masks(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    auto& src = ps.src[d];
    if (int64_t(src.size()) != out[d]) h.no_lowering(n, "output shape disagrees with the pads");
    bool identity = int64_t(src.size()) == in[d];
    for (size_t o = 0; identity && o < src.size(); ++o) identity = src[o] == int64_t(o);
    if (identity) continue;
    bool filled = std::find(src.begin(), src.end(), int64_t(-1)) != src.end();
    if (filled && in[d] == 0) h.no_lowering(n, "pads an empty dimension with a constant");
    t.index[d] = src;
    if (filled) {
      // Filled positions still load (the Where picks the value): from index 0, in bounds.
      masks[d].resize(src.size());
      for (size_t o = 0; o < src.size(); ++o) {
        masks[d][o] = src[o] < 0 ? 0.f : 1.f;
        t.index[d][o] = std::max<int64_t>(src[o], 0);
      }
    }
  }
  if (shape_numel(out) == 0) h.no_lowering(n, "empty output");
  TableBuffers tb;
  int value = h.expr_of(x, read_map(h, tb, m, out, in, t));
  return with_fill(h, tb, m, out, masks, value, fill);
}

int resize_expr(ExprHost& h, const Node& n, const IndexMap& m) {
  check_float(h, n);
  const std::string& x = n.inputs.at(0);
  Shape in = h.shape_of(x), out = h.shape_of(n.outputs[0]);
  const int64_t opset = h.graph().opset();
  tensor_ops::ResizeInputSlots slots = tensor_ops::resize_input_slots(n, opset);
  tensor_ops::ResizeTaps rt;
  try {
    rt = tensor_ops::resize_taps(n, opset, in, const_input(h, n, slots.roi), const_input(h, n, slots.scales), const_input(h, n, slots.sizes));
  } catch (const std::exception& e) {
    h.no_lowering(n, e.what());
  }
  if (rt.mode != "nearest" && rt.mode != "linear") h.no_lowering(n, "mode " + rt.mode);
  if (rt.out != out) h.no_lowering(n, "taps disagree with the output shape " + shape_str(out));
  if (shape_numel(out) == 0) h.no_lowering(n, "empty output");
  // Per dim: up to two taps (index and weight tables), a 0/1 mask where it extrapolates.
  const size_t r = in.size();
  std::vector<std::vector<std::vector<int64_t>>> idx(r);  // [d][tap][o]
  std::vector<std::vector<std::vector<float>>> wt(r);      // [d][tap][o]; empty: weight 1
  std::vector<std::vector<float>> masks(r);
  for (size_t d = 0; d < r; ++d) {
    const auto& ax = rt.axes[d];
    if (!ax.active) continue;
    size_t k = 1;
    for (auto& tp : ax.taps) k = std::max(k, tp.size());
    if (k > 2) h.no_lowering(n, "more than two taps per output along dim " + std::to_string(d));
    idx[d].assign(k, std::vector<int64_t>(size_t(out[d]), 0));
    wt[d].assign(k, std::vector<float>(size_t(out[d]), 0.f));
    bool unit_weights = true;
    for (size_t o = 0; o < size_t(out[d]); ++o) {
      auto tp = ax.taps[o];
      if (ax.extrapolate[o] || tp.empty()) {
        if (masks[d].empty()) masks[d].assign(size_t(out[d]), 1.f);
        masks[d][o] = 0.f;
        continue;  // reads index 0 with weight 0, replaced by the extrapolation value
      }
      // One tap where two are read: split it into two halves of the same index (exact in
      // float, and an infinite input stays infinite rather than 0 * inf).
      if (tp.size() < k) tp = {{tp[0].first, tp[0].second / 2}, {tp[0].first, tp[0].second / 2}};
      for (size_t j = 0; j < k; ++j) {
        if (tp[j].first < 0 || tp[j].first >= in[d]) h.no_lowering(n, "tap outside the input");
        idx[d][j][o] = tp[j].first;
        wt[d][j][o] = float(tp[j].second);
        unit_weights = unit_weights && tp[j].second == 1.0;
      }
    }
    if (unit_weights && k == 1) wt[d].clear();
  }
  // The sum over every combination of one tap per resized dim.
  std::vector<size_t> pick(r, 0);
  TableBuffers tb;
  int sum = -1;
  for (;;) {
    TableRead t;
    t.index.resize(r);
    int weight = -1;
    for (size_t d = 0; d < r; ++d) {
      if (idx[d].empty()) continue;
      t.index[d] = idx[d][pick[d]];
      if (!wt[d].empty()) weight = binary(h, "Mul", weight, dim_table(h, tb, m, out, d, wt[d][pick[d]]));
    }
    int term = h.expr_of(x, read_map(h, tb, m, out, in, t));
    sum = binary(h, "Add", sum, weight < 0 ? term : binary(h, "Mul", weight, term));
    size_t d = 0;
    for (; d < r; ++d) {
      if (idx[d].empty()) continue;
      if (++pick[d] < idx[d].size()) break;
      pick[d] = 0;
    }
    if (d == r) break;
  }
  return with_fill(h, tb, m, out, masks, sum, rt.extrapolation);
}

}  // namespace nnfuse::dm
