// Small device helpers shared by the CUDA backend's kernels: launch shapes, block reductions, the scalar
// functions written exactly as the CPU twins write them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));  // grid-stride loops cover the rest
}

// The current device's multiprocessors (read once: launch shapes that fill the device depend on it).
inline int device_sms() {
  static const int count = [] {
    int device = 0, n = 0;
    NINFER_CUDA_CHECK(cudaGetDevice(&device));
    NINFER_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return count;
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

// --- chained launches (programmatic dependent launch, sm_90+) ---
//
// A decode step is ~1,100 small kernels (35B-A3B), and each one's launch and ramp-up used to wait for the one
// before it to drain. A kernel launched by launch_chained() may be scheduled while the previous kernel of its stream
// still runs: its first statement must be chain_start(), which waits until that kernel has finished and its writes
// are visible (griddepcontrol.wait, before any global memory access: reads of its outputs and writes to what it
// reads alike), then lets the next chained kernel be scheduled in turn. The stream order of results is unchanged.
// A kernel with chain_start() may also be launched plainly (the wait is then a no-op).
__device__ __forceinline__ void chain_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launch_chained() chains (NINFER_CUDA_CHAINED=0 in the environment turns it off, for A/B runs).
inline bool chained_launches() {
  static const bool on = [] {
    const char* value = std::getenv("NINFER_CUDA_CHAINED");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return on;
}

template <class... Params, class... Args>
void launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                    Args... args) {
  cudaLaunchAttribute chained{};
  chained.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  chained.val.programmaticStreamSerializationAllowed = chained_launches() ? 1 : 0;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &chained;
  config.numAttrs = 1;
  NINFER_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, Params(args)...));
}

}  // namespace ninfer::cuda
