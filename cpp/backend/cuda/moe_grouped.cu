#include "backend/cuda/moe_grouped.h"

#include <algorithm>
#include <climits>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"

namespace ninfer::cuda {
namespace {

// Work layout of a pass. A block of kWarps warps computes a 16-row tile of one expert's matrix (two matrices, gate
// and up, in the gate/up pass) against that expert's tokens, kNTiles n-tiles of 8 tokens at a time. Lane
// (g = lane / 4, q = lane % 4) holds weight rows g and g + 8 and, per n-tile, token g of it; the columns are split
// in 128-column tiles, lane q taking columns [128 t + 32 q, +32) (tc::Segment), and the warps take interleaved tiles,
// summed in a fixed order at the end: every token's result goes through the same operations whatever the others.
constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kTileCols = 128;
constexpr int kMTile = 16;
// n-tiles per pass over the weights: decode batches (<= 8 rows) have at most 8 tokens per expert, so one n-tile
// and fewer registers; larger batches take kWarps (the final sum gives one n-tile to each warp). A token's result
// does not depend on this (each n-tile's sums are its own), so batches of either kind agree bit for bit.
constexpr int kDecodeNTiles = 1, kPrefillNTiles = kWarps;
constexpr int kDecodeRows = 8;
constexpr int kBucketThreads = 1024;
static_assert(kMoeMaxExperts == kBucketThreads, "the bucketing scan gives each thread one expert");

// The tokens routed to one expert: slots [begin, begin + count) of the permutation.
struct ExpertRun {
  int32_t expert, begin, count;
};

// The routing buffer: the number of runs, the runs (experts in id order), the slot -> pair permutation.
struct Routing {
  int32_t* active;
  ExpertRun* runs;
  int32_t* perm;
};

Routing routing_of(void* base) {
  int32_t* words = static_cast<int32_t*>(base);
  return {words, reinterpret_cast<ExpertRun*>(words + 4), words + 4 + 3 * kMoeMaxExperts};
}

// --- bucketing and the activation split ---

// Inclusive prefix sum over the block of one value per thread (blockDim.x == kBucketThreads).
__device__ uint64_t block_inclusive_scan(uint64_t v) {
  __shared__ uint64_t warp_totals[kBucketThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    uint64_t t = warp_totals[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t n = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += n;
    }
    warp_totals[lane] = t;
  }
  __syncthreads();
  return warp > 0 ? v + warp_totals[warp - 1] : v;
}

// Counts the pairs of each expert, lays the experts with any out in id order (runs), and places every pair in its
// expert's run. Places within a run come from shared atomics, so their order varies; nothing depends on it.
__device__ void bucket_pairs(const int32_t* ids, int64_t pairs, int32_t experts, Routing r) {
  __shared__ int32_t count[kMoeMaxExperts];  // pairs per expert, then each expert's next free slot
  const int e = threadIdx.x;
  count[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int32_t id = ids[p];
    if (id >= 0 && id < experts) atomicAdd(&count[id], 1);
  }
  __syncthreads();
  // One scan carries both the number of non-empty experts before e (high word) and their pairs (low word).
  const int32_t n = count[e];
  const uint64_t mine = (uint64_t(n > 0) << 32) | uint64_t(n);
  const uint64_t inclusive = block_inclusive_scan(mine), before = inclusive - mine;
  if (n > 0) {
    r.runs[before >> 32] = {e, int32_t(before & 0xffffffffu), n};
    count[e] = int32_t(before & 0xffffffffu);
  }
  if (e == kBucketThreads - 1) *r.active = int32_t(inclusive >> 32);
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int32_t id = ids[p];
    if (id >= 0 && id < experts) r.perm[atomicAdd(&count[id], 1)] = int32_t(p);
  }
}

// Block 0 buckets the pairs; the others split x into bf16 hi/lo planes in the gate/up weights' operand order.
template <tc::Order kOrder>
__global__ void __launch_bounds__(kBucketThreads)
    prepare_kernel(const float* x, int64_t rows, int64_t hidden, const int32_t* ids, int64_t pairs, int32_t experts,
                   Routing routing, uint16_t* x_hi, uint16_t* x_lo) {
  chain_start();
  if (blockIdx.x == 0) {
    bucket_pairs(ids, pairs, experts, routing);
    return;
  }
  const int64_t n = rows * hidden, stride = int64_t(gridDim.x - 1) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x - 1) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t segment = i / tc::kSegmentCols * tc::kSegmentCols;
    tc::split_bf16(x[segment + tc::source_column(kOrder, int(i % tc::kSegmentCols))], x_hi[i], x_lo[i]);
  }
}

// --- the expert passes ---

struct PassArgs {
  WeightRef w[2];          // gate and up (gate/up pass), or down in w[0]
  int64_t n, k;            // each expert matrix's rows and columns
  int64_t m_tiles;         // 16-row tiles per expert matrix
  const uint16_t* b_hi;    // B rows: x (gate/up pass, row = pair / top_k) or the SwiGLU output (down, by slot)
  const uint16_t* b_lo;
  Routing routing;
  int32_t top_k;
  uint16_t* h_hi;          // gate/up pass: silu(gate) * up per slot, split in the down weights' operand order
  uint16_t* h_lo;
  float* y;                // down pass: [pairs, n]
};

template <Encoding E, int kMats>
struct Tile {
  tc::Segment<E> row[kMats][2];
};

template <Encoding E, int kMats>
__device__ __forceinline__ void load_tile(const PassArgs& a, const int64_t (&row)[2], int64_t col0,
                                          Tile<E, kMats>& t) {
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) tc::load_segment<E>(a.w[m], row[h], col0, t.row[m][h]);
}

// acc[m][nt] (the C fragments: rows g, g + 8 x tokens 2q, 2q + 1 of n-tile nt) += this tile's products with the
// B rows b_row (x or h split into bf16 hi and lo: two products per weight keep f32-like accuracy).
template <Encoding E, int kMats, int kNTiles>
__device__ __forceinline__ void multiply_tile(const PassArgs& a, const Tile<E, kMats>& w, int64_t col0,
                                              const int64_t (&b_row)[kNTiles], int n_tiles,
                                              float (&acc)[kMats][kNTiles][4]) {
  constexpr bool kGrouped = E == Encoding::INT4 || E == Encoding::INT8;  // one group per 128-column tile
  uint32_t ops[kMats][2][16];
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) tc::bf16_pairs<E>(w.row[m][h], ops[m][h]);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    if (nt >= n_tiles) break;
    uint4 hi[4], lo[4];
    if (b_row[nt] >= 0) {
      const uint4* ph = reinterpret_cast<const uint4*>(a.b_hi + b_row[nt] * a.k + col0);
      const uint4* pl = reinterpret_cast<const uint4*>(a.b_lo + b_row[nt] * a.k + col0);
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        hi[v] = __ldg(ph + v);
        lo[v] = __ldg(pl + v);
      }
    } else {
#pragma unroll
      for (int v = 0; v < 4; ++v) hi[v] = lo[v] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
      float tile_sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      float (&c)[4] = kGrouped ? tile_sum : acc[m][nt];
      const uint32_t(&a0)[16] = ops[m][0];
      const uint32_t(&a1)[16] = ops[m][1];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        tc::mma_bf16_16816(c, a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1], tc::word(hi, 2 * j),
                           tc::word(hi, 2 * j + 1));
        tc::mma_bf16_16816(c, a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1], tc::word(lo, 2 * j),
                           tc::word(lo, 2 * j + 1));
      }
      if constexpr (kGrouped) {
        acc[m][nt][0] = fmaf(w.row[m][0].group_scale, tile_sum[0], acc[m][nt][0]);
        acc[m][nt][1] = fmaf(w.row[m][0].group_scale, tile_sum[1], acc[m][nt][1]);
        acc[m][nt][2] = fmaf(w.row[m][1].group_scale, tile_sum[2], acc[m][nt][2]);
        acc[m][nt][3] = fmaf(w.row[m][1].group_scale, tile_sum[3], acc[m][nt][3]);
      }
    }
  }
}

// A decode down pass has many small blocks (each streams 16 x K weights, K = 512 at 35B-A3B) and little else in
// registers: at most 128 (ptxas: no or a few bytes of spill), so that 4 blocks fit per SM and more of them have
// their loads in flight at once.
template <Encoding E, bool kGateUp, int kNTiles>
__global__ void __launch_bounds__(kBlockThreads, !kGateUp && kNTiles == kDecodeNTiles ? 4 : 1)
    expert_pass_kernel(PassArgs a) {
  chain_start();
  static_assert(kNTiles <= kWarps, "the final sum gives each n-tile to one warp");
  constexpr int kMats = kGateUp ? 2 : 1, kChunk = 8 * kNTiles;
  const int64_t item = blockIdx.x / a.m_tiles, m_tile = blockIdx.x % a.m_tiles;
  if (item >= *a.routing.active) return;
  const ExpertRun run = a.routing.runs[item];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int64_t m0 = m_tile * kMTile, first_row = int64_t(run.expert) * a.n;
  // Rows past the end load the last row (their results are not written).
  const int64_t row[2] = {first_row + min(m0 + g, a.n - 1), first_row + min(m0 + g + 8, a.n - 1)};
  const int64_t tiles = a.k / kTileCols, lane_col = q * tc::kSegmentCols;
  __shared__ float partial[kWarps][kMats][kNTiles][4][32];

  for (int32_t chunk = 0; chunk < run.count; chunk += kChunk) {
    const int n_tiles = min(kNTiles, (run.count - chunk + 7) / 8);
    // This lane's B row in each n-tile; -1 past the expert's tokens (zeros).
    int64_t b_row[kNTiles];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int32_t token = chunk + nt * 8 + g;
      const int32_t slot = run.begin + token;
      b_row[nt] = token >= run.count ? -1 : (kGateUp ? a.routing.perm[slot] / a.top_k : slot);
    }
    float acc[kMats][kNTiles][4] = {};
    // Two register stages: the next tile's weights are in flight while this one is multiplied.
    Tile<E, kMats> even, odd;
    int64_t t = warp;
    if (t < tiles) load_tile<E, kMats>(a, row, t * kTileCols + lane_col, even);
    for (; t < tiles; t += 2 * kWarps) {
      if (t + kWarps < tiles) load_tile<E, kMats>(a, row, (t + kWarps) * kTileCols + lane_col, odd);
      multiply_tile<E, kMats, kNTiles>(a, even, t * kTileCols + lane_col, b_row, n_tiles, acc);
      if (t + kWarps >= tiles) break;
      if (t + 2 * kWarps < tiles) load_tile<E, kMats>(a, row, (t + 2 * kWarps) * kTileCols + lane_col, even);
      multiply_tile<E, kMats, kNTiles>(a, odd, (t + kWarps) * kTileCols + lane_col, b_row, n_tiles, acc);
    }

    // The warps' sums in a fixed order; warp w finishes n-tile w.
#pragma unroll
    for (int m = 0; m < kMats; ++m)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[warp][m][nt][i][lane] = acc[m][nt][i];
    __syncthreads();
    if (warp < n_tiles) {
      float total[kMats][4];
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          total[m][i] = partial[0][m][warp][i][lane];
#pragma unroll
          for (int w = 1; w < kWarps; ++w) total[m][i] += partial[w][m][warp][i][lane];
        }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t out_row = m0 + g + (i >= 2 ? 8 : 0);
        const int32_t token = chunk + warp * 8 + 2 * q + (i & 1);
        if (out_row >= a.n || token >= run.count) continue;
        const int32_t slot = run.begin + token;
        const int64_t weight_row = first_row + out_row;
        if constexpr (kGateUp) {
          const float gate = total[0][i] * tc::row_scale<E>(a.w[0], weight_row);
          const float up = total[1][i] * tc::row_scale<E>(a.w[1], weight_row);
          const int64_t at = int64_t(slot) * a.n + out_row / tc::kSegmentCols * tc::kSegmentCols +
                             tc::operand_slot(tc::order<E>(), int(out_row % tc::kSegmentCols));
          tc::split_bf16(silu(gate) * up, a.h_hi[at], a.h_lo[at]);
        } else {
          a.y[int64_t(a.routing.perm[slot]) * a.n + out_row] = total[0][i] * tc::row_scale<E>(a.w[0], weight_row);
        }
      }
    }
    __syncthreads();  // `partial` is free for the next chunk
  }
}

// The two passes' arguments: gate/up reads x's planes and writes h's; down reads h's and writes y.
struct Passes {
  PassArgs gate_up, down;
};

Passes pass_args(int64_t rows, int64_t hidden, int32_t top_k, const TensorView& gate, const TensorView& up,
                 const TensorView& down, const MoeScratch& scratch, float* y) {
  const int64_t inter = gate.rows(), pairs = rows * top_k;
  uint16_t* x_hi = static_cast<uint16_t*>(scratch.x_split);
  uint16_t* h_hi = static_cast<uint16_t*>(scratch.h_split);
  Passes p{};
  PassArgs& a = p.gate_up;
  a.w[0] = weight_ref(gate);
  a.w[1] = weight_ref(up);
  a.n = inter;
  a.k = hidden;
  a.b_hi = x_hi;
  a.b_lo = x_hi + rows * hidden;
  a.h_hi = h_hi;
  a.h_lo = h_hi + pairs * inter;
  PassArgs& d = p.down;
  d.w[0] = weight_ref(down);
  d.n = hidden;
  d.k = inter;
  d.b_hi = h_hi;
  d.b_lo = h_hi + pairs * inter;
  d.y = y;
  for (PassArgs* pass : {&a, &d}) {
    pass->m_tiles = (pass->n + kMTile - 1) / kMTile;
    pass->routing = routing_of(scratch.routing);
    pass->top_k = top_k;
  }
  return p;
}

template <Encoding E, int kNTiles>
void launch_passes(const Passes& p, int64_t items, cudaStream_t stream) {
  launch_chained(expert_pass_kernel<E, true, kNTiles>, dim3(unsigned(items * p.gate_up.m_tiles)), dim3(kBlockThreads),
                 0, stream, p.gate_up);
  launch_chained(expert_pass_kernel<E, false, kNTiles>, dim3(unsigned(items * p.down.m_tiles)), dim3(kBlockThreads), 0,
                 stream, p.down);
}

template <Encoding E>
void launch(const float* x, int64_t rows, int64_t hidden, const int32_t* ids, int32_t top_k, const TensorView& gate,
            const TensorView& up, const TensorView& down, const MoeScratch& scratch, float* y, cudaStream_t stream) {
  const int64_t experts = gate.matrices(), pairs = rows * top_k;
  const Passes p = pass_args(rows, hidden, top_k, gate, up, down, scratch, y);
  const int64_t split_blocks = std::min<int64_t>((rows * hidden + kBucketThreads - 1) / kBucketThreads, 2048);
  launch_chained(prepare_kernel<tc::order<E>()>, dim3(unsigned(1 + split_blocks)), dim3(kBucketThreads), 0, stream, x,
                 rows, hidden, ids, pairs, int32_t(experts), p.gate_up.routing, const_cast<uint16_t*>(p.gate_up.b_hi),
                 const_cast<uint16_t*>(p.gate_up.b_lo));
  // Enough blocks for every expert that can have tokens; those past the active count return at once.
  const int64_t items = std::min(experts, pairs);
  if (rows <= kDecodeRows) {
    launch_passes<E, kDecodeNTiles>(p, items, stream);
  } else {
    launch_passes<E, kPrefillNTiles>(p, items, stream);
  }
}

bool takes_encoding(const TensorView& w) {
  switch (w.encoding) {
    case Encoding::INT4:
    case Encoding::INT8: return w.group_size > 0 && w.group_size % kTileCols == 0;
    case Encoding::FP8_E4M3:
    case Encoding::NVFP4:
    case Encoding::BF16: return true;
    default: return false;
  }
}

}  // namespace

bool moe_grouped_supports(const TensorView& gate, const TensorView& up, const TensorView& down, int64_t hidden) {
  const int64_t experts = gate.matrices(), inter = gate.rows();
  const bool shapes = gate.shape.size() == 3 && up.shape == gate.shape && down.shape.size() == 3 &&
                      down.shape[0] == experts && down.rows() == hidden && down.cols() == inter &&
                      gate.cols() == hidden;
  const bool one_encoding = up.encoding == gate.encoding && down.encoding == gate.encoding &&
                            up.group_size == gate.group_size && down.group_size == gate.group_size;
  return shapes && one_encoding && takes_encoding(gate) && hidden % kTileCols == 0 && inter % kTileCols == 0 &&
         experts <= kMoeMaxExperts;
}

size_t moe_grouped_x_split_bytes(int64_t rows, int64_t hidden) { return size_t(rows * hidden) * 2 * sizeof(uint16_t); }
size_t moe_grouped_h_split_bytes(int64_t pairs, int64_t inter) { return size_t(pairs * inter) * 2 * sizeof(uint16_t); }
size_t moe_grouped_routing_bytes(int64_t pairs) { return size_t(4 + 3 * kMoeMaxExperts + pairs) * sizeof(int32_t); }

void moe_grouped_experts(const float* x, int64_t rows, int64_t hidden, const int32_t* ids, int32_t top_k,
                         const TensorView& gate, const TensorView& up, const TensorView& down,
                         const MoeScratch& scratch, float* y, cudaStream_t stream) {
  if (rows <= 0) return;
  if (!moe_grouped_supports(gate, up, down, hidden))
    throw EngineError("moe_grouped_experts: the grouped path does not take " + gate.name + " / " + up.name + " / " +
                      down.name);
  const int64_t m_tiles = (std::max(gate.rows(), hidden) + kMTile - 1) / kMTile;
  if (rows * top_k > INT32_MAX || std::min(gate.matrices(), rows * top_k) * m_tiles > INT32_MAX)
    throw EngineError("moe_grouped_experts: " + std::to_string(rows) + " rows exceed one launch");
  switch (gate.encoding) {
    case Encoding::INT4: return launch<Encoding::INT4>(x, rows, hidden, ids, top_k, gate, up, down, scratch, y, stream);
    case Encoding::INT8: return launch<Encoding::INT8>(x, rows, hidden, ids, top_k, gate, up, down, scratch, y, stream);
    case Encoding::FP8_E4M3:
      return launch<Encoding::FP8_E4M3>(x, rows, hidden, ids, top_k, gate, up, down, scratch, y, stream);
    case Encoding::NVFP4:
      return launch<Encoding::NVFP4>(x, rows, hidden, ids, top_k, gate, up, down, scratch, y, stream);
    default: return launch<Encoding::BF16>(x, rows, hidden, ids, top_k, gate, up, down, scratch, y, stream);
  }
}

}  // namespace ninfer::cuda
