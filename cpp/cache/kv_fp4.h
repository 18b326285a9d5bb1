// The nvfp4 KV row codec's constants and its e2m1 rounding, shared by the CPU pool (cache/kv_quant.cpp) and the
// CUDA kernels (backend/cuda/kv_device.cuh), so a row written by either backend holds the same codes.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define NINFER_KV_HD __host__ __device__
#else
#define NINFER_KV_HD
#endif

namespace ninfer {

constexpr int64_t kKvFp4Block = 16;        // values per e4m3 block scale
constexpr float kKvFp4CodeMax = 6.0f;      // largest e2m1 magnitude
constexpr float kKvFp4ScaleMax = 448.0f;   // largest e4m3 block scale

// e2m1 code (bit 3 = sign) of x: the nearest of 0, .5, 1, 1.5, 2, 3, 4, 6, ties to the even code (`>` where the
// lower code is even, `>=` where the upper one is), saturating at 6; NaN gives 0. The same thresholds as
// ninfer.artifact.encodings.f32_to_e2m1 (the weight codec).
NINFER_KV_HD inline uint8_t kv_f32_to_e2m1(float x) {
  const float m = x < 0.0f ? -x : x;
  const int c = int(m > 0.25f) + int(m >= 0.75f) + int(m > 1.25f) + int(m >= 1.75f) + int(m > 2.5f) +
                int(m >= 3.5f) + int(m > 5.0f);
  return uint8_t(c | (x < 0.0f ? 8 : 0));
}

}  // namespace ninfer
