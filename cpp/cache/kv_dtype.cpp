#include "cache/kv_dtype.h"

#include "errors.h"

namespace ninfer {

namespace {
constexpr KvDtype kAll[] = {KvDtype::F32, KvDtype::BF16, KvDtype::FP8, KvDtype::INT8, KvDtype::NVFP4, KvDtype::K8V4};
}

const char* kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::F32: return "f32";
    case KvDtype::BF16: return "bf16";
    case KvDtype::FP8: return "fp8";
    case KvDtype::INT8: return "int8";
    case KvDtype::NVFP4: return "nvfp4";
    case KvDtype::K8V4: return "k8v4";
  }
  return "?";
}

KvDtype parse_kv_dtype(const std::string& name) {
  std::string known;
  for (KvDtype d : kAll) {
    if (name == kv_dtype_name(d)) return d;
    known += std::string(known.empty() ? "" : ", ") + kv_dtype_name(d);
  }
  throw EngineError("unknown KV cache dtype '" + name + "' (known: " + known + ")");
}

KvDtype kv_key_dtype(KvDtype format) { return format == KvDtype::K8V4 ? KvDtype::INT8 : format; }
KvDtype kv_value_dtype(KvDtype format) { return format == KvDtype::K8V4 ? KvDtype::NVFP4 : format; }

}  // namespace ninfer
