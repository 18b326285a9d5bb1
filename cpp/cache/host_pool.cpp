#include "cache/host_pool.h"

#include <algorithm>
#include <string>

#include "errors.h"

namespace ninfer {

HostPool::HostPool(int64_t pages, size_t page_bytes, int32_t slots, size_t slot_bytes, MemoryResource& memory) {
  pages_ = allocate(pages, page_bytes, memory, "host tier KV pages");
  slots_ = allocate(slots, slot_bytes, memory, "host tier state slots");
}

HostPool::Items HostPool::allocate(int64_t count, size_t item_bytes, MemoryResource& memory, const char* what) {
  Items items;
  items.item_bytes = item_bytes;
  if (count <= 0 || item_bytes == 0) return items;
  items.per_chunk = std::max<size_t>(1, kHostPoolChunkBytes / item_bytes);
  for (int64_t first = 0; first < count; first += int64_t(items.per_chunk)) {
    const size_t n = std::min<size_t>(items.per_chunk, size_t(count - first));
    items.chunks.push_back(memory.allocate_pinned(n * item_bytes, std::string(what) + " (" + std::to_string(count) +
                                                                      " of " + std::to_string(item_bytes) + " B)"));
    bytes_ += n * item_bytes;
  }
  return items;
}

void* HostPool::locate(const Items& items, int64_t i) {
  const size_t chunk = size_t(i) / items.per_chunk;
  if (i < 0 || chunk >= items.chunks.size()) throw EngineError("host tier item " + std::to_string(i) + " out of range");
  return static_cast<uint8_t*>(items.chunks[chunk].get()) + (size_t(i) % items.per_chunk) * items.item_bytes;
}

}  // namespace ninfer
