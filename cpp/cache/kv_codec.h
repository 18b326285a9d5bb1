// How KV rows are stored: the one place that knows each KV dtype's element type and conversions.
// Kernels are written once as templates over a codec and instantiated by `dispatch_kv_dtype`.
//
// A codec stores one (token, head) row of head_dim values at a time. f32 and bf16 store the values themselves;
// fp8 and int8 store 8-bit codes plus one f32 scale per row (cache/kv_quant.h), kept by the pool beside the
// page's rows. A stored value is `scale * load(code)`, with scale 1 for the unscaled codecs, so a kernel computes
// `scale * sum(q[i] * load(code[i]))` for every dtype (multiplying by 1 is exact: f32 results do not change).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "artifact/numeric.h"
#include "errors.h"
#include "cache/kv_dtype.h"
#include "cache/kv_quant.h"

namespace ninfer {

struct KvCodecF32 {
  using Element = float;
  static constexpr bool kScaled = false;
  static float load(Element e) { return e; }
  static float store_row(const float* x, int64_t n, Element* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i];
    return 1.0f;
  }
};

struct KvCodecBF16 {
  using Element = uint16_t;
  static constexpr bool kScaled = false;
  static float load(Element e) { return bf16_to_f32(e); }
  static float store_row(const float* x, int64_t n, Element* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
    return 1.0f;
  }
};

// The 8-bit codecs: `load` gives the unscaled code value; store_row returns the row's scale.
template <KvDtype D>
struct KvCodec8 {
  using Element = uint8_t;
  static constexpr bool kScaled = true;
  static float load(Element e) {
    if constexpr (D == KvDtype::INT8) return float(int8_t(e));
    else return e4m3_to_f32(e);
  }
  static float store_row(const float* x, int64_t n, Element* out) { return kv_quantize_row(x, n, D, out); }
};
using KvCodecFP8 = KvCodec8<KvDtype::FP8>;
using KvCodecINT8 = KvCodec8<KvDtype::INT8>;

inline size_t kv_element_bytes(KvDtype d) {
  switch (d) {
    case KvDtype::F32: return sizeof(float);
    case KvDtype::BF16: return sizeof(uint16_t);
    case KvDtype::FP8:
    case KvDtype::INT8: return sizeof(uint8_t);
  }
  throw EngineError("unknown KV cache dtype " + std::to_string(int(d)));
}

// Calls fn(Codec{}) with the codec of `d`.
template <class Fn>
decltype(auto) dispatch_kv_dtype(KvDtype d, Fn&& fn) {
  switch (d) {
    case KvDtype::F32: return fn(KvCodecF32{});
    case KvDtype::BF16: return fn(KvCodecBF16{});
    case KvDtype::FP8: return fn(KvCodecFP8{});
    case KvDtype::INT8: return fn(KvCodecINT8{});
  }
  throw EngineError("unknown KV cache dtype " + std::to_string(int(d)));
}

}  // namespace ninfer
