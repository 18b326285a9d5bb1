// The model: one forward pass built from the artifact's config (Qwen3.5 dense / MoE with MTP, and plain
// Llama / Qwen2 / Qwen3 decoders). It calls ops through the backend interface only, and it computes only: the
// runtime owns the caches (cache/cache_pools.h) and tells each pass where a sequence's pages, state slot and
// start position are; the model says what a page and a slot must hold (cache_layout).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "artifact/artifact.h"
#include "backend/backend.h"
#include "model/config.h"
#include "model/vision_tower.h"
#include "cache/cache_pools.h"

namespace ninfer {

struct ModelOptions {
  int32_t threads = 0;              // 0 = all cores
  int32_t gdn_chunk = 64;           // chunk length of the chunked Gated DeltaNet prefill
  bool verify_checksums = true;
  bool vision = false;              // load the vision tower (the artifact must carry one)
};

// Rows that replace the token embeddings of tokens [first, first + count) of an item (a vision tower's outputs
// at the placeholder tokens): `rows` [count, hidden_size] in host memory.
struct EmbeddingRows {
  int64_t first = 0, count = 0;
  const float* rows = nullptr;
};

// One sequence's share of a forward pass: `n_tokens` new tokens at positions start .. start + n - 1, after the
// `start` tokens its pages and state slot already hold. The pages must have room for them.
struct ForwardItem {
  const int32_t* tokens = nullptr;
  int64_t n_tokens = 0;
  int64_t start = 0;
  std::span<const int32_t> pages;  // page p holds positions [64p, 64p + 64)
  int32_t state_slot = -1;         // GDN state slot; -1 for models without linear attention
  bool all_logits = false;         // logits (and hidden) for every token, or only for the last
  bool all_hidden = false;         // also every token's final-normed hidden, in ForwardOutput::all_hidden
  // A verify item (runtime/speculative.h): n_tokens slots; row t runs as a decode step would, from the state after
  // row t - 1 (the item's own slot for row 0) into step_slots[t], and the item's own slot is left as it was, so
  // the caller picks the state of the last accepted row afterwards.
  std::span<const int32_t> step_slots;
  // Non-empty: the last token's row is projected onto these lm-head rows only (out.candidate_logits), with no
  // full-vocabulary logits row (a decision readout). Such an item has one output row and no all_logits.
  std::span<const int32_t> candidates;
  std::span<const EmbeddingRows> embeddings;  // media rows in place of some tokens' embeddings
  // M-RoPE positions (t, h, w) of each new token, [n_tokens][3] in host memory (a prompt with media). Null: all
  // three streams at start + i + position_offset (plain text; after media, offset is M-RoPE's rope delta).
  const int64_t* mrope_positions = nullptr;
  int64_t position_offset = 0;
};

struct ForwardOutput {
  // Set by the caller: leave logits and hidden in the backend's memory when it is not the host's (a device
  // sampler reads them there); then `logits` and `hidden` stay empty and device_logits points at the logits.
  bool keep_on_device = false;
  // With keep_on_device: still bring `hidden` to the host (the MTP head's input after a verify pass).
  bool hidden_to_host = false;
  int64_t vocab = 0, hidden_size = 0;
  // Item i's first output row; its rows follow contiguously. Items with candidates come after all the others'
  // rows (their hidden rows are last), so `logits` holds only the rows of the items without.
  std::vector<int64_t> row_offset;
  std::vector<float> logits;        // [rows of items without candidates, vocab]
  // Items with candidates: logit of candidate j at candidate_logits[candidate_offset[i] + j] (host memory).
  std::vector<int64_t> candidate_offset;
  std::vector<float> candidate_logits;
  std::vector<float> hidden;        // [rows, hidden_size], after the final norm (the MTP head's input)
  const float* device_logits = nullptr;  // [rows, vocab] in device memory, valid until the next pass
  // Items with all_hidden: all_hidden_offset[i] is item i's first row in all_hidden ([rows, hidden_size]; -1 for
  // items without), its n_tokens rows following.
  std::vector<int64_t> all_hidden_offset;
  std::vector<float> all_hidden;
};

class Model {
 public:
  // Runs on `backend` (the CPU backend with options.threads when null).
  static std::unique_ptr<Model> load(std::shared_ptr<const Artifact> artifact, const ModelOptions& options,
                                     std::unique_ptr<Backend> backend = nullptr);
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ModelOptions& options() const = 0;

  // What a KV page and a state slot hold for this model; pools built to it are what forward() takes.
  virtual CacheLayout cache_layout() const = 0;
  // The memory the backend computes in: where the runtime puts the pools.
  virtual MemoryResource& memory() = 0;

  // Runs every item in one pass (linear layers see all rows together), writing the tokens' KV into their pages
  // and advancing their state slots in `pools`. Throws EngineError for a bad item (token id outside the
  // vocabulary, too few pages, no state slot) before touching any cache.
  virtual void forward(std::span<const ForwardItem> batch, CachePools& pools, ForwardOutput& out) = 0;

  // The MTP head (Qwen3.5): draft logits for position t from the main model's final-normed hidden at t and the
  // token at t + 1. `hidden` is [n, hidden_size]; item.tokens are the next tokens, at positions item.start ..
  // item.start + n - 1 in the MTP layer's own KV (part of the same pages). Throws EngineError when the model has
  // no MTP head. Logits for every row when item.all_logits, else for the last; `normed`, when given, gets every
  // row's mtp.norm output (a next draft step's hidden).
  virtual bool has_mtp() const = 0;

  // The vision tower (ModelOptions::vision). encode_vision turns patches into the rows a ForwardItem's
  // `embeddings` take (VisionTower::encode); it throws EngineError when no tower is loaded.
  virtual const VisionTower* vision() const = 0;
  virtual void encode_vision(std::span<const float> patches, std::span<const VisionGrid> grids,
                             std::vector<float>& out) = 0;
  virtual void mtp_forward(const float* hidden, const ForwardItem& item, CachePools& pools,
                           std::vector<float>& logits, std::vector<float>* normed = nullptr) = 0;
  // The MTP head's greedy drafts (runtime/speculative.h): mtp_forward's rows (their KV written the same way), then
  // `drafts` tokens into `tokens`: step 0 the argmax of the last row's logits, step j the argmax after one more
  // row at the next position, from step j - 1's normed output and draft. Logits, hidden rows and drafts stay in the
  // backend's memory until the drafts' one copy back (no logits row or host argmax per step; on CUDA it launches
  // the pass, a graph when the caller began one of its shape, runtime/step_executor.cpp). drafts = 0: only the
  // rows' KV. mtp_forward is its slow twin (tests/test_mtp_draft.py).
  virtual void mtp_draft(const float* hidden, const ForwardItem& item, CachePools& pools, int32_t drafts,
                         std::vector<int32_t>& tokens) = 0;
};

}  // namespace ninfer
