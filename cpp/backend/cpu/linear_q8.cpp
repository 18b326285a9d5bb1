#include "backend/cpu/linear_q8.h"

#include <algorithm>
#include <cstring>

#include "errors.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define NINFER_LINEAR_Q8 1
#include <immintrin.h>
#include <omp.h>
#endif

namespace ninfer::cpu {

#ifdef NINFER_LINEAR_Q8

namespace {

constexpr int64_t kTileRows = 8;                     // weight rows per unit of parallel work
constexpr int64_t kParallelMinWork = 400 * 1024;     // weights x input rows below this stay on the calling thread

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

// One 32-column block: d = max|x| / 127, q = x / d rounded to nearest even (the MXCSR default), stored in `order`.
void quantize_block(const float* x, Q8Order order, int8_t* q, float& d, float& dsum) {
  const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16),
               v3 = _mm256_loadu_ps(x + 24);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  d = amax / 127.0f;
  const __m256 inv = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv)),
                i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, inv));
  dsum = d * float(hsum(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3))));
  // The packs work per 128-bit lane: dwords come out as i0[0:4] i1[0:4] i2[0:4] i3[0:4] | i0[4:8] ... i3[4:8].
  __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // column order
  if (order == Q8Order::NibbleHalves) {
    // Per 16-column lane: its 8 even columns, then its 8 odd ones; then the two lanes' evens, then their odds.
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    bytes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bytes, split), 0xd8);  // qwords 0, 2, 1, 3
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
}

// Integer dot products of 32 u8 codes with 32 s8 values: 8 i32 lanes, each the exact sum of 4 products.
template <bool Nibbles>  // codes < 16 (int4): maddubs cannot saturate
__m256i dot_u8s8(__m256i codes, __m256i q) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, q);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), codes, q);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (Nibbles) return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, q), ones);
  // A full byte code: c q = 16 (c >> 4) q + (c & 15) q, each half a nibble product (no i16 saturation).
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(codes, mask), q), ones);
  const __m256i hi = _mm256_madd_epi16(
      _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(codes, 4), mask), q), ones);
  return _mm256_add_epi32(lo, _mm256_slli_epi32(hi, 4));
#endif
}

// A weight row's codes, block by block, in its Q8Order, and its per-block float terms.
template <Encoding E>
struct WeightRow {
  static constexpr bool kInt8 = E == Encoding::INT8;
  const uint8_t* codes;
  const uint8_t* scales;   // f16 per group
  const uint8_t* zeros;    // u8 per group (int4, int8)
  const uint8_t* offsets;  // f16 per group (int4_affine)
  int64_t blocks_per_group;

  WeightRow(const TensorView& w, int64_t row) {
    const int64_t cols = w.cols(), groups = cols / w.group_size;
    codes = w.data + row * (kInt8 ? cols : cols / 2);
    scales = w.scale + 2 * row * groups;
    zeros = E == Encoding::INT4_AFFINE ? nullptr : w.zero + row * groups;
    offsets = E == Encoding::INT4_AFFINE ? w.offset + 2 * row * groups : nullptr;
    blocks_per_group = w.group_size / kQ8Block;
  }

  __m256i block(int64_t b) const {
    if constexpr (kInt8) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + kQ8Block * b));
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + kQ8Block / 2 * b));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), _mm256_set1_epi8(0x0f));
  }

  // For blocks b .. b + n (n <= 8) of an input row with block scales d: the factor of each block's integer sum,
  // s_g d_b, and the coefficient of its d_b sum(q): m_g (affine) or -s_g z_g (s_g z_g is exact in f32).
  void terms(int64_t b, int64_t n, const float* d, float* factor, float* coef) const {
    if (blocks_per_group == 1 && n == 8) {
      const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 2 * b)));
      _mm256_store_ps(factor, _mm256_mul_ps(s, _mm256_loadu_ps(d + b)));
      if constexpr (E == Encoding::INT4_AFFINE) {
        _mm256_store_ps(coef, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(offsets + 2 * b))));
      } else {
        const __m256 z = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
            reinterpret_cast<const __m128i*>(zeros + b))));
        _mm256_store_ps(coef, _mm256_xor_ps(_mm256_mul_ps(s, z), _mm256_set1_ps(-0.0f)));
      }
      return;
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t g = (b + j) / blocks_per_group;
      uint16_t bits;
      std::memcpy(&bits, scales + 2 * g, 2);
      const float s = _cvtsh_ss(bits);
      factor[j] = s * d[b + j];
      if constexpr (E == Encoding::INT4_AFFINE) {
        std::memcpy(&bits, offsets + 2 * g, 2);
        coef[j] = _cvtsh_ss(bits);
      } else {
        coef[j] = -(s * float(zeros[g]));
      }
    }
  }
};

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define NINFER_LINEAR_Q8_512 1
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() (a self-initialised variable) as the unused merge source,
// which -Wmaybe-uninitialized reports wherever they are inlined; the values are never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Two blocks (b, b + 1) of a weight row's codes in one 512-bit register, in the activations' order, and their integer
// dot products with the two blocks of q: 16 i32 lanes, the first 8 block b's, the last 8 block b + 1's.
template <Encoding E>
__m512i pair_dot(const WeightRow<E>& w, int64_t b, const int8_t* q) {
  __m512i codes;
  if constexpr (WeightRow<E>::kInt8) {
    codes = _mm512_loadu_si512(w.codes + kQ8Block * b);
  } else {
    // The 32 code bytes of both blocks as qwords B0 B0 B1 B1 (each block twice), the second copy shifted to its high
    // nibbles: block b's low nibbles, its high ones, then block b + 1's, as WeightRow::block lays out one block.
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.codes + kQ8Block / 2 * b));
    const __m512i twice = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                                   _mm512_zextsi256_si512(bytes));
    codes = _mm512_and_si512(_mm512_srlv_epi64(twice, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                             _mm512_set1_epi8(0x0f));
  }
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512(q + kQ8Block * b));
}
#endif

// <weight row, x̂ row>: per block, factor * float(integer sum) into 8-lane accumulators (16-lane ones for block pairs
// where AVX-512 VNNI is built) and coef * dsum into another; blocks in column order, so the result is fixed by the
// two rows alone (which of the paths a block takes depends only on the width of the rows).
template <Encoding E>
float row_dot(const WeightRow<E>& w, const int8_t* q, const float* d, const float* dsum, int64_t blocks) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, corr = acc0;
  float tail = 0.0f;
  alignas(32) float factor[8], coef[8];
#ifdef NINFER_LINEAR_Q8_512
  __m512 wide = _mm512_setzero_ps();
#endif
  for (int64_t b = 0; b < blocks; b += 8) {
    const int64_t n = std::min<int64_t>(8, blocks - b);
    w.terms(b, n, d, factor, coef);
    int64_t j = 0;
#ifdef NINFER_LINEAR_Q8_512
    const __m512 factors = _mm512_zextps256_ps512(_mm256_load_ps(factor));
    for (; j + 2 <= n; j += 2) {
      // factor[j] in the low 8 lanes, factor[j + 1] in the high 8.
      const __m512i lanes = _mm512_add_epi32(_mm512_set1_epi32(int32_t(j)),
                                             _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
      wide = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair_dot(w, b + j, q)), _mm512_permutexvar_ps(lanes, factors), wide);
    }
#endif
    for (; j < n; ++j) {
      const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + kQ8Block * (b + j)));
      const __m256 sums = _mm256_cvtepi32_ps(dot_u8s8<!WeightRow<E>::kInt8>(w.block(b + j), qb));
      if (j & 1) acc1 = _mm256_fmadd_ps(sums, _mm256_broadcast_ss(factor + j), acc1);
      else acc0 = _mm256_fmadd_ps(sums, _mm256_broadcast_ss(factor + j), acc0);
    }
    if (n == 8) corr = _mm256_fmadd_ps(_mm256_load_ps(coef), _mm256_loadu_ps(dsum + b), corr);
    else
      for (int64_t k = 0; k < n; ++k) tail += coef[k] * dsum[b + k];
  }
#ifdef NINFER_LINEAR_Q8_512
  acc0 = _mm256_add_ps(acc0, _mm256_add_ps(_mm512_castps512_ps256(wide), _mm512_extractf32x8_ps(wide, 1)));
#endif
  return hsum(_mm256_add_ps(acc0, acc1)) + (hsum(corr) + tail);
}

template <Encoding E>
void tile(const Q8Rows& x, const LinearOut& out, int64_t o0, int64_t o1) {
  const TensorView& w = *out.w;
  const int64_t blocks = x.cols / kQ8Block, n_out = w.rows();
  for (int64_t o = o0; o < o1; ++o) {
    const WeightRow<E> row(w, o);
    const float bias = out.bias ? out.bias[o] : 0.0f;
    for (int64_t r = 0; r < x.rows; ++r)
      out.y[r * n_out + o] = row_dot(row, x.q.data() + r * x.cols, x.scale.data() + r * blocks,
                                     x.dsum.data() + r * blocks, blocks) + bias;
  }
}

}  // namespace

bool linear_q8_applies(const TensorView& w) {
  return (w.encoding == Encoding::INT4 || w.encoding == Encoding::INT4_AFFINE || w.encoding == Encoding::INT8) &&
         w.group_size >= kQ8Block && w.group_size % kQ8Block == 0 && w.cols() % w.group_size == 0;
}

void quantize_rows_q8(const float* x, int64_t rows, int64_t cols, Q8Order order, Q8Rows& out) {
  if (cols % kQ8Block != 0) throw EngineError("quantize_rows_q8: columns must be a multiple of 32");
  const int64_t blocks = rows * cols / kQ8Block;
  out.rows = rows;
  out.cols = cols;
  out.order = order;
  if (int64_t(out.q.size()) < rows * cols) out.q.resize(size_t(rows * cols));
  if (int64_t(out.scale.size()) < blocks) {
    out.scale.resize(size_t(blocks));
    out.dsum.resize(size_t(blocks));
  }
#pragma omp parallel for schedule(static) if (blocks >= 4096)
  for (int64_t b = 0; b < blocks; ++b)
    quantize_block(x + kQ8Block * b, order, out.q.data() + kQ8Block * b, out.scale[size_t(b)], out.dsum[size_t(b)]);
}

void linear_q8(const Q8Rows& x, std::span<const LinearOut> outs) {
  // Tiles of every output, numbered one after the other: first_tile[i] is output i's first.
  int64_t first_tile[16], tiles = 0, work = 0;
  if (outs.size() > 16) throw EngineError("linear_q8: at most 16 weights share an input");
  for (size_t i = 0; i < outs.size(); ++i) {
    const TensorView& w = *outs[i].w;
    if (!linear_q8_applies(w) || w.cols() != x.cols || q8_order(w) != x.order)
      throw EngineError("linear_q8: weight " + w.name + " does not take these activations");
    first_tile[i] = tiles;
    tiles += (w.rows() + kTileRows - 1) / kTileRows;
    work += w.rows() * w.cols() * x.rows;
  }
  // Dynamic chunks of a few tiles: on a busy machine a descheduled thread then delays the call by one chunk.
  const int64_t chunk = std::max<int64_t>(1, tiles / (8 * omp_get_max_threads()));
#pragma omp parallel for schedule(dynamic, chunk) if (work >= kParallelMinWork)
  for (int64_t t = 0; t < tiles; ++t) {
    size_t i = outs.size() - 1;
    while (first_tile[i] > t) --i;
    const LinearOut& out = outs[i];
    const int64_t o0 = (t - first_tile[i]) * kTileRows, o1 = std::min(o0 + kTileRows, out.w->rows());
    switch (out.w->encoding) {
      case Encoding::INT4: tile<Encoding::INT4>(x, out, o0, o1); break;
      case Encoding::INT4_AFFINE: tile<Encoding::INT4_AFFINE>(x, out, o0, o1); break;
      default: tile<Encoding::INT8>(x, out, o0, o1); break;
    }
  }
}

#else

bool linear_q8_applies(const TensorView&) { return false; }

void quantize_rows_q8(const float*, int64_t, int64_t, Q8Order, Q8Rows&) {
  throw EngineError("quantize_rows_q8: not built for this CPU (needs AVX2, F16C and FMA)");
}

void linear_q8(const Q8Rows&, std::span<const LinearOut>) {
  throw EngineError("linear_q8: not built for this CPU (needs AVX2, F16C and FMA)");
}

#endif

Q8Order q8_order(const TensorView& w) {
  return w.encoding == Encoding::INT8 ? Q8Order::Columns : Q8Order::NibbleHalves;
}

}  // namespace ninfer::cpu
