// Decode steps of the gated delta rule on the GPU for a batch of sequences (the CPU twin is cpu::gdn_recurrent
// with T = 1 per step). State fp32 [Hv, Dk, Dv] per sequence: updated in place, or, for the runs of a speculative
// verify pass, read once and written after every step into that step's own slot.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gdn_rule_args.h"

namespace ninfer::cuda {

// A run of consecutive decode steps of one sequence: rows [row0, row0 + n), the state read from states[run] and
// the state after row row0 + t written to step_states[out_first + t] (an MTP verify lane: each row's state into
// its own slot, so the caller keeps the one of the last accepted row).
struct GdnDecodeRun {
  int32_t row0 = 0, n = 0, out_first = 0;
};

// Without runs: row b is sequence b's one new token; states[b] its state, updated in place. With runs: `batch`
// runs, each as GdnDecodeRun says.
struct GdnDecodeArgs : GdnRuleArgs {
  int32_t batch = 0;
  const GdnDecodeRun* runs = nullptr;       // device table of `batch` runs, or null
  float* const* step_states = nullptr;      // device table of the runs' per-row output states
};

// Throws EngineError for a key head dim the kernel is not built for (16, 32, 64, 128, 256).
void gdn_decode(const GdnDecodeArgs& args, cudaStream_t stream);

}  // namespace ninfer::cuda
