#include "cache/tier_copy.h"

#include <cstring>

#include "errors.h"

namespace ninfer {

void copy_between(MemoryResource& dst_memory, void* dst, MemoryResource& src_memory, const void* src, size_t bytes) {
  if (&dst_memory == &src_memory)
    dst_memory.copy(dst, src, bytes);
  else if (src_memory.host_accessible())
    dst_memory.from_host(dst, src, bytes);
  else if (dst_memory.host_accessible())
    src_memory.to_host(dst, src, bytes);
  else
    throw EngineError("no copy path between two device memories");
}

}  // namespace ninfer
