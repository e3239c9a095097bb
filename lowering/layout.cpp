// Layout assignment: NCHW or blocked NCHW<c>c per activation buffer, and the blocked stage view.
//
// Runs after every block has been lowered (so the whole producer/consumer picture is known) and
// before the memory plan (blocked buffers are larger: channels padded to a multiple of c).
//
// Which stages can run blocked ("candidates"): Conv anchors with constant weights and group 1,
// depthwise (group == C == K) or grouped by whole blocks (grouped_conv_blocks), pooling anchors, and elementwise stages, all over a 4-D driver,
// whose index maps are Select steps (broadcast / squeeze / transpose: a linear offset per driver
// dim) and unit-stride windows (Split, Slice: a constant offset; on channels, block-aligned).
// Such a stage runs in the physical view rows = n*Cb + cb, cols = (h*W + w)*c + lane, so a vector
// is c channels of one pixel and every access is n*bn + cb*bcb + h*bh + w*bw + lane*blane.
//
// Which buffers are blocked: 4-D float activations written by one candidate stage with the
// identity map and read only by candidate stages (as a conv/pool input, or through a map that
// keeps channels on channels). Fixpoint: a stage loses its blocked view when it would gain nothing
// (reads and writes no blocked buffer, and is not a dense or grouped conv) or when its kernel
// needs a blocked input it does not get (depthwise, pooling); a buffer loses its layout when its
// writer or a reader is not blocked.
// Chains of conv / pointwise / depthwise / pooling / elementwise thus stay blocked, and the
// layout changes sit at the chain ends, folded into a neighbour:
//   NCHW -> blocked: the first blocked conv reads the plain input (the kernel takes both), or a
//     blocked stage loads a plain buffer lane by lane (masked past C);
//   blocked -> NCHW: the last blocked stage stores into the plain buffer from its epilogue
//     (masked past C; the anchor kernel then writes its own value into a blocked scratch).
// No reorder ever runs as a stage of its own.
#include <algorithm>
#include <numeric>

#include "graph/error.h"
#include "lowering/kernel_ir.h"

namespace nnfuse {

std::string layout_name(int block) { return block > 0 ? "NCHW" + std::to_string(block) + "c" : "NCHW"; }

namespace {

// For a map of Select steps and unit-stride Offset steps (a window: Split, Slice): the domain dim
// read by each codomain dim (-1: constant) and the constant added to it (the window's start).
bool select_pick(const IndexMap& m, std::vector<int>& pick, std::vector<int64_t>& off) {
  pick.resize(m.domain.size());
  std::iota(pick.begin(), pick.end(), 0);
  off.assign(m.domain.size(), 0);
  for (auto& s : m.steps) {
    if (s.kind == IndexStep::Offset) {
      if (s.off.size() != pick.size() || (!s.stride.empty() && s.stride.size() != pick.size())) return false;
      for (size_t k = 0; k < pick.size(); ++k) {
        const int64_t stride = s.stride.empty() ? 1 : s.stride[k];  // empty: unit strides
        if (pick[k] >= 0 && stride != 1) return false;
        off[k] = off[k] * stride + s.off[k];
      }
      continue;
    }
    if (s.kind != IndexStep::Select) return false;
    std::vector<int> np(s.to.size(), -1);
    std::vector<int64_t> no(s.to.size(), 0);
    for (size_t k = 0; k < s.to.size(); ++k)
      if (s.src[k] >= 0) np[k] = pick[size_t(s.src[k])], no[k] = off[size_t(s.src[k])];
    pick = std::move(np);
    off = std::move(no);
  }
  return true;
}
bool select_pick(const IndexMap& m, std::vector<int>& pick) {
  std::vector<int64_t> off;
  return select_pick(m, pick, off);
}

// Whether a grouped (not depthwise) conv runs blocked: its output blocks fall into windows that
// read whole blocks of input channels. Either each group's Kg output channels are whole blocks
// (and its Cg input channels too), or a block holds L / Kg whole groups whose (L / Kg) * Cg input
// channels are whole blocks. The kernel (kernels/microkernels/conv_nchwc.h, conv_nchwc_windows)
// takes exactly these. In the second case only Kg / L of a block's FMAs do work: past 4x wasted
// (groups of fewer than L / 4 output channels), im2col per group in NCHW is kept.
bool grouped_conv_blocks(int64_t C, int64_t K, int64_t G, int64_t L) {
  if (G <= 1 || C % G != 0 || K % G != 0) return false;
  const int64_t Cg = C / G, Kg = K / G;
  if (Kg % L == 0) return Cg % L == 0;
  return L % Kg == 0 && (L / Kg * Cg) % L == 0 && L / Kg <= 4;
}

struct LayoutPass {
  KernelModule& mod;
  const int c;
  std::vector<std::vector<int>> readers;  // per buffer: stages reading it
  std::vector<int> writer;                // per buffer: the only stage writing it, -1 none, -2 several
  std::vector<char> cand, sblk, bblk;

  LayoutPass(KernelModule& m, int block) : mod(m), c(block) {}

  const KBuffer& B(int id) const { return mod.buffers[size_t(id)]; }
  static int64_t ip(const Stage& st, const char* k) {
    auto it = st.iparams.find(k);
    return it == st.iparams.end() ? -1 : it->second;
  }

  bool maps_linear(const Stage& st) const {
    std::vector<int> pick;
    for (auto& e : st.exprs)
      if (e.kind == Expr::Load && !select_pick(e.map, pick)) return false;
    for (auto& s : st.stores)
      if (!select_pick(s.map, pick)) return false;
    return true;
  }

  // Every buffer a blocked stage loads or stores is float (the blocked accessors are float-only).
  bool all_float(const Stage& st) const {
    for (auto& e : st.exprs)
      if (e.kind == Expr::Load && B(e.buffer).dtype != DType::Float32) return false;
    for (auto& s : st.stores)
      if (B(s.buffer).dtype != DType::Float32) return false;
    return true;
  }

  bool candidate(const Stage& st) const {
    if (st.kind == StageKind::Fallback || st.driver.size() != 4 || !maps_linear(st) || !all_float(st)) return false;
    if (!st.kernel_outputs.empty()) return false;  // kernel-only anchors (LSTM, NMS) have their own emitters
    for (auto& s : st.stores)
      if (s.windowed()) return false;  // blocked stores know no column windows (MatMul/Gemm only have them)
    if (st.kind == StageKind::Elementwise) return true;
    if (st.anchor_op == "Pool") return true;
    if (st.anchor_op != "Conv" || st.anchor_inputs.size() < 2 || B(st.anchor_inputs[1]).kind != BufferKind::Weight) return false;
    const int64_t G = ip(st, "G"), C = ip(st, "C"), K = ip(st, "CO");
    return G == 1 || conv_stage_depthwise(st) || grouped_conv_blocks(C, K, G, c);
  }

  // Can stage s read blocked buffer b through map m (channels must stay channels)?
  // A window on channels (a channel Split) must start on a block boundary: it is then whole blocks
  // of the buffer, read as they lie.
  bool blocked_load_ok(const Stage& st, const IndexMap& m, int b) const {
    std::vector<int> pick;
    std::vector<int64_t> off;
    if (!select_pick(m, pick, off) || B(b).shape.size() != 4) return false;
    const Shape& S = B(b).shape;
    for (size_t k : {size_t(0), size_t(2), size_t(3)})
      if (S[k] > 1 && pick[k] == 1) return false;
    if (S[1] == 1) return true;
    if (pick[1] < 0) return off[1] == 0;  // a constant channel index other than 0 is not a lane-0 read
    return pick[1] == 1 && off[1] % c == 0 && off[1] + st.driver[1] <= S[1];
  }

  bool reader_accepts(int s, int b) const {
    const Stage& st = mod.stages[size_t(s)];
    if (!sblk[size_t(s)]) return false;
    for (size_t i = 0; i < st.anchor_inputs.size(); ++i)
      if (st.anchor_inputs[i] == b && i != 0) return false;
    for (auto& e : st.exprs)
      if (e.kind == Expr::Load && e.buffer == b && !blocked_load_ok(st, e.map, b)) return false;
    return true;
  }

  bool eligible(int b) const {
    const KBuffer& K = B(b);
    if (K.kind != BufferKind::Activation || K.dynamic || K.row_count >= 0 || K.dtype != DType::Float32 || K.shape.size() != 4)
      return false;
    int w = writer[size_t(b)];
    if (w < 0 || !cand[size_t(w)]) return false;
    const Stage& st = mod.stages[size_t(w)];
    int n = 0;
    for (auto& s : st.stores)
      if (s.buffer == b) {
        if (!s.map.is_identity() || st.driver != K.shape) return false;
        ++n;
      }
    return n == 1;
  }

  // An elementwise stage that reads no blocked buffer and writes only buffers of fewer channels
  // than a block (an image's 3 channels normalised or quantized before the first conv): blocked,
  // its plain loads would be lane-by-lane gathers and most lanes of its stores padding (0.9 ms
  // for a 224x224 RGB image, as much as the conv after it), while the conv reads a plain input
  // as well as a blocked one.
  bool narrow_entry(const Stage& st) const {
    if (st.kind != StageKind::Elementwise) return false;
    for (int b : st.inputs)
      if (bblk[size_t(b)]) return false;
    for (int b : st.outputs)
      if (B(b).shape.size() != 4 || B(b).shape[1] >= c) return false;
    return true;
  }

  void solve() {
    const size_t nb = mod.buffers.size(), ns = mod.stages.size();
    readers.assign(nb, {});
    writer.assign(nb, -1);
    for (size_t s = 0; s < ns; ++s) {
      for (int b : mod.stages[s].inputs) readers[size_t(b)].push_back(int(s));
      for (int b : mod.stages[s].outputs) writer[size_t(b)] = writer[size_t(b)] == -1 ? int(s) : -2;
    }
    cand.assign(ns, 0);
    for (size_t s = 0; s < ns; ++s) cand[s] = candidate(mod.stages[s]);
    sblk = cand;
    bblk.assign(nb, 0);
    for (size_t b = 0; b < nb; ++b) bblk[b] = eligible(int(b));
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t b = 0; b < nb; ++b) {
        if (!bblk[b]) continue;
        bool ok = sblk[size_t(writer[b])];
        for (int r : readers[b]) ok = ok && reader_accepts(r, int(b));
        if (!ok) bblk[b] = 0, changed = true;
      }
      for (size_t s = 0; s < ns; ++s) {
        if (!sblk[s]) continue;
        const Stage& st = mod.stages[s];
        bool touches = false;
        for (int b : st.inputs) touches = touches || bblk[size_t(b)];
        for (int b : st.outputs) touches = touches || bblk[size_t(b)];
        const bool depthwise = conv_stage_depthwise(st);
        // A dense or grouped conv runs blocked even between plain buffers: the blocked kernel
        // reads a plain input and the epilogue stores plain, and it beat im2col + GEMM on every
        // shape measured, 1.2x (64 channels, 56x56) to 3x (16 channels, 8x7) (bench/RESULTS.md).
        const bool gains_alone = st.anchor_op == "Conv" && !depthwise;
        bool needs_blocked_in = st.anchor_op == "Pool" || depthwise;
        if ((!touches && !gains_alone) || (needs_blocked_in && !bblk[size_t(st.anchor_inputs[0])]) || narrow_entry(st))
          sblk[s] = 0, changed = true;
      }
    }
  }

  // The access of map m (driver -> buffer b) in the blocked view.
  Access blocked_access(const Stage& st, const IndexMap& m, int b) {
    std::vector<int> pick;
    std::vector<int64_t> off;
    select_pick(m, pick, off);
    const KBuffer& K = B(b);
    const Shape& S = K.shape;
    Access a;
    a.blocked = true;
    int64_t coef[4] = {0, 0, 0, 0};
    if (K.layout_block > 0) {
      const int64_t Cb = (S[1] + c - 1) / c;
      const int64_t strides[4] = {Cb * S[2] * S[3] * c, 0, S[3] * c, c};
      for (size_t k : {size_t(0), size_t(2), size_t(3)}) {
        if (S[k] > 1 && pick[k] >= 0) coef[pick[k]] += strides[k];
        a.base += off[k] * strides[k];
      }
      a.base += off[1] / c * S[2] * S[3] * c;  // a block-aligned channel window (blocked_load_ok)
      if (S[1] > 1 && pick[1] >= 0) a.bcb = S[2] * S[3] * c, a.blane = 1;
      if (S == st.driver && m.is_identity()) {
        // Physically the identity of the stage's view (the memory plan may share storage).
        a.affine = true;
        a.row_stride = st.width;
        a.col_stride = 1;
      }
    } else {
      std::vector<int64_t> strides = shape_strides(S);
      for (size_t k = 0; k < S.size(); ++k) {
        if (S[k] > 1 && pick[k] >= 0) coef[pick[k]] += strides[k];
        a.base += off[k] * strides[k];
      }
      // Lanes past the stage's channel count are padding: a plain buffer's lanes are masked.
      // With one channel (a Conv to 1 output channel, perhaps squeezed away) no buffer dim
      // follows the lanes: unmasked, all c lanes went to one address and the last, a padding
      // lane, won. A channel broadcast ([N, 1, H, W] under C > 1 channels) needs no mask: what
      // padding lanes compute is never read as a channel.
      a.masked = coef[1] != 0 || st.driver[1] == 1;
      if (a.masked && K.kind != BufferKind::Weight) ++mod.reorder_stores;  // a layout change, not a bias
    }
    a.bn = coef[0];
    a.bcb += coef[1] * c;
    a.blane += coef[1];
    a.bh = coef[2];
    a.bw = coef[3];
    return a;
  }

  int add_buffer(Shape shape, BufferKind kind) {
    KBuffer nb;
    nb.id = int(mod.buffers.size());
    nb.shape = std::move(shape);
    nb.kind = kind;
    mod.buffers.push_back(nb);
    return nb.id;
  }

  void rewrite(int s) {
    Stage& st = mod.stages[size_t(s)];
    const Shape D = st.driver;
    st.layout_block = c;
    st.rows = D[0] * ((D[1] + c - 1) / c);
    st.width = D[2] * D[3] * c;
    st.vectorizable = true;
    for (auto& e : st.exprs)
      if (e.kind == Expr::Load) e.access = blocked_access(st, e.map, e.buffer);
    for (auto& x : st.stores) x.access = blocked_access(st, x.map, x.buffer);
    if (st.kind != StageKind::Anchor) return;
    // The kernel writes the blocked view: into the primary store's buffer when that is blocked,
    // else into blocked scratch (plain-layout stores then happen in the epilogue).
    bool primary_blocked = st.primary_store >= 0 && bblk[size_t(st.stores[size_t(st.primary_store)].buffer)];
    if (!primary_blocked) {
      bool is_store = false;
      for (auto& x : st.stores) is_store = is_store || x.buffer == st.anchor_output;
      st.primary_store = -1;
      if (is_store || st.anchor_output < 0) {
        st.anchor_output = add_buffer(D, BufferKind::Activation);
        st.outputs.push_back(st.anchor_output);
      }
      mod.buffers[size_t(st.anchor_output)].layout_block = c;
    }
    st.iparams["BLK"] = c;
    if (st.anchor_op == "Conv") {
      st.iparams["XBLK"] = B(st.anchor_inputs[0]).layout_block > 0 ? 1 : 0;
      if (st.iparams["XBLK"] == 0) ++mod.reorder_stores;
      // Weights reordered to [Kb, Cg, KH, KW, c] once, at load time.
      st.prepared = add_buffer({}, BufferKind::Weight);
      mod.buffers[size_t(st.prepared)].prepared_by = s;
    }
  }

  // A 1-D conv is lowered over [N, C, 1, L] (lower.cpp, as_2d) but its stage walks the 3-D
  // output [N, K, L]. Given the 4-D driver [N, K, 1, L] (every map first drops the unit dim), it
  // runs blocked like a 2-D conv, as dense convs do between plain buffers: a spectrogram front
  // end's strided long-kernel conv ran 3.8x faster blocked than as im2col + GEMM, Whisper's stem
  // 1.0-1.1x (bench/RESULTS.md). Kept 3-D when it is not a candidate after all.
  void lift_1d_convs() {
    for (auto& st : mod.stages) {
      if (st.kind != StageKind::Anchor || st.anchor_op != "Conv" || st.driver.size() != 3 || ip(st, "H") != 1) continue;
      const Stage before = st;
      const Shape D3 = st.driver, D4 = {D3[0], D3[1], 1, D3[2]};
      IndexStep drop;
      drop.kind = IndexStep::Select;
      drop.from = D4;
      drop.to = D3;
      drop.src = {0, 1, 3};
      auto lift = [&](IndexMap& m) {
        m.domain = D4;
        m.steps.insert(m.steps.begin(), drop);
      };
      for (auto& e : st.exprs)
        if (e.kind == Expr::Load) lift(e.map);
      for (auto& x : st.stores) lift(x.map);
      st.driver = D4;
      if (!candidate(st)) st = before;
    }
  }

  void run() {
    lift_1d_convs();
    solve();
    for (size_t b = 0; b < bblk.size(); ++b)
      if (bblk[b]) mod.buffers[b].layout_block = c;
    for (size_t s = 0; s < sblk.size(); ++s)
      if (sblk[s]) rewrite(int(s));
    for (auto& K : mod.buffers)
      if (K.layout_block > 0) {
        const Shape& S = K.shape;
        K.bytes = S[0] * ((S[1] + c - 1) / c) * c * S[2] * S[3] * int64_t(dtype_size(K.dtype));
      }
  }
};

}  // namespace

void assign_layouts(KernelModule& mod, int block) {
  if (block <= 0) return;
  mod.layout_block = block;
  LayoutPass(mod, block).run();
}

nlohmann::json layout_summary(const KernelModule& m) {
  nlohmann::json j;
  j["block"] = m.layout_block;
  int stages = 0, bufs = 0;
  std::map<int, std::string> per_block;
  for (auto& s : m.stages) {
    stages += s.layout_block > 0;
    std::string& l = per_block[s.block];
    if (l.empty() || s.layout_block > 0) l = layout_name(s.layout_block);
  }
  for (auto& b : m.buffers) bufs += b.layout_block > 0 && !b.value.empty();
  j["blocked_stages"] = stages;
  j["blocked_buffers"] = bufs;
  j["reorders_folded"] = m.reorder_stores;
  nlohmann::json blocks = nlohmann::json::object();
  for (auto& [id, l] : per_block) blocks["b" + std::to_string(id)] = l;
  j["blocks"] = blocks;
  return j;
}

}  // namespace nnfuse
