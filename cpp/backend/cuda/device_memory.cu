#include "backend/cuda/device_memory.h"

#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"

namespace ninfer::cuda {

void* DeviceMemory::allocate(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw OutOfMemoryError(what + " (" + std::to_string(bytes >> 20) + " MiB) does not fit in device memory (" +
                           std::to_string(free_bytes >> 20) + " MiB free of " + std::to_string(total_bytes >> 20) +
                           " MiB)");
  }
  NINFER_CUDA_CHECK(status);
  note_device_allocation_change();
  NINFER_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  return p;
}

void DeviceMemory::deallocate(void* p) noexcept {
  cudaStreamSynchronize(stream_);  // kernels queued before the free may still read it
  cudaFree(p);
  note_device_allocation_change();
}

void DeviceMemory::fill(void* p, uint8_t byte, size_t bytes) {
  NINFER_CUDA_CHECK(cudaMemsetAsync(p, byte, bytes, stream_));
}

void DeviceMemory::copy(void* dst, const void* src, size_t bytes) {
  NINFER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void DeviceMemory::from_host(void* dst, const void* host, size_t bytes) {
  // From pageable memory the call returns once the bytes are staged, so `host` may be reused at once.
  NINFER_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
}

void DeviceMemory::to_host(void* host, const void* src, size_t bytes) {
  if (before_host_read_) before_host_read_();
  NINFER_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace ninfer::cuda
