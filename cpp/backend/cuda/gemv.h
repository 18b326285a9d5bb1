// Decode-batch linear layers on the GPU: y[r, o] = sum_i x[r, i] * W[o, i] for r < rows <= kMaxGemvRows, with W in
// any stored encoding, dequantized in registers while it streams (the CPU twin is cpu::linear).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "artifact/artifact.h"

namespace ninfer::cuda {

constexpr int kMaxGemvRows = 8;

// x [rows, W.cols()] f32 and y [rows, W.rows()] f32 are device pointers; `w` holds device pointers (DeviceWeight).
// Throws EngineError for rows outside 1..kMaxGemvRows.
void gemv(const float* x, int rows, const TensorView& w, float* y, cudaStream_t stream);

}  // namespace ninfer::cuda
