// Segment attention of the CUDA backend (the vision tower's bidirectional attention within one image or one video
// frame group) on tensor cores: a block takes 128 query rows of one segment and one head (four warps of 32 rows up
// to heads of 80, eight of 16 rows beyond); K and V come through shared memory 64 keys at a time, Q stays there
// too (its fragments are read again each tile); S = Q K^T and O += P V run on mma.sync m16n8k16
// bf16 with f32 accumulation (mma_bf16.cuh, as flash_prefill.cu), with an online softmax in f32 (exp2 domain).
// A head of any multiple of 4 up to 128 is zero-padded to the next multiple of 16 (72 -> 80): zero columns of Q
// and K add nothing to a score, and V's zero columns make output columns that are never written.
//
// Numerics (the flash ones; the f32 CPU op is the slow twin): q * scale * log2(e), k and v are rounded to bf16
// (relative error <= 2^-9 each), P = exp2(S - max) is rounded to bf16 for the P V product, the softmax sum is
// taken over the f32 P. So a score is off by about 2 * 2^-9 * sum_i |q_i k_i| * scale and an output by about
// 2^-8 of the weighted mean of |v| (plus the score error's effect on the weights) beside the exact result.
//
// Two kernels. Every query tile of a segment reads the segment's whole K and V (32 tiles of 128 rows read the 4,096
// keys of a 1024 x 1024 image 32 times), so the rounding to bf16 is done once, by a pre-kernel that writes q (times
// scale * log2 e), k and v as bf16 planes [heads][rows][D] (zero columns past the head) into a scratch buffer. The
// attention kernel then reads half the bytes of f32, and its tiles are contiguous 16-byte chunks fetched with
// cp.async straight into shared memory: K/V tiles are double-buffered (tile j + 1 is on its way while tile j is
// computed; one barrier a tile). The values rounded, and the order of every sum, are the single-kernel version's.
// Next step: wgmma (sm_90a) with TMA tiles.
#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mma_bf16.cuh"
#include "errors.h"

namespace ninfer::cuda {
namespace {

constexpr int kQueryRows = 128;  // query rows of a block
constexpr int kKeys = 64;        // keys of one K/V tile
// M-tiles (16 rows) a warp takes: two up to heads of 80, so that each K and V fragment read from shared memory
// feeds two mma (at one m-tile a warp, the ldmatrix reads bound the kernel before the mma do); one for the wider
// heads, whose accumulators would not fit twice in 255 registers.
template <int D>
constexpr int kTilesPerWarp = D <= 80 ? 2 : 1;
template <int D>
constexpr int kWarps = kQueryRows / (16 * kTilesPerWarp<D>);
template <int D>
constexpr int kAttentionThreads = 32 * kWarps<D>;
constexpr int kMaxHeadDim = 128;

// One block's query rows: rows [first, first + 128) (clipped to n) of the segment of rows [row0, row0 + n).
struct QueryTile {
  int64_t row0, n, first;
};

// The bf16 planes of one call: q, k, v one after another, each [heads][rows][D] (D the padded head).
template <int D>
__host__ __device__ constexpr int64_t plane_elements(int64_t rows, int32_t heads) {
  return int64_t(heads) * rows * D;
}

constexpr int kStages = 2;  // K/V tiles in shared memory: the one computed on and the one on its way

template <int D>
constexpr size_t shared_bytes() {
  return size_t(kQueryRows + kStages * 2 * kKeys) * kStride<D> * sizeof(uint16_t);
}

// Rows [0, rows) of q, k, v (row stride row_stride, head h at columns h * head_dim) into the bf16 planes at `out`
// (plane_elements apart): plane p, head h, row r at ((p * heads + h) * rows + r) * D, columns past head_dim zero;
// q times q_scale (in f32, then rounded). One thread per 8 columns of one (row, head), all three planes.
template <int D>
__global__ void __launch_bounds__(kThreads)
    segment_planes_kernel(const float* q, const float* k, const float* v, int64_t row_stride, int64_t rows,
                          int32_t heads, int32_t head_dim, float q_scale, uint16_t* out) {
  chain_start();
  constexpr int kChunks = D / 8;  // 16-byte chunks of a plane row
  const int per_row = heads * kChunks;
  const int64_t plane = plane_elements<D>(rows, heads);
  NINFER_GRID_STRIDE(i, rows * per_row) {
    const int64_t row = i / per_row;
    const int in_row = int(i - row * per_row), h = in_row / kChunks, c = 8 * (in_row % kChunks);
    const int64_t from = row * row_stride + int64_t(h) * head_dim + c;
    uint16_t* to = out + (int64_t(h) * rows + row) * D + c;
    const float* src[3] = {q, k, v};
#pragma unroll
    for (int p = 0; p < 3; ++p) {
      const float s = p == 0 ? q_scale : 1.0f;  // k * 1.0f == k: the same rounding as the q path
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
      // head_dim is a multiple of 4: a 4-column group is wholly in the head or wholly past it.
      if (c < head_dim) a = *reinterpret_cast<const float4*>(src[p] + from);
      if (c + 4 < head_dim) b = *reinterpret_cast<const float4*>(src[p] + from + 4);
      *reinterpret_cast<uint4*>(to + p * plane) = make_uint4(pack_bf16(a.x * s, a.y * s), pack_bf16(a.z * s, a.w * s),
                                                             pack_bf16(b.x * s, b.y * s), pack_bf16(b.z * s, b.w * s));
    }
  }
}

// Rows [from, from + rows) of a plane (rows of D bf16) into `rows` rows of dst (rows of kStride<D>) with cp.async;
// rows past `valid` are zero-filled (their source address stays in bounds: row `from`, which is real).
template <int D>
__device__ __forceinline__ void copy_rows_async(uint16_t* dst, const uint16_t* plane, int64_t from, int rows,
                                                int valid) {
  constexpr int kChunks = D / 8;
  for (int c = threadIdx.x; c < rows * kChunks; c += kAttentionThreads<D>) {
    const int row = c / kChunks, c8 = 8 * (c % kChunks);
    const bool real = row < valid;
    cp_async16(dst + row * kStride<D> + c8, plane + (from + (real ? row : 0)) * D + c8, real);
  }
}

// Two blocks an SM up to heads of 80 (4 warps of 32 rows: up to 255 registers a thread), one for the wider heads (8
// warps of 16 rows, whose accumulators need more than 128 registers). planes: segment_planes_kernel's output for
// `rows` rows.
template <int D>
__global__ void __launch_bounds__(kAttentionThreads<D>, D <= 80 ? 2 : 1)
    segment_attention_kernel(const uint16_t* planes, int64_t rows, const QueryTile* tiles, int32_t heads,
                             int32_t head_dim, float* out) {
  constexpr int M = kTilesPerWarp<D>;
  chain_start();
  extern __shared__ uint4 shared_words[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* const kv = qs + kQueryRows * kStride<D>;  // stage s: K at kv + 2 s kKeys rows, V kKeys rows after
  auto ks = [&](int stage) { return kv + (2 * stage) * kKeys * kStride<D>; };
  auto vs = [&](int stage) { return kv + (2 * stage + 1) * kKeys * kStride<D>; };

  const QueryTile tile = tiles[blockIdx.x];
  const int64_t plane = plane_elements<D>(rows, heads);
  const uint16_t* qp = planes + int64_t(blockIdx.y) * rows * D;  // this head's q plane; k, v planes after
  const uint16_t* kp = qp + plane;
  const uint16_t* vp = kp + plane;
  const int queries = int(min(int64_t(kQueryRows), tile.n - tile.first));
  const int64_t tiles_n = (tile.n + kKeys - 1) / kKeys;
  auto issue_keys = [&](int64_t j) {  // K and V of key tile j into stage j % 2, as one cp.async group
    const int64_t key0 = j * kKeys;
    const int keys = int(min(int64_t(kKeys), tile.n - key0));
    copy_rows_async<D>(ks(int(j % kStages)), kp, tile.row0 + key0, kKeys, keys);
    copy_rows_async<D>(vs(int(j % kStages)), vp, tile.row0 + key0, kKeys, keys);
    cp_async_commit();
  };
  copy_rows_async<D>(qs, qp, tile.row0 + tile.first, kQueryRows, queries);
  cp_async_commit();
  issue_keys(0);  // a segment has at least one key

  // This warp's rows: m-tile m is rows [first_row + 16 m, first_row + 16 m + 16) of the block's.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4, first_row = warp * 16 * M;
  const bool warp_active = first_row < queries;  // m-tiles past the end of an active warp run on zero rows
  float o[M][D / 8][4];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[m][nt][0] = o[m][nt][1] = o[m][nt][2] = o[m][nt][3] = 0.0f;
  float row_max[M][2], row_sum[M][2];
#pragma unroll
  for (int m = 0; m < M; ++m) row_max[m][0] = row_max[m][1] = -INFINITY, row_sum[m][0] = row_sum[m][1] = 0.0f;

  for (int64_t j = 0; j < tiles_n; ++j) {
    const int keys = int(min(int64_t(kKeys), tile.n - j * kKeys));
    cp_async_wait<0>();  // this thread's chunks of tile j (and at j = 0 of Q) are in: the only groups in flight
    // Every thread's chunks of tile j are in, and every warp is done with tile j - 1, whose stage tile j + 1 takes.
    __syncthreads();
    if (j + 1 < tiles_n) issue_keys(j + 1);
    if (!warp_active) continue;
    const uint16_t* k_tile = ks(int(j % kStages));
    const uint16_t* v_tile = vs(int(j % kStages));
    // S = Q K^T for this warp's rows and the tile's 64 keys; keys past the segment masked.
    float sc[M][kKeys / 8][4];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) sc[m][nt][0] = sc[m][nt][1] = sc[m][nt][2] = sc[m][nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      // Q's fragments are read again each tile (as FlashAttention-2 does): kept in registers across tiles they
      // would take 40 of the 255 at two m-tiles of a head of 80, leaving the compiler none to overlap loads.
      uint32_t qa[M][4];
#pragma unroll
      for (int m = 0; m < M; ++m)
        ldmatrix_x4(qa[m], qs + (first_row + 16 * m + lane % 16) * kStride<D> + kk * 16 + (lane / 16) * 8);
      add_key_scores_tiles<kKeys, D, M>(sc, qa, k_tile, kk, lane);
    }
    if (keys < kKeys) {
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if (nt * 8 + 2 * t + (c & 1) >= keys) sc[m][nt][c] = -INFINITY;
    }
#pragma unroll
    for (int m = 0; m < M; ++m)  // finite maxima: every tile has a key
      online_softmax_tile<kKeys, D>(sc[m], o[m], row_max[m], row_sum[m]);
    // O += P V, P as bf16 A fragments straight from the S accumulators.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pa[M][4];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        pa[m][0] = pack_bf16(sc[m][2 * kk][0], sc[m][2 * kk][1]);
        pa[m][1] = pack_bf16(sc[m][2 * kk][2], sc[m][2 * kk][3]);
        pa[m][2] = pack_bf16(sc[m][2 * kk + 1][0], sc[m][2 * kk + 1][1]);
        pa[m][3] = pack_bf16(sc[m][2 * kk + 1][2], sc[m][2 * kk + 1][3]);
      }
      add_weighted_values_tiles<D, M>(o, pa, v_tile, kk, lane);
    }
  }
  if (!warp_active) return;

  const int g = lane / 4;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = first_row + 16 * m + g + 8 * rr;
      const float inv = 1.0f / quad_sum(row_sum[m][rr]);  // every lane of the warp takes part (rows past the end too)
      if (row >= queries) continue;
      float* to = out + (tile.row0 + tile.first + row) * int64_t(heads) * head_dim + int64_t(blockIdx.y) * head_dim;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {
        const int col = nt * 8 + 2 * t;  // head_dim is a multiple of 4: col + 1 is in the head when col is
        if (col < head_dim)
          *reinterpret_cast<float2*>(to + col) = make_float2(o[m][nt][2 * rr] * inv, o[m][nt][2 * rr + 1] * inv);
      }
    }
}

// The pre-kernel and the attention kernel for a head padded to D; planes: scratch of plane_elements<D> x 3.
template <int D>
void launch(dim3 grid, cudaStream_t stream, const float* q, const float* k, const float* v, int64_t row_stride,
            int64_t rows, const QueryTile* tiles, int32_t heads, int32_t head_dim, float scale, uint16_t* planes,
            float* out) {
  constexpr size_t bytes = shared_bytes<D>();
  static const bool configured = [] {
    NINFER_CUDA_CHECK(cudaFuncSetAttribute(segment_attention_kernel<D>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    return true;
  }();
  (void)configured;
  launch_chained(segment_planes_kernel<D>, dim3(blocks_for(rows * heads * (D / 8))), dim3(kThreads), 0, stream, q,
                 k, v, row_stride, rows, heads, head_dim, scale * kLog2e, planes);
  launch_chained(segment_attention_kernel<D>, grid, dim3(kAttentionThreads<D>), bytes, stream, planes, rows, tiles,
                 heads, head_dim, out);
}

// The head padded to the next multiple of 16 (the mma's k step).
int padded_head(int32_t head_dim) { return (head_dim + 15) / 16 * 16; }

void launch_padded(int32_t head_dim, dim3 grid, cudaStream_t stream, const float* q, const float* k, const float* v,
                   int64_t row_stride, int64_t rows, const QueryTile* tiles, int32_t heads, float scale,
                   uint16_t* planes, float* out) {
  switch (padded_head(head_dim)) {
    case 16: return launch<16>(grid, stream, q, k, v, row_stride, rows, tiles, heads, head_dim, scale, planes, out);
    case 32: return launch<32>(grid, stream, q, k, v, row_stride, rows, tiles, heads, head_dim, scale, planes, out);
    case 48: return launch<48>(grid, stream, q, k, v, row_stride, rows, tiles, heads, head_dim, scale, planes, out);
    case 64: return launch<64>(grid, stream, q, k, v, row_stride, rows, tiles, heads, head_dim, scale, planes, out);
    case 80: return launch<80>(grid, stream, q, k, v, row_stride, rows, tiles, heads, head_dim, scale, planes, out);
    case 96: return launch<96>(grid, stream, q, k, v, row_stride, rows, tiles, heads, head_dim, scale, planes, out);
    case 112: return launch<112>(grid, stream, q, k, v, row_stride, rows, tiles, heads, head_dim, scale, planes, out);
    case 128: return launch<128>(grid, stream, q, k, v, row_stride, rows, tiles, heads, head_dim, scale, planes, out);
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
  int64_t rows = 0;  // the rows the planes hold: up to the end of the last segment
  for (const RowSegment& s : segments) {
    for (int64_t first = 0; first < s.n; first += kQueryRows) query_tiles.push_back({s.row0, s.n, first});
    if (s.n > 0) rows = std::max(rows, s.row0 + s.n);
  }
  if (query_tiles.empty()) return;
  if (query_tiles.size() > 0x7fffffff) throw EngineError("cuda segment_attention: too many rows for one launch");
  // The longest segments' tiles first, so that the short ones fill in behind them.
  std::stable_sort(query_tiles.begin(), query_tiles.end(),
                   [](const QueryTile& a, const QueryTile& b) { return a.n > b.n; });
  HostTables tables;
  const size_t at = tables.add(query_tiles.data(), query_tiles.size());
  const uint8_t* base = upload(tables);
  if (tables_only()) return;
  const size_t plane_bytes = 3 * size_t(heads) * size_t(rows) * size_t(padded_head(head_dim)) * sizeof(uint16_t);
  auto* planes = reinterpret_cast<uint16_t*>(scratch(segment_planes_, (plane_bytes + 3) / 4));
  launch_padded(head_dim, dim3(unsigned(query_tiles.size()), unsigned(heads)), stream_, q, k, v, row_stride, rows,
                reinterpret_cast<const QueryTile*>(base + at), heads, scale, planes, out);
}

}  // namespace ninfer::cuda
