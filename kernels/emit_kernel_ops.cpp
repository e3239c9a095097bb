// C++ for kernel-only anchor stages (lowering/lower_kernel_ops.h): one microkernel call each.
#include "kernels/emit_kernel_ops.h"

#include <sstream>

#include "graph/error.h"
#include "lowering/lower_kernel_ops.h"

namespace nnfuse {

namespace {

int64_t ip(const Stage& st, const std::string& k) { return stage_iparam(st, k); }

// `static_cast<T*>(B[i])`, or nullptr for an absent (-1) buffer.
std::string ptr(const std::string& type, int b) {
  if (b < 0) return "nullptr";
  return "static_cast<" + type + "*>(B[" + std::to_string(b) + "])";
}

// LSTM, GRU and RNN (kernels/microkernels/lstm.h, gru.h, rnn.h): the weights packed by the
// prepare entry point; the arguments the three share (mk::RecurrentDims, x, bias, sequence_lens,
// initial_h, clip, Y, Y_h), then each op's own; one kernel call.
std::string emit_recurrent(const Stage& st) {
  const std::string& op = st.anchor_op;
  const std::string kind = op == "LSTM" ? "Lstm" : op == "GRU" ? "Gru" : "Rnn";
  const std::string header = op == "LSTM" ? "lstm" : op == "GRU" ? "gru" : "rnn";
  const std::string sym = stage_symbol(st), W = "nnfuse::mk::" + kind + "Weights<nf::A>";
  const auto& in = st.anchor_inputs;
  const auto& out = st.vparams.at("outputs");
  std::ostringstream o;
  o << "#include \"microkernels/" << header << ".h\"\n";
  o << emit_prepare_release(st, W, std::to_string(ip(st, "D")) + ", " + std::to_string(ip(st, "I")) + ", " + std::to_string(ip(st, "H")) + ", " +
                                    ptr("const float", in.at(1)) + ", " + ptr("const float", in.at(2)));
  o << "extern \"C\" void " << sym << "(const nnfuse_exec_ctx* ctx, void* const* B) {\n";
  o << "  nnfuse::mk::" << kind << "Args a;\n";
  o << "  a.S = " << ip(st, "S") << "; a.B = " << ip(st, "B") << "; a.I = " << ip(st, "I") << "; a.H = " << ip(st, "H") << ";\n";
  o << "  a.directions = " << ip(st, "D") << "; a.reverse = " << (ip(st, "reverse") ? "true" : "false") << "; a.layout = " << ip(st, "layout") << ";\n";
  o << "  a.clip = float(" << st.fparams.at("clip") << ");\n";
  o << "  a.x = " << ptr("const float", in.at(0)) << "; a.bias = " << ptr("const float", in.at(3)) << "; a.seq_lens = " << ptr("const int32_t", in.at(4))
    << "; a.h0 = " << ptr("const float", in.at(5)) << ";\n";
  o << "  a.y = " << ptr("float", int(out.at(0))) << "; a.y_h = " << ptr("float", int(out.at(1))) << ";\n";
  if (op == "LSTM") {
    o << "  a.c0 = " << ptr("const float", in.at(6)) << "; a.peepholes = " << ptr("const float", in.at(7)) << "; a.y_c = " << ptr("float", int(out.at(2)))
      << "; a.input_forget = " << (ip(st, "input_forget") ? "true" : "false") << ";\n";
  } else if (op == "GRU") {
    o << "  a.linear_before_reset = " << (ip(st, "linear_before_reset") ? "true" : "false") << ";\n";
  } else {
    o << "  a.act[0] = nnfuse::mk::RnnActivation(" << ip(st, "act0") << "); a.act[1] = nnfuse::mk::RnnActivation(" << ip(st, "act1") << ");\n";
  }
  o << "  nnfuse::mk::" << header << "<nf::A>(a, *static_cast<const " << W << "*>(B[" << st.prepared << "]), nf::Par{ctx});\n}\n";
  return o.str();
}

std::string emit_nms(const Stage& st) {
  const auto& in = st.anchor_inputs;
  std::ostringstream o;
  o << "#include \"microkernels/nms.h\"\n";
  o << "extern \"C\" void " << stage_symbol(st) << "(const nnfuse_exec_ctx*, void* const* B) {\n";
  o << "  nnfuse::mk::NmsArgs a;\n";
  o << "  a.B = " << ip(st, "B") << "; a.N = " << ip(st, "N") << "; a.C = " << ip(st, "C") << "; a.max_per_class = " << ip(st, "max_per_class")
    << "; a.center_point_box = " << (ip(st, "center_point_box") ? "true" : "false") << ";\n";
  o << "  a.boxes = " << ptr("const float", in.at(0)) << "; a.scores = " << ptr("const float", in.at(1)) << ";\n";
  if (in.at(2) >= 0) o << "  a.iou_threshold = *" << ptr("const float", in[2]) << ";\n";
  if (in.at(3) >= 0) o << "  a.has_score_threshold = true; a.score_threshold = *" << ptr("const float", in[3]) << ";\n";
  o << "  a.selected = " << ptr("int64_t", st.kernel_outputs.at(0)) << "; a.capacity = " << ip(st, "capacity") << ";\n";
  o << "  *" << ptr("int64_t", st.kernel_outputs.at(1)) << " = nnfuse::mk::nms(a);\n}\n";
  return o.str();
}

}  // namespace

bool is_kernel_op_stage(const Stage& s) {
  return s.kind == StageKind::Anchor && (is_recurrent_op(s.anchor_op) || s.anchor_op == "NonMaxSuppression");
}

std::string emit_kernel_op_stage(const Stage& s) {
  if (is_recurrent_op(s.anchor_op)) return emit_recurrent(s);
  if (s.anchor_op == "NonMaxSuppression") return emit_nms(s);
  fail(ErrorKind::Unsupported, "emitter: no code for kernel op " + s.anchor_op + " (stage " + s.name + ")");
}

std::string emit_conv_transpose_call(const Stage& st, const std::string& x, const std::string& w, const std::string& y) {
  std::ostringstream o;
  o << "  nnfuse::mk::ConvTranspose2dArgs a;\n";
  o << "  a.N = " << ip(st, "N") << "; a.C = " << ip(st, "C") << "; a.H = " << ip(st, "H") << "; a.W = " << ip(st, "W") << "; a.K = " << ip(st, "CO")
    << "; a.OH = " << ip(st, "OH") << "; a.OW = " << ip(st, "OW") << "; a.KH = " << ip(st, "KH") << "; a.KW = " << ip(st, "KW") << ";\n";
  o << "  a.stride_h = " << ip(st, "SH") << "; a.stride_w = " << ip(st, "SW") << "; a.pad_top = " << ip(st, "PH") << "; a.pad_left = " << ip(st, "PW")
    << "; a.dil_h = " << ip(st, "DH") << "; a.dil_w = " << ip(st, "DW") << "; a.group = " << ip(st, "G") << ";\n";
  o << "  a.x = " << x << "; a.w = " << w << "; a.y = " << y << ";\n";
  o << "  nnfuse::mk::conv_transpose2d<nf::A>(a, ep, par);\n";
  return o.str();
}

}  // namespace nnfuse
