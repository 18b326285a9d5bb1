#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "errors.h"

namespace ninfer {
namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw ArtifactError(source + ": model config: " + what);
}

int32_t positive_int(const json::Value& v, const char* key, const std::string& source) {
  int64_t n = v[key].as_int();
  if (n <= 0 || n > INT32_MAX) fail(source, std::string(key) + " must be a positive integer, got " + std::to_string(n));
  return int32_t(n);
}

LayerKind parse_layer_kind(const std::string& name, const std::string& source) {
  if (name == "full_attention") return LayerKind::FullAttention;
  if (name == "linear_attention") return LayerKind::LinearAttention;
  fail(source, "unknown layer type '" + name + "'");
}

RopeConfig parse_rope(const json::Value& r, int32_t head_dim, const std::string& source) {
  RopeConfig rope;
  rope.theta = r["theta"].as_number();
  rope.rotary_dim = int32_t(r.int_or("rotary_dim", head_dim));
  const std::string pairing = r.string_or("pairing", "half");
  if (pairing == "half") rope.pairing = RopePairing::Half;
  else if (pairing == "interleaved") rope.pairing = RopePairing::Interleaved;
  else fail(source, "unknown rope pairing '" + pairing + "'");
  if (r.contains("mrope_section") && !r["mrope_section"].is_null())
    for (const auto& s : r["mrope_section"].as_array()) rope.mrope_section.push_back(int32_t(s.as_int()));
  if (rope.theta <= 0) fail(source, "rope.theta must be positive");
  if (rope.rotary_dim <= 0 || rope.rotary_dim > head_dim || rope.rotary_dim % 2 != 0)
    fail(source, "rope.rotary_dim " + std::to_string(rope.rotary_dim) + " must be even and within head_dim " +
                     std::to_string(head_dim));
  return rope;
}

VisionConfig parse_vision(const json::Value& v, int64_t text_hidden, const std::string& source) {
  // Every integer field is required and positive (the converter writes them all).
  static constexpr std::pair<const char*, int32_t VisionConfig::*> kFields[] = {
      {"depth", &VisionConfig::depth},
      {"hidden_size", &VisionConfig::hidden_size},
      {"num_heads", &VisionConfig::num_heads},
      {"intermediate_size", &VisionConfig::intermediate_size},
      {"in_channels", &VisionConfig::in_channels},
      {"patch_size", &VisionConfig::patch_size},
      {"temporal_patch_size", &VisionConfig::temporal_patch_size},
      {"spatial_merge_size", &VisionConfig::spatial_merge_size},
      {"out_hidden_size", &VisionConfig::out_hidden_size},
      {"num_position_embeddings", &VisionConfig::num_position_embeddings},
      {"image_token_id", &VisionConfig::image_token_id},
      {"video_token_id", &VisionConfig::video_token_id},
      {"vision_start_token_id", &VisionConfig::vision_start_token_id},
      {"vision_end_token_id", &VisionConfig::vision_end_token_id},
  };
  VisionConfig c;
  for (const auto& [key, field] : kFields) c.*field = positive_int(v, key, source);
  c.rope_theta = v.number_or("rope_theta", 10000.0);
  if (v.string_or("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh")
    fail(source, "vision.hidden_act must be gelu_pytorch_tanh");
  if (c.hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0)
    fail(source, "vision.hidden_size / num_heads must be a multiple of 4 (the 2-D rotary splits it in quarters)");
  const int32_t side = int32_t(std::lround(std::sqrt(double(c.num_position_embeddings))));
  if (side * side != c.num_position_embeddings) fail(source, "vision.num_position_embeddings must be a square");
  if (c.out_hidden_size != text_hidden)
    fail(source, "vision.out_hidden_size " + std::to_string(c.out_hidden_size) + " differs from hidden_size " +
                     std::to_string(text_hidden));
  return c;
}

}  // namespace

ModelConfig ModelConfig::from_json(const json::Value& c, const std::string& source) {
  ModelConfig m;
  try {
    m.arch = c["arch"].as_string();
    m.vocab_size = positive_int(c, "vocab_size", source);
    m.hidden_size = positive_int(c, "hidden_size", source);
    m.num_layers = positive_int(c, "num_layers", source);
    m.num_heads = positive_int(c, "num_heads", source);
    m.num_kv_heads = positive_int(c, "num_kv_heads", source);
    m.head_dim = positive_int(c, "head_dim", source);
    m.intermediate_size = c.int_or("intermediate_size", 0);
    m.rms_norm_eps = c.number_or("rms_norm_eps", 1e-6);
    m.norm_offset = c.bool_or("norm_offset", false);
    m.attn_output_gate = c.bool_or("attn_output_gate", false);
    m.qk_norm = c.bool_or("qk_norm", false);
    m.qkv_bias = c.bool_or("qkv_bias", false);
    m.tie_word_embeddings = c.bool_or("tie_word_embeddings", false);
    m.max_position_embeddings = c.int_or("max_position_embeddings", 0);
    m.rope = parse_rope(c["rope"], m.head_dim, source);

    if (c.contains("layer_types") && !c["layer_types"].is_null()) {
      for (const auto& t : c["layer_types"].as_array())
        m.layer_types.push_back(parse_layer_kind(t.as_string(), source));
    } else {
      m.layer_types.assign(size_t(m.num_layers), LayerKind::FullAttention);
    }
    if (int64_t(m.layer_types.size()) != m.num_layers)
      fail(source, "layer_types has " + std::to_string(m.layer_types.size()) + " entries for " +
                       std::to_string(m.num_layers) + " layers");

    if (c.contains("linear_attention") && !c["linear_attention"].is_null()) {
      const auto& l = c["linear_attention"];
      LinearAttentionConfig la;
      la.num_key_heads = positive_int(l, "num_key_heads", source);
      la.num_value_heads = positive_int(l, "num_value_heads", source);
      la.key_head_dim = positive_int(l, "key_head_dim", source);
      la.value_head_dim = positive_int(l, "value_head_dim", source);
      la.conv_kernel = positive_int(l, "conv_kernel", source);
      if (la.num_value_heads % la.num_key_heads != 0)
        fail(source, "linear_attention.num_value_heads must be a multiple of num_key_heads");
      m.linear_attention = la;
    }
    if (c.contains("moe") && !c["moe"].is_null()) {
      const auto& e = c["moe"];
      MoeConfig moe;
      moe.num_experts = positive_int(e, "num_experts", source);
      moe.top_k = positive_int(e, "top_k", source);
      moe.intermediate_size = positive_int(e, "intermediate_size", source);
      moe.shared_intermediate_size = int32_t(e.int_or("shared_intermediate_size", 0));
      if (moe.top_k > moe.num_experts) fail(source, "moe.top_k exceeds moe.num_experts");
      m.moe = moe;
    }
    if (c.contains("vision") && !c["vision"].is_null()) m.vision = parse_vision(c["vision"], m.hidden_size, source);
    if (c.contains("mtp") && !c["mtp"].is_null()) m.mtp_layers = int32_t(c["mtp"].int_or("num_layers", 0));
    if (c.contains("eos_token_ids") && !c["eos_token_ids"].is_null())
      for (const auto& t : c["eos_token_ids"].as_array()) m.eos_token_ids.push_back(int32_t(t.as_int()));
    if (c.contains("bos_token_id") && !c["bos_token_id"].is_null())
      m.bos_token_id = int32_t(c["bos_token_id"].as_int());
  } catch (const json::TypeError& e) {
    fail(source, e.what());
  }

  if (m.num_heads % m.num_kv_heads != 0) fail(source, "num_heads must be a multiple of num_kv_heads");
  const bool has_linear = std::find(m.layer_types.begin(), m.layer_types.end(), LayerKind::LinearAttention) !=
                          m.layer_types.end();
  if (has_linear && !m.linear_attention)
    fail(source, "layer_types has linear_attention layers but linear_attention is null");
  if (!m.moe && m.intermediate_size <= 0) fail(source, "intermediate_size must be positive for a dense model");
  if (m.mtp_layers < 0) fail(source, "mtp.num_layers must not be negative");
  return m;
}

int32_t ModelConfig::num_full_attention_layers() const {
  return int32_t(std::count(layer_types.begin(), layer_types.end(), LayerKind::FullAttention));
}

int32_t ModelConfig::num_linear_attention_layers() const {
  return int32_t(std::count(layer_types.begin(), layer_types.end(), LayerKind::LinearAttention));
}

}  // namespace ninfer
