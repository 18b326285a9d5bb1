// The routed experts as a grouped tensor-core matmul: the (row, slot) pairs are bucketed by expert on the device
// (counts, offsets, a permutation; no host sync, so decode can be captured in a CUDA graph), then one launch per
// projection runs (expert, 16-row tile) work items with the expert's weights as the mma A operand and its tokens as
// B. Each expert's weights are read once per launch however many tokens it has: decode is bandwidth-bound.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "artifact/artifact.h"

namespace ninfer::cuda {

constexpr int kMoeMaxExperts = 1024;  // the bucketing block holds one expert per thread

// Whether the grouped path takes these stacked weights: one encoding of int4/int8 (group size a multiple of 128),
// fp8, nvfp4 or bf16; hidden and intermediate widths multiples of 128; at most kMoeMaxExperts experts.
bool moe_grouped_supports(const TensorView& gate, const TensorView& up, const TensorView& down, int64_t hidden);

// Device scratch of one call; sizes from moe_grouped_*_bytes.
struct MoeScratch {
  void* x_split = nullptr;  // x as bf16 hi/lo planes
  void* h_split = nullptr;  // silu(gate x) * up x per slot, bf16 hi/lo planes
  void* routing = nullptr;  // active expert count, (expert, first slot, slots) runs, slot -> pair permutation
};
size_t moe_grouped_x_split_bytes(int64_t rows, int64_t hidden);
size_t moe_grouped_h_split_bytes(int64_t pairs, int64_t inter);
size_t moe_grouped_routing_bytes(int64_t pairs);

// y[p] = down_e(silu(gate_e x[p / top_k]) * up_e x[p / top_k]) for every pair p = r * top_k + j, e = ids[p] (in
// 0..E-1), as f32 [rows * top_k, hidden]. Each pair's result is computed the same way wherever it lands in its
// expert's bucket, so it does not depend on the other rows of the batch.
void moe_grouped_experts(const float* x, int64_t rows, int64_t hidden, const int32_t* ids, int32_t top_k,
                         const TensorView& gate, const TensorView& up, const TensorView& down,
                         const MoeScratch& scratch, float* y, cudaStream_t stream);

}  // namespace ninfer::cuda
