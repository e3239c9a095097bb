#pragma once
// Internals shared by the nn op family (ops_nn*.cpp): the float GEMM the heavy kernels are built
// on, dtype dispatch for "compute in float" kernels, and small inference helpers.
//
// FLOP convention of the family (what OpSchema::flops returns): one multiply-add counts as 2.
//   MatMul/Gemm/MatMulInteger/Einsum-as-GEMM: 2*M*N*K (per batch); Conv: 2 * out_elems * (Cin/group) *
//   prod(kernel); ConvTranspose: 2 * in_elems * (Cout/group) * prod(kernel); pooling: out_elems *
//   prod(kernel) (global pools: input elements); reductions, ArgMax/ArgMin, CumSum: input elements;
//   Softmax/LogSoftmax/Hardmax: 5 per element; Layer/Instance/Group/MeanVariance normalisation: 8 per
//   element; BatchNormalization (inference, a per-channel multiply-add): 2 per element; LRN:
//   (2*size + 4) per element; Quantize/Dequantize: 2 per element; ConvInteger/QLinearConv and
//   QLinearMatMul as Conv and MatMul. Unknown shapes count 0.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/ops_common.h"

namespace nnfuse::nn {

// The schema skeleton every nn op starts from: opsets [since, 28], arity bounds, family "nn";
// Many-to-Many unless told otherwise (Quantize/Dequantize are One-to-One).
inline OpSchema nn_schema(const std::string& name, int since, int min_in, int max_in, int min_out = 1, int max_out = 1,
                          MappingType mapping = MappingType::ManyToMany) {
  OpSchema s;
  s.name = name;
  s.since = since;
  s.until = 28;
  s.min_inputs = min_in;
  s.max_inputs = max_in;
  s.min_outputs = min_out;
  s.max_outputs = max_out;
  s.mapping = mapping;
  s.family = "nn";
  return s;
}

// C[M,N] = A·B (or C += A·B when `accumulate`). A and B are addressed through element strides
// (row stride, column stride), so transposed operands cost nothing to express; C is row-major with
// leading dimension ldc. Cache-blocked and packed; may split the output over 2 threads (rows or
// columns, never the reduction), so results do not depend on the thread count.
void sgemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t b_rs,
           int64_t b_cs, float* C, int64_t ldc, bool accumulate);

// The same contract for other element types (double, integers): a plain i-k-j loop.
template <class T>
void gemm_generic(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                  int64_t b_cs, T* C, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    if (!accumulate)
      for (int64_t j = 0; j < N; ++j) c[j] = T(0);
    for (int64_t k = 0; k < K; ++k) {
      T a = A[i * a_rs + k * a_cs];
      const T* b = B + k * b_rs;
      for (int64_t j = 0; j < N; ++j) c[j] += a * b[j * b_cs];
    }
  }
}

template <class T>
inline void gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
                 int64_t b_cs, T* C, int64_t ldc, bool accumulate) {
  if constexpr (std::is_same_v<T, float>)
    sgemm(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate);
  else
    gemm_generic<T>(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate);
}

// Runs f(tag, inputs) where tag is float (float32, and float16/bfloat16 converted in and out) or
// double (float64), and `inputs` are the node's inputs with every float-typed one converted to the
// compute type. Outputs f returns in the compute type are converted back to input 0's dtype.
// Any other dtype of input 0 is Unsupported, naming the dtype.
template <class F>
std::vector<Tensor> float_kernel(const KernelContext& c, F&& f, bool allow_double = true) {
  DType dt = c.input(0).dtype();
  auto run = [&](auto tag, DType compute) {
    std::vector<Tensor> conv(c.inputs.size());
    std::vector<const Tensor*> p(c.inputs.size(), nullptr);
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      if (!c.inputs[i]) continue;
      if (dtype_is_float(c.inputs[i]->dtype()) && c.inputs[i]->dtype() != compute) {
        conv[i] = c.inputs[i]->cast(compute);
        p[i] = &conv[i];
      } else {
        p[i] = c.inputs[i];
      }
    }
    std::vector<Tensor> outs = f(tag, p);
    if (dt != compute)
      for (auto& o : outs)
        if (o.dtype() == compute) o = o.cast(dt);
    return outs;
  };
  switch (dt) {
    case DType::Float32: return run(float{}, DType::Float32);
    case DType::Float16:
    case DType::BFloat16: return run(float{}, DType::Float32);
    case DType::Float64:
      if (allow_double) return run(double{}, DType::Float64);
      break;
    default: break;
  }
  c.unsupported(c.node.op_type + " does not support dtype " + dtype_name(dt));
}

// Dtype checks in inference: errors name the op and dtype.
inline bool is_floatish(DType t) { return t == DType::Float32 || t == DType::Float16 || t == DType::Float64 || t == DType::BFloat16; }

// A Dim times/plus helpers that keep unknowns unknown.
inline Dim dim_mul(const Dim& a, const Dim& b) {
  if (a.known() && b.known()) return Dim(a.value * b.value);
  if (a.known() && a.value == 1) return b;
  if (b.known() && b.value == 1) return a;
  return Dim();
}

// FLOP helper: numel of a type or 0.
inline double numel_or0(const TensorType& t) {
  auto n = t.numel();
  return n ? double(*n) : 0.0;
}

// A shape split at `axis`: the product of the dims before it, the axis length, the product after.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
inline AxisSplit split_at(const Shape& s, int64_t axis) {
  AxisSplit r;
  r.n = s[size_t(axis)];
  for (int64_t i = 0; i < axis; ++i) r.outer *= s[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < s.size(); ++i) r.inner *= s[i];
  return r;
}

// Registration entry points of the split files.
void register_nn_matmul_ops(OpRegistry& r);
void register_nn_quantize_ops(OpRegistry& r);
void register_nn_conv_ops(OpRegistry& r);
void register_nn_norm_ops(OpRegistry& r);
void register_nn_reduce_ops(OpRegistry& r);
void register_nn_rotary_ops(OpRegistry& r);
void register_nn_attention_ops(OpRegistry& r);
void register_nn_loss_ops(OpRegistry& r);
void register_nn_fold_ops(OpRegistry& r);
void register_nn_roi_ops(OpRegistry& r);
void register_nn_deform_conv_ops(OpRegistry& r);
void register_nn_linear_attention_ops(OpRegistry& r);

}  // namespace nnfuse::nn
