// The gated delta rule on the GPU for sequences with several new tokens (the CPU twins are cpu::gdn_recurrent and
// cpu::gdn_chunked). Two implementations of one contract:
//   gdn_prefill_sequential: token by token, one block per (sequence, value head): the slow, obviously-right twin;
//   gdn_prefill_chunked:    the chunked (WY / UT-transform) form, 64 tokens per chunk, in two kernels: a
//                           chunk-parallel one that builds each chunk's intra-chunk products, then a scan over the
//                           chunks per (sequence, value head, slice of value columns) carrying the f32 state. The
//                           scan has two implementations: tensor cores (tf32 mma.sync, f32 accumulators and state)
//                           and its f32 CUDA-core twin.
// State fp32 [Hv, Dk, Dv] per sequence (its StatePool slot), updated in place.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/gdn_rule_args.h"

namespace ninfer::cuda {

struct DeviceSequence;

// Sequence i holds rows [seqs[i].row0, + seqs[i].n); states[i] is its state.
struct GdnPrefillArgs : GdnRuleArgs {
  int32_t num_seqs = 0;
  const DeviceSequence* seqs = nullptr;  // device table of num_seqs sequences
};

void gdn_prefill_sequential(const GdnPrefillArgs& args, cudaStream_t stream);

// The chunk length of the chunked kernels (fixed: the result does not depend on it beyond rounding).
constexpr int32_t kGdnChunk = 64;

// One chunk of one sequence: the unit of the chunk-parallel kernel. Chunk c of the call is entry c of the list.
struct GdnChunkRef {
  int32_t seq;    // index into the sequence table
  int32_t chunk;  // chunk index within the sequence: rows row0 + 64 * chunk ..
};

// Device tables of the chunked path, built on the host from the sequence lengths.
struct GdnChunkTables {
  int64_t total_chunks = 0;
  const GdnChunkRef* chunks = nullptr;   // [total_chunks]
  const int64_t* first_chunk = nullptr;  // [num_seqs]: the call-wide index of each sequence's chunk 0
};

// Key head dims the chunked kernels take: multiples of 8 up to 256 (shared memory holds a chunk's keys).
bool gdn_chunked_supported(int32_t key_head_dim);
// Key head dims the tensor-core scan takes: multiples of 16 up to 128 (others run the f32 scan).
bool gdn_scan_mma_supported(int32_t key_head_dim);

enum class GdnScanImpl {
  tensor_cores,  // tf32 operands (rounded to nearest), f32 accumulation, f32 state; where supported
  f32,           // f32 FMA throughout: the twin
};
// Floats of device workspace the chunked path needs for `total_chunks` chunks.
size_t gdn_chunked_workspace_floats(int64_t total_chunks, int32_t num_value_heads, int32_t key_head_dim,
                                    int32_t value_head_dim);
// Throws EngineError for an unsupported key head dim. `workspace` holds gdn_chunked_workspace_floats floats.
// Runs gdn_chunk_prepare then gdn_chunk_scan (also callable alone, so that the benchmark can time each).
void gdn_prefill_chunked(const GdnPrefillArgs& args, const GdnChunkTables& tables, float* workspace,
                         GdnScanImpl impl, cudaStream_t stream);
void gdn_chunk_prepare(const GdnPrefillArgs& args, const GdnChunkTables& tables, float* workspace,
                       cudaStream_t stream);
void gdn_chunk_scan(const GdnPrefillArgs& args, const GdnChunkTables& tables, float* workspace, GdnScanImpl impl,
                    cudaStream_t stream);

}  // namespace ninfer::cuda
