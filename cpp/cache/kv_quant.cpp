#include "cache/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "artifact/numeric.h"
#include "cache/kv_fp4.h"
#include "errors.h"

namespace ninfer {
namespace {

constexpr float kInt8Max = 127.0f;
constexpr float kFp8Max = 448.0f;

void require_quantized(KvDtype dtype) {
  if (dtype != KvDtype::FP8 && dtype != KvDtype::INT8)
    throw EngineError(std::string("KV dtype ") + kv_dtype_name(dtype) + " is not an 8-bit row format");
}

void require_fp4_row(int64_t n) {
  if (n % kKvFp4Block != 0)
    throw EngineError("an nvfp4 KV row holds whole blocks of 16 values, not " + std::to_string(n));
}

}  // namespace

bool kv_dtype_is_quantized(KvDtype dtype) { return dtype != KvDtype::F32 && dtype != KvDtype::BF16; }

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

float kv_quantize_row_fp4(const float* x, int64_t n, uint8_t* codes, uint8_t* blocks) {
  require_fp4_row(n);
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float row_scale = amax / (kKvFp4CodeMax * kKvFp4ScaleMax);
  for (int64_t b = 0; b < n / kKvFp4Block; ++b) {
    const float* xb = x + b * kKvFp4Block;
    float block_max = 0.0f;
    for (int64_t i = 0; i < kKvFp4Block; ++i) block_max = std::max(block_max, std::fabs(xb[i]));
    // An all-zero row (scale 0) and a block whose scale rounds to 0 store zero codes.
    blocks[b] = row_scale > 0.0f ? f32_to_e4m3(block_max / (kKvFp4CodeMax * row_scale)) : 0;
    const float step = row_scale * e4m3_to_f32(blocks[b]);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    for (int64_t i = 0; i < kKvFp4Block; i += 2)
      codes[(b * kKvFp4Block + i) / 2] =
          uint8_t(kv_f32_to_e2m1(xb[i] * inv) | (kv_f32_to_e2m1(xb[i + 1] * inv) << 4));
  }
  return row_scale;
}

void kv_dequantize_row_fp4(const uint8_t* codes, const uint8_t* blocks, float scale, int64_t n, float* out) {
  require_fp4_row(n);
  for (int64_t i = 0; i < n; ++i)
    out[i] = e2m1_to_f32(uint8_t(codes[i / 2] >> (4 * (i % 2)))) * e4m3_to_f32(blocks[i / kKvFp4Block]) * scale;
}

std::vector<float> kv_row_roundtrip(const std::vector<float>& row, KvDtype dtype) {
  const int64_t n = static_cast<int64_t>(row.size());
  std::vector<float> out(n);
  if (dtype == KvDtype::NVFP4) {
    require_fp4_row(n);
    std::vector<uint8_t> codes(n / 2), blocks(n / kKvFp4Block);
    const float scale = kv_quantize_row_fp4(row.data(), n, codes.data(), blocks.data());
    kv_dequantize_row_fp4(codes.data(), blocks.data(), scale, n, out.data());
    return out;
  }
  std::vector<uint8_t> q(n);
  const float scale = kv_quantize_row(row.data(), n, dtype, q.data());
  kv_dequantize_row(q.data(), scale, n, dtype, out.data());
  return out;
}

int64_t kv_code_bytes(KvDtype d, int64_t values) {
  switch (d) {
    case KvDtype::F32: return values * int64_t(sizeof(float));
    case KvDtype::BF16: return values * int64_t(sizeof(uint16_t));
    case KvDtype::FP8:
    case KvDtype::INT8: return values;
    case KvDtype::NVFP4: return values / 2;
    case KvDtype::K8V4: break;
  }
  throw EngineError("not a KV row codec: " + std::string(kv_dtype_name(d)));
}

int64_t kv_row_bytes(KvDtype d, int64_t head_dim) {
  const int64_t scale = kv_dtype_is_quantized(d) ? int64_t(sizeof(float)) : 0;
  const int64_t blocks = d == KvDtype::NVFP4 ? head_dim / kKvFp4Block : 0;
  return kv_code_bytes(d, head_dim) + scale + blocks;
}

}  // namespace ninfer
