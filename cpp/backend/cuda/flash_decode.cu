// Split-KV decode attention ("flash-decoding"): a row's keys are cut into `splits` runs of whole pages; a block
// takes one (row, KV head, split) with all the group's query heads, so each K/V byte is read once per group, and
// writes a partial (max, sum, unnormalised output) per query head; a second kernel combines the splits.
// The split count is fixed by the row count (never by the context), so a captured decode graph replays at any
// context length: a split past its row's last page writes (max -inf, sum 0) and exits, and the combine skips it.
// Its limit is reading K/V: every K/V load is a vector load (8 values: 16 bytes of bf16, 8 of fp8/int8, 4 of
// nvfp4 plus its block-scale byte). Keys and values may have different codecs (k8v4).
//
// Per page (64 keys) of a split: scores (two threads per key, f32 q in shared memory, f32 dot products of the
// dequantized codes, times the key scale), an online-softmax update per query head (one warp per head), then
// P V (each thread 8 output dims of a subset of the keys, one V vector load per key). Everything is f32: the
// result differs from the CPU twin by summation order only.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_attention.h"

namespace ninfer::cuda {
namespace {

constexpr int kThreadsPerBlock = 128;
constexpr int kWarps = kThreadsPerBlock / 32;
constexpr int kKeys = int(kKvPageTokens);
constexpr int kMaxGroup = kDecodeMaxGroup;
constexpr int32_t kMaxSplits = 128;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kThreadsPerBlock == 2 * kKeys, "scores take two threads per key");

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Where split `split`'s partial results of (decode row i, query head h) live: outputs, then (max, sum) pairs.
struct Partials {
  float* base;
  int32_t heads, splits, head_dim;
  int64_t rows;
  __device__ float* output(int64_t i, int64_t h, int32_t split) const {
    return base + ((i * heads + h) * splits + split) * head_dim;
  }
  __device__ float2* max_sum(int64_t i, int64_t h, int32_t split) const {
    return reinterpret_cast<float2*>(base + rows * heads * splits * head_dim) + (i * heads + h) * splits + split;
  }
};

// At most 128 registers a thread, so that four blocks fit a multiprocessor (flash_decode_max_splits' target):
// with every load of a page in flight at once the kernel would take up to 142 (three blocks); capped, ptxas
// spills a few loop-invariant values (under 64 bytes a thread, in L1).
template <class KK, class VK, int D>
__global__ void __launch_bounds__(kThreadsPerBlock, 4)
    flash_decode_split_kernel(AttentionArgs a, const int32_t* rows, int32_t group, Partials partials) {
  chain_start();
  constexpr int kChunks = D / 8;                              // 8-element vectors per row
  constexpr int kKeyGroups = kThreadsPerBlock / kChunks;      // P V: threads sharing one output chunk
  __shared__ __align__(16) float q_s[kMaxGroup][D];           // scale * log2(e) * q
  __shared__ __align__(16) float p_s[kKeys][kMaxGroup];       // scores, then weights (times the value scale)
  __shared__ __align__(16) float reduce_s[kKeyGroups][kMaxGroup][D];
  __shared__ float max_s[kMaxGroup], sum_s[kMaxGroup], correction_s[kMaxGroup];

  const int32_t split = int32_t(blockIdx.x), kv_head = int32_t(blockIdx.y);
  const int64_t i = blockIdx.z, r = rows[i];
  const DeviceSequence s = a.t.seqs[a.t.row_seq[r]];
  const int64_t pos = s.start + (r - s.row0);
  const int64_t pages = pos / kKeys + 1, per_split = (pages + partials.splits - 1) / partials.splits;
  const int64_t page_begin = split * per_split, page_end = min(page_begin + per_split, pages);
  if (page_begin >= page_end) {  // nothing of this row's context: an empty partial (its outputs are not read)
    if (threadIdx.x < group)
      *partials.max_sum(i, int64_t(kv_head) * group + threadIdx.x, split) = make_float2(-INFINITY, 0.0f);
    return;
  }

  // q of all kMaxGroup heads, zero past the group, so that the per-head loops between the K and V loads below run
  // a fixed count with no branch on `group`: such a branch after each vector load's dot products kept the next
  // load from issuing before they were done, one memory latency per load (16 K and 16 V loads a page at D = 256).
  // The heads past the group cost only FMAs on zeros (weights 0, outputs never written). Their loads read the
  // group's last head, so that every load is unconditional and all are in flight at once.
  const float q_scale = a.shape.scale * kLog2e;
  static_assert(kMaxGroup * D % kThreadsPerBlock == 0, "q fills whole rounds of the block");
#pragma unroll
  for (int j = 0; j < kMaxGroup * D / kThreadsPerBlock; ++j) {
    const int e = j * kThreadsPerBlock + threadIdx.x, h = e / D, c = e % D;
    const float q = a.q[r * a.q_row_stride + (int64_t(kv_head) * group + min(h, group - 1)) * a.q_head_stride + c];
    q_s[h][c] = h < group ? q * q_scale : 0.0f;
  }
  if (threadIdx.x < kMaxGroup) max_s[threadIdx.x] = -INFINITY, sum_s[threadIdx.x] = 0.0f;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = threadIdx.x % kChunks, key_group = threadIdx.x / kChunks;
  float acc[kMaxGroup][8];
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[h][e] = 0.0f;

  for (int64_t page = page_begin; page < page_end; ++page) {
    __syncthreads();  // q is in place / the previous page's weights are used up
    const uint8_t* k_block = a.k.page(a.t.pages, s.page_offset, page);
    const uint8_t* v_block = a.v.page(a.t.pages, s.page_offset, page);
    const int valid = int(min(int64_t(kKeys), pos - page * kKeys + 1));

    {  // scores: threads 2j and 2j+1 take the even and odd vectors of key j
      const int key = threadIdx.x / 2, half = threadIdx.x % 2;
      float score[kMaxGroup];
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) score[h] = 0.0f;
      if (key < valid) {
        const RowBlockScales<KK, D> block_scales(a.k, k_block, key, int64_t(kv_head) * D);
#pragma unroll
        for (int c = half; c < kChunks; c += 2) {
          float k8[8];
          load_values8<KK, D>(a.k, k_block, key, int64_t(kv_head) * D, c * 8, block_scales, k8);
#pragma unroll
          for (int h = 0; h < kMaxGroup; ++h) {
            const float4 qa = *reinterpret_cast<const float4*>(&q_s[h][c * 8]);
            const float4 qb = *reinterpret_cast<const float4*>(&q_s[h][c * 8 + 4]);
            score[h] += qa.x * k8[0] + qa.y * k8[1] + qa.z * k8[2] + qa.w * k8[3] + qb.x * k8[4] + qb.y * k8[5] +
                        qb.z * k8[6] + qb.w * k8[7];
          }
        }
      }
      float k_scale = 1.0f;
      if constexpr (KK::kScaled)
        if (key < valid) k_scale = a.k.scales(const_cast<uint8_t*>(k_block))[key * a.k.kv_heads + kv_head];
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        score[h] += __shfl_xor_sync(0xffffffffu, score[h], 1);
        if (half == 0) p_s[key][h] = h >= group ? 0.0f : key < valid ? score[h] * k_scale : -INFINITY;
      }
    }
    __syncthreads();
    // Online softmax, one warp per query head; the weights replace the scores.
    for (int h = warp; h < group; h += kWarps) {
      const float old_max = max_s[h];
      float p0 = p_s[lane][h], p1 = p_s[lane + 32][h];
      const float new_max = fmaxf(old_max, warp_max(fmaxf(p0, p1)));  // finite: key 0 of a page is valid
      p0 = exp2f(p0 - new_max), p1 = exp2f(p1 - new_max);
      const float sum = warp_sum(p0 + p1);
      if constexpr (VK::kScaled) {
        const float* v_scales = a.v.scales(const_cast<uint8_t*>(v_block));
        p0 = lane < valid ? p0 * v_scales[lane * a.v.kv_heads + kv_head] : 0.0f;
        p1 = lane + 32 < valid ? p1 * v_scales[(lane + 32) * a.v.kv_heads + kv_head] : 0.0f;
      }
      p_s[lane][h] = p0, p_s[lane + 32][h] = p1;
      if (lane == 0) {
        const float correction = exp2f(old_max - new_max);
        correction_s[h] = correction;
        sum_s[h] = sum_s[h] * correction + sum;
        max_s[h] = new_max;
      }
    }
    __syncthreads();
    // O = O * correction + P V over the valid keys.
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      if (h >= group) break;
      const float correction = correction_s[h];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] *= correction;
    }
    // A fixed count of keys per thread, so its V loads can all be in flight at once: a key past `valid` (its
    // weight is exp2(-inf) = 0, or 0 when scaled) reads the last valid row instead of its own, never written
    // (possibly not finite, and 0 * NaN is NaN), and adds exactly 0.
#pragma unroll
    for (int j = 0; j < kKeys / kKeyGroups; ++j) {
      const int key = key_group + j * kKeyGroups, row = min(key, valid - 1);
      float v8[8];
      load_values8<VK>(a.v, v_block, row, int64_t(kv_head) * D + chunk * 8, v8);
      const float4 pa = *reinterpret_cast<const float4*>(&p_s[key][0]);
      const float4 pb = *reinterpret_cast<const float4*>(&p_s[key][4]);
      const float p[kMaxGroup] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] += p[h] * v8[e];
    }
  }

  // Sum the key groups' outputs and write this split's partials.
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h >= group) break;
#pragma unroll
    for (int e = 0; e < 8; ++e) reduce_s[key_group][h][chunk * 8 + e] = acc[h][e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < group * D; e += kThreadsPerBlock) {
    const int h = e / D, c = e % D;
    float sum = 0.0f;
    for (int k = 0; k < kKeyGroups; ++k) sum += reduce_s[k][h][c];
    partials.output(i, int64_t(kv_head) * group + h, split)[c] = sum;
  }
  if (threadIdx.x < group)
    *partials.max_sum(i, int64_t(kv_head) * group + threadIdx.x, split) =
        make_float2(max_s[threadIdx.x], sum_s[threadIdx.x]);
}

// out[row, head] = sum over splits of 2^(max_z - max) O_z / sum over splits of 2^(max_z - max) sum_z, over the
// splits that hold keys (an empty split's weight is 0 and its O_z unwritten). Split 0 always holds key 0.
// A block takes one (row, query head, slice of up to kCombineColumns output columns). The per-split scans are
// spread over the block, because the split count is fixed by the row count (128 at one row), not by the
// context, so at short contexts most splits are empty: thread z reads split z's (max, sum) once; the max and
// the weighted sum are block reductions; the splits of non-zero weight are listed in split order, and only
// they are read for the outputs, each thread summing 4 columns (one float4) over a strided subset of the list,
// the subsets then summed in a fixed order. f32 throughout: this differs from the serial sum by order only.
constexpr int kCombineThreads = 128;
constexpr int kCombineWarps = kCombineThreads / 32;
constexpr int kCombineColumns = 64;
static_assert(kCombineThreads == kMaxSplits, "the weights take one thread per split");

// The max (kMax) or the sum of v over the block's threads, returned to every thread.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* warp_s) {
  v = kMax ? warp_max(v) : warp_sum(v);
  if (threadIdx.x % 32 == 0) warp_s[threadIdx.x / 32] = v;
  __syncthreads();
  float all = warp_s[0];
  for (int w = 1; w < kCombineWarps; ++w) all = kMax ? fmaxf(all, warp_s[w]) : all + warp_s[w];
  __syncthreads();  // warp_s is free for the next reduction
  return all;
}

__global__ void __launch_bounds__(kCombineThreads)
    flash_decode_combine_kernel(const int32_t* rows, Partials partials, float* out) {
  chain_start();
  __shared__ float warp_s[kCombineWarps];
  __shared__ int32_t listed_before_s[kCombineWarps];
  __shared__ int32_t split_s[kMaxSplits];
  __shared__ float weight_s[kMaxSplits];
  __shared__ __align__(16) float reduce_s[kCombineThreads * 4];
  const int64_t i = blockIdx.x, h = blockIdx.y, r = rows[i];
  const int32_t splits = partials.splits, d = partials.head_dim, z = int32_t(threadIdx.x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const float2 max_sum = z < splits ? *partials.max_sum(i, h, z) : make_float2(-INFINITY, 0.0f);
  const float best = block_reduce<true>(max_sum.x, warp_s);
  const float weight = exp2f(max_sum.x - best);  // 0 for empty splits
  const bool listed = weight != 0.0f;
  const float total = block_reduce<false>(listed ? weight * max_sum.y : 0.0f, warp_s);

  // List the splits of non-zero weight in split order: a ballot per warp, the warps' counts before it.
  const uint32_t ballot = __ballot_sync(0xffffffffu, listed);
  if (lane == 0) listed_before_s[warp] = __popc(ballot);
  __syncthreads();
  int32_t at = __popc(ballot & ((1u << lane) - 1u)), count = 0;
  for (int w = 0; w < kCombineWarps; ++w) {
    if (w < warp) at += listed_before_s[w];
    count += listed_before_s[w];
  }
  if (listed) split_s[at] = z, weight_s[at] = weight;
  __syncthreads();

  // This block's columns [first, first + columns): `vectors` float4 columns, `groups` threads per column.
  const int32_t columns = min(d, kCombineColumns), first = int32_t(blockIdx.z) * columns;
  const int vectors = columns / 4, groups = kCombineThreads / vectors;
  const int vector = threadIdx.x % vectors, group = threadIdx.x / vectors;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int32_t k = group; k < count; k += groups) {
    const float w = weight_s[k];
    const float4 o = *reinterpret_cast<const float4*>(partials.output(i, h, split_s[k]) + first + 4 * vector);
    sum.x += w * o.x, sum.y += w * o.y, sum.z += w * o.z, sum.w += w * o.w;
  }
  reinterpret_cast<float4*>(reduce_s)[group * vectors + vector] = sum;
  __syncthreads();
  if (threadIdx.x < columns) {
    float column = 0.0f;
    for (int g = 0; g < groups; ++g) column += reduce_s[g * columns + threadIdx.x];
    out[(r * partials.heads + h) * d + first + threadIdx.x] = column / total;
  }
}

template <class KK, class VK, int D>
void launch_split(const AttentionArgs& a, const int32_t* rows, int32_t row_count, const Partials& p,
                  cudaStream_t stream) {
  const dim3 grid(unsigned(p.splits), unsigned(a.shape.num_kv_heads), unsigned(row_count));
  launch_chained(flash_decode_split_kernel<KK, VK, D>, grid, dim3(kThreadsPerBlock), 0, stream, a, rows,
                 a.shape.num_heads / a.shape.num_kv_heads, p);
}

template <class KK, class VK>
void launch_for_head_dim(const AttentionArgs& a, const int32_t* rows, int32_t row_count, const Partials& p,
                         cudaStream_t stream) {
  switch (a.shape.head_dim) {
    case 16: return launch_split<KK, VK, 16>(a, rows, row_count, p, stream);
    case 32: return launch_split<KK, VK, 32>(a, rows, row_count, p, stream);
    case 64: return launch_split<KK, VK, 64>(a, rows, row_count, p, stream);
    case 128: return launch_split<KK, VK, 128>(a, rows, row_count, p, stream);
    case 256: return launch_split<KK, VK, 256>(a, rows, row_count, p, stream);
  }
}

}  // namespace

bool flash_decode_supports(KvDtype dtype, int32_t head_dim, int32_t group) {
  const bool dims = head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
  return dims && dtype != KvDtype::F32 && group >= 1 && group <= kMaxGroup;
}

int32_t flash_decode_max_splits(int64_t rows, int32_t kv_heads) {
  // Enough blocks for four per multiprocessor (a block: 128 threads, ~42 KiB of shared memory).
  const int64_t target = 4 * int64_t(device_sms());
  const int64_t per_split = std::max<int64_t>(1, rows * kv_heads);
  return int32_t(std::clamp<int64_t>((target + per_split - 1) / per_split, 1, kMaxSplits));
}

int64_t flash_decode_partial_floats(int64_t rows, const AttentionShape& shape, int32_t splits) {
  return rows * shape.num_heads * splits * (shape.head_dim + 2);
}

void flash_decode(const AttentionArgs& a, KvDtype dtype, const int32_t* rows, int32_t row_count, int32_t splits,
                  float* partial, cudaStream_t stream) {
  if (row_count <= 0) return;
  const Partials p{partial, a.shape.num_heads, splits, a.shape.head_dim, row_count};
  if (dtype == KvDtype::F32) return;  // f32 KV attends with the slow twin (flash_decode_supports)
  dispatch_kv_device(dtype, [&](auto key_codec, auto value_codec) {
    using KK = decltype(key_codec);
    if constexpr (!std::is_same_v<KK, KvDevice<KvDtype::F32>>)
      launch_for_head_dim<KK, decltype(value_codec)>(a, rows, row_count, p, stream);
  });
  NINFER_CUDA_CHECK_LAUNCH();
  const int32_t column_slices = std::max(1, a.shape.head_dim / kCombineColumns);
  launch_chained(flash_decode_combine_kernel,
                 dim3(unsigned(row_count), unsigned(a.shape.num_heads), unsigned(column_slices)),
                 dim3(kCombineThreads), 0, stream, rows, p, a.out);
}

}  // namespace ninfer::cuda
