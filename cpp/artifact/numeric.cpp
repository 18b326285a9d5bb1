#include "artifact/numeric.h"

#include <array>
#include <cmath>
#include <limits>

namespace ninfer {

// Bit assembly rather than ldexp: this runs once per weight group inside the reference decoder.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in f32
    const float magnitude = float(man) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &magnitude, 4);
  } else if (exp == 31) {
    bits = 0x7f800000u | (man << 13);  // infinity, or NaN keeping its payload
  } else {
    bits = ((exp + 112) << 23) | (man << 13);  // rebias 15 -> 127
  }
  bits |= sign;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {          // subnormal: units of 2^-24, nearest even
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const float mantissa = std::nearbyint(std::ldexp(a, 11 - e));  // 11 significant bits, nearest even
  uint32_t m = uint32_t(mantissa);
  int exp = e - 1 + 15;
  if (m == 2048) {  // rounding carried into the next binade
    m = 1024;
    exp += 1;
  }
  if (exp >= 31) return sign | 0x7c00u;
  return sign | uint16_t(exp << 10) | uint16_t(m & 0x3ff);
}

namespace {

// e4m3 has 256 codes: decode through a table computed at compile time from the format's definition.
constexpr float e4m3_value(int bits) {
  const int exp = (bits >> 3) & 0xf, man = bits & 0x7;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  float magnitude = exp == 0 ? float(man) / 512.0f : float(8 + man);  // subnormal: man/8 * 2^-6
  for (int e = exp; exp != 0 && e < 10; ++e) magnitude /= 2.0f;        // normal: (8 + man) * 2^(exp - 10)
  for (int e = 10; exp != 0 && e < exp; ++e) magnitude *= 2.0f;
  return (bits & 0x80) ? -magnitude : magnitude;
}

constexpr std::array<float, 256> kE4m3Values = [] {
  std::array<float, 256> table{};
  for (int i = 0; i < 256; ++i) table[size_t(i)] = e4m3_value(i);
  return table;
}();

}  // namespace

float e4m3_to_f32(uint8_t bits) { return kE4m3Values[bits]; }

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to the largest finite value
  if (a < std::ldexp(1.0f, -6)) {      // subnormal range: steps of 2^-9
    const int man = int(std::nearbyint(a * 512.0f));
    return sign | uint8_t(man);        // man == 8 is exactly the smallest normal's encoding
  }
  int e;
  std::frexp(a, &e);
  int man = int(std::nearbyint(std::ldexp(a, 4 - e)));  // 4 significant bits, nearest even
  int exp = e - 1 + 7;
  if (man == 16) {
    man = 8;
    exp += 1;
  }
  if (exp > 15 || (exp == 15 && man - 8 > 6)) return sign | 0x7e;
  return sign | uint8_t(exp << 3) | uint8_t(man - 8);
}

float e2m1_to_f32(uint8_t code) {
  static constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitudes[code & 0x7];
  return (code & 0x8) ? -m : m;
}

}  // namespace ninfer
