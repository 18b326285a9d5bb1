// Gated DeltaNet ops of the CUDA backend: the causal conv (one thread per sequence and channel, carrying the
// window in registers), the gates, and the delta rule: the decode kernel (gdn_decode.cu) when every sequence has
// one new token, else the chunked prefill kernels (gdn_prefill.cu), or their token-by-token twin when the key
// head dim is one the chunked kernels do not take or the backend is set to use the slow twins.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gdn_decode.h"
#include "backend/cuda/gdn_prefill.h"
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
  if (tables_only()) return;
  const dim3 grid(blocks_for(C, 128), unsigned(seqs.size()));
  gdn_conv_kernel<<<grid, 128, 0, stream_>>>(mixed, reinterpret_cast<const DeviceSequence*>(base + at_seqs),
                                             reinterpret_cast<float* const*>(base + at_states), C,
                                             resident(weight, C * shape.conv_kernel), shape.conv_kernel, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_gates(const float* a, const float* b, int64_t rows, int32_t heads, const float* A_log,
                            const float* dt_bias, float* g, float* beta) {
  if (rows * heads <= 0 || tables_only()) return;
  gdn_gates_kernel<<<blocks_for(rows * heads), kThreads, 0, stream_>>>(a, b, rows, heads, resident(A_log, heads),
                                                                       resident(dt_bias, heads), g, beta);
  NINFER_CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                           std::span<const SequenceRows> seqs, const GdnShape& shape, StatePool& states,
                           int32_t layer, float* out) {
  if (seqs.empty()) return;
  bool decode_batch = !reference_kernels_ && decode_kernel_supports(shape.key_head_dim);
  bool many_tokens = false;  // some sequence has more than one new token: worth the chunked form's workspace
  std::vector<DeviceSequence> device_seqs;
  std::vector<float*> recurrent;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceRows& s = seqs[i];
    decode_batch = decode_batch && s.n == 1 && s.row0 == int64_t(i);
    many_tokens = many_tokens || s.n > 1;
    device_seqs.push_back({s.row0, s.n, s.start, 0});
    recurrent.push_back(states.recurrent(s.state_slot, layer));
  }
  HostTables tables;
  const size_t at_seqs = tables.add(device_seqs.data(), device_seqs.size());
  const size_t at_states = tables.add(recurrent.data(), recurrent.size());
  const uint8_t* base = upload(tables);
  if (tables_only()) return;  // a decode graph pass: no chunk tables follow (one token per sequence)
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
  GdnPrefillArgs args;
  args.num_key_heads = shape.num_key_heads;
  args.num_value_heads = shape.num_value_heads;
  args.key_head_dim = shape.key_head_dim;
  args.value_head_dim = shape.value_head_dim;
  args.q = q;
  args.k = k;
  args.v = v;
  args.g = g;
  args.beta = beta;
  args.num_seqs = int32_t(seqs.size());
  args.seqs = reinterpret_cast<const DeviceSequence*>(base + at_seqs);
  args.states = device_states;
  args.out = out;
  if (reference_kernels_ || !many_tokens || !gdn_chunked_supported(shape.key_head_dim))
    return gdn_prefill_sequential(args, stream_);

  // The chunk list: one entry per (sequence, chunk of 64 rows), and each sequence's first entry.
  std::vector<GdnChunkRef> chunks;
  std::vector<int64_t> first_chunk;
  for (size_t i = 0; i < seqs.size(); ++i) {
    first_chunk.push_back(int64_t(chunks.size()));
    for (int64_t c = 0; c * kGdnChunk < seqs[i].n; ++c) chunks.push_back({int32_t(i), int32_t(c)});
  }
  HostTables chunk_tables;
  const size_t at_chunks = chunk_tables.add(chunks.data(), chunks.size());
  const size_t at_first = chunk_tables.add(first_chunk.data(), first_chunk.size());
  const uint8_t* chunk_base = upload(chunk_tables);
  GdnChunkTables device_chunks;
  device_chunks.total_chunks = int64_t(chunks.size());
  device_chunks.chunks = reinterpret_cast<const GdnChunkRef*>(chunk_base + at_chunks);
  device_chunks.first_chunk = reinterpret_cast<const int64_t*>(chunk_base + at_first);
  float* workspace = scratch(gdn_workspace_, gdn_chunked_workspace_floats(device_chunks.total_chunks,
                                                                          shape.num_value_heads, shape.key_head_dim,
                                                                          shape.value_head_dim));
  // Key head dims under 64 (test models) are too little work for the tensor-core scan to pay; the f32 scan keeps
  // their results comparable to the CPU backend's (tf32 operand rounding can flip a tiny MoE model's routing).
  const bool tensor_cores = !f32_twins_ && shape.key_head_dim >= 64;
  gdn_prefill_chunked(args, device_chunks, workspace, tensor_cores ? GdnScanImpl::tensor_cores : GdnScanImpl::f32,
                      stream_);
}

}  // namespace ninfer::cuda
