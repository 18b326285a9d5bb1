// The blocks of a decoder layer, each over all rows of a pass. Files: attention.cpp, gated_deltanet.cpp,
// feed_forward.cpp (with decoder_layers).
#pragma once

#include <span>

#include "backend/backend.h"
#include "model/scratch.h"
#include "model/weights.h"

namespace ninfer {

// What a block needs to know about the pass it runs in.
struct PassContext {
  Backend& backend;
  const ModelConfig& config;
  KvPool& kv;
  StatePool* states;             // null for models without linear attention
  Scratch& scratch;
  std::span<const SequenceRows> seqs;
  const int64_t* positions;      // per row (rope.streams per row)
  int64_t rows;
  const RopeSpec& rope;
  int32_t gdn_chunk;
  NormKind norm_kind() const { return config.norm_offset ? NormKind::Offset : NormKind::Plain; }
  float eps() const { return float(config.rms_norm_eps); }
};

// Each writes its block's output [rows, hidden] to `out` from the normed input `x`.
void attention_block(const PassContext& p, const AttentionWeights& w, const float* x, float* out);
void gdn_block(const PassContext& p, const GdnWeights& w, const float* x, float* out);
void feed_forward_block(const PassContext& p, const LayerWeights& w, const float* x, float* out);

// A stack of pre-norm decoder layers, updating the residual stream `hidden` [rows, hidden_size] in place.
void decoder_layers(const PassContext& p, std::span<const LayerWeights> layers, float* hidden);

// inv_freq of the config's rotary embedding (computed as the reference does).
std::vector<float> rope_inverse_frequencies(const RopeConfig& rope);
// M-RoPE: the position stream (0 t, 1 h, 2 w) of each frequency (RopeSpec::freq_stream); empty without M-RoPE.
std::vector<uint8_t> mrope_frequency_streams(const RopeConfig& rope);

}  // namespace ninfer
