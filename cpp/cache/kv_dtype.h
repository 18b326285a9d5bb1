// The KV page size and the KV formats: what every layer above the cache agrees on. Pages are 64 tokens
// (prefix reuse, prefill chunks and Gated DeltaNet chunks align on them).
#pragma once

#include <cstdint>
#include <string>

namespace ninfer {

constexpr int64_t kKvPageTokens = 64;

inline int64_t kv_pages_for(int64_t tokens) { return (tokens + kKvPageTokens - 1) / kKvPageTokens; }

// A KV format names how keys and how values are stored. Every format but K8V4 stores both sides the same way, so
// the same enum names a side's row codec (F32 .. NVFP4) and a format (all of them): K8V4 is int8 keys and nvfp4
// values (cache/kv_quant.h), because keys feed a softmax whose error grows with the score magnitude while values
// are only averaged, so values take the coarser codec.
enum class KvDtype : uint8_t { F32, BF16, FP8, INT8, NVFP4, K8V4 };
const char* kv_dtype_name(KvDtype d);
KvDtype parse_kv_dtype(const std::string& name);  // "f32" | "bf16" | "fp8" | "int8" | "nvfp4" | "k8v4"
KvDtype kv_key_dtype(KvDtype format);    // the row codec of the keys (never K8V4)
KvDtype kv_value_dtype(KvDtype format);  // the row codec of the values (never K8V4)

}  // namespace ninfer
