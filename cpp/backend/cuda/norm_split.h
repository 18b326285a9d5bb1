// The residual add + RMSNorm kernel of CudaBackend::add_rmsnorm, callable with the tensor-core GEMV's split
// planes as a second output (norm.cu), so that tests can compare those planes with split_activations() of the
// norm's output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gemv_mma.h"

namespace ninfer::cuda {

// hidden += delta; out = hidden * inv_rms * (offset + w) over `rows` rows of `dim` values (device pointers). With
// `planes` (split_layout() of out, an fp16 kind, rows <= kMaxGemvRows), the same launch also writes out's split
// planes and row exponents, bit for bit what split_activations(out, ...) would write.
void launch_add_rmsnorm(float* hidden, const float* delta, int64_t rows, int64_t dim, const float* w, float offset,
                        float eps, float* out, const SplitActivations* planes, cudaStream_t stream);

}  // namespace ninfer::cuda
