#pragma once
// Running a stage's members one by one with the reference kernels (graph/interpreter.h): how
// Fallback stages execute on every target, and how device targets run the stages that have no
// device form (between launches, on the host).
#include <functional>
#include <optional>
#include <vector>

#include "lowering/kernel_ir.h"

namespace nnfuse {

// `input(b)` gives buffer b's contents (a view is fine); `output(b, t)` receives the tensor the
// members computed for each buffer in `outputs`. Values that are no buffer are graph constants or
// made by an earlier member. Throws Runtime naming the stage when a value is missing.
//
// `body_runner`, when given, is offered every If/Loop/Scan body the members run: it gets the body
// and its feeds (the body's inputs and the enclosing values it reads, by name) and returns the
// body's outputs in order, or nothing to let the reference interpreter run it (kernels/
// cpu_bodies.cpp runs compiled bodies this way, so the ops' own semantics stay in one place).
using BodyRunner = std::function<std::optional<std::vector<Tensor>>(const Graph& body, const TensorMap& feeds)>;
void run_stage_reference(const KernelModule& mod, const Stage& st, const std::vector<int>& outputs,
                         const std::function<Tensor(int)>& input, const std::function<void(int, const Tensor&)>& output,
                         const BodyRunner& body_runner = nullptr);

}  // namespace nnfuse
