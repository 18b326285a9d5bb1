// Paged causal attention of the CUDA backend: KV writes into 64-token pages (every KV dtype, 8-bit rows with
// their per-(token, head) scale) and GQA softmax attention over them.
//
// Which kernel attends a call's rows:
//   - f32 KV, or a head_dim the fast kernels do not take: attention_kernel, the slow obviously-right twin (one
//     block per (row, query head), an online softmax over tiles of keys, f32 on CUDA cores);
//   - bf16 / fp8 / int8 / nvfp4 / k8v4 KV: sequences with at least kPrefillMinRows new rows go to the
//     tensor-core flash kernel (flash_prefill.cu), the others (decode: one new row; a few speculative rows) to
//     split-KV decode (flash_decode.cu), whose kernel count does not depend on the batch's contexts (CUDA-graph
//     replays).
#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_attention.h"
#include "backend/cuda/kv_device.cuh"
#include "cache/kv_pool.h"
#include "cache/kv_quant.h"

namespace ninfer::cuda {
namespace {

constexpr int kAttnThreads = 128;
constexpr int kMaxHeadDim = 4 * kAttnThreads;  // each thread owns up to 4 output dims
// A sequence with this many new rows is worth a 64-row tensor-core tile per GQA group; fewer rows attend on
// their own with split keys.
constexpr int64_t kPrefillMinRows = 8;

// One warp writes one (token, head) row of codec Kv at value `col` of token `offset`'s row of a page block:
// scaled codecs get scale = max|x| / code max first; nvfp4 rows follow kv_quantize_row_fp4 exactly (the same
// f32 operations, correctly rounded: __fdiv_rn is explicit so that no compiler flag changes a code), one lane
// per block of 16.
template <class Kv>
__device__ void write_row(const PagedRows& pr, const float* src, uint8_t* block, int64_t offset, int32_t head,
                          int32_t head_dim, int lane) {
  using E = typename Kv::Element;
  const int64_t col = int64_t(head) * head_dim;
  float amax = 0.0f;
  if constexpr (Kv::kScaled) {
    for (int i = lane; i < head_dim; i += 32) amax = fmaxf(amax, fabsf(src[i]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  }
  if constexpr (Kv::kBlockScaled) {
    const float row_scale = __fdiv_rn(amax, kKvFp4CodeMax * kKvFp4ScaleMax);
    if (lane == 0) pr.scales(block)[offset * pr.kv_heads + head] = row_scale;
    uint8_t* codes = block + offset * pr.row_bytes + col / 2;
    uint8_t* scales = pr.blocks(block) + (offset * pr.width + col) / kKvFp4Block;
    for (int b = lane; b < head_dim / kKvFp4Block; b += 32) {
      const float* xb = src + b * kKvFp4Block;
      float block_max = 0.0f;
      for (int i = 0; i < kKvFp4Block; ++i) block_max = fmaxf(block_max, fabsf(xb[i]));
      // An all-zero row (scale 0) and a block whose scale rounds to 0 store zero codes.
      const uint8_t e = row_scale > 0.0f ? uint8_t(__nv_cvt_float_to_fp8(
                                               __fdiv_rn(block_max, kKvFp4CodeMax * row_scale), __NV_SATFINITE,
                                               __NV_E4M3))
                                         : uint8_t(0);
      scales[b] = e;
      const float step = row_scale * e4m3_to_float(e);
      const float inv = step > 0.0f ? __fdiv_rn(1.0f, step) : 0.0f;
      for (int i = 0; i < kKvFp4Block; i += 2)
        codes[(b * kKvFp4Block + i) / 2] =
            uint8_t(kv_f32_to_e2m1(xb[i] * inv) | (kv_f32_to_e2m1(xb[i + 1] * inv) << 4));
    }
  } else {
    E* dst = reinterpret_cast<E*>(block + offset * pr.row_bytes) + col;
    float inv = 1.0f;
    if constexpr (Kv::kScaled) {
      inv = amax > 0.0f ? Kv::kCodeMax / amax : 0.0f;  // an all-zero row keeps scale 0 and zero codes
      if (lane == 0) pr.scales(block)[offset * pr.kv_heads + head] = amax / Kv::kCodeMax;
    }
    for (int i = lane; i < head_dim; i += 32) dst[i] = Kv::encode(Kv::kScaled ? src[i] * inv : src[i]);
  }
}

// One block per row; each warp takes (K or V, KV head) rows, keys of codec KK and values of codec VK.
template <class KK, class VK>
__global__ void kv_write_kernel(const float* k, const float* v, SeqTables t, PagedRows kr, PagedRows vr,
                                int32_t head_dim) {
  chain_start();
  const int64_t r = blockIdx.x;
  const int32_t si = t.row_seq[r];
  if (si < 0) return;
  const DeviceSequence s = t.seqs[si];
  const int64_t pos = s.start + (r - s.row0), offset = pos % kKvPageTokens;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int job = warp; job < 2 * kr.kv_heads; job += warps) {
    const bool values = job >= kr.kv_heads;
    const int32_t head = job % kr.kv_heads;
    const PagedRows& pr = values ? vr : kr;
    const float* src = (values ? v : k) + r * pr.width + int64_t(head) * head_dim;
    uint8_t* block = pr.page(t.pages, s.page_offset, pos / kKvPageTokens);
    if (values) write_row<VK>(pr, src, block, offset, head, head_dim, lane);
    else write_row<KK>(pr, src, block, offset, head, head_dim, lane);
  }
}

// The scale of key/value `pos`'s row for `kv_head` (1 for the unscaled dtypes).
template <class Kv>
__device__ float row_scale(const PagedRows& pr, const SeqTables& t, int64_t page_offset, int64_t pos,
                           int32_t kv_head) {
  if constexpr (Kv::kScaled)
    return pr.scales(pr.page(t.pages, page_offset, pos / kKvPageTokens))[(pos % kKvPageTokens) * pr.kv_heads +
                                                                         kv_head];
  else
    return 1.0f;
}

template <class KK, class VK>
__global__ void __launch_bounds__(kAttnThreads)
    attention_kernel(const float* q, int64_t q_row_stride, int64_t q_head_stride, SeqTables t, PagedRows kr,
                     PagedRows vr, AttentionShape shape, float* out) {
  extern __shared__ float q_shared[];  // head_dim
  __shared__ float p_tile[kAttnThreads];
  const int64_t r = blockIdx.x;
  const int32_t h = blockIdx.y, d = shape.head_dim;
  const int32_t si = t.row_seq[r];
  if (si < 0) return;  // a row outside every sequence is left as it was (the CPU twin skips it too)
  const DeviceSequence s = t.seqs[si];
  const int64_t last = s.start + (r - s.row0);
  const int32_t kv_head = h / (shape.num_heads / shape.num_kv_heads);
  const int64_t kv_offset = int64_t(kv_head) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) q_shared[i] = q[r * q_row_stride + h * q_head_stride + i];
  __syncthreads();

  float running_max = -INFINITY, running_sum = 0.0f, acc[4] = {0, 0, 0, 0};
  for (int64_t j0 = 0; j0 <= last; j0 += kAttnThreads) {
    const int64_t j = j0 + threadIdx.x;
    float score = -INFINITY;
    if (j <= last) {
      const uint8_t* key_block = kr.page(t.pages, s.page_offset, j / kKvPageTokens);
      float dot = 0.0f;
      for (int i = 0; i < d; ++i) dot += q_shared[i] * load_value<KK>(kr, key_block, j % kKvPageTokens, kv_offset + i);
      score = dot * row_scale<KK>(kr, t, s.page_offset, j, kv_head) * shape.scale;
    }
    const float new_max = fmaxf(running_max, block_reduce(score, MaxOp{}));
    const float correction = expf(running_max - new_max);  // 0 on the first tile
    const float p = j <= last ? expf(score - new_max) : 0.0f;
    running_sum = running_sum * correction + block_reduce(p, SumOp{});
    p_tile[threadIdx.x] = j <= last ? p * row_scale<VK>(vr, t, s.page_offset, j, kv_head) : 0.0f;
    __syncthreads();
    const int64_t tile = last - j0 + 1 < kAttnThreads ? last - j0 + 1 : kAttnThreads;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i = threadIdx.x + c * kAttnThreads;
      if (i >= d) break;
      float a = acc[c] * correction;
      for (int64_t jj = 0; jj < tile; ++jj) {
        const int64_t j = j0 + jj;
        a += p_tile[jj] * load_value<VK>(vr, vr.page(t.pages, s.page_offset, j / kKvPageTokens), j % kKvPageTokens,
                                         kv_offset + i);
      }
      acc[c] = a;
    }
    running_max = new_max;
    __syncthreads();  // p_tile is rewritten by the next tile
  }
  float* o = out + (r * shape.num_heads + h) * d;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int i = threadIdx.x + c * kAttnThreads;
    if (i < d) o[i] = acc[c] / running_sum;
  }
}

PagedRows paged(const KvPool& pool, int32_t layer, bool values) {
  const auto* base = static_cast<const uint8_t*>(values ? pool.v_rows(0, layer) : pool.k_rows(0, layer));
  const auto* scales = reinterpret_cast<const uint8_t*>(values ? pool.v_scales(0, layer) : pool.k_scales(0, layer));
  const uint8_t* blocks = values ? pool.v_blocks(0, layer) : pool.k_blocks(0, layer);
  const KvDtype side = values ? pool.value_dtype() : pool.key_dtype();
  return {const_cast<uint8_t*>(base), pool.page_bytes(), pool.row_elements(),
          kv_code_bytes(side, pool.row_elements()), scales ? scales - base : 0, blocks ? blocks - base : 0,
          pool.kv_heads()};
}

// The flash prefill tiles of the sequences with many new rows (heaviest first: the tiles with the most keys
// start first) and the rows that attend on their own.
struct FastWork {
  std::vector<PrefillTile> tiles;
  std::vector<int32_t> decode_rows;
};

FastWork split_work(std::span<const SequenceRows> seqs, int32_t group, bool decode_ok) {
  FastWork w;
  std::vector<int64_t> tile_keys;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceRows& s = seqs[i];
    if (s.n <= 0) continue;
    if (decode_ok && s.n < kPrefillMinRows) {
      for (int64_t j = 0; j < s.n; ++j) w.decode_rows.push_back(int32_t(s.row0 + j));
      continue;
    }
    for (int64_t first = 0; first < s.n * group; first += kPrefillTileRows) {
      w.tiles.push_back({int32_t(i), int32_t(first)});
      tile_keys.push_back(s.start + std::min(first + kPrefillTileRows, s.n * group) / group);
    }
  }
  std::vector<size_t> order(w.tiles.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tile_keys[a] > tile_keys[b]; });
  std::vector<PrefillTile> sorted;
  for (size_t i : order) sorted.push_back(w.tiles[i]);
  w.tiles = std::move(sorted);
  return w;
}

}  // namespace

void CudaBackend::kv_write(const float* k, const float* v, std::span<const SequenceRows> seqs, KvPool& pool,
                           int32_t layer) {
  const SequenceSlots o = sequence_tables(seqs, pool);
  if (o.rows <= 0 || tables_only()) return;
  const SeqTables t{o.seqs, o.pages, o.row_seq};
  const int32_t head_dim = int32_t(pool.row_elements() / pool.kv_heads());
  dispatch_kv_device(pool.dtype(), [&](auto key_codec, auto value_codec) {
    launch_chained(kv_write_kernel<decltype(key_codec), decltype(value_codec)>, dim3(unsigned(o.rows)),
                   dim3(kThreads), 0, stream_, k, v, t,
                   paged(pool, layer, false), paged(pool, layer, true), head_dim);
  });
}

void CudaBackend::attention(const float* q, int64_t q_row_stride, int64_t q_head_stride,
                            std::span<const SequenceRows> seqs, const KvPool& pool, int32_t layer,
                            const AttentionShape& shape, float* out) {
  if (shape.head_dim > kMaxHeadDim)
    throw EngineError("CUDA attention: head_dim " + std::to_string(shape.head_dim) + " above " +
                      std::to_string(kMaxHeadDim));
  const SequenceSlots o = sequence_tables(seqs, pool);
  if (o.rows <= 0) return;
  const SeqTables t{o.seqs, o.pages, o.row_seq};
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  if (!flash_prefill_supports(pool.dtype(), shape.head_dim)) {
    if (tables_only()) return;
    const dim3 grid(unsigned(o.rows), unsigned(shape.num_heads));
    dispatch_kv_device(pool.dtype(), [&](auto key_codec, auto value_codec) {
      using KK = decltype(key_codec);
      using VK = decltype(value_codec);
      attention_kernel<KK, VK><<<grid, kAttnThreads, shape.head_dim * sizeof(float), stream_>>>(
          q, q_row_stride, q_head_stride, t, paged(pool, layer, false), paged(pool, layer, true), shape, out);
    });
    NINFER_CUDA_CHECK_LAUNCH();
    return;
  }
  const FastWork work = split_work(seqs, group, flash_decode_supports(pool.dtype(), shape.head_dim, group));
  HostTables tables;
  const size_t tiles_at = tables.add(work.tiles.data(), work.tiles.size());
  const size_t rows_at = tables.add(work.decode_rows.data(), work.decode_rows.size());
  const uint8_t* base = upload(tables);
  if (tables_only()) return;
  const AttentionArgs args{q, q_row_stride, q_head_stride, t, paged(pool, layer, false), paged(pool, layer, true),
                           shape, out};
  flash_prefill(args, pool.dtype(), reinterpret_cast<const PrefillTile*>(base + tiles_at), int32_t(work.tiles.size()),
                stream_);
  const int64_t rows = int64_t(work.decode_rows.size());
  if (rows > 0) {
    // The split count depends on the row count alone, never on the context: a decode graph captured at one
    // context length replays at any other (splits past a row's last page exit at once), and the eager warm-up
    // pass of a decode batch makes the partials buffer big enough for its captures.
    const int32_t splits = flash_decode_max_splits(rows, shape.num_kv_heads);
    float* partial = scratch(attention_partial_, size_t(flash_decode_partial_floats(rows, shape, splits)));
    flash_decode(args, pool.dtype(), reinterpret_cast<const int32_t*>(base + rows_at), int32_t(rows), splits, partial,
                 stream_);
  }
}

}  // namespace ninfer::cuda
