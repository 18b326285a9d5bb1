#include "backend/cuda/gemv_mma.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <span>
#include <string>
#include <type_traits>

#include "backend/cuda/activation_split.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemv.h"

namespace ninfer::cuda {
namespace {

// Work layout. A warp computes one 16-row m-tile of W against all (up to 8) activation rows, one tile of 128
// columns at a time: lane (g = lane / 4, q = lane % 4) holds weight rows g and g + 8, columns
// [128 t + 32 q, 128 t + 32 q + 32) — one 16-byte load per row for 4-bit codes — and the activations of row g over
// the same columns. mma.sync.m16n8k16 sums over k-slots shared by the four lanes of a quad; which source column
// sits in which slot does not matter as long as the activations use the same assignment, so each lane keeps its
// 32 columns in the order its dequantization produces them (tc::Order) and the activations are pre-permuted.
// A block's 4 warps take interleaved tiles of the block's column range; blocks along y split the columns further
// when there are too few m-tiles to fill the device.
constexpr int kTileCols = 128;
constexpr int kLaneCols = tc::kSegmentCols;
constexpr int kMTile = 16;
constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kPartialSlots = 2048;  // blocks of a split launch: partial sums (128 floats each) and counters

// --- activations: hi/lo 16-bit planes in operand order, and a power-of-two scale per row (fp16 only) ---

// Blocks of kSplitThreads along each row's columns (kSplitCols each), rows along y. fp16: the row is scaled by 2^e
// so that max |x| lands in [2^14, 2^15) (fp16's largest finite value is 65504); e is recorded and undone on the
// outputs. Every block of a row finds max |x| over the whole row itself (a few KiB from L2; max is exact, so the
// blocks agree on e), so no block waits for another; the loads are unrolled so that a row takes one or two
// memory round trips rather than one per value a thread reads.
constexpr int kSplitThreads = 512, kSplitCols = 4 * kSplitThreads;

__device__ __forceinline__ float abs_max4(float4 v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

template <bool kBf16, tc::Order kOrder>
__global__ void __launch_bounds__(kSplitThreads) split_activations_kernel(const float* x, int64_t cols, uint16_t* hi,
                                                                         uint16_t* lo, int* exps) {
  chain_start();
  const int64_t r = blockIdx.y;
  const float* xr = x + r * cols;
  int e = 0;
  if constexpr (!kBf16) {
    float amax = 0.0f;
    if (reinterpret_cast<uintptr_t>(xr) % 16 == 0) {  // cols is a multiple of 128
#pragma unroll 8
      for (int64_t i = threadIdx.x; i < cols / 4; i += kSplitThreads)
        amax = fmaxf(amax, abs_max4(__ldg(reinterpret_cast<const float4*>(xr) + i)));
    } else {
#pragma unroll 8
      for (int64_t i = threadIdx.x; i < cols; i += kSplitThreads) amax = fmaxf(amax, fabsf(xr[i]));
    }
    e = fp16_row_exponent(block_reduce(amax, MaxOp{}));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) exps[r] = e;
  const int64_t begin = int64_t(blockIdx.x) * kSplitCols;
  split_columns<kBf16, kOrder>(xr, begin, min(cols, begin + kSplitCols), kSplitThreads, ldexpf(1.0f, e), hi + r * cols,
                               lo + r * cols);
}

// --- weights: registers straight into operand pairs ---

__device__ __forceinline__ uint32_t word_of(const uint4* v, int i) {
  const uint4& u = v[i / 4];
  const int k = i % 4;
  return k == 0 ? u.x : (k == 1 ? u.y : (k == 2 ? u.z : u.w));
}

__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
  const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// fp16 bits of 2x the e2m1 magnitudes (0, 1, 2, 3, 4, 6, 8, 12): high bytes, low nibble codes 0..7.
constexpr uint32_t kE2m1HighBytesLo = 0x42403C00u, kE2m1HighBytesHi = 0x4A484644u;

// Per-tile, per-row data besides the codes: the group's scale and 1024 + zero (int), the two block scales
// (nvfp4, as fp16 pairs, halved: the codes are doubled).
struct RowExtra {
  float scale = 1.0f;
  uint32_t bias2 = 0, block_scale[2] = {0, 0};
};

// The 16 operand pairs (pair order of E) of one row's 32 values; integer codes come out minus their zero point,
// nvfp4 codes times their block scale (both exact in fp16).
template <Encoding E>
__device__ __forceinline__ void operands(const uint4 (&w)[tc::segment_vectors<E>()], const RowExtra& extra,
                                         uint32_t (&a)[16]) {
#pragma unroll
  for (int p = 0; p < 16; ++p) {
    if constexpr (E == Encoding::INT4) {
      const uint32_t codes = ((word_of(w, p / 4) >> (4 * (p % 4))) & 0x000F000Fu) | 0x64006400u;  // 1024 + q
      a[p] = hsub2_bits(codes, extra.bias2);
    } else if constexpr (E == Encoding::INT8) {
      const uint32_t codes = ((word_of(w, p / 2) >> (8 * (p % 2))) & 0x00FF00FFu) | 0x64006400u;
      a[p] = hsub2_bits(codes, extra.bias2);
    } else if constexpr (E == Encoding::FP8_E4M3) {
      const uint32_t bytes = (word_of(w, p / 2) >> (16 * (p % 2))) & 0xFFFFu;
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(bytes), __NV_E4M3);
      a[p] = uint32_t(h.x) | (uint32_t(h.y) << 16);
    } else if constexpr (E == Encoding::NVFP4) {
      const uint32_t u = word_of(w, p / 4) >> (4 * (p % 4));  // codes of the pair at bits 0-3 and 16-19
      const uint32_t select = ((u << 4) & 0x70u) | ((u >> 4) & 0x7000u);
      const uint32_t magnitudes = __byte_perm(kE2m1HighBytesLo, kE2m1HighBytesHi, select);
      const uint32_t value = magnitudes | ((u << 12) & 0x80008000u);
      a[p] = hmul2_bits(value, extra.block_scale[p / 8]);
    } else {  // BF16: the stored pairs are the operands
      a[p] = word_of(w, p);
    }
  }
}

template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// One weight of a launch. A launch runs up to kMaxWeights weights of one encoding and width on the same split
// activations (a layer's projections); its blocks are numbered weight by weight, m-tile by m-tile, split by split.
constexpr int kMaxWeights = 4;
struct WeightSlice {
  const uint8_t* q = nullptr;
  const uint8_t* scale = nullptr;
  const uint8_t* zero = nullptr;
  float global_scale = 1.0f;
  float* y = nullptr;
  int64_t n = 0;
  int32_t group_size = 0, splits = 1;
  int64_t first_block = 0;    // the launch's first block for this weight
  int64_t first_partial = 0;  // its first partial-sum slot (m-tile x split)
  int64_t first_counter = 0;  // its first arrival counter (m-tile)
};

struct MmaArgs {
  WeightSlice w[kMaxWeights];
  int32_t count;
  const uint16_t* x_hi;
  const uint16_t* x_lo;
  const int* exps;
  const float* x;  // v5 with bf16 weights: the f32 activations, split in registers (no planes)
  bool x_vectors;  // x is 16-byte aligned
  float* partials;
  unsigned* counters;
  int64_t k;
  int32_t rows;
};

// What one lane loads for one tile: its two weight rows' codes and extras, and activation row g's operands.
template <Encoding E>
struct Stage {
  uint4 w[2][tc::segment_vectors<E>()];
  RowExtra extra[2];
  uint4 x_hi[4], x_lo[4];
};

template <Encoding E>
__device__ __forceinline__ void load_stage(const MmaArgs& a, const WeightSlice& w, const int64_t (&row)[2], int g,
                                           int q, int64_t tile, Stage<E>& s) {
  constexpr int kVectors = tc::segment_vectors<E>();
  const int64_t col0 = tile * kTileCols + q * kLaneCols;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* p = w.q + (row[h] * a.k + col0) * tc::code_bits<E>() / 8;
#pragma unroll
    for (int v = 0; v < kVectors; ++v) s.w[h][v] = tc::load_streaming(p + 16 * v);
    if constexpr (E == Encoding::INT4 || E == Encoding::INT8) {
      const int64_t group = row[h] * (a.k / kTileCols) + tile;  // one group per tile (group_size == 128)
      s.extra[h].scale = __half2float(reinterpret_cast<const __half*>(w.scale)[group]);
      const __half bias = __ushort2half_rn(uint16_t(1024u + w.zero[group]));
      const __half2 bias2 = __halves2half2(bias, bias);
      s.extra[h].bias2 = *reinterpret_cast<const uint32_t*>(&bias2);
    } else if constexpr (E == Encoding::NVFP4) {
      const uint8_t* block = w.scale + row[h] * (a.k / 16) + col0 / 16;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const __half half_scale = __hmul(__half(__nv_cvt_fp8_to_halfraw(block[b], __NV_E4M3)), __float2half(0.5f));
        const __half2 pair = __halves2half2(half_scale, half_scale);
        s.extra[h].block_scale[b] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    }
  }
  if (g < a.rows) {
    const uint4* hi = reinterpret_cast<const uint4*>(a.x_hi + g * a.k + col0);
    const uint4* lo = reinterpret_cast<const uint4*>(a.x_lo + g * a.k + col0);
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      s.x_hi[v] = __ldg(hi + v);
      s.x_lo[v] = __ldg(lo + v);
    }
  } else {
#pragma unroll
    for (int v = 0; v < 4; ++v) s.x_hi[v] = s.x_lo[v] = make_uint4(0, 0, 0, 0);
  }
}

// acc (the C fragment: rows g, g+8 x activation rows 2q, 2q+1) += this tile's products.
template <Encoding E>
__device__ __forceinline__ void compute_stage(const Stage<E>& s, float (&acc)[4]) {
  constexpr bool kBf16 = E == Encoding::BF16;
  constexpr bool kGrouped = E == Encoding::INT4 || E == Encoding::INT8;
  uint32_t a0[16], a1[16];
  operands<E>(s.w[0], s.extra[0], a0);
  operands<E>(s.w[1], s.extra[1], a1);
  float tile[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float (&c)[4] = kGrouped ? tile : acc;  // grouped codes: one group per tile, scaled below
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    mma_16816<kBf16>(c, a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1], word_of(s.x_hi, 2 * j),
                     word_of(s.x_hi, 2 * j + 1));
    mma_16816<kBf16>(c, a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1], word_of(s.x_lo, 2 * j),
                     word_of(s.x_lo, 2 * j + 1));
  }
  if constexpr (kGrouped) {
    acc[0] = fmaf(s.extra[0].scale, tile[0], acc[0]);
    acc[1] = fmaf(s.extra[0].scale, tile[1], acc[1]);
    acc[2] = fmaf(s.extra[1].scale, tile[2], acc[2]);
    acc[3] = fmaf(s.extra[1].scale, tile[3], acc[3]);
  }
}

// This block's weight of the launch, its index among that weight's blocks, its m-tile and its column split.
struct BlockWork {
  WeightSlice w;
  int64_t local, m_tile, split;
};

__device__ __forceinline__ BlockWork block_work(const MmaArgs& a) {
  BlockWork b{a.w[0], 0, 0, 0};
#pragma unroll
  for (int i = 1; i < kMaxWeights; ++i)
    if (i < a.count && int64_t(blockIdx.x) >= a.w[i].first_block) b.w = a.w[i];
  b.local = int64_t(blockIdx.x) - b.w.first_block;
  b.m_tile = b.local / b.w.splits;
  b.split = b.local % b.w.splits;
  return b;
}

// Where one of a lane's accumulated values lands: the weight (output) row and the activation row.
struct OutputSlot {
  int64_t out_row;
  int act_row;
};

// The end of a block: sums its warps' values (kValues per lane) in a fixed order, then, when the columns were split
// over blocks, the last-arriving block of the m-tile sums every block's partials in split order; writes y with the
// encoding's per-row or global scale applied and the activation row's exponent undone. slot(i): value i's output.
template <Encoding E, int kValues, class Slot>
__device__ __forceinline__ void finish_block(const MmaArgs& a, const WeightSlice& w, int64_t local, int64_t m_tile,
                                             const float (&acc)[kValues], Slot slot) {
  static_assert(kValues <= 4, "a partial-sum slot holds 4 values per lane");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float warp_sums[kWarps][32][kValues];
#pragma unroll
  for (int i = 0; i < kValues; ++i) warp_sums[warp][lane][i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float total[kValues];
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    total[i] = warp_sums[0][lane][i];
#pragma unroll
    for (int v = 1; v < kWarps; ++v) total[i] += warp_sums[v][lane][i];
  }
  if (w.splits > 1) {
    float* mine = a.partials + (w.first_partial + local) * 128 + lane * 4;
#pragma unroll
    for (int i = 0; i < kValues; ++i) mine[i] = total[i];
    // Lanes of a warp are not guaranteed to run in step, so warp barriers order the lanes: every lane's partials
    // are fenced before lane 0's atomic arrives, and the last block's lanes read after lane 0's atomic and fence.
    __threadfence();
    __syncwarp();
    unsigned ticket = 0;
    unsigned* counter = a.counters + w.first_counter + m_tile;
    if (lane == 0) ticket = atomicAdd(counter, 1u);
    ticket = __shfl_sync(0xffffffffu, ticket, 0);
    if (ticket != unsigned(w.splits - 1)) return;  // not the last block of this m-tile
    __threadfence();
    __syncwarp();
    const float* all = a.partials + (w.first_partial + m_tile * w.splits) * 128 + lane * 4;
#pragma unroll
    for (int i = 0; i < kValues; ++i) total[i] = __ldcg(all + i);
    for (int s = 1; s < w.splits; ++s)
#pragma unroll
      for (int i = 0; i < kValues; ++i) total[i] += __ldcg(all + s * 128 + i);
    if (lane == 0) *counter = 0;  // ready for the next launch
  }
#pragma unroll
  for (int i = 0; i < kValues; ++i) {
    const OutputSlot o = slot(i);
    if (o.out_row >= w.n || o.act_row >= a.rows) continue;
    float post = 1.0f;
    if constexpr (E == Encoding::FP8_E4M3) post = reinterpret_cast<const float*>(w.scale)[o.out_row];
    if constexpr (E == Encoding::NVFP4) post = w.global_scale;
    if constexpr (E != Encoding::BF16) post = ldexpf(post, -a.exps[o.act_row]);
    w.y[o.act_row * w.n + o.out_row] = total[i] * post;
  }
}

template <Encoding E>
__global__ void __launch_bounds__(kBlockThreads) gemv_mma_kernel(MmaArgs a) {
  chain_start();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const BlockWork b = block_work(a);
  const WeightSlice& w = b.w;
  const int64_t local = b.local, m_tile = b.m_tile, split = b.split;
  const int64_t m0 = m_tile * kMTile;
  // Rows past the end load the last row (their results are not written).
  const int64_t row[2] = {min(m0 + g, w.n - 1), min(m0 + g + 8, w.n - 1)};
  const int64_t tiles = a.k / kTileCols;
  const int64_t first = split * tiles / w.splits, last = (split + 1) * tiles / w.splits;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // Two register stages: the next tile's loads are in flight while this one is multiplied.
  Stage<E> even, odd;
  int64_t t = first + warp;
  if (t < last) load_stage<E>(a, w, row, g, q, t, even);
  for (; t < last; t += 2 * kWarps) {
    if (t + kWarps < last) load_stage<E>(a, w, row, g, q, t + kWarps, odd);
    compute_stage<E>(even, acc);
    if (t + kWarps >= last) break;
    if (t + 2 * kWarps < last) load_stage<E>(a, w, row, g, q, t + 2 * kWarps, even);
    compute_stage<E>(odd, acc);
  }

  // v3's C fragment: rows g, g + 8 (i >= 2) x activation rows 2q, 2q + 1 (i odd).
  finish_block<E, 4>(a, w, local, m_tile, acc, [&](int i) {
    return OutputSlot{m0 + g + (i >= 2 ? 8 : 0), 2 * q + (i & 1)};
  });
}

// --- v5: 16-byte chunks in a register ring, the activations' hi and lo parts in one mma ---
//
// A chunk is 16 bytes of each of a lane's two weight rows (g and g + 8): 32 values of int4/nvfp4, 16 of
// int8/fp8, 8 of bf16; the 4 lanes of a quad cover chunk_cols() consecutive columns, so a warp's chunk is 16 rows
// x 64 bytes whatever the encoding. Every lane keeps kRing chunks in flight in registers (the chunk loop is
// unrolled by the ring, so every register index is static); kBlocksPerSm blocks of 4 warps fit on an SM, i.e.
// 16 warps x 32 lanes x 3-4 chunks x 32 bytes = 48-64 KiB of weights in flight per SM. (An L2 prefetch of 8 chunks
// beyond the ring was measured in session 5 and made every shape slower: bf16 q_proj 86% -> 61% of read BW.)
// The activations' hi and lo planes share one mma: B column 2r holds activation row r's hi part and column 2r + 1
// its lo part (lane g loads plane g % 2 of row g / 2), so up to 4 rows take one mma per 16 columns and 5..8 rows
// a second set; hi and lo products meet in f32 at the end. Activation fragments come straight from L1/L2 (the
// whole activation vector is a few KiB per row and every block of the SM reads the same one).
constexpr int kRing = 4;
// 5..8 rows hold a second set of activation fragments and accumulators: a ring of 3 keeps them within the registers.
template <int kSets>
__host__ __device__ constexpr int ring_depth() { return kSets == 1 ? kRing : kRing - 1; }
constexpr int kBlocksPerSm = 4;  // <= 128 registers per lane

template <Encoding E>
__host__ __device__ constexpr int chunk_values() { return 128 / tc::code_bits<E>(); }  // per lane and row
template <Encoding E>
__host__ __device__ constexpr int chunk_cols() { return 4 * chunk_values<E>(); }
template <Encoding E>
__host__ __device__ constexpr int chunk_pairs() { return chunk_values<E>() / 2; }
constexpr int kChunkBytes = 64;  // per weight row and warp

// One chunk as a lane holds it: the codes of its two rows and, per row, what the encoding needs besides them:
// int4/int8 the group's fp16 scale bits and zero byte, nvfp4 the two e4m3 block scales (one 16-bit load).
template <Encoding E>
struct Chunk {
  uint4 w[2];
  uint32_t scale[2], zero[2];
};

constexpr int kCodeStride = kChunkBytes * kWarps;  // bytes of a row's codes from chunk i to i + 1

// Chunks a quantization group spans (int4/int8): int4 g128 and int8 g64 one, int8 g128 two. int8 g64 is the
// lm_head's encoding in the groupwise-int recipes (248k x 2048 or 5120: ~30% of a 35B-A3B step's bytes).
template <Encoding E>
__host__ __device__ constexpr int default_group_chunks() { return E == Encoding::INT8 ? 2 : 1; }

// Bytes from chunk i to i + 1 of a row's scales (int4/int8: fp16 group scales, a group being kGroupChunks chunks;
// nvfp4: e4m3 block scales of 16 values) and zero points (int4/int8).
template <Encoding E, int kGroupChunks>
__host__ __device__ constexpr int zero_stride() { return kWarps / kGroupChunks; }
template <Encoding E, int kGroupChunks>
__host__ __device__ constexpr int scale_stride() {
  return E == Encoding::NVFP4 ? chunk_cols<E>() / 16 * kWarps : 2 * zero_stride<E, kGroupChunks>();
}

// Where a lane's chunks are: its pointers at some chunk i of its stream (the warp takes every kWarps-th chunk of
// the block's range); chunk i + r is r fixed strides further, so the unrolled ring addresses it by immediate
// offsets and the pointers move once per turn of the ring.
template <Encoding E, int kGroupChunks>
struct ChunkStream {
  static constexpr bool kScales = E == Encoding::INT4 || E == Encoding::INT8 || E == Encoding::NVFP4;
  static constexpr bool kZeros = E == Encoding::INT4 || E == Encoding::INT8;
  const uint8_t* w[2];
  const uint8_t* scale[2] = {nullptr, nullptr};
  const uint8_t* zero[2] = {nullptr, nullptr};

  __device__ __forceinline__ void advance(int chunks) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      w[h] += chunks * kCodeStride;
      if constexpr (kScales) scale[h] += chunks * scale_stride<E, kGroupChunks>();
      if constexpr (kZeros) zero[h] += chunks * zero_stride<E, kGroupChunks>();
    }
  }
};


__device__ __forceinline__ uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c) {
  const __half2 r = __hfma2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b),
                            *reinterpret_cast<const __half2*>(&c));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Chunk i + r of the stream (r known at compile time in the unrolled ring).
template <Encoding E, int kGroupChunks>
__device__ __forceinline__ void load_chunk(const ChunkStream<E, kGroupChunks>& s, int r, Chunk<E>& c) {
  using Stream = ChunkStream<E, kGroupChunks>;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    c.w[h] = tc::load_streaming(s.w[h] + r * kCodeStride);
    if constexpr (Stream::kScales)
      c.scale[h] = __ldg(reinterpret_cast<const uint16_t*>(s.scale[h] + r * scale_stride<E, kGroupChunks>()));
    if constexpr (Stream::kZeros) c.zero[h] = __ldg(s.zero[h] + r * zero_stride<E, kGroupChunks>());
  }
}

// (a & kMask) | bits in one LOP3 (written in C++, the compiler emits an AND and an OR: LOP3 takes one immediate).
template <uint32_t kMask>
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t bits) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(kMask), "r"(bits));
  return d;
}

// fp16 bits of 1/16 and 960, twice.
constexpr uint32_t kSixteenth2 = 0x2C002C00u, kNineSixty2 = 0x63806380u;

// The chunk_pairs() operand pairs of one row's chunk, in the pair order of E (the activations are permuted to
// match); integer codes come out minus their zero point, nvfp4 codes times their block scale (both exact in fp16).
template <Encoding E>
__device__ __forceinline__ void chunk_operands(const uint4& w, uint32_t scale, uint32_t zero,
                                               uint32_t (&a)[chunk_pairs<E>()]) {
  const uint32_t word[4] = {w.x, w.y, w.z, w.w};
  if constexpr (E == Encoding::INT4) {
    // Word k holds pairs 4k + i = nibbles (i, i + 4). Even i: the nibbles at bits 0-3 of each half, OR 1024 ->
    // 1024 + q, minus 1024 + z. Odd i: bits 4-7 -> 1024 + 16 q, times 1/16 minus 64 + z in one HFMA2. One shift
    // per word reaches i = 2, 3.
    const uint32_t minus_low = (0x6400u | zero) * 0x10001u;    // 1024 + z (subtracted)
    const uint32_t minus_high = hsub2_bits(kNineSixty2, minus_low);  // 960 - (1024 + z) = -(64 + z)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = word[k], v = u >> 8;
      a[4 * k] = hsub2_bits(and_or<0x000F000Fu>(u, 0x64006400u), minus_low);
      a[4 * k + 1] = hfma2_bits(and_or<0x00F000F0u>(u, 0x64006400u), kSixteenth2, minus_high);
      a[4 * k + 2] = hsub2_bits(and_or<0x000F000Fu>(v, 0x64006400u), minus_low);
      a[4 * k + 3] = hfma2_bits(and_or<0x00F000F0u>(v, 0x64006400u), kSixteenth2, minus_high);
    }
  } else if constexpr (E == Encoding::INT8) {
    // Word k holds pairs 2k + i = bytes (i, i + 2); a byte permute puts 0x64 above each: 1024 + q.
    const uint32_t minus = (0x6400u | zero) * 0x10001u;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a[2 * k] = hsub2_bits(__byte_perm(word[k], 0x64u, 0x4240u), minus);
      a[2 * k + 1] = hsub2_bits(__byte_perm(word[k], 0x64u, 0x4341u), minus);
    }
  } else if constexpr (E == Encoding::FP8_E4M3) {
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const uint32_t bytes = (word[p / 2] >> (16 * (p % 2))) & 0xFFFFu;
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(bytes), __NV_E4M3);
      a[p] = uint32_t(h.x) | (uint32_t(h.y) << 16);
    }
  } else if constexpr (E == Encoding::NVFP4) {
    uint32_t block_scale[2];  // halved: the magnitudes below are doubled
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const __nv_fp8_storage_t byte = __nv_fp8_storage_t((scale >> (8 * b)) & 0xFFu);
      const __half half_scale = __hmul(__half(__nv_cvt_fp8_to_halfraw(byte, __NV_E4M3)), __float2half(0.5f));
      const __half2 pair = __halves2half2(half_scale, half_scale);
      block_scale[b] = *reinterpret_cast<const uint32_t*>(&pair);
    }
#pragma unroll
    for (int p = 0; p < 16; ++p) {
      const uint32_t u = word[p / 4] >> (4 * (p % 4));  // codes of the pair at bits 0-3 and 16-19
      const uint32_t select = ((u << 4) & 0x70u) | ((u >> 4) & 0x7000u);
      const uint32_t magnitudes = __byte_perm(kE2m1HighBytesLo, kE2m1HighBytesHi, select);
      const uint32_t value = magnitudes | ((u << 12) & 0x80008000u);
      a[p] = hmul2_bits(value, block_scale[p / 8]);
    }
  } else {  // BF16: the stored pairs are the operands
#pragma unroll
    for (int p = 0; p < 4; ++p) a[p] = word[p];
  }
}

// acc[set] (C fragments: rows g, g + 8 x B columns 2q (hi), 2q + 1 (lo) of activation row 4 set + q) += one chunk.
template <Encoding E, int kSets>
__device__ __forceinline__ void multiply_chunk(const Chunk<E>& c, const uint4 (&x)[kSets][chunk_pairs<E>() / 4],
                                               float (&acc)[kSets][4]) {
  constexpr bool kBf16 = E == Encoding::BF16;
  constexpr bool kGrouped = E == Encoding::INT4 || E == Encoding::INT8;
  constexpr int kPairs = chunk_pairs<E>();
  uint32_t a0[kPairs], a1[kPairs];
  chunk_operands<E>(c.w[0], c.scale[0], c.zero[0], a0);
  chunk_operands<E>(c.w[1], c.scale[1], c.zero[1], a1);
  float tile[kSets][4] = {};
  float (&sum)[kSets][4] = kGrouped ? tile : acc;  // grouped codes: scaled once per chunk below
#pragma unroll
  for (int j = 0; j < kPairs / 2; ++j)
#pragma unroll
    for (int s = 0; s < kSets; ++s)
      mma_16816<kBf16>(sum[s], a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1], word_of(x[s], 2 * j),
                       word_of(x[s], 2 * j + 1));
  if constexpr (kGrouped) {
    const float scale[2] = {__half2float(__ushort_as_half(uint16_t(c.scale[0]))),
                            __half2float(__ushort_as_half(uint16_t(c.scale[1])))};
#pragma unroll
    for (int s = 0; s < kSets; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[s][e] = fmaf(scale[e / 2], tile[s][e], acc[s][e]);
  }
}

// Eight f32 activations as the bf16 operand words v5 reads: their hi parts (lo == false) or lo parts, exactly what
// split_activations_kernel<true, Natural> writes. bf16 needs no per-row exponent, so v5 splits in registers and a
// launch on bf16 weights costs no split kernel (35B-A3B decode runs ~110 bf16 GEMVs a step: router, gates).
// `vectors`: x is 16-byte aligned (the row stride is, so the launch decides for all lanes).
__device__ __forceinline__ uint4 split_eight(const float* x, bool lo, bool vectors) {
  float v[8];
  if (vectors) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x)), b = __ldg(reinterpret_cast<const float4*>(x) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __ldg(x + i);
  }
  uint32_t word[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    uint16_t part[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint16_t hi_bits, lo_bits;
      split_value<true>(v[2 * p + h], hi_bits, lo_bits);
      part[h] = lo ? lo_bits : hi_bits;
    }
    word[p] = uint32_t(part[0]) | (uint32_t(part[1]) << 16);
  }
  return make_uint4(word[0], word[1], word[2], word[3]);
}

// kSplitHere (bf16 only): the kernel reads the f32 activations and splits them itself (split_eight) rather than
// reading split planes. The weights and their scales are never written during a pass, so a lane's first ring of
// chunks is loaded before chain_start() waits for the kernel before it: those loads overlap its drain (session 8:
// -0.2 ms a 27B int4 pass at C=1, -0.22 / -0.46 ms at C=8 for 35B-A3B / 27B).
// kGroupChunks: chunks per quantization group (default_group_chunks, or 1 for int8 g64); every weight of the
// launch has the same group size.
template <Encoding E, int kSets, bool kSplitHere, int kGroupChunks = default_group_chunks<E>()>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) gemv_v5_kernel(MmaArgs a) {
  static_assert(!kSplitHere || E == Encoding::BF16, "fp16 operands need the split kernel's row exponents");
  constexpr int kXVectors = chunk_pairs<E>() / 4;  // 16-byte activation loads per lane, set and chunk
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const BlockWork b = block_work(a);
  const WeightSlice& w = b.w;
  const int64_t m0 = b.m_tile * kMTile;
  const int64_t chunks = a.k / chunk_cols<E>();
  const int64_t first = b.split * chunks / w.splits, last = (b.split + 1) * chunks / w.splits;
  const int64_t c0 = first + warp;  // the warp's chunks: c0 + kWarps i for i < n
  const int n = c0 < last ? int((last - c0 + kWarps - 1) / kWarps) : 0;

  ChunkStream<E, kGroupChunks> next;  // at the next chunk to load
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = min(m0 + g + 8 * h, w.n - 1);  // rows past the end read the last row, never written
    next.w[h] = w.q + row * (a.k * tc::code_bits<E>() / 8) + c0 * kChunkBytes + q * 16;
    if constexpr (E == Encoding::INT4 || E == Encoding::INT8) {
      const int64_t group = row * (a.k / (kGroupChunks * chunk_cols<E>())) + c0 / kGroupChunks;
      next.scale[h] = w.scale + 2 * group;
      next.zero[h] = w.zero + group;
    } else if constexpr (E == Encoding::NVFP4) {
      next.scale[h] = w.scale + row * (a.k / 16) + c0 * (chunk_cols<E>() / 16) + q * 2;
    }
  }
  constexpr int kDepth = ring_depth<kSets>();
  Chunk<E> ring[kDepth];
#pragma unroll
  for (int r = 0; r < kDepth; ++r)
    if (r < n) load_chunk<E, kGroupChunks>(next, r, ring[r]);
  next.advance(kDepth);
  chain_start();

  // Lanes past the batch's rows read the last row: their B columns only reach outputs that are not written.
  constexpr int kXStride = kWarps * chunk_cols<E>();  // activation values from chunk i to i + 1
  using XValue = std::conditional_t<kSplitHere, float, uint16_t>;
  const XValue* x[kSets];
#pragma unroll
  for (int set = 0; set < kSets; ++set) {
    const int64_t offset = min(4 * set + g / 2, a.rows - 1) * a.k + c0 * chunk_cols<E>() + q * chunk_values<E>();
    if constexpr (kSplitHere) x[set] = a.x + offset;
    else x[set] = (g % 2 ? a.x_lo : a.x_hi) + offset;
  }

  float acc[kSets][4] = {};
  for (int i0 = 0; i0 < n; i0 += kDepth) {
#pragma unroll
    for (int r = 0; r < kDepth; ++r) {
      const int i = i0 + r;
      if (i >= n) break;
      uint4 xv[kSets][kXVectors];
#pragma unroll
      for (int set = 0; set < kSets; ++set)
#pragma unroll
        for (int v = 0; v < kXVectors; ++v) {
          if constexpr (kSplitHere) xv[set][v] = split_eight(x[set] + r * kXStride + 8 * v, g % 2, a.x_vectors);
          else xv[set][v] = __ldg(reinterpret_cast<const uint4*>(x[set] + r * kXStride) + v);
        }
      multiply_chunk<E, kSets>(ring[r], xv, acc);
      if (i + kDepth < n) load_chunk<E, kGroupChunks>(next, r, ring[r]);
    }
    next.advance(kDepth);
#pragma unroll
    for (int set = 0; set < kSets; ++set) x[set] += kDepth * kXStride;
  }

  // hi + lo, then the block's sums: value 2 set + h is weight row g + 8 h, activation row 4 set + q.
  float sums[2 * kSets];
#pragma unroll
  for (int set = 0; set < kSets; ++set) {
    sums[2 * set] = acc[set][0] + acc[set][1];
    sums[2 * set + 1] = acc[set][2] + acc[set][3];
  }
  finish_block<E, 2 * kSets>(a, w, b.local, b.m_tile, sums,
                             [&](int v) { return OutputSlot{m0 + g + 8 * (v % 2), 4 * (v / 2) + q}; });
}

// Blocks along the columns for an (n, k) weight: only the shape decides (so results do not depend on the batch).
// v3: enough blocks for 16 warps per SM.
int choose_splits_v3(int64_t m_tiles, int64_t tiles) {
  const int64_t warps = m_tiles * kWarps;
  const int64_t target = int64_t(device_sms()) * 16;
  if (warps >= target) return 1;
  int64_t splits = (target + warps - 1) / warps;
  splits = std::min(splits, std::max<int64_t>(1, tiles / kWarps));
  splits = std::min(splits, std::max<int64_t>(1, kPartialSlots / m_tiles));
  return int(splits);
}

// v5: at least one wave of blocks (kBlocksPerSm per SM), each warp at least a ring of chunks.
int choose_splits_v5(int64_t m_tiles, int64_t chunks) {
  const int64_t wave = int64_t(device_sms()) * kBlocksPerSm;
  int64_t splits = (wave + m_tiles - 1) / m_tiles;
  splits = std::min(splits, std::max<int64_t>(1, chunks / (kWarps * kRing)));
  splits = std::min(splits, std::max<int64_t>(1, kPartialSlots / m_tiles));
  return int(splits);
}

template <Encoding E>
constexpr int kind_of() { return split_kind_of(E == Encoding::BF16, tc::order<E>()); }

template <bool kBf16, tc::Order kOrder>
void launch_split(const float* x, const SplitActivations& s, cudaStream_t stream) {
  const dim3 grid(unsigned((s.cols + kSplitCols - 1) / kSplitCols), unsigned(s.rows));
  launch_chained(split_activations_kernel<kBf16, kOrder>, grid, dim3(kSplitThreads), 0, stream, x, s.cols,
                 const_cast<uint16_t*>(s.hi), const_cast<uint16_t*>(s.lo), const_cast<int*>(s.exps));
}

constexpr int kBf16Kind = split_kind_of(true, tc::Order::Natural);

// Weights of one encoding and width on one split, kMaxWeights per launch.
template <Encoding E>
void launch(const SplitActivations& x, std::span<const MmaOutput> outs, GemvWorkspace& ws, cudaStream_t stream,
            MmaKernel kernel) {
  const int64_t k = x.cols;
  // bf16 activations have no planes (v5 splits them in registers) until a kernel that reads them runs.
  const bool in_registers = kernel == MmaKernel::v5 && !x.planes;
  if (!in_registers && !x.planes) launch_split<true, tc::Order::Natural>(x.x, x, stream);
  for (size_t begin = 0; begin < outs.size();) {
    MmaArgs a{};
    a.x_hi = x.hi;
    a.x_lo = x.lo;
    a.exps = x.exps;
    a.x = x.x;
    a.x_vectors = reinterpret_cast<uintptr_t>(x.x) % 16 == 0;
    a.partials = ws.partials_.as<float>();
    a.counters = ws.counters_.as<unsigned>();
    a.k = k;
    a.rows = x.rows;
    int64_t blocks = 0, partials = 0, counters = 0;
    size_t end = begin;
    for (; end < outs.size() && a.count < kMaxWeights; ++end) {
      const TensorView& w = *outs[end].w;
      if (w.encoding != E || x.kind != kind_of<E>() || w.cols() != k)
        throw EngineError("gemv_mma: activations split for another weight kind or width than " + w.name);
      if (kernel == MmaKernel::v3 && (E == Encoding::INT4 || E == Encoding::INT8) && w.group_size != kTileCols)
        throw EngineError("gemv_mma: the v3 kernel takes groups of " + std::to_string(kTileCols) + " only, not " +
                          w.name);
      if (a.count > 0 && w.group_size != a.w[0].group_size) break;  // one group size a launch: the next one
      const int64_t m_tiles = (w.rows() + kMTile - 1) / kMTile;
      const int splits = kernel == MmaKernel::v3 ? choose_splits_v3(m_tiles, k / kTileCols)
                                                 : choose_splits_v5(m_tiles, k / chunk_cols<E>());
      const int64_t slots = splits > 1 ? m_tiles * splits : 0;
      if (a.count > 0 && partials + slots > kPartialSlots) break;  // the next launch takes it
      a.w[a.count++] = {w.data, w.scale, w.zero, w.global_scale, outs[end].y, w.rows(), w.group_size, splits, blocks,
                        partials, counters};
      blocks += m_tiles * splits;
      partials += slots;
      counters += splits > 1 ? m_tiles : 0;
    }
    auto kernel_of = gemv_mma_kernel<E>;  // v3
    if (kernel != MmaKernel::v3) kernel_of = x.rows <= 4 ? gemv_v5_kernel<E, 1, false> : gemv_v5_kernel<E, 2, false>;
    if constexpr (E == Encoding::INT8)
      if (kernel != MmaKernel::v3 && a.w[0].group_size == chunk_cols<E>())
        kernel_of = x.rows <= 4 ? gemv_v5_kernel<E, 1, false, 1> : gemv_v5_kernel<E, 2, false, 1>;
    if constexpr (E == Encoding::BF16)
      if (in_registers) kernel_of = x.rows <= 4 ? gemv_v5_kernel<E, 1, true> : gemv_v5_kernel<E, 2, true>;
    launch_chained(kernel_of, dim3(unsigned(blocks)), dim3(kBlockThreads), 0, stream, a);
    begin = end;
  }
}

}  // namespace

GemvWorkspace::GemvWorkspace()
    : partials_(size_t(kPartialSlots) * 128 * sizeof(float)), counters_(size_t(kPartialSlots) * sizeof(unsigned)) {
  NINFER_CUDA_CHECK(cudaMemset(counters_.get(), 0, counters_.bytes()));
}

void GemvWorkspace::reserve(int rows, int64_t cols, cudaStream_t stream) {
  const size_t needed = size_t(rows) * size_t(cols) * 2 * sizeof(uint16_t) + size_t(rows) * sizeof(int) + 16;
  if (split_.bytes() >= needed) return;
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));  // nothing queued still reads the old buffer
  split_ = DeviceBuffer(std::max(needed, size_t(kMaxGemvRows) * size_t(cols) * 4 + 64));
}

int split_kind(const TensorView& w) {
  if (w.shape.size() != 2 || w.cols() % kTileCols != 0) return -1;
  switch (w.encoding) {
    case Encoding::INT4:
      return w.group_size == kTileCols ? kind_of<Encoding::INT4>() : -1;
    case Encoding::INT8:  // v5 takes groups of one chunk (64) or two (128)
      return w.group_size == kTileCols || w.group_size == chunk_cols<Encoding::INT8>() ? kind_of<Encoding::INT8>()
                                                                                         : -1;
    case Encoding::BF16: return kind_of<Encoding::BF16>();
    case Encoding::FP8_E4M3: return kind_of<Encoding::FP8_E4M3>();
    case Encoding::NVFP4: return kind_of<Encoding::NVFP4>();
    default: return -1;
  }
}

bool gemv_mma_supports(const TensorView& w) { return split_kind(w) >= 0; }

bool split_has_planes(int kind) { return kind >= 0 && kind != kBf16Kind; }

SplitActivations split_layout(const float* x, int rows, int64_t cols, int kind, GemvWorkspace& workspace,
                              cudaStream_t stream) {
  if (rows < 1 || rows > kMaxGemvRows)
    throw EngineError("gemv_mma: " + std::to_string(rows) + " activation rows; the decode kernel takes 1.." +
                      std::to_string(kMaxGemvRows));
  workspace.reserve(rows, cols, stream);
  SplitActivations s;
  uint16_t* hi = workspace.split_.as<uint16_t>();
  s.hi = hi;
  s.lo = hi + int64_t(rows) * cols;
  s.exps = reinterpret_cast<const int*>(s.lo + int64_t(rows) * cols);
  s.x = x;
  s.rows = rows;
  s.cols = cols;
  s.kind = kind;
  s.planes = kind != kBf16Kind;  // v5 splits bf16 in registers; v3 makes the planes when it runs (launch)
  return s;
}

SplitActivations split_activations(const float* x, int rows, int64_t cols, int kind, GemvWorkspace& workspace,
                                   cudaStream_t stream) {
  const SplitActivations s = split_layout(x, rows, cols, kind, workspace, stream);
  switch (kind) {
    case split_kind_of(false, tc::Order::Natural): launch_split<false, tc::Order::Natural>(x, s, stream); break;
    case split_kind_of(false, tc::Order::Nibble): launch_split<false, tc::Order::Nibble>(x, s, stream); break;
    case split_kind_of(false, tc::Order::Byte): launch_split<false, tc::Order::Byte>(x, s, stream); break;
    case kBf16Kind: break;
    default: throw EngineError("gemv_mma: unknown activation split kind " + std::to_string(kind));
  }
  return s;
}

void gemv_mma(const SplitActivations& x, std::span<const MmaOutput> outs, GemvWorkspace& workspace,
              cudaStream_t stream, MmaKernel kernel) {
  if (outs.empty()) return;
  for (const MmaOutput& o : outs)
    if (o.w->encoding != outs[0].w->encoding)
      throw EngineError("gemv_mma: one launch takes weights of one encoding (" + o.w->name + ")");
  switch (outs[0].w->encoding) {
    case Encoding::INT4: return launch<Encoding::INT4>(x, outs, workspace, stream, kernel);
    case Encoding::INT8: return launch<Encoding::INT8>(x, outs, workspace, stream, kernel);
    case Encoding::FP8_E4M3: return launch<Encoding::FP8_E4M3>(x, outs, workspace, stream, kernel);
    case Encoding::NVFP4: return launch<Encoding::NVFP4>(x, outs, workspace, stream, kernel);
    case Encoding::BF16: return launch<Encoding::BF16>(x, outs, workspace, stream, kernel);
    default: throw EngineError("gemv_mma: the tensor-core path does not take " + outs[0].w->name);
  }
}

void gemv_mma(const float* x, int rows, const TensorView& w, float* y, GemvWorkspace& workspace,
              cudaStream_t stream, MmaKernel kernel) {
  const int kind = split_kind(w);
  if (kind < 0) throw EngineError("gemv_mma: the tensor-core path does not take " + w.name);
  const MmaOutput out[] = {{&w, y}};
  gemv_mma(split_activations(x, rows, w.cols(), kind, workspace, stream), out, workspace, stream, kernel);
}

}  // namespace ninfer::cuda
