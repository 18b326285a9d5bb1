// The model config as the artifact manifest states it (docs/artifact-format.md, "Model config").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "artifact/json.h"
#include "backend/rope_pairing.h"

namespace ninfer {

enum class LayerKind : uint8_t { FullAttention, LinearAttention };

struct RopeConfig {
  double theta = 10000.0;
  int32_t rotary_dim = 0;
  RopePairing pairing = RopePairing::Half;
  std::vector<int32_t> mrope_section;  // empty: plain 1-D RoPE
};

struct LinearAttentionConfig {
  int32_t num_key_heads = 0, num_value_heads = 0, key_head_dim = 0, value_head_dim = 0, conv_kernel = 4;
};

struct MoeConfig {
  int32_t num_experts = 0, top_k = 0, intermediate_size = 0, shared_intermediate_size = 0;
};

struct ModelConfig {
  std::string arch;
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0;
  int32_t num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::vector<LayerKind> layer_types;
  double rms_norm_eps = 1e-6;
  bool norm_offset = false, attn_output_gate = false, qk_norm = false, qkv_bias = false;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;
  std::optional<LinearAttentionConfig> linear_attention;
  std::optional<MoeConfig> moe;
  int32_t mtp_layers = 0;
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;

  // Throws ArtifactError (naming `source`) for a missing or inconsistent field.
  static ModelConfig from_json(const json::Value& config, const std::string& source);
  int32_t num_full_attention_layers() const;
  int32_t num_linear_attention_layers() const;
};

}  // namespace ninfer
