// RotaryEmbedding (opset 23): rotary position embeddings as LLM exports write them.
// Reference kernel only; the rewriter and the code generator see it as one Many-to-Many op.
#include <cmath>
#include <string>
#include <vector>

#include "graph/ops_nn_internal.h"

namespace nnfuse::nn {

namespace {

// X [B, H, S, D] (4-D) or [B, S, H*D] (3-D, num_heads given); cos/sin caches [B, S, R/2], or
// [max_position + 1, R/2] read at position_ids [B, S]. The first R = rotary_embedding_dim (0: D)
// values of each head rotate, as halves (x1 = [0, R/2), x2 = [R/2, R)) or interleaved pairs
// (x1 = even, x2 = odd): x1' = cos*x1 - sin*x2, x2' = sin*x1 + cos*x2. The rest pass through.
template <class T>
std::vector<Tensor> rotary_typed(const KernelContext& c, const std::vector<const Tensor*>& in) {
  const Tensor& X = *in[0];
  const Tensor& cosc = *in[1];
  const Tensor& sinc = *in[2];
  const Tensor* pos = in.size() > 3 ? in[3] : nullptr;
  const bool interleaved = c.node.attrs.get_int("interleaved", 0) != 0;
  int64_t B, S, H, D;
  int64_t sb, ss, sh;  // element strides of batch, position and head; the head's values are contiguous
  if (X.rank() == 4) {
    B = X.dim(0), H = X.dim(1), S = X.dim(2), D = X.dim(3);
    sb = H * S * D, sh = S * D, ss = D;
  } else if (X.rank() == 3) {
    H = c.node.attrs.get_int("num_heads", 0);
    if (H <= 0 || X.dim(2) % H != 0)
      c.error("3-D input " + shape_str(X.shape()) + " needs num_heads dividing its last dim (num_heads " + std::to_string(H) + ")");
    B = X.dim(0), S = X.dim(1), D = X.dim(2) / H;
    sb = S * H * D, ss = H * D, sh = D;
  } else {
    c.error("input must be 3-D or 4-D, got " + shape_str(X.shape()));
  }
  int64_t R = c.node.attrs.get_int("rotary_embedding_dim", 0);
  if (R == 0) R = D;
  if (R < 0 || R > D || R % 2 != 0) c.error("rotary_embedding_dim " + std::to_string(R) + " must be even and at most the head size " + std::to_string(D));
  const int64_t half = R / 2;
  if (cosc.shape() != sinc.shape()) c.error("cos_cache " + shape_str(cosc.shape()) + " and sin_cache " + shape_str(sinc.shape()) + " differ");
  if (cosc.rank() < 1 || cosc.dim(cosc.rank() - 1) != half)
    c.error("the caches' last dim must be rotary_embedding_dim / 2 = " + std::to_string(half) + ", got " + shape_str(cosc.shape()));
  if (pos) {
    if (pos->dtype() != DType::Int64) c.error(std::string("position_ids must be int64, not ") + dtype_name(pos->dtype()));
    if (pos->rank() != 2 || pos->dim(0) != B || pos->dim(1) != S)
      c.error("position_ids " + shape_str(pos->shape()) + " must be [" + std::to_string(B) + ", " + std::to_string(S) + "]");
    if (cosc.rank() != 2) c.error("with position_ids the caches must be 2-D [positions, " + std::to_string(half) + "], got " + shape_str(cosc.shape()));
  } else if (cosc.rank() != 3 || cosc.dim(0) != B || cosc.dim(1) != S) {
    c.error("without position_ids the caches must be [" + std::to_string(B) + ", " + std::to_string(S) + ", " + std::to_string(half) + "], got " +
            shape_str(cosc.shape()));
  }
  const std::vector<float> cv = cosc.to_float_vector(), sv = sinc.to_float_vector();
  Tensor Y = X.clone();
  const T* x = X.data<T>();
  T* y = Y.data<T>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      int64_t row = b * S + s;
      if (pos) {
        row = pos->as_int(b * S + s);
        if (row < 0 || row >= cosc.dim(0))
          c.error("position_ids[" + std::to_string(b) + ", " + std::to_string(s) + "] = " + std::to_string(row) + " is outside the caches' " +
                  std::to_string(cosc.dim(0)) + " positions");
      }
      const float* cr = cv.data() + row * half;
      const float* sr = sv.data() + row * half;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = b * sb + s * ss + h * sh;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
          const T x1 = x[base + i1], x2 = x[base + i2], cs = T(cr[i]), sn = T(sr[i]);
          y[base + i1] = T(cs * x1 - sn * x2);
          y[base + i2] = T(sn * x1 + cs * x2);
        }
      }
    }
  return {Y};
}

}  // namespace

void register_nn_rotary_ops(OpRegistry& r) {
  OpSchema s = nn_schema("RotaryEmbedding", 23, 3, 4, 1, 1);
  s.infer = [](const InferContext& c) {
    // position_ids is tensor(int64) in the spec; the kernel reads any integer, but the passes that
    // rewrite the op (decompose-rotary: a Gather at these indices) and other runtimes do not.
    if (c.has_input(3) && c.input(3).dtype != DType::Int64)
      c.error(std::string("position_ids must be int64, not ") + dtype_name(c.input(3).dtype));
    return infer_one(c.input(0));
  };
  s.kernel = [](const KernelContext& c) {
    return float_kernel(c, [&](auto tag, const std::vector<const Tensor*>& in) {
      using T = decltype(tag);
      return rotary_typed<T>(c, in);
    });
  };
  s.flops = [](const Node&, const std::vector<TensorType>& ins, const std::vector<TensorType>&) { return 3 * numel_or0(ins[0]); };
  r.add(std::move(s));
}

}  // namespace nnfuse::nn
