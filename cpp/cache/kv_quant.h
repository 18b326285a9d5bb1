// 8-bit KV rows: one (token, head) row of head_dim values stored as fp8 e4m3 or int8 codes with one f32 scale,
// so each row uses the code range fully whatever its magnitude.
//   int8: q = round(x / s), s = max|x| / 127         -> |x - q s| <= s / 2
//   fp8:  q = e4m3(x / s), s = max|x| / 448          -> |x - e4m3(q) s| <= max(2^-4 |x|, 2^-10 s)
#pragma once

#include <cstdint>
#include <vector>

#include "cache/kv_dtype.h"

namespace ninfer {

bool kv_dtype_is_quantized(KvDtype dtype);  // FP8, INT8
// Writes n codes to `q` and returns the row's scale. `dtype` must be FP8 or INT8 (EngineError otherwise).
float kv_quantize_row(const float* x, int64_t n, KvDtype dtype, uint8_t* q);
void kv_dequantize_row(const uint8_t* q, float scale, int64_t n, KvDtype dtype, float* out);
// quantize then dequantize (for tests)
std::vector<float> kv_row_roundtrip(const std::vector<float>& row, KvDtype dtype);

}  // namespace ninfer
