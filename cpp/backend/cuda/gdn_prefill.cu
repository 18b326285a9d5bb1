// Gated delta rule over many new tokens (gdn_prefill.h). The chunked form, per value head and chunk of L <= 64
// tokens (positions i, m), with S0 the state entering the chunk, G_i = g_0 + .. + g_i and T = (I - A)^-1 where
// A[i, m] = -beta_i e^{G_i - G_m} (k_i . k_m) for m < i (the CPU twin's forward substitution, as a matrix):
//   W  = T diag(beta e^G) K     [L, Dk]   and   U0 = T diag(beta) V   [L, Dv]      (no state: chunk-parallel)
//   P[i, m] = e^{G_i - G_m} (q_i . k_m) for m <= i                                   (no state: chunk-parallel)
//   u  = U0 - W S0                       (the deltas written at each token)
//   o  = diag(e^G) Q S0 + P u
//   S  = e^{G_{L-1}} S0 + (diag(e^{G_{L-1} - G}) K)^T u
// Kernel 1 (prepare) computes W, U0, P and the decay factors for every (chunk, value head) at once; kernel 2
// (scan) walks the chunks of a sequence in order for one slice of 32 value columns — the columns of S evolve
// independently — keeping that slice of the state in shared memory. All arithmetic is f32 (cumulative decay in
// f64, as in the CPU twin).
#include "backend/cuda/gdn_prefill.h"

#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {
namespace {

constexpr int L = kGdnChunk;
constexpr int kAStride = L + 4;       // row stride of A in shared memory: 16-byte rows, stores free of conflicts
constexpr int kSliceColumns = 32;     // value columns per scan block
constexpr int kPrepareThreads = 256;  // a 16 x 16 grid of 4 x 4 tiles of the L x L products
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

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// dst[d, i] = src row i (rows t0 .. t0 + rows - 1 of a [*, heads, Dk] tensor, head `head`) for i < L, zeros past
// `rows`. Consecutive threads take consecutive rows, so the shared-memory stores hit distinct banks.
__device__ void load_transposed(const float* src, int64_t t0, int rows, int heads, int head, int Dk, float* dst) {
  for (int idx = threadIdx.x; idx < L * (Dk / 4); idx += blockDim.x) {
    const int i = idx % L, d = 4 * (idx / L);
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < rows) x = load4(src + ((t0 + i) * heads + head) * Dk + d);
    dst[(d + 0) * L + i] = x.x;
    dst[(d + 1) * L + i] = x.y;
    dst[(d + 2) * L + i] = x.z;
    dst[(d + 3) * L + i] = x.w;
  }
}

// Kernel 1: one block per (chunk, value head). Builds A and P from the chunk's k and q (4 x 4 register tiles,
// interleaved so that a warp's shared loads are broadcasts or consecutive words), then solves
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
  float* k_t = decay_in + L;  // [Dk, L]
  float* q_t = k_t + Dk * L;  // [Dk, L]

  const GdnChunkRef ref = c.t.chunks[blockIdx.x];
  const int head = blockIdx.y, key_head = head / (Hv / Hk);
  const DeviceSequence s = a.seqs[ref.seq];
  const int64_t t0 = s.row0 + int64_t(ref.chunk) * L;
  const int rows = rows_in_chunk(s.n, ref.chunk);
  const ChunkBlock layout{Dk, Dv};
  float* block = c.work + (int64_t(blockIdx.x) * Hv + head) * layout.floats();

  load_transposed(a.k, t0, rows, Hk, key_head, Dk, k_t);
  load_transposed(a.q, t0, rows, Hk, key_head, Dk, q_t);
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

  // k.k (for A) and q.k (for P) over the chunk; thread (ti, tj) owns rows ti + 16a and columns tj + 16b.
  const int ti = threadIdx.x / 16, tj = threadIdx.x % 16;
  float kk[4][4] = {}, qk[4][4] = {};  // kk[a][b] = k_{ti+16a} . k_{tj+16b}; qk[a][b] = q_{tj+16b} . k_{ti+16a}
  for (int d = 0; d < Dk; ++d) {
    float kr[4], kc[4], qc[4];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      kr[x] = k_t[d * L + ti + 16 * x];
      kc[x] = k_t[d * L + tj + 16 * x];
      qc[x] = q_t[d * L + tj + 16 * x];
    }
#pragma unroll
    for (int x = 0; x < 4; ++x)
#pragma unroll
      for (int y = 0; y < 4; ++y) {
        kk[x][y] = fmaf(kr[x], kc[y], kk[x][y]);
        qk[x][y] = fmaf(kr[x], qc[y], qk[x][y]);
      }
  }
  float* p_t = layout.p_t(block);
#pragma unroll
  for (int x = 0; x < 4; ++x)
#pragma unroll
    for (int y = 0; y < 4; ++y) {
      {  // A[i, m], i = ti + 16x, m = tj + 16y: strictly lower; the exponent is only evaluated where it is <= 0
        const int i = ti + 16 * x, m = tj + 16 * y;
        A[i * kAStride + m] = (m < i && i < rows) ? -beta[i] * expf(float(cum[i] - cum[m])) * kk[x][y] : 0.0f;
      }
      {  // P[i, m], i = tj + 16y, m = ti + 16x: lower with the diagonal, stored transposed (consecutive i)
        const int i = tj + 16 * y, m = ti + 16 * x;
        p_t[m * L + i] = (m <= i && i < rows) ? expf(float(cum[i] - cum[m])) * qk[x][y] : 0.0f;
      }
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
      for (int i = 0; i < L; ++i) x[i] = beta[i] * decay_in[i] * k_t[col * L + i];
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
  const int Dk = a.key_head_dim, Dv = a.value_head_dim, Hk = a.num_key_heads, Hv = a.num_value_heads;
  const int slice0 = blockIdx.x * kSliceColumns, head = blockIdx.y, seq = blockIdx.z;
  const int key_head = head / (Hv / Hk);
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

  const DeviceSequence s = a.seqs[seq];
  float* state = a.states[seq] + int64_t(head) * Dk * Dv;
  for (int idx = threadIdx.x; idx < Dk * kSliceColumns; idx += blockDim.x) {
    const int d = idx / kSliceColumns, col = slice0 + idx % kSliceColumns;
    S[idx] = col < Dv ? state[int64_t(d) * Dv + col] : 0.0f;
  }
  const ChunkBlock layout{Dk, Dv};
  const int ti = threadIdx.x / 8, tj = threadIdx.x % 8;  // rows 4ti.., columns 4tj.. of the [L, 32] products
  const int64_t chunks = (s.n + L - 1) / L;
  for (int64_t j = 0; j < chunks; ++j) {
    const int64_t t0 = s.row0 + j * L;
    const int rows = rows_in_chunk(s.n, j);
    float* block = c.work + ((c.t.first_chunk[seq] + j) * Hv + head) * layout.floats();
    __syncthreads();  // the previous chunk is done with every buffer; its state writes are visible
    {
      const float4* src = reinterpret_cast<const float4*>(layout.w_t(block));
      for (int idx = threadIdx.x; idx < Dk * L / 4; idx += blockDim.x) reinterpret_cast<float4*>(buf1)[idx] = src[idx];
    }
    load_transposed(a.q, t0, rows, Hk, key_head, Dk, buf2);
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

size_t prepare_shared_bytes(int Dk) {
  return size_t(L) * kAStride * 4 + size_t(L) * 8 + 2 * size_t(L) * 4 + 2 * size_t(Dk) * L * 4;
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

void gdn_prefill_chunked(const GdnPrefillArgs& a, const GdnChunkTables& t, float* workspace, cudaStream_t stream) {
  if (a.num_seqs == 0 || t.total_chunks == 0) return;
  if (!gdn_chunked_supported(a.key_head_dim))
    throw EngineError("gdn_prefill_chunked: key head dim " + std::to_string(a.key_head_dim) +
                      " is not a multiple of 8 up to 256");
  const ChunkedArgs args{a, t, workspace};
  const size_t prepare_bytes = prepare_shared_bytes(a.key_head_dim), scan_bytes = scan_shared_bytes(a.key_head_dim);
  NINFER_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_prepare_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(prepare_bytes)));
  NINFER_CUDA_CHECK(
      cudaFuncSetAttribute(gdn_chunk_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(scan_bytes)));
  const dim3 prepare_grid(unsigned(t.total_chunks), unsigned(a.num_value_heads));
  gdn_chunk_prepare_kernel<<<prepare_grid, kPrepareThreads, prepare_bytes, stream>>>(args);
  NINFER_CUDA_CHECK_LAUNCH();
  const dim3 scan_grid(unsigned((a.value_head_dim + kSliceColumns - 1) / kSliceColumns), unsigned(a.num_value_heads),
                       unsigned(a.num_seqs));
  gdn_chunk_scan_kernel<<<scan_grid, kScanThreads, scan_bytes, stream>>>(args);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
