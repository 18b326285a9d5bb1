// The operands of the gated delta rule that the GPU decode step (gdn_decode.h) and prefill (gdn_prefill.h) share;
// each adds how its rows map to sequences.
#pragma once

#include <cstdint>

namespace ninfer::cuda {

struct GdnRuleArgs {
  int32_t num_key_heads = 0, num_value_heads = 0, key_head_dim = 0, value_head_dim = 0;
  const float* q = nullptr;        // [rows, Hk, Dk], L2-normalised, q scaled by Dk^-0.5
  const float* k = nullptr;        // [rows, Hk, Dk], L2-normalised
  const float* v = nullptr;        // [rows, Hv, Dv]
  const float* g = nullptr;        // [rows, Hv] log decay (<= 0)
  const float* beta = nullptr;     // [rows, Hv]
  float* const* states = nullptr;  // device table of one pointer per sequence to its [Hv, Dk, Dv] f32 state
  float* out = nullptr;            // [rows, Hv, Dv]
};

}  // namespace ninfer::cuda
