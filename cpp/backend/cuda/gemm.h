// Prefill-size linear layers on the GPU: y[r, o] = sum_i x[r, i] * W[o, i] (+ bias[o]) for any number of rows,
// W in its stored encoding and dequantized as its tiles are loaded (the CPU twin is cpu::linear). A plain tiled
// f32 GEMM: the obviously-right twin of the tensor-core paths in prefill_gemm.h, which fall back to it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "artifact/artifact.h"

namespace ninfer::cuda {

// x [rows, W.cols()], y [rows, W.rows()], bias [W.rows()] or null: device pointers; `w` holds device pointers.
void gemm(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias, cudaStream_t stream);

}  // namespace ninfer::cuda
