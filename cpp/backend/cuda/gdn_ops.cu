// Gated DeltaNet ops of the CUDA backend: the causal conv (parallel over tiles of a sequence's rows and over
// channels), the gates, and the delta rule: the decode kernel (gdn_decode.cu) when every sequence has one new token,
// else the chunked prefill kernels (gdn_prefill.cu), or their token-by-token twin when the key head dim is one the
// chunked kernels do not take or the backend is set to use the slow twins.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gdn_decode.h"
#include "backend/cuda/gdn_prefill.h"
#include "runtime/state_pool.h"

namespace ninfer::cuda {
namespace {

constexpr int kMaxConvKernel = 8;
// Rows of one sequence per conv tile. A tile re-reads the K-1 rows before it, so longer tiles read less twice;
// at least K-1 rows, so that only a sequence's first tile reads its carried history.
constexpr int32_t kConvTileRows = 32;
constexpr int kConvThreads = 128;  // channels per block
static_assert(kConvTileRows >= kMaxConvKernel - 1);

// Rows [t0, t0 + kConvTileRows) (clipped to its length) of sequence `seq`.
struct ConvTile {
  int32_t seq;
  int32_t t0;
};

// out[t, c] = silu(sum_j w[c, j] * input(t - (K-1) + j, c)), where input(t) for t < 0 is the carried history
// (oldest first), for the tile's rows of one sequence and one channel per thread. The thread with a sequence's
// first tile also writes that sequence's new history (the last K-1 entries of [old history | inputs]): no other
// thread reads the history, since later tiles start at least K-1 rows in.
template <int K>
__global__ void __launch_bounds__(kConvThreads) gdn_conv_kernel(const float* mixed, const ConvTile* tiles,
                                                                const DeviceSequence* seqs,
                                                                float* const* conv_states, int64_t C,
                                                                const float* weight, float* out) {
  constexpr int hist = K - 1;
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const ConvTile tile = tiles[blockIdx.x];
  const DeviceSequence s = seqs[tile.seq];
  float* state = conv_states[tile.seq] + c * hist;
  const float* x = mixed + s.row0 * C + c;  // x[t * C]: input t of this sequence and channel
  float taps[K], window[K];                 // window[j]: input t - (K-1) + j
#pragma unroll
  for (int j = 0; j < K; ++j) taps[j] = weight[c * K + j];
  float old_history[hist > 0 ? hist : 1];
#pragma unroll
  for (int j = 0; j < hist; ++j) {
    const int64_t t = int64_t(tile.t0) - hist + j;
    if (tile.t0 == 0) old_history[j] = state[j];
    window[j] = t >= 0 ? x[t * C] : state[hist + t];
  }
  const int64_t t1 = min(s.n, int64_t(tile.t0) + kConvTileRows);
  for (int64_t t = tile.t0; t < t1; ++t) {
    window[hist] = x[t * C];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc += taps[j] * window[j];
    out[(s.row0 + t) * C + c] = silu(acc);
#pragma unroll
    for (int j = 0; j < hist; ++j) window[j] = window[j + 1];
  }
  if (tile.t0 != 0) return;
#pragma unroll
  for (int i = 0; i < hist; ++i) {  // entry i is position i + n of [old history | inputs]
    const int64_t from = i + s.n;
    float v = 0.0f;
    if (from >= hist) v = x[(from - hist) * C];
#pragma unroll
    for (int j = 0; j < hist; ++j)  // select rather than index, so that old_history stays in registers
      if (from == j) v = old_history[j];
    state[i] = v;
  }
}

template <int K>
void launch_gdn_conv(dim3 grid, cudaStream_t stream, const float* mixed, const ConvTile* tiles,
                     const DeviceSequence* seqs, float* const* conv_states, int64_t C, const float* weight,
                     float* out) {
  gdn_conv_kernel<K><<<grid, kConvThreads, 0, stream>>>(mixed, tiles, seqs, conv_states, C, weight, out);
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
  std::vector<ConvTile> tiles;
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int64_t t0 = 0; t0 < seqs[i].n; t0 += kConvTileRows) tiles.push_back({int32_t(i), int32_t(t0)});
  if (tiles.empty()) return;
  if (tiles.size() > 0x7fffffffu) throw EngineError("CUDA gdn_conv: too many rows for one launch");
  HostTables tables;
  const size_t at_seqs = tables.add(device_seqs.data(), device_seqs.size());
  const size_t at_states = tables.add(conv_states.data(), conv_states.size());
  const size_t at_tiles = tables.add(tiles.data(), tiles.size());
  const uint8_t* base = upload(tables);
  const dim3 grid(unsigned(tiles.size()), unsigned((C + kConvThreads - 1) / kConvThreads));
  using Launch = void (*)(dim3, cudaStream_t, const float*, const ConvTile*, const DeviceSequence*, float* const*,
                          int64_t, const float*, float*);
  constexpr Launch launches[kMaxConvKernel] = {launch_gdn_conv<1>, launch_gdn_conv<2>, launch_gdn_conv<3>,
                                               launch_gdn_conv<4>, launch_gdn_conv<5>, launch_gdn_conv<6>,
                                               launch_gdn_conv<7>, launch_gdn_conv<8>};
  launches[shape.conv_kernel - 1](grid, stream_, mixed, reinterpret_cast<const ConvTile*>(base + at_tiles),
                                  reinterpret_cast<const DeviceSequence*>(base + at_seqs),
                                  reinterpret_cast<float* const*>(base + at_states), C,
                                  resident(weight, C * shape.conv_kernel), out);
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
