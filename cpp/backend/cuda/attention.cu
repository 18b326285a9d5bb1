// Paged causal attention of the CUDA backend: KV writes into 64-token pages and GQA softmax attention over them,
// one block per (row, query head) with an online softmax over tiles of keys (no score row in memory).
#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "runtime/kv_codec.h"
#include "runtime/kv_pool.h"

namespace ninfer::cuda {
namespace {

constexpr int kAttnThreads = 128;
constexpr int kMaxHeadDim = 4 * kAttnThreads;  // each thread owns up to 4 output dims

// The KV element codecs of runtime/kv_codec.h on the device; bf16 rounds to nearest even like f32_to_bf16.
template <class E>
struct DeviceCodec;
template <>
struct DeviceCodec<float> {
  __device__ static float load(float e) { return e; }
  __device__ static float store(float f) { return f; }
};
template <>
struct DeviceCodec<uint16_t> {
  __device__ static float load(uint16_t e) { return __uint_as_float(uint32_t(e) << 16); }
  __device__ static uint16_t store(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
};

// Layer `layer`'s K (or V) rows: page p starts at base + p * page_bytes; rows of `width` elements.
struct PagedRows {
  uint8_t* base;
  int64_t page_bytes, width;
  template <class E>
  __device__ E* row(const int32_t* pages, int64_t page_offset, int64_t pos) const {
    return reinterpret_cast<E*>(base + pages[page_offset + pos / kKvPageTokens] * page_bytes) +
           (pos % kKvPageTokens) * width;
  }
};

struct SeqTables {
  const DeviceSequence* seqs;
  const int32_t* pages;
  const int32_t* row_seq;
};

template <class E>
__global__ void kv_write_kernel(const float* k, const float* v, SeqTables t, PagedRows kr, PagedRows vr) {
  const int64_t r = blockIdx.x;
  const int32_t si = t.row_seq[r];
  if (si < 0) return;
  const DeviceSequence s = t.seqs[si];
  const int64_t pos = s.start + (r - s.row0);
  E* kd = kr.row<E>(t.pages, s.page_offset, pos);
  E* vd = vr.row<E>(t.pages, s.page_offset, pos);
  for (int64_t j = threadIdx.x; j < kr.width; j += blockDim.x) {
    kd[j] = DeviceCodec<E>::store(k[r * kr.width + j]);
    vd[j] = DeviceCodec<E>::store(v[r * kr.width + j]);
  }
}

template <class E>
__global__ void __launch_bounds__(kAttnThreads)
    attention_kernel(const float* q, int64_t q_row_stride, int64_t q_head_stride, SeqTables t, PagedRows kr,
                     PagedRows vr, AttentionShape shape, float* out) {
  extern __shared__ float q_shared[];  // head_dim
  __shared__ float p_tile[kAttnThreads];
  const int64_t r = blockIdx.x;
  const int32_t h = blockIdx.y, d = shape.head_dim;
  const int32_t si = t.row_seq[r];
  if (si < 0) return;  // a row outside every sequence is left as it was (the CPU twin skips it too)
  const DeviceSequence s = t.seqs[si];
  const int64_t last = s.start + (r - s.row0);
  const int64_t kv_offset = int64_t(h / (shape.num_heads / shape.num_kv_heads)) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) q_shared[i] = q[r * q_row_stride + h * q_head_stride + i];
  __syncthreads();

  float running_max = -INFINITY, running_sum = 0.0f, acc[4] = {0, 0, 0, 0};
  for (int64_t j0 = 0; j0 <= last; j0 += kAttnThreads) {
    const int64_t j = j0 + threadIdx.x;
    float score = -INFINITY;
    if (j <= last) {
      const E* key = kr.row<E>(t.pages, s.page_offset, j) + kv_offset;
      float dot = 0.0f;
      for (int i = 0; i < d; ++i) dot += q_shared[i] * DeviceCodec<E>::load(key[i]);
      score = dot * shape.scale;
    }
    const float new_max = fmaxf(running_max, block_reduce(score, MaxOp{}));
    const float correction = expf(running_max - new_max);  // 0 on the first tile
    const float p = j <= last ? expf(score - new_max) : 0.0f;
    running_sum = running_sum * correction + block_reduce(p, SumOp{});
    p_tile[threadIdx.x] = p;
    __syncthreads();
    const int64_t tile = last - j0 + 1 < kAttnThreads ? last - j0 + 1 : kAttnThreads;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i = threadIdx.x + c * kAttnThreads;
      if (i >= d) break;
      float a = acc[c] * correction;
      for (int64_t jj = 0; jj < tile; ++jj)
        a += p_tile[jj] * DeviceCodec<E>::load(vr.row<E>(t.pages, s.page_offset, j0 + jj)[kv_offset + i]);
      acc[c] = a;
    }
    running_max = new_max;
    __syncthreads();  // p_tile is rewritten by the next tile
  }
  float* o = out + (r * shape.num_heads + h) * d;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int i = threadIdx.x + c * kAttnThreads;
    if (i < d) o[i] = acc[c] / running_sum;
  }
}

PagedRows paged(const KvPool& pool, int32_t layer, bool values) {
  const void* base = values ? pool.v_rows(0, layer) : pool.k_rows(0, layer);
  return {static_cast<uint8_t*>(const_cast<void*>(base)), pool.page_bytes(), pool.row_elements()};
}

// Calls fn(element{}) for the pool's dtype; the dtypes the CUDA kernels do not store yet are refused.
template <class Fn>
void dispatch_kv(KvDtype dtype, Fn&& fn) {
  switch (dtype) {
    case KvDtype::F32: return fn(float{});
    case KvDtype::BF16: return fn(uint16_t{});
    default: break;
  }
  throw EngineError(std::string("CUDA backend: KV cache dtype ") + kv_dtype_name(dtype) + " is not supported yet");
}

}  // namespace

void CudaBackend::kv_write(const float* k, const float* v, std::span<const SequenceRows> seqs, KvPool& pool,
                           int32_t layer) {
  HostTables tables;
  const SequenceOffsets o = add_sequences(seqs, tables);
  if (o.rows <= 0) return;
  const uint8_t* base = upload(tables);
  const SeqTables t{reinterpret_cast<const DeviceSequence*>(base + o.seqs),
                    reinterpret_cast<const int32_t*>(base + o.pages), reinterpret_cast<const int32_t*>(base + o.row_seq)};
  dispatch_kv(pool.dtype(), [&](auto element) {
    kv_write_kernel<decltype(element)><<<unsigned(o.rows), kThreads, 0, stream_>>>(k, v, t, paged(pool, layer, false),
                                                                                    paged(pool, layer, true));
  });
  NINFER_CUDA_CHECK_LAUNCH();
}

void CudaBackend::attention(const float* q, int64_t q_row_stride, int64_t q_head_stride,
                            std::span<const SequenceRows> seqs, const KvPool& pool, int32_t layer,
                            const AttentionShape& shape, float* out) {
  if (shape.head_dim > kMaxHeadDim)
    throw EngineError("CUDA attention: head_dim " + std::to_string(shape.head_dim) + " above " +
                      std::to_string(kMaxHeadDim));
  HostTables tables;
  const SequenceOffsets o = add_sequences(seqs, tables);
  if (o.rows <= 0) return;
  const uint8_t* base = upload(tables);
  const SeqTables t{reinterpret_cast<const DeviceSequence*>(base + o.seqs),
                    reinterpret_cast<const int32_t*>(base + o.pages), reinterpret_cast<const int32_t*>(base + o.row_seq)};
  const dim3 grid(unsigned(o.rows), unsigned(shape.num_heads));
  dispatch_kv(pool.dtype(), [&](auto element) {
    attention_kernel<decltype(element)><<<grid, kAttnThreads, shape.head_dim * sizeof(float), stream_>>>(
        q, q_row_stride, q_head_stride, t, paged(pool, layer, false), paged(pool, layer, true), shape, out);
  });
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
