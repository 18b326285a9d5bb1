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

// The vision tower (docs/artifact-format.md, "vision"): ViT blocks over 2-D patches, then a 2x2 merger into the
// decoder's width; the placeholder token ids its outputs replace.
struct VisionConfig {
  int32_t depth = 0, hidden_size = 0, num_heads = 0, intermediate_size = 0, in_channels = 3, patch_size = 0,
          temporal_patch_size = 0, spatial_merge_size = 0, out_hidden_size = 0, num_position_embeddings = 0;
  double rope_theta = 10000.0;
  int32_t image_token_id = -1, video_token_id = -1, vision_start_token_id = -1, vision_end_token_id = -1;
  int32_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_values() const { return int64_t(in_channels) * temporal_patch_size * patch_size * patch_size; }
  int32_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
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
  std::optional<VisionConfig> vision;  // the artifact carries a vision tower
  int32_t mtp_layers = 0;
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;

  // Throws ArtifactError (naming `source`) for a missing or inconsistent field.
  static ModelConfig from_json(const json::Value& config, const std::string& source);
  int32_t num_full_attention_layers() const;
  int32_t num_linear_attention_layers() const;
};

}  // namespace ninfer
