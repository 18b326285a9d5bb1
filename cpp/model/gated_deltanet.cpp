// The Gated DeltaNet block (Qwen3.5 layout): in_qkv -> causal conv + SiLU -> per-head L2-normed q (scaled by
// Dk^-0.5) and k, v; gates g and beta from in_a / in_b; the delta rule over the sequence's state; a plain-weight
// RMSNorm gated by silu(in_z); out_proj.
#include <cmath>

#include "model/blocks.h"

namespace ninfer {

void gdn_block(const PassContext& p, const GdnWeights& w, const float* x, float* out) {
  const LinearAttentionConfig& l = *p.config.linear_attention;
  const GdnShape shape{l.num_key_heads, l.num_value_heads, l.key_head_dim, l.value_head_dim, l.conv_kernel,
                       p.gdn_chunk};
  const int64_t rows = p.rows, channels = shape.conv_channels(),
                qk_width = int64_t(l.num_key_heads) * l.key_head_dim,
                v_width = int64_t(l.num_value_heads) * l.value_head_dim, hv = l.num_value_heads;
  Backend& be = p.backend;
  Scratch& s = p.scratch;

  float* mixed = s.get(Buf::GdnMixed, rows * channels);
  float* z = s.get(Buf::GdnZ, rows * v_width);
  float* b = s.get(Buf::GdnB, rows * hv);
  float* a = s.get(Buf::GdnA, rows * hv);
  const LinearOut projections[] = {{w.in_qkv, mixed}, {w.in_z, z}, {w.in_b, b}, {w.in_a, a}};
  be.linear_shared_input(x, rows, projections);

  // The conv output is [q | k | v] per row; the rule wants each contiguous, q and k L2-normed per head.
  float* q = s.get(Buf::GdnQ, rows * qk_width);
  float* k = s.get(Buf::GdnK, rows * qk_width);
  float* v = s.get(Buf::GdnV, rows * v_width);
  be.gdn_conv_qkv(mixed, p.seqs, shape, w.conv.data(), *p.states, w.state_layer,
                  float(1.0 / std::sqrt(double(l.key_head_dim))), q, k, v);

  float* g = s.get(Buf::GdnG, rows * hv);
  float* beta = s.get(Buf::GdnBeta, rows * hv);
  be.gdn_gates(a, b, rows, int32_t(hv), w.A_log.data(), w.dt_bias.data(), g, beta);

  float* o = s.get(Buf::GdnOut, rows * v_width);
  be.gdn_rule(q, k, v, g, beta, p.seqs, shape, *p.states, w.state_layer, o);
  be.gated_rmsnorm(o, z, rows, int32_t(hv), l.value_head_dim, w.norm.data(), p.eps(), o);
  be.linear(o, rows, *w.out_proj, out);
}

}  // namespace ninfer
