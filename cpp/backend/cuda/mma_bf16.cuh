// Warp-level building blocks of the tensor-core attention kernels (flash_prefill.cu, segment_attention.cu):
// bf16 packing, ldmatrix loads of 8x8 b16 tiles from shared memory, the m16n8k16 bf16 mma with f32 accumulation,
// and the reductions over the quad of lanes that share an accumulator row.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace ninfer::cuda {

constexpr float kLog2e = 1.4426950408889634f;  // softmax in the exp2 domain: exp(x) = exp2(x * log2(e))

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint16_t* p) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* p) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// c += a b for a 16x16 (row) bf16 A fragment, a 16x8 (col) bf16 B fragment and a 16x8 f32 accumulator.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Shared-memory rows of D bf16 padded by 16 bytes: ldmatrix's eight row addresses then fall in distinct banks.
template <int D>
constexpr int kStride = D + 8;

// One k step (head columns [16 kk, 16 kk + 16)) of S = Q K^T for M m-tiles of 16 rows of a warp and Keys keys,
// each K fragment loaded once for all M: qa[m] m-tile m's A fragment of that step, ks the keys' tile in shared
// memory (rows of kStride<D>); sc[m][Keys / 8] m-tile m's accumulators.
template <int Keys, int D, int M>
__device__ __forceinline__ void add_key_scores_tiles(float (*sc)[Keys / 8][4], const uint32_t (*qa)[4],
                                                     const uint16_t* ks, int kk, int lane) {
#pragma unroll
  for (int np = 0; np < Keys / 16; ++np) {
    uint32_t kb[4];
    ldmatrix_x4(kb, ks + (np * 16 + lane % 8 + (lane / 16) * 8) * kStride<D> + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      mma_bf16(sc[m][2 * np], qa[m], kb[0], kb[1]);
      mma_bf16(sc[m][2 * np + 1], qa[m], kb[2], kb[3]);
    }
  }
}

// The same for a warp's 16 rows: qa their A fragment of the step, sc[Keys / 8] their accumulators.
template <int Keys, int D>
__device__ __forceinline__ void add_key_scores(float (*sc)[4], const uint32_t qa[4], const uint16_t* ks, int kk,
                                               int lane) {
  add_key_scores_tiles<Keys, D, 1>(reinterpret_cast<float(*)[Keys / 8][4]>(sc),
                                   reinterpret_cast<const uint32_t(*)[4]>(qa), ks, kk, lane);
}

// One k step (keys [16 kk, 16 kk + 16)) of O += P V for M m-tiles of 16 rows of a warp, each V fragment loaded
// once for all M: pa[m] m-tile m's P A fragment of those keys, vs the values' tile in shared memory (rows of
// kStride<D>); o[m][D / 8] m-tile m's accumulators.
template <int D, int M>
__device__ __forceinline__ void add_weighted_values_tiles(float (*o)[D / 8][4], const uint32_t (*pa)[4],
                                                          const uint16_t* vs, int kk, int lane) {
#pragma unroll
  for (int dp = 0; dp < D / 16; ++dp) {
    uint32_t vb[4];
    const int key = kk * 16 + lane % 8 + ((lane / 8) % 2) * 8;
    ldmatrix_x4_trans(vb, vs + key * kStride<D> + dp * 16 + (lane / 16) * 8);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      mma_bf16(o[m][2 * dp], pa[m], vb[0], vb[1]);
      mma_bf16(o[m][2 * dp + 1], pa[m], vb[2], vb[3]);
    }
  }
}

// The same for a warp's 16 rows: pa their P A fragment, o[D / 8] their accumulators.
template <int D>
__device__ __forceinline__ void add_weighted_values(float (*o)[4], const uint32_t pa[4], const uint16_t* vs, int kk,
                                                    int lane) {
  add_weighted_values_tiles<D, 1>(reinterpret_cast<float(*)[D / 8][4]>(o), reinterpret_cast<const uint32_t(*)[4]>(pa),
                                  vs, kk, lane);
}

// One tile of the online softmax for a warp's 16 rows (two per lane, held with the quad of lanes that share them):
// sc[Keys / 8] holds the tile's scores in the exp2 domain and becomes its unnormalised probabilities; each row's
// running max and sum move on, and the output accumulators o[D / 8] are rescaled to the new max. Every row must have
// one finite score by this tile (a key before it, or one of this tile's), so the max is finite.
template <int Keys, int D>
__device__ __forceinline__ void online_softmax_tile(float (*sc)[4], float (*o)[4], float row_max[2],
                                                    float row_sum[2]) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float m = row_max[rr];
#pragma unroll
    for (int nt = 0; nt < Keys / 8; ++nt) m = fmaxf(m, fmaxf(sc[nt][2 * rr], sc[nt][2 * rr + 1]));
    m = quad_max(m);
    const float correction = exp2f(row_max[rr] - m);  // 0 on a row's first tile
    row_max[rr] = m;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < Keys / 8; ++nt) {
      sc[nt][2 * rr] = exp2f(sc[nt][2 * rr] - m);
      sc[nt][2 * rr + 1] = exp2f(sc[nt][2 * rr + 1] - m);
      sum += sc[nt][2 * rr] + sc[nt][2 * rr + 1];
    }
    row_sum[rr] = row_sum[rr] * correction + sum;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][2 * rr] *= correction, o[nt][2 * rr + 1] *= correction;
  }
}

}  // namespace ninfer::cuda
