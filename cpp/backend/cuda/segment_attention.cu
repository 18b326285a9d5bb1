// Segment attention of the CUDA backend (the vision tower's bidirectional attention within one image or one video
// frame group): f32 on CUDA cores, correct first. A block takes 64 query rows of one segment and one head; four
// threads share a query row, each holding every fourth float4 of its q and output; K and V come through shared
// memory 32 keys at a time, with an online softmax over the tiles (scores of a tile first, then one rescale).
// Next step: tensor cores (bf16 mma with f32 accumulation, as flash_prefill.cu), which the 15 ms target needs.
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "errors.h"

namespace ninfer::cuda {
namespace {

constexpr int kQueryRows = 64;
constexpr int kLanesPerRow = 4;
constexpr int kAttentionThreads = kQueryRows * kLanesPerRow;
constexpr int kKeyTile = 32;
constexpr int kMaxHeadDim = 128;
constexpr int kMaxVectors = kMaxHeadDim / 4;           // float4s of a head
constexpr int kVectorsPerLane = kMaxVectors / kLanesPerRow;

// One block's query rows: rows [first, first + 64) (clipped to n) of the segment of rows [row0, row0 + n).
struct QueryTile {
  int64_t row0, n, first;
};

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

__device__ __forceinline__ void axpy4(float4& acc, float p, float4 v) {
  acc.x += p * v.x, acc.y += p * v.y, acc.z += p * v.z, acc.w += p * v.w;
}

__global__ void __launch_bounds__(kAttentionThreads)
    segment_attention_kernel(const float* q, const float* k, const float* v, int64_t row_stride,
                             const QueryTile* tiles, int32_t heads, int32_t head_dim, float scale, float* out) {
  chain_start();
  __shared__ float4 ks[kKeyTile][kMaxVectors];
  __shared__ float4 vs[kKeyTile][kMaxVectors];
  const QueryTile tile = tiles[blockIdx.x];
  const int32_t h = int32_t(blockIdx.y), vectors = head_dim / 4;
  const int lane = int(threadIdx.x) % kLanesPerRow;
  const int64_t query = tile.first + int64_t(threadIdx.x) / kLanesPerRow;  // within the segment
  const bool active = query < tile.n;
  const int64_t head_offset = int64_t(h) * head_dim;

  float4 qr[kVectorsPerLane], acc[kVectorsPerLane];
#pragma unroll
  for (int i = 0; i < kVectorsPerLane; ++i) {
    const int c = lane + kLanesPerRow * i;
    qr[i] = active && c < vectors
                ? reinterpret_cast<const float4*>(q + (tile.row0 + query) * row_stride + head_offset)[c]
                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float running_max = -INFINITY, total = 0.0f;
  for (int64_t key0 = 0; key0 < tile.n; key0 += kKeyTile) {
    const int keys = int(tile.n - key0 < kKeyTile ? tile.n - key0 : kKeyTile);
    __syncthreads();  // the previous tile's readers are done
    for (int idx = int(threadIdx.x); idx < keys * vectors; idx += kAttentionThreads) {
      const int j = idx / vectors, c = idx % vectors;
      const int64_t at = (tile.row0 + key0 + j) * row_stride + head_offset;
      ks[j][c] = reinterpret_cast<const float4*>(k + at)[c];
      vs[j][c] = reinterpret_cast<const float4*>(v + at)[c];
    }
    __syncthreads();
    float scores[kKeyTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeyTile; ++j) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kVectorsPerLane; ++i) {
        const int c = lane + kLanesPerRow * i;
        if (c < vectors) dot += dot4(qr[i], ks[j][c]);
      }
      dot = quad_sum(dot) * scale;  // every lane of the quad takes part: the loop has no early exit
      scores[j] = j < keys ? dot : -INFINITY;
      tile_max = fmaxf(tile_max, scores[j]);
    }
    const float new_max = fmaxf(running_max, tile_max);
    const float rescale = expf(running_max - new_max);  // 0 on the first tile (running_max is -inf)
    total *= rescale;
#pragma unroll
    for (int i = 0; i < kVectorsPerLane; ++i) {
      acc[i].x *= rescale, acc[i].y *= rescale, acc[i].z *= rescale, acc[i].w *= rescale;
    }
#pragma unroll
    for (int j = 0; j < kKeyTile; ++j) {
      if (j >= keys) break;
      const float p = expf(scores[j] - new_max);
      total += p;
#pragma unroll
      for (int i = 0; i < kVectorsPerLane; ++i) {
        const int c = lane + kLanesPerRow * i;
        if (c < vectors) axpy4(acc[i], p, vs[j][c]);
      }
    }
    running_max = new_max;
  }
  if (!active) return;
  float4* o = reinterpret_cast<float4*>(out + (tile.row0 + query) * int64_t(heads) * head_dim + head_offset);
  const float inv = 1.0f / total;
#pragma unroll
  for (int i = 0; i < kVectorsPerLane; ++i) {
    const int c = lane + kLanesPerRow * i;
    if (c < vectors) o[c] = make_float4(acc[i].x * inv, acc[i].y * inv, acc[i].z * inv, acc[i].w * inv);
  }
}

}  // namespace

void CudaBackend::segment_attention(const float* q, const float* k, const float* v, int64_t row_stride,
                                    std::span<const RowSegment> segments, int32_t heads, int32_t head_dim,
                                    float scale, float* out) {
  if (head_dim <= 0 || head_dim > kMaxHeadDim || head_dim % 4 != 0)
    throw EngineError("cuda segment_attention: head_dim " + std::to_string(head_dim) +
                      " must be a multiple of 4 up to " + std::to_string(kMaxHeadDim));
  if (row_stride % 4 != 0 || !aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out))
    throw EngineError("cuda segment_attention: q, k, v and out must be 16-byte aligned with a row stride of 4k");
  if (heads <= 0 || heads > 65535) throw EngineError("cuda segment_attention: 1..65535 heads");
  std::vector<QueryTile> query_tiles;
  for (const RowSegment& s : segments)
    for (int64_t first = 0; first < s.n; first += kQueryRows) query_tiles.push_back({s.row0, s.n, first});
  if (query_tiles.empty()) return;
  if (query_tiles.size() > 0x7fffffff) throw EngineError("cuda segment_attention: too many rows for one launch");
  HostTables tables;
  const size_t at = tables.add(query_tiles.data(), query_tiles.size());
  const uint8_t* base = upload(tables);
  if (tables_only()) return;
  launch_chained(segment_attention_kernel, dim3(unsigned(query_tiles.size()), unsigned(heads)),
                 dim3(kAttentionThreads), 0, stream_, q, k, v, row_stride,
                 reinterpret_cast<const QueryTile*>(base + at), heads, head_dim, scale, out);
}

}  // namespace ninfer::cuda
