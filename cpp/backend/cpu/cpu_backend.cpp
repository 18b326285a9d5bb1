// Matrices and elementwise ops of the CPU backend.
#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/linear.h"

namespace ninfer {

std::unique_ptr<Backend> make_cpu_backend(int32_t threads) { return std::make_unique<cpu::CpuBackend>(threads); }

namespace cpu {

void CpuBackend::bind_calling_thread() {
  omp_set_num_threads(threads_ > 0 ? threads_ : omp_get_num_procs());
}

void CpuBackend::linear(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias) {
  cpu::linear(x, rows, w, y, bias);
}

void CpuBackend::linear_shared_input(const float* x, int64_t rows, std::span<const LinearOut> outs) {
  cpu::linear_shared_input(x, rows, outs);
}

void CpuBackend::embed(const int32_t* tokens, int64_t n, const TensorView& table, float* out) {
  const int64_t dim = table.cols();
#pragma omp parallel for if (n > 1)
  for (int64_t i = 0; i < n; ++i) dequantize_row(table, tokens[i], out + i * dim);
}

void CpuBackend::gather_rows(const float* x, int64_t dim, const int64_t* rows, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * dim, x + rows[i] * dim, size_t(dim) * sizeof(float));
}

void CpuBackend::argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, const float* column_ids) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t best = std::max_element(x + r * cols, x + (r + 1) * cols) - (x + r * cols);
    ids[r] = column_ids ? int32_t(column_ids[best]) : int32_t(best);
  }
}

void CpuBackend::row_dots(const float* rows, int64_t n, int64_t dim, const float* x, float* out) {
#pragma omp parallel for if (n * dim > 65536)
  for (int64_t j = 0; j < n; ++j) {
    double sum = 0;  // double: the readout compares against the full-vocabulary f32 logits within their rounding
    for (int64_t c = 0; c < dim; ++c) sum += double(rows[j * dim + c]) * x[c];
    out[j] = float(sum);
  }
}

void CpuBackend::add(float* inout, const float* x, int64_t n) {
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) inout[i] += x[i];
}

static inline float silu(float v) { return v / (1.0f + std::exp(-v)); }
static inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

void CpuBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void CpuBackend::copy_columns(const float* x, int64_t rows, int64_t x_stride, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * cols, x + r * x_stride, size_t(cols) * sizeof(float));
}

void CpuBackend::sigmoid_gate(float* x, int64_t rows, int32_t heads, int32_t dim, const float* gate,
                              int64_t gate_row_stride, int64_t gate_head_stride) {
#pragma omp parallel for collapse(2) if (rows * heads * dim > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t h = 0; h < heads; ++h) {
      float* xh = x + (r * heads + h) * dim;
      const float* gh = gate + r * gate_row_stride + h * gate_head_stride;
      for (int32_t j = 0; j < dim; ++j) xh[j] *= sigmoid(gh[j]);
    }
}

}  // namespace cpu
}  // namespace ninfer
