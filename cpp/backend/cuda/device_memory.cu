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
  fence_pinned_copies();  // (a slot or page a host-tier copy still reads may be written next)
  NINFER_CUDA_CHECK(cudaMemsetAsync(p, byte, bytes, stream_));
}

void DeviceMemory::copy(void* dst, const void* src, size_t bytes) {
  fence_pinned_copies();
  NINFER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void DeviceMemory::from_host(void* dst, const void* host, size_t bytes) {
  fence_pinned_copies();
  // From pageable memory the call returns once the bytes are staged, so `host` may be reused at once.
  NINFER_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
}

void DeviceMemory::to_host(void* host, const void* src, size_t bytes) {
  fence_pinned_copies();
  if (before_host_read_) before_host_read_();
  NINFER_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CopyStream::CopyStream() {
  NINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  NINFER_CUDA_CHECK(cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming));
  NINFER_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
}

CopyStream::~CopyStream() {
  cudaStreamSynchronize(stream_);
  cudaEventDestroy(queued_);
  cudaEventDestroy(copied_);
  cudaStreamDestroy(stream_);
}

void CopyStream::begin(cudaStream_t after) {
  if (copying_) return;
  NINFER_CUDA_CHECK(cudaEventRecord(queued_, after));
  NINFER_CUDA_CHECK(cudaStreamWaitEvent(stream_, queued_, 0));
  copying_ = true;
}

void CopyStream::fence(cudaStream_t before) {
  if (!copying_) return;
  NINFER_CUDA_CHECK(cudaEventRecord(copied_, stream_));
  NINFER_CUDA_CHECK(cudaStreamWaitEvent(before, copied_, 0));
  copying_ = false;
}

std::shared_ptr<void> DeviceMemory::allocate_pinned(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t status = cudaMallocHost(&p, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw OutOfMemoryError(what + " (" + std::to_string(bytes >> 20) + " MiB) could not be page-locked in host " +
                           "memory: " + cudaGetErrorString(status));
  }
  return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
}

void DeviceMemory::copy_to_pinned(void* pinned, const void* src, size_t bytes) {
  copies_->begin(stream_);
  NINFER_CUDA_CHECK(cudaMemcpyAsync(pinned, src, bytes, cudaMemcpyDeviceToHost, copies_->stream()));
}

void DeviceMemory::copy_from_pinned(void* dst, const void* pinned, size_t bytes) {
  copies_->begin(stream_);
  NINFER_CUDA_CHECK(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, copies_->stream()));
}

void DeviceMemory::fence_pinned_copies() {
  if (copies_) copies_->fence(stream_);
}

void DeviceMemory::wait_pinned_copies() {
  if (!copies_) return;
  copies_->fence(stream_);
  NINFER_CUDA_CHECK(cudaStreamSynchronize(copies_->stream()));
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
