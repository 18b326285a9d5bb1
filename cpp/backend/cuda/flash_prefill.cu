// Tensor-core flash attention for prefill: a block takes 64 flattened rows (new position, query head of one GQA
// group) of one sequence and one KV head, so each K/V tile (one 64-token page) is read once for the whole group;
// S = Q K^T and O += P V run on mma.sync m16n8k16 bf16 with f32 accumulation and an online softmax in f32
// (exp2 domain). Four warps, 16 rows each; causal masking only on the tiles that reach past the block's first row.
//
// Numerics (the standard flash ones): q * scale * log2(e) is rounded to bf16 (relative error <= 2^-8 per element);
// K and V codes go to bf16 exactly (bf16 values, e4m3 and int8 codes, and e2m1 codes times their e4m3 block
// scale -- at most 6 significant bits -- are all bf16 numbers) and the quantized rows' scales multiply S (keys)
// and P (values) in f32; P = exp2(S - max) (times the value scale) is rounded to bf16
// for the PV product; the softmax sum is taken over the f32 P. So a score is off by about 2^-8 * sum|q_i k_i|
// and an output by about 2^-8 of the weighted mean of |v| beside the f32 reference.
//
// Pipeline: K and V have one shared-memory tile each; the next K tile is fetched while the softmax and P V of
// this one run, the next V tile while the next S = Q K^T runs. bf16 tiles come with cp.async (no registers);
// 8-bit tiles are converted to bf16 on the way (global -> registers -> shared), at the same points of the
// schedule, so their fetch is not overlapped within the block (two blocks per SM overlap each other).
// Next steps: 128-row tiles, TMA, wgmma.
#include <type_traits>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/flash_attention.h"
#include "backend/cuda/mma_bf16.cuh"

namespace ninfer::cuda {
namespace {

constexpr int kWarps = kPrefillTileRows / 16;
constexpr int kThreadsPerBlock = 32 * kWarps;
constexpr int kKeys = int(kKvPageTokens);  // one K/V tile = one page

template <int D>
constexpr size_t shared_bytes() {
  return size_t(3) * kKeys * kStride<D> * sizeof(uint16_t) + 2 * kKeys * sizeof(float);
}

// Starts bringing KV head `kv_head`'s slice of a page's 64 rows into shared memory as bf16 codes (rows past
// `valid` zeroed: their storage was never written) with the rows' scales (8-bit dtypes; 0 past `valid`), as one
// cp.async group: bf16 rows are copied asynchronously, 8-bit rows converted here.
template <class Kv, int D>
__device__ void fetch_tile(const PagedRows& pr, const uint8_t* block, int kv_head, int valid, uint16_t* dst,
                           float* scales) {
  using E = typename Kv::Element;
  constexpr int kChunks = D / 8;  // 8 values per chunk
#pragma unroll 4
  for (int c = threadIdx.x; c < kKeys * kChunks; c += kThreadsPerBlock) {
    const int row = c / kChunks, c8 = c % kChunks;
    const int64_t col = int64_t(kv_head) * D + c8 * 8;
    uint16_t* to = dst + row * kStride<D> + c8 * 8;
    if constexpr (sizeof(E) == 2) {
      cp_async16(to, reinterpret_cast<const E*>(block + min(row, valid - 1) * pr.row_bytes) + col, row < valid);
    } else {
      uint4 packed = {0, 0, 0, 0};
      if (row < valid) {
        float f[8];
        load_values8<Kv>(pr, block, row, col, f);
        packed = {pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7])};
      }
      *reinterpret_cast<uint4*>(to) = packed;
    }
  }
  if constexpr (Kv::kScaled) {
    if (threadIdx.x < kKeys) {
      const int row = threadIdx.x;
      scales[row] = row < valid ? pr.scales(const_cast<uint8_t*>(block))[row * pr.kv_heads + kv_head] : 0.0f;
    }
  }
  cp_async_commit();
}

template <class KK, class VK, int D>
__global__ void __launch_bounds__(kThreadsPerBlock, 2)
    flash_prefill_kernel(AttentionArgs a, const PrefillTile* tiles, int32_t group) {
  extern __shared__ uint4 shared_words[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* ks = qs + kKeys * kStride<D>;
  uint16_t* vs = ks + kKeys * kStride<D>;
  float* k_scale = reinterpret_cast<float*>(vs + kKeys * kStride<D>);
  float* v_scale = k_scale + kKeys;

  const int32_t kv_heads = a.shape.num_kv_heads;
  const PrefillTile tile = tiles[blockIdx.x / kv_heads];
  const int kv_head = int(blockIdx.x % kv_heads);
  const DeviceSequence s = a.t.seqs[tile.seq];
  const int64_t flat_end = s.n * group;  // flattened rows of this sequence
  const int64_t tile_last = min(int64_t(tile.first) + kPrefillTileRows, flat_end) - 1;

  // Q of the tile's rows, in the exp2 domain, as bf16 (rows past the sequence: zeros, never written out).
  const float q_scale = a.shape.scale * kLog2e;
  for (int e = threadIdx.x; e < kPrefillTileRows * D; e += kThreadsPerBlock) {
    const int m = e / D, c = e % D;
    const int64_t f = int64_t(tile.first) + m;
    float x = 0.0f;
    if (f < flat_end) {
      const int64_t r = s.row0 + f / group, h = int64_t(kv_head) * group + f % group;
      x = a.q[r * a.q_row_stride + h * a.q_head_stride + c] * q_scale;
    }
    qs[m * kStride<D> + c] = uint16_t(pack_bf16(x, 0.0f) & 0xffffu);
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool warp_active = int64_t(tile.first) + warp * 16 < flat_end;
  // The positions of this thread's two rows (g and g + 8 of its warp's 16); rows past the end take the last one.
  int64_t pos[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t f = min(int64_t(tile.first) + warp * 16 + g + 8 * rr, flat_end - 1);
    pos[rr] = s.start + f / group;
  }
  const int64_t first_pos = s.start + tile.first / group, last_pos = s.start + tile_last / group;
  const int64_t seq_len = s.start + s.n;

  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  const int64_t key_tiles = last_pos / kKeys + 1;
  auto valid_keys = [&](int64_t kt) { return int(min(int64_t(kKeys), seq_len - kt * kKeys)); };
  auto fetch_keys = [&](int64_t kt) {
    fetch_tile<KK, D>(a.k, a.k.page(a.t.pages, s.page_offset, kt), kv_head, valid_keys(kt), ks, k_scale);
  };
  auto fetch_values = [&](int64_t kt) {
    fetch_tile<VK, D>(a.v, a.v.page(a.t.pages, s.page_offset, kt), kv_head, valid_keys(kt), vs, v_scale);
  };
  fetch_keys(0);
  fetch_values(0);
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const bool more = kt + 1 < key_tiles;
    cp_async_wait<1>();  // K[kt] is in (V[kt] may still be on its way)
    __syncthreads();     // ... for every thread (and Q on the first tile)
    float sc[kKeys / 8][4];
    if (warp_active) {
      // S = Q K^T for this warp's 16 rows and the tile's 64 keys.
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[4];
        ldmatrix_x4(qa, qs + (warp * 16 + lane % 16) * kStride<D> + kk * 16 + (lane / 16) * 8);
        add_key_scores<kKeys, D>(sc, qa, ks, kk, lane);
      }
      // Key scales, then the causal mask where the tile reaches past the block's first row.
      const bool diagonal = kt * kKeys + kKeys - 1 > first_pos;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int key = nt * 8 + 2 * t + (c & 1);
          if constexpr (KK::kScaled) sc[nt][c] *= k_scale[key];
          if (diagonal && kt * kKeys + key > pos[c / 2]) sc[nt][c] = -INFINITY;
        }
      // Online softmax (finite maxima: key 0 of tile 0 is before every row).
      online_softmax_tile<kKeys, D>(sc, o, row_max, row_sum);
    }
    __syncthreads();  // every warp is done with K[kt]
    if (more) fetch_keys(kt + 1);
    else cp_async_commit();  // an empty group keeps the count of groups in flight the same
    cp_async_wait<1>();      // V[kt] is in
    __syncthreads();
    if (warp_active) {
      // O += P V, P as bf16 A fragments straight from the S accumulators (times the value scales).
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        float p[2][4];
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            p[half][c] = sc[2 * kk + half][c];
            if constexpr (VK::kScaled) p[half][c] *= v_scale[(2 * kk + half) * 8 + 2 * t + (c & 1)];
          }
        const uint32_t pa[4] = {pack_bf16(p[0][0], p[0][1]), pack_bf16(p[0][2], p[0][3]), pack_bf16(p[1][0], p[1][1]),
                                pack_bf16(p[1][2], p[1][3])};
        add_weighted_values<D>(o, pa, vs, kk, lane);
      }
    }
    __syncthreads();  // every warp is done with V[kt]
    if (more) fetch_values(kt + 1);
  }
  if (!warp_active) return;

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t f = int64_t(tile.first) + warp * 16 + g + 8 * rr;
    if (f >= flat_end) continue;
    const float inv = 1.0f / quad_sum(row_sum[rr]);
    const int64_t r = s.row0 + f / group, h = int64_t(kv_head) * group + f % group;
    float* out = a.out + (r * a.shape.num_heads + h) * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<float2*>(out + nt * 8 + 2 * t) = make_float2(o[nt][2 * rr] * inv, o[nt][2 * rr + 1] * inv);
  }
}

template <class KK, class VK, int D>
void launch(const AttentionArgs& a, const PrefillTile* tiles, int32_t tile_count, cudaStream_t stream) {
  constexpr size_t bytes = shared_bytes<D>();
  static const bool configured = [] {
    NINFER_CUDA_CHECK(cudaFuncSetAttribute(flash_prefill_kernel<KK, VK, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(bytes)));
    return true;
  }();
  (void)configured;
  const int32_t group = a.shape.num_heads / a.shape.num_kv_heads;
  const unsigned blocks = unsigned(tile_count) * unsigned(a.shape.num_kv_heads);
  flash_prefill_kernel<KK, VK, D><<<blocks, kThreadsPerBlock, bytes, stream>>>(a, tiles, group);
  NINFER_CUDA_CHECK_LAUNCH();
}

template <class KK, class VK>
void launch_for_head_dim(const AttentionArgs& a, const PrefillTile* tiles, int32_t tile_count, cudaStream_t stream) {
  switch (a.shape.head_dim) {
    case 16: return launch<KK, VK, 16>(a, tiles, tile_count, stream);
    case 32: return launch<KK, VK, 32>(a, tiles, tile_count, stream);
    case 64: return launch<KK, VK, 64>(a, tiles, tile_count, stream);
    case 128: return launch<KK, VK, 128>(a, tiles, tile_count, stream);
    case 256: return launch<KK, VK, 256>(a, tiles, tile_count, stream);
  }
}

}  // namespace

bool flash_prefill_supports(KvDtype dtype, int32_t head_dim) {
  const bool dims = head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
  return dims && dtype != KvDtype::F32;
}

void flash_prefill(const AttentionArgs& a, KvDtype dtype, const PrefillTile* tiles, int32_t tile_count,
                   cudaStream_t stream) {
  if (tile_count <= 0) return;
  if (dtype == KvDtype::F32) return;  // f32 KV attends with the slow twin (flash_prefill_supports)
  dispatch_kv_device(dtype, [&](auto key_codec, auto value_codec) {
    using KK = decltype(key_codec);
    if constexpr (!std::is_same_v<KK, KvDevice<KvDtype::F32>>)
      launch_for_head_dim<KK, decltype(value_codec)>(a, tiles, tile_count, stream);
  });
}

}  // namespace ninfer::cuda
