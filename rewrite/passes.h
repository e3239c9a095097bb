#pragma once
// The C++ structural passes of the rewrite stage: transforms that a rule file cannot express well
// (they look at whole-graph properties, evaluate kernels or build tensors of computed sizes).
// Each is a named pass in the PassRegistry; pipeline files refer to them by these names:
//   constant-folding [max_elements=N]   fold nodes whose inputs are all constant (results capped)
//   dce                                 remove nodes, initializers and values no output needs
//   cse                                 merge identical nodes and identical initializers
//   shape-simplification                static shape chains -> constants; drop no-op reshapes/casts
//   fold-batchnorm                      BatchNormalization into Conv/ConvTranspose/Gemm/MatMul weights
//   combine-parallel-matmul             MatMuls/Gemms sharing an activation -> one MatMul + Split
//   combine-parallel-conv               Convs sharing an input with equal geometry -> one Conv + Split
//   fold-transpose-into-gemm            Transpose on a Gemm operand -> transA/transB
//   decompose-attention                 Attention (opset 23) -> MatMul/Softmax/MatMul for fused attention
//   decompose-rms-norm                  RMSNormalization (opset 23) -> ReduceMean chain the generator lowers
//   decompose-rotary-embedding          RotaryEmbedding (opset 23) -> Slice/Mul/Concat the generator lowers
//   qdq-to-float                        QuantizeLinear -> DequantizeLinear on activations -> float ops the planner fuses
// Every pass counts what it did in PassContext::rules_fired under its own name.

namespace nnfuse {

// Registers every structural pass with PassRegistry::global(). Idempotent; called once by the
// optimize driver (no static initialisers: static libraries would drop them).
void register_structural_passes();

}  // namespace nnfuse
