#include "report.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"

namespace nnfuse::cli {

std::map<std::string, Shape> shape_bindings(const ParsedArgs& args) {
  std::map<std::string, Shape> r;
  std::string usage = args.spec ? args.spec->usage_line() : "";
  for (auto& s : args.all("--shape")) {
    std::pair<std::string, Shape> b;
    try {
      b = parse_shape_binding(s);
    } catch (const Error& e) {
      throw UsageError(e.what(), usage);  // a malformed argument, not a model fault
    }
    if (!r.emplace(b.first, b.second).second) throw UsageError("--shape given twice for input '" + b.first + "'", usage);
  }
  return r;
}

Model load_model_file(const std::string& path, const std::map<std::string, Shape>& bindings) {
  // Checked here so that the message is the same whatever the importer reports for a bad path.
  std::error_code ec;
  auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) fail(ErrorKind::Io, "cannot read model '" + path + "': no such file");
  if (std::filesystem::is_directory(st)) fail(ErrorKind::Io, "cannot read model '" + path + "': it is a directory");
  ImportOptions opt;
  opt.input_shapes = bindings;
  return load_model(path, opt);
}

json type_json(const TensorType& t) {
  json j;
  j["dtype"] = dtype_name(t.dtype);
  if (!t.has_shape) {
    j["shape"] = nullptr;
  } else {
    json dims = json::array();
    for (auto& d : t.dims) {
      if (d.known()) dims.push_back(d.value);
      else if (!d.symbol.empty()) dims.push_back(d.symbol);
      else dims.push_back(nullptr);
    }
    j["shape"] = dims;
  }
  j["type"] = t.str();
  return j;
}

json values_json(const Graph& g, const std::vector<std::string>& names) {
  json arr = json::array();
  for (auto& n : names) {
    json j = type_json(g.type(n));
    j["name"] = n;
    arr.push_back(j);
  }
  return arr;
}

json tensor_info_json(const Tensor& t) {
  if (t.is_none()) return json{{"kind", "optional"}, {"empty", true}};
  if (t.is_sequence()) {
    json el = json::array();
    for (auto& e : t.elements()) el.push_back(tensor_info_json(e));
    return json{{"kind", "sequence"}, {"dtype", dtype_name(t.dtype())}, {"elements", el}};
  }
  return json{{"shape", t.shape()}, {"dtype", dtype_name(t.dtype())}};
}

GraphStats graph_stats(const Graph& g) {
  GraphStats s;
  for (NodeId id : g.node_ids()) {
    const Node& n = g.node(id);
    ++s.nodes;
    if (n.op_type == "Constant" && n.domain.empty()) {
      ++s.constants;
      continue;
    }
    ++s.operators;
    std::string op = n.domain.empty() ? n.op_type : n.domain + "." + n.op_type;
    ++s.by_op[op];
    try {
      ++s.by_mapping[mapping_type_name(node_mapping_type(g, id))];
      bool is_static = true;
      for (auto& o : n.outputs)
        if (!o.empty() && g.has_value(o) && !g.type(o).is_static()) is_static = false;
      if (is_static) s.flops += node_flops(g, id);
      else ++s.flops_unknown;
    } catch (const Error& e) {
      // Reported, not hidden: the histogram by mapping type then does not cover this op.
      s.unsupported.emplace(op, e.detail());
    }
  }
  return s;
}

json stats_json(const GraphStats& s) {
  json j;
  j["nodes"] = s.nodes;
  j["operators"] = s.operators;
  j["constants"] = s.constants;
  j["ops"] = s.by_op;
  j["mapping_types"] = s.by_mapping;
  j["flops"] = s.flops;
  j["flops_unknown_ops"] = s.flops_unknown;
  j["unsupported_ops"] = s.unsupported;
  return j;
}

std::string histogram_text(const std::map<std::string, size_t>& h, const std::string& indent) {
  std::vector<std::pair<std::string, size_t>> rows(h.begin(), h.end());
  std::stable_sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second > b.second; });
  size_t width = 0;
  for (auto& r : rows) width = std::max(width, r.first.size());
  std::ostringstream s;
  for (auto& [name, count] : rows) s << indent << name << std::string(width - name.size() + 2, ' ') << count << "\n";
  return s.str();
}

static std::string fmt(double v, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, unit);
  return buf;
}

std::string human_bytes(double b) {
  if (b < 1024) return std::to_string(int64_t(b)) + " B";
  if (b < 1024.0 * 1024) return fmt(b / 1024, "KiB");
  if (b < 1024.0 * 1024 * 1024) return fmt(b / (1024.0 * 1024), "MiB");
  return fmt(b / (1024.0 * 1024 * 1024), "GiB");
}

std::string human_flops(double f) {
  if (f < 1e3) return std::to_string(int64_t(f)) + " FLOP";
  if (f < 1e6) return fmt(f / 1e3, "KFLOP");
  if (f < 1e9) return fmt(f / 1e6, "MFLOP");
  if (f < 1e12) return fmt(f / 1e9, "GFLOP");
  return fmt(f / 1e12, "TFLOP");
}

std::string flops_text(const GraphStats& s) {
  char exact[64];
  std::snprintf(exact, sizeof exact, "%.0f", s.flops);
  std::string t = human_flops(s.flops) + " (" + exact + ")";
  if (s.flops_unknown)
    t += "; excludes " + std::to_string(s.flops_unknown) + " operator" + (s.flops_unknown > 1 ? "s" : "") +
         " with unknown or symbolic shapes (bind them with --shape)";
  return t;
}

std::string human_ms(double ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, ms < 1 ? "%.3f ms" : ms < 100 ? "%.2f ms" : "%.1f ms", ms);
  return buf;
}

static std::string domain_label(const std::string& d) { return d.empty() ? "ai.onnx" : d; }

std::string opsets_text(const std::map<std::string, int64_t>& opsets) {
  std::string s;
  for (auto& [d, v] : opsets) s += (s.empty() ? "" : ", ") + domain_label(d) + " " + std::to_string(v);
  return s.empty() ? "(none)" : s;
}

json opsets_json(const std::map<std::string, int64_t>& opsets) {
  json j = json::object();
  for (auto& [d, v] : opsets) j[domain_label(d)] = v;
  return j;
}

void print_json(const json& j) {
  // Tensor and node names come from model files: replace invalid UTF-8 rather than throw.
  std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  std::cout.flush();
}

std::string sanitize_file_name(const std::string& name) {
  std::string r;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    r += ok ? c : '_';
  }
  if (r.empty()) r = "output";
  if (r[0] == '.') r[0] = '_';  // no hidden files, no "." or ".."
  return r;
}

}  // namespace nnfuse::cli

namespace nnfuse::cli {

std::function<void(size_t, size_t)> terminal_progress(const std::string& label) {
  if (!::isatty(STDERR_FILENO)) return {};
  return [label](size_t done, size_t total) {
    const int width = 30;
    int filled = total ? int(width * done / total) : width;
    std::string bar(size_t(filled), '=');
    bar.resize(size_t(width), ' ');
    std::fprintf(stderr, "\r%s [%s] %zu/%zu", label.c_str(), bar.c_str(), done, total);
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

}  // namespace nnfuse::cli
