// Paged causal attention of the CPU backend: KV writes into 64-token pages and GQA softmax attention over them.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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
  // One head row at a time: a quantized row's scale (and nvfp4's block scales) cover exactly that (token, head).
  auto store_side = [&](auto codec, const float* src, void* rows, float* scales, uint8_t* blocks, int64_t off) {
    using Codec = decltype(codec);
    using E = typename Codec::Element;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t first = off * width + h * d;  // the row's first value within the page
      const float scale = Codec::store_row(src + h * d, d, static_cast<E*>(rows) + first / Codec::kValuesPerElement,
                                           Codec::kBlockScaled ? blocks + first / kKvFp4Block : nullptr);
      if constexpr (Codec::kScaled) scales[off * heads + h] = scale;
    }
  };
  dispatch_kv_format(pool.dtype(), [&](auto key_codec, auto value_codec) {
    for (const SequenceRows& s : seqs)
      for (int64_t t = 0; t < s.n; ++t) {
        const int64_t pos = s.start + t, off = pos % kKvPageTokens;
        const int32_t page = s.pages[pos / kKvPageTokens];
        store_side(key_codec, k + (s.row0 + t) * width, pool.k_rows(page, layer), pool.k_scales(page, layer),
                   pool.k_blocks(page, layer), off);
        store_side(value_codec, v + (s.row0 + t) * width, pool.v_rows(page, layer), pool.v_scales(page, layer),
                   pool.v_blocks(page, layer), off);
      }
  });
}

namespace {

// One (token, head) row of one side (K or V) as the kernels read it: codes, nvfp4's block scales (nullptr for
// the other codecs) and the row scale (1 for the unscaled codecs).
template <class Codec>
struct SideRow {
  const typename Codec::Element* codes;
  const uint8_t* blocks;
  float scale;
};

// Row `offset` (0..63) of a page side for `kv_head`; `rows`, `scales` and `blocks` are the pool's pointers for
// that page, layer and side.
template <class Codec>
SideRow<Codec> side_row(const void* rows, const float* scales, const uint8_t* blocks, int64_t offset,
                        int32_t kv_head, const KvPool& pool, int64_t d) {
  const int64_t first = offset * pool.row_elements() + kv_head * d;
  SideRow<Codec> r{static_cast<const typename Codec::Element*>(rows) + first / Codec::kValuesPerElement, nullptr,
                   1.0f};
  if constexpr (Codec::kBlockScaled) r.blocks = blocks + first / kKvFp4Block;
  if constexpr (Codec::kScaled) r.scale = scales[offset * pool.kv_heads() + kv_head];
  return r;
}

template <class Codec>
SideRow<Codec> key_row(const KvPool& pool, int32_t page, int32_t layer, int64_t offset, int32_t kv_head, int64_t d) {
  return side_row<Codec>(pool.k_rows(page, layer), pool.k_scales(page, layer), pool.k_blocks(page, layer), offset,
                         kv_head, pool, d);
}
template <class Codec>
SideRow<Codec> value_row(const KvPool& pool, int32_t page, int32_t layer, int64_t offset, int32_t kv_head,
                         int64_t d) {
  return side_row<Codec>(pool.v_rows(page, layer), pool.v_scales(page, layer), pool.v_blocks(page, layer), offset,
                         kv_head, pool, d);
}

// sum(q[i] * load(row, i)) in 8 interleaved partial sums (lane l takes i = l mod 8), which the compiler
// vectorises without reassociating anything; the few columns past a multiple of 8 go to lane 0 afterwards.
template <class Codec>
float dot_row(const float* q, const SideRow<Codec>& row, int64_t d) {
  constexpr int64_t kLanes = 8;
  float part[kLanes] = {};
  const int64_t whole = d - d % kLanes;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) part[l] += q[i + l] * Codec::load(row.codes, row.blocks, i + l);
  for (int64_t i = whole; i < d; ++i) part[0] += q[i] * Codec::load(row.codes, row.blocks, i);
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += part[l];
  return sum;
}

// One query head of one row against positions 0 .. last of its sequence; `scores` holds last + 1 floats.
// A stored value is scale * load(row, i), so the row's scale multiplies the dot product (keys) and the weight
// (values).
template <class KC, class VC>
void attend_one(const float* q, const SequenceRows& s, int64_t last, int32_t kv_head, const KvPool& pool,
                int32_t layer, const AttentionShape& shape, float* scores, float* out) {
  const int64_t d = shape.head_dim;
  float max_score = -INFINITY;
  for (int64_t j = 0; j <= last; ++j) {
    const auto kr = key_row<KC>(pool, s.pages[j / kKvPageTokens], layer, j % kKvPageTokens, kv_head, d);
    scores[j] = dot_row<KC>(q, kr, d) * kr.scale * shape.scale;
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
    const auto vr = value_row<VC>(pool, s.pages[j / kKvPageTokens], layer, j % kKvPageTokens, kv_head, d);
    const float p = scores[j] * inv * vr.scale;
    for (int64_t i = 0; i < d; ++i) out[i] += p * VC::load(vr.codes, vr.blocks, i);
  }
}

#ifdef NINFER_ATTENTION_AVX2

// Codec::load of the 8 consecutive values i .. i + 7 of a row (i a multiple of 8), as one vector (the same
// values: each conversion is exact, and nvfp4's product of two short significands is too).
template <class Codec>
__m256 load8(const SideRow<Codec>& row, int64_t i) {
  const auto* p = row.codes + i / Codec::kValuesPerElement;
  if constexpr (std::is_same_v<Codec, KvCodecF32>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<Codec, KvCodecBF16>) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  } else if constexpr (std::is_same_v<Codec, KvCodecINT8>) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else if constexpr (std::is_same_v<Codec, KvCodecNVFP4>) {
    // Eight codes in one 32-bit word, value k in bits 4k .. 4k + 3: the magnitude by a permute of the 8 e2m1
    // magnitudes (it reads the low 3 bits of each index), the sign bit (bit 3) moved to bit 31. All 8 values
    // are in one block of 16, so one block scale.
    uint32_t word;
    std::memcpy(&word, p, sizeof(word));
    const __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(word)),
                                                             _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                           _mm256_set1_epi32(0xf));
    const __m256 magnitudes = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256 m = _mm256_permutevar8x32_ps(magnitudes, codes);
    const __m256 signed_m = _mm256_xor_ps(m, _mm256_castsi256_ps(_mm256_slli_epi32(
                                                 _mm256_and_si256(codes, _mm256_set1_epi32(8)), 28)));
    return _mm256_mul_ps(signed_m, _mm256_set1_ps(e4m3_to_f32(row.blocks[i / kKvFp4Block])));
  } else {
    static_assert(std::is_same_v<Codec, KvCodecFP8>);
    return _mm256_mul_ps(simd::e4m3x8_over_256(p), _mm256_set1_ps(256.0f));
  }
}

// attend_one's computation vectorised (head_dim a multiple of 8): the keys four positions at a time (one
// horizontal sum for four scores), the softmax exponentials 8 at a time.
// `scores` holds last + 1 floats rounded up to a multiple of 8.
template <class KC, class VC>
void attend_one_avx2(const float* q, const SequenceRows& s, int64_t last, int32_t kv_head, const KvPool& pool,
                     int32_t layer, const AttentionShape& shape, float* scores, float* out) {
  const int64_t d = shape.head_dim, count = last + 1;
  auto dot = [&](const SideRow<KC>& kr) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8<KC>(kr, i), acc);
    return acc;
  };
  for (int64_t j0 = 0; j0 < count; j0 += kKvPageTokens) {
    const int32_t page = s.pages[j0 / kKvPageTokens];
    const int64_t n = std::min(kKvPageTokens, count - j0);
    auto row = [&](int64_t t) { return key_row<KC>(pool, page, layer, t, kv_head, d); };
    int64_t t = 0;
    for (; t + 4 <= n; t += 4)
      _mm_storeu_ps(scores + j0 + t, sum_lanes4(dot(row(t)), dot(row(t + 1)), dot(row(t + 2)), dot(row(t + 3))));
    for (; t < n; ++t) {
      const __m256 zero = _mm256_setzero_ps();
      scores[j0 + t] = _mm_cvtss_f32(sum_lanes4(dot(row(t)), zero, zero, zero));
    }
    for (t = 0; t < n; ++t) scores[j0 + t] = scores[j0 + t] * row(t).scale * shape.scale;
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
  for (int64_t j = 0; j < count; ++j) {
    const auto vr = value_row<VC>(pool, s.pages[j / kKvPageTokens], layer, j % kKvPageTokens, kv_head, d);
    const __m256 p = _mm256_set1_ps(scores[j] * inv * vr.scale);
    for (int64_t i = 0; i < d; i += 8)
      _mm256_storeu_ps(out + i, _mm256_fmadd_ps(p, load8<VC>(vr, i), _mm256_loadu_ps(out + i)));
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

  dispatch_kv_format(pool.dtype(), [&](auto key_codec, auto value_codec) {
    using KC = decltype(key_codec);
    using VC = decltype(value_codec);
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
        attend_one_avx2<KC, VC>(qh, s, last, h / group, pool, layer, shape, scores, oh);
        continue;
      }
#endif
      attend_one<KC, VC>(qh, s, last, h / group, pool, layer, shape, scores, oh);
    }
  });
}

}  // namespace ninfer::cpu
