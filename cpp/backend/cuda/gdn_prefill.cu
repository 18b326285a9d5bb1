// Gated delta rule over many new tokens (gdn_prefill.h). The chunked form, per value head and chunk of L <= 64
// tokens (positions i, m), with S0 the state entering the chunk, G_i = g_0 + .. + g_i and T = (I - A)^-1 where
// A[i, m] = -beta_i e^{G_i - G_m} (k_i . k_m) for m < i (the CPU twin's forward substitution, as a matrix):
//   W  = T diag(beta e^G) K     [L, Dk]   and   U0 = T diag(beta) V   [L, Dv]      (no state: chunk-parallel)
//   P[i, m] = e^{G_i - G_m} (q_i . k_m) for m <= i                                   (no state: chunk-parallel)
//   u  = U0 - W S0                       (the deltas written at each token)
//   o  = diag(e^G) Q S0 + P u
//   S  = e^{G_{L-1}} S0 + (diag(e^{G_{L-1} - G}) K)^T u
// Kernel 1 (prepare) computes W, U0, P and the decay factors for every (chunk, value head) at once; kernel 2
// (scan) walks the chunks of a sequence in order for one slice of value columns — the columns of S evolve
// independently — carrying that slice of the state. Kernel 1 and the f32 scan (32 columns per block) use f32
// FMAs only (cumulative decay in f64, as in the CPU twin); the tensor-core scan (64 columns per block) runs its
// products on tf32 mma.sync with f32 accumulation and an f32 state.
#include "backend/cuda/gdn_prefill.h"

#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {
namespace {

constexpr int L = kGdnChunk;
constexpr int kAStride = L + 4;       // row stride of A in shared memory: 16-byte rows, stores free of conflicts
constexpr int kTStride = L + 8;       // row stride of the prepare kernel's K^T and Q^T: mma fragment loads hit
                                      // banks 8 t + g, free of conflicts
constexpr int kSliceColumns = 32;     // value columns per scan block
constexpr int kPrepareThreads = 256;  // 8 warps: 4 x 2 warp tiles (16 x 32) of the L x L products
constexpr int kScanThreads = 128;     // a 16 x 8 grid of 4 x 4 tiles of the L x 32 products

// ---------- the slow twin ----------

// The recurrent rule token by token for one (sequence, value head); thread c owns column c of S [Dk, Dv]:
// S = exp(g) S; p = S^T k; S += k (beta (v - p))^T; o = S^T q, in the CPU reference's order.
__global__ void gdn_sequence_kernel(GdnPrefillArgs a) {
  extern __shared__ float qk[];  // q then k of the current token, Dk each
  const DeviceSequence s = a.seqs[blockIdx.x];
  const int32_t j = blockIdx.y, Hk = a.num_key_heads, Hv = a.num_value_heads, Dk = a.key_head_dim,
                Dv = a.value_head_dim, h = j / (Hv / Hk);
  float* S = a.states[blockIdx.x] + int64_t(j) * Dk * Dv;
  for (int64_t t = 0; t < s.n; ++t) {
    const int64_t r = s.row0 + t;
    __syncthreads();  // the previous token is done with qk
    for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
      qk[i] = a.q[(r * Hk + h) * Dk + i];
      qk[Dk + i] = a.k[(r * Hk + h) * Dk + i];
    }
    __syncthreads();
    const float decay = expf(a.g[r * Hv + j]), b = a.beta[r * Hv + j];
    for (int c = threadIdx.x; c < Dv; c += blockDim.x) {
      float p = 0.0f;
      for (int i = 0; i < Dk; ++i) {
        const float x = S[int64_t(i) * Dv + c] * decay;
        S[int64_t(i) * Dv + c] = x;
        p += x * qk[Dk + i];
      }
      const float delta = b * (a.v[(r * Hv + j) * Dv + c] - p);
      float o = 0.0f;
      for (int i = 0; i < Dk; ++i) {
        const float x = S[int64_t(i) * Dv + c] + qk[Dk + i] * delta;
        S[int64_t(i) * Dv + c] = x;
        o += x * qk[i];
      }
      a.out[(r * Hv + j) * Dv + c] = o;
    }
  }
}

// ---------- the chunked form ----------

// Workspace of one (chunk, value head), in floats: W transposed [Dk, L], U0 [L, Dv], P transposed [L, L]
// (entry [m, i] = P[i, m]), e^{G_i} [L], e^{G_{L-1} - G_i} [L]. Rows past the chunk's end are zeros throughout,
// so the scan needs no masks inside its products.
struct ChunkBlock {
  int32_t Dk, Dv;
  __host__ __device__ int64_t floats() const { return int64_t(L) * (Dk + Dv + L + 2); }
  __device__ float* w_t(float* base) const { return base; }
  __device__ float* u0(float* base) const { return base + L * Dk; }
  __device__ float* p_t(float* base) const { return base + L * (Dk + Dv); }
  __device__ float* decay_in(float* base) const { return base + L * (Dk + Dv + L); }
  __device__ float* decay_out(float* base) const { return base + L * (Dk + Dv + L + 1); }
};

struct ChunkedArgs {
  GdnPrefillArgs a;
  GdnChunkTables t;
  float* work;
};

__device__ __forceinline__ int rows_in_chunk(int64_t n, int64_t chunk) {
  const int64_t left = n - chunk * L;
  return left < L ? int(left) : L;
}

// What a scan block works on: value columns slice0 .. slice0 + `slice` - 1 (blockIdx.x) of value head blockIdx.y
// of sequence blockIdx.z, over that sequence's chunks.
struct ScanBlock {
  int Dk, Dv, Hk, Hv;
  int slice0, head, seq, key_head;
  DeviceSequence s;
  float* state;  // the head's [Dk, Dv] state
  ChunkBlock layout;
  int64_t chunks;

  __device__ ScanBlock(const GdnPrefillArgs& a, int slice)
      : Dk(a.key_head_dim), Dv(a.value_head_dim), Hk(a.num_key_heads), Hv(a.num_value_heads),
        slice0(int(blockIdx.x) * slice), head(blockIdx.y), seq(blockIdx.z), key_head(head / (Hv / Hk)),
        s(a.seqs[seq]), state(a.states[seq] + int64_t(head) * Dk * Dv), layout{Dk, Dv},
        chunks((s.n + L - 1) / L) {}

  // S[d * stride + j] = state[d, slice0 + j] for the slice's `slice` columns (zeros past Dv).
  __device__ void load_state(float* S, int slice, int stride) const {
    for (int idx = threadIdx.x; idx < Dk * slice; idx += blockDim.x) {
      const int d = idx / slice, j = idx % slice, col = slice0 + j;
      S[d * stride + j] = col < Dv ? state[int64_t(d) * Dv + col] : 0.0f;
    }
  }
};

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// dst[d * stride + i] = src row i (rows t0 .. t0 + rows - 1 of a [*, heads, Dk] tensor, head `head`) for i < L,
// zeros past `rows`. Consecutive threads take consecutive rows, so the shared-memory stores hit distinct banks.
__device__ void load_transposed(const float* src, int64_t t0, int rows, int heads, int head, int Dk, float* dst,
                                int stride) {
  for (int idx = threadIdx.x; idx < L * (Dk / 4); idx += blockDim.x) {
    const int i = idx % L, d = 4 * (idx / L);
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < rows) x = load4(src + ((t0 + i) * heads + head) * Dk + d);
    dst[(d + 0) * stride + i] = x.x;
    dst[(d + 1) * stride + i] = x.y;
    dst[(d + 2) * stride + i] = x.z;
    dst[(d + 3) * stride + i] = x.w;
  }
}

// ---------- tensor-core helpers ----------

__device__ __forceinline__ uint32_t tf32(float x) {  // round to nearest (ties away), as cvt.rna does
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
// c += a b for one m16n8k8 tile. a: (g, t), (g+8, t), (g, t+4), (g+8, t+4); b: (t, g), (t+4, g);
// c: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1), with g = lane / 4, t = lane % 4.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A fragment of a matrix stored transposed (element (m, k) at p[k * stride + m]) or row-major (p[m * stride + k]),
// at tile origin (m0, k0).
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const float* p, int stride, int m0, int k0,
                                                  int g, int t) {
  a[0] = tf32(p[(k0 + t) * stride + m0 + g]);
  a[1] = tf32(p[(k0 + t) * stride + m0 + g + 8]);
  a[2] = tf32(p[(k0 + t + 4) * stride + m0 + g]);
  a[3] = tf32(p[(k0 + t + 4) * stride + m0 + g + 8]);
}
__device__ __forceinline__ void load_a_rows(uint32_t (&a)[4], const float* p, int stride, int m0, int k0, int g,
                                            int t) {
  a[0] = tf32(p[(m0 + g) * stride + k0 + t]);
  a[1] = tf32(p[(m0 + g + 8) * stride + k0 + t]);
  a[2] = tf32(p[(m0 + g) * stride + k0 + t + 4]);
  a[3] = tf32(p[(m0 + g + 8) * stride + k0 + t + 4]);
}
// B fragment of a row-major [k, n] matrix (p[k * stride + n]) at (k0, n0).
__device__ __forceinline__ void load_b(uint32_t (&b)[2], const float* p, int stride, int k0, int n0, int g, int t) {
  b[0] = tf32(p[(k0 + t) * stride + n0 + g]);
  b[1] = tf32(p[(k0 + t + 4) * stride + n0 + g]);
}

// x = hi + lo with hi and lo both tf32 (lo carries the next 11 significant bits): products through three tf32
// mmas (hi hi + hi lo + lo hi) are f32-accurate ("3xTF32").
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = tf32(x);
  lo = tf32(x - __uint_as_float(hi));
}

// Kernel 1: one block per (chunk, value head). Builds A and P from the chunk's k.k and q.k products (3xTF32 on
// the tensor cores: f32-accurate, so A, T, W and U0 carry no operand rounding), then solves
// (I - A) [W | U0] = [diag(beta e^G) K | diag(beta) V] by forward substitution, one thread per column with the
// column's 64 values in registers.
__global__ void __launch_bounds__(kPrepareThreads) gdn_chunk_prepare_kernel(ChunkedArgs c) {
  const GdnPrefillArgs& a = c.a;
  const int Dk = a.key_head_dim, Dv = a.value_head_dim, Hk = a.num_key_heads, Hv = a.num_value_heads;
  extern __shared__ float4 shared4[];
  float* A = reinterpret_cast<float*>(shared4);  // [L, kAStride]
  double* cum = reinterpret_cast<double*>(A + L * kAStride);
  float* beta = reinterpret_cast<float*>(cum + L);
  float* decay_in = beta + L;
  float* k_t = decay_in + L;         // [Dk, kTStride]
  float* q_t = k_t + Dk * kTStride;  // [Dk, kTStride]

  const GdnChunkRef ref = c.t.chunks[blockIdx.x];
  const int head = blockIdx.y, key_head = head / (Hv / Hk);
  const DeviceSequence s = a.seqs[ref.seq];
  const int64_t t0 = s.row0 + int64_t(ref.chunk) * L;
  const int rows = rows_in_chunk(s.n, ref.chunk);
  const ChunkBlock layout{Dk, Dv};
  float* block = c.work + (int64_t(blockIdx.x) * Hv + head) * layout.floats();

  load_transposed(a.k, t0, rows, Hk, key_head, Dk, k_t, kTStride);
  load_transposed(a.q, t0, rows, Hk, key_head, Dk, q_t, kTStride);
  if (threadIdx.x < 32) {  // cumulative log decay in f64: a warp scan over pairs of rows
    const int i0 = 2 * threadIdx.x;
    const double g0 = i0 < rows ? double(a.g[(t0 + i0) * Hv + head]) : 0.0;
    const double g1 = i0 + 1 < rows ? double(a.g[(t0 + i0 + 1) * Hv + head]) : 0.0;
    double inclusive = g0 + g1;
    for (int o = 1; o < 32; o <<= 1) {
      const double up = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (int(threadIdx.x) >= o) inclusive += up;
    }
    const double before = inclusive - (g0 + g1);
    cum[i0] = before + g0;
    cum[i0 + 1] = before + g0 + g1;
  } else if (threadIdx.x < 32 + L) {
    const int i = threadIdx.x - 32;
    beta[i] = i < rows ? a.beta[(t0 + i) * Hv + head] : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x < L) {
    const int i = threadIdx.x;
    decay_in[i] = i < rows ? expf(float(cum[i])) : 0.0f;
    layout.decay_in(block)[i] = decay_in[i];
    layout.decay_out(block)[i] = i < rows ? expf(float(cum[rows - 1] - cum[i])) : 0.0f;
  }

  // kk = K K^T (for A) and qk = Q K^T (for P): warp tile rows 16 rm.., columns 32 cn.. (4 n-tiles of 8); A and P
  // are lower triangular, so the two warps whose tiles lie wholly above the diagonal skip their products.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rm = warp % 4, cn = warp / 4, row0 = 16 * rm, col0 = 32 * cn;
  float kk[4][4] = {}, qk[4][4] = {};
  if (col0 <= row0 + 15) {
    for (int k0 = 0; k0 < Dk; k0 += 8) {
      float kr[4], qr[4];  // A fragments (rows of K and of Q), split into tf32 hi + lo below
      kr[0] = k_t[(k0 + t) * kTStride + row0 + g];
      kr[1] = k_t[(k0 + t) * kTStride + row0 + g + 8];
      kr[2] = k_t[(k0 + t + 4) * kTStride + row0 + g];
      kr[3] = k_t[(k0 + t + 4) * kTStride + row0 + g + 8];
      qr[0] = q_t[(k0 + t) * kTStride + row0 + g];
      qr[1] = q_t[(k0 + t) * kTStride + row0 + g + 8];
      qr[2] = q_t[(k0 + t + 4) * kTStride + row0 + g];
      qr[3] = q_t[(k0 + t + 4) * kTStride + row0 + g + 8];
      uint32_t k_hi[4], k_lo[4], q_hi[4], q_lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        split_tf32(kr[e], k_hi[e], k_lo[e]);
        split_tf32(qr[e], q_hi[e], q_lo[e]);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {  // B = K^T: element (d, m) = k_t[d, m]
        const int n = col0 + 8 * nt + g;
        uint32_t b_hi[2], b_lo[2];
        split_tf32(k_t[(k0 + t) * kTStride + n], b_hi[0], b_lo[0]);
        split_tf32(k_t[(k0 + t + 4) * kTStride + n], b_hi[1], b_lo[1]);
        mma_tf32(kk[nt], k_lo, b_hi);
        mma_tf32(kk[nt], k_hi, b_lo);
        mma_tf32(kk[nt], k_hi, b_hi);
        mma_tf32(qk[nt], q_lo, b_hi);
        mma_tf32(qk[nt], q_hi, b_lo);
        mma_tf32(qk[nt], q_hi, b_hi);
      }
    }
  }
  float* p_t = layout.p_t(block);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row0 + g + 8 * (e / 2), m = col0 + 8 * nt + 2 * t + e % 2;
      // A[i, m]: strictly lower; P[i, m]: lower with the diagonal, stored transposed. The exponent is only
      // evaluated where it is <= 0.
      A[i * kAStride + m] = (m < i && i < rows) ? -beta[i] * expf(float(cum[i] - cum[m])) * kk[nt][e] : 0.0f;
      p_t[m * L + i] = (m <= i && i < rows) ? expf(float(cum[i] - cum[m])) * qk[nt][e] : 0.0f;
    }
  __syncthreads();

  // Forward substitution per column: x_i += sum_{m<i} A[i, m] x_m in order, rows of A read as float4
  // broadcasts. Columns 0..Dk-1 are W (written transposed, 64 contiguous floats per thread), the rest U0.
  float* w_t = layout.w_t(block);
  float* u0 = layout.u0(block);
  for (int col = threadIdx.x; col < Dk + Dv; col += blockDim.x) {
    float x[L];
    if (col < Dk) {
#pragma unroll
      for (int i = 0; i < L; ++i) x[i] = beta[i] * decay_in[i] * k_t[col * kTStride + i];
    } else {
      const float* vcol = a.v + (t0 * Hv + head) * Dv + (col - Dk);
#pragma unroll
      for (int i = 0; i < L; ++i) x[i] = i < rows ? beta[i] * vcol[int64_t(i) * Hv * Dv] : 0.0f;
    }
#pragma unroll
    for (int i = 1; i < L; ++i) {
      const float4* row = reinterpret_cast<const float4*>(A + i * kAStride);
      float even = x[i], odd = 0.0f;  // two chains for the dependent FMAs
#pragma unroll
      for (int m4 = 0; m4 < (i + 3) / 4; ++m4) {
        const float4 w = row[m4];
        even = fmaf(w.x, x[4 * m4], even);
        if (4 * m4 + 1 < i) odd = fmaf(w.y, x[4 * m4 + 1], odd);
        if (4 * m4 + 2 < i) even = fmaf(w.z, x[4 * m4 + 2], even);
        if (4 * m4 + 3 < i) odd = fmaf(w.w, x[4 * m4 + 3], odd);
      }
      x[i] = even + odd;
    }
    if (col < Dk) {
      float4* dst = reinterpret_cast<float4*>(w_t + col * L);
#pragma unroll
      for (int i = 0; i < L; i += 4) dst[i / 4] = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
    } else {
#pragma unroll
      for (int i = 0; i < L; ++i) u0[i * Dv + (col - Dk)] = x[i];
    }
  }
}

// Kernel 2: one block per (value-column slice, value head, sequence), over the sequence's chunks in order.
// Shared: the state slice S [Dk, 32], u [L, 32], and two [Dk, L]-sized buffers: W^T and Q^T for
// u = U0 - W S and Q S, then the scaled keys [L, Dk] and P^T for o and the state update.
__global__ void __launch_bounds__(kScanThreads) gdn_chunk_scan_kernel(ChunkedArgs c) {
  const GdnPrefillArgs& a = c.a;
  const ScanBlock b(a, kSliceColumns);
  const int Dk = b.Dk, Dv = b.Dv, Hk = b.Hk, Hv = b.Hv, slice0 = b.slice0, head = b.head, seq = b.seq,
            key_head = b.key_head;
  extern __shared__ float4 shared4[];
  float* S = reinterpret_cast<float*>(shared4);  // [Dk, 32]
  float* U = S + Dk * kSliceColumns;              // [L, 32]
  float* buf1 = U + L * kSliceColumns;            // W^T [Dk, L], then K scaled [L, Dk]
  float* buf2 = buf1 + Dk * L;                    // Q^T [Dk, L], then P^T [L, L]
  float* decay_in = buf2 + max(Dk, L) * L;
  float* decay_out = decay_in + L;
  const float4* S4 = reinterpret_cast<const float4*>(S);
  const float4* U4 = reinterpret_cast<const float4*>(U);
  const float4* buf1_4 = reinterpret_cast<const float4*>(buf1);
  const float4* buf2_4 = reinterpret_cast<const float4*>(buf2);

  const DeviceSequence& s = b.s;
  float* state = b.state;
  b.load_state(S, kSliceColumns, kSliceColumns);
  const ChunkBlock& layout = b.layout;
  const int ti = threadIdx.x / 8, tj = threadIdx.x % 8;  // rows 4ti.., columns 4tj.. of the [L, 32] products
  const int64_t chunks = b.chunks;
  for (int64_t j = 0; j < chunks; ++j) {
    const int64_t t0 = s.row0 + j * L;
    const int rows = rows_in_chunk(s.n, j);
    float* block = c.work + ((c.t.first_chunk[seq] + j) * Hv + head) * layout.floats();
    __syncthreads();  // the previous chunk is done with every buffer; its state writes are visible
    {
      const float4* src = reinterpret_cast<const float4*>(layout.w_t(block));
      for (int idx = threadIdx.x; idx < Dk * L / 4; idx += blockDim.x) reinterpret_cast<float4*>(buf1)[idx] = src[idx];
    }
    load_transposed(a.q, t0, rows, Hk, key_head, Dk, buf2, L);
    if (threadIdx.x < L) {
      decay_in[threadIdx.x] = layout.decay_in(block)[threadIdx.x];
      decay_out[threadIdx.x] = layout.decay_out(block)[threadIdx.x];
    }
    __syncthreads();

    // ws = W S and qs = Q S for rows 4ti.., slice columns 4tj..
    float ws[4][4] = {}, qs[4][4] = {};
    for (int d = 0; d < Dk; ++d) {
      const float4 w = buf1_4[d * (L / 4) + ti], q = buf2_4[d * (L / 4) + ti], sv = S4[d * (kSliceColumns / 4) + tj];
      const float wr[4] = {w.x, w.y, w.z, w.w}, qr[4] = {q.x, q.y, q.z, q.w}, sc[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) {
          ws[x][y] = fmaf(wr[x], sc[y], ws[x][y]);
          qs[x][y] = fmaf(qr[x], sc[y], qs[x][y]);
        }
    }
    const float* u0 = layout.u0(block);
#pragma unroll
    for (int x = 0; x < 4; ++x)
#pragma unroll
      for (int y = 0; y < 4; ++y) {
        const int i = 4 * ti + x, col = slice0 + 4 * tj + y;
        U[i * kSliceColumns + 4 * tj + y] = col < Dv ? u0[i * Dv + col] - ws[x][y] : 0.0f;
      }
    __syncthreads();  // u complete; W^T and Q^T no longer read

    {
      const float4* src = reinterpret_cast<const float4*>(layout.p_t(block));
      for (int idx = threadIdx.x; idx < L * L / 4; idx += blockDim.x) reinterpret_cast<float4*>(buf2)[idx] = src[idx];
    }
    for (int idx = threadIdx.x; idx < L * (Dk / 4); idx += blockDim.x) {  // keys scaled by e^{G_{L-1} - G_i}
      const int i = idx / (Dk / 4), d = 4 * (idx % (Dk / 4));
      float4 k = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < rows) {
        k = load4(a.k + ((t0 + i) * Hk + key_head) * Dk + d);
        const float f = decay_out[i];
        k = make_float4(k.x * f, k.y * f, k.z * f, k.w * f);
      }
      reinterpret_cast<float4*>(buf1)[idx] = k;
    }
    __syncthreads();

    // o = e^G (Q S) + P u for rows 4ti.. (P is lower: m <= i)
    {
      float o[4][4];
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) o[x][y] = decay_in[4 * ti + x] * qs[x][y];
      const int m_end = min(4 * ti + 4, rows);
      for (int m = 0; m < m_end; ++m) {
        const float4 p = buf2_4[m * (L / 4) + ti], u = U4[m * (kSliceColumns / 4) + tj];
        const float pr[4] = {p.x, p.y, p.z, p.w}, uc[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int x = 0; x < 4; ++x)
#pragma unroll
          for (int y = 0; y < 4; ++y) o[x][y] = fmaf(pr[x], uc[y], o[x][y]);
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int i = 4 * ti + x;
        if (i >= rows) continue;
        float* orow = a.out + ((t0 + i) * Hv + head) * Dv;
#pragma unroll
        for (int y = 0; y < 4; ++y)
          if (slice0 + 4 * tj + y < Dv) orow[slice0 + 4 * tj + y] = o[x][y];
      }
    }

    // S = e^{G_{L-1}} S + K_scaled^T u: thread owns rows d0..d0+7 (d0 = 8 ti + 128 r) and columns 4tj..
    const float chunk_decay = decay_in[rows - 1];
    for (int d0 = 8 * ti; d0 < Dk; d0 += 8 * (kScanThreads / 8)) {
      float acc[8][4];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float4 sv = S4[(d0 + e) * (kSliceColumns / 4) + tj];
        acc[e][0] = chunk_decay * sv.x;
        acc[e][1] = chunk_decay * sv.y;
        acc[e][2] = chunk_decay * sv.z;
        acc[e][3] = chunk_decay * sv.w;
      }
      for (int i = 0; i < rows; ++i) {
        const float4 k0 = buf1_4[i * (Dk / 4) + d0 / 4], k1 = buf1_4[i * (Dk / 4) + d0 / 4 + 1];
        const float4 u = U4[i * (kSliceColumns / 4) + tj];
        const float kr[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w}, uc[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < 8; ++e)
#pragma unroll
          for (int y = 0; y < 4; ++y) acc[e][y] = fmaf(kr[e], uc[y], acc[e][y]);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e)
        reinterpret_cast<float4*>(S)[(d0 + e) * (kSliceColumns / 4) + tj] =
            make_float4(acc[e][0], acc[e][1], acc[e][2], acc[e][3]);
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < Dk * kSliceColumns; idx += blockDim.x) {
    const int d = idx / kSliceColumns, col = slice0 + idx % kSliceColumns;
    if (col < Dv) state[int64_t(d) * Dv + col] = S[idx];
  }
}

// ---------- the scan on tensor cores ----------
//
// The same recurrence as gdn_chunk_scan_kernel, with its four products on mma.sync.m16n8k8 tf32 (operands rounded
// to nearest tf32, 11 significant bits; accumulators f32). The state slice lives in f32: each warp keeps its tile
// of S in accumulator registers across chunks (S = e^{G_{L-1}} S + K^T (e^{G_{L-1}-G} u) accumulates onto it), and
// a copy in shared memory serves as the B operand of W S and Q S. One block of 8 warps owns 64 value columns of one
// (sequence, value head). Per chunk, two cp.async groups bring the chunk's operands in while the other half of the
// previous work runs: group A (W^T, Q) lands during the previous chunk's o and state update, group B (K, P^T, the
// decays) during this chunk's W S / Q S.
namespace mma {

constexpr int kSlice = 64;              // value columns per block
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxDk = 128;
constexpr int kStride = kSlice + 8;     // rows of S, U, W^T, P^T: 8 t + g banks for the fragment loads
static_assert(L == kSlice, "W^T and P^T rows (L wide) share kStride with the slice's rows");

__host__ __device__ constexpr int q_stride(int Dk) { return Dk + 4; }                  // 4 g + t banks
__host__ __device__ constexpr int k_stride(int Dk) { return Dk + (40 - Dk % 32) % 32; }  // == 8 (mod 32): 8 t + g

struct Smem {
  float *S, *U, *Wt, *Q, *K, *Pt, *decay;  // decay: e^{G_i} [L] then e^{G_{L-1} - G_i} [L]
  __host__ __device__ static size_t floats(int Dk) {
    return size_t(Dk) * kStride + size_t(L) * kStride + size_t(Dk) * kStride + size_t(L) * q_stride(Dk) +
           size_t(L) * k_stride(Dk) + size_t(L) * kStride + 2 * size_t(L);
  }
  __device__ Smem(float* base, int Dk) {
    S = base;
    U = S + Dk * kStride;
    Wt = U + L * kStride;
    Q = Wt + Dk * kStride;
    K = Q + L * q_stride(Dk);
    Pt = K + L * k_stride(Dk);
    decay = Pt + L * kStride;
  }
};

// `rows` rows of `cols` floats (a multiple of 4) from src (row stride src_stride) to dst (row stride dst_stride);
// rows past `valid` are zero-filled (their source address stays in bounds: row 0).
__device__ __forceinline__ void copy_rows_async(float* dst, int dst_stride, const float* src, int64_t src_stride,
                                                int rows, int cols, int valid) {
  const int per_row = cols / 4;
  for (int idx = threadIdx.x; idx < rows * per_row; idx += kThreads) {
    const int r = idx / per_row, c = 4 * (idx % per_row);
    cp_async16(dst + r * dst_stride + c, src + (r < valid ? r * src_stride : 0) + c, r < valid);
  }
}

__global__ void __launch_bounds__(kThreads) gdn_chunk_scan_mma_kernel(ChunkedArgs c) {
  const GdnPrefillArgs& a = c.a;
  const ScanBlock b(a, kSlice);
  const int Dk = b.Dk, Dv = b.Dv, Hk = b.Hk, Hv = b.Hv, slice0 = b.slice0, head = b.head, seq = b.seq,
            key_head = b.key_head;
  extern __shared__ float4 shared4[];
  const Smem sm(reinterpret_cast<float*>(shared4), Dk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Phases 1-2 tile the chunk's [L, 64] products: rows 16 rm.., columns 32 cn.. (4 n-tiles of 8).
  // Phase 3 tiles S [Dk, 64]: m-tiles rm and rm + 4 (those below Dk), the same columns.
  const int rm = warp % 4, cn = warp / 4, row0 = 16 * rm, col0 = 32 * cn;
  const int m_tiles = Dk / 16;

  const DeviceSequence& s = b.s;
  float* state = b.state;
  const ChunkBlock& layout = b.layout;
  const int64_t chunks = b.chunks;
  float* const first_block = c.work + (c.t.first_chunk[seq] * Hv + head) * layout.floats();
  auto chunk_block = [&](int64_t j) { return first_block + j * Hv * layout.floats(); };
  const int64_t qk_row_stride = int64_t(Hk) * Dk;
  auto issue_group_a = [&](int64_t j) {  // W^T [Dk, L] and Q [rows, Dk] of chunk j
    copy_rows_async(sm.Wt, kStride, layout.w_t(chunk_block(j)), L, Dk, L, Dk);
    const int64_t t0 = s.row0 + j * L;
    copy_rows_async(sm.Q, q_stride(Dk), a.q + t0 * qk_row_stride + key_head * Dk, qk_row_stride, L, Dk,
                    rows_in_chunk(s.n, j));
    cp_async_commit();
  };
  auto issue_group_b = [&](int64_t j) {  // K [rows, Dk], P^T [L, L], both decay vectors of chunk j
    const int64_t t0 = s.row0 + j * L;
    copy_rows_async(sm.K, k_stride(Dk), a.k + t0 * qk_row_stride + key_head * Dk, qk_row_stride, L, Dk,
                    rows_in_chunk(s.n, j));
    copy_rows_async(sm.Pt, kStride, layout.p_t(chunk_block(j)), L, L, L, L);
    copy_rows_async(sm.decay, 0, layout.decay_in(chunk_block(j)), 0, 1, 2 * L, 1);
    cp_async_commit();
  };
  if (chunks > 0) {
    issue_group_a(0);
    issue_group_b(0);
  }

  // The starting state slice: into shared memory, then each warp's phase-3 tiles into registers.
  b.load_state(sm.S, kSlice, kStride);
  __syncthreads();
  float st[2][4][4];  // st[mi][nt]: m-tile rm + 4 mi, n-tile nt of this warp's columns, C layout
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int r = 16 * (rm + 4 * mi) + g, col = col0 + 8 * nt + 2 * t;
      const bool own = rm + 4 * mi < m_tiles;
      st[mi][nt][0] = own ? sm.S[r * kStride + col] : 0.0f;
      st[mi][nt][1] = own ? sm.S[r * kStride + col + 1] : 0.0f;
      st[mi][nt][2] = own ? sm.S[(r + 8) * kStride + col] : 0.0f;
      st[mi][nt][3] = own ? sm.S[(r + 8) * kStride + col + 1] : 0.0f;
    }

  for (int64_t j = 0; j < chunks; ++j) {
    const int64_t t0 = s.row0 + j * L;
    const int rows = rows_in_chunk(s.n, j);
    const float* u0 = layout.u0(chunk_block(j));
    float u0v[4][4];  // U0 at this warp's phase-1 tile (rows past the chunk are zeros in the workspace)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = row0 + g + 8 * (e / 2), col = slice0 + col0 + 8 * nt + 2 * t + e % 2;
        u0v[nt][e] = col < Dv ? u0[r * Dv + col] : 0.0f;
      }
    cp_async_wait<1>();  // group A of chunk j is in (group B may still be on its way)
    __syncthreads();              // ... for every thread; and the previous chunk's S is in shared memory

    // Phase 1: ws = W S and qs = Q S on this warp's tile.
    float ws[4][4] = {}, qs[4][4] = {};
    for (int k0 = 0; k0 < Dk; k0 += 8) {
      uint32_t aw[4], aq[4];
      load_a_transposed(aw, sm.Wt, kStride, row0, k0, g, t);
      load_a_rows(aq, sm.Q, q_stride(Dk), row0, k0, g, t);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        uint32_t b[2];
        load_b(b, sm.S, kStride, k0, col0 + 8 * nt, g, t);
        mma_tf32(ws[nt], aw, b);
        mma_tf32(qs[nt], aq, b);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {  // u = U0 - W S
      const int col = col0 + 8 * nt + 2 * t;
      *reinterpret_cast<float2*>(sm.U + (row0 + g) * kStride + col) =
          make_float2(u0v[nt][0] - ws[nt][0], u0v[nt][1] - ws[nt][1]);
      *reinterpret_cast<float2*>(sm.U + (row0 + g + 8) * kStride + col) =
          make_float2(u0v[nt][2] - ws[nt][2], u0v[nt][3] - ws[nt][3]);
    }
    __syncthreads();  // U complete; W^T and Q free
    if (j + 1 < chunks)
      issue_group_a(j + 1);
    else
      cp_async_commit();  // an empty group keeps the count in flight the same
    cp_async_wait<1>();  // group B of chunk j is in
    __syncthreads();

    // Phase 2: o = e^G (Q S) + P u on this warp's tile; P is lower triangular, so k stops at the tile's last row.
    {
      float o[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] = sm.decay[row0 + g + 8 * (e / 2)] * qs[nt][e];
      for (int k0 = 0; k0 < row0 + 16; k0 += 8) {
        uint32_t ap[4];
        load_a_transposed(ap, sm.Pt, kStride, row0, k0, g, t);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          uint32_t b[2];
          load_b(b, sm.U, kStride, k0, col0 + 8 * nt, g, t);
          mma_tf32(o[nt], ap, b);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = row0 + g + 8 * (e / 2), col = slice0 + col0 + 8 * nt + 2 * t + e % 2;
          if (r < rows && col < Dv) a.out[((t0 + r) * Hv + head) * Dv + col] = o[nt][e];
        }
    }

    // Phase 3: S = e^{G_{L-1}} S + K^T (e^{G_{L-1} - G} u) onto the register tiles, then into shared memory.
    {
      const float chunk_decay = sm.decay[rows - 1];
      const float* decay_out = sm.decay + L;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) st[mi][nt][e] *= chunk_decay;
      for (int k0 = 0; k0 < L; k0 += 8) {
        uint32_t b[4][2];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int n = col0 + 8 * nt + g;
          b[nt][0] = tf32(decay_out[k0 + t] * sm.U[(k0 + t) * kStride + n]);
          b[nt][1] = tf32(decay_out[k0 + t + 4] * sm.U[(k0 + t + 4) * kStride + n]);
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          if (rm + 4 * mi >= m_tiles) continue;
          uint32_t ak[4];  // A = K^T: element (d, i) = K[i, d]
          load_a_transposed(ak, sm.K, k_stride(Dk), 16 * (rm + 4 * mi), k0, g, t);
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) mma_tf32(st[mi][nt], ak, b[nt]);
        }
      }
    }
    __syncthreads();  // every warp is done reading K, P^T, U and the decays, and (phase 1) S
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      if (rm + 4 * mi >= m_tiles) continue;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int r = 16 * (rm + 4 * mi) + g, col = col0 + 8 * nt + 2 * t;
        *reinterpret_cast<float2*>(sm.S + r * kStride + col) = make_float2(st[mi][nt][0], st[mi][nt][1]);
        *reinterpret_cast<float2*>(sm.S + (r + 8) * kStride + col) = make_float2(st[mi][nt][2], st[mi][nt][3]);
      }
    }
    if (j + 1 < chunks) issue_group_b(j + 1);
    else cp_async_commit();
  }

  // Write the final state slice from the register tiles.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    if (rm + 4 * mi >= m_tiles) continue;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * (rm + 4 * mi) + g + 8 * (e / 2), col = slice0 + col0 + 8 * nt + 2 * t + e % 2;
        if (col < Dv) state[int64_t(r) * Dv + col] = st[mi][nt][e];
      }
  }
}

}  // namespace mma

size_t prepare_shared_bytes(int Dk) {
  return size_t(L) * kAStride * 4 + size_t(L) * 8 + 2 * size_t(L) * 4 + 2 * size_t(Dk) * kTStride * 4;
}

size_t scan_shared_bytes(int Dk) {
  return (size_t(Dk) * kSliceColumns + size_t(L) * kSliceColumns + size_t(Dk) * L + size_t(Dk > L ? Dk : L) * L +
          2 * size_t(L)) * 4;
}

}  // namespace

void gdn_prefill_sequential(const GdnPrefillArgs& a, cudaStream_t stream) {
  if (a.num_seqs == 0) return;
  const dim3 grid(unsigned(a.num_seqs), unsigned(a.num_value_heads));
  const int threads = a.value_head_dim >= 128 ? 128 : 64;
  gdn_sequence_kernel<<<grid, threads, 2 * a.key_head_dim * sizeof(float), stream>>>(a);
  NINFER_CUDA_CHECK_LAUNCH();
}

bool gdn_chunked_supported(int32_t key_head_dim) {
  return key_head_dim > 0 && key_head_dim % 8 == 0 && key_head_dim <= 256;
}

size_t gdn_chunked_workspace_floats(int64_t total_chunks, int32_t num_value_heads, int32_t key_head_dim,
                                    int32_t value_head_dim) {
  return size_t(total_chunks) * size_t(num_value_heads) * size_t(ChunkBlock{key_head_dim, value_head_dim}.floats());
}

namespace {
void check_chunked_supported(int32_t key_head_dim) {
  if (!gdn_chunked_supported(key_head_dim))
    throw EngineError("gdn_prefill_chunked: key head dim " + std::to_string(key_head_dim) +
                      " is not a multiple of 8 up to 256");
}
}  // namespace

bool gdn_scan_mma_supported(int32_t key_head_dim) {
  return key_head_dim > 0 && key_head_dim % 16 == 0 && key_head_dim <= mma::kMaxDk;
}

void gdn_chunk_prepare(const GdnPrefillArgs& a, const GdnChunkTables& t, float* workspace, cudaStream_t stream) {
  if (a.num_seqs == 0 || t.total_chunks == 0) return;
  check_chunked_supported(a.key_head_dim);
  const size_t bytes = prepare_shared_bytes(a.key_head_dim);
  NINFER_CUDA_CHECK(
      cudaFuncSetAttribute(gdn_chunk_prepare_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  const dim3 grid(unsigned(t.total_chunks), unsigned(a.num_value_heads));
  gdn_chunk_prepare_kernel<<<grid, kPrepareThreads, bytes, stream>>>(ChunkedArgs{a, t, workspace});
  NINFER_CUDA_CHECK_LAUNCH();
}

void gdn_chunk_scan(const GdnPrefillArgs& a, const GdnChunkTables& t, float* workspace, GdnScanImpl impl,
                    cudaStream_t stream) {
  if (a.num_seqs == 0 || t.total_chunks == 0) return;
  check_chunked_supported(a.key_head_dim);
  const ChunkedArgs args{a, t, workspace};
  if (impl == GdnScanImpl::tensor_cores && gdn_scan_mma_supported(a.key_head_dim)) {
    const size_t bytes = mma::Smem::floats(a.key_head_dim) * sizeof(float);
    NINFER_CUDA_CHECK(cudaFuncSetAttribute(mma::gdn_chunk_scan_mma_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    const dim3 grid(unsigned((a.value_head_dim + mma::kSlice - 1) / mma::kSlice), unsigned(a.num_value_heads),
                    unsigned(a.num_seqs));
    mma::gdn_chunk_scan_mma_kernel<<<grid, mma::kThreads, bytes, stream>>>(args);
    NINFER_CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t bytes = scan_shared_bytes(a.key_head_dim);
  NINFER_CUDA_CHECK(
      cudaFuncSetAttribute(gdn_chunk_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  const dim3 grid(unsigned((a.value_head_dim + kSliceColumns - 1) / kSliceColumns), unsigned(a.num_value_heads),
                  unsigned(a.num_seqs));
  gdn_chunk_scan_kernel<<<grid, kScanThreads, bytes, stream>>>(args);
  NINFER_CUDA_CHECK_LAUNCH();
}

void gdn_prefill_chunked(const GdnPrefillArgs& a, const GdnChunkTables& t, float* workspace, GdnScanImpl impl,
                         cudaStream_t stream) {
  gdn_chunk_prepare(a, t, workspace, stream);
  gdn_chunk_scan(a, t, workspace, impl, stream);
}

}  // namespace ninfer::cuda
