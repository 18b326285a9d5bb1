// The full (optionally gated) attention block: q/k/v projections (+bias), per-head q/k norm, partial RoPE,
// paged KV write, GQA attention, the sigmoid output gate, o_proj.
#include <cmath>

#include "errors.h"

#include "model/blocks.h"

namespace ninfer {

std::vector<float> rope_inverse_frequencies(const RopeConfig& rope) {
  std::vector<float> inv(size_t(rope.rotary_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = float(1.0 / std::pow(rope.theta, double(2 * i) / double(rope.rotary_dim)));
  return inv;
}

std::vector<uint8_t> mrope_frequency_streams(const RopeConfig& rope) {
  if (rope.mrope_section.empty()) return {};
  if (rope.mrope_section.size() != 3) throw EngineError("mrope_section must have 3 entries (t, h, w)");
  // The interleaved layout (HF applies it whatever mrope_interleaved says): frequency i is h's when i % 3 == 1
  // within h's 3 * section, w's when i % 3 == 2 within w's, else t's.
  std::vector<uint8_t> stream(size_t(rope.rotary_dim / 2), 0);
  for (int32_t i = 0; i < int32_t(stream.size()); ++i)
    for (int32_t s = 1; s <= 2; ++s)
      if (i % 3 == s && i < 3 * rope.mrope_section[size_t(s)]) stream[size_t(i)] = uint8_t(s);
  return stream;
}

void attention_block(const PassContext& p, const AttentionWeights& w, const float* x, float* out) {
  const ModelConfig& c = p.config;
  const int64_t rows = p.rows, d = c.head_dim, hq = c.num_heads, hkv = c.num_kv_heads;
  const bool gated = c.attn_output_gate;
  // With the output gate, q_proj rows hold [q | gate] per head: query head h starts at h * 2D.
  const int64_t q_head_stride = gated ? 2 * d : d, q_width = hq * q_head_stride, kv_width = hkv * d;
  Backend& be = p.backend;

  float* q = p.scratch.get(Buf::AttnQ, rows * q_width);
  float* k = p.scratch.get(Buf::AttnK, rows * kv_width);
  float* v = p.scratch.get(Buf::AttnV, rows * kv_width);
  const LinearOut qkv[] = {{w.q_proj, q, w.q_bias.empty() ? nullptr : w.q_bias.data()},
                           {w.k_proj, k, w.k_bias.empty() ? nullptr : w.k_bias.data()},
                           {w.v_proj, v, w.v_bias.empty() ? nullptr : w.v_bias.data()}};
  be.linear_shared_input(x, rows, qkv);
  if (!w.q_norm.empty()) {
    // Query head h of row r sits at (r * hq + h) * q_head_stride, so heads are rows of a strided matrix.
    be.rmsnorm(q, rows * hq, d, q_head_stride, w.q_norm.data(), p.norm_kind(), p.eps(), q, q_head_stride);
    be.rmsnorm(k, rows * hkv, d, d, w.k_norm.data(), p.norm_kind(), p.eps(), k, d);
  }
  be.rope(q, rows, int32_t(hq), q_head_stride, q_width, p.positions, p.rope);
  be.rope(k, rows, int32_t(hkv), d, kv_width, p.positions, p.rope);
  be.kv_write(k, v, p.seqs, p.kv, w.kv_layer);

  float* attn = p.scratch.get(Buf::AttnOut, rows * hq * d);
  const AttentionShape shape{int32_t(hq), int32_t(hkv), int32_t(d), float(1.0 / std::sqrt(double(d)))};
  be.attention(q, q_width, q_head_stride, p.seqs, p.kv, w.kv_layer, shape, attn);
  if (gated) be.sigmoid_gate(attn, rows, int32_t(hq), int32_t(d), q + d, q_width, q_head_stride);
  be.linear(attn, rows, *w.o_proj, out);
}

}  // namespace ninfer
