#include "backend/cpu/linear_grouped.h"

#include <algorithm>

#include "errors.h"

#include "backend/cpu/linear_decode.h"
#include "backend/cpu/linear_tiling.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(NINFER_DECODE_AVX2)
#define NINFER_LINEAR_GROUPED 1
#include <immintrin.h>

#include "artifact/numeric.h"
#include "backend/cpu/linear_simd.h"
#endif

namespace ninfer::cpu {

#ifdef NINFER_LINEAR_GROUPED

namespace {

// One weight row's codes minus its group's zero point, 16 columns at a time, as two exact f32 8-vectors.
// set_group() must be called for the group holding the columns before at().
template <bool Int4>
struct CenteredCodes {
  const uint8_t* q;         // the row's codes
  const uint8_t* zeros;     // the row's zero points, one per group
  const uint8_t* scales;    // the row's f16 scales, one per group
  __m256i zero16 = _mm256_setzero_si256();  // int8: the zero point in 16 i16 lanes
  __m128i zero8 = _mm_setzero_si128();      // int4: the zero point in 16 u8 lanes

  CenteredCodes(const TensorView& w, int64_t row) {
    const int64_t groups = w.cols() / w.group_size;
    q = w.data + row * (Int4 ? w.cols() / 2 : w.cols());
    zeros = w.zero + row * groups;
    scales = w.scale + 2 * row * groups;
  }
  // Loads group `g`'s zero point and returns its scale.
  float set_group(int64_t g) {
    if constexpr (Int4) zero8 = _mm_set1_epi8(char(zeros[g]));
    else zero16 = _mm256_set1_epi16(int16_t(zeros[g]));
    return _cvtsh_ss(simd::load_u16(scales, g));
  }
  void at(int64_t c, __m256& lo, __m256& hi) const {
    if constexpr (Int4) {
      // code - zero lies in [-15, 15]: the byte subtraction is exact as a signed byte.
      const __m128i centered = _mm_sub_epi8(simd::unpack_nibbles16(q + c / 2), zero8);
      lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(centered));
      hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(centered, 8)));
    } else {
      // code - zero lies in [-255, 255]: exact in i16.
      const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c));
      const __m256i centered = _mm256_sub_epi16(_mm256_cvtepu8_epi16(codes), zero16);
      lo = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(centered)));
      hi = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(centered, 1)));
    }
  }
  // Columns [c, c + 32) as four 8-vectors: the values of at(c) and at(c + 16). int4 unpacks the 16 code bytes in
  // one go (fewer shuffles than two at() calls).
  void at32(int64_t c, __m256 v[4]) const {
    if constexpr (Int4) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c / 2));
      const __m128i mask = _mm_set1_epi8(0x0f);
      const __m128i lo = _mm_and_si128(bytes, mask), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
      const __m128i first = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), zero8);
      const __m128i second = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), zero8);
      v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first));
      v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(first, 8)));
      v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second));
      v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(second, 8)));
    } else {
      at(c, v[0], v[1]);
      at(c + 16, v[2], v[3]);
    }
  }
};

// The arithmetic both paths share, per (input row, weight row) and per chunk of columns:
//   a = 0 (8 lanes); for each group: s = 0; s += x[k:k+8] * v[k:k+8] for k over the group in steps of 8 (FMA);
//   a = scale * s + a (FMA); then the chunk's sum_lanes4 is added to the row's running total.
// v = code - zero. Both paths below follow it step for step.

// The decode step: one input row, weights centered straight into registers.
template <bool Int4>
void tile_one_row(const float* x, const TensorView& w, int64_t o0, float* acc) {
  const int64_t cols = w.cols(), group = w.group_size, last = w.rows() - 1;
  // A short last tile centers its last row again in the missing slots; those sums are never written out.
  CenteredCodes<Int4> d0(w, o0), d1(w, std::min(o0 + 1, last)), d2(w, std::min(o0 + 2, last)),
      d3(w, std::min(o0 + 3, last));
  for (int64_t c0 = 0; c0 < cols; c0 += kChunkCols) {
    const int64_t end = std::min(c0 + kChunkCols, cols);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t g0 = c0; g0 < end; g0 += group) {
      const int64_t g = g0 / group;
      const __m256 scale0 = _mm256_set1_ps(d0.set_group(g)), scale1 = _mm256_set1_ps(d1.set_group(g)),
                   scale2 = _mm256_set1_ps(d2.set_group(g)), scale3 = _mm256_set1_ps(d3.set_group(g));
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, v[4];
      // Groups are multiples of 32 columns (linear_grouped_applies).
      for (int64_t k = g0; k < g0 + group; k += 32) {
        const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        const __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
        auto step = [&](const CenteredCodes<Int4>& d, __m256 s) {
          d.at32(k, v);
          return _mm256_fmadd_ps(x3, v[3], _mm256_fmadd_ps(x2, v[2], _mm256_fmadd_ps(x1, v[1],
                                 _mm256_fmadd_ps(x0, v[0], s))));
        };
        s0 = step(d0, s0);
        s1 = step(d1, s1);
        s2 = step(d2, s2);
        s3 = step(d3, s3);
      }
      a0 = _mm256_fmadd_ps(scale0, s0, a0);
      a1 = _mm256_fmadd_ps(scale1, s1, a1);
      a2 = _mm256_fmadd_ps(scale2, s2, a2);
      a3 = _mm256_fmadd_ps(scale3, s3, a3);
    }
    _mm_storeu_ps(acc, _mm_add_ps(_mm_loadu_ps(acc), sum_lanes4(a0, a1, a2, a3)));
  }
}

// A chunk of the batched path: centered weights of the tile (kTileRows rows of kChunkCols floats; zero rows pad a
// short tile) and their scales (kTileRows rows of kChunkCols / 32 groups at most; zero for padding).
struct CenteredChunk {
  alignas(64) float values[kTileRows * kChunkCols];
  float scales[kTileRows][kChunkCols / 32];
};

template <bool Int4>
void center_chunk(const TensorView& w, int64_t o0, int64_t tile_rows, int64_t c0, int64_t n, CenteredChunk& chunk) {
  const int64_t group = w.group_size;
  for (int64_t t = 0; t < kTileRows; ++t) {
    float* out = chunk.values + t * kChunkCols;
    if (t >= tile_rows) {
      std::fill(out, out + n, 0.0f);
      std::fill(chunk.scales[t], chunk.scales[t] + n / group, 0.0f);
      continue;
    }
    CenteredCodes<Int4> d(w, o0 + t);
    for (int64_t g0 = 0; g0 < n; g0 += group) {
      chunk.scales[t][g0 / group] = d.set_group((c0 + g0) / group);
      for (int64_t k = g0; k < g0 + group; k += 16) {
        __m256 lo, hi;
        d.at(c0 + k, lo, hi);
        _mm256_store_ps(out + k, lo);
        _mm256_store_ps(out + k + 8, hi);
      }
    }
  }
}

// acc[r * kTileRows + t] += the chunk's contribution for input rows r < rows (x rows `ldx` floats apart, x
// pointing at the chunk's first column), in the shared order; two input rows at a time share the weight loads.
void chunk_dot(const float* x, int64_t ldx, int64_t rows, const CenteredChunk& chunk, int64_t n, int64_t group,
               float* acc) {
  const float* w[kTileRows] = {chunk.values, chunk.values + kChunkCols, chunk.values + 2 * kChunkCols,
                               chunk.values + 3 * kChunkCols};
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    const float* xa = x + r * ldx;
    const float* xb = xa + ldx;
    __m256 a[2][kTileRows];
    for (auto& row : a)
      for (__m256& v : row) v = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < n; g0 += group) {
      __m256 sa0 = _mm256_setzero_ps(), sa1 = sa0, sa2 = sa0, sa3 = sa0, sb0 = sa0, sb1 = sa0, sb2 = sa0, sb3 = sa0;
      for (int64_t k = g0; k < g0 + group; k += 8) {
        const __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k);
        const __m256 v0 = _mm256_load_ps(w[0] + k), v1 = _mm256_load_ps(w[1] + k);
        const __m256 v2 = _mm256_load_ps(w[2] + k), v3 = _mm256_load_ps(w[3] + k);
        sa0 = _mm256_fmadd_ps(va, v0, sa0); sb0 = _mm256_fmadd_ps(vb, v0, sb0);
        sa1 = _mm256_fmadd_ps(va, v1, sa1); sb1 = _mm256_fmadd_ps(vb, v1, sb1);
        sa2 = _mm256_fmadd_ps(va, v2, sa2); sb2 = _mm256_fmadd_ps(vb, v2, sb2);
        sa3 = _mm256_fmadd_ps(va, v3, sa3); sb3 = _mm256_fmadd_ps(vb, v3, sb3);
      }
      const int64_t g = g0 / group;
      const __m256 scale0 = _mm256_set1_ps(chunk.scales[0][g]), scale1 = _mm256_set1_ps(chunk.scales[1][g]),
                   scale2 = _mm256_set1_ps(chunk.scales[2][g]), scale3 = _mm256_set1_ps(chunk.scales[3][g]);
      a[0][0] = _mm256_fmadd_ps(scale0, sa0, a[0][0]); a[1][0] = _mm256_fmadd_ps(scale0, sb0, a[1][0]);
      a[0][1] = _mm256_fmadd_ps(scale1, sa1, a[0][1]); a[1][1] = _mm256_fmadd_ps(scale1, sb1, a[1][1]);
      a[0][2] = _mm256_fmadd_ps(scale2, sa2, a[0][2]); a[1][2] = _mm256_fmadd_ps(scale2, sb2, a[1][2]);
      a[0][3] = _mm256_fmadd_ps(scale3, sa3, a[0][3]); a[1][3] = _mm256_fmadd_ps(scale3, sb3, a[1][3]);
    }
    for (int64_t i = 0; i < 2; ++i) {
      float* ra = acc + (r + i) * kTileRows;
      _mm_storeu_ps(ra, _mm_add_ps(_mm_loadu_ps(ra), sum_lanes4(a[i][0], a[i][1], a[i][2], a[i][3])));
    }
  }
  if (r < rows) {
    // The odd row: one row of the pair loop above, the same operations in the same order.
    const float* xa = x + r * ldx;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t g0 = 0; g0 < n; g0 += group) {
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t k = g0; k < g0 + group; k += 8) {
        const __m256 va = _mm256_loadu_ps(xa + k);
        s0 = _mm256_fmadd_ps(va, _mm256_load_ps(w[0] + k), s0);
        s1 = _mm256_fmadd_ps(va, _mm256_load_ps(w[1] + k), s1);
        s2 = _mm256_fmadd_ps(va, _mm256_load_ps(w[2] + k), s2);
        s3 = _mm256_fmadd_ps(va, _mm256_load_ps(w[3] + k), s3);
      }
      const int64_t g = g0 / group;
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(chunk.scales[0][g]), s0, a0);
      a1 = _mm256_fmadd_ps(_mm256_set1_ps(chunk.scales[1][g]), s1, a1);
      a2 = _mm256_fmadd_ps(_mm256_set1_ps(chunk.scales[2][g]), s2, a2);
      a3 = _mm256_fmadd_ps(_mm256_set1_ps(chunk.scales[3][g]), s3, a3);
    }
    float* ra = acc + r * kTileRows;
    _mm_storeu_ps(ra, _mm_add_ps(_mm_loadu_ps(ra), sum_lanes4(a0, a1, a2, a3)));
  }
}

template <bool Int4>
void linear_grouped_typed(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias,
                          int64_t chunk) {
  const int64_t out = w.rows(), cols = w.cols(), tiles = (out + kTileRows - 1) / kTileRows;
  auto write = [&](const float* acc, int64_t r, int64_t o0, int64_t tile_rows) {
    for (int64_t t = 0; t < tile_rows; ++t) y[r * out + o0 + t] = acc[t] + (bias ? bias[o0 + t] : 0.0f);
  };
  if (rows == 1) {
#pragma omp parallel for schedule(dynamic, chunk) if (out * cols >= kParallelMinWeights)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t o0 = tile * kTileRows;
      alignas(16) float acc[kTileRows] = {0.0f, 0.0f, 0.0f, 0.0f};
      tile_one_row<Int4>(x, w, o0, acc);
      write(acc, 0, o0, std::min(kTileRows, out - o0));
    }
    return;
  }
  struct Scratch {
    CenteredChunk buf;
    alignas(64) float acc[kMaxRowBlock * kTileRows];
  };
  for_each_tile_of_row_blocks<Scratch>(rows, cols, out, chunk, [&](Scratch& s, int64_t r0, int64_t block_rows,
                                                                    int64_t o0) {
    const int64_t tile_rows = std::min(kTileRows, out - o0);
    std::fill(s.acc, s.acc + block_rows * kTileRows, 0.0f);
    for (int64_t c0 = 0; c0 < cols; c0 += kChunkCols) {
      const int64_t n = std::min(kChunkCols, cols - c0);
      center_chunk<Int4>(w, o0, tile_rows, c0, n, s.buf);
      chunk_dot(x + r0 * cols + c0, cols, block_rows, s.buf, n, w.group_size, s.acc);
    }
    for (int64_t r = 0; r < block_rows; ++r) write(s.acc + r * kTileRows, r0 + r, o0, tile_rows);
  });
}

}  // namespace

bool linear_grouped_applies(const TensorView& w) {
  // Groups of 32 .. kChunkCols columns that tile a chunk (the format's sizes are 32, 64 and 128).
  return (w.encoding == Encoding::INT4 || w.encoding == Encoding::INT8) && w.group_size >= 32 &&
         kChunkCols % w.group_size == 0;
}

void linear_grouped(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias, int64_t chunk) {
  if (w.encoding == Encoding::INT4) linear_grouped_typed<true>(x, rows, w, y, bias, chunk);
  else linear_grouped_typed<false>(x, rows, w, y, bias, chunk);
}

#else

bool linear_grouped_applies(const TensorView&) { return false; }

void linear_grouped(const float*, int64_t, const TensorView&, float*, const float*, int64_t) {
  throw EngineError("linear_grouped: not built for this CPU (needs AVX2, F16C and FMA)");
}

#endif

}  // namespace ninfer::cpu
