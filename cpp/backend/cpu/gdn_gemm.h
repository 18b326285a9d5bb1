// Small single-threaded f32 matrix product for the chunked Gated DeltaNet kernel (private to gdn.cpp).
// The callers' matrices are a few KiB to 64 KiB, so there is no packing: a register tile of kRows x kCols outputs
// is accumulated over the whole inner dimension, and the compiler vectorises the fixed-width column loop.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ninfer::cpu {

enum class GemmMode { kOverwrite, kAccumulate };

namespace gemm_detail {

constexpr int kRows = 4;
constexpr int kCols = 16;

// One tile of at most kRows x kCols outputs. Full tiles use the compile-time bounds (fully unrolled, held in
// registers); edge tiles pass their real extent and run the same loops with runtime bounds.
template <bool kFull>
inline void tile(int64_t rows, int64_t cols, int64_t inner, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float* c, int64_t ldc, GemmMode mode) {
  const int64_t nr = kFull ? kRows : rows, nc = kFull ? kCols : cols;
  float acc[kRows][kCols] = {};
  for (int64_t p = 0; p < inner; ++p) {
    const float* bp = b + p * ldb;
    for (int64_t r = 0; r < nr; ++r) {
      const float ar = a[r * lda + p];
#pragma omp simd
      for (int64_t x = 0; x < nc; ++x) acc[r][x] += ar * bp[x];
    }
  }
  for (int64_t r = 0; r < nr; ++r)
    for (int64_t x = 0; x < nc; ++x) c[r * ldc + x] = (mode == GemmMode::kAccumulate ? c[r * ldc + x] : 0.0f) + acc[r][x];
}

}  // namespace gemm_detail

// c[M, N] = (mode == kAccumulate ? c : 0) + a[M, K] b[K, N]; row-major with leading dimensions lda, ldb, ldc.
inline void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                 int64_t ldc, GemmMode mode) {
  using namespace gemm_detail;
  for (int64_t i = 0; i < M; i += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, M - i);
    for (int64_t j = 0; j < N; j += kCols) {
      const int64_t cols = std::min<int64_t>(kCols, N - j);
      const float* ai = a + i * lda;
      float* cij = c + i * ldc + j;
      if (rows == kRows && cols == kCols)
        tile<true>(rows, cols, K, ai, lda, b + j, ldb, cij, ldc, mode);
      else
        tile<false>(rows, cols, K, ai, lda, b + j, ldb, cij, ldc, mode);
    }
  }
}

}  // namespace ninfer::cpu
