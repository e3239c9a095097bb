#pragma once
// Fusion planning as a named pass ("fusion-plan"), so pipelines decide where it runs. The plan is
// left in PassContext::artifacts["fusion_plan"] (a FusionPlan).
namespace nnfuse {
void register_fusion_passes();
}  // namespace nnfuse
