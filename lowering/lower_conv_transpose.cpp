// ConvTranspose anchor parameters (see lower_conv_transpose.h). Only the explicit-pads form is
// lowered (what torch and tf2onnx write); auto_pad and output_shape, whose pad split has had
// exporter- and version-dependent readings, stay on the reference kernel.
#include "lowering/lower_conv_transpose.h"

namespace nnfuse {

std::string conv_transpose_params(const Node& n, const Shape& X, const Shape& Wt, const Shape& O, Stage& st) {
  if (X.size() != 4 || Wt.size() != 4 || O.size() != 4) return "only 2-D transposed convolution is lowered";
  if (n.attrs.get_string("auto_pad", "NOTSET") != "NOTSET") return "auto_pad " + n.attrs.get_string("auto_pad", "");
  if (n.attrs.has("output_shape")) return "output_shape attribute";
  const int64_t group = n.attrs.get_int("group", 1);
  auto strides = n.attrs.get_ints("strides", {1, 1}), dil = n.attrs.get_ints("dilations", {1, 1});
  auto pads = n.attrs.get_ints("pads", {0, 0, 0, 0}), out_pad = n.attrs.get_ints("output_padding", {0, 0});
  if (strides.size() != 2 || dil.size() != 2 || pads.size() != 4 || out_pad.size() != 2) return "attribute sizes";
  if (group <= 0 || X[1] % group != 0 || Wt[0] != X[1] || O[1] != Wt[1] * group) return "channel counts";
  const int64_t KH = Wt[2], KW = Wt[3];
  // The output size the attributes give must be the inferred one (else the kernel would misplace taps).
  for (int d = 0; d < 2; ++d) {
    int64_t k = d ? KW : KH;
    int64_t want = (X[size_t(2 + d)] - 1) * strides[size_t(d)] - pads[size_t(d)] - pads[size_t(d + 2)] + (k - 1) * dil[size_t(d)] + 1 +
                   out_pad[size_t(d)];
    if (want != O[size_t(2 + d)]) return "output size " + shape_str(O) + " disagrees with the attributes";
  }
  st.iparams = {{"N", X[0]}, {"C", X[1]}, {"H", X[2]}, {"W", X[3]}, {"CO", O[1]}, {"KH", KH}, {"KW", KW},
                {"OH", O[2]}, {"OW", O[3]}, {"SH", strides[0]}, {"SW", strides[1]}, {"PH", pads[0]}, {"PW", pads[1]},
                {"DH", dil[0]}, {"DW", dil[1]}, {"G", group}};
  st.flops = 2.0 * double(shape_numel(X)) * double(O[1] / group) * double(KH * KW);
  st.width = O[2] * O[3];
  return "";
}

}  // namespace nnfuse
