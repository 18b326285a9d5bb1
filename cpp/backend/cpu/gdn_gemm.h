// Small single-threaded f32 matrix product for the chunked Gated DeltaNet kernel (private to gdn.cpp).
// The callers' matrices are a few KiB to 64 KiB, so there is no packing: a register tile of kRows x kCols outputs
// is accumulated over the whole inner dimension, and the compiler vectorises the fixed-width column loop
// (6 x 16 floats = 12 AVX2 accumulators, leaving registers for two rows of b and one broadcast of a).
#pragma once

#include <algorithm>
#include <cstdint>

namespace ninfer::cpu {

enum class GemmMode { kOverwrite, kAccumulate };

// Triangular structure the chunk's products have, so that their zero half is not computed:
// kLowerOutput: only c[i, j] with j <= i is wanted (entries above the diagonal are left unspecified);
// kLowerA: a[i, p] is zero for p > i (the inner sum of row i stops at p = i).
enum class Triangle { kNone, kLowerOutput, kLowerA };

namespace gemm_detail {

constexpr int64_t kRows = 6;
constexpr int64_t kCols = 16;

// One tile of kRowsT x cols outputs (cols <= kCols). Full-width tiles use compile-time bounds, so the accumulators
// live in registers; a narrower last column tile runs the same loops with a runtime bound. kTransA reads a as
// stored transposed (a[p, r] instead of a[r, p]).
template <int64_t kRowsT, bool kFullWidth, bool kTransA>
inline void tile(int64_t cols, int64_t inner, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                 int64_t ldc, GemmMode mode) {
  const int64_t nc = kFullWidth ? kCols : cols;
  float acc[kRowsT][kCols] = {};
  for (int64_t p = 0; p < inner; ++p) {
    const float* bp = b + p * ldb;
    for (int64_t r = 0; r < kRowsT; ++r) {
      const float ar = kTransA ? a[p * lda + r] : a[r * lda + p];
#pragma omp simd
      for (int64_t x = 0; x < nc; ++x) acc[r][x] += ar * bp[x];
    }
  }
  for (int64_t r = 0; r < kRowsT; ++r)
    for (int64_t x = 0; x < nc; ++x)
      c[r * ldc + x] = (mode == GemmMode::kAccumulate ? c[r * ldc + x] : 0.0f) + acc[r][x];
}

// The tile of kRowsT rows from row0 and the column tile from j, honouring the triangle (skipped when all of it lies
// above the diagonal under kLowerOutput; the inner sum stops at the block's last row under kLowerA).
template <int64_t kRowsT, bool kTransA>
inline void tile_at(int64_t row0, int64_t j, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
                    int64_t ldb, float* c, int64_t ldc, GemmMode mode, Triangle tri) {
  const int64_t last_row = row0 + kRowsT - 1;
  if (tri == Triangle::kLowerOutput && j > last_row) return;
  const int64_t inner = tri == Triangle::kLowerA ? std::min(K, last_row + 1) : K;
  const float* ai = a + row0 * (kTransA ? 1 : lda);
  float* cij = c + row0 * ldc + j;
  if (j + kCols <= N)
    tile<kRowsT, true, kTransA>(kCols, inner, ai, lda, b + j, ldb, cij, ldc, mode);
  else
    tile<kRowsT, false, kTransA>(N - j, inner, ai, lda, b + j, ldb, cij, ldc, mode);
}

// Column tiles outermost, so that the K x kCols panel of b stays in L1 while every row block of a passes over it.
// Rows go in blocks of kRows, the last M % kRows rows with a tile of their own compile-time height.
template <bool kTransA>
inline void gemm_rows(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float* c, int64_t ldc, GemmMode mode, Triangle tri) {
  const int64_t full = M - M % kRows;
  for (int64_t j = 0; j < N; j += kCols) {
    for (int64_t i = 0; i < full; i += kRows) tile_at<kRows, kTransA>(i, j, N, K, a, lda, b, ldb, c, ldc, mode, tri);
    switch (M - full) {
      case 5: tile_at<5, kTransA>(full, j, N, K, a, lda, b, ldb, c, ldc, mode, tri); break;
      case 4: tile_at<4, kTransA>(full, j, N, K, a, lda, b, ldb, c, ldc, mode, tri); break;
      case 3: tile_at<3, kTransA>(full, j, N, K, a, lda, b, ldb, c, ldc, mode, tri); break;
      case 2: tile_at<2, kTransA>(full, j, N, K, a, lda, b, ldb, c, ldc, mode, tri); break;
      case 1: tile_at<1, kTransA>(full, j, N, K, a, lda, b, ldb, c, ldc, mode, tri); break;
      default: break;
    }
  }
}

}  // namespace gemm_detail

// c[M, N] = (mode == kAccumulate ? c : 0) + a[M, K] b[K, N]; row-major with leading dimensions lda, ldb, ldc.
inline void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                 int64_t ldc, GemmMode mode, Triangle tri = Triangle::kNone) {
  gemm_detail::gemm_rows<false>(M, N, K, a, lda, b, ldb, c, ldc, mode, tri);
}

// c[M, N] = (mode == kAccumulate ? c : 0) + a^T b with a stored [K, M] (leading dimension lda), b [K, N].
inline void gemm_at(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb,
                    float* c, int64_t ldc, GemmMode mode) {
  gemm_detail::gemm_rows<true>(M, N, K, a, lda, b, ldb, c, ldc, mode, Triangle::kNone);
}

}  // namespace ninfer::cpu
