#include "model/weights.h"

#include <cmath>

#include "backend/cpu/linear.h"

namespace ninfer {
namespace {

class Loader {
 public:
  Loader(const Artifact& a, const ModelConfig& c) : a_(a), c_(c) {}

  const TensorView* matrix(const std::string& name, std::vector<int64_t> shape) { return &a_.tensor(name, shape); }

  // Small vectors are read once into f32 whatever their encoding.
  std::vector<float> vector(const std::string& name, std::vector<int64_t> shape) {
    const TensorView& t = a_.tensor(name, shape);
    std::vector<float> out(size_t(t.numel()));
    cpu::dequantize(t, out.data());
    return out;
  }

  AttentionWeights attention(const std::string& p, int32_t kv_layer) {
    const int64_t h = c_.hidden_size, d = c_.head_dim, q = int64_t(c_.num_heads) * d,
                  kv = int64_t(c_.num_kv_heads) * d;
    AttentionWeights w;
    w.q_proj = matrix(p + "q_proj", {c_.attn_output_gate ? 2 * q : q, h});
    w.k_proj = matrix(p + "k_proj", {kv, h});
    w.v_proj = matrix(p + "v_proj", {kv, h});
    w.o_proj = matrix(p + "o_proj", {h, q});
    if (c_.qkv_bias) {
      w.q_bias = vector(p + "q_bias", {c_.attn_output_gate ? 2 * q : q});
      w.k_bias = vector(p + "k_bias", {kv});
      w.v_bias = vector(p + "v_bias", {kv});
    }
    if (c_.qk_norm) {
      w.q_norm = vector(p + "q_norm", {d});
      w.k_norm = vector(p + "k_norm", {d});
    }
    w.kv_layer = kv_layer;
    return w;
  }

  GdnWeights gdn(const std::string& p, int32_t state_layer) {
    const LinearAttentionConfig& l = *c_.linear_attention;
    const int64_t h = c_.hidden_size, vd = int64_t(l.num_value_heads) * l.value_head_dim,
                  ch = 2LL * l.num_key_heads * l.key_head_dim + vd;
    GdnWeights w;
    w.in_qkv = matrix(p + "in_qkv", {ch, h});
    w.in_z = matrix(p + "in_z", {vd, h});
    w.in_b = matrix(p + "in_b", {l.num_value_heads, h});
    w.in_a = matrix(p + "in_a", {l.num_value_heads, h});
    w.out_proj = matrix(p + "out_proj", {h, vd});
    w.conv = vector(p + "conv", {ch, l.conv_kernel});
    w.A_log = vector(p + "A_log", {l.num_value_heads});
    w.dt_bias = vector(p + "dt_bias", {l.num_value_heads});
    w.norm = vector(p + "norm", {l.value_head_dim});
    w.state_layer = state_layer;
    return w;
  }

  MlpWeights mlp(const std::string& p, int64_t inter) {
    const int64_t h = c_.hidden_size;
    return {matrix(p + "gate", {inter, h}), matrix(p + "up", {inter, h}), matrix(p + "down", {h, inter})};
  }

  MoeWeights moe(const std::string& p) {
    const MoeConfig& m = *c_.moe;
    const int64_t h = c_.hidden_size, e = m.num_experts, i = m.intermediate_size;
    MoeWeights w;
    w.router = matrix(p + "router", {e, h});
    w.experts_gate = matrix(p + "experts_gate", {e, i, h});
    w.experts_up = matrix(p + "experts_up", {e, i, h});
    w.experts_down = matrix(p + "experts_down", {e, h, i});
    if (m.shared_intermediate_size > 0) {
      const int64_t s = m.shared_intermediate_size;
      w.shared = {matrix(p + "shared_gate", {s, h}), matrix(p + "shared_up", {s, h}),
                  matrix(p + "shared_down", {h, s})};
      w.shared_expert_gate = matrix(p + "shared_expert_gate", {1, h});
    }
    return w;
  }

  LayerWeights layer(const std::string& p, LayerKind kind, int32_t kv_layer, int32_t state_layer) {
    LayerWeights w;
    w.kind = kind;
    w.input_norm = vector(p + "input_norm", {c_.hidden_size});
    w.post_attn_norm = vector(p + "post_attn_norm", {c_.hidden_size});
    if (kind == LayerKind::FullAttention) w.attn = attention(p + "attn.", kv_layer);
    else w.gdn = gdn(p + "gdn.", state_layer);
    w.is_moe = c_.moe.has_value();
    if (w.is_moe) w.moe = moe(p + "moe.");
    else w.mlp = mlp(p + "mlp.", c_.intermediate_size);
    return w;
  }

 private:
  const Artifact& a_;
  const ModelConfig& c_;
};

}  // namespace

ModelWeights load_weights(const Artifact& artifact, const ModelConfig& c) {
  Loader load(artifact, c);
  ModelWeights w;
  w.embed = load.matrix("embed", {c.vocab_size, c.hidden_size});
  w.lm_head = c.tie_word_embeddings ? w.embed : load.matrix("lm_head", {c.vocab_size, c.hidden_size});
  w.final_norm = load.vector("final_norm", {c.hidden_size});
  int32_t kv_layer = 0, state_layer = 0;
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const LayerKind kind = c.layer_types[size_t(i)];
    w.layers.push_back(load.layer("layers." + std::to_string(i) + ".", kind, kv_layer, state_layer));
    (kind == LayerKind::FullAttention ? kv_layer : state_layer)++;
  }
  // The MTP layer is a full-attention layer whose KV follows the main model's in the same pages. Every
  // checkpoint of the family has exactly one; more would need per-layer fc/norm names the format lacks.
  if (c.mtp_layers > 1)
    throw ArtifactError(artifact.path() + ": " + std::to_string(c.mtp_layers) + " MTP layers; ninfer runs at most 1");
  if (c.mtp_layers == 1) {
    MtpWeights m;
    m.fc = load.matrix("mtp.fc", {c.hidden_size, 2 * c.hidden_size});
    m.pre_fc_norm_embedding = load.vector("mtp.pre_fc_norm_embedding", {c.hidden_size});
    m.pre_fc_norm_hidden = load.vector("mtp.pre_fc_norm_hidden", {c.hidden_size});
    m.norm = load.vector("mtp.norm", {c.hidden_size});
    m.layer = load.layer("mtp.layers.0.", LayerKind::FullAttention, kv_layer, -1);
    if (artifact.has("mtp.draft_vocab")) {
      const int64_t rows = artifact.tensor("mtp.draft_vocab").numel();
      m.draft_vocab = load.vector("mtp.draft_vocab", {rows});
      m.draft_head = load.matrix("mtp.draft_head", {rows, c.hidden_size});
      for (size_t i = 0; i < m.draft_vocab.size(); ++i) {
        const float id = m.draft_vocab[i];
        if (!(id >= 0 && id < float(c.vocab_size) && id == std::floor(id) && (i == 0 || id > m.draft_vocab[i - 1])))
          throw ArtifactError(artifact.path() + ": mtp.draft_vocab[" + std::to_string(i) + "] = " +
                              std::to_string(id) + " is not an ascending token id below " +
                              std::to_string(c.vocab_size));
      }
    }
    w.mtp = std::move(m);
  }
  return w;
}

}  // namespace ninfer
