#pragma once
// Views of a fusion plan: the `blocks` part of the optimize report (JSON), a DOT picture with
// blocks as clusters coloured by mapping type, and the fused model (blocks as nodes of domain
// `nnfuse` whose bodies are model-local functions, for Netron).
#include <nlohmann/json.hpp>
#include <string>

#include "fusion/planner.h"

namespace nnfuse {

// {"kernels": N, "blocks": [...], "fusion_stats": {...}}
nlohmann::json plan_to_json(const Graph& g, const FusionPlan& plan);
std::string plan_to_dot(const Graph& g, const FusionPlan& plan);
// A copy of the model whose blocks are single `nnfuse` nodes with function bodies.
Model fused_model(const Model& m, const FusionPlan& plan);
// Fill colour per mapping type (also used by the DOT legend).
const char* mapping_type_colour(MappingType m);

}  // namespace nnfuse
