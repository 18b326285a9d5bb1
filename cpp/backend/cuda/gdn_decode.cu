#include "backend/cuda/gdn_decode.h"

#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {
namespace {

// A block owns 32 value columns of one (sequence, value head) and splits each column's Dk-long reductions over
// kRowSplits warps: warp w holds rows [w Dk/4, (w+1) Dk/4) of its 32 columns in registers. Each warp load reads
// 128 contiguous bytes of a state row, and every thread has Dk/4 independent loads in flight before the first
// FMA (the one-thread-per-column version walked a 128-long dependent chain twice: latency-bound at batch 1).
// The partial sums meet in shared memory, added in warp order.
constexpr int kColumnsPerBlock = 32;
constexpr int kRowSplits = 4;

template <int DK>
__global__ void __launch_bounds__(kColumnsPerBlock * kRowSplits) gdn_decode_kernel(GdnDecodeArgs a) {
  chain_start();
  constexpr int kRows = DK / kRowSplits;
  const int head = blockIdx.x, seq = blockIdx.z;
  const int lane = threadIdx.x % kColumnsPerBlock, part = threadIdx.x / kColumnsPerBlock;
  const int column = blockIdx.y * kColumnsPerBlock + lane;
  const int Dv = a.value_head_dim;
  const int key_head = head / (a.num_value_heads / a.num_key_heads);
  const GdnDecodeRun run = a.runs ? a.runs[seq] : GdnDecodeRun{seq, 1, 0};

  __shared__ float k_shared[DK], q_shared[DK], partial[kRowSplits][kColumnsPerBlock];
  const bool active = column < Dv;
  const int64_t offset = int64_t(head) * DK * Dv + int64_t(part) * kRows * Dv + column;
  const float* state_in = a.states[seq] + offset;
  float s[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) s[r] = active ? state_in[int64_t(r) * Dv] : 0.0f;

  // The run's steps one after another, the state in registers between them.
  for (int t = 0; t < run.n; ++t) {
    const int64_t row = run.row0 + t;
    if (t > 0) __syncthreads();  // every warp is done with the previous step's k, q and partials
    const float* k = a.k + (row * a.num_key_heads + key_head) * DK;
    const float* q = a.q + (row * a.num_key_heads + key_head) * DK;
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
      k_shared[i] = k[i];
      q_shared[i] = q[i];
    }
    const int64_t row_head = row * a.num_value_heads + head;
    const float decay = __expf(a.g[row_head]);
    const float beta = a.beta[row_head];
    const float v = active ? a.v[row_head * Dv + column] : 0.0f;
    __syncthreads();  // k, q in shared memory

    float prediction = 0.0f;  // this warp's rows of (S^T k), before the decay
#pragma unroll
    for (int r = 0; r < kRows; ++r) prediction = fmaf(s[r], k_shared[part * kRows + r], prediction);
    partial[part][lane] = prediction;
    __syncthreads();
    prediction = partial[0][lane];
#pragma unroll
    for (int p = 1; p < kRowSplits; ++p) prediction += partial[p][lane];
    const float delta = beta * (v - decay * prediction);

    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      s[r] = fmaf(k_shared[part * kRows + r], delta, s[r] * decay);
      o = fmaf(s[r], q_shared[part * kRows + r], o);
    }
    if (active) {
      float* state_out = (a.runs ? a.step_states[run.out_first + t] : a.states[seq]) + offset;
#pragma unroll
      for (int r = 0; r < kRows; ++r) state_out[int64_t(r) * Dv] = s[r];
    }
    __syncthreads();  // every warp has read the predictions
    partial[part][lane] = o;
    __syncthreads();
    if (part == 0 && active) {
#pragma unroll
      for (int p = 1; p < kRowSplits; ++p) o += partial[p][lane];
      a.out[row_head * Dv + column] = o;
    }
  }
}

template <int DK>
void launch(const GdnDecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(a.num_value_heads, (a.value_head_dim + kColumnsPerBlock - 1) / kColumnsPerBlock, a.batch);
  launch_chained(gdn_decode_kernel<DK>, grid, dim3(kColumnsPerBlock * kRowSplits), 0, stream, a);
}

}  // namespace

void gdn_decode(const GdnDecodeArgs& a, cudaStream_t stream) {
  if (a.batch == 0) return;
  switch (a.key_head_dim) {
    case 16: return launch<16>(a, stream);
    case 32: return launch<32>(a, stream);
    case 64: return launch<64>(a, stream);
    case 128: return launch<128>(a, stream);
    case 256: return launch<256>(a, stream);
  }
  throw EngineError("gdn_decode: key head dim " + std::to_string(a.key_head_dim) +
                    " is not one the CUDA kernel is built for (16, 32, 64, 128, 256)");
}

}  // namespace ninfer::cuda
