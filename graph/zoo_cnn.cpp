// Convolutional networks of the zoo: ResNet (torchvision v1.5 layout), MobileNetV2, EfficientNet,
// VGG-16 and an SSD detector on the MobileNetV2 backbone.
#include <cmath>

#include "graph/zoo_common.h"

namespace nnfuse::zoo {

namespace {

// Residual branches end in a BN whose gamma is scaled down, so that the sum of identity and
// branch grows slowly over tens of blocks instead of doubling the variance per block.
constexpr float kResidualGamma = 0.3f;
// Conv init gains that keep the second moment of activations near 1 (He init generalised): a
// conv reading the output of an activation with E[f(x)^2] = m for x ~ N(0, 1) gets gain 1/m
// (ReLU: 2). SiLU has m ~= 0.355; an SE gate near sigmoid(0) = 0.5 scales it by 0.25 more; a
// conv reading a linear (BN-only) output gets gain 1.
constexpr float kGainAfterSwish = 2.8f;
constexpr float kGainAfterSwishGate = 11.3f;
constexpr float kGainLinear = 1.0f;

std::string image_input(Net& n, int64_t image) {
  return n.b.input("input", DType::Float32, {n.batch_dim(), 3, image, image});
}

int64_t conv_out(int64_t in, int64_t k, int64_t stride) { return (in + 2 * (k / 2) - k) / stride + 1; }

// Global average pool, Flatten, Gemm: the classifier tail torchvision models export.
std::string classifier(Net& n, const std::string& x, int64_t c, int64_t classes, float gain = 1.0f) {
  std::string pooled = n.op("GlobalAveragePool", {x}, {}, "avgpool");
  std::string flat = n.op("Flatten", {pooled}, GraphBuilder::attrs({{"axis", A::i(1)}}), "flatten");
  return n.gemm(flat, c, classes, std::sqrt(gain / float(c)), "fc", "logits");
}

}  // namespace

// ---------------------------------------------------------------- ResNet

Model build_resnet(const ResNetConfig& c, const ZooOptions& opt) {
  Net n(c.name, opt);
  std::string x = image_input(n, c.image);
  x = n.op("Relu", {n.bn(n.conv(x, 3, c.base_width, 7, 2, 1, false, "conv1"), c.base_width, "bn1")});
  x = n.op("MaxPool", {x},
           GraphBuilder::attrs({{"ceil_mode", A::i(0)},
                                {"kernel_shape", A::is({3, 3})},
                                {"pads", A::is({1, 1, 1, 1})},
                                {"strides", A::is({2, 2})}}),
           "maxpool");
  const int64_t expansion = c.bottleneck ? 4 : 1;
  int64_t in = c.base_width;
  for (size_t stage = 0; stage < c.blocks.size(); ++stage) {
    int64_t width = c.base_width << stage;
    for (int64_t blk = 0; blk < c.blocks[stage]; ++blk) {
      std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(blk);
      int64_t stride = (blk == 0 && stage > 0) ? 2 : 1;
      int64_t out = width * expansion;
      std::string y;
      if (c.bottleneck) {
        // v1.5: the stride sits on the 3x3 conv.
        y = n.op("Relu", {n.bn(n.conv(x, in, width, 1, 1, 1, false, p + ".conv1"), width, p + ".bn1")});
        y = n.op("Relu", {n.bn(n.conv(y, width, width, 3, stride, 1, false, p + ".conv2"), width, p + ".bn2")});
        y = n.bn(n.conv(y, width, out, 1, 1, 1, false, p + ".conv3"), out, p + ".bn3", kResidualGamma);
      } else {
        y = n.op("Relu", {n.bn(n.conv(x, in, width, 3, stride, 1, false, p + ".conv1"), width, p + ".bn1")});
        y = n.bn(n.conv(y, width, out, 3, 1, 1, false, p + ".conv2"), out, p + ".bn2", kResidualGamma);
      }
      std::string identity = x;
      if (stride != 1 || in != out)
        identity = n.bn(n.conv(x, in, out, 1, stride, 1, false, p + ".downsample.0"), out, p + ".downsample.1");
      x = n.op("Relu", {n.op("Add", {y, identity})});
      in = out;
    }
  }
  classifier(n, x, in, c.classes);
  n.b.output("logits");
  return n.finish(c.name + ": ResNet (torchvision layout, " + (c.bottleneck ? "Bottleneck" : "BasicBlock") +
                  " blocks), seeded random weights");
}

// ---------------------------------------------------------------- MobileNetV2

namespace {

struct Features {
  std::string out;
  int64_t channels = 0;
  int64_t size = 0;
  // For SSD: the expansion output of the first block that goes from stride 16 to stride 32.
  std::string tap;
  int64_t tap_channels = 0, tap_size = 0;
};

std::string conv_bn_relu6(Net& n, const std::string& x, int64_t cin, int64_t cout, int64_t k, int64_t stride,
                          int64_t groups, const std::string& p) {
  return n.clip(n.bn(n.conv(x, cin, cout, k, stride, groups, false, p + ".0"), cout, p + ".1"), 0.0f, 6.0f);
}

Features mobilenetv2_features(Net& n, const std::string& input, const MobileNetV2Config& c) {
  Features f;
  int64_t size = conv_out(c.image, 3, 2), stride_total = 2;
  std::string x = conv_bn_relu6(n, input, 3, c.stem, 3, 2, 1, "features.0");
  int64_t in = c.stem;
  int idx = 1;
  for (auto& row : c.rows) {
    for (int64_t i = 0; i < row.n; ++i, ++idx) {
      std::string p = "features." + std::to_string(idx) + ".conv";
      int64_t stride = i == 0 ? row.s : 1;
      int64_t hidden = in * row.t;
      std::string y = x;
      int layer = 0;
      if (row.t != 1) {
        y = conv_bn_relu6(n, y, in, hidden, 1, 1, 1, p + "." + std::to_string(layer++));
        if (stride == 2 && stride_total == 16 && f.tap.empty()) {
          f.tap = y;
          f.tap_channels = hidden;
          f.tap_size = size;
        }
      }
      y = conv_bn_relu6(n, y, hidden, hidden, 3, stride, hidden, p + "." + std::to_string(layer++));
      bool residual = stride == 1 && in == row.c;
      // Linear bottleneck: projection without activation.
      y = n.bn(n.conv(y, hidden, row.c, 1, 1, 1, false, p + "." + std::to_string(layer)), row.c,
               p + "." + std::to_string(layer + 1), residual ? kResidualGamma : 1.0f);
      x = residual ? n.op("Add", {x, y}) : y;
      in = row.c;
      size = conv_out(size, 3, stride);
      stride_total *= stride;
    }
  }
  x = conv_bn_relu6(n, x, in, c.head, 1, 1, 1, "features." + std::to_string(idx));
  f.out = x;
  f.channels = c.head;
  f.size = size;
  return f;
}

}  // namespace

Model build_mobilenetv2(const MobileNetV2Config& c, const ZooOptions& opt) {
  Net n(c.name, opt);
  Features f = mobilenetv2_features(n, image_input(n, c.image), c);
  classifier(n, f.out, f.channels, c.classes);
  n.b.output("logits");
  return n.finish(c.name + ": MobileNetV2 (inverted residuals, ReLU6 as Clip), seeded random weights");
}

// ---------------------------------------------------------------- EfficientNet

Model build_efficientnet(const EfficientNetConfig& c, const ZooOptions& opt) {
  Net n(c.name, opt);
  std::string x = image_input(n, c.image);
  x = n.swish(n.bn(n.conv(x, 3, c.stem, 3, 2, 1, false, "features.0.0"), c.stem, "features.0.1"));
  int64_t in = c.stem;
  int stage_idx = 1;
  for (auto& st : c.stages) {
    for (int64_t i = 0; i < st.repeats; ++i) {
      std::string p = "features." + std::to_string(stage_idx) + "." + std::to_string(i) + ".block";
      int64_t stride = i == 0 ? st.stride : 1;
      int64_t block_in = i == 0 ? st.in : st.out;
      if (block_in != in) fail(ErrorKind::Invalid, "efficientnet table: stage input " + std::to_string(block_in) + " != " + std::to_string(in));
      int64_t hidden = block_in * st.expand;
      std::string y = x;
      int layer = 0;
      if (st.expand != 1) {
        std::string q = p + "." + std::to_string(layer++);
        y = n.swish(n.bn(n.conv(y, block_in, hidden, 1, 1, 1, false, q + ".0", kGainLinear), hidden, q + ".1"));
      }
      {
        std::string q = p + "." + std::to_string(layer++);
        // Reads the expand activation (SiLU), or for expand 1 the linear block input.
        float gain = st.expand != 1 ? kGainAfterSwish : kGainLinear;
        y = n.swish(n.bn(n.conv(y, hidden, hidden, st.kernel, stride, hidden, false, q + ".0", gain), hidden, q + ".1"));
      }
      {
        // Squeeze-and-excitation: squeeze to a quarter of the block input channels.
        std::string q = p + "." + std::to_string(layer++);
        int64_t squeeze = std::max<int64_t>(1, block_in / 4);
        std::string s = n.op("GlobalAveragePool", {y}, {}, q + ".avgpool");
        s = n.swish(n.conv(s, hidden, squeeze, 1, 1, 1, true, q + ".fc1"));
        s = n.op("Sigmoid", {n.conv(s, squeeze, hidden, 1, 1, 1, true, q + ".fc2", 1.0f)});
        y = n.op("Mul", {y, s});
      }
      bool residual = stride == 1 && block_in == st.out;
      std::string q = p + "." + std::to_string(layer);
      y = n.bn(n.conv(y, hidden, st.out, 1, 1, 1, false, q + ".0", kGainAfterSwishGate), st.out, q + ".1",
               residual ? kResidualGamma : 1.0f);
      x = residual ? n.op("Add", {y, x}) : y;
      in = st.out;
    }
    ++stage_idx;
  }
  std::string p = "features." + std::to_string(stage_idx);
  x = n.swish(n.bn(n.conv(x, in, c.head, 1, 1, 1, false, p + ".0", kGainLinear), c.head, p + ".1"));
  classifier(n, x, c.head, c.classes, kGainAfterSwish);
  n.b.output("logits");
  return n.finish(c.name + ": EfficientNet (MBConv with squeeze-excitation, SiLU as x*Sigmoid(x)), seeded random weights");
}

// ---------------------------------------------------------------- VGG-16

Model build_vgg16(const ZooOptions& opt) {
  Net n("vgg16", opt);
  std::string x = image_input(n, 224);
  // Configuration D; 0 marks a 2x2 max pool.
  const int64_t cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};
  int64_t in = 3;
  int idx = 0;
  for (int64_t v : cfg) {
    std::string p = "features." + std::to_string(idx);
    if (v == 0) {
      x = n.op("MaxPool", {x},
               GraphBuilder::attrs({{"ceil_mode", A::i(0)},
                                    {"kernel_shape", A::is({2, 2})},
                                    {"pads", A::is({0, 0, 0, 0})},
                                    {"strides", A::is({2, 2})}}),
               p);
      idx += 1;
    } else {
      x = n.op("Relu", {n.conv(x, in, v, 3, 1, 1, true, p)});
      in = v;
      idx += 2;
    }
  }
  x = n.op("Flatten", {x}, GraphBuilder::attrs({{"axis", A::i(1)}}), "flatten");
  x = n.op("Relu", {n.gemm(x, 512 * 7 * 7, 4096, std::sqrt(2.0f / (512 * 7 * 7)), "classifier.0")});
  x = n.op("Relu", {n.gemm(x, 4096, 4096, std::sqrt(2.0f / 4096), "classifier.3")});
  n.gemm(x, 4096, 1000, std::sqrt(1.0f / 4096), "classifier.6", "logits");
  n.b.output("logits");
  return n.finish("vgg16: VGG-16 configuration D (13 conv + 3 FC, no BN), seeded random weights");
}

// ---------------------------------------------------------------- SSD on MobileNetV2

namespace {

struct Anchor {
  float cy, cx, h, w;
};

// SSD anchors per level, in the order a head's output is flattened: (row, col, anchor).
// The lowest level uses 3 anchors (small box, 2:1, 1:2) as SSD-MobileNet does; the others 6
// (ratios 1, 2, 1/2, 3, 1/3 and an extra square at the geometric mean of this and the next scale).
std::vector<Anchor> level_anchors(int64_t level, int64_t num_levels, int64_t fsize, int64_t per_location) {
  const float smin = 0.2f, smax = 0.95f;
  auto scale = [&](int64_t k) { return smin + (smax - smin) * float(k) / float(std::max<int64_t>(1, num_levels - 1)); };
  float s = scale(level), s_next = level + 1 < num_levels ? scale(level + 1) : 1.0f;
  std::vector<std::pair<float, float>> shapes;  // (h, w)
  auto add = [&](float sc, float ar) { shapes.push_back({sc / std::sqrt(ar), sc * std::sqrt(ar)}); };
  if (per_location == 3) {
    add(0.1f, 1.0f);
    add(s, 2.0f);
    add(s, 0.5f);
  } else {
    add(s, 1.0f);
    add(s, 2.0f);
    add(s, 0.5f);
    add(s, 3.0f);
    add(s, 1.0f / 3.0f);
    add(std::sqrt(s * s_next), 1.0f);
  }
  std::vector<Anchor> r;
  for (int64_t i = 0; i < fsize; ++i)
    for (int64_t j = 0; j < fsize; ++j)
      for (auto& [h, w] : shapes) r.push_back({(float(i) + 0.5f) / float(fsize), (float(j) + 0.5f) / float(fsize), h, w});
  return r;
}

}  // namespace

Model build_ssd(const SSDConfig& c, const ZooOptions& opt) {
  Net n(c.name, opt);
  MobileNetV2Config bc = c.backbone;
  bc.image = c.image;
  Features f = mobilenetv2_features(n, image_input(n, c.image), bc);
  if (f.tap.empty()) fail(ErrorKind::Invalid, c.name + ": backbone has no stride-16 feature map");

  struct Level {
    std::string x;
    int64_t channels, size;
  };
  std::vector<Level> levels = {{f.tap, f.tap_channels, f.tap_size}, {f.out, f.channels, f.size}};
  // Extra feature layers (SSDLite style): 1x1 reduce, depthwise 3x3 stride 2, 1x1 expand.
  for (size_t e = 0; e < c.extras.size(); ++e) {
    const Level& prev = levels.back();
    std::string p = "extras." + std::to_string(e);
    int64_t mid = c.extras[e] / 2;
    std::string y = conv_bn_relu6(n, prev.x, prev.channels, mid, 1, 1, 1, p + ".0");
    y = conv_bn_relu6(n, y, mid, mid, 3, 2, mid, p + ".1");
    y = conv_bn_relu6(n, y, mid, c.extras[e], 1, 1, 1, p + ".2");
    levels.push_back({y, c.extras[e], conv_out(prev.size, 3, 2)});
  }

  std::vector<std::string> box_parts, cls_parts;
  std::vector<float> anchor_yx, anchor_hw;
  const int64_t L = int64_t(levels.size());
  for (int64_t l = 0; l < L; ++l) {
    const Level& lv = levels[size_t(l)];
    int64_t a = l == 0 ? 3 : 6;
    std::string p = "head." + std::to_string(l);
    // Heads are linear: small weights keep the box codes (exponentiated below) moderate.
    std::string box = n.conv(lv.x, lv.channels, a * 4, 3, 1, 1, true, p + ".bbox", 0.1f);
    std::string cls = n.conv(lv.x, lv.channels, a * c.classes, 3, 1, 1, true, p + ".cls", 1.0f);
    // [B, A*K, H, W] -> [B, H, W, A*K] -> [B, H*W*A, K], as view(N, -1, K) exports.
    auto flatten_head = [&](const std::string& t, int64_t k) {
      std::string tr = n.op("Transpose", {t}, GraphBuilder::attrs({{"perm", A::is({0, 2, 3, 1})}}));
      return n.reshape(tr, {vdim(tr, 0, opt.batch), cdim(-1), cdim(k)});
    };
    box_parts.push_back(flatten_head(box, 4));
    cls_parts.push_back(flatten_head(cls, c.classes));
    for (auto& an : level_anchors(l, L, lv.size, a)) {
      anchor_yx.insert(anchor_yx.end(), {an.cy, an.cx});
      anchor_hw.insert(anchor_hw.end(), {an.h, an.w});
    }
  }
  const int64_t num_anchors = int64_t(anchor_yx.size() / 2);
  std::string rel = n.op("Concat", box_parts, GraphBuilder::attrs({{"axis", A::i(1)}}), "bbox_regression");
  std::string logits = n.op("Concat", cls_parts, GraphBuilder::attrs({{"axis", A::i(1)}}), "cls_logits");
  std::string scores = n.named("Softmax", {logits}, GraphBuilder::attrs({{"axis", A::i(-1)}}), "scores");

  // Box decoding (center-size codes with variances 0.1/0.2, i.e. scale factors 10 and 5).
  std::string a_yx = n.b.constant("anchors_yx", Tensor::from_vector<float>({1, num_anchors, 2}, anchor_yx));
  std::string a_hw = n.b.constant("anchors_hw", Tensor::from_vector<float>({1, num_anchors, 2}, anchor_hw));
  std::string t_yx = n.slice(rel, {0}, {cdim(2)}, {2});
  std::string t_hw = n.slice(rel, {2}, {cdim(4)}, {2});
  std::string center = n.op("Add", {n.op("Mul", {n.op("Div", {t_yx, n.f(10.0f)}), a_hw}), a_yx});
  std::string half = n.op("Mul", {n.op("Mul", {n.op("Exp", {n.op("Div", {t_hw, n.f(5.0f)})}), a_hw}), n.f(0.5f)});
  std::string boxes = n.named("Concat", {n.op("Sub", {center, half}), n.op("Add", {center, half})},
                              GraphBuilder::attrs({{"axis", A::i(2)}}), "boxes");

  // NMS over the foreground classes: scores as [B, C-1, N].
  std::string per_class = n.op("Transpose", {scores}, GraphBuilder::attrs({{"perm", A::is({0, 2, 1})}}));
  std::string fg = n.slice(per_class, {1}, {cdim(c.classes)}, {1});
  std::string max_out = n.ints({c.max_boxes_per_class});
  std::string iou = n.b.constant("iou_threshold", Tensor::from_vector<float>({1}, {c.iou_threshold}));
  std::string score_th = n.b.constant("score_threshold", Tensor::from_vector<float>({1}, {c.score_threshold}));
  n.named("NonMaxSuppression", {boxes, fg, max_out, iou, score_th},
          GraphBuilder::attrs({{"center_point_box", A::i(0)}}), "selected_indices");
  n.b.output("boxes");
  n.b.output("scores");
  n.b.output("selected_indices");
  return n.finish(c.name + ": SSD detector on MobileNetV2 (" + std::to_string(L) + " levels, " +
                  std::to_string(num_anchors) + " anchors, NonMaxSuppression), seeded random weights");
}

}  // namespace nnfuse::zoo
