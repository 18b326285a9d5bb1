// How KV rows are stored: the one place that knows each row codec's element type and conversions.
// Kernels are written once as templates over a key codec and a value codec and instantiated by
// `dispatch_kv_format` (a KV format names one codec per side: cache/kv_dtype.h).
//
// A codec stores one (token, head) row of head_dim values at a time. f32 and bf16 store the values themselves;
// fp8 and int8 store 8-bit codes plus one f32 scale per row (cache/kv_quant.h), kept by the pool beside the
// page's rows; nvfp4 stores 4-bit codes two a byte plus one e4m3 scale per 16 values (also beside the rows) and
// the f32 row scale. A stored value is `scale * load(row, i)`, with scale 1 for the unscaled codecs (and the
// block scale inside load for nvfp4), so a kernel computes `scale * sum(q[i] * load(row, i))` for every codec
// (multiplying by 1 is exact: f32 results do not change).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "artifact/numeric.h"
#include "errors.h"
#include "cache/kv_dtype.h"
#include "cache/kv_fp4.h"
#include "cache/kv_quant.h"

namespace ninfer {

// The common shape of the codecs with one value an element and no block scales: load(row, blocks, i) is
// load(row[i]) and store_row ignores `blocks`.
template <class Self, class E, bool Scaled>
struct KvCodecPerElement {
  using Element = E;
  static constexpr bool kScaled = Scaled;
  static constexpr bool kBlockScaled = false;
  static constexpr int64_t kValuesPerElement = 1;
  static float load(const Element* row, const uint8_t*, int64_t i) { return Self::load_one(row[i]); }
};

struct KvCodecF32 : KvCodecPerElement<KvCodecF32, float, false> {
  static float load_one(Element e) { return e; }
  static float store_row(const float* x, int64_t n, Element* out, uint8_t*) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i];
    return 1.0f;
  }
};

struct KvCodecBF16 : KvCodecPerElement<KvCodecBF16, uint16_t, false> {
  static float load_one(Element e) { return bf16_to_f32(e); }
  static float store_row(const float* x, int64_t n, Element* out, uint8_t*) {
    for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
    return 1.0f;
  }
};

// The 8-bit codecs: `load` gives the unscaled code value; store_row returns the row's scale.
template <KvDtype D>
struct KvCodec8 : KvCodecPerElement<KvCodec8<D>, uint8_t, true> {
  static float load_one(uint8_t e) {
    if constexpr (D == KvDtype::INT8) return float(int8_t(e));
    else return e4m3_to_f32(e);
  }
  static float store_row(const float* x, int64_t n, uint8_t* out, uint8_t*) { return kv_quantize_row(x, n, D, out); }
};
using KvCodecFP8 = KvCodec8<KvDtype::FP8>;
using KvCodecINT8 = KvCodec8<KvDtype::INT8>;

// nvfp4: an element is a byte of two codes; `blocks` are the row's e4m3 block scales; load includes the block
// scale, the row scale stays outside as for the 8-bit codecs.
struct KvCodecNVFP4 {
  using Element = uint8_t;
  static constexpr bool kScaled = true;
  static constexpr bool kBlockScaled = true;
  static constexpr int64_t kValuesPerElement = 2;
  static float load(const Element* row, const uint8_t* blocks, int64_t i) {
    return e2m1_to_f32(uint8_t(row[i / 2] >> (4 * (i % 2)))) * e4m3_to_f32(blocks[i / kKvFp4Block]);
  }
  static float store_row(const float* x, int64_t n, Element* out, uint8_t* blocks) {
    return kv_quantize_row_fp4(x, n, out, blocks);
  }
};

// K plus V bytes of one (token, head) of a format.
inline int64_t kv_format_row_bytes(KvDtype format, int64_t head_dim) {
  return kv_row_bytes(kv_key_dtype(format), head_dim) + kv_row_bytes(kv_value_dtype(format), head_dim);
}

// Calls fn(Codec{}) with the row codec of side dtype `d` (K8V4 is a format, not a side: EngineError).
template <class Fn>
decltype(auto) dispatch_kv_dtype(KvDtype d, Fn&& fn) {
  switch (d) {
    case KvDtype::F32: return fn(KvCodecF32{});
    case KvDtype::BF16: return fn(KvCodecBF16{});
    case KvDtype::FP8: return fn(KvCodecFP8{});
    case KvDtype::INT8: return fn(KvCodecINT8{});
    case KvDtype::NVFP4: return fn(KvCodecNVFP4{});
    case KvDtype::K8V4: break;
  }
  throw EngineError("not a KV row codec: " + std::string(kv_dtype_name(d)));
}

// Calls fn(KeyCodec{}, ValueCodec{}) for format `f`: only the pairs that formats name are instantiated.
template <class Fn>
decltype(auto) dispatch_kv_format(KvDtype f, Fn&& fn) {
  if (f == KvDtype::K8V4) return fn(KvCodecINT8{}, KvCodecNVFP4{});
  return dispatch_kv_dtype(f, [&](auto codec) { return fn(codec, codec); });
}

}  // namespace ninfer
