// C++ emitter: kernel IR stages -> C++ source using xsimd and the microkernel templates.
#include "kernels/emit_cpp.h"

#include <cctype>
#include <cmath>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "graph/error.h"
#include "kernels/emit_kernel_ops.h"
#include "lowering/lower_kernel_ops.h"

namespace nnfuse {

std::string stage_symbol(const Stage& s) { return "nf_" + s.name; }

int64_t stage_iparam(const Stage& s, const std::string& key) {
  auto it = s.iparams.find(key);
  if (it == s.iparams.end()) fail(ErrorKind::Invalid, "emitter: stage " + s.name + " lacks parameter " + key);
  return it->second;
}

std::string emit_prepare_release(const Stage& s, const std::string& type, const std::string& pack_args) {
  const std::string sym = stage_symbol(s);
  return "extern \"C\" void* " + sym + "_prepare(void* const* B) {\n  auto* p = new " + type + "();\n  p->pack(" + pack_args +
         ");\n  return p;\n}\nextern \"C\" void " + sym + "_release(void* p) { delete static_cast<" + type + "*>(p); }\n";
}

namespace {

std::string flt(double v) {
  if (std::isinf(v)) return v > 0 ? "std::numeric_limits<float>::infinity()" : "(-std::numeric_limits<float>::infinity())";
  if (std::isnan(v)) return "std::numeric_limits<float>::quiet_NaN()";
  std::ostringstream o;
  o << std::setprecision(9) << float(v);
  std::string s = o.str();
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return "float(" + s + ")";
}

std::string i64(int64_t v) { return "int64_t(" + std::to_string(v) + ")"; }

struct StageEmitter {
  const KernelModule& m;
  const Stage& st;
  std::ostringstream pre;   // helper functions before the entry point
  std::ostringstream body;  // the entry point

  StageEmitter(const KernelModule& mod, const Stage& s) : m(mod), st(s) {}

  // width: the row length of the map's view (a windowed store's window, else the stage's).
  std::string off_fn(const IndexMap& map, int tag, int64_t width = -1) {
    std::string fn = "off_" + st.name + "_" + std::to_string(tag);
    // ctx and B: a Gather step reads its index buffer and reports an index out of range.
    pre << "static inline int64_t " << fn << "(const nnfuse_exec_ctx* ctx, void* const* B, int64_t r, int64_t c) {\n";
    pre << "  (void)ctx; (void)B;\n";
    pre << "  int64_t e = r * " << i64(width < 0 ? st.width : width) << " + c;\n";
    const Shape& d = map.domain;
    std::string cur = "a0";
    pre << "  int64_t a0[" << std::max<size_t>(d.size(), 1) << "] = {0};\n";
    for (size_t k = d.size(); k-- > 0;) {
      pre << "  a0[" << k << "] = e % " << i64(d[k]) << "; e /= " << i64(d[k]) << ";\n";
    }
    Shape from = d;
    int n = 0;
    for (auto& s : map.steps) {
      std::string nxt = "a" + std::to_string(++n);
      pre << "  int64_t " << nxt << "[" << std::max<size_t>(s.to.size(), 1) << "] = {0};\n";
      if (s.kind == IndexStep::Offset) {
        for (size_t k = 0; k < s.to.size(); ++k)
          pre << "  " << nxt << "[" << k << "] = " << cur << "[" << k << "]" << (s.stride.empty() ? "" : " * " + i64(s.stride[k])) << " + "
              << i64(s.off[k]) << ";\n";
      } else if (s.kind == IndexStep::Gather) {
        emit_gather_step(pre, s, cur, nxt);
      } else if (s.kind == IndexStep::Select) {
        for (size_t k = 0; k < s.to.size(); ++k)
          if (s.src[k] >= 0) pre << "  " << nxt << "[" << k << "] = " << cur << "[" << s.src[k] << "];\n";
      } else {
        pre << "  { int64_t l = 0;\n";
        for (size_t k = 0; k < s.from.size(); ++k) pre << "    l = l * " << i64(s.from[k]) << " + " << cur << "[" << k << "];\n";
        for (size_t k = s.to.size(); k-- > 0;) pre << "    " << nxt << "[" << k << "] = l % " << i64(s.to[k]) << "; l /= " << i64(s.to[k]) << ";\n";
        pre << "  }\n";
      }
      cur = nxt;
      from = s.to;
    }
    pre << "  int64_t o = 0;\n";
    for (size_t k = 0; k < from.size(); ++k) pre << "  o = o * " << i64(from[k]) << " + " << cur << "[" << k << "];\n";
    pre << "  return o;\n}\n";
    return fn;
  }

  std::string offset_expr(const IndexMap& map, const Access& a, int tag, const std::string& c = "c", int64_t width = -1) {
    if (a.affine) return (a.base ? i64(a.base) + " + " : std::string()) + "r * " + i64(a.row_stride) + " + " + c + " * " + i64(a.col_stride);
    return off_fn(map, tag, width) + "(ctx, B, r, " + c + ")";
  }
  // A windowed store (Store::window_lo/hi) sees the column c - window_lo of its window.
  static std::string store_col(const Store& s) { return s.windowed() ? "(c - " + i64(s.window_lo) + ")" : "c"; }
  static bool window_aligned(const Store& s) {
    return !s.windowed() || (s.window_lo % kStoreWindowAlign == 0 && s.window_hi % kStoreWindowAlign == 0);
  }

  std::string buf(int b) { return "b" + std::to_string(b); }

  // The element type of a buffer a generated stage touches. Expressions compute in float:
  // integer/bool buffers are converted on load and store (lowering admits them only where that
  // is exact or is the Cast itself: lower_data_movement.cpp).
  std::string c_type(DType dt) const {
    switch (dt) {
      case DType::Float32: return "float";
      case DType::Int64: return "int64_t";
      case DType::Int32: return "int32_t";
      case DType::Int16: return "int16_t";
      case DType::Int8: return "int8_t";
      case DType::UInt64: return "uint64_t";
      case DType::UInt32: return "uint32_t";
      case DType::UInt16: return "uint16_t";
      case DType::UInt8:
      case DType::Bool: return "uint8_t";
      default: fail(ErrorKind::Unsupported, "emitter: stage " + st.name + " touches a " + dtype_name(dt) + " buffer");
    }
  }

  // The data of a Gather step's index buffer when it is a constant (a Weight: Pad/Resize tables,
  // a Gather with constant indices), else null.
  const Tensor* constant_index(int b) const {
    const KBuffer& kb = m.buffers[size_t(b)];
    if (kb.kind != BufferKind::Weight || kb.dynamic || kb.data.numel() != shape_numel(kb.shape)) return nullptr;
    if (kb.data.dtype() != DType::Int64 && kb.data.dtype() != DType::Int32) return nullptr;
    return &kb.data;
  }

  // Checked: the index is data (or out of range): wrap_index checks it per element.
  enum class TableRange { NonNegative, Wrapping, Checked };
  TableRange constant_table_range(const IndexStep& s) const {
    const Tensor* t = constant_index(s.index_buffer);
    if (!t) return TableRange::Checked;
    const int64_t n = s.to[size_t(s.axis)];
    bool negative = false;
    for (int64_t i : t->to_int_vector()) {
      if (i < -n || i >= n) return TableRange::Checked;  // reported at run time, as for data
      negative = negative || i < 0;
    }
    return negative ? TableRange::Wrapping : TableRange::NonNegative;
  }

  // to[axis] = the index read at the linearized from[axis .. axis + q) (negative: from the end).
  void emit_gather_step(std::ostringstream& o, const IndexStep& s, const std::string& cur, const std::string& nxt) {
    const size_t axis = size_t(s.axis), q = size_t(s.q);
    o << "  { int64_t l = 0;\n";
    for (size_t k = axis; k < axis + q; ++k) o << "    l = l * " << i64(s.from[k]) << " + " << cur << "[" << k << "];\n";
    const KBuffer& ib = m.buffers[size_t(s.index_buffer)];
    const std::string read = "int64_t(static_cast<const " + c_type(ib.dtype) + "*>(B[" + std::to_string(s.index_buffer) + "])[l])";
    switch (constant_table_range(s)) {
      // A constant table checked here, once: no per-element range check.
      case TableRange::NonNegative: o << "    " << nxt << "[" << axis << "] = " << read << ";\n  }\n"; break;
      case TableRange::Wrapping:
        o << "    const int64_t i = " << read << ";\n    " << nxt << "[" << axis << "] = i < 0 ? i + " << i64(s.to[axis]) << " : i;\n  }\n";
        break;
      case TableRange::Checked:
        o << "    " << nxt << "[" << axis << "] = nf::wrap_index(ctx, " << read << ", " << i64(s.to[axis]) << ");\n  }\n";
        break;
    }
    for (size_t k = 0; k < axis; ++k) o << "  " << nxt << "[" << k << "] = " << cur << "[" << k << "];\n";
    for (size_t k = axis + 1; k < s.to.size(); ++k) o << "  " << nxt << "[" << k << "] = " << cur << "[" << k + q - 1 << "];\n";
  }

  void declare_buffers() {
    std::set<int> used;
    for (auto& e : st.exprs)
      if (e.kind == Expr::Load) used.insert(e.buffer);
    for (auto& s : st.stores) used.insert(s.buffer);
    for (int b : st.anchor_inputs)
      if (b >= 0) used.insert(b);
    if (st.anchor_output >= 0) used.insert(st.anchor_output);
    for (int b : used) {
      const std::string t = c_type(m.buffers[size_t(b)].dtype);
      body << "  " << t << "* " << buf(b) << " = static_cast<" << t << "*>(B[" << b << "]);\n";
    }
    body << "  (void)B;\n";
  }

  // Emits the expression pool and the stores as statements of a generic body (V, r, c in scope).
  // The first expression this emitter emits: an attention stage's epilogue skips the score
  // transform's part of the pool (kernel_ir.h), which a sub-emitter prints (attention()).
  size_t expr_begin = 0;

  void emit_exprs(std::ostringstream& o, bool epilogue) {
    for (size_t i = expr_begin; i < st.exprs.size(); ++i) {
      const Expr& e = st.exprs[i];
      std::string n = "e" + std::to_string(i);
      o << "    const V " << n << " = ";
      auto a = [&](size_t k) { return "e" + std::to_string(e.args[k]); };
      switch (e.kind) {
        case Expr::Load: {
          if (st.layout_block > 0) {
            o << blocked_access(e.access, "nnfuse::mk::nchwc_load", buf(e.buffer)) << ")";
            break;
          }
          auto sp = split_loads.find(int(i));
          if (sp != split_loads.end()) {
            o << sp->second;
            break;
          }
          int K = e.access.affine && e.access.col_stride == 0 ? 0 : 1;
          if (e.part >= 0)
            o << "nf::ld_part<V, " << K << ", " << e.part << ">(" << buf(e.buffer) << " + " << offset_expr(e.map, e.access, int(i)) << ")";
          else
            o << "nf::ld<V, " << K << ">(" << buf(e.buffer) << " + " << offset_expr(e.map, e.access, int(i)) << ")";
          break;
        }
        case Expr::Const: o << "nf::cst<V>(" << flt(e.value) << ")"; break;
        case Expr::AnchorValue: o << (epilogue ? "v" : "V(0.f)"); break;
        case Expr::Clip: o << "nf::op_Clip<V>(" << a(0) << ", " << flt(e.lo) << ", " << flt(e.hi) << ")"; break;
        case Expr::Unary:
          if (e.op == "LeakyRelu" || e.op == "Elu" || e.op == "HardSigmoid")
            o << "nf::op_" << e.op << "<V>(" << a(0) << ", " << flt(e.lo) << ", " << flt(e.hi) << ")";
          else
            o << "nf::op_" << e.op << "<V>(" << a(0) << ")";
          break;
        case Expr::Binary: o << "nf::op_" << e.op << "<V>(" << a(0) << ", " << a(1) << ")"; break;
        case Expr::Where: o << "nf::op_Where<V>(" << a(0) << ", " << a(1) << ", " << a(2) << ")"; break;
      }
      o << ";\n    (void)" << n << ";\n";
    }
  }

  void emit_stores(std::ostringstream& o, int skip) {
    for (size_t i = 0; i < st.stores.size(); ++i) {
      if (int(i) == skip) continue;
      const Store& s = st.stores[i];
      if (st.layout_block > 0) {
        o << "    " << blocked_access(s.access, "nnfuse::mk::nchwc_store", buf(s.buffer)) << ", e" << s.expr << ");\n";
        continue;
      }
      auto sp = split_stores.find(int(i));
      const std::string off =
          sp != split_stores.end() ? sp->second : offset_expr(s.map, s.access, 1000 + int(i), store_col(s), s.width_in(st.width));
      // A window's vectors lie wholly inside or outside it (window_aligned, else lane by lane).
      if (s.windowed()) o << "    if (c >= " << i64(s.window_lo) << " && c < " << i64(s.window_hi) << ")";
      o << "    nf::st<V>(" << buf(s.buffer) << " + " << off << ", e" << s.expr << ");\n";
    }
  }

  // Stores through separable maps in an anchor epilogue: the offset of (r, c) is the map's offset
  // at (r, 0) plus c.
  std::map<int, std::string> split_stores;

  // An anchor epilogue is called per vector of one row (r, c .. c + L - 1). Loads and stores whose
  // maps are not affine in (r, c) but separable, with a unit (or, for loads, zero) column stride,
  // then cost one offset computation per vector: the map at (r, 0), plus c. Without this every
  // lane ran the whole map (divisions and all) as a scalar: attention's probs x V MatMul, whose
  // epilogue stores [heads, seq, d] as [seq, heads * d], ran at a third of its GEMM's speed.
  // Returns whether the epilogue can then run on vectors.
  bool plan_anchor_row_split() {
    auto unit_cols = [&](const IndexMap& map, bool load, int64_t& stride, int64_t width) {
      ColumnSplit cs = split_columns(map, width, [&](int b) { return constant_index(b); });
      stride = cs.col_stride;
      if (cs.separable && !cs.col_dynamic && cs.col_affine && (cs.col_stride == 1 || (load && cs.col_stride == 0))) return true;
      for (int64_t s : {int64_t(1), int64_t(0)}) {
        if (s == 0 && !load) break;
        if (columns_affine(map, width, s)) return stride = s, true;
      }
      return false;
    };
    // Decide first, emit after: off_fn writes the offset function into the source.
    std::vector<std::pair<int, int64_t>> loads;
    std::vector<int> stores;
    for (size_t i = expr_begin; i < st.exprs.size(); ++i) {
      const Expr& e = st.exprs[i];
      if (e.kind != Expr::Load || vectorizable_load(e.access)) continue;
      int64_t stride = 0;
      // Integer and bool buffers convert on load (nf::ld); a wide integer's parts stay lane by lane.
      // (A causal mask of bools read per lane through its map made GPT-2's attention scores
      // scalar: 0.45 ms a layer where ONNX Runtime takes 0.37.)
      if (e.part >= 0 || !unit_cols(e.map, true, stride, st.width)) return false;
      loads.push_back({int(i), stride});
    }
    // Stores whose columns are contiguous only in aligned runs of 16 (so of any vector width): a
    // table of the runs' offsets. A quantized BERT's Q and V projections store [seq, heads * 64]
    // as [heads, seq, 64]; lane by lane, their epilogues took two thirds of the block's time.
    std::map<int, std::vector<int64_t>> chunked;
    for (size_t i = 0; i < st.stores.size(); ++i) {
      const Store& s = st.stores[i];
      if (!window_aligned(s)) return false;
      if (int(i) == st.primary_store || (s.access.affine && s.access.col_stride == 1)) continue;
      int64_t stride = 0;
      const int64_t w = s.width_in(st.width);
      if (unit_cols(s.map, false, stride, w)) {
        stores.push_back(int(i));
      } else if (std::vector<int64_t> tab; columns_chunked(s.map, w, kStoreChunk, tab)) {
        chunked[int(i)] = std::move(tab);
      } else {
        return false;
      }
    }
    // The row part: a multiply where it is affine in r (heads apart: r * d), else the map's
    // offset function, divisions and all, once per vector of the epilogue (5% of ViT-B/16's
    // Q/K/V block).
    auto row_off = [&](const IndexMap& map, int tag, int64_t width) {
      if (int64_t base = 0, rs = 0; rows_affine(map, width, base, rs)) return "(" + i64(base) + " + r * " + i64(rs) + ")";
      return off_fn(map, tag, width) + "(ctx, B, r, 0)";
    };
    for (auto [i, stride] : loads) {
      const Expr& e = st.exprs[size_t(i)];
      split_loads[i] = "nf::ld<V, " + std::to_string(stride) + ">(" + buf(e.buffer) + " + " + row_off(e.map, i, st.width) +
                       (stride ? " + c" : "") + ")";
    }
    for (int i : stores) {
      const Store& s = st.stores[size_t(i)];
      split_stores[i] = row_off(s.map, 1000 + i, s.width_in(st.width)) + " + " + store_col(s);
    }
    for (auto& [i, tab] : chunked) {
      const Store& s = st.stores[size_t(i)];
      const std::string name = "runs_" + st.name + "_" + std::to_string(i), c = store_col(s);
      pre << "static const int64_t " << name << "[] = {";
      for (size_t k = 0; k < tab.size(); ++k) pre << (k ? "," : "") << tab[k];
      pre << "};\n";
      split_stores[i] = row_off(s.map, 1000 + i, s.width_in(st.width)) + " + " + name + "[" + c + " / " + std::to_string(kStoreChunk) +
                        "] + " + c + " % " + std::to_string(kStoreChunk);
    }
    return true;
  }
  static constexpr int64_t kStoreChunk = 16;

  // Blocked view (Stage::layout_block, lowering/layout.cpp): row r = n*Cb + cb, col c = pixel*BLK +
  // lane. The pixel decomposition is per call (per vector), not per element.
  void blocked_prelude(std::ostringstream& o) {
    if (st.layout_block <= 0) return;
    const int64_t blk = st.layout_block, C = st.driver[1], Cb = (C + blk - 1) / blk, OW = st.driver[3];
    o << "    const int64_t n_ = r / " << i64(Cb) << ", cb_ = r % " << i64(Cb) << ", s_ = c / " << i64(blk) << ", oh_ = s_ / "
      << i64(OW) << ", ow_ = s_ % " << i64(OW) << ", lane_ = c % " << i64(blk) << ";\n";
    // Valid lanes of block cb_ (only the last block of a channel count that is not a multiple of
    // the block has fewer). Spelled as the constant where every block is whole, so that a masked
    // load (a plain per-channel bias) folds to one vector load: with the min, the compiler kept a
    // lane-by-lane path for every result of a conv tile and spilled its accumulators around it.
    if (C % blk == 0) o << "    const int64_t nv_ = " << i64(blk) << ";\n";
    else o << "    const int64_t nv_ = std::min<int64_t>(" << i64(blk) << ", " << i64(C) << " - cb_ * " << i64(blk) << ");\n";
    o << "    (void)n_; (void)cb_; (void)oh_; (void)ow_; (void)lane_; (void)nv_;\n";
  }
  // "fn<V, lane stride>(buffer + offset of lane 0, lane, valid lanes" (the caller closes the call).
  // A buffer whose rows are as wide as the stage's (bh == OW * bw: every same-size operand, and
  // broadcasts) is addressed by the pixel index s_ alone: oh_ * bh + ow_ * bw == s_ * bw, which
  // spares a division and a modulo per vector (a blocked copy stage ran at a few GB/s with them).
  std::string blocked_access(const Access& a, const char* fn, const std::string& b) {
    std::ostringstream o;
    const int64_t OW = st.driver[3];
    o << fn << "<V, " << a.blane << ">(" << b << (a.base ? " + " + i64(a.base) : std::string()) << " + n_ * " << i64(a.bn)
      << " + cb_ * " << i64(a.bcb);
    if (a.bh == OW * a.bw) o << " + s_ * " << i64(a.bw);
    else o << " + oh_ * " << i64(a.bh) << " + ow_ * " << i64(a.bw);
    o << ", lane_, " << (a.masked ? std::string("nv_") : i64(st.layout_block));
    return o.str();
  }

  // Loads through separable maps (split_columns): expression index -> the load's code.
  std::map<int, std::string> split_loads;

  // Plans the loads whose maps are not affine but separable: offset(r, c) = rb[k] + column part,
  // rb[k] (the map's offset at (r, 0)) computed once per row by row_init. The column part is
  // c * stride (stride 0 or 1: a plain load), or a table: constant (emitted) or computed once
  // per call (an index buffer read at run time). Writes the row_init lambda and per-call tables
  // into the body; returns whether every load and store can then run on vectors.
  bool plan_split_loads(std::ostringstream& o) {
    constexpr int64_t kMaxStaticTable = 4096;  // entries emitted into the source
    std::ostringstream init;
    int rows_k = 0;
    bool vec = true;
    for (size_t i = 0; i < st.exprs.size(); ++i) {
      const Expr& e = st.exprs[i];
      if (e.kind != Expr::Load) continue;
      if (e.access.affine) {
        vec = vec && (e.access.col_stride == 0 || e.access.col_stride == 1);
        continue;
      }
      if (e.part >= 0) {  // a wide integer's part: through its offset function and ld_part, on scalars
        vec = false;
        continue;
      }
      ColumnSplit cs = split_columns(e.map, st.width, [&](int b) { return constant_index(b); });
      if (!cs.separable) {
        vec = false;
        continue;
      }
      const std::string fn = off_fn(e.map, int(i));
      const std::string rb = "rb[" + std::to_string(rows_k++) + "]";
      init << "    rb[" << rows_k - 1 << "] = " << fn << "(ctx, B, r, 0);\n";
      const std::string p = buf(e.buffer) + " + " + rb;
      if (cs.col_affine && (cs.col_stride == 0 || cs.col_stride == 1)) {
        split_loads[int(i)] = "nf::ld<V, " + std::to_string(cs.col_stride) + ">(" + p + (cs.col_stride ? " + c" : "") + ")";
        continue;
      }
      const std::string tab = "ct_" + st.name + "_" + std::to_string(i);
      if (!cs.col_dynamic && st.width <= kMaxStaticTable) {
        bool narrow = true;  // 32-bit entries: half the cache footprint, and a vector gather
        for (int64_t v : cs.col) narrow = narrow && v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
        pre << "alignas(64) static const " << (narrow ? "int32_t " : "int64_t ") << tab << "[] = {";
        for (size_t c = 0; c < cs.col.size(); ++c) pre << (c ? "," : "") << cs.col[c];
        pre << "};\n";
        if (narrow && m.buffers[size_t(e.buffer)].dtype == DType::Float32) {
          o << "  static const nf::ColWindows win_" << i << " = nf::col_windows(" << tab << ", " << i64(st.width) << ");\n";
          split_loads[int(i)] = "nf::ldw<V>(" + p + ", win_" + std::to_string(i) + ", " + tab + " + c, c)";
          continue;
        }
      } else {
        o << "  std::vector<int64_t> " << tab << "(" << st.width << ");\n";
        o << "  { const int64_t o0 = " << fn << "(ctx, B, 0, 0);\n    for (int64_t c = 0; c < " << i64(st.width) << "; ++c) " << tab
          << "[size_t(c)] = " << fn << "(ctx, B, 0, c) - o0; }\n";
      }
      split_loads[int(i)] = "nf::ldt<V>(" + p + ", " + tab + (cs.col_dynamic || st.width > kMaxStaticTable ? ".data()" : "") + " + c)";
    }
    for (auto& s : st.stores) vec = vec && s.access.affine && s.access.col_stride == 1;
    if (split_loads.empty()) return false;
    o << "  auto row_init = [&](int64_t r) {\n    std::array<int64_t, " << rows_k << "> rb{};\n" << init.str() << "    return rb;\n  };\n";
    return vec;
  }

  std::string elementwise() {
    body << "extern \"C\" void " << stage_symbol(st) << "(const nnfuse_exec_ctx* ctx, void* const* B) {\n";
    declare_buffers();
    bool vec = st.vectorizable;
    if (st.layout_block <= 0 && !st.vectorizable) vec = plan_split_loads(body);
    const bool split = !split_loads.empty();
    body << "  auto body = [&](auto tag, int64_t r, int64_t c" << (split ? ", const auto& rb" : "") << ") {\n    using V = decltype(tag);\n    (void)r; (void)c;\n";
    blocked_prelude(body);
    emit_exprs(body, false);
    emit_stores(body, -1);
    body << "  };\n";
    const std::string v = vec ? "true" : "false";
    if (split) body << "  nf::elementwise_split<" << v << ">(ctx, " << i64(st.rows) << ", " << i64(st.width) << ", row_init, body);\n}\n";
    else body << "  nf::elementwise<" << v << ">(ctx, " << i64(st.rows) << ", " << i64(st.width) << ", body);\n}\n";
    return pre.str() + body.str();
  }

  int64_t ip(const std::string& k) const { return stage_iparam(st, k); }

  // Conv and GEMM anchors under this many FLOPs (a few microseconds on one core) run serially
  // (see anchor()). Not pooling: its FLOP count is its input size, and a global pool over a
  // 14x14x672 map (131 kFLOP) reads half a megabyte; run serially, EfficientNet-B0's pools made
  // it 1.5% slower at 2 threads.
  static constexpr double kSerialAnchorFlops = 2.5e5;
  bool serial_anchor() const {
    const bool compute_bound = st.anchor_op == "Conv" || st.anchor_op == "MatMul" || st.anchor_op == "Gemm";
    return compute_bound && st.flops > 0 && st.flops < kSerialAnchorFlops;
  }

  // Int8 stages (lowering/int8_kernels.cpp): the weights' grid multipliers as a table for the
  // prepare entry point, and a guard that the unit is compiled with VNNI.
  static constexpr const char* kNeedsVnni =
      "#if !defined(__AVX512VNNI__)\n#error \"stage lowered for the int8 kernels needs AVX-512 VNNI\"\n#endif\n";
  std::string int8_weight_table() {
    const std::string name = "wmult_" + st.name;
    pre << "static const int32_t " << name << "[] = {";
    for (size_t k = 0; k < st.vparams.at("WMULT").size(); ++k) pre << (k ? "," : "") << st.vparams.at("WMULT")[k];
    pre << "};\n";
    return name;
  }

  // A quantized MatMul / Gemm on VNNI (kernels/microkernels/gemm_int8.h): every batch element's
  // rows as one matrix; Gemm's alpha folded into the per-column scale.
  void gemm_int8_anchor(const std::string& a, const std::string& y) {
    const int64_t M = ip("M") * ip("batch"), N = ip("N"), K = ip("K");
    const double alpha = st.fparams.count("alpha") ? st.fparams.at("alpha") : 1.0;
    const std::string xoffset = "int32_t(" + std::to_string(ip("XOFFSET")) + ")";
    const std::string mult = int8_weight_table();
    pre << emit_prepare_release(st, "nnfuse::mk::PackedGemmInt8",
                                "static_cast<const float*>(B[" + std::to_string(st.anchor_inputs[1]) + "]), " + std::to_string(K) + ", " +
                                    std::to_string(N) + ", " + std::to_string(ip("transB") ? 1 : N) + ", " + std::to_string(ip("transB") ? K : 1) +
                                    ", " + flt(st.fparams.at("XSCALE") * alpha) + ", " + xoffset + ", " + mult);
    body << kNeedsVnni;
    body << "  nnfuse::mk::GemmInt8Args q;\n  q.M = " << M << "; q.N = " << N << "; q.K = " << K << "; q.A = " << a << "; q.C = " << y
         << ";\n  q.x_scale = " << flt(st.fparams.at("XSCALE")) << "; q.x_offset = " << xoffset << ";\n";
    body << "  const auto& pb = *static_cast<const nnfuse::mk::PackedGemmInt8*>(B[" << st.prepared << "]);\n";
    body << "  if (!nnfuse::mk::gemm_int8<nf::A, " << (N + 15) / 16 << ">(q, pb, ep, par)) nf::shape_class_error(ctx);\n";
  }

  // Conv / pooling in NCHW<BLK>c (kernels/microkernels/conv_nchwc.h). The block must be the
  // compiled vector width: a mismatch (lowered for one target, compiled for another) fails to build.
  void blocked_anchor(const std::string& x, const std::string& y) {
    const int64_t blk = st.layout_block;
    body << "  static_assert(nf::L == " << blk << ", \"stage lowered for NCHW" << blk << "c\");\n";
    auto geometry = [&](const char* arg) {
      body << "  " << arg << ".N = " << ip("N") << "; " << arg << ".C = " << ip("C") << "; " << arg << ".H = " << ip("H") << "; " << arg
           << ".W = " << ip("W") << "; " << arg << ".OH = " << ip("OH") << "; " << arg << ".OW = " << ip("OW") << ";\n";
      body << "  " << arg << ".KH = " << ip("KH") << "; " << arg << ".KW = " << ip("KW") << "; " << arg << ".stride_h = " << ip("SH") << "; "
           << arg << ".stride_w = " << ip("SW") << "; " << arg << ".pad_top = " << ip("PH") << "; " << arg << ".pad_left = " << ip("PW")
           << "; " << arg << ".dil_h = " << ip("DH") << "; " << arg << ".dil_w = " << ip("DW") << ";\n";
    };
    if (st.anchor_op == "Conv" && ip("ALGO") == kConvInt8) {
      // A quantized model's conv on VNNI (kernels/microkernels/conv_int8.h; int8_kernels.cpp
      // chose it only for a target that has VNNI, and the kernel exists only where it is compiled).
      const std::string xscale = flt(st.fparams.at("XSCALE")), xoffset = "int32_t(" + std::to_string(ip("XOFFSET")) + ")";
      const std::string mult = int8_weight_table();
      pre << emit_prepare_release(st, "nnfuse::mk::PackedConvInt8",
                                  "static_cast<const float*>(B[" + std::to_string(st.anchor_inputs[1]) + "]), " + std::to_string(ip("CO")) + ", " +
                                      std::to_string(ip("C")) + ", " + std::to_string(ip("KH")) + ", " + std::to_string(ip("KW")) + ", " + xscale +
                                      ", " + xoffset + ", " + mult);
      body << kNeedsVnni;
      body << "  nnfuse::mk::ConvInt8Args a;\n";
      geometry("a");
      body << "  a.K = " << ip("CO") << "; a.x_blocked = " << (ip("XBLK") ? "true" : "false") << "; a.x_scale = " << xscale
           << "; a.x_offset = " << xoffset << ";\n";
      body << "  a.x = " << x << "; a.y = " << y << ";\n";
      body << "  const auto& packed = *static_cast<const nnfuse::mk::PackedConvInt8*>(B[" << st.prepared << "]);\n";
      body << "  if (!nnfuse::mk::conv2d_int8_nchwc<nf::A, " << (ip("CO") + 15) / 16 << ">(a, packed, ep, par)) nf::shape_class_error(ctx);\n";
    } else if (st.anchor_op == "Conv") {
      const int64_t G = ip("G"), K = ip("CO"), Cg = ip("C") / G;
      // Blocked convs are dense, depthwise, or grouped by windows (conv_nchwc.h, conv_nchwc_windows).
      const bool depthwise = conv_stage_depthwise(st);
      const bool winograd = ip("ALGO") == kConvWinogradF4x4 || ip("ALGO") == kConvWinogradF2x2;
      const std::string packed = ip("ALGO") == kConvWinogradF4x4   ? "nnfuse::mk::PackedConvWinograd"
                                 : ip("ALGO") == kConvWinogradF2x2 ? "nnfuse::mk::PackedConvWinograd2"
                                                                   : "nnfuse::mk::PackedConvNchwc";
      const std::string w = "static_cast<const float*>(B[" + std::to_string(st.anchor_inputs[1]) + "]), " + std::to_string(K) + ", " +
                            std::to_string(Cg) + ", ";
      pre << emit_prepare_release(st, packed, winograd ? w + std::to_string(blk)
                                                       : w + std::to_string(ip("KH")) + ", " + std::to_string(ip("KW")) + ", " + std::to_string(blk) +
                                                             ", " + std::to_string(depthwise ? 1 : G) + (depthwise ? ", true" : ""));
      body << "  nnfuse::mk::ConvNchwcArgs a;\n";
      geometry("a");
      body << "  a.K = " << K << "; a.depthwise = " << (depthwise ? "true" : "false") << "; a.group = " << (depthwise ? 1 : G)
           << "; a.x_blocked = " << (ip("XBLK") ? "true" : "false") << ";\n";
      body << "  a.x = " << x << "; a.y = " << y << ";\n";
      body << "  const auto& packed = *static_cast<const " << packed << "*>(B[" << st.prepared << "]);\n";
      // The conv's shape class (kernels/microkernels/conv_nchwc.h): the instantiation holds only
      // the tile paths these static shapes take. `pointwise` is mk::conv_pointwise_geometry's test
      // (the kernel checks the class it is given with it: a mismatch is an error, never a wrong path).
      // The input width is in every class: a dense conv's picks its register tile (AVX-512 takes
      // 7 pixels on maps up to mk::kNarrowMapWidth wide), a depthwise one's its row kernel.
      const bool pointwise = !depthwise && ip("KH") == 1 && ip("KW") == 1 && ip("PH") == 0 && ip("PW") == 0 &&
                             (ip("OH") - 1) * ip("SH") < ip("H") && (ip("OW") - 1) * ip("SW") < ip("W");
      const std::string cls = std::string("nnfuse::mk::ConvClass{nnfuse::mk::ConvKind::") +
                              (depthwise ? "Depthwise" : pointwise ? "Pointwise" : "Spatial") + ", " + std::to_string(K) +
                              (depthwise ? ", " + std::to_string(ip("KW")) + ", " + std::to_string(ip("SW")) + ", " + std::to_string(ip("DW")) +
                                               ", " + std::to_string(ip("W"))
                                         : ", 0, 0, 0, " + std::to_string(ip("W")) + ", " + std::to_string(G)) +
                              "}";
      if (winograd) {
        body << "  if (!nnfuse::mk::conv2d_nchwc_winograd<nf::A, " << cls << ">(a, packed, ep, par)) nf::shape_class_error(ctx);\n";
      } else {
        body << "  a.w = packed.w.data();\n";
        body << "  if (!nnfuse::mk::conv2d_nchwc<nf::A, " << cls << ">(a, ep, par)) nf::shape_class_error(ctx);\n";
      }
    } else if (st.anchor_op == "Pool") {
      body << "  nnfuse::mk::PoolNchwcArgs a;\n";
      geometry("a");
      body << "  a.pad_bottom = " << ip("PH1") << "; a.pad_right = " << ip("PW1") << "; a.is_max = " << (ip("MAX") ? "true" : "false")
           << "; a.count_include_pad = " << (ip("CIP") ? "true" : "false") << ";\n";
      body << "  a.x = " << x << "; a.y = " << y << ";\n  nnfuse::mk::pool2d_nchwc<nf::A>(a, ep, par);\n";
    } else {
      fail(ErrorKind::Unsupported, "emitter: no blocked-layout code for anchor " + st.anchor_op + " (stage " + st.name + ")");
    }
  }

  // The anchor's epilogue as the functor `ep` (ep(v, r, c): the expressions, the stores but the
  // primary one, and the value the kernel writes): on vectors, or lane by lane when some access
  // is not vectorisable.
  void epilogue_functor(bool vec) {
    body << "  auto body = [&](auto v, int64_t r, int64_t c) {\n    using V = decltype(v);\n    (void)r; (void)c;\n";
    blocked_prelude(body);
    emit_exprs(body, true);
    emit_stores(body, st.primary_store);
    if (st.primary_store >= 0) body << "    return e" << st.stores[size_t(st.primary_store)].expr << ";\n";
    else body << "    return v;\n";
    body << "  };\n";
    if (vec && heavy_epilogue()) body << "  const nnfuse::mk::AfterStoresEpilogue<decltype(body)> ep{body};\n";
    else if (vec) body << "  const auto& ep = body;\n";
    else body << "  nf::LaneSplit<decltype(body)> ep{body};\n";
  }
  // Whether the epilogue evaluates a function with constants of its own (a polynomial or an
  // exponential): a GEMM then applies it after storing its tile (mk::AfterStoresEpilogue); other
  // kernels call the wrapper as they would the functor.
  bool heavy_epilogue() const {
    static const std::set<std::string> heavy = {"Sigmoid", "Tanh", "Erf", "Exp", "Log", "Gelu", "GeluTanh", "Sin", "Cos", "Elu", "Softplus", "Pow"};
    for (size_t i = expr_begin; i < st.exprs.size(); ++i)
      if ((st.exprs[i].kind == Expr::Unary || st.exprs[i].kind == Expr::Binary) && heavy.count(st.exprs[i].op)) return true;
    return false;
  }

  // Fused attention (kernels/microkernels/attention.h): two functors, the score transform on
  // the scores' rows x score_width view and the epilogue on the output's rows x width view.
  std::string attention() {
    body << "extern \"C\" void " << stage_symbol(st) << "(const nnfuse_exec_ctx* ctx, void* const* B) {\n";
    declare_buffers();
    // The score transform through a sub-emitter over a stage holding only its expressions (its
    // off_ helpers get their own names).
    Stage sc = st;
    sc.exprs.resize(size_t(st.score_exprs));
    sc.stores.clear();
    sc.width = st.score_width;
    sc.name = st.name + "_sc";
    sc.vectorizable = true;
    for (auto& e : sc.exprs)
      if (e.kind == Expr::Load && !vectorizable_load(e.access)) sc.vectorizable = false;
    StageEmitter se(m, sc);
    const bool score_vec = sc.vectorizable || se.plan_anchor_row_split();
    se.emit_exprs(se.body, true);
    pre << "#include \"microkernels/attention.h\"\n" << se.pre.str();
    body << "  auto score_body = [&](auto v, int64_t r, int64_t c) {\n    using V = decltype(v);\n    (void)r; (void)c;\n"
         << se.body.str() << "    return e" << st.score_expr << ";\n  };\n";
    if (score_vec) body << "  const auto& score = score_body;\n";
    else body << "  nf::LaneSplit<decltype(score_body)> score{score_body};\n";
    expr_begin = size_t(st.score_exprs);
    const bool vec = st.vectorizable || plan_anchor_row_split();
    body << "  nf::Par par{ctx};\n";
    epilogue_functor(vec);
    auto table = [&](const char* name) {
      const auto& t = st.vparams.at(name);
      body << "  static const int64_t " << name << "[] = {";
      for (size_t i = 0; i < t.size(); ++i) body << (i ? "," : "") << t[i];
      body << "};\n";
    };
    table("q_off");
    table("k_off");
    table("v_off");
    body << "  nnfuse::mk::AttentionArgs a;\n";
    body << "  a.batch = " << ip("batch") << "; a.Sq = " << ip("Sq") << "; a.Sk = " << ip("Sk") << "; a.D = " << ip("D") << "; a.Dv = " << ip("Dv")
         << ";\n";
    body << "  a.q = " << buf(st.anchor_inputs.at(0)) << "; a.k = " << buf(st.anchor_inputs.at(1)) << "; a.v = " << buf(st.anchor_inputs.at(2))
         << ";\n  a.q_off = q_off; a.k_off = k_off; a.v_off = v_off;\n";
    body << "  a.y = " << buf(st.anchor_output) << "; a.nan_to_zero = " << (ip("nan_guard") ? "true" : "false") << ";\n";
    body << "  nnfuse::mk::attention<nf::A>(a, score, ep, par);\n}\n";
    return pre.str() + body.str();
  }

  std::string anchor() {
    body << "extern \"C\" void " << stage_symbol(st) << "(const nnfuse_exec_ctx* ctx, void* const* B) {\n";
    declare_buffers();
    const bool vec = st.vectorizable || (st.layout_block <= 0 && plan_anchor_row_split());
    // A small anchor runs on the calling thread: handing half of a few microseconds of work to a
    // worker costs about as much as it saves when the worker spins, and several times more when it
    // sleeps (a 20 us model ran slower at 2 threads than at 1; bench/RESULTS.md, session 13).
    body << "  nf::Par par{" << (serial_anchor() ? "nullptr" : "ctx") << "};\n  (void)par;\n";
    epilogue_functor(vec);
    std::string y = buf(st.anchor_output);
    auto in = [&](size_t k) { return buf(st.anchor_inputs.at(k)); };
    const std::string& op = st.anchor_op;
    if (st.layout_block > 0) {
      blocked_anchor(in(0), y);
    } else if ((op == "MatMul" || op == "Gemm") && st.iparams.count("INT8")) {
      gemm_int8_anchor(in(0), y);
    } else if (op == "MatMul" || op == "Gemm") {
      int64_t M = ip("M"), N = ip("N"), K = ip("K"), batch = ip("batch");
      const auto& ao = st.vparams.at("a_off");
      const auto& bo = st.vparams.at("b_off");
      body << "  nnfuse::mk::GemmArgs g = nnfuse::mk::GemmArgs::matmul(" << M << ", " << N << ", " << K << ", " << in(0) << ", "
           << (ip("transA") ? "true" : "false") << ", " << in(1) << ", " << (ip("transB") ? "true" : "false") << ", " << y << ");\n";
      body << "  g.alpha = " << flt(st.fparams.count("alpha") ? st.fparams.at("alpha") : 1.0) << ";\n";
      bool affine = true;
      int64_t as = batch > 1 ? ao[1] - ao[0] : 0, bs = batch > 1 ? bo[1] - bo[0] : 0;
      for (int64_t b = 0; b < batch; ++b)
        if (ao[size_t(b)] != b * as || bo[size_t(b)] != b * bs) affine = false;
      // The GEMM's shape class (kernels/microkernels/gemm.h): only the row tiles these rows use.
      const std::string cls_batched = "nnfuse::mk::GemmClass{" + std::to_string(M) + ", " + std::to_string(batch) + "}";
      const std::string cls_single = "nnfuse::mk::GemmClass{" + std::to_string(M) + ", 1}";
      if (st.prepared >= 0) {
        // B is a weight shared by every batch: packed once by the prepare entry point.
        int64_t b_rs = ip("transB") ? 1 : N, b_cs = ip("transB") ? K : 1;
        pre << emit_prepare_release(st, "nnfuse::mk::PackedB<nf::A>",
                                    std::to_string(K) + ", " + std::to_string(N) + ", static_cast<const float*>(B[" +
                                        std::to_string(st.anchor_inputs[1]) + "]), " + std::to_string(b_rs) + ", " + std::to_string(b_cs));
        body << "  const auto& pb = *static_cast<const nnfuse::mk::PackedB<nf::A>*>(B[" << st.prepared << "]);\n";
        if (affine) {
          body << "  g.batch = " << batch << "; g.a_bs = " << as << "; g.c_bs = " << M * N << ";\n";
          body << "  if (!nnfuse::mk::gemm_packed<nf::A, " << cls_batched << ">(g, pb, ep, par)) nf::shape_class_error(ctx);\n";
        } else {
          body << "  static const int64_t aoff[] = {";
          for (size_t b = 0; b < ao.size(); ++b) body << (b ? "," : "") << ao[b];
          body << "};\n  for (int64_t b = 0; b < " << batch << "; ++b) {\n";
          body << "    g.A = " << in(0) << " + aoff[b]; g.C = " << y << " + b * " << M * N << ";\n";
          body << "    nnfuse::mk::OffsetEpilogue<std::decay_t<decltype(ep)>> oep{ep, b * " << M << ", 0};\n";
          body << "    if (!nnfuse::mk::gemm_packed<nf::A, " << cls_single << ">(g, pb, oep, par)) nf::shape_class_error(ctx);\n  }\n";
        }
      } else if (affine) {
        body << "  g.batch = " << batch << "; g.a_bs = " << as << "; g.b_bs = " << bs << "; g.c_bs = " << M * N << ";\n";
        body << "  if (!nnfuse::mk::gemm<nf::A, " << cls_batched << ">(g, ep, par)) nf::shape_class_error(ctx);\n";
      } else {
        body << "  static const int64_t aoff[] = {";
        for (size_t b = 0; b < ao.size(); ++b) body << (b ? "," : "") << ao[b];
        body << "};\n  static const int64_t boff[] = {";
        for (size_t b = 0; b < bo.size(); ++b) body << (b ? "," : "") << bo[b];
        body << "};\n";
        body << "  for (int64_t b = 0; b < " << batch << "; ++b) {\n";
        body << "    g.A = " << in(0) << " + aoff[b]; g.B = " << in(1) << " + boff[b]; g.C = " << y << " + b * " << M * N << ";\n";
        body << "    nnfuse::mk::OffsetEpilogue<std::decay_t<decltype(ep)>> oep{ep, b * " << M << ", 0};\n";
        body << "    if (!nnfuse::mk::gemm<nf::A, " << cls_single << ">(g, oep, par)) nf::shape_class_error(ctx);\n  }\n";
      }
    } else if (op == "Conv") {
      body << "  nnfuse::mk::Conv2dArgs a;\n";
      body << "  a.N = " << ip("N") << "; a.C = " << ip("C") << "; a.H = " << ip("H") << "; a.W = " << ip("W") << ";\n";
      body << "  a.K = " << ip("CO") << "; a.OH = " << ip("OH") << "; a.OW = " << ip("OW") << "; a.KH = " << ip("KH") << "; a.KW = " << ip("KW") << ";\n";
      body << "  a.stride_h = " << ip("SH") << "; a.stride_w = " << ip("SW") << "; a.pad_top = " << ip("PH") << "; a.pad_left = " << ip("PW") << ";\n";
      body << "  a.dil_h = " << ip("DH") << "; a.dil_w = " << ip("DW") << "; a.group = " << ip("G") << ";\n";
      body << "  a.set_contiguous();\n  a.x = " << in(0) << "; a.w = " << in(1) << "; a.y = " << y << ";\n";
      body << "  nnfuse::mk::conv2d<nf::A>(a, ep, par);\n";
    } else if (op == "ConvTranspose") {
      pre << "#include \"microkernels/conv_transpose.h\"\n";
      body << emit_conv_transpose_call(st, in(0), in(1), y);
    } else if (op == "Pool") {
      body << "  nf::pool2d(ctx, " << in(0) << ", " << y;
      for (auto k : {"N", "C", "H", "W", "OH", "OW", "KH", "KW", "SH", "SW", "PH", "PW", "PH1", "PW1", "DH", "DW"}) body << ", " << i64(ip(k));
      body << ", " << (ip("MAX") ? "true" : "false") << ", " << (ip("CIP") ? "true" : "false") << ", ep);\n";
    } else if (op == "Softmax" && st.iparams.count("inner") && ip("inner") > 1) {
      // Over a non-last axis: rows of the [outer, n, inner] view, vectorised along inner.
      body << "  nf::softmax_axis(ctx, " << in(0) << ", " << y << ", " << i64(ip("outer")) << ", "
           << i64(ip("n")) << ", " << i64(ip("inner")) << ", ep);\n";
    } else if (op == "Softmax") {
      body << "  nf::softmax(ctx, " << in(0) << ", " << y << ", " << i64(ip("rows")) << ", " << i64(ip("n")) << ", ep);\n";
    } else if (op == "LayerNormalization") {
      body << "  nf::layernorm(ctx, " << in(0) << ", " << y << ", " << i64(ip("rows")) << ", " << i64(ip("n")) << ", "
           << flt(st.fparams.at("eps")) << ", ep);\n";
    } else if (op == "Reduce") {
      body << "  nf::reduce(ctx, " << in(0) << ", " << y << ", " << i64(ip("outer")) << ", " << i64(ip("red")) << ", " << i64(ip("inner"))
           << ", " << ip("mode") << ", ep);\n";
    } else {
      fail(ErrorKind::Unsupported, "emitter: no code for anchor " + op + " (stage " + st.name + ")");
    }
    body << "}\n";
    return pre.str() + body.str();
  }
};

// A stage's code with its own names taken out: the stage name becomes a placeholder and the
// buffers it touches are renumbered 0, 1, ... in order of first mention (`bN` variables and
// `B[N]` reads alike). Two stages with the same normalised code differ only in which buffers they
// run on (e.g. the twelve layers of a transformer), so one compiled implementation serves both.
// The code depends on buffers only through those names: constant tables and shapes are in the
// text, buffer contents are read at run time.
struct NormalisedStage {
  std::string code;          // stage name -> "@STAGE@", buffer N -> its slot
  std::vector<int> buffers;  // slot -> buffer number
};

constexpr const char* kStagePlaceholder = "@STAGE@";

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

NormalisedStage normalise_stage(const std::string& code, const std::string& stage_name) {
  NormalisedStage n;
  std::map<int, int> slot;
  auto slot_of = [&](int b) {
    auto [it, added] = slot.emplace(b, int(n.buffers.size()));
    if (added) n.buffers.push_back(b);
    return it->second;
  };
  std::string& o = n.code;
  o.reserve(code.size());
  for (size_t i = 0; i < code.size();) {
    const bool at_word = i == 0 || !ident_char(code[i - 1]);
    // The stage name, where it is (part of) an identifier: nf_<stage>, off_<stage>_3, ct_<stage>_1.
    if (code.compare(i, stage_name.size(), stage_name) == 0 && (i == 0 || !std::isalnum(static_cast<unsigned char>(code[i - 1]))) &&
        (i + stage_name.size() == code.size() || !std::isalnum(static_cast<unsigned char>(code[i + stage_name.size()])))) {
      o += kStagePlaceholder;
      i += stage_name.size();
      continue;
    }
    // bN (a buffer's variable) or B[N] (a buffer's pointer).
    const bool var = at_word && code[i] == 'b' && i + 1 < code.size() && std::isdigit(static_cast<unsigned char>(code[i + 1]));
    const bool ptr = at_word && code.compare(i, 2, "B[") == 0 && i + 2 < code.size() && std::isdigit(static_cast<unsigned char>(code[i + 2]));
    if (var || ptr) {
      size_t j = i + (var ? 1 : 2);
      int b = 0;
      while (j < code.size() && std::isdigit(static_cast<unsigned char>(code[j]))) b = b * 10 + (code[j++] - '0');
      if (var ? (j == code.size() || !ident_char(code[j])) : (j < code.size() && code[j] == ']')) {
        o += var ? "b" + std::to_string(slot_of(b)) : "B[" + std::to_string(slot_of(b));
        i = j;
        continue;
      }
    }
    o += code[i++];
  }
  return n;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
  return s;
}

// The entry points of a stage that runs a shared implementation `impl`: each passes the stage's
// own buffers in slot order.
std::string shared_stage_wrappers(const Stage& s, const std::string& impl, const NormalisedStage& n) {
  std::string slots;
  for (size_t k = 0; k < n.buffers.size(); ++k) slots += (k ? ", B[" : "B[") + std::to_string(n.buffers[k]) + "]";
  const std::string sym = stage_symbol(s), isym = "nf_" + impl;
  const std::string local = "  void* const S[] = {" + (slots.empty() ? std::string("nullptr") : slots) + "};\n";
  std::string o = "extern \"C\" void " + sym + "(const nnfuse_exec_ctx* ctx, void* const* B) {\n" + local + "  " + isym + "(ctx, S);\n}\n";
  if (n.code.find("nf_" + std::string(kStagePlaceholder) + "_prepare(") != std::string::npos) {
    o += "extern \"C\" void* " + sym + "_prepare(void* const* B) {\n" + local + "  return " + isym + "_prepare(S);\n}\n";
    o += "extern \"C\" void " + sym + "_release(void* p) { " + isym + "_release(p); }\n";
  }
  return o;
}

}  // namespace

std::vector<SourceUnit> emit_cpp(const KernelModule& m, int max_units) {
  // Each stage's code, grouped by its normalised form: a group compiles once.
  struct Group {
    std::vector<const Stage*> stages;
    std::vector<NormalisedStage> forms;
    std::string code;  // the first stage's code (a group of one is emitted as it is)
  };
  std::vector<Group> groups;
  std::map<std::string, size_t> group_of;
  for (auto& s : m.stages) {
    if (s.kind == StageKind::Fallback) continue;
    StageEmitter se(m, s);
    std::string code = is_kernel_op_stage(s)                                     ? emit_kernel_op_stage(s)
                       : s.kind == StageKind::Anchor && s.anchor_op == "Attention" ? se.attention()
                       : s.kind == StageKind::Anchor                               ? se.anchor()
                                                                                   : se.elementwise();
    NormalisedStage n = normalise_stage(code, s.name);
    auto [it, added] = group_of.emplace(n.code, groups.size());
    if (added) groups.push_back(Group{{}, {}, std::move(code)});
    groups[it->second].stages.push_back(&s);
    groups[it->second].forms.push_back(std::move(n));
  }
  // Anchors instantiate microkernel templates and cost most to compile.
  auto compile_cost = [](const Stage& s) {
    if (s.kind != StageKind::Anchor) return 1.0;
    return s.anchor_op == "Conv" || s.anchor_op == "ConvTranspose" || s.anchor_op == "MatMul" || s.anchor_op == "Gemm" || is_recurrent_op(s.anchor_op) ? 10.0 : 3.0;
  };
  // Every unit pays a fixed price (compiler start, loading the precompiled support header: about
  // 0.15 s CPU, twice an elementwise stage's own cost), so a unit gets at least kMinUnitCost of
  // work: small models compile as one or two units, large ones still spread over max_units.
  constexpr double kMinUnitCost = 4;
  double total_cost = 0;
  for (const Group& g : groups) total_cost += compile_cost(*g.stages[0]);
  int units = std::max(1, std::min<int>(max_units, int(std::ceil(total_cost / kMinUnitCost))));
  std::vector<SourceUnit> out(static_cast<size_t>(units));
  std::vector<double> load(static_cast<size_t>(units), 0.0);
  for (int u = 0; u < units; ++u) {
    out[size_t(u)].name = "unit" + std::to_string(u);
    out[size_t(u)].code = "// Generated by nnfuse: do not edit.\n#include \"gen_support.h\"\n\n";
  }
  auto header = [](const Stage& s) {
    return "// stage " + s.name + " (" + stage_kind_name(s.kind) + (s.anchor_op.empty() ? "" : " " + s.anchor_op) + ")";
  };
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    const size_t u = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    load[u] += compile_cost(*g.stages[0]);
    std::string& code = out[u].code;
    if (g.stages.size() == 1) {
      code += header(*g.stages[0]) + "\n" + g.code + "\n";
    } else {
      const std::string impl = "k" + std::to_string(gi);
      code += "// kernel " + impl + ": the code of " + std::to_string(g.stages.size()) + " stages, each on its own buffers (slots)\n";
      code += replace_all(g.forms[0].code, kStagePlaceholder, impl);
      for (size_t k = 0; k < g.stages.size(); ++k)
        code += header(*g.stages[k]) + ": kernel " + impl + "\n" + shared_stage_wrappers(*g.stages[k], impl, g.forms[k]);
      code += "\n";
    }
    for (const Stage* s : g.stages) out[u].symbols.push_back(stage_symbol(*s));
    ++out[u].implementations;
  }
  std::vector<SourceUnit> res;
  for (auto& u : out)
    if (!u.symbols.empty()) res.push_back(std::move(u));
  return res;
}

}  // namespace nnfuse
