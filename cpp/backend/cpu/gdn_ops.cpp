// Gated DeltaNet ops of the CPU backend: per-sequence conv and delta rule over the state pool, and the gates.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gdn.h"
#include "cache/state_pool.h"

namespace ninfer::cpu {

void CpuBackend::gdn_conv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                          const float* weight, StatePool& states, int32_t layer, float* out) {
  const int64_t c = shape.conv_channels();
  for (const SequenceRows& s : seqs) {
    if (s.source_slot >= 0) states.copy_conv(s.source_slot, s.state_slot, layer);
    gdn_causal_conv(mixed + s.row0 * c, s.n, c, weight, shape.conv_kernel, states.conv(s.state_slot, layer),
                    out + s.row0 * c);
  }
}

void CpuBackend::gdn_conv_qkv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                              const float* weight, StatePool& states, int32_t layer, float q_scale, float* q,
                              float* k, float* v) {
  int64_t rows = 0;
  for (const SequenceRows& s : seqs) rows = std::max(rows, s.row0 + s.n);
  const int64_t c = shape.conv_channels(), dk = shape.key_head_dim, qk_width = shape.num_key_heads * dk;
  gdn_conv_rows_.resize(size_t(rows * c));
  float* conv = gdn_conv_rows_.data();
  gdn_conv(mixed, seqs, shape, weight, states, layer, conv);
  l2norm_heads(conv, rows, shape.num_key_heads, int32_t(dk), c, q_scale, q);
  l2norm_heads(conv + qk_width, rows, shape.num_key_heads, int32_t(dk), c, 1.0f, k);
  copy_columns(conv + 2 * qk_width, rows, c, int64_t(shape.num_value_heads) * shape.value_head_dim, v);
}

static inline float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

void CpuBackend::gdn_gates(const float* a, const float* b, int64_t rows, int32_t heads, const float* A_log,
                           const float* dt_bias, float* g, float* beta) {
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t h = 0; h < heads; ++h) {
      const int64_t i = r * heads + h;
      g[i] = -std::exp(A_log[h]) * softplus(a[i] + dt_bias[h]);
      beta[i] = 1.0f / (1.0f + std::exp(-b[i]));
    }
}

void CpuBackend::gdn_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                          std::span<const SequenceRows> seqs, const GdnShape& shape, StatePool& states,
                          int32_t layer, float* out) {
  const GdnDims dims{shape.num_key_heads, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim};
  const int64_t qk = int64_t(shape.num_key_heads) * shape.key_head_dim;
  const int64_t vd = int64_t(shape.num_value_heads) * shape.value_head_dim;
  const int64_t hv = shape.num_value_heads;
  for (const SequenceRows& s : seqs) {
    const int64_t r = s.row0;
    if (s.source_slot >= 0) states.copy_recurrent(s.source_slot, s.state_slot, layer);
    float* state = states.recurrent(s.state_slot, layer);
    if (s.n == 1)
      gdn_recurrent(dims, 1, q + r * qk, k + r * qk, v + r * vd, g + r * hv, beta + r * hv, state, out + r * vd);
    else
      gdn_chunked(dims, s.n, q + r * qk, k + r * qk, v + r * vd, g + r * hv, beta + r * hv, state, out + r * vd,
                  shape.chunk);
  }
}

}  // namespace ninfer::cpu
