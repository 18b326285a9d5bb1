// The model: one forward pass built from the artifact's config (Qwen3.5 dense / MoE with MTP, and plain
// Llama / Qwen2 / Qwen3 decoders). It calls ops through the backend interface only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "artifact/artifact.h"
#include "backend/backend.h"
#include "model/config.h"
#include "runtime/cache.h"

namespace ninfer {

struct ModelOptions {
  int64_t max_context = 4096;       // longest sequence (prompt + generation)
  int64_t kv_capacity = 0;          // tokens in the shared KV pool; 0 = max_context * max_sequences
  int32_t max_sequences = 1;        // GDN state slots (one per lane, more later for snapshots)
  KvDtype kv_dtype = KvDtype::BF16;
  int32_t threads = 0;              // 0 = all cores
  int32_t gdn_chunk = 64;           // chunk length of the chunked Gated DeltaNet prefill
  bool verify_checksums = true;
};

// One sequence's share of a forward pass: `n_tokens` new tokens at positions start .. start + n - 1, where
// start == cache->length. The cache must already hold room for them (Model::reserve).
struct ForwardItem {
  const int32_t* tokens = nullptr;
  int64_t n_tokens = 0;
  SequenceCache* cache = nullptr;
  bool all_logits = false;  // logits (and hidden) for every token, or only for the last
};

struct ForwardOutput {
  // Set by the caller: leave logits and hidden in the backend's memory when it is not the host's (a device
  // sampler reads them there); then `logits` and `hidden` stay empty and device_logits points at the logits.
  bool keep_on_device = false;
  int64_t vocab = 0, hidden_size = 0;
  std::vector<int64_t> row_offset;  // item i's first output row; its rows follow contiguously
  std::vector<float> logits;        // [rows, vocab]
  std::vector<float> hidden;        // [rows, hidden_size], after the final norm (the MTP head's input)
  const float* device_logits = nullptr;  // [rows, vocab] in device memory, valid until the next pass
};

class Model {
 public:
  // Runs on `backend` (the CPU backend with options.threads when null).
  static std::unique_ptr<Model> load(std::shared_ptr<const Artifact> artifact, const ModelOptions& options,
                                     std::unique_ptr<Backend> backend = nullptr);
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ModelOptions& options() const = 0;

  // Cache management: the pools' layout is the model's. reserve() grows `cache` so it can hold `total_tokens`
  // (pages, and a state slot on first use); it returns false, changing nothing, when the pool is short.
  virtual bool reserve(SequenceCache& cache, int64_t total_tokens) = 0;
  virtual void release(SequenceCache& cache) = 0;  // returns pages and slot to the pools at once
  virtual int64_t kv_capacity_tokens() const = 0;
  virtual int64_t kv_free_tokens() const = 0;
  virtual int32_t free_state_slots() const = 0;

  // Runs every item in one pass (linear layers see all rows together), appending the tokens to the caches.
  // Throws EngineError for a token id outside the vocabulary, before touching any cache.
  virtual void forward(std::span<const ForwardItem> batch, ForwardOutput& out) = 0;

  // The MTP head (Qwen3.5): draft logits for position t from the main model's final-normed hidden at t and the
  // token at t + 1. `hidden` is [n, hidden_size]; rows use positions start .. start + n - 1 in the MTP layer's own
  // KV (part of the same SequenceCache pages). Throws EngineError when the model has no MTP head.
  virtual bool has_mtp() const = 0;
  virtual void mtp_forward(const float* hidden, const int32_t* next_tokens, int64_t n, int64_t start,
                           SequenceCache& cache, std::vector<float>& logits) = 0;
};

}  // namespace ninfer
