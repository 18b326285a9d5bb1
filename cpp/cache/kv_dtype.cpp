#include "cache/kv_dtype.h"

#include "errors.h"

namespace ninfer {

const char* kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::F32: return "f32";
    case KvDtype::BF16: return "bf16";
    case KvDtype::FP8: return "fp8";
    case KvDtype::INT8: return "int8";
  }
  return "?";
}

KvDtype parse_kv_dtype(const std::string& name) {
  for (KvDtype d : {KvDtype::F32, KvDtype::BF16, KvDtype::FP8, KvDtype::INT8})
    if (name == kv_dtype_name(d)) return d;
  throw EngineError("unknown KV cache dtype '" + name + "' (known: f32, bf16, fp8, int8)");
}

}  // namespace ninfer
