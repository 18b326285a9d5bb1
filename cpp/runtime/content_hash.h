// 64-bit hashes that name content: the prefix cache's block chain and the media keys salted into it. Not
// cryptographic; a collision is a 2^-64 event for content nobody chose to collide.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>

namespace ninfer {

// splitmix64's finalizer: every input bit moves every output bit.
inline uint64_t hash_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A hash of `bytes` at memory speed: four independent multiply-rotate lanes over 32-byte stripes (so the loop is
// not one long dependency chain), the tail zero-padded, the length folded in, the lanes mixed at the end.
inline uint64_t hash_bytes(std::span<const std::byte> bytes, uint64_t seed = 0) {
  constexpr uint64_t k1 = 0x9e3779b185ebca87ULL, k2 = 0xc2b2ae3d27d4eb4fULL;
  uint64_t lane[4] = {seed + k1, seed + k2, seed, seed - k1};
  const auto round = [&](uint64_t& acc, uint64_t word) { acc = std::rotl(acc + word * k2, 31) * k1; };
  size_t at = 0;
  for (; at + 32 <= bytes.size(); at += 32) {
    uint64_t words[4];
    std::memcpy(words, bytes.data() + at, 32);
    for (int i = 0; i < 4; ++i) round(lane[i], words[i]);
  }
  uint64_t tail[4] = {};
  if (at < bytes.size()) std::memcpy(tail, bytes.data() + at, bytes.size() - at);
  for (int i = 0; i < 4; ++i) round(lane[i], tail[i]);
  uint64_t h = hash_mix(uint64_t(bytes.size()));
  for (uint64_t l : lane) h = hash_mix(h ^ l);
  return h;
}

}  // namespace ninfer
