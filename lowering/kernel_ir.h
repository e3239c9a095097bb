#pragma once
// The kernel IR: a fused block lowered to target-neutral stages over buffers.
//
// A block becomes one or more stages (one entry point each, all tagged with the block's id):
//   Elementwise  a loop over an output index space (the "driver" shape, viewed as rows x width);
//                every stored value is an expression tree whose leaves load buffers through index
//                maps. Reorganize/Shuffle members are index maps (no copy), One-to-Many members
//                are broadcast maps (stride 0), One-to-One members are expression nodes.
//   Anchor       a Many-to-Many computation (Conv, MatMul/Gemm, pooling, Softmax, LayerNorm,
//                reductions). Its output element, at (row, col) of the output's rows x width view,
//                feeds the epilogue: the expression trees of the members after it, stored through
//                forward index maps (so Reshape/Transpose after a MatMul scatter in place). When
//                the members after it cannot be an epilogue, the anchor output is materialised
//                and an Elementwise stage follows. Members feeding the anchor (prologue) are an
//                Elementwise stage writing the anchor's input.
//   Anchor "Attention" (a block whose FusionBlock::pattern is "attention"): softmax(score(Q Kt)) V
//                as one kernel (kernels/microkernels/attention.h). Its expression pool holds two
//                parts: exprs [0, score_exprs) are the score transform (the members between the
//                two MatMuls), evaluated on the scores' rows x score_width view with AnchorValue =
//                a raw score and value score_expr; the rest is the epilogue after MatMul(p, V) on
//                the output's rows x width view, as for any anchor. Both views have the same rows.
//   Fallback     members run one by one with the reference kernels (ops with no lowering yet).
// Buffers are planned statically into one arena (liveness, reuse, in-place for One-to-One).
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fusion/planner.h"
#include "graph/graph.h"

namespace nnfuse {

enum class BufferKind { Input, Output, Weight, Activation };
const char* buffer_kind_name(BufferKind k);

struct KBuffer {
  int id = 0;
  std::string value;        // the graph value it holds ("" for derived weights)
  DType dtype = DType::Float32;
  Shape shape;
  BufferKind kind = BufferKind::Activation;
  int64_t bytes = 0;
  Tensor data;              // Weight: the constant data
  // Memory plan (Activation only): byte offset in the arena; live from stage `first` to `last`.
  int64_t offset = -1;
  int first = -1, last = -1;
  int inplace_of = -1;      // the buffer whose storage it reuses in place, or -1
  bool dynamic = false;     // shape known only at run time (data-dependent): fallback stages only
  int prepared_by = -1;     // a slot filled at load time by that stage's prepare entry point
                            // (e.g. GEMM weights packed once); no storage of its own
  int layout_block = 0;     // 0: row-major (NCHW). c > 0: a 4-D [N, C, H, W] activation stored
                            // blocked NCHW<c>c, i.e. [N, ceil(C/c), H, W, c] (lowering/layout.cpp)
  // A capacity buffer (NonMaxSuppression's selected rows): `shape` is a static upper bound of a
  // data-dependent leading dim; the stage writing it stores the actual row count as one int64
  // in buffer `row_count` (kind Output, so it outlives the arena), and readers use that many rows.
  int row_count = -1;
};

// One step of an index map, taking a multi-index over `from` to one over `to`.
//   Select   to[k] = src[k] < 0 ? 0 : from[src[k]]   (broadcast, transpose, dim insertion)
//   Reshape  to = unlinearize(linearize(from, from_shape), to_shape)
//   Offset   to[k] = from[k] * stride[k] + off[k] (Split/Concat windows, Slice; stride empty: 1)
//   Gather   to = from with dims [axis, axis + q) replaced by one dim, read from an integer
//            buffer: to[axis] = index[linearized from[axis .. axis + q)] (+ to[axis] if negative);
//            an index out of range is reported at run time (Gather, lower_data_movement.cpp)
struct IndexStep {
  enum Kind { Select, Reshape, Offset, Gather } kind = Select;
  Shape from, to;
  std::vector<int> src;      // Select
  std::vector<int64_t> off;  // Offset: to[k] = from[k] * stride[k] + off[k]
  std::vector<int64_t> stride;
  int axis = 0, q = 0;       // Gather: the data axis; the index buffer's rank
  int index_buffer = -1;     // Gather: the integer buffer holding the indices (shape from[axis..axis+q))
};

struct IndexMap {
  Shape domain;                 // the index space it is evaluated on
  std::vector<IndexStep> steps;
  Shape codomain() const { return steps.empty() ? domain : steps.back().to; }
  bool is_identity() const;
  std::vector<int> index_buffers() const;  // buffers read by Gather steps (data-dependent maps)
  std::vector<int64_t> apply(std::vector<int64_t> idx) const;  // throws on a Gather step
  int64_t offset(const std::vector<int64_t>& idx) const;  // row-major offset in codomain
  std::string str() const;
};

// How a load (or store) walks memory over a stage's rows x width view:
// offset(r, c) = r * row_stride + c * col_stride when affine, else computed by the map.
struct Access {
  bool affine = false;
  int64_t base = 0, row_stride = 0, col_stride = 0;  // offset = base + r*row_stride + c*col_stride
  // In a blocked stage (Stage::layout_block = c > 0, driver [N, C, H, W] viewed as rows n*Cb + cb,
  // cols (h*W + w)*c + lane): offset = base + n*bn + cb*bcb + h*bh + w*bw + lane*blane (base: a
  // window's start, e.g. a channel Split's first block); `masked` when
  // the buffer is plain and lanes past C must not be touched.
  bool blocked = false, masked = false;
  int64_t bn = 0, bcb = 0, bh = 0, bw = 0, blane = 0;
};

// A load a vector can make: contiguous (column stride 1) or a broadcast (0) along the row.
inline bool vectorizable_load(const Access& a) { return a.affine && (a.col_stride == 0 || a.col_stride == 1); }

struct Expr {
  enum Kind { Load, Const, Unary, Binary, Clip, AnchorValue, Where } kind = Const;  // Where: args cond, x, y
  std::string op;          // Unary/Binary op name ("Relu", "Add", ...)
  std::vector<int> args;   // indices into the stage's expression pool
  int buffer = -1;         // Load
  IndexMap map;            // Load: from the stage's driver index to the buffer's index
  Access access;           // Load
  double value = 0;        // Const
  double lo = 0, hi = 0;   // Clip bounds; LeakyRelu/HardSigmoid/Elu parameters
  // Load of a 32/64-bit integer buffer: -1 loads the value as float; 0, 1, 2 load its bits
  // [0, 22), [22, 44) and [44, 64) (the last signed for signed types), each exact in float, so
  // that wide integers compare exactly (lower_data_movement.cpp, wide_int_compare).
  int part = -1;
};

struct Store {
  int buffer = -1;
  int expr = -1;
  IndexMap map;   // driver index -> buffer index (identity for elementwise stages)
  Access access;
  // A column window (a MatMul/Gemm epilogue storing one output of a Split of the anchor's last
  // axis; no other stage kind takes windows):
  // the store applies only to the stage's columns c in [window_lo, window_hi), at map(r, c -
  // window_lo); map's domain and access then cover the window (rows x (hi - lo)), not the driver.
  // window_hi < 0: no window. Lowering makes windows only where the stage's width is the driver's
  // last dim, and emitters vectorize them only when lo and hi are multiples of 16.
  int64_t window_lo = 0, window_hi = -1;
  bool windowed() const { return window_hi >= 0; }
  int64_t width_in(int64_t stage_width) const { return windowed() ? window_hi - window_lo : stage_width; }
};
// Window boundaries vector stores may assume: every vector width divides it.
constexpr int64_t kStoreWindowAlign = 16;

enum class StageKind { Elementwise, Anchor, Fallback };
const char* stage_kind_name(StageKind k);

struct Stage {
  StageKind kind = StageKind::Elementwise;
  int block = -1;
  std::string name;              // entry point suffix, unique
  std::vector<NodeId> nodes;     // members computed by this stage
  std::string mapping;           // the block's mapping type
  double flops = 0;
  // The driver index space and its rows x width view.
  Shape driver;
  int64_t rows = 1, width = 1;
  std::vector<Expr> exprs;
  std::vector<Store> stores;
  bool vectorizable = false;     // every load/store has col stride 0 or 1 (store: 1)
  // Anchor
  NodeId anchor = kNoNode;
  std::string anchor_op;                 // "MatMul", "Conv", "MaxPool", ...
  std::vector<int> anchor_inputs;        // buffers (-1 absent)
  std::map<std::string, int64_t> iparams;
  std::map<std::string, std::vector<int64_t>> vparams;
  std::map<std::string, double> fparams;
  int prepared = -1;                     // buffer slot of data prepared at load time, or -1
  // Weight buffers (anchor inputs) that only the prepare entry point reads: the stage body uses
  // the packed slot instead (GEMM B, NCHWc conv weights, LSTM W/R). Once every stage is
  // prepared the runtime may free them when no other stage reads them (CpuModel, docs/codegen.md).
  std::vector<int> prepare_only;
  int anchor_output = -1;                // the buffer the anchor kernel writes (its own layout)
  int primary_store = -1;                // the store whose value the kernel writes there, or -1
                                         // (then anchor_output is scratch and stores scatter)
  // Kernel-only anchors (LSTM, NonMaxSuppression: lowering/lower_kernel_ops.h) write these
  // buffers directly, with no epilogue; -1 entries are absent optional outputs.
  std::vector<int> kernel_outputs;
  // Attention (see the header comment): the score transform's part of `exprs` and its value.
  int score_exprs = 0;
  int score_expr = -1;
  int64_t score_width = 0;
  // Fallback
  std::string fallback_reason;
  std::vector<int> inputs, outputs;      // buffers read / written (all kinds)
  int layout_block = 0;                  // c > 0: runs in the blocked NCHW<c>c view (layout.cpp)
};

struct KernelModule {
  std::string model_name;
  int64_t opset = 0;
  std::vector<KBuffer> buffers;
  std::vector<Stage> stages;
  std::vector<std::pair<std::string, int>> graph_inputs;   // name -> buffer
  std::vector<std::pair<std::string, int>> graph_outputs;  // name -> buffer
  Graph graph;            // the graph the plan refers to (fallback stages run its nodes)
  int blocks = 0, fallback_blocks = 0;
  int folded_blocks = 0;  // blocks reading only constants, evaluated at lowering time
  std::vector<std::string> fallback_ops;  // op types that made blocks fall back
  int64_t arena_bytes = 0;        // peak activation memory (the arena)
  int64_t naive_bytes = 0;        // every activation in its own allocation
  int inplace_count = 0;
  int layout_block = 0;            // the block size layouts were chosen with (0: NCHW forced)
  int reorder_stores = 0;          // layout changes folded into stage loads/stores
  std::string conv_algorithm = "auto";  // the mode conv algorithms were chosen with
  bool int8_dot = false;                 // lowered with LowerOptions::int8_dot (an artifact records it)
  // Per fused block ("b12"), when the choice was measured (kernels/conv_probe.h): microseconds
  // per algorithm on this machine and where they came from ("measured" or "cache").
  nlohmann::json conv_timings = nlohmann::json::object();
  int buffer_id(const std::string& value) const;  // -1 if none
  nlohmann::json summary() const;
};

struct LowerOptions {
  bool allow_inplace = true;
  bool fuse_epilogues = true;
  // Channel block for the NCHW<c>c layout (the target's float vector width: 16 AVX-512, 8 AVX2,
  // 4 NEON); 0 keeps every buffer NCHW. CpuModel resolves -1 from the target ($NNFUSE_LAYOUT=nchw
  // forces 0); lower_module treats -1 as 0.
  int layout_block = -1;
  // Convolution algorithm for blocked dense convs (conv_algorithm.cpp): "auto" (cost model),
  // "direct", "winograd" or "winograd2" (F(4x4) / F(2x2) for every applicable conv). CpuModel
  // reads $NNFUSE_CONV_ALGO.
  std::string conv_algorithm = "auto";
  // The target multiplies unsigned by signed bytes into int32 (AVX-512 VNNI): dense blocked convs
  // and MatMul/Gemm of a quantized model run on int8 kernels (int8_kernels.cpp, kernels/microkernels/conv_int8.h, gemm_int8.h).
  // CpuModel sets it for a host with VNNI ($NNFUSE_INT8=0 turns it off).
  bool int8_dot = false;
};

// Lowers an optimized graph (static shapes) and its fusion plan. Every block becomes stages;
// blocks with an op that has no lowering become Fallback stages. Throws Shape naming the value
// when a shape is not static (bind dims with --shape).
KernelModule lower_module(const Graph& g, const FusionPlan& plan, const LowerOptions& opt = {});

// "Gather embeddings.word, Add Add_3": a stage's members, for messages and reports about it.
std::string stage_node_list(const Graph& g, const Stage& st);

// A plan with one block per operator (used when no fusion plan exists).
FusionPlan singleton_plan(const Graph& g);

// Layout assignment (layout.cpp): after the stages exist and before the memory plan, picks per
// activation buffer NCHW or NCHW<block>c and rewrites the stages that run blocked.
void assign_layouts(KernelModule& mod, int block);
// "NCHW" or "NCHW16c" for a buffer / a stage.
std::string layout_name(int block);
// The report's "layout" object: block size, blocked stages/buffers, folded reorders, and the
// layout each fused block runs in.
nlohmann::json layout_summary(const KernelModule& mod);

// Convolution algorithm per Conv stage (conv_algorithm.cpp), in Stage::iparams["ALGO"]; runs
// after assign_layouts. mode: "auto" (cost model), "direct", "winograd" (F(4x4,3x3) for every
// applicable conv), "winograd2" (F(2x2,3x3) for every applicable conv). kConvInt8 is set after
// it, by choose_int8_kernels.
constexpr int64_t kConvDirect = 0, kConvWinogradF4x4 = 1, kConvWinogradF2x2 = 2, kConvInt8 = 3;
void choose_conv_algorithms(KernelModule& mod, const std::string& mode);
// Int8 kernels (int8_kernels.cpp). Whether a Conv stage can run on the int8 kernel: dense, NCHW16c, its input the float form of a
// QuantizeLinear -> DequantizeLinear pair of an 8-bit type (rewrite/passes_qdq_to_float.cpp) and
// its weights int8 (channel k: integers in [-127, 127] times max|w_k| / multipliers[k]). Fills
// scale (s_x), offset (B) and multipliers as conv_int8.h defines them.
bool conv_int8_applicable(const KernelModule& mod, const Stage& st, double& scale, int64_t& offset, std::vector<int64_t>& multipliers);
// The same for a MatMul / Gemm stage (gemm_int8.h): B a packed weight on an int8 grid per column,
// A quantized, not transposed, its batch elements contiguous.
bool gemm_int8_applicable(const KernelModule& mod, const Stage& st, double& scale, int64_t& offset, std::vector<int64_t>& multipliers);
// The int8 kernels of a quantized model, chosen after choose_conv_algorithms (lower_module, from
// LowerOptions::int8_dot; sets KernelModule::int8_dot). With int8_dot, the Conv stages that
// conv_int8_applicable admits run on the int8 kernel (iparams["ALGO"] = kConvInt8), whatever the
// conv mode, and the MatMul / Gemm stages that gemm_int8_applicable admits on gemm_int8
// (iparams["INT8"] = 1); both then hold the input's quantization in fparams["XSCALE"] and
// iparams["XOFFSET"] and the weights' grid in vparams["WMULT"].
void choose_int8_kernels(KernelModule& mod, bool int8_dot);
// The report's "int8_kernels" object: {enabled (lowered with int8_dot), convs, gemms, blocks:
// {"b3": "conv" | "gemm"}}.
nlohmann::json int8_summary(const KernelModule& mod);
// "direct_nchwc", "winograd_f4x4_3x3", "winograd_f2x2_3x3", "int8_vnni_nchwc", "depthwise_nchwc", "grouped_nchwc", "im2col_gemm",
// "depthwise"; "" for a stage that is not a Conv anchor.
std::string conv_algorithm_name(const Stage& st);
// A Conv stage with one channel per group (group == C == K): the lane-wise depthwise kernel when
// blocked. Other group counts above 1 are grouped convs (layout.cpp, grouped_conv_blocks).
bool conv_stage_depthwise(const Stage& st);
std::string conv_algorithm_name(int64_t algo);  // of kConvDirect / kConvWinograd*
// The algorithms a stage can run (kConvDirect first, then the Winograd variants whose scratch
// stays bounded); empty when it has no choice. What a measurement picks from.
std::vector<int64_t> conv_algorithm_candidates(const Stage& st);
// The report's "conv_algorithms" object: the mode, counts per algorithm and each block's choice.
nlohmann::json conv_algorithm_summary(const KernelModule& mod);

// Index step constructors (index_map.cpp).
IndexStep select_step(const Shape& from, const Shape& to, std::vector<int> src);
IndexStep reshape_step(const Shape& from, const Shape& to);
IndexStep offset_step(const Shape& from, const Shape& to, std::vector<int64_t> off, std::vector<int64_t> stride = {});
// numpy broadcasting as an index step: output index over `out` -> input index over `in` (size-1
// and missing leading dims read index 0).
IndexStep broadcast_step(const Shape& out, const Shape& in);

// Classifies a map over a rows x width view (exhaustive on the index space when needed).
Access classify_access(const IndexMap& m, int64_t rows, int64_t width);

// A map that is not affine over rows x width may still be separable: when no step mixes the
// column dims (the trailing domain dims spanning `width`) with the row dims, offset(r, c) =
// offset(r, 0) + col[c] with col[c] = offset(0, c) - offset(0, 0). The emitter then computes
// the row part once per row and the column part once (kernels/emit_cpp.cpp, docs/codegen.md).
struct ColumnSplit {
  bool separable = false;
  // col depends on an index buffer that is not a constant (read at run time, per call).
  bool col_dynamic = false;
  std::vector<int64_t> col;  // col[c] for c in [0, width) when !col_dynamic
  bool col_affine = false;   // col[c] == c * col_stride
  int64_t col_stride = 0;
};
// `constant_index(b)`: the data of index buffer b when it is a constant, else null. A constant
// Gather table with an index out of range makes the column part dynamic (the run-time check
// reports it).
ColumnSplit split_columns(const IndexMap& m, int64_t width, const std::function<const Tensor*(int)>& constant_index);
// Whether offset(r, c) == offset(r, 0) + c * col_stride for every row r and column c < width of
// the map's domain viewed as rows x width (maps without Gather; checked exhaustively on index
// spaces up to 2^22 elements). Catches what split_columns's dependency analysis cannot: a
// Reshape merging a row dim with the column dim ([seq, heads, d] -> [seq, heads * d]).
bool columns_affine(const IndexMap& m, int64_t width, int64_t col_stride);
// Whether, over a rows x width view of m's domain, offset(r, c) = offset(r, 0) + tab[c / chunk] +
// c % chunk: every aligned run of `chunk` columns is contiguous and the runs' placement is the same
// on every row (a [rows, heads * d] output stored as [heads, rows, d] with d a multiple of chunk).
// Fills tab (ceil(width / chunk) entries). False for Gather maps and domains past 2^22 elements.
bool columns_chunked(const IndexMap& m, int64_t width, int64_t chunk, std::vector<int64_t>& tab);
// Whether, over a rows x width view of m's domain, offset(r, 0) = base + r * row_stride for every
// row (the row part of a separable map is then one multiply, not the map's divisions). False for
// Gather maps and domains past 2^22 elements.
bool rows_affine(const IndexMap& m, int64_t width, int64_t& base, int64_t& row_stride);

}  // namespace nnfuse
