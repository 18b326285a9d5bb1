// NOTE: two implementations of one function. Where the CPU has carry-less multiply (PCLMULQDQ, every x86-64 of
// the last decade), the bulk is folded 64 bytes at a time as in Intel's "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ" (Gopal et al., 2009), >10 GB/s per core; the remainder, and every byte on other
// machines, goes through a slice-by-16 table loop (a few GB/s per core). The reader spreads blobs over cores on
// top of this, so a multi-gigabyte artifact verifies in seconds.
#include "artifact/crc32.h"

#include <array>
#include <cstring>

#if defined(__PCLMUL__) && defined(__SSE4_1__)
#include <immintrin.h>
#define NINFER_CRC_CLMUL 1
#endif

namespace ninfer {

namespace {

constexpr int kSlices = 16;
using Tables = std::array<std::array<uint32_t, 256>, kSlices>;

// tables[0] is the classic byte-at-a-time table; tables[k][b] is the CRC of byte b followed by k zero bytes.
constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[0][b] = c;
  }
  for (int k = 1; k < kSlices; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  return t;
}

constexpr Tables kTables = make_tables();

uint32_t load_le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // the artifact is little-endian and so are the machines ninfer runs on
}

// The table loop on the inverted (in-register) CRC state.
uint32_t crc_tables(const uint8_t* data, size_t size, uint32_t c) {
  const auto& t = kTables;
  while (size >= kSlices) {
    const uint32_t a = load_le32(data) ^ c;
    const uint32_t b = load_le32(data + 4);
    const uint32_t d = load_le32(data + 8);
    const uint32_t e = load_le32(data + 12);
    c = t[15][a & 0xff] ^ t[14][(a >> 8) & 0xff] ^ t[13][(a >> 16) & 0xff] ^ t[12][a >> 24] ^
        t[11][b & 0xff] ^ t[10][(b >> 8) & 0xff] ^ t[9][(b >> 16) & 0xff] ^ t[8][b >> 24] ^
        t[7][d & 0xff] ^ t[6][(d >> 8) & 0xff] ^ t[5][(d >> 16) & 0xff] ^ t[4][d >> 24] ^
        t[3][e & 0xff] ^ t[2][(e >> 8) & 0xff] ^ t[1][(e >> 16) & 0xff] ^ t[0][e >> 24];
    data += kSlices;
    size -= kSlices;
  }
  while (size--) c = (c >> 8) ^ t[0][(c ^ *data++) & 0xff];
  return c;
}

#ifdef NINFER_CRC_CLMUL

// Folding constants of the paper for the bit-reflected zlib polynomial: x^(k) mod P for the distances folded.
constexpr int64_t kFold512Low = 0x0154442bd4, kFold512High = 0x01c6e41596;  // 4 x 128 bits ahead
constexpr int64_t kFold128Low = 0x01751997d0, kFold128High = 0x00ccaa009e;  // 128 bits ahead
constexpr int64_t kFold64 = 0x0163cd6124;                                   // 128 -> 64 bits
constexpr int64_t kPoly = 0x01db710641, kBarrettMu = 0x01f7011641;          // P' and mu for Barrett reduction

// `acc` carried 128 bits (times the distance encoded in k) forward and added to `next`.
inline __m128i fold(__m128i acc, __m128i k, __m128i next) {
  const __m128i low = _mm_clmulepi64_si128(acc, k, 0x00);
  const __m128i high = _mm_clmulepi64_si128(acc, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(low, high), next);
}

inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// The inverted CRC state after `size` bytes (size >= 64, a multiple of 16), from the inverted state `c`.
uint32_t crc_clmul(const uint8_t* data, size_t size, uint32_t c) {
  __m128i lane[4];
  for (int i = 0; i < 4; ++i) lane[i] = load128(data + 16 * i);
  lane[0] = _mm_xor_si128(lane[0], _mm_cvtsi32_si128(int(c)));
  data += 64;
  size -= 64;
  const __m128i k512 = _mm_set_epi64x(kFold512High, kFold512Low);
  for (; size >= 64; data += 64, size -= 64)
    for (int i = 0; i < 4; ++i) lane[i] = fold(lane[i], k512, load128(data + 16 * i));
  // Four lanes into one, then any 16-byte blocks left.
  const __m128i k128 = _mm_set_epi64x(kFold128High, kFold128Low);
  __m128i acc = lane[0];
  for (int i = 1; i < 4; ++i) acc = fold(acc, k128, lane[i]);
  for (; size >= 16; data += 16, size -= 16) acc = fold(acc, k128, load128(data));
  // 128 -> 64 bits, then Barrett reduction to the 32-bit remainder.
  const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);
  acc = _mm_xor_si128(_mm_srli_si128(acc, 8), _mm_clmulepi64_si128(acc, k128, 0x10));
  const __m128i k64 = _mm_set_epi64x(0, kFold64);
  acc = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(acc, low32), k64, 0x00), _mm_srli_si128(acc, 4));
  const __m128i barrett = _mm_set_epi64x(kBarrettMu, kPoly);
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(acc, low32), barrett, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
  return uint32_t(_mm_extract_epi32(_mm_xor_si128(acc, t), 1));
}

#endif

}  // namespace

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc) {
  uint32_t c = ~crc;
#ifdef NINFER_CRC_CLMUL
  if (size >= 64) {
    const size_t bulk = size & ~size_t(15);
    c = crc_clmul(data, bulk, c);
    data += bulk;
    size -= bulk;
  }
#endif
  return ~crc_tables(data, size, c);
}

}  // namespace ninfer
