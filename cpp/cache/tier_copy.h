// A copy between two memories, one of which may be the host: how a device slot or page reaches the host tier and
// comes back.
#pragma once

#include <cstddef>

#include "backend/memory.h"

namespace ninfer {

void copy_between(MemoryResource& dst_memory, void* dst, MemoryResource& src_memory, const void* src, size_t bytes);

}  // namespace ninfer
