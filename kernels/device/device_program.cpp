// Kernel-IR stages -> the device kernel form (device_program.h). One printer for both GPU
// dialects: what differs (qualifiers, ids, barriers) is the backend's prelude.
#include "kernels/device/device_program.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "graph/error.h"

namespace nnfuse::device {

namespace {

constexpr int kTile = 16;        // tiled GEMM: 16 x 16 work-items per group,
constexpr int64_t kMinBlockedGroups = 256;  // register blocking by shape: the least work-groups
                                            // (after split-K) a blocked grid must keep
constexpr int64_t kSplitMinK = 128;  // split-K: the least K per split
constexpr int kGroup = 256;      // work-items per group for every other form
constexpr int64_t kMinTiledRows = 8;  // Conv: output channels per group below this run direct
constexpr int kTensorMinKTile = 32;  // tensor-core tiles: the least k per staged step (two m16n16k16)

std::string flt(double v) {
  if (std::isnan(v)) return "NF_NAN";
  if (std::isinf(v)) return v > 0 ? "NF_INF" : "(-NF_INF)";
  std::ostringstream o;
  o << std::setprecision(9) << float(v);
  std::string s = o.str();
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return "(" + s + "f)";
}

std::string i64s(int64_t v) { return "((i64)" + std::to_string(v) + ")"; }

std::string c_type(DType dt, const std::string& where) {
  switch (dt) {
    case DType::Float32: return "float";
    case DType::Int64: return "i64";
    case DType::Int32: return "i32";
    case DType::Int16: return "i16";
    case DType::Int8: return "i8";
    case DType::UInt64: return "u64";
    case DType::UInt32: return "u32";
    case DType::UInt16: return "u16";
    case DType::UInt8:
    case DType::Bool: return "u8";
    default: fail(ErrorKind::Unsupported, "device kernels: " + where + " touches a " + std::string(dtype_name(dt)) + " buffer");
  }
}

// The element-wise ops of expression trees, as float functions (the CPU's gen_support.h ops,
// scalar). Comparisons and logic give 0 / 1; NaN propagates through Relu/Max/Min as on the CPU.
const char* kOps = R"(
NF_FN float op_Relu(float x) { return x < 0.0f ? 0.0f : x; }
NF_FN float op_Sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
NF_FN float op_Tanh(float x) { return tanh(x); }
NF_FN float op_Erf(float x) { return erf(x); }
NF_FN float op_Exp(float x) { return exp(x); }
NF_FN float op_Log(float x) { return log(x); }
NF_FN float op_Sqrt(float x) { return sqrt(x); }
NF_FN float op_Gelu(float x) { return 0.5f * x * (1.0f + erf(x * 0.70710678118654752f)); }
NF_FN float op_GeluTanh(float x) { return x / (1.0f + exp(-1.5957691216057308f * (x + 0.044715f * x * x * x))); }
NF_FN float op_Neg(float x) { return -x; }
NF_FN float op_Abs(float x) { return fabs(x); }
NF_FN float op_Reciprocal(float x) { return 1.0f / x; }
NF_FN float op_Floor(float x) { return floor(x); }
NF_FN float op_Ceil(float x) { return ceil(x); }
NF_FN float op_Round(float x) { return rint(x); }
NF_FN float op_Sin(float x) { return sin(x); }
NF_FN float op_Cos(float x) { return cos(x); }
NF_FN float op_Trunc(float x) { return trunc(x); }
NF_FN float op_Max(float a, float b) { return a < b ? b : a; }
NF_FN float op_Min(float a, float b) { return b < a ? b : a; }
NF_FN float op_LeakyRelu(float x, float a, float b) { return x < 0.0f ? x * a : x; }
NF_FN float op_Elu(float x, float a, float b) { return x < 0.0f ? a * (exp(x) - 1.0f) : x; }
NF_FN float op_HardSigmoid(float x, float a, float b) { return op_Min(op_Max(a * x + b, 0.0f), 1.0f); }
NF_FN float op_Softplus(float x) { return op_Max(x, 0.0f) + log1p(exp(-fabs(x))); }
NF_FN float op_HardSwish(float x) { return x * op_Min(op_Max(x * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f); }
NF_FN float op_Clip(float x, float lo, float hi) { return op_Min(op_Max(x, lo), hi); }
NF_FN float op_Add(float a, float b) { return a + b; }
NF_FN float op_Sub(float a, float b) { return a - b; }
NF_FN float op_Mul(float a, float b) { return a * b; }
NF_FN float op_Div(float a, float b) { return a / b; }
NF_FN float op_Pow(float a, float b) { return pow(a, b); }
NF_FN float op_PRelu(float x, float s) { return x < 0.0f ? x * s : x; }
NF_FN float op_Where(float c, float x, float y) { return c != 0.0f ? x : y; }
NF_FN float op_Equal(float a, float b) { return a == b ? 1.0f : 0.0f; }
NF_FN float op_Less(float a, float b) { return a < b ? 1.0f : 0.0f; }
NF_FN float op_LessOrEqual(float a, float b) { return a <= b ? 1.0f : 0.0f; }
NF_FN float op_Greater(float a, float b) { return a > b ? 1.0f : 0.0f; }
NF_FN float op_GreaterOrEqual(float a, float b) { return a >= b ? 1.0f : 0.0f; }
NF_FN float op_And(float a, float b) { return (a != 0.0f && b != 0.0f) ? 1.0f : 0.0f; }
NF_FN float op_Or(float a, float b) { return (a != 0.0f || b != 0.0f) ? 1.0f : 0.0f; }
NF_FN float op_Xor(float a, float b) { return ((a != 0.0f) != (b != 0.0f)) ? 1.0f : 0.0f; }
NF_FN float op_Not(float a) { return a != 0.0f ? 0.0f : 1.0f; }
NF_FN float op_NotZero(float a) { return a != 0.0f ? 1.0f : 0.0f; }
NF_FN float op_IsNaN(float a) { return a != a ? 1.0f : 0.0f; }
NF_FN float op_IsPosInf(float a) { return a == NF_INF ? 1.0f : 0.0f; }
NF_FN float op_IsNegInf(float a) { return a == -NF_INF ? 1.0f : 0.0f; }
NF_FN float op_IsInf(float a) { return (a == NF_INF || a == -NF_INF) ? 1.0f : 0.0f; }
)";

const std::set<std::string> kUnaryWithParams = {"LeakyRelu", "Elu", "HardSigmoid"};

// The op names kOps defines: an expression with any other op has no device form (its stage runs on
// the host) instead of a program that does not build.
const std::set<std::string>& device_ops() {
  static const std::set<std::string> ops = [] {
    std::set<std::string> r;
    const std::string text = kOps;
    for (size_t at = text.find("float op_"); at != std::string::npos; at = text.find("float op_", at + 1)) {
      const size_t b = at + 9, e = text.find('(', b);
      r.insert(text.substr(b, e - b));
    }
    return r;
  }();
  return ops;
}

struct KernelPrinter {
  const KernelModule& m;
  const Stage& st;
  DeviceKernel k;
  std::ostringstream body;
  std::map<int, int> arg_of;  // buffer -> argument slot
  int tmp = 0;

  const DeviceProgramOptions& opt;
  KernelPrinter(const KernelModule& mod, const Stage& s, const DeviceProgramOptions& o) : m(mod), st(s), opt(o) { k.name = "nf_" + s.name; }

  std::string where() const { return "stage " + st.name; }
  std::string buf(int b) {
    if (b < 0 || size_t(b) >= m.buffers.size()) fail(ErrorKind::Invalid, "device kernels: " + where() + " names no buffer " + std::to_string(b));
    if (!arg_of.count(b)) {
      arg_of[b] = int(k.buffers.size());
      k.buffers.push_back(b);
    }
    return "b" + std::to_string(arg_of[b]);  // by argument slot: repeated layers print the same text
  }
  std::string type_of(int b) const { return c_type(m.buffers[size_t(b)].dtype, where()); }

  // A map's offset at (r, c) for a map that is not affine: statements into `o` computing a fresh
  // variable, which is returned (the CPU emitter's off_fn, inline).
  // width: the row length of the map's view (a windowed store's window, else the stage's).
  std::string map_offset(std::ostringstream& o, const IndexMap& map, const std::string& r, const std::string& c, int64_t width = -1) {
    const std::string var = "o" + std::to_string(tmp++);
    o << "    i64 " << var << ";\n    {\n      i64 e = " << r << " * " << i64s(width < 0 ? st.width : width) << " + " << c << ";\n";
    const Shape& d = map.domain;
    o << "      i64 a0[" << std::max<size_t>(d.size(), 1) << "];\n      a0[0] = 0;\n";
    for (size_t q = d.size(); q-- > 0;) o << "      a0[" << q << "] = e % " << i64s(d[q]) << "; e /= " << i64s(d[q]) << ";\n";
    std::string cur = "a0";
    Shape from = d;
    int n = 0;
    for (const IndexStep& s : map.steps) {
      const std::string nxt = "a" + std::to_string(++n);
      o << "      i64 " << nxt << "[" << std::max<size_t>(s.to.size(), 1) << "];\n      " << nxt << "[0] = 0;\n";
      if (s.kind == IndexStep::Offset) {
        for (size_t q = 0; q < s.to.size(); ++q)
          o << "      " << nxt << "[" << q << "] = " << cur << "[" << q << "]" << (s.stride.empty() ? "" : " * " + i64s(s.stride[q])) << " + "
            << i64s(s.off[q]) << ";\n";
      } else if (s.kind == IndexStep::Select) {
        for (size_t q = 0; q < s.to.size(); ++q)
          o << "      " << nxt << "[" << q << "] = " << (s.src[q] >= 0 ? cur + "[" + std::to_string(s.src[q]) + "]" : std::string("0")) << ";\n";
      } else if (s.kind == IndexStep::Reshape) {
        o << "      { i64 l = 0;\n";
        for (size_t q = 0; q < s.from.size(); ++q) o << "        l = l * " << i64s(s.from[q]) << " + " << cur << "[" << q << "];\n";
        for (size_t q = s.to.size(); q-- > 0;) o << "        " << nxt << "[" << q << "] = l % " << i64s(s.to[q]) << "; l /= " << i64s(s.to[q]) << ";\n";
        o << "      }\n";
      } else {  // Gather: an index read from a buffer; negative counts from the end, out of range is reported
        const size_t axis = size_t(s.axis), q = size_t(s.q);
        const std::string ib = buf(s.index_buffer);
        o << "      { i64 l = 0;\n";
        for (size_t j = axis; j < axis + q; ++j) o << "        l = l * " << i64s(s.from[j]) << " + " << cur << "[" << j << "];\n";
        o << "        i64 i = (i64)" << ib << "[l];\n        if (i < 0) i += " << i64s(s.to[axis]) << ";\n";
        // The first failing stage in launch order records itself (kernels run one after another).
        o << "        if (i < 0 || i >= " << i64s(s.to[axis]) << ") { if (status[0] == 0) status[1] = (i32)stage_id; status[0] = 1; i = 0; }\n";
        o << "        " << nxt << "[" << axis << "] = i;\n      }\n";
        for (size_t j = 0; j < axis; ++j) o << "      " << nxt << "[" << j << "] = " << cur << "[" << j << "];\n";
        for (size_t j = axis + 1; j < s.to.size(); ++j) o << "      " << nxt << "[" << j << "] = " << cur << "[" << j + q - 1 << "];\n";
      }
      cur = nxt;
      from = s.to;
    }
    o << "      i64 off = 0;\n";
    for (size_t q = 0; q < from.size(); ++q) o << "      off = off * " << i64s(from[q]) << " + " << cur << "[" << q << "];\n";
    o << "      " << var << " = off;\n    }\n";
    return var;
  }

  std::string offset(std::ostringstream& o, const IndexMap& map, const Access& a, const std::string& r, const std::string& c,
                     int64_t width = -1) {
    if (a.affine) return "(" + i64s(a.base) + " + " + r + " * " + i64s(a.row_stride) + " + " + c + " * " + i64s(a.col_stride) + ")";
    return map_offset(o, map, r, c, width);
  }

  // The expression pool and the stores at (r, c) ("r", "c" in scope); `v`: the anchor value's
  // name, or "" in an element-wise stage. Returns the primary store's expression (the value the
  // anchor output holds), or "" when there is none.
  std::string exprs_and_stores(std::ostringstream& o, const std::string& v, int skip_store) {
    for (size_t i = 0; i < st.exprs.size(); ++i) {
      const Expr& e = st.exprs[i];
      if ((e.kind == Expr::Unary || e.kind == Expr::Binary) && !device_ops().count(e.op))
        fail(ErrorKind::Unsupported, "no device code for op " + e.op);
      auto a = [&](size_t q) { return "e" + std::to_string(e.args.at(q)); };
      std::string val;
      switch (e.kind) {
        case Expr::Load: {
          const std::string b = buf(e.buffer);
          const std::string x = b + "[" + offset(o, e.map, e.access, "r", "c") + "]";
          // Expr::part: the exact 22-bit parts of a wide integer (gen_support.h, int_part).
          const DType dt = m.buffers.at(size_t(e.buffer)).dtype;
          const bool is_signed = dt == DType::Int64 || dt == DType::Int32;
          if (e.part < 0) val = "(float)" + x;
          else if (e.part < 2) val = "(float)((((u64)" + x + ") >> " + std::to_string(22 * e.part) + ") & (u64)0x3fffff)";
          else val = std::string("(float)(((") + (is_signed ? "i64" : "u64") + ")" + x + ") >> 44)";
          break;
        }
        case Expr::Const: val = flt(e.value); break;
        case Expr::AnchorValue: val = v.empty() ? "0.0f" : v; break;
        case Expr::Clip: val = "op_Clip(" + a(0) + ", " + flt(e.lo) + ", " + flt(e.hi) + ")"; break;
        case Expr::Unary:
          val = kUnaryWithParams.count(e.op) ? "op_" + e.op + "(" + a(0) + ", " + flt(e.lo) + ", " + flt(e.hi) + ")"
                                             : "op_" + e.op + "(" + a(0) + ")";
          break;
        case Expr::Binary: val = "op_" + e.op + "(" + a(0) + ", " + a(1) + ")"; break;
        case Expr::Where: val = "op_Where(" + a(0) + ", " + a(1) + ", " + a(2) + ")"; break;
      }
      o << "    const float e" << i << " = " << val << ";\n";
    }
    for (size_t i = 0; i < st.stores.size(); ++i) {
      if (int(i) == skip_store) continue;
      const Store& s = st.stores[i];
      const std::string b = buf(s.buffer);
      // A windowed store (an epilogue Split) writes only its columns, at c - window_lo.
      const std::string c = s.windowed() ? "(c - " + i64s(s.window_lo) + ")" : std::string("c");
      const std::string off = offset(o, s.map, s.access, "r", c, s.width_in(st.width));
      if (s.windowed()) o << "    if (c >= " << i64s(s.window_lo) << " && c < " << i64s(s.window_hi) << ")";
      o << "    " << b << "[" << off << "] = (" << type_of(s.buffer) << ")(e" << s.expr << ");\n";
    }
    if (skip_store >= 0) return "e" + std::to_string(st.stores[size_t(skip_store)].expr);
    return "";
  }

  // The epilogue on anchor value `v` at (r, c), writing the anchor output at `y_off`.
  std::string epilogue(const std::string& v, const std::string& r, const std::string& c, const std::string& y_off) {
    std::ostringstream o;
    o << "  {\n    const i64 r = " << r << ", c = " << c << ";\n    const float v = " << v << ";\n";
    const std::string primary = exprs_and_stores(o, "v", st.primary_store);
    const std::string y = buf(st.anchor_output);
    o << "    " << y << "[" << y_off << "] = " << (primary.empty() ? "v" : primary) << ";\n  }\n";
    return o.str();
  }

  int64_t ip(const std::string& key) const {
    auto it = st.iparams.find(key);
    if (it == st.iparams.end()) fail(ErrorKind::Invalid, "device kernels: " + where() + " lacks parameter " + key);
    return it->second;
  }

  void elementwise() {
    const int64_t total = st.rows * st.width;
    k.form = "elementwise";
    k.local = kGroup;
    k.groups = (total + kGroup - 1) / kGroup;
    body << "  const i64 gid = NF_GID;\n  if (gid >= " << i64s(total) << ") return;\n";
    body << "  const i64 r = gid / " << i64s(st.width) << ", c = gid % " << i64s(st.width) << ";\n";
    exprs_and_stores(body, "", -1);
  }

  // A tiled GEMM over `batches` independent products of M x KD by KD x NC: `decode` declares the
  // batch's variables from bb, `a_elem` (of m, kk) and `b_elem` (of kk, n) are expressions read in
  // bounds, `r`/`c` the epilogue's row and column of output (m, n). A work-group of 16 x 16 items
  // computes a T x T tile, each item R x R outputs strided by 16 (so that neighbouring items load
  // and store neighbouring columns); A and B are staged k-major through work-group memory, 16 k
  // at a time.
  void tiled(const std::string& form, int64_t batches, int64_t M, int64_t NC, int64_t KD, const std::string& decode,
             const std::string& a_elem, const std::string& b_elem, const std::string& r, const std::string& c, const std::string& scale,
             const std::string& y_off) {
    // Register blocking: each item computes R x R outputs of a 16R x 16R tile, so that a k step
    // reads 2R values from work-group memory for R^2 multiply-adds (R = 1: two reads per
    // multiply-add, which bounds a 16 x 16 tile by work-group memory bandwidth). Larger tiles
    // leave fewer groups: at batch 1 a 128 x 768 product has 24 tiles of 64 x 64, too few for a
    // GPU of 80-132 SMs even after split-K. So R is the largest of 4, 2, 1 whose grid (after
    // split-K) still holds kMinBlockedGroups groups, unless opt.register_block fixes it.
    auto splits = [&](int64_t grid) {
      if (opt.split_k_groups <= 0 || grid >= opt.split_k_groups) return int64_t(1);
      return std::max<int64_t>(1, std::min<int64_t>((opt.split_k_groups + grid - 1) / grid, KD / kSplitMinK));
    };
    auto grid_of = [&](int r) {
      const int64_t t = int64_t(kTile) * r;
      return batches * ((M + t - 1) / t) * ((NC + t - 1) / t);
    };
    // Tensor cores (opt.tensor_cores, CUDA only): 64 x 64 tiles of fp16 products with fp32
    // accumulation, for products whose grid of such tiles (after split-K) keeps
    // opt.tensor_core_min_groups groups; smaller ones stay on fp32 tiles by shape, which are
    // smaller (on an H200, every product of MobileNetV2 on 64 x 64 tensor-core tiles ran 0.77x).
    const bool tc = opt.tensor_cores && grid_of(4) * splits(grid_of(4)) >= opt.tensor_core_min_groups;
    int R = tc ? 4 : opt.register_block;
    if (R <= 0) {
      R = 1;
      for (int r : {4, 2})
        if (grid_of(r) * splits(grid_of(r)) >= kMinBlockedGroups) {
          R = r;
          break;
        }
    }
    // Tensor-core tiles stage twice the fp32 k tile (fp16 operands: the same bytes), at least 32.
    const int T = kTile * R, KT = tc ? std::max(kTensorMinKTile, 2 * opt.k_tile) : opt.k_tile;
    const int64_t tm = (M + T - 1) / T, tn = (NC + T - 1) / T;
    // Split-K: a grid of fewer groups than opt.split_k_groups, over a long K, splits K into S
    // ranges of at least kSplitMinK; each group writes its partial tile to scratch and a second
    // kernel sums the S partials and runs the epilogue.
    const int64_t S = splits(batches * tm * tn);
    const int64_t KS = (KD + S - 1) / S;  // K per split, rounded up to whole k tiles below
    const int64_t KSt = (KS + KT - 1) / KT * KT;
    k.register_block = R;
    k.tensor_cores = tc;
    k.form = form;
    k.local = kTile * kTile;
    k.groups = batches * tm * tn * S;
    const std::string L = std::to_string(kTile * kTile);
    if (tc) {
      // Operands as fp16 bits, row-major (m, k) and (k, n), rows padded by 8 halves: the mma
      // loads want 32-byte aligned fragments and row strides of whole 16 bytes.
      body << "  NF_LOCAL_ARRAY NF_ALIGN32 u16 Ah[" << T << "][" << KT + 8 << "];\n";
      body << "  NF_LOCAL_ARRAY NF_ALIGN32 u16 Bh[" << KT << "][" << T + 8 << "];\n";
      body << "  NF_LOCAL_ARRAY NF_ALIGN32 float Cs[" << T << "][" << T + 4 << "];\n";
    } else {
      body << "  NF_LOCAL_ARRAY float As[" << KT << "][" << T + 1 << "];\n";
      body << "  NF_LOCAL_ARRAY float Bs[" << KT << "][" << T + 1 << "];\n";
    }
    body << "  const i64 grp = NF_GROUP / " << i64s(S) << ", split = NF_GROUP % " << i64s(S) << ";\n";
    body << "  const i64 tn_ = grp % " << i64s(tn) << ", tq_ = grp / " << i64s(tn) << ";\n";
    body << "  const i64 tm_ = tq_ % " << i64s(tm) << ", bb = tq_ / " << i64s(tm) << ";\n";
    body << "  const int lid = NF_LID, ty = lid / " << kTile << ", tx = lid % " << kTile << ";\n";
    body << decode;
    const std::string RR = std::to_string(R * R), Rs = std::to_string(R);
    if (tc) {
      // 8 warps: warp w computes rows 16 (w / 2) and columns 32 (w % 2) of the tile, as two
      // 16 x 16 accumulator fragments.
      body << "  const int wm = (lid / 32) / 2, wn = (lid / 32) % 2;\n";
      body << "  nf_frag_c c0, c1;\n  nf_mma_zero(&c0);\n  nf_mma_zero(&c1);\n";
    } else {
      body << "  float acc[" << R << "][" << R << "];\n";
      // Every loop over the R x R outputs is one flat unrolled loop, so that acc, a_ and b_ are
      // indexed by constants and live in registers.
      body << "  #pragma unroll\n  for (int ij = 0; ij < " << RR << "; ++ij) acc[ij / " << Rs << "][ij % " << Rs << "] = 0.0f;\n";
    }
    body << "  const i64 k_end = split * " << i64s(KSt) << " + " << i64s(KSt) << " < " << i64s(KD) << " ? split * " << i64s(KSt) << " + "
         << i64s(KSt) << " : " << i64s(KD) << ";\n";
    const std::string cvt_open = tc ? "nf_f2h(" : "", cvt_close = tc ? ")" : "";
    body << "  for (i64 k0 = split * " << i64s(KSt) << "; k0 < k_end; k0 += " << KT << ") {\n";
    body << "    for (int l = lid; l < " << T * KT << "; l += " << L << ") {\n";
    body << "      const int mi = l / " << KT << ", ki = l % " << KT << ";\n";
    body << "      const i64 m = tm_ * " << T << " + mi, kk = k0 + ki;\n";
    body << "      " << (tc ? "Ah[mi][ki]" : "As[ki][mi]") << " = " << cvt_open << "(m < " << i64s(M) << " && kk < k_end) ? (" << a_elem
         << ") : 0.0f" << cvt_close << ";\n    }\n";
    body << "    for (int l = lid; l < " << T * KT << "; l += " << L << ") {\n";
    body << "      const int ki = l / " << T << ", ni = l % " << T << ";\n";
    body << "      const i64 n = tn_ * " << T << " + ni, kk = k0 + ki;\n";
    body << "      " << (tc ? "Bh" : "Bs") << "[ki][ni] = " << cvt_open << "(kk < k_end && n < " << i64s(NC) << ") ? (" << b_elem << ") : 0.0f"
         << cvt_close << ";\n    }\n";
    body << "    NF_SYNC();\n";
    if (tc) {
      body << "    #pragma unroll\n    for (int q = 0; q < " << KT << "; q += 16) {\n";
      body << "      nf_frag_ab fa, fb;\n";
      body << "      nf_mma_load_a(&fa, &Ah[wm * 16][q], " << KT + 8 << ");\n";
      body << "      nf_mma_load_b(&fb, &Bh[q][wn * 32], " << T + 8 << ");\n      nf_mma(&c0, &fa, &fb);\n";
      body << "      nf_mma_load_b(&fb, &Bh[q][wn * 32 + 16], " << T + 8 << ");\n      nf_mma(&c1, &fa, &fb);\n";
      body << "    }\n    NF_SYNC();\n  }\n";
      body << "  nf_mma_store(&Cs[wm * 16][wn * 32], &c0, " << T + 4 << ");\n";
      body << "  nf_mma_store(&Cs[wm * 16][wn * 32 + 16], &c1, " << T + 4 << ");\n  NF_SYNC();\n";
    } else {
      body << "    #pragma unroll\n    for (int q = 0; q < " << KT << "; ++q) {\n";
      body << "      float a_[" << R << "], b_[" << R << "];\n";
      body << "      #pragma unroll\n      for (int i = 0; i < " << R << "; ++i) a_[i] = As[q][ty + " << kTile << " * i];\n";
      body << "      #pragma unroll\n      for (int j = 0; j < " << R << "; ++j) b_[j] = Bs[q][tx + " << kTile << " * j];\n";
      body << "      #pragma unroll\n      for (int ij = 0; ij < " << RR << "; ++ij) acc[ij / " << Rs << "][ij % " << Rs << "] += a_[ij / " << Rs
           << "] * b_[ij % " << Rs << "];\n";
      body << "    }\n    NF_SYNC();\n  }\n";
    }
    // Output (i, j) of this work-item: in registers, or in the tile the fragments were stored to.
    const std::string acc_ij = tc ? "Cs[ty + " + std::to_string(kTile) + " * i][tx + " + std::to_string(kTile) + " * j]" : "acc[i][j]";
    body << "  #pragma unroll\n  for (int ij = 0; ij < " << RR << "; ++ij) {\n";
    body << "      const int i = ij / " << Rs << ", j = ij % " << Rs << ";\n";
    body << "      const i64 m = tm_ * " << T << " + ty + " << kTile << " * i, n = tn_ * " << T << " + tx + " << kTile << " * j;\n";
    if (S == 1) {
      body << "      if (m < " << i64s(M) << " && n < " << i64s(NC) << ")\n" << epilogue(scale + acc_ij, r, c, y_off);
      body << "    }\n";
      return;
    }
    const int64_t outputs = batches * M * NC;
    body << "      if (m < " << i64s(M) << " && n < " << i64s(NC) << ") scratch[(split * " << i64s(batches) << " + bb) * " << i64s(M * NC)
         << " + m * " << i64s(NC) << " + n] = " << acc_ij << ";\n    }\n";
    k.scratch_bytes = S * outputs * int64_t(sizeof(float));
    sum = k;
    sum->name = k.name + "_sum";
    sum->form = form + "_split_sum";
    sum->register_block = 0;
    sum->tensor_cores = false;
    sum->local = kGroup;
    sum->groups = (outputs + kGroup - 1) / kGroup;
    body_sum << "  const i64 gid = NF_GID;\n  if (gid >= " << i64s(outputs) << ") return;\n";
    body_sum << "  const i64 n = gid % " << i64s(NC) << ", m = (gid / " << i64s(NC) << ") % " << i64s(M) << ", bb = gid / " << i64s(M * NC)
             << ";\n";
    body_sum << decode;
    body_sum << "  float acc = 0.0f;\n  for (i64 sp = 0; sp < " << i64s(S) << "; ++sp) acc += scratch[sp * " << i64s(outputs) << " + gid];\n";
    body_sum << epilogue(scale + "acc", r, c, y_off);
  }
  // The split-K sum kernel (same arguments as the main kernel), when tiled() split K.
  std::optional<DeviceKernel> sum;
  std::ostringstream body_sum;

  void gemm() {
    const int64_t M = ip("M"), N = ip("N"), K = ip("K"), batch = ip("batch"), tA = ip("transA"), tB = ip("transB");
    const auto& ao = st.vparams.at("a_off");
    const auto& bo = st.vparams.at("b_off");
    const std::string A = buf(st.anchor_inputs.at(0)), B = buf(st.anchor_inputs.at(1));
    std::ostringstream dec;
    auto table = [&](const char* name, const std::vector<int64_t>& offs) {
      bool affine = true;
      const int64_t step = offs.size() > 1 ? offs[1] - offs[0] : 0;
      for (size_t b = 0; b < offs.size(); ++b) affine = affine && offs[b] == int64_t(b) * step;
      if (affine) {
        dec << "  const i64 " << name << " = bb * " << i64s(step) << ";\n";
        return;
      }
      dec << "  const i64 " << name << "_t[] = {";
      for (size_t b = 0; b < offs.size(); ++b) dec << (b ? "," : "") << offs[b];
      dec << "};\n  const i64 " << name << " = " << name << "_t[bb];\n";
    };
    table("ab", ao);
    table("bb_", bo);
    const std::string a = tA ? A + "[ab + kk * " + i64s(M) + " + m]" : A + "[ab + m * " + i64s(K) + " + kk]";
    const std::string b = tB ? B + "[bb_ + n * " + i64s(K) + " + kk]" : B + "[bb_ + kk * " + i64s(N) + " + n]";
    const double alpha = st.fparams.count("alpha") ? st.fparams.at("alpha") : 1.0;
    tiled("tiled_gemm", batch, M, N, K, dec.str(), a, b, "bb * " + i64s(M) + " + m", "n", alpha == 1.0 ? "" : flt(alpha) + " * ",
          "r * " + i64s(N) + " + c");
  }

  void conv() {
    const int64_t N = ip("N"), C = ip("C"), H = ip("H"), W = ip("W"), K = ip("CO"), KH = ip("KH"), KW = ip("KW"), OH = ip("OH"),
                  OW = ip("OW"), SH = ip("SH"), SW = ip("SW"), PH = ip("PH"), PW = ip("PW"), DH = ip("DH"), DW = ip("DW"), G = ip("G");
    const int64_t Cg = C / G, Kg = K / G, KD = Cg * KH * KW;
    const std::string x = buf(st.anchor_inputs.at(0)), w = buf(st.anchor_inputs.at(1));
    const std::string y_off = "r * " + i64s(OH * OW) + " + c";
    // The input element at channel ci of the group, kernel tap (kh, kw), output pixel (oh, ow);
    // zero in the padding.
    auto x_at = [&](const std::string& nb, const std::string& ch) {
      return "((ih >= 0 && ih < " + i64s(H) + " && iw >= 0 && iw < " + i64s(W) + ") ? " + x + "[((" + nb + " * " + i64s(C) + " + " + ch +
             ") * " + i64s(H) + " + ih) * " + i64s(W) + " + iw] : 0.0f)";
    };
    if (Kg >= kMinTiledRows) {
      std::ostringstream dec;
      dec << "  const i64 nb = bb / " << i64s(G) << ", g = bb % " << i64s(G) << ";\n";
      // B(kk, n): im2col on the fly. Written as a statement expression would not be portable, so
      // the tap decomposition is a helper.
      const std::string helper = k.name + "_im2col";
      std::ostringstream h;
      h << "NF_FN float " << helper << "(NF_GLOBAL const float* " << x << ", i64 nb, i64 g, i64 kk, i64 n) {\n";
      // The tap and pixel decomposition divides by constants per element loaded: in 32 bits where
      // the sizes allow (a 64-bit division is a long instruction sequence on GPUs).
      // Every value computed in 32 bits is bounded: kq < KD, nq < OH * OW, and ih, iw by the
      // last output row/column's taps.
      const int64_t lim = int64_t(1) << 31;
      const bool narrow = KD < lim && OH * OW < lim && OH * SH + (KH - 1) * DH + PH < lim && OW * SW + (KW - 1) * DW + PW < lim &&
                          H < lim && W < lim;
      const std::string ix = narrow ? "int" : "i64", cast = narrow ? "(int)" : "";
      auto lit = [&](int64_t v) { return narrow ? std::to_string(v) : i64s(v); };
      h << "  const " << ix << " kq = " << cast << "kk, nq = " << cast << "n;\n";
      h << "  const " << ix << " ci = kq / " << lit(KH * KW) << ", kr = kq % " << lit(KH * KW) << ", kh = kr / " << lit(KW) << ", kw = kr % "
        << lit(KW) << ";\n";
      h << "  const " << ix << " oh = nq / " << lit(OW) << ", ow = nq % " << lit(OW) << ";\n";
      h << "  const " << ix << " ih = oh * " << lit(SH) << " - " << lit(PH) << " + kh * " << lit(DH) << ", iw = ow * " << lit(SW) << " - "
        << lit(PW) << " + kw * " << lit(DW) << ";\n";
      h << "  return " << x_at("nb", "g * " + i64s(Cg) + " + ci") << ";\n}\n";
      helpers += h.str();
      tiled("implicit_gemm_conv", N * G, Kg, OH * OW, KD, dec.str(), w + "[(g * " + i64s(Kg) + " + m) * " + i64s(KD) + " + kk]",
            helper + "(" + x + ", nb, g, kk, n)", "nb * " + i64s(K) + " + g * " + i64s(Kg) + " + m", "n", "", y_off);
      return;
    }
    const int64_t total = N * K * OH * OW;
    k.form = "direct_conv";
    k.local = kGroup;
    k.groups = (total + kGroup - 1) / kGroup;
    body << "  const i64 gid = NF_GID;\n  if (gid >= " << i64s(total) << ") return;\n";
    body << "  const i64 ow = gid % " << i64s(OW) << ", oh = (gid / " << i64s(OW) << ") % " << i64s(OH) << ";\n";
    body << "  const i64 kc = (gid / " << i64s(OW * OH) << ") % " << i64s(K) << ", nb = gid / " << i64s(OW * OH * K) << ";\n";
    body << "  const i64 g = kc / " << i64s(Kg) << ";\n  float acc = 0.0f;\n";
    body << "  for (i64 ci = 0; ci < " << i64s(Cg) << "; ++ci)\n    for (i64 kh = 0; kh < " << i64s(KH) << "; ++kh) {\n";
    body << "      const i64 ih = oh * " << i64s(SH) << " - " << i64s(PH) << " + kh * " << i64s(DH) << ";\n";
    body << "      if (ih < 0 || ih >= " << i64s(H) << ") continue;\n";
    body << "      for (i64 kw = 0; kw < " << i64s(KW) << "; ++kw) {\n";
    body << "        const i64 iw = ow * " << i64s(SW) << " - " << i64s(PW) << " + kw * " << i64s(DW) << ";\n";
    body << "        if (iw < 0 || iw >= " << i64s(W) << ") continue;\n";
    body << "        acc += " << w << "[((kc * " << i64s(Cg) << " + ci) * " << i64s(KH) << " + kh) * " << i64s(KW) << " + kw] * " << x << "[((nb * "
         << i64s(C) << " + g * " << i64s(Cg) << " + ci) * " << i64s(H) << " + ih) * " << i64s(W) << " + iw];\n";
    body << "      }\n    }\n";
    body << epilogue("acc", "nb * " + i64s(K) + " + kc", "oh * " + i64s(OW) + " + ow", y_off);
  }

  void pool() {
    const int64_t N = ip("N"), C = ip("C"), H = ip("H"), W = ip("W"), OH = ip("OH"), OW = ip("OW"), KH = ip("KH"), KW = ip("KW"),
                  SH = ip("SH"), SW = ip("SW"), PH = ip("PH"), PW = ip("PW"), PH1 = ip("PH1"), PW1 = ip("PW1"), DH = ip("DH"),
                  DW = ip("DW");
    const bool is_max = ip("MAX"), cip = ip("CIP");
    const std::string x = buf(st.anchor_inputs.at(0));
    const int64_t total = N * C * OH * OW;
    k.form = "pool";
    k.local = kGroup;
    k.groups = (total + kGroup - 1) / kGroup;
    body << "  const i64 gid = NF_GID;\n  if (gid >= " << i64s(total) << ") return;\n";
    body << "  const i64 ow = gid % " << i64s(OW) << ", oh = (gid / " << i64s(OW) << ") % " << i64s(OH) << ", rc = gid / " << i64s(OW * OH)
         << ";\n";
    body << "  float acc = " << (is_max ? "-NF_INF" : "0.0f") << ";\n  i64 cnt = 0;\n";
    body << "  for (i64 kh = 0; kh < " << i64s(KH) << "; ++kh) {\n    const i64 ih = oh * " << i64s(SH) << " - " << i64s(PH) << " + kh * "
         << i64s(DH) << ";\n    if (ih < 0 || ih >= " << i64s(H) << ") continue;\n";
    body << "    for (i64 kw = 0; kw < " << i64s(KW) << "; ++kw) {\n      const i64 iw = ow * " << i64s(SW) << " - " << i64s(PW)
         << " + kw * " << i64s(DW) << ";\n      if (iw < 0 || iw >= " << i64s(W) << ") continue;\n";
    body << "      const float xv = " << x << "[(rc * " << i64s(H) << " + ih) * " << i64s(W) << " + iw];\n";
    body << "      acc = " << (is_max ? "op_Max(acc, xv)" : "acc + xv") << ";\n      ++cnt;\n    }\n  }\n";
    if (!is_max) {
      if (cip) {
        body << "  { const i64 h0 = oh * " << i64s(SH) << " - " << i64s(PH) << ", w0 = ow * " << i64s(SW) << " - " << i64s(PW) << ";\n";
        body << "    i64 h1 = h0 + " << i64s((KH - 1) * DH + 1) << ", w1 = w0 + " << i64s((KW - 1) * DW + 1) << ";\n";
        body << "    if (h1 > " << i64s(H + PH1) << ") h1 = " << i64s(H + PH1) << ";\n    if (w1 > " << i64s(W + PW1) << ") w1 = " << i64s(W + PW1)
             << ";\n";
        body << "    cnt = ((h1 - h0 + " << i64s(DH - 1) << ") / " << i64s(DH) << ") * ((w1 - w0 + " << i64s(DW - 1) << ") / " << i64s(DW)
             << ");\n  }\n";
      }
      body << "  acc = cnt ? acc / (float)cnt : 0.0f;\n";
    }
    body << epilogue("acc", "rc", "oh * " + i64s(OW) + " + ow", "r * " + i64s(OH * OW) + " + c");
  }

  // Tree reduction of `val` over the work-group into red[0], read back into `val`.
  std::string group_reduce(const std::string& val, bool is_max) {
    std::ostringstream o;
    o << "  red[lid] = " << val << ";\n  NF_SYNC();\n";
    o << "  for (int s = " << kGroup / 2 << "; s > 0; s >>= 1) {\n    if (lid < s) red[lid] = "
      << (is_max ? "op_Max(red[lid], red[lid + s])" : "red[lid] + red[lid + s]") << ";\n    NF_SYNC();\n  }\n";
    o << "  " << val << " = red[0];\n  NF_SYNC();\n";
    return o.str();
  }

  // Softmax / LayerNorm / Reduce over rows of n contiguous elements: a work-group per row.
  void row_kernel(const std::string& op, int64_t rows, int64_t n, int mode) {
    const std::string x = buf(st.anchor_inputs.at(0));
    k.form = "row_reduction";
    k.local = kGroup;
    k.groups = rows;
    body << "  NF_LOCAL_ARRAY float red[" << kGroup << "];\n";
    body << "  const i64 row = NF_GROUP;\n  const int lid = NF_LID;\n";
    body << "  NF_GLOBAL const float* xr = " << x << " + row * " << i64s(n) << ";\n";
    const std::string each = "for (i64 q = lid; q < " + i64s(n) + "; q += " + std::to_string(kGroup) + ")";
    if (op == "Softmax") {
      body << "  float mx = -NF_INF;\n  " << each << " mx = op_Max(mx, xr[q]);\n" << group_reduce("mx", true);
      body << "  float sum = 0.0f;\n  " << each << " sum += exp(xr[q] - mx);\n" << group_reduce("sum", false);
      body << "  const float inv = 1.0f / sum;\n  " << each << "\n"
           << epilogue("exp(xr[q] - mx) * inv", "row", "q", "r * " + i64s(n) + " + c");
    } else if (op == "LayerNormalization") {
      body << "  float sum = 0.0f;\n  " << each << " sum += xr[q];\n" << group_reduce("sum", false);
      body << "  const float mean = sum / " << flt(double(n)) << ";\n";
      body << "  float sq = 0.0f;\n  " << each << " { const float d = xr[q] - mean; sq += d * d; }\n" << group_reduce("sq", false);
      body << "  const float inv = 1.0f / sqrt(sq / " << flt(double(n)) << " + " << flt(st.fparams.at("eps")) << ");\n";
      body << "  " << each << "\n" << epilogue("(xr[q] - mean) * inv", "row", "q", "r * " + i64s(n) + " + c");
    } else {  // Reduce with inner == 1: one value per row
      body << "  float acc = " << (mode == 2 ? "-NF_INF" : "0.0f") << ";\n  " << each << " acc = "
           << (mode == 2 ? "op_Max(acc, xr[q])" : "acc + xr[q]") << ";\n"
           << group_reduce("acc", mode == 2);
      if (mode == 1) body << "  acc = acc / " << flt(double(n)) << ";\n";
      body << "  if (lid == 0)\n" << epilogue("acc", "row", "0", "r");
    }
  }

  // Softmax / Reduce over a non-last axis, x viewed as [outer, n, inner]: a work-item per
  // (outer, inner) column.
  void column_kernel(const std::string& op, int64_t outer, int64_t n, int64_t inner, int mode) {
    const std::string x = buf(st.anchor_inputs.at(0));
    const int64_t total = outer * inner;
    k.form = "column_reduction";
    k.local = kGroup;
    k.groups = (total + kGroup - 1) / kGroup;
    body << "  const i64 gid = NF_GID;\n  if (gid >= " << i64s(total) << ") return;\n";
    body << "  const i64 o = gid / " << i64s(inner) << ", i = gid % " << i64s(inner) << ";\n";
    body << "  NF_GLOBAL const float* xo = " << x << " + o * " << i64s(n * inner) << " + i;\n";
    const std::string each = "for (i64 q = 0; q < " + i64s(n) + "; ++q)";
    if (op == "Softmax") {
      body << "  float mx = -NF_INF;\n  " << each << " mx = op_Max(mx, xo[q * " << i64s(inner) << "]);\n";
      body << "  float sum = 0.0f;\n  " << each << " sum += exp(xo[q * " << i64s(inner) << "] - mx);\n";
      body << "  const float inv = 1.0f / sum;\n  " << each << "\n"
           << epilogue("exp(xo[q * " + i64s(inner) + "] - mx) * inv", "o * " + i64s(n) + " + q", "i", "r * " + i64s(inner) + " + c");
    } else {
      body << "  float acc = " << (mode == 2 ? "-NF_INF" : "0.0f") << ";\n  " << each << " acc = "
           << (mode == 2 ? "op_Max(acc, xo[q * " + i64s(inner) + "])" : "acc + xo[q * " + i64s(inner) + "]") << ";\n";
      if (mode == 1) body << "  acc = acc / " << flt(double(n)) << ";\n";
      body << epilogue("acc", "o", "i", "r * " + i64s(inner) + " + c");
    }
  }

  // Returns false when the stage has no device form.
  bool print() {
    if (st.kind == StageKind::Elementwise) {
      elementwise();
    } else if (st.kind == StageKind::Anchor && st.kernel_outputs.empty() && st.layout_block <= 0) {
      const std::string& op = st.anchor_op;
      if (st.anchor_output < 0 || m.buffers[size_t(st.anchor_output)].dtype != DType::Float32) return false;
      if (op == "MatMul" || op == "Gemm") gemm();
      else if (op == "Conv") conv();
      else if (op == "Pool") pool();
      else if (op == "Softmax" && st.iparams.count("inner") && ip("inner") > 1) column_kernel(op, ip("outer"), ip("n"), ip("inner"), 0);
      else if (op == "Softmax" || op == "LayerNormalization") row_kernel(op, ip("rows"), ip("n"), 0);
      else if (op == "Reduce" && ip("inner") == 1) row_kernel(op, ip("outer"), ip("red"), int(ip("mode")));
      else if (op == "Reduce") column_kernel(op, ip("outer"), ip("red"), ip("inner"), int(ip("mode")));
      else return false;
    } else {
      return false;
    }
    for (int b : k.buffers) {
      const KBuffer& B = m.buffers[size_t(b)];
      if (B.dynamic || B.row_count >= 0 || B.prepared_by >= 0) return false;
    }
    return true;
  }

  std::string helpers;

  // The kernel (and its split-K sum kernel): every buffer argument, the scratch when K is split,
  // then the status word.
  std::string source() {
    if (sum) sum->buffers = k.buffers;  // the epilogue's buffers were added after the copy
    std::ostringstream o;
    o << helpers;
    auto kernel = [&](const std::string& name, const std::string& text, bool tensor_cores) {
      // Tensor-core tiles hold their fragments and staging loops in up to ~130 registers on
      // sm_70: the bounds keep two 256-thread blocks per SM (128 registers), as the other tiles do.
      o << "NF_KERNEL void " << (tensor_cores ? "NF_TC_BOUNDS " : "") << name << "(";
      for (size_t i = 0; i < k.buffers.size(); ++i) o << "NF_GLOBAL u8* p" << i << ", i64 q" << i << ", ";
      if (k.scratch_bytes) o << "NF_GLOBAL u8* p_scratch, i64 q_scratch, ";
      o << "NF_GLOBAL u8* p_status, i64 q_status, i64 stage_id) {\n";
      for (size_t i = 0; i < k.buffers.size(); ++i) {
        const int b = k.buffers[i];
        const std::string t = type_of(b);
        o << "  NF_GLOBAL " << t << "* b" << i << " = (NF_GLOBAL " << t << "*)(p" << i << " + q" << i << ");\n";
      }
      if (k.scratch_bytes) o << "  NF_GLOBAL float* scratch = (NF_GLOBAL float*)(p_scratch + q_scratch);\n";
      o << "  NF_GLOBAL i32* status = (NF_GLOBAL i32*)(p_status + q_status);\n";
      // Work-group arrays first: OpenCL wants them at the kernel's outermost scope.
      std::string locals, rest;
      std::istringstream lines(text);
      for (std::string line; std::getline(lines, line);) (line.find("NF_LOCAL_ARRAY") != std::string::npos ? locals : rest) += line + "\n";
      o << locals << "  (void)status;\n  (void)stage_id;\n" << rest << "}\n\n";
    };
    kernel(k.name, body.str(), k.tensor_cores);
    if (sum) kernel(sum->name, body_sum.str(), false);
    return o.str();
  }
};

// Whether the stage's members can run one by one with the reference kernels between device
// launches: every value they read is a buffer, a constant or made by an earlier member, and every
// buffer the stage writes is a member's output.
bool host_runnable(const KernelModule& m, const Stage& st, std::string& why) {
  std::set<std::string> made;
  const Graph& g = m.graph;
  for (NodeId id : st.nodes) {
    const Node& n = g.node(id);
    for (auto& v : n.inputs) {
      if (v.empty() || made.count(v) || m.buffer_id(v) >= 0 || g.constant_value(v)) continue;
      why = n.op_type + " " + n.label() + " reads '" + v + "', which only the fused block holds";
      return false;
    }
    for (auto& v : n.outputs) made.insert(v);
  }
  for (int b : stage_written_buffers(m, st)) {
    const std::string& v = m.buffers[size_t(b)].value;
    if (v.empty() || !made.count(v)) {
      why = "it writes a buffer no member outputs";
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<int> stage_written_buffers(const KernelModule& m, const Stage& st) {
  std::vector<int> w = st.outputs;
  for (auto& s : st.stores) w.push_back(s.buffer);
  for (int b : st.kernel_outputs)
    if (b >= 0) w.push_back(b);
  if (st.anchor_output >= 0 && st.primary_store >= 0) w.push_back(st.anchor_output);
  std::sort(w.begin(), w.end());
  w.erase(std::unique(w.begin(), w.end()), w.end());
  for (auto& B : m.buffers)
    if (B.row_count >= 0) w.erase(std::remove(w.begin(), w.end(), B.row_count), w.end());
  return w;
}

bool tensor_cores_for_precision(const std::string& precision) {
  if (precision != "fp32" && precision != "fp16")
    fail(ErrorKind::Invalid, "precision '" + precision + "': expected fp32 or fp16 (--precision, precision=, NNFUSE_DEVICE_PRECISION)");
  return precision == "fp16";
}

DeviceProgram print_device_program(const KernelModule& m, const DeviceProgramOptions& opt) {
  if (opt.register_block != 0 && opt.register_block != 1 && opt.register_block != 2 && opt.register_block != 4)
    fail(ErrorKind::Invalid, "device kernels: register_block " + std::to_string(opt.register_block) + " (expected 0, 1, 2 or 4)");
  if (opt.k_tile != 8 && opt.k_tile != 16 && opt.k_tile != 32)
    fail(ErrorKind::Invalid, "device kernels: k_tile " + std::to_string(opt.k_tile) + " (expected 8, 16 or 32)");
  if (m.layout_block > 0) fail(ErrorKind::Invalid, "device kernels: the module was lowered with blocked layouts; lower with layout_block 0");
  DeviceProgram p;
  std::ostringstream src;
  src << kOps << "\n";
  std::map<std::string, std::string> seen;  // kernel text with its name taken out -> entry point
  for (size_t i = 0; i < m.stages.size(); ++i) {
    const Stage& st = m.stages[i];
    KernelPrinter kp(m, st, opt);
    kp.k.stage = int(i);
    bool ok = false;
    std::string why;
    if (st.kind == StageKind::Fallback) why = "fallback: " + st.fallback_reason;
    else {
      try {
        ok = kp.print();
      } catch (const std::exception& e) {  // Error, or a parameter the lowering did not set (std::out_of_range)
        why = e.what();
      }
      if (!ok && why.empty()) why = "no device form for " + (st.kind == StageKind::Anchor ? st.anchor_op : std::string(stage_kind_name(st.kind)));
    }
    if (ok) {
      // Stages whose kernels differ only in their name (a transformer's layers, a CNN's repeated
      // blocks: buffers are named by argument slot) share the first one's entry point.
      std::string text = kp.source();
      std::string key = text;
      for (size_t at = key.find(kp.k.name); at != std::string::npos; at = key.find(kp.k.name, at)) key.replace(at, kp.k.name.size(), "@K@");
      auto [it, fresh] = seen.emplace(key, kp.k.name);
      if (fresh) src << text;
      else kp.k.name = it->second;
      p.stage_kernels.push_back({int(p.kernels.size())});
      p.kernels.push_back(kp.k);
      if (kp.sum) {
        kp.sum->name = kp.k.name + "_sum";
        p.stage_kernels.back().push_back(int(p.kernels.size()));
        p.kernels.push_back(*kp.sum);
      }
      p.host_reason.push_back("");
      continue;
    }
    std::string blocked;
    if (!host_runnable(m, st, blocked)) {
      fail(ErrorKind::Unsupported, "device kernels: stage " + st.name + " (" + stage_node_list(m.graph, st) + ") has no device form (" + why +
                                       ") and cannot run on the host: " + blocked);
    }
    p.stage_kernels.push_back({});
    p.host_reason.push_back(why);
  }
  p.source = src.str();
  return p;
}

}  // namespace nnfuse::device
