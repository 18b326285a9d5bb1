// The host tier's storage: KV pages and Gated DeltaNet state slots in page-locked host memory (on the CUDA
// backend; plain host memory on the CPU backend), so copies from and to the device pools run at the bus's full
// rate without staging. Storage only, like KvPool and StatePool: which pages and slots hold what is the prefix
// cache's business (runtime/prefix_cache.h), their tables the host tier's (runtime/host_tier.h).
//
// It is allocated in chunks of at most kHostPoolChunkBytes: one huge page-locked allocation can fail (or stall
// the machine) where several smaller ones succeed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/memory.h"

namespace ninfer {

inline constexpr size_t kHostPoolChunkBytes = size_t(1) << 30;

class HostPool {
 public:
  HostPool(int64_t pages, size_t page_bytes, int32_t slots, size_t slot_bytes, MemoryResource& memory);

  void* page(int32_t page) const { return locate(pages_, page); }
  void* slot(int32_t slot) const { return locate(slots_, slot); }
  size_t bytes() const { return bytes_; }

 private:
  // Equal-sized items in chunks of `per_chunk` items.
  struct Items {
    size_t item_bytes = 0, per_chunk = 1;
    std::vector<std::shared_ptr<void>> chunks;
  };
  Items allocate(int64_t count, size_t item_bytes, MemoryResource& memory, const char* what);
  static void* locate(const Items& items, int64_t i);

  Items pages_, slots_;
  size_t bytes_ = 0;
};

}  // namespace ninfer
