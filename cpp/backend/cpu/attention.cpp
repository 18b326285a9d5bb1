// Paged causal attention of the CPU backend: KV writes into 64-token pages and GQA softmax attention over them.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "runtime/kv_codec.h"
#include "runtime/kv_pool.h"

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
  if (attn_scores_.size() < size_t(threads * longest)) attn_scores_.resize(size_t(threads * longest));
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t work = rows * shape.num_heads;

  dispatch_kv_dtype(pool.dtype(), [&](auto codec) {
    using Codec = decltype(codec);
#pragma omp parallel for schedule(dynamic) if (work > 1)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t r = w / shape.num_heads;
      const int32_t h = int32_t(w % shape.num_heads);
      const int32_t si = attn_row_seq_[size_t(r)];
      if (si < 0) continue;
      const SequenceRows& s = seqs[size_t(si)];
      float* scores = attn_scores_.data() + int64_t(omp_get_thread_num()) * longest;
      attend_one<Codec>(q + r * q_row_stride + h * q_head_stride, s, s.start + (r - s.row0), h / group, pool, layer,
                        shape, scores, out + (r * shape.num_heads + h) * shape.head_dim);
    }
  });
}

}  // namespace ninfer::cpu
