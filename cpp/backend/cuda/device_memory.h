// Device memory as a MemoryResource: what pools and activation buffers of the CUDA backend allocate from.
// Fills and copies are queued on the backend's stream; to_host waits for them.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

#include "backend/memory.h"

namespace ninfer::cuda {

// The host tier's copies: device-to-host stores on one stream, host-to-device loads on another, so that a restore
// which must evict first (store device pages, then load host blocks into them) uses the bus in both directions at
// once. Both streams are ordered against the passes' stream by events: the first copy after a fence waits for the
// work queued so far, and the fence makes later work wait for every copy. Between the two streams a copy waits for
// the latest copy of the other direction queued before it whose bytes it meets (the device page a store still
// reads and a load would write, or the host page a load still reads and a store would write), through that copy's
// own event, and for nothing else. (The copies do not overlap the passes: every batch sits between two passes that
// need it done.)
class CopyStream {
 public:
  CopyStream();
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  void begin(cudaStream_t after);  // once per batch of copies
  void store(void* pinned, const void* device, size_t bytes);
  void load(void* device, const void* pinned, size_t bytes);
  void fence(cudaStream_t before);
  void synchronize();  // waits on the host for every copy queued

 private:
  // One direction: its stream and this batch's copies that the other direction has not waited for yet.
  struct Direction {
    struct Copy {
      const uint8_t *device, *pinned;
      size_t bytes;
      size_t event;  // into events
    };
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> events;  // one per copy of a batch, reused by later batches
    std::vector<Copy> pending;
    cudaEvent_t done = nullptr;  // recorded at a fence
    bool used = false;           // in this batch
  };
  // Queues a copy on `to` after the latest copy of `other` its bytes meet.
  void queue(Direction& to, Direction& other, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
             const uint8_t* device, const uint8_t* pinned);

  Direction stores_, loads_;
  cudaEvent_t queued_ = nullptr;
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
