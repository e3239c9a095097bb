// qdq-to-float: a DequantizeLinear reading a QuantizeLinear of a float32 activation, both
// per-tensor with constant scale and zero point (the pair onnxruntime.quantization's QDQ format
// writes around every quantized op's inputs and outputs), becomes the same arithmetic in float:
//   y = (Min(Max(Round(x / s_q) + z_q, lo), hi) - z_dq) * s_dq      [lo, hi]: the integer type's range
// Elementwise ops that the planner fuses into the producing block's epilogue, where the pair
// otherwise runs as two reference-kernel stages with an int8 tensor between them. The result is
// the reference's bit for bit: x / s_q is the same float division, Round rounds half to even like
// QuantizeLinear, and the integers involved are exact in float. The weights' DequantizeLinear
// nodes are constant and folded by constant-folding; this pass is for activations.
// Condition: x float32; scales float32 and zero points 8/16-bit integers of the quantized type,
// each one element (rank 0 or 1) and constant; no blocked quantization; the DequantizeLinear's
// output not read by name from an If/Loop/Scan body. The QuantizeLinear stays while other nodes
// read it (dce drops it otherwise).
// One difference: a NaN input. QuantizeLinear's reference kernel clamps it to the type's lowest
// value; the float form's Max and Min propagate NaN, as ONNX's Max and Min do.
#include <cmath>

#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

// A one-element constant of rank 0 or 1 (a per-tensor parameter) as a double, or nullopt.
std::optional<double> scalar_constant(const Graph& g, const std::string& v) {
  if (v.empty()) return std::nullopt;
  const Tensor* t = g.constant_value(v);
  if (!t || t->numel() != 1 || t->rank() > 1) return std::nullopt;
  return t->as_double(0);
}

bool integer_range(DType dt, double& lo, double& hi) {
  switch (dt) {
    case DType::Int8: lo = -128, hi = 127; return true;
    case DType::UInt8: lo = 0, hi = 255; return true;
    case DType::Int16: lo = -32768, hi = 32767; return true;
    case DType::UInt16: lo = 0, hi = 65535; return true;
    default: return false;
  }
}

bool apply(Graph& g, NodeId id, const std::set<std::string>& body_reads) {
  const Node dq = g.node(id);
  if (dq.inputs.size() < 2 || dq.outputs.empty() || dq.outputs[0].empty() || body_reads.count(dq.outputs[0])) return false;
  if (dq.attrs.get_int("block_size", 0) != 0) return false;
  const std::string& q_out = dq.inputs[0];
  const auto producer = g.producer(q_out);
  if (!producer) return false;
  const Node& q = g.node(*producer);
  if (q.op_type != "QuantizeLinear" || !q.domain.empty() || q.inputs.size() < 2) return false;
  if (q.attrs.get_int("block_size", 0) != 0) return false;
  const std::string x = q.inputs[0];
  if (g.type(x).dtype != DType::Float32 || g.type(dq.outputs[0]).dtype != DType::Float32) return false;
  double lo = 0, hi = 0;
  if (!integer_range(g.type(q_out).dtype, lo, hi)) return false;
  const auto s_q = scalar_constant(g, q.inputs[1]), s_dq = scalar_constant(g, dq.inputs[1]);
  if (!s_q || !s_dq || g.type(q.inputs[1]).dtype != DType::Float32 || g.type(dq.inputs[1]).dtype != DType::Float32) return false;
  // An absent zero point is 0; a present one must be a constant.
  const bool has_zq = q.inputs.size() > 2 && !q.inputs[2].empty(), has_zdq = dq.inputs.size() > 2 && !dq.inputs[2].empty();
  const auto z_q = has_zq ? scalar_constant(g, q.inputs[2]) : std::optional<double>(0.0);
  const auto z_dq = has_zdq ? scalar_constant(g, dq.inputs[2]) : std::optional<double>(0.0);
  if (!z_q || !z_dq) return false;
  // Zero points, where given, are of the quantized type (the op's own type check, kept here).
  if ((has_zq && g.type(q.inputs[2]).dtype != g.type(q_out).dtype) || (has_zdq && g.type(dq.inputs[2]).dtype != g.type(q_out).dtype))
    return false;
  const std::string out = dq.outputs[0];
  const NodeMaker op{g, dq.name.empty() ? "qdq" : dq.name};
  std::string v = op("Round", {op("Div", {x, op.scalar("scale", float(*s_q))})});
  if (*z_q != 0) v = op("Add", {v, op.scalar("zero_point", float(*z_q))});
  v = op("Min", {op("Max", {v, op.scalar("qmin", float(lo))}), op.scalar("qmax", float(hi))});
  if (*z_dq != 0) v = op("Sub", {v, op.scalar("zero_point", float(*z_dq))});
  v = op("Mul", {v, op.scalar("scale", float(*s_dq))});
  g.remove_node(id, /*drop_outputs=*/false);
  redirect(g, out, v);
  return true;
}

void run(PassContext& ctx, const PassArgs&) {
  const std::set<std::string> body_reads = names_read_by_subgraphs(ctx.graph());
  rewrite_each(ctx, "DequantizeLinear", "qdq-to-float", [&](Graph& g, NodeId id) { return apply(g, id, body_reads); });
}

}  // namespace

void register_qdq_to_float_pass() {
  register_pass({"qdq-to-float",
                 "QuantizeLinear -> DequantizeLinear pairs on float activations (per-tensor, constant) -> the same arithmetic in float, "
                 "fused into the producer's epilogue",
                 {"shapes"}, {}, false},
                run);
}

}  // namespace nnfuse::passes
