// Small device helpers shared by the CUDA backend's kernels: launch shapes, block reductions, the scalar
// functions written exactly as the CPU twins write them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ninfer::cuda {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));  // grid-stride loops cover the rest
}

// Whether `p` may be read and written as float4.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

#define NINFER_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces `v` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <class Op>
__device__ float block_reduce(float v, Op op) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // the previous reduction's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = partial[0];
  for (int i = 1; i < warps; ++i) v = op(v, partial[i]);
  return v;
}

}  // namespace ninfer::cuda
