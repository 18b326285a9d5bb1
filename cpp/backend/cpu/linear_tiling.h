// The tiling that every linear() kernel of the CPU backend shares: 4 weight rows per tile, columns taken a
// 512-column chunk at a time, input rows in L2-sized blocks. The kernels of one encoding must agree on it (and on
// the order of their sums) so that a row's result does not depend on how many rows share the call.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace ninfer::cpu {

constexpr int64_t kTileRows = 4;      // weight rows decoded and multiplied together (the micro-kernel's width)
constexpr int64_t kChunkCols = 512;   // columns per decoded chunk: a multiple of every group size and of 16
constexpr int64_t kMaxRowBlock = 256; // input rows per block, at most
constexpr int64_t kRowBlockBytes = 256 * 1024;  // input-row block sized to stay in L2 with room to spare
// Decode-step (one input row) matrices below this many weights run on the calling thread alone: under ~0.1 ms of
// work, waking and joining a second thread costs about as much as it saves, and on a busy machine the join waits
// for that thread to be scheduled.
constexpr int64_t kParallelMinWeights = 400 * 1024;

// The OpenMP chunk, in tiles, for a loop over `tiles` tiles: dynamic chunks of a few tiles, so that on a busy
// machine a descheduled thread delays the loop by one chunk, not by its whole static share.
inline int64_t tile_chunk_size(int64_t tiles) {
  return std::max<int64_t>(1, tiles / (8 * omp_get_max_threads()));
}

// Input rows per block for rows of `cols` floats: even, 8 .. kMaxRowBlock.
inline int64_t input_row_block(int64_t cols) {
  const int64_t fit = kRowBlockBytes / (cols * int64_t(sizeof(float)));
  return std::clamp<int64_t>(fit & ~int64_t(1), 8, kMaxRowBlock);
}

// The batched loop every kernel shares: input rows in blocks of input_row_block(cols), and within each block the
// weight tiles handed to the threads in dynamic chunks of `chunk` tiles. Each thread owns one Scratch (decode buffer,
// accumulators); tile_block(scratch, r0, block_rows, o0) computes the tile of weight rows from o0 for input rows
// [r0, r0 + block_rows).
template <class Scratch, class TileBlock>
void for_each_tile_of_row_blocks(int64_t rows, int64_t cols, int64_t out, int64_t chunk, TileBlock tile_block) {
  const int64_t row_block = input_row_block(cols), tiles = (out + kTileRows - 1) / kTileRows;
#pragma omp parallel
  {
    Scratch scratch;
    for (int64_t r0 = 0; r0 < rows; r0 += row_block) {
      const int64_t block_rows = std::min(row_block, rows - r0);
#pragma omp for schedule(dynamic, chunk)
      for (int64_t tile = 0; tile < tiles; ++tile) tile_block(scratch, r0, block_rows, tile * kTileRows);
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// The four lane-sums of a, b, c, d as one 4-vector.
inline __m128 sum_lanes4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
#endif

}  // namespace ninfer::cpu
