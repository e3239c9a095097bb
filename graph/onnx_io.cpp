// ONNX import and export. Protobuf headers stay in this file and in graph/onnx_tensor.cpp (tensor
// protos): everything else sees only the nnfuse IR (graph/graph.h), so that a change to the ONNX
// proto recompiles two objects.
#include "graph/onnx_io.h"

#include <onnx/onnx_pb.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "graph/onnx_tensor.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"

namespace nnfuse {

namespace {

namespace fs = std::filesystem;
using namespace onnx_tensor;

// Versions we accept on import. IR 3 is the first with opset_import. IR 11-14 (ONNX 1.17-1.23)
// add element types and proto fields, nothing that changes what older fields mean: the new types
// up to int2 (code 26) are taken (graph/low_precision.h), a model that uses a type nnfuse lacks
// is refused where the type appears (dtype_supported), and onnx 1.23's make_model stamps IR 14
// on every model, new features or not.
constexpr int64_t kMinIr = 3, kMaxIr = 14;
// Opsets 22-28 (onnx 1.17-1.23): most new schema versions only add element types; an op whose
// newer version changed what it computes is checked per node against its schema's opset range
// (OpSchema::until), so a model at opset 28 runs where its ops mean what they meant before.
constexpr int64_t kMinOpset = 7, kMaxOpset = 28;

// The lowest IR version each default-domain opset requires (onnx.helper.VERSION_TABLE).
int64_t ir_required_by_opset(int64_t opset) {
  if (opset >= 23) return 11;
  if (opset >= 21) return 10;
  if (opset >= 19) return 9;
  if (opset >= 15) return 8;
  if (opset >= 12) return 7;
  if (opset == 11) return 6;
  if (opset == 10) return 5;
  if (opset == 9) return 4;
  return 3;
}

// ------------------------------------------------------------------------------------------
// Import
// ------------------------------------------------------------------------------------------

struct Importer {
  std::string label;     // file name (or "<bytes>") for error messages
  std::string base_dir;  // external data is resolved against this
  std::map<std::string, int64_t> opsets;
  mutable int64_t node_count = 0;  // every graph's nodes so far, against max_graph_nodes()

  [[noreturn]] void model_error(const std::string& msg, ErrorContext ctx = {}) const {
    ctx.file = label;
    fail(ErrorKind::Model, msg, ctx);
  }

  // ---- tensors ----
  Tensor tensor(const onnx::TensorProto& tp, const std::string& what) const { return from_proto(tp, what, {label, base_dir}); }
  Tensor sparse_tensor(const onnx::SparseTensorProto& sp, const std::string& what) const {
    return sparse_from_proto(sp, what, {label, base_dir});
  }

  // ---- types ----
  // `strict`: graph inputs/outputs must be tensors; value_info entries of other kinds are skipped.
  std::optional<TensorType> type(const onnx::ValueInfoProto& vi, bool strict) const {
    if (!vi.has_type()) return TensorType{};
    return type_of(vi.type(), vi.name(), strict);
  }
  // A TypeProto: a tensor, a sequence of tensors, or an optional tensor or sequence of tensors.
  std::optional<TensorType> type_of(const onnx::TypeProto& tp, const std::string& name, bool strict) const {
    // An empty TypeProto (PyTorch writes one for an If output inside a branch, Silero VAD v5/v6):
    // no type given; shape inference finds it.
    if (tp.value_case() == onnx::TypeProto::VALUE_NOT_SET) return TensorType{};
    auto refuse = [&](const char* what) -> std::optional<TensorType> {
      if (!strict) return std::nullopt;
      fail(ErrorKind::Unsupported,
           "value '" + name + "' is " + what + " (tensors, sequences of tensors and optional tensors or sequences are supported)",
           in_file(label));
    };
    if (tp.has_sequence_type() || tp.has_optional_type()) {
      const bool seq = tp.has_sequence_type();
      const onnx::TypeProto& et = seq ? tp.sequence_type().elem_type() : tp.optional_type().elem_type();
      if (!(seq ? tp.sequence_type().has_elem_type() : tp.optional_type().has_elem_type())) return refuse("a sequence or optional without an element type");
      if (seq && !et.has_tensor_type()) return refuse("a sequence of non-tensors");
      if (!seq && !et.has_tensor_type() && !(et.has_sequence_type() && et.sequence_type().elem_type().has_tensor_type()))
        return refuse("an optional of something other than a tensor or a sequence of tensors");
      std::optional<TensorType> inner = type_of(et, name, strict);
      if (!inner) return std::nullopt;
      TensorType r = *inner;
      r.optional_of = seq ? ValueKind::Tensor : inner->kind;
      r.kind = seq ? ValueKind::Sequence : ValueKind::Optional;
      return r;
    }
    if (!tp.has_tensor_type()) return refuse(tp.has_map_type() ? "a map" : tp.has_sparse_tensor_type() ? "a sparse tensor" : "not a tensor");
    const auto& tt = tp.tensor_type();
    TensorType r;
    int32_t et = tt.elem_type();
    if (et != 0 && !dtype_supported(et)) {
      if (!strict) return std::nullopt;
      fail(ErrorKind::Unsupported, "value '" + name + "' has element type " + onnx_dtype_name(et) + ", which nnfuse does not support", in_file(label));
    }
    r.dtype = DType(et);
    if (tt.has_shape()) {
      r.has_shape = true;
      for (auto& d : tt.shape().dim()) {
        if (d.has_dim_value()) {
          if (d.dim_value() < 0) model_error("value '" + name + "' has a negative dimension " + std::to_string(d.dim_value()));
          r.dims.emplace_back(d.dim_value());
        } else if (d.has_dim_param()) {
          r.dims.push_back(Dim::sym(d.dim_param()));
        } else {
          r.dims.emplace_back();
        }
      }
    }
    return r;
  }

  // ---- attributes ----
  Attribute attribute(onnx::AttributeProto& ap, const Node& owner, const std::vector<const Graph*>& scope) const {
    using AP = onnx::AttributeProto;
    auto ctx = ErrorContext{label, 0, 0, owner.label(), owner.op_type};
    if (!ap.ref_attr_name().empty())
      fail(ErrorKind::Unsupported, "attribute '" + ap.name() + "' refers to a function attribute, which is only valid inside functions", ctx);
    AP::AttributeType kind = ap.type();
    if (kind == AP::UNDEFINED) {
      // IR < 2 files may omit the discriminator: infer it from the field that is set.
      if (ap.has_f()) kind = AP::FLOAT;
      else if (ap.has_i()) kind = AP::INT;
      else if (ap.has_s()) kind = AP::STRING;
      else if (ap.has_t()) kind = AP::TENSOR;
      else if (ap.has_g()) kind = AP::GRAPH;
      else if (ap.floats_size()) kind = AP::FLOATS;
      else if (ap.ints_size()) kind = AP::INTS;
      else if (ap.strings_size()) kind = AP::STRINGS;
      else if (ap.tensors_size()) kind = AP::TENSORS;
      else if (ap.graphs_size()) kind = AP::GRAPHS;
      else if (ap.has_sparse_tensor()) kind = AP::SPARSE_TENSOR;
      else fail(ErrorKind::Model, "attribute '" + ap.name() + "' has no type and no value", ctx);
    }
    const std::string what = "attribute '" + ap.name() + "' of node '" + owner.label() + "'";
    Attribute a;
    switch (kind) {
      case AP::FLOAT: a = Attribute::make_float(ap.f()); break;
      case AP::INT: a = Attribute::make_int(ap.i()); break;
      case AP::STRING: a = Attribute::make_string(ap.s()); break;
      case AP::TENSOR: a = Attribute::make_tensor(tensor(ap.t(), what)); break;
      case AP::SPARSE_TENSOR: a = Attribute::make_tensor(sparse_tensor(ap.sparse_tensor(), what)); break;
      case AP::GRAPH: a = Attribute::make_graph(std::make_shared<Graph>(graph(*ap.mutable_g(), scope, true))); break;
      case AP::FLOATS: a = Attribute::make_floats({ap.floats().begin(), ap.floats().end()}); break;
      case AP::INTS: a = Attribute::make_ints({ap.ints().begin(), ap.ints().end()}); break;
      case AP::STRINGS: a = Attribute::make_strings({ap.strings().begin(), ap.strings().end()}); break;
      case AP::TENSORS:
        a.kind = Attribute::Kind::Tensors;
        for (auto& t : ap.tensors()) a.tensors.push_back(tensor(t, what));
        break;
      case AP::GRAPHS:
        a.kind = Attribute::Kind::Graphs;
        for (auto& g : *ap.mutable_graphs()) a.graphs.push_back(std::make_shared<Graph>(graph(g, scope, true)));
        break;
      case AP::TYPE_PROTO:
        a = Attribute::make_type(*type_of(ap.tp(), what, true));
        break;
      default:
        fail(ErrorKind::Unsupported, "attribute '" + ap.name() + "' has kind " + AP::AttributeType_Name(kind) + ", which nnfuse does not support", ctx);
    }
    return a;
  }

  // Constant's value_float/value_ints/... forms all become the `value` tensor, so that every
  // later stage (constant_value, folding, export) sees one form.
  static void normalize_constant(Attributes& attrs) {
    if (attrs.has("value")) return;
    if (auto* a = attrs.find("value_float")) {
      Tensor t = Tensor::scalar<float>(a->f);
      attrs.erase("value_float");
      attrs.set("value", Attribute::make_tensor(t));
    } else if (auto* a = attrs.find("value_floats")) {
      Tensor t = Tensor::from_vector<float>({int64_t(a->floats.size())}, a->floats);
      attrs.erase("value_floats");
      attrs.set("value", Attribute::make_tensor(t));
    } else if (auto* a = attrs.find("value_int")) {
      Tensor t = Tensor::scalar<int64_t>(a->i);
      attrs.erase("value_int");
      attrs.set("value", Attribute::make_tensor(t));
    } else if (auto* a = attrs.find("value_ints")) {
      Tensor t = Tensor::from_vector<int64_t>({int64_t(a->ints.size())}, a->ints);
      attrs.erase("value_ints");
      attrs.set("value", Attribute::make_tensor(t));
    } else if (attrs.has("sparse_value")) {
      Attribute a = *attrs.find("sparse_value");
      attrs.erase("sparse_value");
      attrs.set("value", a);
    }
  }

  // ---- graphs ----
  // `scope`: the enclosing graphs, innermost last (a body may read their values).
  // Takes the proto mutably so that weight bytes are released as soon as they are copied
  // (a 440 MB model would otherwise be held twice).
  Graph graph(onnx::GraphProto& gp, std::vector<const Graph*> scope, bool is_subgraph) const {
    Graph g;
    g.name = gp.name();
    g.doc = gp.doc_string();
    g.is_subgraph = is_subgraph;
    g.opset_imports = opsets;

    // Freed weight strings below glibc's mmap threshold stay in the heap as holes the tensors
    // copied next rarely fit: hand them back to the OS every so often, so that the import peaks
    // near one copy of the weights plus the message rather than growing with every hole.
    size_t freed_since_trim = 0;
    for (auto& init : *gp.mutable_initializer()) {
      if (init.name().empty()) model_error("graph '" + gp.name() + "' has an initializer without a name");
      if (g.is_initializer(init.name())) model_error("initializer '" + init.name() + "' is defined twice");
      g.set_initializer(init.name(), tensor(init, "'" + init.name() + "'"));
      if (init.has_raw_data()) {
        freed_since_trim += init.raw_data().size();
        delete init.release_raw_data();
      }
      if (freed_since_trim >= (size_t(32) << 20)) {
        return_free_memory_to_os();
        freed_since_trim = 0;
      }
    }
    for (auto& sp : gp.sparse_initializer()) {
      const std::string& n = sp.values().name();
      if (n.empty()) model_error("graph '" + gp.name() + "' has a sparse initializer without a name");
      g.set_initializer(n, sparse_tensor(sp, "'" + n + "'"));
    }
    for (auto& vi : gp.input()) {
      if (vi.name().empty()) model_error("graph '" + gp.name() + "' has an input without a name");
      TensorType t = *type(vi, true);
      if (const Tensor* init = g.find_initializer(vi.name())) {
        // An initializer also listed as an input (IR < 4 requires it): it stays an
        // initializer, and the input may be fed to override it.
        if (t.dtype != DType::Undefined && t.dtype != init->dtype())
          model_error("input '" + vi.name() + "' is declared " + t.str() + " but its initializer is " +
                      TensorType::of(init->dtype(), init->shape()).str());
        t = TensorType::of(init->dtype(), init->shape());
      }
      g.add_input(vi.name(), t);
    }
    node_count += gp.node_size();
    if (node_count > max_graph_nodes())
      model_error("has more than " + std::to_string(max_graph_nodes()) + " nodes in its graphs (the limit is NNFUSE_MAX_GRAPH_NODES)");
    // Values first, so that nodes may appear in any order in the file.
    for (auto& np : gp.node()) {
      for (auto& o : np.output())
        if (!o.empty()) g.declare_value(o);
      for (auto& i : np.input())
        if (!i.empty()) g.declare_value(i);
    }
    for (auto& vi : gp.value_info()) {
      if (vi.name().empty() || !g.has_value(vi.name()) || g.is_initializer(vi.name()) || g.is_input(vi.name())) continue;
      if (auto t = type(vi, false)) g.set_type(vi.name(), *t);
    }
    for (auto& vi : gp.output()) {
      if (vi.name().empty()) model_error("graph '" + gp.name() + "' has an output without a name");
      g.add_output(vi.name());
      TensorType t = *type(vi, true);
      if (!g.is_initializer(vi.name()) && !g.is_input(vi.name()) && (t.dtype != DType::Undefined || t.has_shape))
        g.set_type(vi.name(), t);
    }

    std::vector<const Graph*> inner = scope;
    inner.push_back(&g);
    for (auto& np : *gp.mutable_node()) {
      Node probe;  // for error messages while attributes are converted
      probe.name = np.name();
      probe.op_type = np.op_type();
      probe.id = NodeId(g.num_nodes());
      if (np.op_type().empty()) model_error("a node has no op_type", {label, 0, 0, probe.label(), ""});
      Attributes attrs;
      for (auto& ap : *np.mutable_attribute()) {
        if (ap.name().empty()) model_error("an attribute has no name", {label, 0, 0, probe.label(), np.op_type()});
        if (attrs.has(ap.name())) model_error("attribute '" + ap.name() + "' is given twice", {label, 0, 0, probe.label(), np.op_type()});
        attrs.set(ap.name(), attribute(ap, probe, inner));
      }
      std::string domain = np.domain() == "ai.onnx" ? "" : np.domain();
      if (np.op_type() == "Constant" && domain.empty()) normalize_constant(attrs);
      std::vector<std::string> ins(np.input().begin(), np.input().end());
      std::vector<std::string> outs(np.output().begin(), np.output().end());
      try {
        NodeId id = g.add_node(np.op_type(), ins, outs, std::move(attrs), np.name(), domain);
        if (!np.doc_string().empty()) g.set_node_doc(id, np.doc_string());
      } catch (const Error& e) {
        ErrorContext c = e.context();
        c.file = label;
        if (c.node.empty()) c.node = probe.label();
        if (c.op.empty()) c.op = np.op_type();
        throw Error(e.kind(), e.detail(), c);
      }
    }
    // A body may read values of any enclosing graph; a name found in none of them dangles.
    if (is_subgraph) {
      for (auto& r : g.outer_references()) {
        const Graph* owner = nullptr;
        for (auto it = scope.rbegin(); it != scope.rend() && !owner; ++it)
          if ((*it)->has_value(r)) owner = *it;
        if (!owner) {
          const Use& u = g.value(r).uses.front();
          const Node& n = g.node(u.node);
          model_error("input '" + r + "' of node '" + n.label() + "' in subgraph '" + g.name +
                          "' is produced by no node and is not an input, initializer or outer-scope value (dangling edge)",
                      {label, 0, 0, n.label(), n.op_type});
        }
      }
    }
    check_structure(g);
    return g;
  }

  // Dangling edges, cycles, op support and arity: errors that name the node at fault.
  void check_structure(const Graph& g) const {
    if (!g.is_subgraph) {
      for (auto& r : g.outer_references()) {
        const Use& u = g.value(r).uses.front();
        const Node& n = g.node(u.node);
        model_error("input " + std::to_string(u.slot) + " '" + r + "' of node '" + n.label() +
                        "' is produced by no node and is not a graph input or initializer (dangling edge)",
                    {label, 0, 0, n.label(), n.op_type});
      }
    }
    if (!g.is_subgraph)
      for (auto& o : g.outputs())
        if (!g.producer(o) && !g.is_input(o) && !g.is_initializer(o))
          model_error("graph output '" + o + "' is produced by no node and is not a graph input or initializer");
    std::vector<NodeId> cyc;
    if (g.has_cycle(&cyc)) {
      std::string path;
      for (NodeId c : cyc) path += (path.empty() ? "" : " -> ") + g.node(c).label();
      if (!cyc.empty()) path += " -> " + g.node(cyc.front()).label();
      const Node& n = g.node(cyc.empty() ? g.node_ids().front() : cyc.front());
      model_error("the graph has a cycle: " + path, {label, 0, 0, n.label(), n.op_type});
    }
    const OpRegistry& reg = OpRegistry::global();
    for (NodeId id : g.node_ids()) {
      const Node& n = g.node(id);
      int64_t opset = g.opset(n.domain);
      ErrorContext ctx{label, 0, 0, n.label(), n.op_type, int(opset)};
      if (opset == 0)
        model_error("node uses domain '" + (n.domain.empty() ? std::string("ai.onnx") : n.domain) + "', which the model does not import", ctx);
      const OpSchema* s = nullptr;
      try {
        s = &reg.get(n, opset);
      } catch (const Error& e) {
        ErrorContext c = e.context();
        c.file = label;
        throw Error(e.kind(), e.detail(), c);
      }
      int nin = int(n.inputs.size());
      if (nin < s->min_inputs || (s->max_inputs >= 0 && nin > s->max_inputs))
        model_error("has " + std::to_string(nin) + " inputs; " + n.op_type + " takes " + std::to_string(s->min_inputs) +
                        (s->max_inputs < 0 ? " or more" : s->max_inputs == s->min_inputs ? "" : " to " + std::to_string(s->max_inputs)),
                    ctx);
      int nout = int(n.outputs.size());
      if (nout < s->min_outputs || (s->max_outputs >= 0 && nout > s->max_outputs))
        model_error("has " + std::to_string(nout) + " outputs; " + n.op_type + " gives " + std::to_string(s->min_outputs) +
                        (s->max_outputs < 0 ? " or more" : s->max_outputs == s->min_outputs ? "" : " to " + std::to_string(s->max_outputs)),
                    ctx);
    }
  }
};

// Model-local functions (FunctionProto: PyTorch exports, our own --export-fused) are inlined on
// import, so that every later stage sees only registry ops. A call's formal parameters become its
// actual arguments; every other name in the body gets a per-call prefix, so that two calls of one
// function do not collide.
struct FunctionInliner {
  std::map<std::pair<std::string, std::string>, const onnx::FunctionProto*> functions;
  std::string label;
  int calls = 0;
  int64_t nodes = 0;  // nodes written out so far, against max_graph_nodes()

  static std::string norm(const std::string& d) { return d == "ai.onnx" ? std::string() : d; }

  const onnx::FunctionProto* find(const onnx::NodeProto& n) const {
    auto it = functions.find({norm(n.domain()), n.op_type()});
    return it == functions.end() ? nullptr : it->second;
  }

  void expand_graph(onnx::GraphProto& gp, int depth) {
    google::protobuf::RepeatedPtrField<onnx::NodeProto> out;
    for (auto& n : *gp.mutable_node()) expand_node(n, out, depth);
    gp.mutable_node()->Swap(&out);
  }

  void expand_node(onnx::NodeProto& n, google::protobuf::RepeatedPtrField<onnx::NodeProto>& out, int depth) {
    const onnx::FunctionProto* f = find(n);
    if (!f) {
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_g()) expand_graph(*a.mutable_g(), depth);
        for (auto& g : *a.mutable_graphs()) expand_graph(g, depth);
      }
      if (++nodes > max_graph_nodes()) {
        ErrorContext ctx = in_file(label);
        fail(ErrorKind::Model,
             "model-local function calls expand to more than " + std::to_string(max_graph_nodes()) +
                 " nodes (the limit is NNFUSE_MAX_GRAPH_NODES)",
             ctx);
      }
      *out.Add() = std::move(n);
      return;
    }
    ErrorContext ctx = in_file(label);
    ctx.node = n.name().empty() ? "#call" : n.name();
    ctx.op = n.op_type();
    if (depth > 64) fail(ErrorKind::Model, "model-local function calls nest more than 64 deep (is '" + f->name() + "' recursive?)", ctx);
    if (n.input_size() > f->input_size() || n.output_size() > f->output_size())
      fail(ErrorKind::Model, "calls function " + f->name() + " with " + std::to_string(n.input_size()) + " inputs and " +
                                 std::to_string(n.output_size()) + " outputs; it takes " + std::to_string(f->input_size()) +
                                 " and gives " + std::to_string(f->output_size()), ctx);
    const std::string prefix = (n.name().empty() ? f->name() : n.name()) + "#" + std::to_string(++calls) + "/";
    std::map<std::string, std::string> rename;
    for (int i = 0; i < f->input_size(); ++i) rename[f->input(i)] = i < n.input_size() ? n.input(i) : std::string();
    for (int i = 0; i < f->output_size(); ++i)
      if (i < n.output_size() && !n.output(i).empty()) rename[f->output(i)] = n.output(i);
    auto map_name = [&](const std::string& v) -> std::string {
      if (v.empty()) return v;
      auto it = rename.find(v);
      return it != rename.end() ? it->second : prefix + v;
    };
    std::map<std::string, const onnx::AttributeProto*> actual;
    for (auto& a : n.attribute()) actual[a.name()] = &a;
    for (const auto& body_node : f->node()) {
      onnx::NodeProto c = body_node;
      if (!c.name().empty()) c.set_name(prefix + c.name());
      for (auto& v : *c.mutable_input()) v = map_name(v);
      for (auto& v : *c.mutable_output()) v = map_name(v);
      google::protobuf::RepeatedPtrField<onnx::AttributeProto> attrs;
      for (auto& a : *c.mutable_attribute()) {
        if (!a.ref_attr_name().empty()) {
          // An attribute the caller did not give: the function's default (IR 9) is not in
          // ONNX 1.12's proto, so the attribute is left out and the op's own default applies.
          auto it = actual.find(a.ref_attr_name());
          if (it == actual.end()) continue;
          onnx::AttributeProto bound = *it->second;
          bound.set_name(a.name());
          *attrs.Add() = std::move(bound);
          continue;
        }
        if (a.has_g()) rename_graph(*a.mutable_g(), map_name);
        for (auto& g : *a.mutable_graphs()) rename_graph(g, map_name);
        *attrs.Add() = std::move(a);
      }
      c.mutable_attribute()->Swap(&attrs);
      expand_node(c, out, depth + 1);
    }
  }

  // Renames every name of a body nested in a function (its own names included, consistently).
  template <class F>
  static void rename_graph(onnx::GraphProto& g, const F& map_name) {
    for (auto& vi : *g.mutable_input()) vi.set_name(map_name(vi.name()));
    for (auto& vi : *g.mutable_output()) vi.set_name(map_name(vi.name()));
    for (auto& vi : *g.mutable_value_info()) vi.set_name(map_name(vi.name()));
    for (auto& t : *g.mutable_initializer()) t.set_name(map_name(t.name()));
    for (auto& n : *g.mutable_node()) {
      for (auto& v : *n.mutable_input()) v = map_name(v);
      for (auto& v : *n.mutable_output()) v = map_name(v);
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_g()) rename_graph(*a.mutable_g(), map_name);
        for (auto& sg : *a.mutable_graphs()) rename_graph(sg, map_name);
      }
    }
  }
};

// Parses without protobuf's historical 64 MiB cap (BERT-base is ~440 MB); 2 GiB is the format's limit.
bool parse_model(google::protobuf::io::ZeroCopyInputStream& raw, onnx::ModelProto& mp) {
  google::protobuf::io::CodedInputStream coded(&raw);
  coded.SetTotalBytesLimit(INT_MAX);
  if (!mp.ParseFromCodedStream(&coded)) return false;
  return coded.ConsumedEntireMessage();
}

bool parse_model(const std::string& bytes, onnx::ModelProto& mp) {
  if (bytes.size() > size_t(INT_MAX)) return false;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), int(bytes.size()));
  return parse_model(raw, mp);
}

void parse_or_fail(const std::string& bytes, onnx::ModelProto& mp, const std::string& label) {
  if (bytes.empty()) fail(ErrorKind::Model, "not a valid ONNX model (the file is empty)", in_file(label));
  if (!parse_model(bytes, mp)) fail(ErrorKind::Model, "not a valid ONNX model (protobuf parse failed)", in_file(label));
}

Model import_model_unlabelled(onnx::ModelProto& mp, const ImportOptions& opt, const std::string& base_dir, const std::string& label) {
  auto bad = [&](const std::string& why) {
    fail(ErrorKind::Model, "not a valid ONNX model (" + why + ")", in_file(label));
  };
  if (!mp.has_graph()) bad("it has no graph");
  if (!mp.has_ir_version()) bad("it has no ir_version");
  int64_t ir = mp.ir_version();
  if (ir < kMinIr || ir > kMaxIr)
    fail(ErrorKind::Unsupported, "model has IR version " + std::to_string(ir) + "; nnfuse supports IR versions " +
                                     std::to_string(kMinIr) + " to " + std::to_string(kMaxIr), in_file(label));

  Importer imp;
  imp.label = label;
  imp.base_dir = base_dir;
  for (auto& os : mp.opset_import()) {
    std::string d = os.domain() == "ai.onnx" ? "" : os.domain();
    if (imp.opsets.count(d)) bad("opset of domain '" + os.domain() + "' is imported twice");
    imp.opsets[d] = os.version();
  }
  // A model without an ai.onnx opset is fine as long as no node uses that domain (checked per node).
  auto def = imp.opsets.find("");
  if (def != imp.opsets.end() && (def->second < kMinOpset || def->second > kMaxOpset))
    fail(ErrorKind::Unsupported, "model uses opset " + std::to_string(def->second) + " of ai.onnx; nnfuse supports " +
                                     std::to_string(kMinOpset) + " to " + std::to_string(kMaxOpset), {label, 0, 0, "", "", int(def->second)});

  Model m;
  m.ir_version = ir;
  m.producer_name = mp.producer_name();
  m.producer_version = mp.producer_version();
  m.domain = mp.domain();
  m.model_version = mp.model_version();
  m.doc = mp.doc_string();
  for (auto& kv : mp.metadata_props()) m.metadata[kv.key()] = kv.value();
  if (mp.functions_size() > 0) {
    FunctionInliner inl;
    inl.label = label;
    for (auto& f : mp.functions()) {
      inl.functions[{FunctionInliner::norm(f.domain()), f.name()}] = &f;
      // Inlined bodies may use domains only the function imports.
      for (auto& os : f.opset_import()) imp.opsets.emplace(FunctionInliner::norm(os.domain()), os.version());
    }
    inl.expand_graph(*mp.mutable_graph(), 0);
  }
  m.graph = imp.graph(*mp.mutable_graph(), {}, false);

  if (!opt.input_shapes.empty()) bind_input_shapes(m.graph, opt.input_shapes);
  else if (opt.infer_shapes) infer_shapes(m.graph);
  if (opt.validate) m.graph.validate();
  return m;
}

// Every error of an import names the file, whichever layer raised it.
Model import_model(onnx::ModelProto& mp, const ImportOptions& opt, const std::string& base_dir, const std::string& label) {
  try {
    return import_model_unlabelled(mp, opt, base_dir, label);
  } catch (const Error& e) {
    rethrow_in(e, in_file(label));
  } catch (const std::bad_alloc&) {
    fail(ErrorKind::Runtime, "out of memory while importing the model", in_file(label));
  }
}

// ------------------------------------------------------------------------------------------
// Export
// ------------------------------------------------------------------------------------------

// The protobuf limit is 2 GiB for the whole message; leave room for the graph itself.
constexpr size_t kEmbedLimit = size_t(2000) * 1000 * 1000;

struct Exporter {
  ExternalWriter* external = nullptr;  // non-null: big tensors go to the data file

  void tensor(const Tensor& t, const std::string& name, onnx::TensorProto& tp, bool allow_external) const {
    to_proto(t, name, tp, allow_external ? external : nullptr);
  }

  static void type(const TensorType& t, onnx::TypeProto& tp) {
    if (!t.is_tensor()) {
      TensorType inner = t;
      inner.kind = t.kind == ValueKind::Optional ? t.optional_of : ValueKind::Tensor;
      inner.optional_of = ValueKind::Tensor;
      type(inner, *(t.kind == ValueKind::Sequence ? tp.mutable_sequence_type()->mutable_elem_type()
                                                   : tp.mutable_optional_type()->mutable_elem_type()));
      return;
    }
    auto* tt = tp.mutable_tensor_type();
    tt->set_elem_type(int32_t(t.dtype));
    if (t.has_shape) {
      auto* sh = tt->mutable_shape();
      for (auto& d : t.dims) {
        auto* dp = sh->add_dim();
        if (d.known()) dp->set_dim_value(d.value);
        else if (!d.symbol.empty()) dp->set_dim_param(d.symbol);
      }
    }
  }

  static void value_info(const std::string& name, const TensorType& t, onnx::ValueInfoProto& vi) {
    vi.set_name(name);
    if (t.dtype != DType::Undefined) type(t, *vi.mutable_type());
  }

  void attribute(const std::string& name, const Attribute& a, onnx::AttributeProto& ap) const {
    using AP = onnx::AttributeProto;
    ap.set_name(name);
    switch (a.kind) {
      case Attribute::Kind::Float: ap.set_type(AP::FLOAT); ap.set_f(a.f); break;
      case Attribute::Kind::Int: ap.set_type(AP::INT); ap.set_i(a.i); break;
      case Attribute::Kind::String: ap.set_type(AP::STRING); ap.set_s(a.s); break;
      case Attribute::Kind::Tensor:
        ap.set_type(AP::TENSOR);
        tensor(a.t, "", *ap.mutable_t(), external && external->attributes);
        break;
      case Attribute::Kind::Graph:
        ap.set_type(AP::GRAPH);
        if (!a.g) fail(ErrorKind::Invalid, "graph attribute '" + name + "' is empty");
        graph(*a.g, *ap.mutable_g());
        break;
      case Attribute::Kind::Floats: ap.set_type(AP::FLOATS); for (float v : a.floats) ap.add_floats(v); break;
      case Attribute::Kind::Ints: ap.set_type(AP::INTS); for (int64_t v : a.ints) ap.add_ints(v); break;
      case Attribute::Kind::Strings: ap.set_type(AP::STRINGS); for (auto& v : a.strings) ap.add_strings(v); break;
      case Attribute::Kind::Tensors:
        ap.set_type(AP::TENSORS);
        for (auto& t : a.tensors) tensor(t, "", *ap.add_tensors(), false);
        break;
      case Attribute::Kind::Type:
        ap.set_type(AP::TYPE_PROTO);
        if (a.type) type(*a.type, *ap.mutable_tp());
        break;
      case Attribute::Kind::Graphs:
        ap.set_type(AP::GRAPHS);
        for (auto& g : a.graphs) {
          if (!g) fail(ErrorKind::Invalid, "graph attribute '" + name + "' holds an empty graph");
          graph(*g, *ap.add_graphs());
        }
        break;
    }
  }

  void node(const Node& n, onnx::NodeProto& np) const {
    for (auto& i : n.inputs) np.add_input(i);
    for (auto& o : n.outputs) np.add_output(o);
    if (!n.name.empty()) np.set_name(n.name);
    np.set_op_type(n.op_type);
    if (!n.domain.empty()) np.set_domain(n.domain);
    if (!n.doc.empty()) np.set_doc_string(n.doc);
    for (auto& [k, a] : n.attrs.all()) attribute(k, a, *np.add_attribute());
  }

  // A model-local function. FunctionProto has no initializers: the body's become Constant nodes.
  void function(const ModelFunction& f, const std::map<std::string, int64_t>& model_opsets, onnx::FunctionProto& fp) const {
    fp.set_name(f.name);
    fp.set_domain(f.domain);
    for (auto& i : f.inputs) fp.add_input(i);
    for (auto& o : f.outputs) fp.add_output(o);
    const Graph& b = f.body;
    if (!b.doc.empty()) fp.set_doc_string(b.doc);
    std::map<std::string, int64_t> opsets;
    for (auto& [d, v] : f.opset_imports) opsets[d == "ai.onnx" ? "" : d] = v;
    auto need = [&](const std::string& d) {
      if (opsets.count(d)) return;
      auto it = model_opsets.find(d);
      opsets[d] = it == model_opsets.end() ? 1 : it->second;
    };
    for (auto& name : b.initializer_names()) {
      need("");
      auto* np = fp.add_node();
      np->add_output(name);
      np->set_op_type("Constant");
      auto* ap = np->add_attribute();
      ap->set_name("value");
      ap->set_type(onnx::AttributeProto::TENSOR);
      tensor(b.initializer(name), "", *ap->mutable_t(), false);
    }
    for (NodeId id : b.topo_order()) {
      const Node& n = b.node(id);
      need(n.domain);
      node(n, *fp.add_node());
    }
    for (auto& [d, v] : opsets) {
      auto* os = fp.add_opset_import();
      os->set_domain(d);
      os->set_version(v);
    }
  }

  void graph(const Graph& g, onnx::GraphProto& gp) const {
    gp.set_name(g.name.empty() ? (g.is_subgraph ? "body" : "nnfuse_graph") : g.name);
    if (!g.doc.empty()) gp.set_doc_string(g.doc);
    std::set<std::string> produced;
    for (NodeId id : g.topo_order()) {
      const Node& n = g.node(id);
      node(n, *gp.add_node());
      for (auto& o : n.outputs)
        if (!o.empty()) produced.insert(o);
    }
    for (auto& name : g.initializer_names()) tensor(g.initializer(name), name, *gp.add_initializer(), true);
    for (auto& in : g.inputs()) value_info(in, g.type(in), *gp.add_input());
    for (auto& out : g.outputs()) value_info(out, g.type(out), *gp.add_output());
    for (auto& name : g.value_names()) {
      if (!produced.count(name) || g.is_output(name)) continue;
      const TensorType& t = g.type(name);
      if (t.dtype == DType::Undefined) continue;
      value_info(name, t, *gp.add_value_info());
    }
  }
};

void collect_weight_bytes(const Graph& g, size_t& total) {
  for (auto& n : g.initializer_names()) total += g.initializer(n).nbytes();
  for (NodeId id : g.node_ids())
    for (auto& [k, a] : g.node(id).attrs.all()) {
      if (a.kind == Attribute::Kind::Tensor) total += a.t.nbytes();
      for (auto& t : a.tensors) total += t.nbytes();
      if (a.g) collect_weight_bytes(*a.g, total);
      for (auto& sg : a.graphs)
        if (sg) collect_weight_bytes(*sg, total);
    }
}

void uses_domain(const Graph& g, std::set<std::string>& domains) {
  for (NodeId id : g.node_ids()) {
    const Node& n = g.node(id);
    domains.insert(n.domain);
    for (auto& [k, a] : n.attrs.all()) {
      if (a.g) uses_domain(*a.g, domains);
      for (auto& sg : a.graphs)
        if (sg) uses_domain(*sg, domains);
    }
  }
}

onnx::ModelProto build_model(const Model& m, ExternalWriter* external) {
  onnx::ModelProto mp;
  std::map<std::string, int64_t> opsets = m.graph.opset_imports;
  if (auto it = opsets.find("ai.onnx"); it != opsets.end()) {
    int64_t v = it->second;
    opsets.erase(it);
    opsets.emplace("", v);
  }
  std::set<std::string> domains;
  uses_domain(m.graph, domains);
  if (domains.count("nnfuse") && !opsets.count("nnfuse")) opsets["nnfuse"] = 1;
  for (auto& d : domains)
    if (!opsets.count(d)) {
      if (d.empty()) fail(ErrorKind::Invalid, "the model has no ai.onnx opset to export");
      opsets[d] = 1;
    }
  for (auto& f : m.functions) {
    if (!opsets.count(f.domain)) opsets[f.domain] = 1;
    std::set<std::string> body_domains;
    uses_domain(f.body, body_domains);
    for (auto& d : body_domains)
      if (!opsets.count(d) && !d.empty()) opsets[d] = 1;
  }
  // onnx.checker rejects an IR version lower than its opset needs; IR 4 is the first where
  // initializers need not be listed as inputs, which our graphs rely on; IR 8 the first with
  // model-local functions.
  int64_t ir = std::max<int64_t>(m.ir_version, m.functions.empty() ? 4 : 8);
  if (auto it = opsets.find(""); it != opsets.end()) ir = std::max(ir, ir_required_by_opset(it->second));
  mp.set_ir_version(ir);
  for (auto& [d, v] : opsets) {
    auto* os = mp.add_opset_import();
    os->set_domain(d);
    os->set_version(v);
  }
  if (!m.producer_name.empty()) mp.set_producer_name(m.producer_name);
  if (!m.producer_version.empty()) mp.set_producer_version(m.producer_version);
  if (!m.domain.empty()) mp.set_domain(m.domain);
  if (m.model_version) mp.set_model_version(m.model_version);
  if (!m.doc.empty()) mp.set_doc_string(m.doc);
  for (auto& [k, v] : m.metadata) {
    auto* e = mp.add_metadata_props();
    e->set_key(k);
    e->set_value(v);
  }
  Exporter ex;
  ex.external = external;
  ex.graph(m.graph, *mp.mutable_graph());
  for (auto& f : m.functions) ex.function(f, opsets, *mp.add_functions());
  return mp;
}

std::string serialize(const onnx::ModelProto& mp) {
  std::string out;
  if (!mp.SerializeToString(&out)) fail(ErrorKind::Runtime, "serializing the ONNX model failed");
  return out;
}

// Parses the model file straight from disk: reading it into memory first would hold its bytes
// and the parsed message at once (twice the weights at the peak; 880 MB for BERT-base).
void parse_file_or_fail(const std::string& path, onnx::ModelProto& mp) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(ErrorKind::Io, "cannot read model '" + path + "': it is a directory", in_file(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::Io, "cannot open model file '" + path + "'" + (fs::exists(path, ec) ? "" : ": no such file"), in_file(path));
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  if (size < 0) fail(ErrorKind::Io, "cannot read model file '" + path + "'", in_file(path));
  if (size == 0) fail(ErrorKind::Model, "not a valid ONNX model (the file is empty)", in_file(path));
  in.seekg(0);
  google::protobuf::io::IstreamInputStream raw(&in, 1 << 20);
  const bool ok = int64_t(size) <= int64_t(INT_MAX) && parse_model(raw, mp);
  if (in.bad()) fail(ErrorKind::Io, "reading model file '" + path + "' failed", in_file(path));
  if (!ok) fail(ErrorKind::Model, "not a valid ONNX model (protobuf parse failed)", in_file(path));
}

}  // namespace

Model load_model(const std::string& path, const ImportOptions& opt) {
  Model m;
  {
    onnx::ModelProto mp;
    parse_file_or_fail(path, mp);
    std::string dir = fs::path(path).parent_path().string();
    m = import_model(mp, opt, dir, path);
  }
  // The parsed message's weight strings were freed one by one as they were copied; the heap keeps
  // those below glibc's mmap threshold unless asked to hand them back.
  return_free_memory_to_os();
  m.path = path;
  return m;
}

Model load_model_bytes(const std::string& bytes, const ImportOptions& opt, const std::string& base_dir, const std::string& label) {
  onnx::ModelProto mp;
  parse_or_fail(bytes, mp, label);
  return import_model(mp, opt, base_dir, label);
}

std::string save_model_bytes(const Model& m) {
  size_t weights = 0;
  collect_weight_bytes(m.graph, weights);
  for (auto& f : m.functions) collect_weight_bytes(f.body, weights);
  if (weights > kEmbedLimit)
    fail(ErrorKind::Invalid, "the model holds " + std::to_string(weights) +
                                 " bytes of weights, over protobuf's 2 GiB limit: save it to a file (save_model), which writes the weights as external data");
  return serialize(build_model(m, nullptr));
}

void save_model(const Model& m, const std::string& path) { save_model(m, path, SaveOptions{}); }

void save_model(const Model& m, const std::string& path, const SaveOptions& opt) {
  size_t weights = 0;
  collect_weight_bytes(m.graph, weights);
  for (auto& f : m.functions) collect_weight_bytes(f.body, weights);
  onnx::ModelProto mp;
  if (weights > kEmbedLimit || opt.external_data) {
    fs::path p(path);
    std::string location = p.filename().string() + ".data";
    fs::path data_path = p.parent_path() / location;
    std::ofstream data(data_path, std::ios::binary | std::ios::trunc);
    if (!data) fail(ErrorKind::Io, "cannot write external data file '" + data_path.string() + "'", in_file(data_path.string()));
    ExternalWriter w{&data, location, 0, opt.external_data ? opt.external_min_bytes : kExternalMinBytes, weights > kEmbedLimit};
    mp = build_model(m, &w);
    data.close();
    if (!data) fail(ErrorKind::Io, "writing external data file '" + data_path.string() + "' failed", in_file(data_path.string()));
  } else {
    mp = build_model(m, nullptr);
  }
  write_message(mp, path, "model file");
}

}  // namespace nnfuse
