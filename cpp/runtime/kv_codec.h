// How KV rows are stored: the one place that knows each KV dtype's element type and conversions.
// Kernels are written once as templates over a codec and instantiated by `dispatch_kv_dtype`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "artifact/numeric.h"
#include "errors.h"
#include "runtime/cache.h"

namespace ninfer {

struct KvCodecF32 {
  using Element = float;
  static float load(Element e) { return e; }
  static Element store(float f) { return f; }
};

struct KvCodecBF16 {
  using Element = uint16_t;
  static float load(Element e) { return bf16_to_f32(e); }
  static Element store(float f) { return f32_to_bf16(f); }
};

inline size_t kv_element_bytes(KvDtype d) {
  switch (d) {
    case KvDtype::F32: return sizeof(float);
    case KvDtype::BF16: return sizeof(uint16_t);
    default: break;
  }
  throw EngineError(std::string("KV cache dtype ") + kv_dtype_name(d) + " is not supported by this build yet");
}

// Calls fn(Codec{}) with the codec of `d`. fp8 / int8 (with their scales) join here.
template <class Fn>
decltype(auto) dispatch_kv_dtype(KvDtype d, Fn&& fn) {
  switch (d) {
    case KvDtype::F32: return fn(KvCodecF32{});
    case KvDtype::BF16: return fn(KvCodecBF16{});
    default: break;
  }
  throw EngineError(std::string("KV cache dtype ") + kv_dtype_name(d) + " is not supported by this build yet");
}

}  // namespace ninfer
