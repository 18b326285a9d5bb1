// RAII device memory, and a weight uploaded to the device in its stored encoding (no expansion).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "artifact/artifact.h"

namespace ninfer::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(other.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A count of the device allocations and frees made through DeviceBuffer and DeviceMemory. While it stays the
// same, every device buffer is where it was (what a captured CUDA graph's kernel arguments point at).
uint64_t device_allocation_epoch();
void note_device_allocation_change();

// A weight on the device: the blobs of its encoding copied as they are, and a TensorView whose pointers are
// device pointers (what the kernels take).
struct DeviceWeight {
  TensorView view;
  DeviceBuffer data, scale, zero, offset;
};

DeviceWeight upload_weight(const TensorView& host);

// Bytes of each blob of a view (the sizes the artifact format fixes for the encoding and shape).
size_t data_bytes(const TensorView& v);
size_t scale_bytes(const TensorView& v);
size_t zero_bytes(const TensorView& v);
size_t offset_bytes(const TensorView& v);

}  // namespace ninfer::cuda
