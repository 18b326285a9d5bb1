// One decode step of the gated delta rule on the GPU for a batch of sequences (the CPU twin is
// cpu::gdn_recurrent with T = 1). State fp32 [Hv, Dk, Dv] per sequence, updated in place.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gdn_rule_args.h"

namespace ninfer::cuda {

// Row b is sequence b's one new token; states[b] its state.
struct GdnDecodeArgs : GdnRuleArgs {
  int32_t batch = 0;
};

// Throws EngineError for a key head dim the kernel is not built for (16, 32, 64, 128, 256).
void gdn_decode(const GdnDecodeArgs& args, cudaStream_t stream);

}  // namespace ninfer::cuda
