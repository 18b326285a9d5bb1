#include "backend/cuda/gemm.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"

namespace ninfer::cuda {
namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kGemmThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each

template <Encoding E>
__global__ void __launch_bounds__(kGemmThreads)
    gemm_kernel(const float* __restrict__ x, int64_t M, WeightRef w, int64_t N, const float* __restrict__ bias,
                float* __restrict__ y) {
  __shared__ float xs[kTileK][kTileM + 4];
  __shared__ float ws[kTileK][kTileN + 4];
  const int64_t K = w.cols, m0 = int64_t(blockIdx.y) * kTileM, n0 = int64_t(blockIdx.x) * kTileN;
  const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTileM * kTileK; i += kGemmThreads) {
      const int mm = i / kTileK, kk = i % kTileK;
      const int64_t gm = m0 + mm, gk = k0 + kk;
      xs[kk][mm] = gm < M && gk < K ? x[gm * K + gk] : 0.0f;
    }
    for (int i = threadIdx.x; i < kTileN * kTileK; i += kGemmThreads) {
      const int nn = i / kTileK, kk = i % kTileK;
      const int64_t gn = n0 + nn, gk = k0 + kk;
      ws[kk][nn] = gn < N && gk < K ? weight_at<E>(w, gn, gk) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = xs[kk][tr * 4 + i];
        b[i] = ws[kk][tc * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gm = m0 + tr * 4 + i, gn = n0 + tc * 4 + j;
      if (gm < M && gn < N) y[gm * N + gn] = acc[i][j] + (bias ? bias[gn] : 0.0f);
    }
}

}  // namespace

void gemm(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias, cudaStream_t stream) {
  if (rows <= 0) return;
  const int64_t n = w.rows();
  const dim3 grid(unsigned((n + kTileN - 1) / kTileN), unsigned((rows + kTileM - 1) / kTileM));
  if (grid.y > 65535) throw EngineError("cuda gemm: " + std::to_string(rows) + " rows exceed one launch");
  dispatch_encoding(w.encoding, [&](auto encoding) {
    gemm_kernel<decltype(encoding)::value><<<grid, kGemmThreads, 0, stream>>>(x, rows, weight_ref(w), n, bias, y);
  });
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
