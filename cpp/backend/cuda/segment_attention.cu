// Segment attention of the CUDA backend (the vision tower's bidirectional attention within one image or one video
// frame group) on tensor cores: a block takes 128 query rows of one segment and one head (eight warps, 16 rows
// each); K and V come through shared memory 64 keys at a time; S = Q K^T and O += P V run on mma.sync m16n8k16
// bf16 with f32 accumulation (mma_bf16.cuh, as flash_prefill.cu), with an online softmax in f32 (exp2 domain).
// A head of any multiple of 4 up to 128 is zero-padded to the next multiple of 16 (72 -> 80): zero columns of Q
// and K add nothing to a score, and V's zero columns make output columns that are never written.
//
// Numerics (the flash ones; the f32 CPU op is the slow twin): q * scale * log2(e), k and v are rounded to bf16
// (relative error <= 2^-9 each), P = exp2(S - max) is rounded to bf16 for the P V product, the softmax sum is
// taken over the f32 P. So a score is off by about 2 * 2^-9 * sum_i |q_i k_i| * scale and an output by about
// 2^-8 of the weighted mean of |v| (plus the score error's effect on the weights) beside the exact result.
//
// The inputs are f32, so tiles are converted on the way (global -> registers -> shared) and their fetch is not
// overlapped within the block; two blocks per SM (heads up to 80) overlap each other. Next steps: a bf16 copy of
// q/k/v made once per layer (cp.async or TMA tiles, read by every query tile of the segment), then wgmma.
#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mma_bf16.cuh"
#include "errors.h"

namespace ninfer::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kQueryRows = 16 * kWarps;
constexpr int kAttentionThreads = 32 * kWarps;
constexpr int kKeys = 64;  // keys of one K/V tile
constexpr int kMaxHeadDim = 128;

// One block's query rows: rows [first, first + 128) (clipped to n) of the segment of rows [row0, row0 + n).
struct QueryTile {
  int64_t row0, n, first;
};

template <int D>
constexpr size_t shared_bytes() {
  return size_t(kQueryRows + 2 * kKeys) * kStride<D> * sizeof(uint16_t);
}

// Rows [from, from + count) of x (head offset applied, `valid` of them real, the rest zeros) into `rows` rows of
// dst as bf16 times `scale`, columns past head_dim zeroed.
template <int D>
__device__ void load_rows(const float* x, int64_t row_stride, int64_t from, int rows, int valid, int head_dim,
                          float scale, uint16_t* dst) {
  constexpr int kChunks = D / 4;  // 4 elements per chunk
  const int real_chunks = head_dim / 4;
  for (int c = threadIdx.x; c < rows * kChunks; c += kAttentionThreads) {
    const int row = c / kChunks, c4 = c % kChunks;
    float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < valid && c4 < real_chunks) f = reinterpret_cast<const float4*>(x + (from + row) * row_stride)[c4];
    *reinterpret_cast<uint2*>(dst + row * kStride<D> + c4 * 4) =
        make_uint2(pack_bf16(f.x * scale, f.y * scale), pack_bf16(f.z * scale, f.w * scale));
  }
}

// Two blocks an SM up to heads of 80 (128 registers a thread, no spills); the wider heads' accumulators need more.
template <int D>
__global__ void __launch_bounds__(kAttentionThreads, D <= 80 ? 2 : 1)
    segment_attention_kernel(const float* q, const float* k, const float* v, int64_t row_stride,
                             const QueryTile* tiles, int32_t heads, int32_t head_dim, float scale, float* out) {
  chain_start();
  extern __shared__ uint4 shared_words[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* ks = qs + kQueryRows * kStride<D>;
  uint16_t* vs = ks + kKeys * kStride<D>;

  const QueryTile tile = tiles[blockIdx.x];
  const int64_t head_offset = int64_t(blockIdx.y) * head_dim;
  const int64_t segment = tile.row0 * row_stride + head_offset;  // q, k, v offset of the segment's first row
  const int queries = int(min(int64_t(kQueryRows), tile.n - tile.first));
  load_rows<D>(q + segment, row_stride, tile.first, kQueryRows, queries, head_dim, scale * kLog2e, qs);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  const bool warp_active = warp * 16 < queries;
  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  __syncthreads();  // Q is in
  uint32_t qa[D / 16][4];  // this warp's Q fragments, read once
  if (warp_active) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ldmatrix_x4(qa[kk], qs + (warp * 16 + lane % 16) * kStride<D> + kk * 16 + (lane / 16) * 8);
  }

  for (int64_t key0 = 0; key0 < tile.n; key0 += kKeys) {
    const int keys = int(min(int64_t(kKeys), tile.n - key0));
    __syncthreads();  // every warp is done with the previous tile
    load_rows<D>(k + segment, row_stride, key0, kKeys, keys, head_dim, 1.0f, ks);
    load_rows<D>(v + segment, row_stride, key0, kKeys, keys, head_dim, 1.0f, vs);
    __syncthreads();
    if (!warp_active) continue;
    // S = Q K^T for this warp's 16 rows and the tile's 64 keys; keys past the segment masked.
    float sc[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) add_key_scores<kKeys, D>(sc, qa[kk], ks, kk, lane);
    if (keys < kKeys) {
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (nt * 8 + 2 * t + (c & 1) >= keys) sc[nt][c] = -INFINITY;
    }
    online_softmax_tile<kKeys, D>(sc, o, row_max, row_sum);  // finite maxima: every tile has a key
    // O += P V, P as bf16 A fragments straight from the S accumulators.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      add_weighted_values<D>(o, pa, vs, kk, lane);
    }
  }
  if (!warp_active) return;

  const int g = lane / 4;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = warp * 16 + g + 8 * rr;
    const float inv = 1.0f / quad_sum(row_sum[rr]);  // every lane of the warp takes part (rows past the end too)
    if (row >= queries) continue;
    float* to = out + (tile.row0 + tile.first + row) * int64_t(heads) * head_dim + head_offset;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int col = nt * 8 + 2 * t;  // head_dim is a multiple of 4: col + 1 is in the head when col is
      if (col < head_dim)
        *reinterpret_cast<float2*>(to + col) = make_float2(o[nt][2 * rr] * inv, o[nt][2 * rr + 1] * inv);
    }
  }
}

template <int D>
void launch(dim3 grid, cudaStream_t stream, const float* q, const float* k, const float* v, int64_t row_stride,
            const QueryTile* tiles, int32_t heads, int32_t head_dim, float scale, float* out) {
  constexpr size_t bytes = shared_bytes<D>();
  static const bool configured = [] {
    NINFER_CUDA_CHECK(cudaFuncSetAttribute(segment_attention_kernel<D>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    return true;
  }();
  (void)configured;
  launch_chained(segment_attention_kernel<D>, grid, dim3(kAttentionThreads), bytes, stream, q, k, v, row_stride,
                 tiles, heads, head_dim, scale, out);
}

// The head padded to the next multiple of 16 (the mma's k step).
void launch_padded(int32_t head_dim, dim3 grid, cudaStream_t stream, const float* q, const float* k, const float* v,
                   int64_t row_stride, const QueryTile* tiles, int32_t heads, float scale, float* out) {
  switch ((head_dim + 15) / 16 * 16) {
    case 16: return launch<16>(grid, stream, q, k, v, row_stride, tiles, heads, head_dim, scale, out);
    case 32: return launch<32>(grid, stream, q, k, v, row_stride, tiles, heads, head_dim, scale, out);
    case 48: return launch<48>(grid, stream, q, k, v, row_stride, tiles, heads, head_dim, scale, out);
    case 64: return launch<64>(grid, stream, q, k, v, row_stride, tiles, heads, head_dim, scale, out);
    case 80: return launch<80>(grid, stream, q, k, v, row_stride, tiles, heads, head_dim, scale, out);
    case 96: return launch<96>(grid, stream, q, k, v, row_stride, tiles, heads, head_dim, scale, out);
    case 112: return launch<112>(grid, stream, q, k, v, row_stride, tiles, heads, head_dim, scale, out);
    case 128: return launch<128>(grid, stream, q, k, v, row_stride, tiles, heads, head_dim, scale, out);
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
  // The longest segments' tiles first, so that the short ones fill in behind them.
  std::stable_sort(query_tiles.begin(), query_tiles.end(),
                   [](const QueryTile& a, const QueryTile& b) { return a.n > b.n; });
  HostTables tables;
  const size_t at = tables.add(query_tiles.data(), query_tiles.size());
  const uint8_t* base = upload(tables);
  if (tables_only()) return;
  launch_padded(head_dim, dim3(unsigned(query_tiles.size()), unsigned(heads)), stream_, q, k, v, row_stride,
                reinterpret_cast<const QueryTile*>(base + at), heads, scale, out);
}

}  // namespace ninfer::cuda
