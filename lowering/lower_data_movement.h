#pragma once
// Data-movement, selection and conversion ops lowered to index maps and expressions
// (lower_data_movement.cpp): Gather, Slice, Concat, Tile, Where, comparisons and logical ops,
// Cast between float and integer/bool types; Pad and Resize/Upsample (nearest, linear) in
// lower_resample.cpp. lower.cpp calls these from its expression builder; internal to lowering/.
//
// Expressions compute in float. A value of integer/bool type may appear in an expression only
// where float holds it exactly: a Cast from float (truncated), a comparison or logical result
// (0/1), a bool buffer; or as the operand of a Cast to float, which rounds exactly as loading
// the integer as float does. Anything else (integer arithmetic, integer pass-through) is left to
// the fallback stages.
#include <optional>
#include <string>

#include "lowering/kernel_ir.h"

namespace nnfuse::dm {

// What lower.cpp's expression builder lends (for the stage and block being built).
struct ExprHost {
  virtual ~ExprHost() = default;
  virtual const Graph& graph() const = 0;
  virtual Shape shape_of(const std::string& v) = 0;
  virtual const Tensor* constant(const std::string& v) = 0;  // initializer, Constant or folded
  virtual int buffer_for(const std::string& v) = 0;
  // A new weight buffer holding t (index or weight tables derived at lowering time).
  virtual int weight_buffer(Tensor t) = 0;
  virtual const KBuffer& buffer(int id) const = 0;
  // True when v is computed inside the block (not a buffer read by this stage).
  virtual bool in_block(const std::string& v) const = 0;
  // The expression of value v at map m (the stage's driver index -> v's index).
  virtual int expr_of(const std::string& v, const IndexMap& m) = 0;
  // The same with integer/bool values loaded as float (the operand of a Cast to float).
  virtual int expr_of_as_float(const std::string& v, const IndexMap& m) = 0;
  virtual int push(Expr e) = 0;
  // Part k (0, 1, 2: bits [0, 22), [22, 44), [44, 64)) of integer value v at map m as an exact
  // float: a Load with Expr::part, or a Const for a scalar constant; nullopt when v is computed
  // in the block (its parts are not in a buffer).
  virtual std::optional<int> int_part(const std::string& v, const IndexMap& m, int k) = 0;
  // m followed by s (composing steps where possible).
  virtual IndexMap then(const IndexMap& m, const IndexStep& s) const = 0;
  // Throws the lowering's "no lowering" exception for node n (the block falls back).
  [[noreturn]] virtual void no_lowering(const Node& n, const std::string& why) const = 0;
};

// The expression of output v of node n at map m, or nullopt when n is not lowered here.
std::optional<int> lower_expr(ExprHost& h, const Node& n, const std::string& v, const IndexMap& m);

// Ops lower_expr computes (accepted as members of blocks with no anchor).
bool lowers_op(const std::string& op);
// Ops that are elementwise with numpy broadcasting (valid along an anchor's epilogue).
bool elementwise_op(const std::string& op);
// Ops that only move elements (an integer value read as float stays exact through them).
bool moves_data(const std::string& op);
// Types whose every value float holds exactly (float, bool, 8- and 16-bit integers).
bool exact_dtype(DType d);
// 32/64-bit integers: compared by exact parts (Expr::part), as float would round them.
bool wide_int_dtype(DType d);
// Node n produces a non-float value that the expression holds exactly (so it may be stored
// into its integer/bool buffer): Cast from float, comparisons, logical ops.
bool exact_in_float(const Graph& g, const Node& n);

// Pad (any mode) and Resize/Upsample (nearest, linear) at map m (lower_resample.cpp).
int pad_expr(ExprHost& h, const Node& n, const IndexMap& m);
int resize_expr(ExprHost& h, const Node& n, const IndexMap& m);

// Concat: the window of input i in the output (to = from + offset along the axis).
IndexStep concat_window(const Graph& g, const Node& n, size_t i);

}  // namespace nnfuse::dm
