// Transformers of the zoo: BERT (post-LN encoder), GPT-2 (pre-LN decoder with a causal mask) and
// ViT (pre-LN encoder on image patches), written as torch.onnx exports of the HuggingFace and
// torchvision modules show them.
#include <cmath>

#include "graph/zoo_common.h"

namespace nnfuse::zoo {

namespace {

// Weight init of BERT/GPT-2 (N(0, 0.02)); LayerNorm keeps activations O(1) whatever the depth.
constexpr float kInitStd = 0.02f;

Attributes perm(std::vector<int64_t> p) { return GraphBuilder::attrs({{"perm", A::is(std::move(p))}}); }

// [B, S, H*D] -> [B, H, S, D] (key_t: [B, H, D, S] as a second Transpose, as K^T exports).
std::string split_heads(Net& n, const std::string& t, int64_t B, int64_t S, int64_t H, int64_t D, bool key_t) {
  std::string r = n.reshape(t, {vdim(t, 0, B), vdim(t, 1, S), cdim(H), cdim(D)});
  std::string heads = n.op("Transpose", {r}, perm({0, 2, 1, 3}));
  if (key_t) heads = n.op("Transpose", {heads}, perm({0, 1, 3, 2}));
  return heads;
}

// [B, H, S, D] -> [B, S, H*D]
std::string merge_heads(Net& n, const std::string& ctx, int64_t B, int64_t S, int64_t hidden) {
  std::string t = n.op("Transpose", {ctx}, perm({0, 2, 1, 3}));
  return n.reshape(t, {vdim(t, 0, B), vdim(t, 1, S), cdim(hidden)});
}

// Scaled dot-product attention core on [B, H, S, D] heads. `mask_add` (may be empty) is added to
// the scaled scores; `causal` (may be empty) is a bool [1, 1, S, S] mask applied with Where.
std::string attention_core(Net& n, const std::string& q, const std::string& kt, const std::string& v, int64_t D,
                           const std::string& mask_add, const std::string& causal) {
  std::string scores = n.op("Div", {n.op("MatMul", {q, kt}), n.f(std::sqrt(float(D)))});
  if (!causal.empty()) scores = n.op("Where", {causal, scores, n.f(-10000.0f)});
  if (!mask_add.empty()) scores = n.op("Add", {scores, mask_add});
  std::string probs = n.op("Softmax", {scores}, GraphBuilder::attrs({{"axis", A::i(-1)}}));
  return n.op("MatMul", {probs, v});
}

// Self-attention with separate Q/K/V projections (BERT, ViT).
std::string self_attention(Net& n, const std::string& x, const std::string& p, int64_t B, int64_t S, int64_t hidden,
                           int64_t heads, const std::string& mask_add, float init_std) {
  int64_t D = hidden / heads;
  std::string q = split_heads(n, n.linear(x, hidden, hidden, init_std, p + ".query"), B, S, heads, D, false);
  std::string k = split_heads(n, n.linear(x, hidden, hidden, init_std, p + ".key"), B, S, heads, D, true);
  std::string v = split_heads(n, n.linear(x, hidden, hidden, init_std, p + ".value"), B, S, heads, D, false);
  std::string ctx = merge_heads(n, attention_core(n, q, k, v, D, mask_add, ""), B, S, hidden);
  return n.linear(ctx, hidden, hidden, init_std, p + ".output.dense");
}

int64_t seq_or(const ZooOptions& opt, int64_t dflt, int64_t max, const std::string& model) {
  int64_t s = opt.seq_len > 0 ? opt.seq_len : dflt;
  if (s > max)
    fail(ErrorKind::Invalid, model + ": seq_len " + std::to_string(s) + " exceeds the " + std::to_string(max) + " positions of the model");
  return s;
}

}  // namespace

// ---------------------------------------------------------------- BERT

Model build_bert(const BertConfig& c, const ZooOptions& opt) {
  Net n(c.name, opt);
  const int64_t B = opt.batch, S = seq_or(opt, std::min<int64_t>(128, c.max_pos), c.max_pos, c.name);
  const int64_t H = c.hidden;
  std::string ids = n.b.input("input_ids", DType::Int64, {n.batch_dim(), n.seq_dim(S)});
  std::string mask = n.b.input("attention_mask", DType::Int64, {n.batch_dim(), n.seq_dim(S)});

  // Embeddings: word + position + token type, LayerNorm. position_ids / token_type_ids are
  // [1, max_pos] buffers sliced to the sequence length.
  std::string word_w = n.b.weight("embeddings.word_embeddings.weight", {c.vocab, H}, kInitStd);
  std::string pos_w = n.b.weight("embeddings.position_embeddings.weight", {c.max_pos, H}, kInitStd);
  std::string type_w = n.b.weight("embeddings.token_type_embeddings.weight", {c.type_vocab, H}, kInitStd);
  std::vector<int64_t> positions(static_cast<size_t>(c.max_pos));
  for (int64_t i = 0; i < c.max_pos; ++i) positions[size_t(i)] = i;
  std::string pos_buf = n.b.constant("embeddings.position_ids", Tensor::from_vector<int64_t>({1, c.max_pos}, positions));
  std::string type_buf = n.b.constant("embeddings.token_type_ids", Tensor(DType::Int64, {1, c.max_pos}));
  std::string pos_ids = n.slice(pos_buf, {0}, {vdim(ids, 1, S)}, {1});
  std::string type_ids = n.slice(type_buf, {0}, {vdim(ids, 1, S)}, {1});
  std::string emb = n.op("Gather", {word_w, ids}, GraphBuilder::attrs({{"axis", A::i(0)}}), "embeddings.word");
  emb = n.op("Add", {emb, n.op("Gather", {type_w, type_ids}, GraphBuilder::attrs({{"axis", A::i(0)}}), "embeddings.token_type")});
  emb = n.op("Add", {emb, n.op("Gather", {pos_w, pos_ids}, GraphBuilder::attrs({{"axis", A::i(0)}}), "embeddings.position")});
  std::string x = n.layer_norm(emb, H, 1e-12f, "embeddings.LayerNorm");

  // Extended mask: (1 - mask[:, None, None, :]) * -10000, broadcast over heads and queries.
  std::string m = n.op("Cast", {n.unsqueeze(n.unsqueeze(mask, {1}), {2})}, GraphBuilder::attrs({{"to", A::i(int64_t(DType::Float32))}}));
  std::string mask_add = n.op("Mul", {n.op("Sub", {n.f(1.0f), m}), n.f(-10000.0f)}, {}, "extended_attention_mask");

  for (int64_t l = 0; l < c.layers; ++l) {
    std::string p = "encoder.layer." + std::to_string(l);
    std::string attn = self_attention(n, x, p + ".attention", B, S, H, c.heads, mask_add, kInitStd);
    bool last = l + 1 == c.layers;
    x = n.layer_norm(n.op("Add", {attn, x}), H, 1e-12f, p + ".attention.output.LayerNorm");
    std::string ff = n.gelu(n.linear(x, H, c.ffn, kInitStd, p + ".intermediate.dense"), false);
    ff = n.linear(ff, c.ffn, H, kInitStd, p + ".output.dense");
    x = n.layer_norm(n.op("Add", {ff, x}), H, 1e-12f, p + ".output.LayerNorm", last ? "last_hidden_state" : "");
  }
  if (c.layers == 0) x = n.named("Identity", {x}, {}, "last_hidden_state");
  // Pooler: dense + tanh on the first token.
  std::string first = n.op("Gather", {x, n.int_scalar(0)}, GraphBuilder::attrs({{"axis", A::i(1)}}), "pooler.first_token");
  std::string pooled = n.gemm(first, H, H, kInitStd, "pooler.dense");
  n.named("Tanh", {pooled}, {}, "pooler_output");
  n.b.output("last_hidden_state");
  n.b.output("pooler_output");
  return n.finish(c.name + ": BERT encoder (" + std::to_string(c.layers) + " layers, hidden " + std::to_string(H) + ", " +
                  std::to_string(c.heads) + " heads), seeded random weights");
}

// ---------------------------------------------------------------- GPT-2

Model build_gpt2(const GPT2Config& c, const ZooOptions& opt) {
  Net n(c.name, opt);
  const int64_t B = opt.batch, S = seq_or(opt, std::min<int64_t>(64, c.n_positions), c.n_positions, c.name);
  const int64_t H = c.hidden, D = c.hidden / c.heads;
  std::string ids = n.b.input("input_ids", DType::Int64, {n.batch_dim(), n.seq_dim(S)});

  std::string wte = n.b.weight("transformer.wte.weight", {c.vocab, H}, kInitStd);
  std::string wpe = n.b.weight("transformer.wpe.weight", {c.n_positions, H}, 0.01f);
  std::string pos_ids;
  if (n.dynamic()) {
    // position_ids = arange(0, S).unsqueeze(0)
    std::string s = n.dim_scalar(ids, 1, S);
    pos_ids = n.unsqueeze(n.op("Range", {n.int_scalar(0), s, n.int_scalar(1)}), {0});
  } else {
    std::vector<int64_t> p(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) p[size_t(i)] = i;
    pos_ids = n.b.constant("position_ids", Tensor::from_vector<int64_t>({1, S}, p));
  }
  std::string x = n.op("Add", {n.op("Gather", {wte, ids}, GraphBuilder::attrs({{"axis", A::i(0)}}), "transformer.wte"),
                               n.op("Gather", {wpe, pos_ids}, GraphBuilder::attrs({{"axis", A::i(0)}}), "transformer.wpe")});

  // The causal mask buffer: lower-triangular bool [1, 1, n_positions, n_positions], sliced to S.
  const int64_t P = c.n_positions;
  Tensor tril(DType::Bool, {1, 1, P, P});
  bool* tp = tril.data<bool>();
  for (int64_t i = 0; i < P; ++i)
    for (int64_t j = 0; j <= i; ++j) tp[i * P + j] = true;
  std::string bias_buf = n.b.constant("attn.bias", tril);

  // Residual projections scaled by 1/sqrt(2 * layers) as GPT-2 initialises them.
  const float proj_std = kInitStd / std::sqrt(2.0f * float(std::max<int64_t>(1, c.layers)));
  for (int64_t l = 0; l < c.layers; ++l) {
    std::string p = "transformer.h." + std::to_string(l);
    std::string h = n.layer_norm(x, H, 1e-5f, p + ".ln_1");
    std::string qkv = n.linear(h, H, 3 * H, kInitStd, p + ".attn.c_attn");
    auto parts = n.b.op_n("Split", {qkv, n.ints({H, H, H})}, 3, GraphBuilder::attrs({{"axis", A::i(2)}}), p + ".attn.split");
    std::string q = split_heads(n, parts[0], B, S, c.heads, D, false);
    // GPT-2 permutes keys straight to [B, H, D, S].
    std::string kr = n.reshape(parts[1], {vdim(parts[1], 0, B), vdim(parts[1], 1, S), cdim(c.heads), cdim(D)});
    std::string kt = n.op("Transpose", {kr}, perm({0, 2, 3, 1}));
    std::string v = split_heads(n, parts[2], B, S, c.heads, D, false);
    std::string causal = n.slice(bias_buf, {0, 0}, {vdim(q, 2, S), vdim(kt, 3, S)}, {2, 3});
    std::string ctx = merge_heads(n, attention_core(n, q, kt, v, D, "", causal), B, S, H);
    x = n.op("Add", {n.linear(ctx, H, H, proj_std, p + ".attn.c_proj"), x});
    h = n.layer_norm(x, H, 1e-5f, p + ".ln_2");
    std::string ff = n.gelu(n.linear(h, H, 4 * H, kInitStd, p + ".mlp.c_fc"), true);
    x = n.op("Add", {n.linear(ff, 4 * H, H, proj_std, p + ".mlp.c_proj"), x});
  }
  x = n.layer_norm(x, H, 1e-5f, "transformer.ln_f");
  // LM head tied to the token embedding.
  std::string wte_t = n.op("Transpose", {wte}, perm({1, 0}), "lm_head.weight_t");
  n.named("MatMul", {x, wte_t}, {}, "logits");
  n.b.output("logits");
  return n.finish(c.name + ": GPT-2 decoder (" + std::to_string(c.layers) + " layers, hidden " + std::to_string(H) + ", " +
                  std::to_string(c.heads) + " heads, tied LM head), seeded random weights");
}

// ---------------------------------------------------------------- ViT

Model build_vit(const ViTConfig& c, const ZooOptions& opt) {
  Net n(c.name, opt);
  const int64_t B = opt.batch, H = c.hidden, grid = c.image / c.patch, T = grid * grid + 1;
  std::string img = n.b.input("input", DType::Float32, {n.batch_dim(), 3, c.image, c.image});
  std::string w = n.b.weight("conv_proj.weight", {H, 3, c.patch, c.patch}, std::sqrt(1.0f / float(3 * c.patch * c.patch)));
  std::string bias = n.b.weight("conv_proj.bias", {H}, 0.01f);
  std::string x = n.op("Conv", {img, w, bias},
                       GraphBuilder::attrs({{"dilations", A::is({1, 1})},
                                            {"group", A::i(1)},
                                            {"kernel_shape", A::is({c.patch, c.patch})},
                                            {"pads", A::is({0, 0, 0, 0})},
                                            {"strides", A::is({c.patch, c.patch})}}),
                       "conv_proj");
  // [B, H, g, g] -> [B, H, g*g] -> [B, g*g, H]
  x = n.reshape(x, {vdim(x, 0, B), cdim(H), cdim(grid * grid)});
  x = n.op("Transpose", {x}, perm({0, 2, 1}));
  std::string cls = n.b.weight("class_token", {1, 1, H}, kInitStd);
  std::string cls_b = n.op("Expand", {cls, n.target({vdim(x, 0, B), cdim(1), cdim(1)})});
  x = n.op("Concat", {cls_b, x}, GraphBuilder::attrs({{"axis", A::i(1)}}));
  x = n.op("Add", {x, n.b.weight("encoder.pos_embedding", {1, T, H}, kInitStd)});
  for (int64_t l = 0; l < c.layers; ++l) {
    std::string p = "encoder.layers.encoder_layer_" + std::to_string(l);
    std::string h = n.layer_norm(x, H, 1e-6f, p + ".ln_1");
    x = n.op("Add", {self_attention(n, h, p + ".self_attention", B, T, H, c.heads, "", kInitStd), x});
    h = n.layer_norm(x, H, 1e-6f, p + ".ln_2");
    h = n.linear(n.gelu(n.linear(h, H, c.mlp, kInitStd, p + ".mlp.0"), false), c.mlp, H, kInitStd, p + ".mlp.3");
    x = n.op("Add", {h, x});
  }
  x = n.layer_norm(x, H, 1e-6f, "encoder.ln");
  std::string first = n.op("Gather", {x, n.int_scalar(0)}, GraphBuilder::attrs({{"axis", A::i(1)}}), "cls_token");
  n.gemm(first, H, c.classes, kInitStd, "heads.head", "logits");
  n.b.output("logits");
  return n.finish(c.name + ": Vision Transformer (patch " + std::to_string(c.patch) + ", " + std::to_string(c.layers) +
                  " layers, hidden " + std::to_string(H) + "), seeded random weights");
}

}  // namespace nnfuse::zoo
