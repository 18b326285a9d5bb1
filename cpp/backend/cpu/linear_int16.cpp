// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(), which -Wmaybe-uninitialized reports
// (a false positive, GCC bug 105593) wherever they are inlined; the warning is off for this file, before the first
// inclusion of immintrin.h.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "backend/cpu/linear_int16.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "errors.h"

#include "backend/cpu/linear_decode.h"
#include "backend/cpu/linear_tiling.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(NINFER_DECODE_AVX2)
#define NINFER_LINEAR_INT16 1
#include <immintrin.h>

#include "backend/cpu/linear_simd.h"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define NINFER_LINEAR_INT16_AVX512 1
#endif
#endif

namespace ninfer::cpu {

#ifdef NINFER_LINEAR_INT16

namespace {

constexpr int64_t kBlock = 32;  // columns per activation block: the smallest weight group, one step per block

// Rounded input rows. Each 32-column block is stored as the int16 values of its 16 even columns, then of its 16
// odd columns: the order in which a mask and a shift take the weight codes out of their bytes (kernel below), so
// the activations are permuted once per call instead of every weight's codes on every call. For the AVX-512 form
// (`pairs`) each pair of blocks 2p, 2p + 1 is stored as the 32 even columns of the pair, then its 32 odd ones
// (the first block's evens, the second's evens, the first's odds, the second's odds): the order a mask and a shift
// give for 64 columns' codes; a last block without a pair keeps the single-block order.
struct RoundedRows {
  int64_t cols = 0, blocks = 0, groups = 0;  // per row
  std::vector<int16_t> q;
  std::vector<float> step;       // per block: the power of two q counts in (NaN: the block was not finite)
  std::vector<float> group_sum;  // per weight group: the sum of the rounded values, step * q, over the group
};

struct RoundedRow {
  const int16_t* q;
  const float* step;
  const float* group_sum;
};

// Rounds the 32 values at x into q (even columns, then odd); returns the block's step and writes sum(q) to *sum.
float round_block(const float* x, int16_t* q, int32_t* sum) {
  __m256 v[4], amax = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[i]));
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));  // max_ps drops NaNs
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float largest = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
  const bool finite = _mm256_movemask_ps(unordered) == 0 && largest <= std::numeric_limits<float>::max();
  if (!finite || largest == 0.0f) {
    std::fill(q, q + kBlock, int16_t(0));
    *sum = 0;
    return finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  // largest * 2^shift in [16384, 32768), one step less if it would round to 32768: |q| <= 32767 always.
  int exponent;
  std::frexp(largest, &exponent);
  int shift = 15 - exponent;
  if (std::ldexp(largest, shift) >= 32767.5f) --shift;
  // Multiplying by 2^shift is exact; 2^shift passes f32's range for blocks below 2^-112, so it goes in two steps.
  const int first = std::min(shift, 127);
  const __m256 by_first = _mm256_set1_ps(std::ldexp(1.0f, first));
  const __m256 by_rest = _mm256_set1_ps(std::ldexp(1.0f, shift - first));
  const __m256i even_then_odd = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  __m256i r[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 scaled = _mm256_mul_ps(_mm256_mul_ps(v[i], by_first), by_rest);
    r[i] = _mm256_cvtps_epi32(_mm256_permutevar8x32_ps(scaled, even_then_odd));  // rounds to nearest even
  }
  // packs gives [evens | odds] of columns 0..15 and of 16..31; the 128-bit halves are then regrouped.
  const __m256i low = _mm256_packs_epi32(r[0], r[1]), high = _mm256_packs_epi32(r[2], r[3]);
  const __m256i even = _mm256_permute2x128_si256(low, high, 0x20), odd = _mm256_permute2x128_si256(low, high, 0x31);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), even);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), odd);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i pairs = _mm256_add_epi32(_mm256_madd_epi16(even, ones), _mm256_madd_epi16(odd, ones));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  *sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
  return std::ldexp(1.0f, -shift);  // 0 below 2^-135: such a block counts as zero
}

void round_rows(const float* x, int64_t rows, int64_t cols, int64_t group, bool pairs, RoundedRows& out) {
  out.cols = cols;
  out.blocks = cols / kBlock;
  out.groups = cols / group;
  out.q.resize(size_t(rows * cols));
  // 16 more than the rows hold: the AVX2 form reads a chunk's 16 blocks and groups whole (lanes past the chunk
  // are masked or never used).
  out.step.assign(size_t(rows * out.blocks + 16), 0.0f);
  out.group_sum.assign(size_t(rows * out.groups + 16), 0.0f);
  const int64_t per_group = group / kBlock;
#pragma omp parallel for schedule(static) if (rows >= 8)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < out.groups; ++g) {
      float total = 0.0f;
      for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
        int32_t sum;
        const float step = round_block(x + r * cols + b * kBlock, out.q.data() + r * cols + b * kBlock, &sum);
        out.step[size_t(r * out.blocks + b)] = step;
        total += step * float(sum);  // exact: |sum| < 2^20, step a power of two
      }
      out.group_sum[size_t(r * out.groups + g)] = total;
    }
    if (pairs) {
      for (int64_t b = 0; b + 1 < out.blocks; b += 2) {
        int16_t* q = out.q.data() + r * cols + b * kBlock;  // [evens 0, odds 0, evens 1, odds 1] -> [e0, e1, o0, o1]
        std::swap_ranges(q + kBlock / 2, q + kBlock, q + kBlock);
      }
    }
  }
}

RoundedRow row_of(const RoundedRows& rounded, int64_t r) {
  return {rounded.q.data() + r * rounded.cols, rounded.step.data() + r * rounded.blocks,
          rounded.group_sum.data() + r * rounded.groups};
}

// A tile's kTileRows weight rows read in place: per 32-column block, the unsigned codes as 16-bit lanes in the
// activations' order (even columns, then odd), and per group the scale and the offset, W = code * scale + offset:
// int4_affine's own offset, -zero * scale for int4 / int8 (exact in f32: 8 + 11 significant bits). A short last
// tile reads its last row again in the missing slots; those sums are never written out.
template <Encoding E>
struct TileInPlace {
  static constexpr bool kNibbles = E != Encoding::INT8;
  const TensorView& w;
  const uint8_t* q[kTileRows];
  int64_t first_group[kTileRows];
  int64_t total_groups;

  TileInPlace(const TensorView& view, int64_t o0) : w(view), total_groups(w.rows() * (w.cols() / w.group_size)) {
    const int64_t groups = w.cols() / w.group_size;
    for (int64_t t = 0; t < kTileRows; ++t) {
      const int64_t row = std::min(o0 + t, w.rows() - 1);
      q[t] = w.data + row * (kNibbles ? w.cols() / 2 : w.cols());
      first_group[t] = row * groups;
    }
  }
  void codes(int64_t t, int64_t c, __m256i& even, __m256i& odd) const {
    if constexpr (kNibbles) {
      // Byte j holds column 2j in its low nibble and 2j + 1 in its high one.
      const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[t] + c / 2)));
      even = _mm256_and_si256(bytes, _mm256_set1_epi16(0x0f));
      odd = _mm256_srli_epi16(bytes, 4);
    } else {
      const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[t] + c));
      even = _mm256_and_si256(pairs, _mm256_set1_epi16(0xff));
      odd = _mm256_srli_epi16(pairs, 8);
    }
  }
  float scale(int64_t t, int64_t g) const { return _cvtsh_ss(simd::load_u16(w.scale, first_group[t] + g)); }
  float offset(int64_t t, int64_t g) const {
    if constexpr (E == Encoding::INT4_AFFINE) return _cvtsh_ss(simd::load_u16(w.offset, first_group[t] + g));
    else return -float(w.zero[first_group[t] + g]) * scale(t, g);
  }
  // Groups g .. g + 15 of row t as two 8-lane vectors, the same values as scale / offset; lanes past `count` hold
  // the following groups of the tensor (0 past its end) and are the caller's to ignore.
  void scales8(int64_t t, int64_t g, int64_t count, __m256 out[2]) const {
    alignas(16) uint16_t halves[16];
    const uint16_t* p = read16(w.scale, 2, first_group[t] + g, count, halves);
    out[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    out[1] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
  void offsets8(int64_t t, int64_t g, int64_t count, const __m256 scales[2], __m256 out[2]) const {
    if constexpr (E == Encoding::INT4_AFFINE) {
      alignas(16) uint16_t halves[16];
      const uint16_t* p = read16(w.offset, 2, first_group[t] + g, count, halves);
      out[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      out[1] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
    } else {
      alignas(16) uint8_t bytes[16];
      const __m128i zeros = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
          read16(w.zero, 1, first_group[t] + g, count, bytes)));
      for (int h = 0; h < 2; ++h) {
        const __m256 zero = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(zeros, 8) : zeros));
        out[h] = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(zero, scales[h]));  // as offset() gives
      }
    }
  }
  // 16 elements of `size` bytes from element i of a per-group array: in place, unless that would read past the
  // tensor's last group (its last rows), then the `count` there copied into `spare` (zeros after).
  template <class T>
  const T* read16(const uint8_t* base, int size, int64_t i, int64_t count, T* spare) const {
    const T* p = reinterpret_cast<const T*>(base + size * i);
    if (i + 16 <= total_groups) return p;
    std::fill(spare, spare + 16, T(0));
    std::copy_n(p, count, spare);
    return spare;
  }

#ifdef NINFER_LINEAR_INT16_AVX512
  // The 64 columns from c (two blocks) as 32 even and 32 odd 16-bit lanes: RoundedRows' pair order.
  void codes_pair(int64_t t, int64_t c, __m512i& even, __m512i& odd) const {
    if constexpr (kNibbles) {
      const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[t] + c / 2)));
      even = _mm512_and_si512(bytes, _mm512_set1_epi16(0x0f));
      odd = _mm512_srli_epi16(bytes, 4);
    } else {
      const __m512i pairs = _mm512_loadu_si512(q[t] + c);
      even = _mm512_and_si512(pairs, _mm512_set1_epi16(0xff));
      odd = _mm512_srli_epi16(pairs, 8);
    }
  }
  // Groups g .. g + 15 of row t as lanes (those outside `lanes` 0, not read): the same values as scale / offset.
  __m512 scales(int64_t t, int64_t g, __mmask16 lanes) const {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, w.scale + 2 * (first_group[t] + g)));
  }
  __m512 offsets(int64_t t, int64_t g, __mmask16 lanes, __m512 scales) const {
    if constexpr (E == Encoding::INT4_AFFINE)
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, w.offset + 2 * (first_group[t] + g)));
    const __m512 zero = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, w.zero + first_group[t] + g)));
    return _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(zero, scales));  // -(zero * scale), as offset() gives
  }
#endif
};

// The same tile over one chunk of columns, unpacked once and then read for every input row of a batch. Pairs: the
// codes in the AVX-512 form's order (RoundedRows with pairs), else the single-block order.
template <bool Pairs>
struct TileUnpacked {
  alignas(64) int16_t code_values[kTileRows][kChunkCols];
  float scale_values[kTileRows][kChunkCols / kBlock], offset_values[kTileRows][kChunkCols / kBlock];
  int64_t c0 = 0, g0 = 0;

  template <class Tile>
  void fill(const Tile& tile, int64_t chunk_begin, int64_t n, int64_t group) {
    c0 = chunk_begin;
    g0 = chunk_begin / group;
    for (int64_t t = 0; t < kTileRows; ++t) {
      int64_t c = 0;
#ifdef NINFER_LINEAR_INT16_AVX512
      if constexpr (Pairs) {
        for (; c + 2 * kBlock <= n; c += 2 * kBlock) {
          __m512i even, odd;
          tile.codes_pair(t, c0 + c, even, odd);
          _mm512_store_si512(code_values[t] + c, even);
          _mm512_store_si512(code_values[t] + c + kBlock, odd);
        }
      }
#endif
      for (; c < n; c += kBlock) {
        __m256i even, odd;
        tile.codes(t, c0 + c, even, odd);
        _mm256_store_si256(reinterpret_cast<__m256i*>(code_values[t] + c), even);
        _mm256_store_si256(reinterpret_cast<__m256i*>(code_values[t] + c + 16), odd);
      }
      for (int64_t g = 0; g < kChunkCols / kBlock; ++g) {  // 0 past the chunk's groups
        scale_values[t][g] = g < n / group ? tile.scale(t, g0 + g) : 0.0f;
        offset_values[t][g] = g < n / group ? tile.offset(t, g0 + g) : 0.0f;
      }
    }
  }
  void codes(int64_t t, int64_t c, __m256i& even, __m256i& odd) const {
    even = _mm256_load_si256(reinterpret_cast<const __m256i*>(code_values[t] + (c - c0)));
    odd = _mm256_load_si256(reinterpret_cast<const __m256i*>(code_values[t] + (c - c0) + 16));
  }
  float scale(int64_t t, int64_t g) const { return scale_values[t][g - g0]; }
  float offset(int64_t t, int64_t g) const { return offset_values[t][g - g0]; }
  void scales8(int64_t t, int64_t g, int64_t, __m256 out[2]) const {
    out[0] = _mm256_loadu_ps(scale_values[t] + (g - g0));
    out[1] = _mm256_loadu_ps(scale_values[t] + (g - g0) + 8);
  }
  void offsets8(int64_t t, int64_t g, int64_t, const __m256*, __m256 out[2]) const {
    out[0] = _mm256_loadu_ps(offset_values[t] + (g - g0));
    out[1] = _mm256_loadu_ps(offset_values[t] + (g - g0) + 8);
  }
#ifdef NINFER_LINEAR_INT16_AVX512
  void codes_pair(int64_t t, int64_t c, __m512i& even, __m512i& odd) const {
    even = _mm512_load_si512(code_values[t] + (c - c0));
    odd = _mm512_load_si512(code_values[t] + (c - c0) + kBlock);
  }
  __m512 scales(int64_t t, int64_t g, __mmask16 lanes) const {
    return _mm512_maskz_loadu_ps(lanes, scale_values[t] + (g - g0));
  }
  __m512 offsets(int64_t t, int64_t g, __mmask16 lanes, __m512) const {
    return _mm512_maskz_loadu_ps(lanes, offset_values[t] + (g - g0));
  }
#endif
};

// One input row against a tile over columns [c0, c0 + n) (whole groups): the kernel's only arithmetic, shared by
// the single-row and the batched path. Per chunk and weight row: `factor` holds block i's step x its group's scale
// (exact: a power of two times an f16), and the row's 8-lane accumulator starts with the chunk's group offsets
// times the groups' activation sums. Per block and weight row: each block's exact int32 products summed in 8
// lanes (each at most 4 products of 2^23), converted, times the block's factor, into the accumulator. acc[t] +=
// its lanes' sum.
template <class Tile>
inline void tile_chunk(const RoundedRow& x, const Tile& tile, int64_t c0, int64_t n, int64_t group, float* acc) {
  static_assert(kTileRows == 4, "written for 4 weight rows");
  const int64_t blocks = n / kBlock, groups = n / group, g0 = c0 / group;  // at most 16 of each
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // Lanes past the chunk's groups read the next row's (RoundedRows pads its arrays): masked out of the offsets.
  const __m256 in_group[2] = {
      _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(groups)), lane)),
      _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(groups) - 8), lane))};
  const float* steps = x.step + c0 / kBlock;
  const float* group_sums = x.group_sum + g0;
  // Block i's group, in lanes i and 8 + i: the first 8 groups hold every block's when group > 32.
  const __m256i shift = _mm256_set1_epi32(std::countr_zero(uint64_t(group / kBlock)));
  const __m256i group_of_block[2] = {_mm256_srlv_epi32(lane, shift),
                                     _mm256_srlv_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(8)), shift)};
  alignas(32) float factor[kTileRows][16];
  __m256 a[kTileRows];
  for (int64_t t = 0; t < kTileRows; ++t) {
    __m256 scales[2], offsets[2];
    tile.scales8(t, g0, groups, scales);
    tile.offsets8(t, g0, groups, scales, offsets);
    a[t] = _mm256_add_ps(_mm256_and_ps(in_group[0], _mm256_mul_ps(offsets[0], _mm256_loadu_ps(group_sums))),
                         _mm256_and_ps(in_group[1], _mm256_mul_ps(offsets[1], _mm256_loadu_ps(group_sums + 8))));
    for (int h = 0; h < 2; ++h) {
      const __m256 block_scales =
          group == kBlock ? scales[h] : _mm256_permutevar8x32_ps(scales[0], group_of_block[h]);
      _mm256_store_ps(factor[t] + 8 * h, _mm256_mul_ps(block_scales, _mm256_loadu_ps(steps + 8 * h)));
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + c0 + b * kBlock));
    const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + c0 + b * kBlock + 16));
    for (int64_t t = 0; t < kTileRows; ++t) {
      __m256i even, odd;
      tile.codes(t, c0 + b * kBlock, even, odd);
      const __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(xe, even), _mm256_madd_epi16(xo, odd));
      a[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_broadcast_ss(factor[t] + b), a[t]);
    }
  }
  _mm_storeu_ps(acc, _mm_add_ps(_mm_loadu_ps(acc), sum_lanes4(a[0], a[1], a[2], a[3])));
}

#ifdef NINFER_LINEAR_INT16_AVX512
// tile_chunk's AVX-512 form, on RoundedRows with pairs. Per chunk and weight row, the 16 lanes `factor` hold block
// i's step x its group's scale (exact: a power of two times an f16), and the row's 16-lane accumulator starts with
// the chunk's group offsets times the groups' activation sums. Per pair of blocks and weight row: `vpdpwssd` twice
// gives lanes 0-7 the first block's and lanes 8-15 the second's exact int32 products (each lane 4 products of at
// most 2^23), converted, times the blocks' factors, into the accumulator. acc[t] += its lanes' sum.
template <class Tile>
inline void tile_chunk_avx512(const RoundedRow& x, const Tile& tile, int64_t c0, int64_t n, int64_t group,
                              float* acc) {
  static_assert(kTileRows == 4, "written for 4 weight rows");
  const int64_t blocks = n / kBlock, g0 = c0 / group;  // n <= 512: at most 16 blocks, 16 groups
  const __mmask16 block_lanes = __mmask16((1u << blocks) - 1), group_lanes = __mmask16((1u << (n / group)) - 1);
  const __m512 steps = _mm512_maskz_loadu_ps(block_lanes, x.step + c0 / kBlock);
  const __m512 group_sums = _mm512_maskz_loadu_ps(group_lanes, x.group_sum + g0);
  // Lane i: the group of block i (group / 32 is a power of two: kChunkCols % group == 0).
  const __m512i group_of_block = _mm512_srlv_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                                     14, 15),
                                                   _mm512_set1_epi32(std::countr_zero(uint64_t(group / kBlock))));
  __m512 a[kTileRows], factor[kTileRows];
  for (int64_t t = 0; t < kTileRows; ++t) {
    const __m512 scales = tile.scales(t, g0, group_lanes);
    a[t] = _mm512_mul_ps(tile.offsets(t, g0, group_lanes, scales), group_sums);
    factor[t] = _mm512_mul_ps(_mm512_permutexvar_ps(group_of_block, scales), steps);
  }
  // Lanes 0-7: block b, 8-15: block b + 1, for the b of the loop.
  __m512i pair_blocks = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const int16_t* q = x.q + c0 + b * kBlock;
    const __m512i xe = _mm512_loadu_si512(q), xo = _mm512_loadu_si512(q + kBlock);
    for (int64_t t = 0; t < kTileRows; ++t) {
      __m512i even, odd;
      tile.codes_pair(t, c0 + b * kBlock, even, odd);
      const __m512i sums = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), xe, even), xo, odd);
      a[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_permutexvar_ps(pair_blocks, factor[t]), a[t]);
    }
    pair_blocks = _mm512_add_epi32(pair_blocks, _mm512_set1_epi32(2));
  }
  if (b < blocks) {  // a last block without a pair, in the single-block order, into lanes 0-7
    const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + c0 + b * kBlock));
    const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + c0 + b * kBlock + 16));
    const __m512i block = _mm512_set1_epi32(int(b));
    for (int64_t t = 0; t < kTileRows; ++t) {
      __m256i even, odd;
      tile.codes(t, c0 + b * kBlock, even, odd);
      const __m256i sums = _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(_mm256_setzero_si256(), xe, even), xo, odd);
      a[t] = _mm512_fmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(sums)),
                             _mm512_permutexvar_ps(block, factor[t]), a[t]);
    }
  }
  for (int64_t t = 0; t < kTileRows; ++t) acc[t] += _mm512_reduce_add_ps(a[t]);
}
#endif

// The form's tile_chunk: AVX-512 where built and asked for (Pairs), else AVX2.
template <bool Pairs, class Tile>
inline void tile_chunk_of(const RoundedRow& x, const Tile& tile, int64_t c0, int64_t n, int64_t group, float* acc) {
#ifdef NINFER_LINEAR_INT16_AVX512
  if constexpr (Pairs) return tile_chunk_avx512(x, tile, c0, n, group, acc);
#endif
  tile_chunk(x, tile, c0, n, group, acc);
}

// One input row against the tile of w's weight rows from o0, written to y[o0 ..] (+ bias): a decode step's unit of
// work, the same whether w is computed alone or beside the other weights of a linear_int16_shared call.
template <bool Pairs, Encoding E>
void row_tile(const RoundedRow& x, const TensorView& w, int64_t o0, float* y, const float* bias) {
  const TileInPlace<E> weights(w, o0);
  alignas(16) float acc[kTileRows] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t c0 = 0; c0 < w.cols(); c0 += kChunkCols)
    tile_chunk_of<Pairs>(x, weights, c0, std::min(kChunkCols, w.cols() - c0), w.group_size, acc);
  for (int64_t t = 0; t < std::min(kTileRows, w.rows() - o0); ++t)
    y[o0 + t] = acc[t] + (bias ? bias[o0 + t] : 0.0f);
}

template <bool Pairs>
void row_tile_any(const RoundedRow& x, const LinearOut& o, int64_t o0) {
  switch (o.w->encoding) {
    case Encoding::INT4: return row_tile<Pairs, Encoding::INT4>(x, *o.w, o0, o.y, o.bias);
    case Encoding::INT8: return row_tile<Pairs, Encoding::INT8>(x, *o.w, o0, o.y, o.bias);
    default: return row_tile<Pairs, Encoding::INT4_AFFINE>(x, *o.w, o0, o.y, o.bias);  // checked by the caller
  }
}

// A decode step: the tiles of every weight in `outs` as one loop, so that they cost one fork and join (on a shared
// machine, waking the other threads is a visible share of a step: bench/NOTES-cpu.md, session 11). Small sets
// stay on the calling thread, as one small matrix does (kParallelMinWeights), now counted over all of them.
template <bool Pairs>
void decode_tiles(const RoundedRow& x, std::span<const LinearOut> outs) {
  static thread_local std::vector<int64_t> first_tile;  // outs[i]'s tiles are [first_tile[i], first_tile[i + 1])
  first_tile.assign(1, 0);
  int64_t weights = 0;
  for (const LinearOut& o : outs) {
    first_tile.push_back(first_tile.back() + (o.w->rows() + kTileRows - 1) / kTileRows);
    weights += o.w->rows() * o.w->cols();
  }
  // The calling thread's table, read through a pointer: inside the region first_tile would name each thread's own.
  const int64_t* first = first_tile.data();
  const int64_t tiles = first_tile.back();
#pragma omp parallel for schedule(dynamic, tile_chunk_size(tiles)) if (weights >= kParallelMinWeights)
  for (int64_t tile = 0; tile < tiles; ++tile) {
    size_t i = 0;
    while (tile >= first[i + 1]) ++i;
    row_tile_any<Pairs>(x, outs[i], (tile - first[i]) * kTileRows);
  }
}

template <bool Pairs, Encoding E>
void batch_typed(const RoundedRows& rounded, int64_t rows, const TensorView& w, float* y, const float* bias) {
  const int64_t out = w.rows(), cols = w.cols(), group = w.group_size;
  struct Scratch {
    TileUnpacked<Pairs> unpacked;
    alignas(16) float acc[kMaxRowBlock * kTileRows];
  };
  const int64_t chunk = tile_chunk_size((out + kTileRows - 1) / kTileRows);
  for_each_tile_of_row_blocks<Scratch>(rows, cols, out, chunk, [&](Scratch& s, int64_t r0, int64_t block_rows,
                                                                    int64_t o0) {
    const TileInPlace<E> weights(w, o0);
    std::fill(s.acc, s.acc + block_rows * kTileRows, 0.0f);
    for (int64_t c0 = 0; c0 < cols; c0 += kChunkCols) {
      const int64_t n = std::min(kChunkCols, cols - c0);
      s.unpacked.fill(weights, c0, n, group);
      for (int64_t r = 0; r < block_rows; ++r)
        tile_chunk_of<Pairs>(row_of(rounded, r0 + r), s.unpacked, c0, n, group, s.acc + r * kTileRows);
    }
    for (int64_t r = 0; r < block_rows; ++r)
      for (int64_t t = 0; t < std::min(kTileRows, out - o0); ++t)
        y[(r0 + r) * out + o0 + t] = s.acc[r * kTileRows + t] + (bias ? bias[o0 + t] : 0.0f);
  });
}

// Several input rows (a prefill chunk, a decode batch): each weight in its own pass over its tiles, each weight
// tile unpacked once per block of rows, all reading the one rounding of x.
template <bool Pairs>
void batch(const RoundedRows& rounded, int64_t rows, const LinearOut& o) {
  switch (o.w->encoding) {
    case Encoding::INT4: return batch_typed<Pairs, Encoding::INT4>(rounded, rows, *o.w, o.y, o.bias);
    case Encoding::INT8: return batch_typed<Pairs, Encoding::INT8>(rounded, rows, *o.w, o.y, o.bias);
    default: return batch_typed<Pairs, Encoding::INT4_AFFINE>(rounded, rows, *o.w, o.y, o.bias);
  }
}

// One form's call: x rounded in its order, then the decode step's tiles or each weight's batched pass.
template <bool Pairs>
void run_form(const float* x, int64_t rows, std::span<const LinearOut> outs, int64_t cols, int64_t group) {
  // The calling thread's buffer, kept between calls: a decode step's calls then allocate nothing.
  static thread_local RoundedRows rounded;
  round_rows(x, rows, cols, group, Pairs, rounded);
  if (rows == 1) {
    decode_tiles<Pairs>(row_of(rounded, 0), outs);
    return;
  }
  for (const LinearOut& o : outs) batch<Pairs>(rounded, rows, o);
}

}  // namespace

bool linear_int16_applies(const TensorView& w) {
  const bool grouped = w.encoding == Encoding::INT4 || w.encoding == Encoding::INT8 ||
                       w.encoding == Encoding::INT4_AFFINE;
  return grouped && w.group_size >= kBlock && w.group_size % kBlock == 0 && kChunkCols % w.group_size == 0;
}

bool linear_int16_avx512_built() {
#ifdef NINFER_LINEAR_INT16_AVX512
  return true;
#else
  return false;
#endif
}

void linear_int16(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias, Int16Form form) {
  const LinearOut one{&w, y, bias};
  linear_int16_shared(x, rows, {&one, 1}, form);
}

void linear_int16_shared(const float* x, int64_t rows, std::span<const LinearOut> outs, Int16Form form) {
  if (outs.empty()) return;
  const int64_t cols = outs[0].w->cols(), group = outs[0].w->group_size;
  for (const LinearOut& o : outs)
    if (o.w->shape.size() != 2 || !linear_int16_applies(*o.w) || o.w->cols() != cols || o.w->group_size != group)
      throw EngineError("linear_int16: " + o.w->name + " is not a 2-D int4, int8 or int4_affine matrix of " +
                        std::to_string(cols) + " columns in groups of " + std::to_string(group) +
                        " like the call's first weight");
#ifdef NINFER_LINEAR_INT16_AVX512
  if (form == Int16Form::Widest) return run_form<true>(x, rows, outs, cols, group);
#endif
  run_form<false>(x, rows, outs, cols, group);
}

#else

bool linear_int16_applies(const TensorView&) { return false; }

bool linear_int16_avx512_built() { return false; }

void linear_int16(const float*, int64_t, const TensorView&, float*, const float*, Int16Form) {
  throw EngineError("linear_int16: not built for this CPU (needs AVX2, F16C and FMA)");
}

void linear_int16_shared(const float*, int64_t, std::span<const LinearOut>, Int16Form) {
  throw EngineError("linear_int16: not built for this CPU (needs AVX2, F16C and FMA)");
}

#endif

}  // namespace ninfer::cpu
