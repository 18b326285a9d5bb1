// The device memory plan of an engine on a backend with its own memory (the CUDA backend): what the weights,
// the KV pool, the Gated DeltaNet states and the activation workspace take, and the KV capacity that fits.
// The arithmetic lives here, in the runtime, so it is the same for every device and testable without one; the
// backend supplies the two measured numbers (bytes its weights took, bytes still free after them).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "cache/kv_dtype.h"

namespace ninfer {

inline constexpr int64_t kMemoryHeadroomBytes = int64_t(1) << 30;  // left free for the driver, graphs, growth

// The CUDA backend's prefill GEMM (backend/cuda/prefill_gemm.h) sizes its scratch by these: dequantized weights
// go through a bf16 slab of at most kGemmWeightSlabBytes (bigger weights, the lm_head, run slab by slab), and
// cuBLASLt gets a workspace of kGemmLtWorkspaceBytes.
inline constexpr int64_t kGemmWeightSlabBytes = int64_t(256) << 20;
inline constexpr int64_t kGemmLtWorkspaceBytes = int64_t(32) << 20;

// The prefill chunk when EngineOptions::prefill_chunk is kPrefillChunkAuto: the CPU backend keeps
// kDefaultPrefillChunk; a device backend takes the largest chunk up to kMaxAutoPrefillChunk whose workspace fits
// in kAutoChunkMemoryShare of the memory left after weights, headroom and GDN states (choose_prefill_chunk).
inline constexpr int64_t kPrefillChunkAuto = 0;
inline constexpr int64_t kDefaultPrefillChunk = 512;
inline constexpr int64_t kMaxAutoPrefillChunk = 8192;
// The auto EngineOptions::decoding_prefill_chunk of a device backend (bench/NOTES-cuda.md, session 13: the decode
// gaps and long-prompt TTFTs of 512 .. 8192 on the H200).
inline constexpr int64_t kDecodingPrefillChunk = 2048;
inline constexpr int64_t kAutoChunkMemoryShare = 8;  // the workspace may take 1 / this of that memory
// Tokens per chunk of the chunked Gated DeltaNet prefill (its per-chunk workspace is part of a pass's).
inline constexpr int64_t kGdnPrefillChunkTokens = 64;

struct MemoryPlan {
  int64_t device_total = 0;       // the device's memory
  int64_t weights = 0;            // measured: device bytes the uploaded weights took
  int64_t free_after_weights = 0; // measured
  int64_t kv_page_bytes = 0;      // one page of kKvPageTokens tokens over every KV layer
  int64_t kv_capacity_tokens = 0;
  int64_t kv_pool = 0, gdn_states = 0, workspace = 0;  // planned bytes
  int32_t state_slots = 0;        // GDN state slots in `gdn_states`: one per lane, the rest prefix-cache snapshots
  int64_t gemm_scratch = 0;                            // the part of `workspace` the prefill GEMM takes
  int64_t pass_rows = 0;          // the rows `workspace` is planned for: one prefill chunk plus every lane
  int64_t headroom = kMemoryHeadroomBytes;
};

// Bytes of one KV page for `config` (its full-attention layers, plus one for the MTP head) in `dtype`.
int64_t kv_page_bytes(const ModelConfig& config, KvDtype dtype);
// Bytes of the GDN conv + recurrent state of `slots` sequences (0 for models without linear attention).
int64_t gdn_state_bytes(const ModelConfig& config, int32_t slots);
// An upper bound on the activation buffers of a pass of `rows` rows over at most `sequences` sequences (the
// largest pass is a prefill chunk plus the decoding lanes): the residual stream, every per-row buffer of the
// widest layer in f32 (model/scratch.h), logits for every row (scoring), and the chunked GDN prefill's per-chunk
// workspace. Excludes the prefill GEMM's scratch (gemm_scratch_bytes).
int64_t workspace_bytes(const ModelConfig& config, int64_t rows, int32_t sequences);
// An upper bound on the prefill GEMM's scratch for a pass of `rows` rows: the weight slab (capped by the largest
// linear weight), the activations in bf16 (e4m3 takes half of that) with one f32 scale per row, and the
// cuBLASLt workspace. Part of the planned workspace.
int64_t gemm_scratch_bytes(const ModelConfig& config, int64_t rows);

// Plans the pools after the weights for `slots` lanes and `state_slots` GDN state slots (lanes', snapshots',
// decision rows' and speculative verify rows').
// `kv_capacity_tokens` < 0 asks for the largest capacity that fits with
// kMemoryHeadroomBytes to spare (whole pages, at most `most_kv_tokens`: the engine's default pool); otherwise that
// capacity is checked. Throws OutOfMemoryError with every number when the request does not fit (or, for auto, not
// one sequence of max_context).
MemoryPlan plan_memory(const ModelConfig& config, KvDtype dtype, int64_t kv_capacity_tokens,
                       int64_t most_kv_tokens, int64_t max_context, int32_t slots, int32_t state_slots,
                       int64_t pass_rows, int64_t device_total, int64_t weights, int64_t free_after_weights);

// The prefill chunk for EngineOptions::prefill_chunk == kPrefillChunkAuto on a device backend: the largest of
// min(kMaxAutoPrefillChunk, max_context rounded up to 64) and the powers of two below it, down to
// kDefaultPrefillChunk, whose pass workspace (chunk + slots rows) takes at most 1 / kAutoChunkMemoryShare of the
// memory after weights, headroom and GDN states and with which plan_memory still fits the requested KV pool;
// kDefaultPrefillChunk when none does. A larger chunk runs a long prompt in fewer, more efficient passes (each
// weight streamed and, for quantized encodings, dequantized once per chunk; GEMMs with more rows); the price is
// that a decoding lane waits up to one chunk's pass (the engine alternates decode and prefill passes).
int64_t choose_prefill_chunk(const ModelConfig& config, KvDtype dtype, int64_t kv_capacity_tokens,
                             int64_t most_kv_tokens, int64_t max_context, int32_t slots, int32_t state_slots,
                             int64_t device_total, int64_t weights, int64_t free_after_weights);

// One line per part, in MiB: the startup memory summary.
std::string describe(const MemoryPlan& plan);

}  // namespace ninfer
