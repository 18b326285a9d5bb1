// The fast attention paths of the CUDA backend (the slow obviously-right twin is attention_kernel in attention.cu):
//   prefill (flash_prefill.cu): tensor-core flash attention for sequences with many new rows;
//   decode (flash_decode.cu): split-KV ("flash-decoding") attention for rows attending alone, then a combine.
// Both take bf16, fp8 and int8 KV pools. Numerics are the standard flash ones; the bounds are in each file.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kv_device.cuh"

namespace ninfer::cuda {

// --- prefill ---
// One block's work: 64 flattened rows (new position index * group + head in group) of one sequence, from `first`.
struct PrefillTile {
  int32_t seq, first;
};
constexpr int kPrefillTileRows = 64;
bool flash_prefill_supports(KvDtype dtype, int32_t head_dim);
// `tiles` (device) in the order they should start (heaviest first); every tile runs for each KV head.
void flash_prefill(const AttentionArgs& a, KvDtype dtype, const PrefillTile* tiles, int32_t tile_count,
                   cudaStream_t stream);

// --- decode ---
constexpr int32_t kDecodeMaxGroup = 8;  // query heads per KV head
bool flash_decode_supports(KvDtype dtype, int32_t head_dim, int32_t group);
// The split count for `rows` rows: enough blocks to fill the device, whatever the context (rows with fewer pages
// than splits leave the rest empty), so that a decode graph's launch shapes depend on its batch only.
int32_t flash_decode_max_splits(int64_t rows, int32_t kv_heads);
// Floats of partial results for `rows` rows with `splits` splits.
int64_t flash_decode_partial_floats(int64_t rows, const AttentionShape& shape, int32_t splits);
// Attends the rows listed in `rows` (device, `row_count` of them), each over positions 0 .. its own, keys split
// `splits` ways; `partial` holds flash_decode_partial_floats. Always two kernels (split, combine).
void flash_decode(const AttentionArgs& a, KvDtype dtype, const int32_t* rows, int32_t row_count, int32_t splits,
                  float* partial, cudaStream_t stream);

}  // namespace ninfer::cuda
