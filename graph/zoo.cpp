#include "graph/zoo.h"

#include "graph/zoo_common.h"

namespace nnfuse {

namespace {

using namespace zoo;

// The MobileNetV2 table of the paper (t, c, n, s).
MobileNetV2Config mobilenetv2_config() {
  return {"mobilenetv2", 32, {{1, 16, 1, 1}, {6, 24, 2, 2}, {6, 32, 3, 2}, {6, 64, 4, 2}, {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}},
          1280, 224, 1000};
}
// Same shape of table with small widths and one block per row (stride pattern kept).
MobileNetV2Config mobilenet_tiny_config() {
  return {"mobilenet_tiny", 8, {{1, 8, 1, 1}, {6, 8, 2, 2}, {6, 16, 1, 2}, {6, 16, 1, 2}, {6, 24, 1, 1}, {6, 32, 1, 2}, {6, 32, 1, 1}},
          64, 32, 10};
}

EfficientNetConfig efficientnet_b0_config() {
  return {"efficientnet_b0",
          32,
          {{1, 3, 1, 32, 16, 1},
           {6, 3, 2, 16, 24, 2},
           {6, 5, 2, 24, 40, 2},
           {6, 3, 2, 40, 80, 3},
           {6, 5, 1, 80, 112, 3},
           {6, 5, 2, 112, 192, 4},
           {6, 3, 1, 192, 320, 1}},
          1280,
          224,
          1000};
}
EfficientNetConfig efficientnet_tiny_config() {
  return {"efficientnet_tiny",
          8,
          {{1, 3, 1, 8, 8, 1}, {6, 3, 2, 8, 12, 2}, {6, 5, 2, 12, 16, 1}, {6, 3, 2, 16, 24, 1}, {6, 5, 1, 24, 32, 1}},
          64,
          32,
          10};
}

const std::vector<ZooEntry>& all_models() {
  static const std::vector<ZooEntry> models = {
      {"resnet18", "ResNet-18 (BasicBlock [2,2,2,2], 224x224, 1000 classes, 11.7M parameters)", "residual_cnn", false,
       [](const ZooOptions& o) { return build_resnet({"resnet18", false, {2, 2, 2, 2}, 64, 224, 1000}, o); }},
      {"resnet50", "ResNet-50 v1.5 (Bottleneck [3,4,6,3], 224x224, 1000 classes, 25.6M parameters)", "residual_cnn", false,
       [](const ZooOptions& o) { return build_resnet({"resnet50", true, {3, 4, 6, 3}, 64, 224, 1000}, o); }},
      {"resnet_tiny", "ResNet with BasicBlock [1,1,1,1], width 8, 32x32, 10 classes", "residual_cnn", true,
       [](const ZooOptions& o) { return build_resnet({"resnet_tiny", false, {1, 1, 1, 1}, 8, 32, 10}, o); }},
      {"mobilenetv2", "MobileNetV2 (width 1.0, 224x224, 1000 classes, 3.5M parameters)", "mobile_cnn", false,
       [](const ZooOptions& o) { return build_mobilenetv2(mobilenetv2_config(), o); }},
      {"mobilenet_tiny", "MobileNetV2 layout with small widths, 32x32, 10 classes", "mobile_cnn", true,
       [](const ZooOptions& o) { return build_mobilenetv2(mobilenet_tiny_config(), o); }},
      {"efficientnet_b0", "EfficientNet-B0 (MBConv + SE, 224x224, 1000 classes, 5.3M parameters)", "mobile_cnn", false,
       [](const ZooOptions& o) { return build_efficientnet(efficientnet_b0_config(), o); }},
      {"efficientnet_tiny", "EfficientNet layout with small widths, 32x32, 10 classes", "mobile_cnn", true,
       [](const ZooOptions& o) { return build_efficientnet(efficientnet_tiny_config(), o); }},
      {"vgg16", "VGG-16 configuration D (224x224, 1000 classes, 138M parameters)", "generic", false,
       [](const ZooOptions& o) { return build_vgg16(o); }},
      {"ssd_mobilenet", "SSD detector on MobileNetV2 (300x300, 6 levels, 1917 anchors, 91 classes, NMS)", "detector", false,
       [](const ZooOptions& o) {
         MobileNetV2Config bb = mobilenetv2_config();
         return build_ssd({"ssd_mobilenet", bb, {512, 256, 256, 128}, 300, 91, 100, 0.5f, 0.05f}, o);
       }},
      {"ssd_tiny", "SSD detector on a small MobileNetV2, 64x64, 4 levels, 5 classes, NMS", "detector", true,
       [](const ZooOptions& o) {
         MobileNetV2Config bb = mobilenet_tiny_config();
         return build_ssd({"ssd_tiny", bb, {32, 16}, 64, 5, 10, 0.5f, 0.05f}, o);
       }},
      {"bert_base", "BERT-base encoder (12 layers, hidden 768, 12 heads, vocab 30522, 110M parameters)",
       "transformer_encoder", false, [](const ZooOptions& o) { return build_bert({"bert_base"}, o); }},
      {"bert_tiny", "BERT encoder with 2 layers, hidden 128, 2 heads, FFN 512, vocab 1000", "transformer_encoder", true,
       [](const ZooOptions& o) { return build_bert({"bert_tiny", 2, 128, 2, 512, 1000, 512, 2}, o); }},
      {"gpt2", "GPT-2 small (12 layers, hidden 768, 12 heads, vocab 50257, 124M parameters)", "transformer_decoder",
       false, [](const ZooOptions& o) { return build_gpt2({"gpt2"}, o); }},
      {"gpt2_tiny", "GPT-2 decoder with 2 layers, hidden 128, 2 heads, vocab 1000, 128 positions", "transformer_decoder",
       true, [](const ZooOptions& o) { return build_gpt2({"gpt2_tiny", 2, 128, 2, 1000, 128}, o); }},
      {"vit_b16", "ViT-B/16 (224x224, patch 16, 12 layers, hidden 768, 86M parameters)", "transformer_encoder", false,
       [](const ZooOptions& o) { return build_vit({"vit_b16"}, o); }},
      {"vit_tiny", "ViT with 32x32 images, patch 8, 2 layers, hidden 64, 2 heads, 10 classes", "transformer_encoder",
       true, [](const ZooOptions& o) { return build_vit({"vit_tiny", 32, 8, 64, 2, 2, 128, 10}, o); }},
      {"lstm_seq2seq", "LSTM seq2seq (4+4 layers, hidden 1024, vocab 8000, teacher-forced decoder)", "rnn", false,
       [](const ZooOptions& o) { return build_lstm_seq2seq({"lstm_seq2seq"}, o); }},
      {"lstm_tiny", "LSTM seq2seq with 2+2 layers, hidden 32, embedding 32, vocab 100", "rnn", true,
       [](const ZooOptions& o) { return build_lstm_seq2seq({"lstm_tiny", 2, 32, 32, 100}, o); }},
  };
  return models;
}

}  // namespace

const std::vector<ZooEntry>& zoo_models() { return all_models(); }

Model build_zoo_model(const std::string& name, const ZooOptions& opt) {
  std::string known;
  for (auto& e : zoo_models()) {
    if (e.name == name) {
      Model m = e.build(opt);
      m.metadata["zoo_model"] = e.name;
      m.metadata["network_class"] = e.network_class;
      return m;
    }
    known += (known.empty() ? "" : ", ") + e.name;
  }
  fail(ErrorKind::Invalid, "unknown zoo model '" + name + "' (known: " + known + ")");
}

}  // namespace nnfuse
