// Slice-by-16 table CRC: 16 bytes per step through 16 independent table lookups, several GB/s per core, so a
// multi-gigabyte artifact verifies in seconds (the reader spreads blobs over cores on top of this).
#include "artifact/crc32.h"

#include <array>
#include <cstring>

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

}  // namespace

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc) {
  uint32_t c = ~crc;
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
  return ~c;
}

}  // namespace ninfer
