// Device memory as a MemoryResource: what pools and activation buffers of the CUDA backend allocate from.
// Fills and copies are queued on the backend's stream; to_host waits for them.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "backend/memory.h"

namespace ninfer::cuda {

class DeviceMemory final : public MemoryResource {
 public:
  explicit DeviceMemory(cudaStream_t stream) : stream_(stream) {}
  void* allocate(size_t bytes, const std::string& what) override;
  void deallocate(void* p) noexcept override;
  void fill(void* p, uint8_t byte, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void from_host(void* dst, const void* host, size_t bytes) override;
  void to_host(void* host, const void* src, size_t bytes) override;
  bool host_accessible() const override { return false; }
  // Runs before every read back to the host (where a captured decode pass is launched: its outputs are read).
  void set_before_host_read(std::function<void()> hook) { before_host_read_ = std::move(hook); }

 private:
  cudaStream_t stream_;
  std::function<void()> before_host_read_;
};

// Whether `p` is device (or managed) memory, as opposed to host memory the device cannot read.
bool is_device_pointer(const void* p);

}  // namespace ninfer::cuda
