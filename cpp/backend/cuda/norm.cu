// Normalisations of the CUDA backend: RMSNorm in both conventions, the GDN gated RMSNorm, per-head L2 norm.
// One block per vector; each thread reads its elements before writing them, so `out` may alias `x`.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {
namespace {

constexpr int kNormThreads = 128;

__device__ float sum_of_squares(const float* x, int64_t dim) {
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) s += x[j] * x[j];
  return block_reduce(s, SumOp{});
}

__global__ void rmsnorm_kernel(const float* x, int64_t dim, int64_t x_stride, const float* w, float offset, float eps,
                               float* out, int64_t out_stride) {
  const float* xr = x + int64_t(blockIdx.x) * x_stride;
  float* yr = out + int64_t(blockIdx.x) * out_stride;
  const float inv = 1.0f / sqrtf(sum_of_squares(xr, dim) / float(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = xr[j] * inv * (offset + w[j]);
}

__global__ void gated_rmsnorm_kernel(const float* x, const float* z, int32_t dim, const float* w, float eps,
                                     float* out) {
  const int64_t base = int64_t(blockIdx.x) * dim;
  const float inv = 1.0f / sqrtf(sum_of_squares(x + base, dim) / float(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    out[base + j] = (w[j] * (x[base + j] * inv)) * silu(z[base + j]);
}

__global__ void l2norm_heads_kernel(const float* x, int32_t heads, int32_t dim, int64_t x_stride, float scale,
                                    float* out) {
  const int64_t r = blockIdx.x / heads, h = blockIdx.x % heads;
  const float* xr = x + r * x_stride + h * dim;
  float* yr = out + int64_t(blockIdx.x) * dim;
  const float inv = 1.0f / sqrtf(sum_of_squares(xr, dim) + 1e-6f);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = xr[j] * inv * scale;
}

void check_grid(int64_t blocks, const char* op) {
  if (blocks > 0x7fffffff) throw EngineError(std::string("cuda ") + op + ": too many rows for one launch");
}

}  // namespace

void CudaBackend::rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, NormKind kind,
                          float eps, float* out, int64_t out_stride) {
  if (rows <= 0 || tables_only()) return;
  check_grid(rows, "rmsnorm");
  rmsnorm_kernel<<<unsigned(rows), kNormThreads, 0, stream_>>>(x, dim, x_stride, resident(w, dim),
                                                               kind == NormKind::Offset ? 1.0f : 0.0f, eps, out,
                                                               out_stride);
  NINFER_CUDA_CHECK_LAUNCH();
}

void CudaBackend::gated_rmsnorm(const float* x, const float* z, int64_t rows, int32_t heads, int32_t dim,
                                const float* w, float eps, float* out) {
  if (rows * heads <= 0 || tables_only()) return;
  check_grid(rows * heads, "gated_rmsnorm");
  gated_rmsnorm_kernel<<<unsigned(rows * heads), kNormThreads, 0, stream_>>>(x, z, dim, resident(w, dim), eps, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

void CudaBackend::l2norm_heads(const float* x, int64_t rows, int32_t heads, int32_t dim, int64_t x_stride,
                               float scale, float* out) {
  if (rows * heads <= 0 || tables_only()) return;
  check_grid(rows * heads, "l2norm_heads");
  l2norm_heads_kernel<<<unsigned(rows * heads), kNormThreads, 0, stream_>>>(x, heads, dim, x_stride, scale, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
