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
//   Fallback     members run one by one with the reference kernels (ops with no lowering yet).
// Buffers are planned statically into one arena (liveness, reuse, in-place for One-to-One).
#include <cstdint>
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
};

// One step of an index map, taking a multi-index over `from` to one over `to`.
//   Select   to[k] = src[k] < 0 ? 0 : from[src[k]]   (broadcast, transpose, dim insertion)
//   Reshape  to = unlinearize(linearize(from, from_shape), to_shape)
//   Affine   to[k] = from[k] * stride[k] + offset[k] (pooling windows, slices; unused for now)
struct IndexStep {
  enum Kind { Select, Reshape, Offset } kind = Select;
  Shape from, to;
  std::vector<int> src;      // Select
  std::vector<int64_t> off;  // Offset: to[k] = from[k] + off[k] (a Split/Slice window)
};

struct IndexMap {
  Shape domain;                 // the index space it is evaluated on
  std::vector<IndexStep> steps;
  Shape codomain() const { return steps.empty() ? domain : steps.back().to; }
  bool is_identity() const;
  std::vector<int64_t> apply(std::vector<int64_t> idx) const;
  int64_t offset(const std::vector<int64_t>& idx) const;  // row-major offset in codomain
  std::string str() const;
};

// How a load (or store) walks memory over a stage's rows x width view:
// offset(r, c) = r * row_stride + c * col_stride when affine, else computed by the map.
struct Access {
  bool affine = false;
  int64_t base = 0, row_stride = 0, col_stride = 0;  // offset = base + r*row_stride + c*col_stride
};

struct Expr {
  enum Kind { Load, Const, Unary, Binary, Clip, AnchorValue } kind = Const;
  std::string op;          // Unary/Binary op name ("Relu", "Add", ...)
  std::vector<int> args;   // indices into the stage's expression pool
  int buffer = -1;         // Load
  IndexMap map;            // Load: from the stage's driver index to the buffer's index
  Access access;           // Load
  double value = 0;        // Const
  double lo = 0, hi = 0;   // Clip bounds; LeakyRelu/HardSigmoid/Elu parameters
};

struct Store {
  int buffer = -1;
  int expr = -1;
  IndexMap map;   // driver index -> buffer index (identity for elementwise stages)
  Access access;
};

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
  int anchor_output = -1;                // the buffer the anchor kernel writes (its own layout)
  int primary_store = -1;                // the store whose value the kernel writes there, or -1
                                         // (then anchor_output is scratch and stores scatter)
  // Fallback
  std::string fallback_reason;
  std::vector<int> inputs, outputs;      // buffers read / written (all kinds)
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
  int buffer_id(const std::string& value) const;  // -1 if none
  nlohmann::json summary() const;
};

struct LowerOptions {
  bool allow_inplace = true;
  bool fuse_epilogues = true;
};

// Lowers an optimized graph (static shapes) and its fusion plan. Every block becomes stages;
// blocks with an op that has no lowering become Fallback stages. Throws Shape naming the value
// when a shape is not static (bind dims with --shape).
KernelModule lower_module(const Graph& g, const FusionPlan& plan, const LowerOptions& opt = {});

// A plan with one block per operator (used when no fusion plan exists).
FusionPlan singleton_plan(const Graph& g);

// Classifies a map over a rows x width view (exhaustive on the index space when needed).
Access classify_access(const IndexMap& m, int64_t rows, int64_t width);

}  // namespace nnfuse
