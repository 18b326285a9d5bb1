#include "backend/cuda/step_tables.h"

#include <cstring>

#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {

StepTables::StepTables(size_t capacity) : capacity_(capacity), device_(capacity) {
  NINFER_CUDA_CHECK(cudaMallocHost(&host_, capacity));
}

StepTables::~StepTables() {
  if (host_) cudaFreeHost(host_);
}

const uint8_t* StepTables::put(const void* data, size_t bytes, bool copy_now, cudaStream_t stream, bool& fits) {
  const size_t at = (used_ + 15) / 16 * 16;
  fits = at + bytes <= capacity_;
  if (!fits) return nullptr;
  if (bytes) std::memcpy(host_ + at, data, bytes);
  used_ = at + bytes;
  layout_.push_back(uint32_t(bytes));
  uint8_t* slot = device_.as<uint8_t>() + at;
  if (copy_now && bytes)
    NINFER_CUDA_CHECK(cudaMemcpyAsync(slot, host_ + at, bytes, cudaMemcpyHostToDevice, stream));
  return slot;
}

void StepTables::copy_all(cudaStream_t stream) const {
  if (used_) NINFER_CUDA_CHECK(cudaMemcpyAsync(device_.get(), host_, used_, cudaMemcpyHostToDevice, stream));
}

}  // namespace ninfer::cuda
