// The KV page size and the KV element types: what every layer above the cache agrees on. Pages are 64 tokens
// (prefix reuse, prefill chunks and Gated DeltaNet chunks align on them).
#pragma once

#include <cstdint>
#include <string>

namespace ninfer {

constexpr int64_t kKvPageTokens = 64;

inline int64_t kv_pages_for(int64_t tokens) { return (tokens + kKvPageTokens - 1) / kKvPageTokens; }

enum class KvDtype : uint8_t { F32, BF16, FP8, INT8 };
const char* kv_dtype_name(KvDtype d);
KvDtype parse_kv_dtype(const std::string& name);  // "f32" | "bf16" | "fp8" | "int8"; EngineError otherwise

}  // namespace ninfer
