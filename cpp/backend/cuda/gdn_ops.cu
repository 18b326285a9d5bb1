// Gated DeltaNet ops of the CUDA backend: the causal conv (one thread per sequence and channel, carrying the
// window in registers), the gates, and the delta rule: the decode kernel (gdn_decode.cu) when every sequence has
// one new token, else a per-token loop with one block per (sequence, value head) and one thread per state column.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gdn_decode.h"
#include "runtime/state_pool.h"

namespace ninfer::cuda {
namespace {

constexpr int kMaxConvKernel = 8;

// out[t, c] = silu(sum_j w[c, j] * input(t - (K-1) + j, c)); the window starts as the carried history (oldest
// first) and the last K-1 inputs become the new history.
__global__ void gdn_conv_kernel(const float* mixed, const DeviceSequence* seqs, float* const* conv_states, int64_t C,
                                const float* weight, int32_t K, float* out) {
  const DeviceSequence s = seqs[blockIdx.y];
  float* state = conv_states[blockIdx.y];
  const int32_t hist = K - 1;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    float window[kMaxConvKernel], taps[kMaxConvKernel];
    for (int32_t j = 0; j < K; ++j) taps[j] = weight[c * K + j];
    for (int32_t j = 0; j < hist; ++j) window[j] = state[c * hist + j];
    for (int64_t t = 0; t < s.n; ++t) {
      const float x = mixed[(s.row0 + t) * C + c];
      float acc = 0.0f;
      for (int32_t j = 0; j < hist; ++j) acc += taps[j] * window[j];
      acc += taps[hist] * x;
      out[(s.row0 + t) * C + c] = silu(acc);
      for (int32_t j = 0; j + 1 < hist; ++j) window[j] = window[j + 1];
      if (hist > 0) window[hist - 1] = x;
    }
    for (int32_t j = 0; j < hist; ++j) state[c * hist + j] = window[j];
  }
}

__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

__global__ void gdn_gates_kernel(const float* a, const float* b, int64_t rows, int32_t heads, const float* A_log,
                                 const float* dt_bias, float* g, float* beta) {
  NINFER_GRID_STRIDE(i, rows * heads) {
    const int64_t h = i % heads;
    g[i] = -expf(A_log[h]) * softplus(a[i] + dt_bias[h]);
    beta[i] = 1.0f / (1.0f + expf(-b[i]));
  }
}

// The recurrent rule token by token for one (sequence, value head); thread c owns column c of S [Dk, Dv]:
// S = exp(g) S; p = S^T k; S += k (beta (v - p))^T; o = S^T q, in the CPU reference's order.
__global__ void gdn_sequence_kernel(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                    const DeviceSequence* seqs, float* const* states, GdnShape shape, float* out) {
  extern __shared__ float qk[];  // q then k of the current token, Dk each
  const DeviceSequence s = seqs[blockIdx.x];
  const int32_t j = blockIdx.y, Hk = shape.num_key_heads, Hv = shape.num_value_heads, Dk = shape.key_head_dim,
                Dv = shape.value_head_dim, h = j / (Hv / Hk);
  float* S = states[blockIdx.x] + int64_t(j) * Dk * Dv;
  for (int64_t t = 0; t < s.n; ++t) {
    const int64_t r = s.row0 + t;
    __syncthreads();  // the previous token is done with qk
    for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
      qk[i] = q[(r * Hk + h) * Dk + i];
      qk[Dk + i] = k[(r * Hk + h) * Dk + i];
    }
    __syncthreads();
    const float decay = expf(g[r * Hv + j]), b = beta[r * Hv + j];
    for (int c = threadIdx.x; c < Dv; c += blockDim.x) {
      float p = 0.0f;
      for (int i = 0; i < Dk; ++i) {
        const float x = S[int64_t(i) * Dv + c] * decay;
        S[int64_t(i) * Dv + c] = x;
        p += x * qk[Dk + i];
      }
      const float delta = b * (v[(r * Hv + j) * Dv + c] - p);
      float o = 0.0f;
      for (int i = 0; i < Dk; ++i) {
        const float x = S[int64_t(i) * Dv + c] + qk[Dk + i] * delta;
        S[int64_t(i) * Dv + c] = x;
        o += x * qk[i];
      }
      out[(r * Hv + j) * Dv + c] = o;
    }
  }
}

bool decode_kernel_supports(int32_t key_head_dim) {
  for (int32_t d : {16, 32, 64, 128, 256})
    if (key_head_dim == d) return true;
  return false;
}

}  // namespace

void CudaBackend::gdn_conv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                           const float* weight, StatePool& states, int32_t layer, float* out) {
  if (seqs.empty()) return;
  if (shape.conv_kernel < 1 || shape.conv_kernel > kMaxConvKernel)
    throw EngineError("CUDA gdn_conv: kernel width " + std::to_string(shape.conv_kernel) + " outside 1.." +
                      std::to_string(kMaxConvKernel));
  const int64_t C = shape.conv_channels();
  std::vector<DeviceSequence> device_seqs;
  std::vector<float*> conv_states;
  for (const SequenceRows& s : seqs) {
    device_seqs.push_back({s.row0, s.n, s.start, 0});
    conv_states.push_back(states.conv(s.state_slot, layer));
  }
  HostTables tables;
  const size_t at_seqs = tables.add(device_seqs.data(), device_seqs.size());
  const size_t at_states = tables.add(conv_states.data(), conv_states.size());
  const uint8_t* base = upload(tables);
  const dim3 grid(blocks_for(C, 128), unsigned(seqs.size()));
  gdn_conv_kernel<<<grid, 128, 0, stream_>>>(mixed, reinterpret_cast<const DeviceSequence*>(base + at_seqs),
                                             reinterpret_cast<float* const*>(base + at_states), C,
                                             resident(weight, C * shape.conv_kernel), shape.conv_kernel, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_gates(const float* a, const float* b, int64_t rows, int32_t heads, const float* A_log,
                            const float* dt_bias, float* g, float* beta) {
  if (rows * heads <= 0) return;
  gdn_gates_kernel<<<blocks_for(rows * heads), kThreads, 0, stream_>>>(a, b, rows, heads, resident(A_log, heads),
                                                                       resident(dt_bias, heads), g, beta);
  NINFER_CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                           std::span<const SequenceRows> seqs, const GdnShape& shape, StatePool& states,
                           int32_t layer, float* out) {
  if (seqs.empty()) return;
  bool decode_batch = decode_kernel_supports(shape.key_head_dim);
  std::vector<DeviceSequence> device_seqs;
  std::vector<float*> recurrent;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceRows& s = seqs[i];
    decode_batch = decode_batch && s.n == 1 && s.row0 == int64_t(i);
    device_seqs.push_back({s.row0, s.n, s.start, 0});
    recurrent.push_back(states.recurrent(s.state_slot, layer));
  }
  HostTables tables;
  const size_t at_seqs = tables.add(device_seqs.data(), device_seqs.size());
  const size_t at_states = tables.add(recurrent.data(), recurrent.size());
  const uint8_t* base = upload(tables);
  float* const* device_states = reinterpret_cast<float* const*>(base + at_states);
  if (decode_batch) {  // rows 0..B-1 are the B sequences' single tokens: the layout gdn_decode takes
    GdnDecodeArgs args;
    args.batch = int32_t(seqs.size());
    args.num_key_heads = shape.num_key_heads;
    args.num_value_heads = shape.num_value_heads;
    args.key_head_dim = shape.key_head_dim;
    args.value_head_dim = shape.value_head_dim;
    args.q = q;
    args.k = k;
    args.v = v;
    args.g = g;
    args.beta = beta;
    args.states = device_states;
    args.out = out;
    gdn_decode(args, stream_);
    return;
  }
  const dim3 grid(unsigned(seqs.size()), unsigned(shape.num_value_heads));
  const int threads = shape.value_head_dim >= 128 ? 128 : 64;
  gdn_sequence_kernel<<<grid, threads, 2 * shape.key_head_dim * sizeof(float), stream_>>>(
      q, k, v, g, beta, reinterpret_cast<const DeviceSequence*>(base + at_seqs), device_states, shape, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
