#include "backend/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "errors.h"

namespace ninfer {
namespace {

class HostMemory final : public MemoryResource {
 public:
  void* allocate(size_t bytes, const std::string& what) override {
    // 64-byte aligned (a cache line, and what the vectorised CPU kernels like).
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p)
      throw OutOfMemoryError(what + " (" + std::to_string(bytes >> 20) + " MiB) does not fit in host memory");
    std::memset(p, 0, bytes);
    return p;
  }
  void deallocate(void* p) noexcept override { std::free(p); }
  void fill(void* p, uint8_t byte, size_t bytes) override { std::memset(p, byte, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void from_host(void* dst, const void* host, size_t bytes) override { copy(dst, host, bytes); }
  void to_host(void* host, const void* src, size_t bytes) override { copy(host, src, bytes); }
  bool host_accessible() const override { return true; }
};

}  // namespace

std::shared_ptr<void> MemoryResource::allocate_pinned(size_t bytes, const std::string& what) {
  return std::shared_ptr<void>(host_memory().allocate(bytes, what), [](void* p) { host_memory().deallocate(p); });
}

MemoryResource& host_memory() {
  static HostMemory memory;
  return memory;
}

}  // namespace ninfer
