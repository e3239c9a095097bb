// decompose-rotary-embedding: RotaryEmbedding (opset 23) -> Slice, Mul, Sub/Add, Concat (and
// Gather of the caches at position_ids): data movement and elementwise ops the code generator
// lowers, where the op itself has only its reference kernel.
// Condition: float32 X, 4-D [B, H, S, D] or 3-D [B, S, H*D] with num_heads, static head size;
// rotary_embedding_dim even and at most D. Apply: x1, x2 = the halves (or the even and odd
// elements, interleaved) of the first R values of each head; x1' = cos*x1 - sin*x2,
// x2' = sin*x1 + cos*x2 put back in place; the other D - R values pass through.
#include "rewrite/passes_util.h"

namespace nnfuse::passes {
namespace {

bool apply(Graph& g, NodeId id) {
  const Node n = g.node(id);
  if (n.inputs.size() < 3 || n.outputs.empty() || n.outputs[0].empty()) return false;
  const TensorType& x = g.type(n.inputs[0]);
  if (x.dtype != DType::Float32 || !x.has_shape || (x.rank() != 3 && x.rank() != 4) || !x.dims.back().known()) return false;
  for (size_t i = 1; i < 3; ++i)
    if (g.type(n.inputs[i]).dtype != DType::Float32) return false;
  const bool three_d = x.rank() == 3, interleaved = n.attrs.get_int("interleaved", 0) != 0;
  const bool positions = n.inputs.size() > 3 && !n.inputs[3].empty();
  int64_t H = 0, D = x.dims.back().value;
  if (three_d) {
    H = n.attrs.get_int("num_heads", 0);
    if (H <= 0 || D % H) return false;
    D /= H;
  }
  int64_t R = n.attrs.get_int("rotary_embedding_dim", 0);
  if (R == 0) R = D;
  if (R < 2 || R > D || R % 2) return false;
  const int64_t half = R / 2;
  const NodeMaker op{g, n.name.empty() ? "rotary" : n.name};
  auto ints = [&](const std::string& hint, std::vector<int64_t> v) { return op.ints(hint, v); };
  // Values [start, end) step `step` of the last axis.
  auto last = [&](const std::string& v, int64_t start, int64_t end, int64_t step = 1) {
    return op("Slice", {v, ints("starts", {start}), ints("ends", {end}), ints("axes", {-1}), ints("steps", {step})});
  };
  auto axis_attr = [](int64_t a) {
    Attributes at;
    at.set("axis", Attribute::make_int(a));
    return at;
  };
  // X as [B, H, S, D] or [B, S, H, D]; the caches broadcast over the head axis.
  std::string x4 = three_d ? op("Reshape", {n.inputs[0], ints("heads_shape", {0, 0, H, D})}) : n.inputs[0];
  const int64_t head_axis = three_d ? 2 : 1;
  auto cache = [&](const std::string& c) {
    std::string v = positions ? op("Gather", {c, n.inputs[3]}, axis_attr(0)) : c;  // [B, S, R/2]
    return op("Unsqueeze", {v, ints("head_axis", {head_axis})});
  };
  const std::string cs = cache(n.inputs[1]), sn = cache(n.inputs[2]);
  const std::string xr = R < D ? last(x4, 0, R) : x4;
  const std::string x1 = interleaved ? last(xr, 0, R, 2) : last(xr, 0, half);
  const std::string x2 = interleaved ? last(xr, 1, R, 2) : last(xr, half, R);
  const std::string re = op("Sub", {op("Mul", {cs, x1}), op("Mul", {sn, x2})});
  const std::string im = op("Add", {op("Mul", {sn, x1}), op("Mul", {cs, x2})});
  std::string rot;
  if (interleaved) {  // [.., R/2, 2] pairs back to [.., R]
    const std::string pairs = op("Concat", {op("Unsqueeze", {re, ints("pair_axis", {-1})}), op("Unsqueeze", {im, ints("pair_axis", {-1})})},
                                 axis_attr(-1));
    rot = op("Reshape", {pairs, ints("rot_shape", {0, 0, 0, R})});
  } else {
    rot = op("Concat", {re, im}, axis_attr(-1));
  }
  std::string y = R < D ? op("Concat", {rot, last(x4, R, D)}, axis_attr(-1)) : rot;
  if (three_d) y = op("Reshape", {y, ints("out_shape", {0, 0, H * D})});
  const std::string out = n.outputs[0];
  g.remove_node(id, /*drop_outputs=*/false);
  redirect(g, out, y);
  return true;
}

void run(PassContext& ctx, const PassArgs&) {
  if (ctx.graph().opset() < 13) return;  // Unsqueeze and Slice take their axes as inputs (the op is 23+)
  rewrite_each(ctx, "RotaryEmbedding", "decompose-rotary-embedding", apply);
}

}  // namespace

void register_decompose_rotary_embedding_pass() {
  register_pass({"decompose-rotary-embedding", "RotaryEmbedding (opset 23) -> Slice, Mul, Sub/Add, Concat that the code generator lowers",
                 {"shapes"}, {}, false},
                run);
}

}  // namespace nnfuse::passes
