// Quantized KV rows: one (token, head) row of head_dim values with one f32 scale, so each row uses the code range
// fully whatever its magnitude.
//   int8: q = round(x / s), s = max|x| / 127         -> |x - q s| <= s / 2
//   fp8:  q = e4m3(x / s), s = max|x| / 448          -> |x - e4m3(q) s| <= max(2^-4 |x|, 2^-10 s)
//   nvfp4: 4-bit e2m1 codes (two a byte, value 2i in the low nibble) with one e4m3 scale per block of 16 values,
//     stored apart from the codes (cache/kv_pool.h), and the row's f32 scale:
//       s = max|x| / (6 * 448),  e_b = e4m3(max_b |x| / (6 s)),  q_i = e2m1(x_i / (s e_b))  (saturating at 6).
//     The row scale is what keeps every block scale in e4m3 range: the row's largest block gets e_b = 448 exactly
//     and the others max_b / max|x| of that, normal (4 significant bits) down to 2^-6 / 448 ~ 3.5e-5 of the row's
//     largest value, and 0 (the block stored as zeros) below 2^-10 / 448 of it. Without it e_b = max_b / 6 would
//     leave e4m3's range for |x| > 2688 or < 2^-9 * 6.
//     Bound, with S = s e_b and y = x / S: |x - S e2m1(q)| <= S h(|y|), h = 1/4 for |y| <= 2, 1/2 to 4, 1 to 6
//     (half the code spacing), |y| - 6 past 6 (saturation: only when e_b rounded down, by at most 2^-4 for a
//     normal e_b, so |y| <= 6 / (1 - 2^-4) and h <= 0.4); so |x - x^| <= max(|x|, S) / 4 for a normal e_b.
//     e_b = 0 stores the block as zeros: |x - x^| = |x| <= 6 * 2^-10 s.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/kv_dtype.h"

namespace ninfer {

bool kv_dtype_is_quantized(KvDtype dtype);  // has a per-row f32 scale: FP8, INT8, NVFP4 (K8V4: both sides)
// Writes n codes to `q` and returns the row's scale. `dtype` must be FP8 or INT8 (EngineError otherwise).
float kv_quantize_row(const float* x, int64_t n, KvDtype dtype, uint8_t* q);
void kv_dequantize_row(const uint8_t* q, float scale, int64_t n, KvDtype dtype, float* out);
// nvfp4: n / 2 code bytes to `codes`, n / 16 e4m3 block scales to `blocks`; returns the row scale (n a multiple
// of 16, EngineError otherwise).
float kv_quantize_row_fp4(const float* x, int64_t n, uint8_t* codes, uint8_t* blocks);
void kv_dequantize_row_fp4(const uint8_t* codes, const uint8_t* blocks, float scale, int64_t n, float* out);
// Bytes of one (token, head) row of `head_dim` values of side codec `d`: codes, then its f32 scale (scaled
// codecs), then its block scales (nvfp4). The pool keeps each kind in its own array per page (cache/kv_pool.h);
// this is their sum per row, what a page and the memory plan count.
int64_t kv_code_bytes(KvDtype d, int64_t values);  // the codes alone
int64_t kv_row_bytes(KvDtype d, int64_t head_dim);
// quantize then dequantize (for tests): FP8, INT8 or NVFP4
std::vector<float> kv_row_roundtrip(const std::vector<float>& row, KvDtype dtype);

}  // namespace ninfer
