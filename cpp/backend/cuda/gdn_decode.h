// One decode step of the gated delta rule on the GPU for a batch of sequences (the CPU twin is
// cpu::gdn_recurrent with T = 1). State fp32 [Hv, Dk, Dv] per sequence, updated in place.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ninfer::cuda {

struct GdnDecodeArgs {
  int32_t batch = 0;
  int32_t num_key_heads = 0, num_value_heads = 0, key_head_dim = 0, value_head_dim = 0;
  const float* q = nullptr;     // [batch, Hk, Dk], L2-normalised, q scaled by Dk^-0.5
  const float* k = nullptr;     // [batch, Hk, Dk], L2-normalised
  const float* v = nullptr;     // [batch, Hv, Dv]
  const float* g = nullptr;     // [batch, Hv] log decay
  const float* beta = nullptr;  // [batch, Hv]
  float* const* states = nullptr;  // device array of `batch` pointers to [Hv, Dk, Dv] f32
  float* out = nullptr;         // [batch, Hv, Dv]
};

// Throws EngineError for a key head dim the kernel is not built for (16, 32, 64, 128, 256).
void gdn_decode(const GdnDecodeArgs& args, cudaStream_t stream);

}  // namespace ninfer::cuda
