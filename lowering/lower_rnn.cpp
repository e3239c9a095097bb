// LSTM, GRU and RNN lowered to one kernel-only anchor stage each (kernels/microkernels/lstm.h,
// gru.h, rnn.h):
// W^T and R^T packed at load time, the input projection of a chunk of steps as one GEMM, per time
// step GEMMs against R, then the gate nonlinearities and state update.
#include <algorithm>
#include <cctype>

#include "graph/op_registry.h"
#include "lowering/lower_kernel_ops.h"

namespace nnfuse {

bool is_recurrent_op(const std::string& op_type) { return op_type == "LSTM" || op_type == "GRU" || op_type == "RNN"; }

bool is_kernel_op(const Node& n) { return n.domain.empty() && (is_recurrent_op(n.op_type) || n.op_type == "NonMaxSuppression"); }

std::string lower_kernel_op(const Node& n, KernelOpContext& cx, Stage& st) {
  st.kind = StageKind::Anchor;
  st.anchor = n.id;
  st.anchor_op = n.op_type;
  if (is_recurrent_op(n.op_type)) return lower_recurrent(n, cx, st);
  if (n.op_type == "NonMaxSuppression") return lower_nms(n, cx, st);
  return "not a kernel op";
}

std::string lower_recurrent(const Node& n, KernelOpContext& cx, Stage& st) {
  const Graph& g = cx.g;
  // LSTM: X, W, R, B [D, 8H], sequence_lens, initial_h, initial_c, P; outputs Y, Y_h, Y_c.
  // GRU:  X, W, R, B [D, 6H], sequence_lens, initial_h;              outputs Y, Y_h.
  // RNN:  X, W, R, B [D, 2H], sequence_lens, initial_h;              outputs Y, Y_h.
  const bool lstm = n.op_type == "LSTM", gru = n.op_type == "GRU";
  const int64_t gates = lstm ? 4 : gru ? 3 : 1;
  const size_t n_in = lstm ? 8 : 6, n_out = lstm ? 3 : 2;
  auto input = [&](size_t i) -> std::string { return i < n.inputs.size() ? n.inputs[i] : std::string(); };
  auto static_shape = [&](const std::string& v) -> std::optional<Shape> {
    const TensorType& t = g.type(v);
    if (!t.is_static()) return std::nullopt;
    return t.static_shape();
  };
  for (size_t i : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(5), size_t(6), size_t(7)})
    if (i < n_in && !input(i).empty() && g.type(input(i)).dtype != DType::Float32)
      return "input " + std::to_string(i) + " ('" + input(i) + "') is " + dtype_name(g.type(input(i)).dtype) + ", not float32";
  // Activations: the LSTM's and GRU's defaults (Sigmoid, Tanh, Tanh; Sigmoid, Tanh) for every
  // direction; an RNN's Tanh (the default), Relu or Sigmoid per direction (mk::RnnActivation).
  std::vector<int64_t> rnn_acts = {0, 0};
  if (const Attribute* acts = n.attrs.find("activations")) {
    static const char* kDefault[] = {"sigmoid", "tanh", "tanh"};
    const size_t per_dir = lstm ? 3 : 2;
    for (size_t i = 0; i < acts->strings.size(); ++i) {
      std::string a;
      for (char ch : acts->strings[i]) a += char(std::tolower(static_cast<unsigned char>(ch)));
      if (!lstm && !gru) {
        const int64_t code = a == "tanh" ? 0 : a == "relu" ? 1 : a == "sigmoid" ? 2 : -1;
        if (code < 0 || i > 1) return "activation '" + acts->strings[i] + "' (Tanh, Relu and Sigmoid are generated)";
        rnn_acts[i] = code;
      } else if (a != kDefault[i % per_dir]) {
        return "activation '" + acts->strings[i] + "' (only the defaults are generated)";
      }
    }
    if (!lstm && !gru && acts->strings.size() == 1) rnn_acts[1] = rnn_acts[0];
  }
  const std::string dir = n.attrs.get_string("direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional") return "direction '" + dir + "'";
  const int D = dir == "bidirectional" ? 2 : 1;
  const int64_t layout = n.attrs.get_int("layout", 0);
  if (layout != 0 && layout != 1) return "layout " + std::to_string(layout);
  auto X = static_shape(input(0));
  if (!X || X->size() != 3) return "X needs a static rank-3 shape";
  const Tensor* W = cx.constant(input(1));
  const Tensor* R = cx.constant(input(2));
  if (!W || !R) return "W and R must be constants (they are packed once at load time)";
  const int64_t S = layout == 0 ? (*X)[0] : (*X)[1], B = layout == 0 ? (*X)[1] : (*X)[0], I = (*X)[2];
  if (R->rank() != 3 || R->dim(0) != D || R->dim(1) % gates != 0) return "R has shape " + shape_str(R->shape());
  const int64_t H = R->dim(2);
  if (R->dim(1) != gates * H || W->rank() != 3 || W->dim(0) != D || W->dim(1) != gates * H || W->dim(2) != I)
    return "W " + shape_str(W->shape()) + " / R " + shape_str(R->shape()) + " do not match X " + shape_str(*X);
  if (n.attrs.has("hidden_size") && n.attrs.get_int("hidden_size", 0) != H) return "hidden_size does not match R";
  // Optional inputs must have the shapes ONNX gives them (the reference kernel reports errors).
  auto check = [&](size_t i, const Shape& want) -> std::string {
    if (input(i).empty()) return "";
    auto s = static_shape(input(i));
    if (!s || *s != want) return "input " + std::to_string(i) + " ('" + input(i) + "') is not " + shape_str(want);
    return "";
  };
  const Shape state = layout == 0 ? Shape{D, B, H} : Shape{B, D, H};
  for (auto [i, want] : {std::pair<size_t, Shape>{3, {D, 2 * gates * H}}, {4, {B}}, {5, state}, {6, state}, {7, {D, 3 * H}}})
    if (i < n_in)
      if (auto e = check(i, want); !e.empty()) return e;
  if (!input(4).empty() && g.type(input(4)).dtype != DType::Int32) return "sequence_lens is not int32";

  st.anchor_inputs.clear();
  for (size_t i = 0; i < n_in; ++i) st.anchor_inputs.push_back(input(i).empty() ? -1 : cx.buffer(input(i)));
  std::vector<int64_t> outs;
  for (size_t i = 0; i < n_out; ++i) {
    int b = i < n.outputs.size() && !n.outputs[i].empty() ? cx.buffer(n.outputs[i]) : -1;
    outs.push_back(b);
    if (b >= 0) st.kernel_outputs.push_back(b);
  }
  st.vparams["outputs"] = outs;
  st.iparams = {{"S", S}, {"B", B}, {"I", I}, {"H", H}, {"D", D}, {"reverse", dir == "reverse"}, {"layout", layout},
                {"input_forget", lstm && n.attrs.get_int("input_forget", 0) != 0},
                {"linear_before_reset", gru && n.attrs.get_int("linear_before_reset", 0) != 0},
                {"act0", rnn_acts[0]}, {"act1", rnn_acts[1]}};
  st.fparams["clip"] = n.attrs.has("clip") ? n.attrs.get_float("clip", 0.f) : 0.0;
  // W^T and R^T packed (mk::LstmWeights / GruWeights), made by the stage's prepare entry point.
  st.prepared = cx.new_buffer(DType::Float32, {}, BufferKind::Weight);
  st.flops = node_flops(g, n.id);
  st.driver = {S, B, H};
  st.rows = S * B;
  st.width = H;
  return "";
}

}  // namespace nnfuse
