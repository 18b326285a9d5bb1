// GELU of the CUDA backend, both forms the vision tower uses: the tanh approximation (its blocks' MLP) and the exact
// erf form (its merger), each written as the CPU twin writes it. Elementwise, so `out` may alias `x`.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"

namespace ninfer::cuda {
namespace {

__device__ __forceinline__ float gelu_tanh(float v) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
}

__device__ __forceinline__ float gelu_erf(float v) {
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  return 0.5f * v * (1.0f + erff(v * kInvSqrt2));
}

template <GeluKind kKind>
__global__ void gelu_kernel(const float* x, int64_t n, float* out) {
  chain_start();
  NINFER_GRID_STRIDE(i, n) out[i] = kKind == GeluKind::Tanh ? gelu_tanh(x[i]) : gelu_erf(x[i]);
}

}  // namespace

void CudaBackend::gelu(const float* x, int64_t n, GeluKind kind, float* out) {
  if (n <= 0 || tables_only()) return;
  launch_chained(kind == GeluKind::Tanh ? gelu_kernel<GeluKind::Tanh> : gelu_kernel<GeluKind::Erf>,
                 dim3(blocks_for(n)), dim3(kThreads), 0, stream_, x, n, out);
}

}  // namespace ninfer::cuda
