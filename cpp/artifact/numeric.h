// Scalar conversions of the stored number formats (bf16, f16, fp8 e4m3, e2m1), exact and branch-light.
#pragma once

#include <cstdint>
#include <cstring>

namespace ninfer {

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float f);
float e4m3_to_f32(uint8_t bits);   // OCP FP8 E4M3FN: bias 7, no infinities, 0x7f/0xff NaN, max 448
uint8_t f32_to_e4m3(float f);      // round to nearest even, saturating to +-448
float e2m1_to_f32(uint8_t code);   // low 4 bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign

}  // namespace ninfer
