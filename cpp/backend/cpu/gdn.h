// Gated DeltaNet kernels of the CPU backend (qwen35-architecture.md section 4). One sequence per call; state fp32.
#pragma once

#include <cstdint>

namespace ninfer::cpu {

// Causal depthwise conv + SiLU over T new tokens of one sequence.
// mixed [T, C]: pre-conv in_proj_qkv outputs. weight [C, K] f32: weight[c, K-1] multiplies the current token.
// state [C, K-1] f32: the previous K-1 pre-conv inputs, oldest first (zeros for a fresh sequence); updated in place.
// out [T, C] = silu(conv). `out` may not alias `mixed`.
void gdn_causal_conv(const float* mixed, int64_t T, int64_t C, const float* weight, int32_t K, float* state,
                     float* out);

struct GdnDims {
  int32_t num_key_heads;    // Hk
  int32_t num_value_heads;  // Hv, a multiple of Hk; value head j reads key head j / (Hv / Hk)
  int32_t key_head_dim;     // Dk
  int32_t value_head_dim;   // Dv
};

// Gated delta rule over T tokens. q, k [T, Hk, Dk] are already L2-normalised (and q scaled by Dk^-0.5);
// v [T, Hv, Dv]; g [T, Hv] log-decay (<= 0); beta [T, Hv]; state [Hv, Dk, Dv] f32, updated in place;
// out [T, Hv, Dv]. Per token and value head: S = exp(g) S; p = S^T k; S += k (beta (v - p))^T; o = S^T q.
void gdn_recurrent(const GdnDims& d, int64_t T, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* state, float* out);

// The same result by the chunked (WY / UT-transform) form, `chunk` tokens at a time, state carried in fp32.
// Agrees with gdn_recurrent to rounding for every T and chunk size.
void gdn_chunked(const GdnDims& d, int64_t T, const float* q, const float* k, const float* v, const float* g,
                 const float* beta, float* state, float* out, int32_t chunk = 64);

}  // namespace ninfer::cpu
