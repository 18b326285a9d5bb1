// How RoPE pairs a head's values: the one model-config enum the backends read, kept here so that backends (and
// the cache below them) need nothing from model/.
#pragma once

#include <cstdint>

namespace ninfer {

enum class RopePairing : uint8_t { Half, Interleaved };  // (i, i + d/2) as in Llama / Qwen; (2i, 2i + 1) as in GPT-J

}  // namespace ninfer
