// Paged causal attention of the CPU backend: KV writes into 64-token pages and GQA softmax attention over them.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include <type_traits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/linear_decode.h"
#include "cache/kv_codec.h"
#include "cache/kv_pool.h"

#if defined(NINFER_DECODE_AVX2) && defined(__FMA__)
#define NINFER_ATTENTION_AVX2 1
#include "backend/cpu/linear_simd.h"
#include "backend/cpu/linear_tiling.h"
#include "backend/cpu/simd_exp.h"
#endif

namespace ninfer::cpu {

void CpuBackend::kv_write(const float* k, const float* v, std::span<const SequenceRows> seqs, KvPool& pool,
                          int32_t layer) {
  const int64_t width = pool.row_elements(), heads = pool.kv_heads(), d = width / heads;
  dispatch_kv_dtype(pool.dtype(), [&](auto codec) {
    using Codec = decltype(codec);
    using E = typename Codec::Element;
    // One head row at a time: an 8-bit row's scale covers exactly that (token, head).
    auto store = [&](const float* src, E* rows, float* scales, int64_t off) {
      for (int64_t h = 0; h < heads; ++h) {
        const float scale = Codec::store_row(src + h * d, d, rows + off * width + h * d);
        if constexpr (Codec::kScaled) scales[off * heads + h] = scale;
      }
    };
    for (const SequenceRows& s : seqs)
      for (int64_t t = 0; t < s.n; ++t) {
        const int64_t pos = s.start + t, off = pos % kKvPageTokens;
        const int32_t page = s.pages[pos / kKvPageTokens];
        store(k + (s.row0 + t) * width, static_cast<E*>(pool.k_rows(page, layer)), pool.k_scales(page, layer), off);
        store(v + (s.row0 + t) * width, static_cast<E*>(pool.v_rows(page, layer)), pool.v_scales(page, layer), off);
      }
  });
}

namespace {

// sum(q[i] * load(row[i])) in 8 interleaved partial sums (lane l takes i = l mod 8), which the compiler
// vectorises without reassociating anything; the few columns past a multiple of 8 go to lane 0 afterwards.
template <class Codec>
float dot_row(const float* q, const typename Codec::Element* row, int64_t d) {
  constexpr int64_t kLanes = 8;
  float part[kLanes] = {};
  const int64_t whole = d - d % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) part[l] += q[i + l] * Codec::load(row[i + l]);
  for (int64_t i = whole; i < d; ++i) part[0] += q[i] * Codec::load(row[i]);
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += part[l];
  return sum;
}

// The scale of row `j`'s head `kv_head` (1 for the unscaled dtypes).
template <class Codec>
float row_scale(const float* scales, int64_t j, int32_t kv_head, int32_t kv_heads) {
  if constexpr (Codec::kScaled) return scales[(j % kKvPageTokens) * kv_heads + kv_head];
  else return 1.0f;
}

// One query head of one row against positions 0 .. last of its sequence; `scores` holds last + 1 floats.
// A stored value is scale * load(code), so the row's scale multiplies the dot product (keys) and the weight (values).
template <class Codec>
void attend_one(const float* q, const SequenceRows& s, int64_t last, int32_t kv_head, const KvPool& pool,
                int32_t layer, const AttentionShape& shape, float* scores, float* out) {
  using E = typename Codec::Element;
  const int64_t width = pool.row_elements(), d = shape.head_dim;
  const int32_t kv_heads = pool.kv_heads();
  float max_score = -INFINITY;
  for (int64_t j = 0; j <= last; ++j) {
    const int32_t page = s.pages[j / kKvPageTokens];
    const E* kr = static_cast<const E*>(pool.k_rows(page, layer)) + (j % kKvPageTokens) * width + kv_head * d;
    scores[j] = dot_row<Codec>(q, kr, d) * row_scale<Codec>(pool.k_scales(page, layer), j, kv_head, kv_heads) * shape.scale;
    max_score = std::max(max_score, scores[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j <= last; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  std::fill_n(out, d, 0.0f);
  for (int64_t j = 0; j <= last; ++j) {
    const int32_t page = s.pages[j / kKvPageTokens];
    const E* vr = static_cast<const E*>(pool.v_rows(page, layer)) + (j % kKvPageTokens) * width + kv_head * d;
    const float p = scores[j] * inv * row_scale<Codec>(pool.v_scales(page, layer), j, kv_head, kv_heads);
    for (int64_t i = 0; i < d; ++i) out[i] += p * Codec::load(vr[i]);
  }
}

#ifdef NINFER_ATTENTION_AVX2

// Codec::load of 8 consecutive elements, as one vector (the same values: each conversion is exact).
template <class Codec>
__m256 load8(const typename Codec::Element* p) {
  if constexpr (std::is_same_v<Codec, KvCodecF32>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<Codec, KvCodecBF16>) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  } else if constexpr (std::is_same_v<Codec, KvCodecINT8>) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else {
    static_assert(std::is_same_v<Codec, KvCodecFP8>);
    return _mm256_mul_ps(simd::e4m3x8_over_256(p), _mm256_set1_ps(256.0f));
  }
}

// attend_one's computation vectorised (head_dim a multiple of 8): the page pointers are looked up once per page,
// the keys four positions at a time (one horizontal sum for four scores), the softmax exponentials 8 at a time.
// `scores` holds last + 1 floats rounded up to a multiple of 8.
template <class Codec>
void attend_one_avx2(const float* q, const SequenceRows& s, int64_t last, int32_t kv_head, const KvPool& pool,
                     int32_t layer, const AttentionShape& shape, float* scores, float* out) {
  using E = typename Codec::Element;
  const int64_t width = pool.row_elements(), d = shape.head_dim, count = last + 1;
  const int32_t kv_heads = pool.kv_heads();
  auto dot = [&](const E* kr) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8<Codec>(kr + i), acc);
    return acc;
  };
  for (int64_t j0 = 0; j0 < count; j0 += kKvPageTokens) {
    const int32_t page = s.pages[j0 / kKvPageTokens];
    const E* rows = static_cast<const E*>(pool.k_rows(page, layer)) + kv_head * d;
    const float* row_scales = pool.k_scales(page, layer);
    const int64_t n = std::min(kKvPageTokens, count - j0);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
      const E* kr = rows + t * width;
      _mm_storeu_ps(scores + j0 + t, sum_lanes4(dot(kr), dot(kr + width), dot(kr + 2 * width), dot(kr + 3 * width)));
    }
    for (; t < n; ++t) {
      const __m256 zero = _mm256_setzero_ps();
      scores[j0 + t] = _mm_cvtss_f32(sum_lanes4(dot(rows + t * width), zero, zero, zero));
    }
    for (t = 0; t < n; ++t)
      scores[j0 + t] = scores[j0 + t] * row_scale<Codec>(row_scales, j0 + t, kv_head, kv_heads) * shape.scale;
  }
  const int64_t padded = (count + 7) & ~int64_t(7);
  std::fill(scores + count, scores + padded, -INFINITY);  // exp gives 0 there
  __m256 top = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < padded; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(scores + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  const float max_score = *std::max_element(lanes, lanes + 8);
  __m256 total = _mm256_setzero_ps();
  for (int64_t j = 0; j < padded; j += 8) {
    const __m256 e = simd::exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), _mm256_set1_ps(max_score)));
    _mm256_storeu_ps(scores + j, e);
    total = _mm256_add_ps(total, e);
  }
  const __m256 zero = _mm256_setzero_ps();
  const float inv = 1.0f / _mm_cvtss_f32(sum_lanes4(total, zero, zero, zero));
  std::fill_n(out, d, 0.0f);
  for (int64_t j0 = 0; j0 < count; j0 += kKvPageTokens) {
    const int32_t page = s.pages[j0 / kKvPageTokens];
    const E* rows = static_cast<const E*>(pool.v_rows(page, layer)) + kv_head * d;
    const float* row_scales = pool.v_scales(page, layer);
    const int64_t n = std::min(kKvPageTokens, count - j0);
    for (int64_t t = 0; t < n; ++t) {
      const __m256 p =
          _mm256_set1_ps(scores[j0 + t] * inv * row_scale<Codec>(row_scales, j0 + t, kv_head, kv_heads));
      const E* vr = rows + t * width;
      for (int64_t i = 0; i < d; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(p, load8<Codec>(vr + i), _mm256_loadu_ps(out + i)));
    }
  }
}

#endif  // NINFER_ATTENTION_AVX2

constexpr int64_t kParallelMinMacs = 1 << 20;

}  // namespace

void CpuBackend::attention(const float* q, int64_t q_row_stride, int64_t q_head_stride,
                           std::span<const SequenceRows> seqs, const KvPool& pool, int32_t layer,
                           const AttentionShape& shape, float* out) {
  int64_t rows = 0, longest = 0;
  for (const SequenceRows& s : seqs) {
    rows = std::max(rows, s.row0 + s.n);
    longest = std::max(longest, s.start + s.n);
  }
  attn_row_seq_.assign(size_t(rows), -1);
  for (size_t i = 0; i < seqs.size(); ++i)
    std::fill_n(attn_row_seq_.begin() + seqs[i].row0, seqs[i].n, int32_t(i));
  const int threads = omp_get_max_threads();
  longest = (longest + 7) & ~int64_t(7);  // the vector softmax pads a score row to a multiple of 8
  if (attn_scores_.size() < size_t(threads * longest)) attn_scores_.resize(size_t(threads * longest));
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t work = rows * shape.num_heads;

  // Spread over threads only when there is enough of it (a few hundred thousand multiply-adds): a decode step's
  // attention over a few hundred positions takes tens of microseconds, about what a fork and join cost.
  int64_t visits = 0;
  for (const SequenceRows& s : seqs) visits += s.n * (s.start + s.n);
  const bool parallel = work > 1 && visits * shape.num_heads * shape.head_dim >= kParallelMinMacs;

  dispatch_kv_dtype(pool.dtype(), [&](auto codec) {
    using Codec = decltype(codec);
#pragma omp parallel for schedule(dynamic) if (parallel)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t r = w / shape.num_heads;
      const int32_t h = int32_t(w % shape.num_heads);
      const int32_t si = attn_row_seq_[size_t(r)];
      if (si < 0) continue;
      const SequenceRows& s = seqs[size_t(si)];
      float* scores = attn_scores_.data() + int64_t(omp_get_thread_num()) * longest;
      const float* qh = q + r * q_row_stride + h * q_head_stride;
      float* oh = out + (r * shape.num_heads + h) * shape.head_dim;
      const int64_t last = s.start + (r - s.row0);
#ifdef NINFER_ATTENTION_AVX2
      if (shape.head_dim % 8 == 0) {
        attend_one_avx2<Codec>(qh, s, last, h / group, pool, layer, shape, scores, oh);
        continue;
      }
#endif
      attend_one<Codec>(qh, s, last, h / group, pool, layer, shape, scores, oh);
    }
  });
}

}  // namespace ninfer::cpu
