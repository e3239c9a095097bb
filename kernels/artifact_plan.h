#pragma once
// The schema of a compiled artifact's plan.json (CpuModel::save writes it, CpuModel::load reads
// it). Checked in full before the loader reads a field, so that an edited, truncated or foreign
// plan.json is an Error naming the file and the field, never a JSON type exception or a crash
// deeper in the lowering.
#include <nlohmann/json.hpp>
#include <string>

namespace nnfuse {

// Fails (ErrorKind::Io) naming `path` and the first field that is missing, of the wrong type or
// out of range.
void check_artifact_plan(const nlohmann::json& plan, const std::string& path);

}  // namespace nnfuse
