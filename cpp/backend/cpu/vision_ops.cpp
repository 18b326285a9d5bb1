// The vision tower's ops on the CPU backend: LayerNorm, GELU (tanh and exact), the resampled position embedding,
// and attention within segments (one image or one video frame group each).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear.h"
#include "errors.h"

namespace ninfer::cpu {

void CpuBackend::layernorm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                           float* out) {
#pragma omp parallel for if (rows * dim > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    // Two passes (mean, then the centred variance): the one-pass E[x^2] - E[x]^2 loses digits on offset rows.
    double mean = 0.0;
    for (int64_t j = 0; j < dim; ++j) mean += xr[j];
    mean /= double(dim);
    double var = 0.0;
    for (int64_t j = 0; j < dim; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    const float inv = float(1.0 / std::sqrt(var / double(dim) + double(eps)));
    const float m = float(mean);
    for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - m) * inv * w[j] + b[j];
  }
}

void CpuBackend::gelu(const float* x, int64_t n, GeluKind kind, float* out) {
  if (kind == GeluKind::Tanh) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
#pragma omp parallel for simd if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      out[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
    }
  } else {
    constexpr float kInvSqrt2 = 0.7071067811865476f;
#pragma omp parallel for simd if (n > 65536)
    for (int64_t i = 0; i < n; ++i) out[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
  }
}

void CpuBackend::add_embedding_mix(const int32_t* ids, const float* weights, int64_t rows, int32_t taps,
                                   const TensorView& table, float* inout) {
  const int64_t dim = table.cols(), table_rows = table.rows();
  check_embedding_taps(ids, rows * taps, table_rows);
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(dim)), mix(static_cast<size_t>(dim));
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      // The taps are summed first and then added, as the reference sums its weighted rows before the add.
      std::fill(mix.begin(), mix.end(), 0.0f);
      for (int32_t j = 0; j < taps; ++j) {
        dequantize_row(table, ids[r * taps + j], row.data());
        const float wj = weights[r * taps + j];
        for (int64_t c = 0; c < dim; ++c) mix[size_t(c)] += wj * row[size_t(c)];
      }
      float* y = inout + r * dim;
      for (int64_t c = 0; c < dim; ++c) y[c] += mix[size_t(c)];
    }
  }
}

void CpuBackend::segment_attention(const float* q, const float* k, const float* v, int64_t row_stride,
                                   std::span<const RowSegment> segments, int32_t heads, int32_t head_dim, float scale,
                                   float* out) {
  // (segment, query row) pairs flattened so that one large image and several small ones spread alike.
  std::vector<std::pair<int32_t, int64_t>> work;
  for (size_t s = 0; s < segments.size(); ++s)
    for (int64_t i = 0; i < segments[s].n; ++i) work.emplace_back(int32_t(s), segments[s].row0 + i);
#pragma omp parallel
  {
    std::vector<float> scores, acc(static_cast<size_t>(head_dim));
#pragma omp for schedule(dynamic, 16)
    for (size_t w = 0; w < work.size(); ++w) {
      const RowSegment& seg = segments[size_t(work[w].first)];
      const int64_t row = work[w].second;
      scores.resize(size_t(seg.n));
      for (int32_t h = 0; h < heads; ++h) {
        const float* qr = q + row * row_stride + int64_t(h) * head_dim;
        float top = -INFINITY;
        for (int64_t j = 0; j < seg.n; ++j) {
          const float* kr = k + (seg.row0 + j) * row_stride + int64_t(h) * head_dim;
          float dot = 0.0f;
          for (int32_t c = 0; c < head_dim; ++c) dot += qr[c] * kr[c];
          scores[size_t(j)] = dot * scale;
          top = std::max(top, scores[size_t(j)]);
        }
        float total = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < seg.n; ++j) {
          const float p = std::exp(scores[size_t(j)] - top);
          total += p;
          const float* vr = v + (seg.row0 + j) * row_stride + int64_t(h) * head_dim;
          for (int32_t c = 0; c < head_dim; ++c) acc[size_t(c)] += p * vr[c];
        }
        float* o = out + row * int64_t(heads) * head_dim + int64_t(h) * head_dim;
        for (int32_t c = 0; c < head_dim; ++c) o[c] = acc[size_t(c)] / total;
      }
    }
  }
}

}  // namespace ninfer::cpu
