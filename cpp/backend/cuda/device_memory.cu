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

namespace {

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  NINFER_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

bool ranges_meet(const uint8_t* a, const uint8_t* b, size_t bytes_a, size_t bytes_b) {
  return a < b + bytes_b && b < a + bytes_a;
}

}  // namespace

CopyStream::CopyStream() {
  for (Direction* d : {&stores_, &loads_}) {
    NINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    d->done = new_event();
  }
  queued_ = new_event();
}

CopyStream::~CopyStream() {
  for (Direction* d : {&stores_, &loads_}) {
    cudaStreamSynchronize(d->stream);
    for (cudaEvent_t e : d->events) cudaEventDestroy(e);
    cudaEventDestroy(d->done);
    cudaStreamDestroy(d->stream);
  }
  cudaEventDestroy(queued_);
}

void CopyStream::begin(cudaStream_t after) {
  if (copying_) return;
  NINFER_CUDA_CHECK(cudaEventRecord(queued_, after));
  NINFER_CUDA_CHECK(cudaStreamWaitEvent(stores_.stream, queued_, 0));
  NINFER_CUDA_CHECK(cudaStreamWaitEvent(loads_.stream, queued_, 0));
  copying_ = true;
}

void CopyStream::queue(Direction& to, Direction& other, void* dst, const void* src, size_t bytes,
                       cudaMemcpyKind kind, const uint8_t* device, const uint8_t* pinned) {
  // The latest of the other direction's pending copies that this one meets; copies run in order on a stream, so
  // waiting for it covers the ones before it, which leave the list with it. (Linear in the pending copies: a
  // restore's few thousand pages cost a few ms of host time at most, against their copy's ~100 ms.)
  size_t through = 0;
  for (size_t i = 0; i < other.pending.size(); ++i) {
    const Direction::Copy& c = other.pending[i];
    if (ranges_meet(device, c.device, bytes, c.bytes) || ranges_meet(pinned, c.pinned, bytes, c.bytes)) through = i + 1;
  }
  if (through > 0) {
    NINFER_CUDA_CHECK(cudaStreamWaitEvent(to.stream, other.events[other.pending[through - 1].event], 0));
    other.pending.erase(other.pending.begin(), other.pending.begin() + ptrdiff_t(through));
  }
  NINFER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, to.stream));
  const size_t event = to.pending.empty() ? 0 : to.pending.back().event + 1;
  if (event == to.events.size()) to.events.push_back(new_event());
  NINFER_CUDA_CHECK(cudaEventRecord(to.events[event], to.stream));
  to.pending.push_back({device, pinned, bytes, event});
  to.used = true;
}

void CopyStream::store(void* pinned, const void* device, size_t bytes) {
  queue(stores_, loads_, pinned, device, bytes, cudaMemcpyDeviceToHost, static_cast<const uint8_t*>(device),
        static_cast<const uint8_t*>(pinned));
}

void CopyStream::load(void* device, const void* pinned, size_t bytes) {
  queue(loads_, stores_, device, pinned, bytes, cudaMemcpyHostToDevice, static_cast<const uint8_t*>(device),
        static_cast<const uint8_t*>(pinned));
}

void CopyStream::fence(cudaStream_t before) {
  if (!copying_) return;
  for (Direction* d : {&stores_, &loads_}) {
    if (d->used) {
      NINFER_CUDA_CHECK(cudaEventRecord(d->done, d->stream));
      NINFER_CUDA_CHECK(cudaStreamWaitEvent(before, d->done, 0));
    }
    d->pending.clear();
    d->used = false;
  }
  copying_ = false;
}

void CopyStream::synchronize() {
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stores_.stream));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(loads_.stream));
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
  copies_->store(pinned, src, bytes);
}

void DeviceMemory::copy_from_pinned(void* dst, const void* pinned, size_t bytes) {
  copies_->begin(stream_);
  copies_->load(dst, pinned, bytes);
}

void DeviceMemory::fence_pinned_copies() {
  if (copies_) copies_->fence(stream_);
}

void DeviceMemory::wait_pinned_copies() {
  if (!copies_) return;
  copies_->fence(stream_);
  copies_->synchronize();
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
