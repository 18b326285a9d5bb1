// The model's weights as views into the artifact (linear weights stay in their stored encoding) plus the few
// small per-channel vectors (norms, biases, GDN gate parameters, conv taps) read once into f32.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "artifact/artifact.h"
#include "model/config.h"

namespace ninfer {

struct AttentionWeights {
  const TensorView *q_proj = nullptr, *k_proj = nullptr, *v_proj = nullptr, *o_proj = nullptr;
  std::vector<float> q_bias, k_bias, v_bias;  // empty without qkv_bias
  std::vector<float> q_norm, k_norm;          // empty without qk_norm
  int32_t kv_layer = 0;                       // this layer's index in the KV pool
};

struct GdnWeights {
  const TensorView *in_qkv = nullptr, *in_z = nullptr, *in_b = nullptr, *in_a = nullptr, *out_proj = nullptr;
  std::vector<float> conv, A_log, dt_bias, norm;
  int32_t state_layer = 0;  // this layer's index in the GDN state slots
};

struct MlpWeights {
  const TensorView *gate = nullptr, *up = nullptr, *down = nullptr;
};

struct MoeWeights {
  const TensorView *router = nullptr, *experts_gate = nullptr, *experts_up = nullptr, *experts_down = nullptr;
  MlpWeights shared;                                 // all null without a shared expert
  const TensorView* shared_expert_gate = nullptr;
};

struct LayerWeights {
  LayerKind kind = LayerKind::FullAttention;
  std::vector<float> input_norm, post_attn_norm;
  AttentionWeights attn;  // FullAttention
  GdnWeights gdn;         // LinearAttention
  bool is_moe = false;
  MlpWeights mlp;
  MoeWeights moe;
};

struct MtpWeights {
  const TensorView* fc = nullptr;
  std::vector<float> pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  LayerWeights layer;
  // The drafts' shortlist (`ninfer convert --draft-vocab`, python/ninfer/artifact/draft_vocab.py): the lm-head rows
  // of these token ids (ascending, exact integers in f32); none: drafts score the whole lm-head.
  const TensorView* draft_head = nullptr;
  std::vector<float> draft_vocab;
};

struct ModelWeights {
  const TensorView* embed = nullptr;
  const TensorView* lm_head = nullptr;  // the embedding when tied
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;
};

// Looks up every tensor the config needs, checking shapes; throws ArtifactError naming file and tensor.
ModelWeights load_weights(const Artifact& artifact, const ModelConfig& config);

}  // namespace ninfer
