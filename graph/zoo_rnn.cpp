// Recurrent models of the zoo: an LSTM sequence-to-sequence model (stacked encoder, decoder
// initialised from the encoder's final states, teacher forcing), as torch.onnx writes nn.LSTM:
// one ONNX LSTM node per layer, seq-major (layout 0), Squeeze of the direction axis between layers.
#include <cmath>

#include "graph/zoo_common.h"

namespace nnfuse::zoo {

namespace {

// Gain on weights that read LSTM hidden states (see lstm_layer).
constexpr float kHiddenGain = 5.0f;

struct LstmOut {
  std::string y;  // [S, B, H]
  std::string h, c;  // [1, B, H]
};

// One unidirectional LSTM layer with PyTorch's init (uniform in +-1/sqrt(H)), except that input
// weights are scaled by `input_gain`: hidden states of a random LSTM are small (|h| ~ 0.2), and
// without the gain every layer of the stack would shrink the signal further.
LstmOut lstm_layer(Net& n, const std::string& x, int64_t in, int64_t hidden, const std::string& init_h,
                   const std::string& init_c, const std::string& p, float input_gain) {
  float k = 1.0f / std::sqrt(float(hidden));
  float kw = input_gain / std::sqrt(float(in));
  std::string W = n.b.uniform(p + ".W", {1, 4 * hidden, in}, -kw, kw);
  std::string R = n.b.uniform(p + ".R", {1, 4 * hidden, hidden}, -k, k);
  std::string Bias = n.b.uniform(p + ".B", {1, 8 * hidden}, -k, k);
  std::vector<std::string> ins = {x, W, R, Bias};
  if (!init_h.empty()) ins.insert(ins.end(), {"", init_h, init_c});
  auto outs = n.b.op_n("LSTM", ins, 3,
                       // layout (opset 14+) is left at its default 0 (seq-major), as torch.onnx writes nn.LSTM.
                       GraphBuilder::attrs({{"direction", A::s("forward")}, {"hidden_size", A::i(hidden)}}),
                       p);
  return {n.squeeze(outs[0], {1}), outs[1], outs[2]};
}

}  // namespace

Model build_lstm_seq2seq(const Seq2SeqConfig& c, const ZooOptions& opt) {
  Net n(c.name, opt);
  const int64_t S = opt.seq_len > 0 ? opt.seq_len : 32;
  std::string src = n.b.input("src_ids", DType::Int64, {n.seq_dim(S), n.batch_dim()});
  std::string tgt = n.b.input("tgt_ids", DType::Int64, {n.seq_dim(S), n.batch_dim()});
  // nn.Embedding's init is N(0, 1); LSTM input weights of +-1/sqrt(H) keep the gates unsaturated.
  std::string src_emb_w = n.b.weight("encoder.embedding.weight", {c.vocab, c.embed}, 1.0f);
  std::string tgt_emb_w = n.b.weight("decoder.embedding.weight", {c.vocab, c.embed}, 1.0f);

  std::string x = n.op("Gather", {src_emb_w, src}, GraphBuilder::attrs({{"axis", A::i(0)}}), "encoder.embedding");
  std::vector<LstmOut> enc;
  for (int64_t l = 0; l < c.layers; ++l) {
    enc.push_back(lstm_layer(n, x, l == 0 ? c.embed : c.hidden, c.hidden, "", "", "encoder.lstm.l" + std::to_string(l),
                            l == 0 ? 1.0f : kHiddenGain));
    x = enc.back().y;
  }
  // Teacher forcing: the decoder reads the target sequence, starting from the encoder's states.
  std::string y = n.op("Gather", {tgt_emb_w, tgt}, GraphBuilder::attrs({{"axis", A::i(0)}}), "decoder.embedding");
  for (int64_t l = 0; l < c.layers; ++l)
    y = lstm_layer(n, y, l == 0 ? c.embed : c.hidden, c.hidden, enc[size_t(l)].h, enc[size_t(l)].c,
                   "decoder.lstm.l" + std::to_string(l), l == 0 ? 1.0f : kHiddenGain)
            .y;
  std::string w = n.b.weight("decoder.out.weight", {c.hidden, c.vocab}, kHiddenGain / std::sqrt(float(c.hidden)));
  std::string b = n.b.weight("decoder.out.bias", {c.vocab}, 0.01f);
  n.named("Add", {n.op("MatMul", {y, w}, {}, "decoder.out"), b}, {}, "logits");
  n.b.output("logits");
  return n.finish(c.name + ": LSTM seq2seq (" + std::to_string(c.layers) + "+" + std::to_string(c.layers) +
                  " layers, hidden " + std::to_string(c.hidden) + ", vocab " + std::to_string(c.vocab) +
                  ", teacher-forced decoder), seeded random weights");
}

}  // namespace nnfuse::zoo
