#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "errors.h"
#include "cache/kv_pool.h"

namespace ninfer {
namespace {

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f MiB", double(bytes) / double(1 << 20));
  return text;
}

}  // namespace

int64_t kv_page_bytes(const ModelConfig& config, KvDtype dtype) {
  const int32_t layers = config.num_full_attention_layers() + (config.mtp_layers > 0 ? 1 : 0);
  // An empty pool computes the page layout exactly as the real one will.
  return KvPool(layers, config.num_kv_heads, config.head_dim, 0, dtype).page_bytes();
}

int64_t gdn_state_bytes(const ModelConfig& config, int32_t slots) {
  const auto& l = config.linear_attention;
  if (!l) return 0;
  const int64_t channels = 2LL * l->num_key_heads * l->key_head_dim + int64_t(l->num_value_heads) * l->value_head_dim;
  const int64_t per_layer = channels * (l->conv_kernel - 1) + int64_t(l->num_value_heads) * l->key_head_dim *
                                                                   l->value_head_dim;
  return int64_t(slots) * config.num_linear_attention_layers() * per_layer * int64_t(sizeof(float));
}

int64_t workspace_bytes(const ModelConfig& config, int64_t rows, int32_t sequences) {
  const int64_t h = config.hidden_size;
  const int64_t attention = 2LL * config.num_heads * config.head_dim + 2LL * config.num_kv_heads * config.head_dim +
                            int64_t(config.num_heads) * config.head_dim;
  int64_t gdn = 0, gdn_chunk_work = 0;
  if (const auto& l = config.linear_attention) {
    const int64_t value = int64_t(l->num_value_heads) * l->value_head_dim;
    const int64_t channels = 2LL * l->num_key_heads * l->key_head_dim + value;
    // mixed, conv and the contiguous q | k | v copies (channels each); z and the rule's output; a, b, g, beta.
    gdn = 3 * channels + 2 * value + 4LL * l->num_value_heads;
    // The chunked rule's products per chunk and value head: [L, Dk] + [L, Dv] + [L, L] + 2 L floats; every
    // sequence may end in a partial chunk.
    const int64_t chunks = rows / kGdnPrefillChunkTokens + sequences;
    gdn_chunk_work = chunks * l->num_value_heads * kGdnPrefillChunkTokens *
                     (l->key_head_dim + l->value_head_dim + kGdnPrefillChunkTokens + 2);
  }
  int64_t ffn = 2 * config.intermediate_size;
  if (const auto& m = config.moe)
    ffn = int64_t(m->top_k) * (2LL * m->intermediate_size + h) + 2LL * m->shared_intermediate_size + m->num_experts;
  // Residual stream, its normed copy, the block output, the widest mixer, the FFN; logits for every row at most.
  const int64_t per_row = 3 * h + std::max(attention, gdn) + ffn + config.vocab_size + h;
  return (rows * per_row + gdn_chunk_work) * int64_t(sizeof(float));
}

int64_t gemm_scratch_bytes(const ModelConfig& config, int64_t rows) {
  const int64_t h = config.hidden_size, attention = int64_t(config.num_heads) * config.head_dim;
  // The widest inputs (k) and outputs (n) of any linear layer: the MTP head's fc takes 2h; q_proj with its
  // output gate gives 2 * attention; the lm_head gives the vocabulary.
  int64_t k = std::max({2 * h, config.intermediate_size, attention});
  int64_t n = std::max({config.vocab_size, config.intermediate_size, 2 * attention});
  if (const auto& l = config.linear_attention) {
    const int64_t value = int64_t(l->num_value_heads) * l->value_head_dim;
    k = std::max<int64_t>(k, value);
    n = std::max<int64_t>(n, 2LL * l->num_key_heads * l->key_head_dim + value);
  }
  if (const auto& m = config.moe) {
    k = std::max<int64_t>(k, m->shared_intermediate_size);
    n = std::max<int64_t>(n, m->shared_intermediate_size);
  }
  const int64_t slab = std::min(kGemmWeightSlabBytes, 2 * n * k);
  return slab + rows * (2 * k + int64_t(sizeof(float))) + kGemmLtWorkspaceBytes;
}

MemoryPlan plan_memory(const ModelConfig& config, KvDtype dtype, int64_t kv_capacity_tokens,
                       int64_t most_kv_tokens, int64_t max_context, int32_t slots, int32_t state_slots,
                       int64_t pass_rows, int64_t device_total, int64_t weights, int64_t free_after_weights) {
  MemoryPlan p;
  p.device_total = device_total;
  p.weights = weights;
  p.free_after_weights = free_after_weights;
  p.kv_page_bytes = kv_page_bytes(config, dtype);
  p.state_slots = config.linear_attention ? state_slots : 0;
  p.gdn_states = gdn_state_bytes(config, state_slots);
  p.pass_rows = pass_rows;
  p.gemm_scratch = gemm_scratch_bytes(config, pass_rows);
  p.workspace = workspace_bytes(config, pass_rows, slots) + p.gemm_scratch;
  const int64_t for_kv = free_after_weights - p.headroom - p.gdn_states - p.workspace;
  const int64_t max_pages = (most_kv_tokens + kKvPageTokens - 1) / kKvPageTokens;
  const int64_t min_pages = (max_context + kKvPageTokens - 1) / kKvPageTokens;
  int64_t pages = 0;
  if (kv_capacity_tokens < 0)
    pages = std::min(max_pages, std::max<int64_t>(0, for_kv) / p.kv_page_bytes);
  else
    pages = ((kv_capacity_tokens ? kv_capacity_tokens : most_kv_tokens) + kKvPageTokens - 1) / kKvPageTokens;
  p.kv_capacity_tokens = pages * kKvPageTokens;
  p.kv_pool = pages * p.kv_page_bytes;
  const bool too_small = kv_capacity_tokens < 0 && pages < min_pages;
  if (too_small || p.kv_pool > for_kv)
    throw OutOfMemoryError(
        "the model does not fit in device memory: weights " + mib(weights) + ", " + mib(free_after_weights) +
        " free after them of " + mib(device_total) + "; GDN states " + mib(p.gdn_states) + " + workspace " +
        mib(p.workspace) + " + headroom " + mib(p.headroom) + " leave " + mib(std::max<int64_t>(0, for_kv)) +
        " for the KV pool, which needs " + mib((too_small ? min_pages : pages) * p.kv_page_bytes) + " (" +
        std::to_string((too_small ? min_pages : pages) * kKvPageTokens) + " tokens at " +
        std::to_string(p.kv_page_bytes / kKvPageTokens) + " B/token)");
  return p;
}

int64_t choose_prefill_chunk(const ModelConfig& config, KvDtype dtype, int64_t kv_capacity_tokens,
                             int64_t most_kv_tokens, int64_t max_context, int32_t slots, int32_t state_slots,
                             int64_t device_total, int64_t weights, int64_t free_after_weights) {
  const int64_t available = free_after_weights - kMemoryHeadroomBytes - gdn_state_bytes(config, state_slots);
  const int64_t longest = (max_context + kKvPageTokens - 1) / kKvPageTokens * kKvPageTokens;
  int64_t chunk = std::clamp(longest, kDefaultPrefillChunk, kMaxAutoPrefillChunk);
  while (chunk > kDefaultPrefillChunk) {
    const int64_t rows = chunk + slots;
    if ((workspace_bytes(config, rows, slots) + gemm_scratch_bytes(config, rows)) * kAutoChunkMemoryShare <=
        available) {
      try {
        plan_memory(config, dtype, kv_capacity_tokens, most_kv_tokens, max_context, slots, state_slots, rows,
                    device_total, weights, free_after_weights);
        return chunk;
      } catch (const OutOfMemoryError&) {
        // the KV pool asked for does not fit next to this chunk's workspace: try a smaller chunk
      }
    }
    // The next power of two below (a multiple of 64, since kDefaultPrefillChunk is one).
    int64_t below = kDefaultPrefillChunk;
    while (below * 2 < chunk) below *= 2;
    chunk = below;
  }
  return kDefaultPrefillChunk;
}

std::string describe(const MemoryPlan& p) {
  return "device memory " + mib(p.device_total) + ": weights " + mib(p.weights) + ", KV pool " + mib(p.kv_pool) +
         " (" + std::to_string(p.kv_capacity_tokens) + " tokens, " + std::to_string(p.kv_page_bytes / kKvPageTokens) +
         " B/token), GDN states " + mib(p.gdn_states) + " (" + std::to_string(p.state_slots) + " slots), workspace (planned) " + mib(p.workspace) +
         " (" + std::to_string(p.pass_rows) + " rows; prefill GEMM scratch " + mib(p.gemm_scratch) + "), headroom " +
         mib(p.headroom);
}

}  // namespace ninfer
