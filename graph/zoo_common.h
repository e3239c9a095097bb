#pragma once
// Internal to the model zoo (graph/zoo*.cpp): a thin layer over GraphBuilder that writes the op
// forms framework exporters emit for a given opset (ReduceMean axes as attribute or input,
// Squeeze/Unsqueeze axes as inputs, Clip bounds as inputs, LayerNorm/GELU decomposed or not), and
// reshape targets as constants (static shapes) or Shape->Gather->Unsqueeze->Concat chains
// (dynamic axes), as PyTorch writes them.
#include <map>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/zoo.h"

namespace nnfuse::zoo {

// One element of a Reshape/Expand/Slice target: a constant, or dimension `axis` of value `of`
// (whose size in the static build is `value`). Static builds write the whole target as one
// constant; dynamic builds read the `of` dims through Shape chains.
struct TargetDim {
  std::string of;  // "" = constant
  int64_t axis = 0;
  int64_t value = 0;
};
inline TargetDim cdim(int64_t v) { return {"", 0, v}; }
inline TargetDim vdim(const std::string& of, int64_t axis, int64_t v) { return {of, axis, v}; }

class Net {
 public:
  Net(const std::string& name, const ZooOptions& opt);

  GraphBuilder b;
  ZooOptions opt;
  int64_t opset;

  bool dynamic() const { return opt.dynamic_batch; }
  // Input dims: symbolic under dynamic axes, else the configured sizes.
  Dim batch_dim() const { return opt.dynamic_batch ? Dim::sym("batch") : Dim(opt.batch); }
  Dim seq_dim(int64_t s) const { return opt.dynamic_batch ? Dim::sym("sequence") : Dim(s); }

  // Shared small constants (initializers), one per distinct value.
  std::string ints(const std::vector<int64_t>& v);
  std::string int_scalar(int64_t v);
  std::string f(float v);  // 0-D float32

  std::string op(const std::string& type, const std::vector<std::string>& ins, Attributes a = {},
                 const std::string& hint = "") {
    return b.op(type, ins, std::move(a), hint);
  }
  // A node whose single output has a chosen name (graph outputs keep exporter-like names).
  std::string named(const std::string& type, const std::vector<std::string>& ins, Attributes a,
                    const std::string& out_name);

  // Opset-correct forms.
  std::string unsqueeze(const std::string& x, const std::vector<int64_t>& axes);
  std::string squeeze(const std::string& x, const std::vector<int64_t>& axes);
  std::string reduce_mean(const std::string& x, const std::vector<int64_t>& axes, bool keepdims);
  std::string clip(const std::string& x, float lo, float hi);  // ReLU6 as exporters write it
  std::string slice(const std::string& x, const std::vector<int64_t>& starts, const std::vector<TargetDim>& ends,
                    const std::vector<int64_t>& axes);
  // A 1-D int64 target tensor for Reshape/Expand/Slice.
  std::string target(const std::vector<TargetDim>& dims);
  std::string reshape(const std::string& x, const std::vector<TargetDim>& dims, const std::string& hint = "");
  // Scalar (0-D) dim `axis` of x as Shape->Gather (dynamic) or a constant (static).
  std::string dim_scalar(const std::string& x, int64_t axis, int64_t value);

  // Layers with seeded weights.
  // Conv k x k, padding k/2, He init (std sqrt(gain/fan_in)).
  std::string conv(const std::string& x, int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t groups,
                   bool bias, const std::string& hint, float gain = 2.0f);
  // Inference BatchNormalization with running mean ~0 and var ~1; gamma scaled by `gamma_scale`
  // (residual branches use < 1 so the stream stays O(1) through the depth).
  std::string bn(const std::string& x, int64_t c, const std::string& hint, float gamma_scale = 1.0f);
  // MatMul + Add (exporters write nn.Linear on rank > 2 inputs this way); W is [in, out].
  std::string linear(const std::string& x, int64_t in, int64_t out, float stddev, const std::string& hint);
  // Gemm with transB=1 (nn.Linear on a 2-D input); W is [out, in].
  std::string gemm(const std::string& x, int64_t in, int64_t out, float stddev, const std::string& hint,
                   const std::string& out_name = "");
  // LayerNorm over the last axis: decomposed below opset 17, LayerNormalization from 17.
  std::string layer_norm(const std::string& x, int64_t dim, float eps, const std::string& hint,
                         const std::string& out_name = "");
  // GELU: erf form or tanh form, decomposed below opset 20, Gelu op from 20.
  std::string gelu(const std::string& x, bool tanh_form);
  std::string swish(const std::string& x);  // x * Sigmoid(x)

  Model finish(const std::string& description);

 private:
  std::map<std::vector<int64_t>, std::string> ints_;
  std::map<int64_t, std::string> int_scalars_;
  std::map<uint32_t, std::string> floats_;
};

// ---- builders (zoo_cnn.cpp, zoo_transformer.cpp, zoo_rnn.cpp) ----
struct ResNetConfig {
  std::string name;
  bool bottleneck = false;
  std::vector<int64_t> blocks;  // per stage
  int64_t base_width = 64;
  int64_t image = 224;
  int64_t classes = 1000;
};
Model build_resnet(const ResNetConfig& c, const ZooOptions& opt);

// One row of the MobileNetV2 table (expansion t, output channels c, repeats n, first stride s).
struct InvertedResidualRow {
  int64_t t, c, n, s;
};
struct MobileNetV2Config {
  std::string name;
  int64_t stem = 32;
  std::vector<InvertedResidualRow> rows;
  int64_t head = 1280;
  int64_t image = 224;
  int64_t classes = 1000;
};
Model build_mobilenetv2(const MobileNetV2Config& c, const ZooOptions& opt);

// One EfficientNet stage: MBConv(expand, kernel, stride, in -> out) repeated.
struct MBConvStage {
  int64_t expand, kernel, stride, in, out, repeats;
};
struct EfficientNetConfig {
  std::string name;
  int64_t stem = 32;
  std::vector<MBConvStage> stages;
  int64_t head = 1280;
  int64_t image = 224;
  int64_t classes = 1000;
};
Model build_efficientnet(const EfficientNetConfig& c, const ZooOptions& opt);

Model build_vgg16(const ZooOptions& opt);

struct SSDConfig {
  std::string name;
  MobileNetV2Config backbone;
  std::vector<int64_t> extras;  // output channels of each extra feature layer
  int64_t image = 300;
  int64_t classes = 91;         // including background (class 0)
  int64_t max_boxes_per_class = 100;
  float iou_threshold = 0.5f;
  float score_threshold = 0.05f;
};
Model build_ssd(const SSDConfig& c, const ZooOptions& opt);

struct BertConfig {
  std::string name;
  int64_t layers = 12, hidden = 768, heads = 12, ffn = 3072, vocab = 30522, max_pos = 512, type_vocab = 2;
};
Model build_bert(const BertConfig& c, const ZooOptions& opt);

struct GPT2Config {
  std::string name;
  int64_t layers = 12, hidden = 768, heads = 12, vocab = 50257, n_positions = 1024;
};
Model build_gpt2(const GPT2Config& c, const ZooOptions& opt);

struct ViTConfig {
  std::string name;
  int64_t image = 224, patch = 16, hidden = 768, layers = 12, heads = 12, mlp = 3072, classes = 1000;
};
Model build_vit(const ViTConfig& c, const ZooOptions& opt);

struct Seq2SeqConfig {
  std::string name;
  int64_t layers = 4, hidden = 1024, embed = 1024, vocab = 8000;
};
Model build_lstm_seq2seq(const Seq2SeqConfig& c, const ZooOptions& opt);

}  // namespace nnfuse::zoo
