// Device memory as a MemoryResource: what pools and activation buffers of the CUDA backend allocate from.
// Fills and copies are queued on the backend's stream; to_host waits for them.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>

#include "backend/memory.h"

namespace ninfer::cuda {

// The host tier's copies run on a stream of their own, ordered against the passes' stream by events: the first
// copy after a fence waits for the work queued so far, and the fence makes later work wait for the copies. (They
// do not overlap the passes yet: every copy sits between two passes that need it done.)
class CopyStream {
 public:
  CopyStream();
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  void begin(cudaStream_t after);  // once per batch of copies
  void fence(cudaStream_t before);
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t queued_ = nullptr, copied_ = nullptr;
  bool copying_ = false;
};

class DeviceMemory final : public MemoryResource {
 public:
  // The copy stream only for a memory with a stream (the backend's).
  explicit DeviceMemory(cudaStream_t stream)
      : stream_(stream), copies_(stream ? std::make_unique<CopyStream>() : nullptr) {}
  void* allocate(size_t bytes, const std::string& what) override;
  void deallocate(void* p) noexcept override;
  void fill(void* p, uint8_t byte, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void from_host(void* dst, const void* host, size_t bytes) override;
  void to_host(void* host, const void* src, size_t bytes) override;
  bool host_accessible() const override { return false; }
  std::shared_ptr<void> allocate_pinned(size_t bytes, const std::string& what) override;
  void copy_to_pinned(void* pinned, const void* src, size_t bytes) override;
  void copy_from_pinned(void* dst, const void* pinned, size_t bytes) override;
  void fence_pinned_copies() override;
  void wait_pinned_copies() override;
  // Runs before every read back to the host (where a captured decode pass is launched: its outputs are read).
  void set_before_host_read(std::function<void()> hook) { before_host_read_ = std::move(hook); }

 private:
  cudaStream_t stream_;
  std::unique_ptr<CopyStream> copies_;
  std::function<void()> before_host_read_;
};

// Whether `p` is device (or managed) memory, as opposed to host memory the device cannot read.
bool is_device_pointer(const void* p);

}  // namespace ninfer::cuda
