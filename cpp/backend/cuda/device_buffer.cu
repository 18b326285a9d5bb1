#include "backend/cuda/device_buffer.h"

#include <atomic>

#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {
namespace {
std::atomic<uint64_t> allocation_epoch{0};
}  // namespace

uint64_t device_allocation_epoch() { return allocation_epoch.load(std::memory_order_relaxed); }
void note_device_allocation_change() { allocation_epoch.fetch_add(1, std::memory_order_relaxed); }

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) NINFER_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  if (ptr_) note_device_allocation_change();
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) {
    cudaFree(ptr_);
    note_device_allocation_change();
  }
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) {
      cudaFree(ptr_);
      note_device_allocation_change();
    }
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = other.bytes_;
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  NINFER_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  NINFER_CUDA_CHECK(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost));
}

size_t data_bytes(const TensorView& v) {
  const size_t n = size_t(v.numel());
  switch (v.encoding) {
    case Encoding::F32: return 4 * n;
    case Encoding::F16:
    case Encoding::BF16: return 2 * n;
    case Encoding::FP8_E4M3:
    case Encoding::INT8: return n;
    case Encoding::INT4:
    case Encoding::INT4_AFFINE:
    case Encoding::NVFP4: return n / 2;
  }
  return 0;
}

size_t scale_bytes(const TensorView& v) {
  const size_t stacked_rows = size_t(v.matrices() * v.rows());
  switch (v.encoding) {
    case Encoding::FP8_E4M3: return 4 * stacked_rows;
    case Encoding::INT8:
    case Encoding::INT4:
    case Encoding::INT4_AFFINE: return 2 * stacked_rows * size_t(v.cols() / v.group_size);
    case Encoding::NVFP4: return stacked_rows * size_t(v.cols() / 16);
    default: return 0;
  }
}

size_t zero_bytes(const TensorView& v) {
  if (v.encoding != Encoding::INT8 && v.encoding != Encoding::INT4) return 0;
  return size_t(v.matrices() * v.rows()) * size_t(v.cols() / v.group_size);
}

size_t offset_bytes(const TensorView& v) {
  if (v.encoding != Encoding::INT4_AFFINE) return 0;
  return 2 * size_t(v.matrices() * v.rows()) * size_t(v.cols() / v.group_size);
}

DeviceWeight upload_weight(const TensorView& host) {
  DeviceWeight w;
  w.view = host;
  auto copy = [](DeviceBuffer& buffer, const uint8_t* source, size_t bytes) -> const uint8_t* {
    if (!bytes || !source) return nullptr;
    buffer = DeviceBuffer(bytes);
    buffer.upload(source, bytes);
    return buffer.as<const uint8_t>();
  };
  w.view.data = copy(w.data, host.data, data_bytes(host));
  w.view.scale = copy(w.scale, host.scale, scale_bytes(host));
  w.view.zero = copy(w.zero, host.zero, zero_bytes(host));
  w.view.offset = copy(w.offset, host.offset, offset_bytes(host));
  return w;
}

}  // namespace ninfer::cuda
