#include "cache/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "artifact/numeric.h"
#include "errors.h"

namespace ninfer {
namespace {

constexpr float kInt8Max = 127.0f;
constexpr float kFp8Max = 448.0f;

void require_quantized(KvDtype dtype) {
  if (!kv_dtype_is_quantized(dtype))
    throw EngineError(std::string("KV dtype ") + kv_dtype_name(dtype) + " is not an 8-bit row format");
}

}  // namespace

bool kv_dtype_is_quantized(KvDtype dtype) { return dtype == KvDtype::FP8 || dtype == KvDtype::INT8; }

float kv_quantize_row(const float* x, int64_t n, KvDtype dtype, uint8_t* q) {
  require_quantized(dtype);
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float code_max = dtype == KvDtype::INT8 ? kInt8Max : kFp8Max;
  // An all-zero row keeps scale 0 and zero codes; dequantizing gives zeros back.
  const float scale = amax / code_max;
  const float inv = amax > 0.0f ? code_max / amax : 0.0f;
  if (dtype == KvDtype::INT8) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = std::clamp(std::nearbyint(x[i] * inv), -kInt8Max, kInt8Max);
      q[i] = static_cast<uint8_t>(static_cast<int8_t>(v));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) q[i] = f32_to_e4m3(x[i] * inv);
  }
  return scale;
}

void kv_dequantize_row(const uint8_t* q, float scale, int64_t n, KvDtype dtype, float* out) {
  require_quantized(dtype);
  if (dtype == KvDtype::INT8) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<int8_t>(q[i])) * scale;
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(q[i]) * scale;
  }
}

std::vector<float> kv_row_roundtrip(const std::vector<float>& row, KvDtype dtype) {
  const int64_t n = static_cast<int64_t>(row.size());
  std::vector<uint8_t> q(n);
  std::vector<float> out(n);
  const float scale = kv_quantize_row(row.data(), n, dtype, q.data());
  kv_dequantize_row(q.data(), scale, n, dtype, out.data());
  return out;
}

}  // namespace ninfer
