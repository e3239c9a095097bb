// NonMaxSuppression lowered to one kernel-only anchor stage (kernels/microkernels/nms.h).
//
// Its output row count depends on the data. Rather than a run-time allocation (which only
// fallback stages could handle), the output gets a static capacity, B * C * min(max boxes per
// class, N) rows, so it is planned like any buffer; the kernel stores the actual count in a
// one-element int64 buffer (KBuffer::row_count) that the runtime and the cross driver read to
// trim the output, and that fallback stages consuming it use as its leading dim.
#include "graph/op_registry.h"
#include "lowering/lower_kernel_ops.h"

namespace nnfuse {

std::string lower_nms(const Node& n, KernelOpContext& cx, Stage& st) {
  const Graph& g = cx.g;
  auto input = [&](size_t i) -> std::string { return i < n.inputs.size() ? n.inputs[i] : std::string(); };
  const TensorType &bt = g.type(input(0)), &sct = g.type(input(1));
  if (!bt.is_static() || !sct.is_static()) return "boxes and scores need static shapes";
  if (bt.dtype != DType::Float32 || sct.dtype != DType::Float32) return "boxes and scores must be float32";
  Shape bs = bt.static_shape(), ss = sct.static_shape();
  if (bs.size() != 3 || bs[2] != 4 || ss.size() != 3 || ss[0] != bs[0] || ss[2] != bs[1])
    return "boxes " + shape_str(bs) + " and scores " + shape_str(ss) + " must be [B,N,4] and [B,C,N]";
  const int64_t B = bs[0], N = bs[1], C = ss[1];
  // The capacity needs max_output_boxes_per_class at lowering time.
  int64_t max_per_class = 0;
  if (!input(2).empty()) {
    const Tensor* m = cx.constant(input(2));
    if (!m) return "max_output_boxes_per_class is not a constant (the output needs a static capacity)";
    max_per_class = m->numel() > 0 ? m->as_int(0) : 0;
  }
  for (size_t i : {size_t(3), size_t(4)}) {
    if (input(i).empty()) continue;
    const TensorType& t = g.type(input(i));
    if (t.dtype != DType::Float32 || !t.is_static() || shape_numel(t.static_shape()) != 1)
      return "input " + std::to_string(i) + " ('" + input(i) + "') is not a one-element float32 tensor";
  }
  const int64_t capacity = B * C * std::max<int64_t>(0, std::min(max_per_class, N));
  if (n.outputs.empty() || n.outputs[0].empty()) return "no output";
  st.anchor_inputs = {cx.buffer(input(0)), cx.buffer(input(1)), input(3).empty() ? -1 : cx.buffer(input(3)),
                      input(4).empty() ? -1 : cx.buffer(input(4))};
  const int out = cx.buffer(n.outputs[0]);
  const int count = cx.new_buffer(DType::Int64, {1}, BufferKind::Output);
  KBuffer& o = cx.mod.buffers[size_t(out)];
  o.dynamic = false;
  o.dtype = DType::Int64;
  o.shape = {capacity, 3};
  o.bytes = capacity * 3 * int64_t(sizeof(int64_t));
  o.row_count = count;
  st.kernel_outputs = {out, count};
  st.iparams = {{"B", B}, {"N", N}, {"C", C}, {"max_per_class", max_per_class}, {"capacity", capacity},
                {"center_point_box", n.attrs.get_int("center_point_box", 0) != 0}};
  st.flops = node_flops(g, n.id);
  st.driver = {capacity, 3};
  st.rows = capacity;
  st.width = 3;
  return "";
}

}  // namespace nnfuse
