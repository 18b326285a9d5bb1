// Where a backend's ops find their data: host memory for the CPU backend, device memory for the CUDA backend.
// Pools (KV pages, GDN state slots) and the model's activation buffers allocate through a MemoryResource, so one
// pool class serves every backend; the host resource is the default and keeps the CPU path as it was.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace ninfer {

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  // Zero-filled storage of `bytes`; throws OutOfMemoryError naming `what` when it does not fit.
  virtual void* allocate(size_t bytes, const std::string& what) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  virtual void fill(void* p, uint8_t byte, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // both in this memory
  // Transfers with host memory; to_host returns once the bytes are there.
  virtual void from_host(void* dst, const void* host, size_t bytes) = 0;
  virtual void to_host(void* host, const void* src, size_t bytes) = 0;
  // Whether the host may read and write this memory directly (then the transfers are plain copies).
  virtual bool host_accessible() const = 0;

  // The host tier (cache/host_pool.h): host memory this memory copies to and from at full speed (page-locked for a
  // device; the allocation frees itself, so it may outlive this resource), and copies between the two that are
  // queued, not waited for: after everything queued on this memory before them, and before everything queued
  // after fence_pinned_copies(). wait_pinned_copies() returns once they are done. The host resource copies at once.
  virtual std::shared_ptr<void> allocate_pinned(size_t bytes, const std::string& what);
  virtual void copy_to_pinned(void* pinned, const void* src, size_t bytes) { to_host(pinned, src, bytes); }
  virtual void copy_from_pinned(void* dst, const void* pinned, size_t bytes) { from_host(dst, pinned, bytes); }
  virtual void fence_pinned_copies() {}
  virtual void wait_pinned_copies() {}
};

MemoryResource& host_memory();

// One allocation, freed with its owner.
class MemoryBlock {
 public:
  MemoryBlock() = default;
  MemoryBlock(MemoryResource& memory, size_t bytes, const std::string& what)
      : memory_(&memory), ptr_(bytes ? memory.allocate(bytes, what) : nullptr), bytes_(bytes) {}
  ~MemoryBlock() {
    if (ptr_) memory_->deallocate(ptr_);
  }
  MemoryBlock(MemoryBlock&& o) noexcept
      : memory_(o.memory_), ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  MemoryBlock& operator=(MemoryBlock&& o) noexcept {
    if (this != &o) {
      if (ptr_) memory_->deallocate(ptr_);
      memory_ = o.memory_;
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  MemoryBlock(const MemoryBlock&) = delete;
  MemoryBlock& operator=(const MemoryBlock&) = delete;

  template <class T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  MemoryResource& memory() const { return *memory_; }

 private:
  MemoryResource* memory_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ninfer
