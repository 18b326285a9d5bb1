// Per-sequence caches shared by the lanes: a paged KV pool for the full-attention layers and a pool of
// Gated DeltaNet state slots. Pages are 64 tokens (prefix reuse and prefill chunks align on them); state slots
// can be copied so that snapshots, forks (decision scoring) and MTP rollback fit later.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ninfer {

constexpr int64_t kKvPageTokens = 64;

enum class KvDtype : uint8_t { F32, BF16, FP8, INT8 };
const char* kv_dtype_name(KvDtype d);
KvDtype parse_kv_dtype(const std::string& name);  // "f32" | "bf16" | "fp8" | "int8"; EngineError otherwise

struct SequenceCache {
  std::vector<int32_t> pages;  // KV pages in order; page p holds positions [64p, 64p + 64)
  int32_t state_slot = -1;     // GDN state slot, -1 for models without linear attention
  int64_t length = 0;          // tokens already in the cache
};

}  // namespace ninfer
