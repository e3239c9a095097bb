#pragma once
// Helpers shared by the structural passes (rewrite/passes_*.cpp); internal to rewrite/.
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "rewrite/pass.h"

namespace nnfuse::passes {

// One registration function per pass file; register_structural_passes() calls them all.
void register_constant_folding_pass();
void register_dce_pass();
void register_cse_pass();
void register_shape_simplification_pass();
void register_fold_batchnorm_pass();
void register_combine_parallel_passes();
void register_fold_transpose_into_gemm_pass();
void register_decompose_attention_pass();
void register_decompose_rms_norm_pass();
void register_decompose_rotary_embedding_pass();
void register_qdq_to_float_pass();

// The value has exactly one consumer and is not a graph output.
bool single_use(const Graph& g, const std::string& v);

// Ops whose results differ run to run: never folded or merged.
bool is_random_op(const Node& n);
// The node carries a subgraph (If/Loop/Scan body): passes leave these alone.
bool has_subgraph(const Node& n);

// Names of this graph that subgraph bodies (If/Loop/Scan, nested too) read without a recorded
// use: passes must not rename, merge away or drop them.
std::set<std::string> names_read_by_subgraphs(const Graph& g);
// The names one node's bodies read from this graph.
std::set<std::string> subgraph_reads(const Node& n);

// After the producer of `from` was removed, makes every reader of `from` read `to` instead.
// Graph outputs keep their names: when `from` is a graph output, the node producing `to` is
// rebuilt to produce `from` (and `to`'s other readers follow). Returns false, changing nothing,
// when that is impossible (`to` is a graph input, initializer or graph output itself); check
// can_redirect() before removing anything.
// (Names are taken by value: callers often pass fields of a node these functions remove.)
bool can_redirect(const Graph& g, const std::string& from, const std::string& to);
void redirect(Graph& g, std::string from, std::string to);

// Removes a node whose output `out` equals its input `in` (Identity-like), keeping output names.
// Returns false (nothing changed) when the output name cannot be kept.
bool bypass_node(Graph& g, NodeId id, std::string in, std::string out);

// Adds an initializer under a fresh name derived from `hint`; returns the name.
std::string add_initializer(Graph& g, const std::string& hint, Tensor t);

// Builds the replacement of one node op by op (the decompose-* passes): every node and value
// gets a fresh name under `base` (the replaced node's name).
struct NodeMaker {
  Graph& g;
  std::string base;
  // Adds node `type` reading `ins`; returns its (single) output.
  std::string operator()(const std::string& type, const std::vector<std::string>& ins, Attributes attrs = {}) const;
  std::string ints(const std::string& hint, const std::vector<int64_t>& v) const;  // a 1-D int64 initializer
  std::string scalar(const std::string& hint, float v) const;                      // a float32 scalar initializer
};

// Runs `apply` on every default-domain node of type `op`, in topological order; counts the nodes
// it rewrote under `pass` in rules_fired and drops the values left without use.
void rewrite_each(PassContext& ctx, const std::string& op, const std::string& pass, const std::function<bool(Graph&, NodeId)>& apply);

// Evaluates a node whose inputs are all constant with its reference kernel; nullopt (and a
// warning in ctx) when the kernel fails or is missing.
std::optional<std::vector<Tensor>> evaluate_constant_node(const Graph& g, NodeId id, PassContext* ctx);

// Replaces a node by initializers holding its results (outputs keep their names).
void replace_by_constants(Graph& g, NodeId id, const std::vector<Tensor>& results);

// Dims that are known, or named by the same non-empty symbol: two such types describe the same
// runtime shape. Unknown anonymous dims never compare equal here.
bool same_runtime_type(const TensorType& a, const TensorType& b);

// Counts nodes other than Constant (the report's op count).
size_t count_ops(const Graph& g);

}  // namespace nnfuse::passes
