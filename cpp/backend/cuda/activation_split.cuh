// The tensor-core GEMV's activation split (gemv_mma.h): one f32 row into hi and lo 16-bit planes in the lane pair
// order of the weights that read it, fp16 rows scaled by a power of two first. Shared by the split kernel
// (gemv_mma.cu) and the norm that writes the planes itself (norm.cu), so both produce the same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/dequant.cuh"

namespace ninfer::cuda {

// Split kinds: the operand type (bf16, or fp16 with per-row scaling) and the lane pair order; equal kinds share
// one split (gemv_mma.h's split_kind()).
__host__ __device__ constexpr int split_kind_of(bool bf16, tc::Order order) { return (bf16 ? 3 : 0) + int(order); }

template <bool kBf16>
__device__ __forceinline__ void split_value(float v, uint16_t& hi, uint16_t& lo) {
  if constexpr (kBf16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi = __bfloat16_as_ushort(h);
    lo = __bfloat16_as_ushort(__float2bfloat16_rn(v - __bfloat162float(h)));
  } else {
    const __half h = __float2half_rn(v);
    hi = __half_as_ushort(h);
    lo = __half_as_ushort(__float2half_rn(v - __half2float(h)));
  }
}

// The fp16 row exponent e for a row whose largest |x| is `amax`: x * 2^e has its largest value in [2^14, 2^15)
// (fp16's largest finite value is 65504); 0 for an all-zero or non-finite row.
__device__ __forceinline__ int fp16_row_exponent(float amax) {
  if (!(amax > 0.0f && amax <= FLT_MAX)) return 0;
  int exponent = 0;
  frexpf(amax, &exponent);  // amax in [2^(exponent-1), 2^exponent)
  return min(15 - exponent, 126);
}

// Columns [begin, end) of row xr (every `step`-th from begin + threadIdx.x) into the planes hi and lo (this row's),
// scaled by `scale`: plane column j holds source column segment + source_column(j % 32) of its 32-column segment.
template <bool kBf16, tc::Order kOrder>
__device__ __forceinline__ void split_columns(const float* xr, int64_t begin, int64_t end, int step, float scale,
                                              uint16_t* hi, uint16_t* lo) {
#pragma unroll 4
  for (int64_t j = begin + threadIdx.x; j < end; j += step) {
    const int64_t segment = j / tc::kSegmentCols * tc::kSegmentCols;
    split_value<kBf16>(xr[segment + tc::source_column(kOrder, int(j % tc::kSegmentCols))] * scale, hi[j], lo[j]);
  }
}

}  // namespace ninfer::cuda
