// Prefill-size products with grouped-integer weights (int4, int8) streamed through the tensor cores in their stored
// encoding: y[r, o] = sum_i x[r, i] * W[o, i] (+ bias[o]) for any number of rows, with no dequantized copy of W.
// The bf16 path (prefill_gemm.h) first writes W out as bf16 (2 bytes a weight, every call) and so costs a
// whole-model pass of writes whatever the rows; here the codes are read once per tile of rows and dequantized in
// registers, so a pass of a few dozen rows (a verify pass, a decision batch, a short prefill chunk beside decode
// rows) costs about one read of the weights.
//
// Numerics: x is rounded to bf16 (as the bf16 path does); the weight operand is exact (q - zero, an integer of at
// most 8 bits, is exact in bf16) and each 128-column group's f32 partial sum is multiplied by its scale, so W
// itself is not rounded (the bf16 path rounds (q - zero) * scale to bf16). f32 accumulation; with the columns
// split over blocks (split-K, chosen from the shape and the rows), the partial sums are added in a fixed order.
//
// Layout: a block of 4 warps computes 128 weight rows (two 16-row mma tiles per warp) against a tile of 16, 32 or
// 64 activation rows; the weights' codes and the activations are staged through shared memory by cp.async, several
// 128-column steps ahead. The activations are prepared once per input (streamed_gemm_prepare) as a bf16 plane in
// the weights' operand order (dequant.cuh tc::Order), so a lane's 16-byte shared load is its mma B operands.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "artifact/artifact.h"

namespace ninfer::cuda {

// Whether this path takes the weight: int4 or int8, groups a multiple of 128 columns, cols a multiple of 128.
bool streamed_gemm_supports(const TensorView& w);

// The activation plane's element order for this weight (equal values share one prepared plane).
int streamed_gemm_order(const TensorView& w);

// x f32 [rows, k] (16-byte aligned, k % 128 == 0) -> plane, bf16 [rows, k] in `order` (streamed_gemm_order).
void streamed_gemm_prepare(const float* x, int64_t rows, int64_t k, int order, uint16_t* plane, cudaStream_t stream);

// Bytes of split-K partial sums streamed_gemm needs for `rows` rows of `w` (0 when it does not split).
size_t streamed_gemm_partial_bytes(int64_t rows, const TensorView& w);

// y [rows, w.rows()] = plane W^T (+ bias), plane from streamed_gemm_prepare for this weight's order; `w` holds
// device pointers; partials: streamed_gemm_partial_bytes(rows, w) bytes of device scratch (null when 0).
void streamed_gemm(const uint16_t* plane, int64_t rows, const TensorView& w, float* y, const float* bias,
                   float* partials, cudaStream_t stream);

}  // namespace ninfer::cuda
