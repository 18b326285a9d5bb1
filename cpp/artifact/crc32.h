// CRC-32 with the zlib polynomial (reflected 0xEDB88320), as the artifact's manifest and blob checksums use.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ninfer {

// CRC-32 of `size` bytes, continuing from `crc` (0 to start), same value as Python's zlib.crc32.
uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc = 0);

}  // namespace ninfer
