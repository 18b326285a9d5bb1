// Normalisations of the CPU backend: RMSNorm in both conventions, the GDN gated RMSNorm, per-head L2 norm.
#include <cmath>

#include "backend/cpu/cpu_backend.h"

namespace ninfer::cpu {

static inline float inverse_rms(const float* x, int64_t dim, float eps) {
  float sum = 0.0f;
  for (int64_t j = 0; j < dim; ++j) sum += x[j] * x[j];
  return 1.0f / std::sqrt(sum / float(dim) + eps);
}

void CpuBackend::rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, NormKind kind,
                         float eps, float* out, int64_t out_stride) {
  const float offset = kind == NormKind::Offset ? 1.0f : 0.0f;
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* yr = out + r * out_stride;
    const float inv = inverse_rms(xr, dim, eps);
    for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * inv * (offset + w[j]);
  }
}

void CpuBackend::add_rmsnorm(float* hidden, const float* delta, int64_t rows, int64_t dim, const float* w,
                             NormKind kind, float eps, float* out) {
  const float offset = kind == NormKind::Offset ? 1.0f : 0.0f;
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    float* hr = hidden + r * dim;
    const float* dr = delta + r * dim;
    float* yr = out + r * dim;
    for (int64_t j = 0; j < dim; ++j) hr[j] += dr[j];
    const float inv = inverse_rms(hr, dim, eps);
    for (int64_t j = 0; j < dim; ++j) yr[j] = hr[j] * inv * (offset + w[j]);
  }
}

void CpuBackend::gated_rmsnorm(const float* x, const float* z, int64_t rows, int32_t heads, int32_t dim,
                               const float* w, float eps, float* out) {
#pragma omp parallel for if (rows * heads * dim > 65536)
  for (int64_t rh = 0; rh < rows * heads; ++rh) {
    const float* xr = x + rh * dim;
    const float* zr = z + rh * dim;
    float* yr = out + rh * dim;
    const float inv = inverse_rms(xr, dim, eps);
    for (int32_t j = 0; j < dim; ++j) yr[j] = (w[j] * (xr[j] * inv)) * (zr[j] / (1.0f + std::exp(-zr[j])));
  }
}

void CpuBackend::l2norm_heads(const float* x, int64_t rows, int32_t heads, int32_t dim, int64_t x_stride,
                              float scale, float* out) {
#pragma omp parallel for if (rows * heads * dim > 65536)
  for (int64_t rh = 0; rh < rows * heads; ++rh) {
    const int64_t r = rh / heads, h = rh % heads;
    const float* xr = x + r * x_stride + h * dim;
    float* yr = out + rh * dim;
    float sum = 0.0f;
    for (int32_t j = 0; j < dim; ++j) sum += xr[j] * xr[j];
    const float inv = 1.0f / std::sqrt(sum + 1e-6f);
    for (int32_t j = 0; j < dim; ++j) yr[j] = xr[j] * inv * scale;
  }
}

}  // namespace ninfer::cpu
