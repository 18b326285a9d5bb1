// Gated DeltaNet ops of the CUDA backend: the causal conv (parallel over tiles of a sequence's rows and over
// channels; alone, or fused with the q/k L2 norms and the split into q, k, v), the gates, and the delta rule: the
// decode kernel (gdn_decode.cu) when every sequence has one new token, else the chunked prefill kernels
// (gdn_prefill.cu), or their token-by-token twin when the key head dim is one the chunked kernels do not take or
// the backend is set to use the slow twins.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gdn_decode.h"
#include "backend/cuda/gdn_prefill.h"
#include "cache/state_pool.h"

namespace ninfer::cuda {
namespace {

constexpr int kMaxConvKernel = 8;
// Rows of one sequence per conv tile. A tile re-reads the K-1 rows before it, so longer tiles read less twice;
// at least K-1 rows, so that only a sequence's first tile reads its carried history.
constexpr int32_t kConvTileRows = 32;
constexpr int kConvThreads = 128;  // channels per block of gdn_conv_kernel
constexpr int kMaxConvSplitThreads = 256;  // gdn_conv_qkv_kernel: one key head per block
static_assert(kConvTileRows >= kMaxConvKernel - 1);

// Rows [t0, t0 + kConvTileRows) (clipped to its length) of sequence `seq`.
struct ConvTile {
  int32_t seq;
  int32_t t0;
};

// y[i] = silu(sum_j w[c, j] * input(t0 + i - (K-1) + j, c)) for the tile's rows t0 + i < n of one sequence and one
// channel, where input(t) for t < 0 is the carried history (oldest first); y[i] = 0 past the sequence's end. The
// caller with a sequence's first tile also writes that sequence's new history (the last K-1 entries of
// [old history | inputs]): no other thread reads the history, since later tiles start at least K-1 rows in.
// x points at input 0 of the sequence and channel (x[t * C]), taps at the channel's K taps, state at its history.
template <int K>
__device__ void conv_tile(const float* x, int64_t C, int64_t n, int32_t t0, const float* taps_in, float* state,
                          float (&y)[kConvTileRows]) {
  constexpr int hist = K - 1;
  float taps[K], window[K];  // window[j]: input t - (K-1) + j
#pragma unroll
  for (int j = 0; j < K; ++j) taps[j] = taps_in[j];
  float old_history[hist > 0 ? hist : 1];
#pragma unroll
  for (int j = 0; j < hist; ++j) {
    const int64_t t = int64_t(t0) - hist + j;
    if (t0 == 0) old_history[j] = state[j];
    window[j] = t >= 0 ? x[t * C] : state[hist + t];
  }
#pragma unroll
  for (int i = 0; i < kConvTileRows; ++i) {  // unrolled, so that y stays in registers
    const int64_t t = int64_t(t0) + i;
    y[i] = 0.0f;
    if (t >= n) continue;
    window[hist] = x[t * C];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc += taps[j] * window[j];
    y[i] = silu(acc);
#pragma unroll
    for (int j = 0; j < hist; ++j) window[j] = window[j + 1];
  }
  if (t0 != 0) return;
#pragma unroll
  for (int i = 0; i < hist; ++i) {  // entry i is position i + n of [old history | inputs]
    const int64_t from = i + n;
    float v = 0.0f;
    if (from >= hist) v = x[(from - hist) * C];
#pragma unroll
    for (int j = 0; j < hist; ++j)  // select rather than index, so that old_history stays in registers
      if (from == j) v = old_history[j];
    state[i] = v;
  }
}

// out [rows, C]: the conv of one tile (blockIdx.x) and kConvThreads channels (blockIdx.y).
template <int K>
__global__ void __launch_bounds__(kConvThreads) gdn_conv_kernel(const float* mixed, const ConvTile* tiles,
                                                                const DeviceSequence* seqs,
                                                                float* const* conv_states, int64_t C,
                                                                const float* weight, float* out) {
  chain_start();
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const ConvTile tile = tiles[blockIdx.x];
  const DeviceSequence s = seqs[tile.seq];
  float y[kConvTileRows];
  conv_tile<K>(mixed + s.row0 * C + c, C, s.n, tile.t0, weight + c * K, conv_states[tile.seq] + c * (K - 1), y);
  float* o = out + (s.row0 + tile.t0) * C + c;
#pragma unroll
  for (int i = 0; i < kConvTileRows; ++i)
    if (tile.t0 + i < s.n) o[i * C] = y[i];
}

// Where gdn_conv_qkv_kernel writes: the conv's channels are [q heads | k heads | v], Dk channels per block.
struct ConvSplit {
  int32_t key_heads, key_dim;
  int64_t value_width;  // Hv * Dv
  float q_scale;
  float *q, *k, *v;
};

// The conv of one tile (blockIdx.x) and one group of Dk channels (blockIdx.y): a q head, scaled to unit L2 norm
// times q_scale per row; a k head, to unit norm; or Dk value columns (fewer in the last group), copied. The
// block has Dk threads rounded up to a warp.
template <int K>
__global__ void __launch_bounds__(kMaxConvSplitThreads) gdn_conv_qkv_kernel(const float* mixed,
                                                                           const ConvTile* tiles,
                                                                           const DeviceSequence* seqs,
                                                                           float* const* conv_states, int64_t C,
                                                                           const float* weight, ConvSplit split) {
  chain_start();
  const int32_t group = blockIdx.y, dk = split.key_dim;
  const int64_t qk_width = int64_t(split.key_heads) * dk;
  const int64_t first = int64_t(group) * dk;  // the group's first channel
  const int64_t width = min(int64_t(dk), C - first);
  const bool active = threadIdx.x < width;
  const int64_t c = first + threadIdx.x;
  const ConvTile tile = tiles[blockIdx.x];
  const DeviceSequence s = seqs[tile.seq];
  float y[kConvTileRows];
  if (active)
    conv_tile<K>(mixed + s.row0 * C + c, C, s.n, tile.t0, weight + c * K, conv_states[tile.seq] + c * (K - 1), y);
  const int64_t row = s.row0 + tile.t0;
  const int32_t rows = int32_t(min(int64_t(kConvTileRows), s.n - tile.t0));
  if (first >= 2 * qk_width) {  // value columns: no norm
    if (!active) return;
    float* o = split.v + row * split.value_width + (c - 2 * qk_width);
#pragma unroll
    for (int i = 0; i < kConvTileRows; ++i)
      if (i < rows) o[i * split.value_width] = y[i];
    return;
  }
  // Per row: the head's sum of squares over the block (warp sums, then over the warps).
  __shared__ float partial[kConvTileRows][kMaxConvSplitThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
#pragma unroll
  for (int i = 0; i < kConvTileRows; ++i) {
    if (i >= rows) break;  // the same for the whole block (a decode tile has one row)
    float sq = active ? y[i] * y[i] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
    if (lane == 0) partial[i][warp] = sq;
  }
  __syncthreads();
  if (!active) return;
  const bool is_q = first < qk_width;
  const float scale = is_q ? split.q_scale : 1.0f;
  float* o = (is_q ? split.q : split.k) + row * qk_width + (c - (is_q ? 0 : qk_width));
#pragma unroll
  for (int i = 0; i < kConvTileRows; ++i) {
    if (i >= rows) continue;
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += partial[i][w];
    const float inv = 1.0f / sqrtf(sum + 1e-6f);
    o[i * qk_width] = y[i] * inv * scale;
  }
}

template <int K>
void launch_gdn_conv(dim3 grid, int threads, cudaStream_t stream, const float* mixed, const ConvTile* tiles,
                     const DeviceSequence* seqs, float* const* conv_states, int64_t C, const float* weight,
                     const ConvSplit* split, float* out) {
  if (split)
    launch_chained(gdn_conv_qkv_kernel<K>, grid, dim3(threads), 0, stream, mixed, tiles, seqs, conv_states, C, weight,
                   *split);
  else
    launch_chained(gdn_conv_kernel<K>, grid, dim3(threads), 0, stream, mixed, tiles, seqs, conv_states, C, weight,
                   out);
}

__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

__global__ void gdn_gates_kernel(const float* a, const float* b, int64_t rows, int32_t heads, const float* A_log,
                                 const float* dt_bias, float* g, float* beta) {
  chain_start();
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

// The device tables of one conv call, before upload: sequences, their history pointers, the tiles.
struct ConvTables {
  HostTables host;
  size_t at_seqs = 0, at_states = 0, at_tiles = 0;
  unsigned tiles = 0;
};

ConvTables conv_tables(std::span<const SequenceRows> seqs, const GdnShape& shape, StatePool& states,
                       int32_t layer) {
  if (shape.conv_kernel < 1 || shape.conv_kernel > kMaxConvKernel)
    throw EngineError("CUDA gdn_conv: kernel width " + std::to_string(shape.conv_kernel) + " outside 1.." +
                      std::to_string(kMaxConvKernel));
  std::vector<DeviceSequence> device_seqs;
  std::vector<float*> conv_states;
  std::vector<ConvTile> tiles;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceRows& s = seqs[i];
    device_seqs.push_back({s.row0, s.n, s.start, 0});
    conv_states.push_back(states.conv(s.state_slot, layer));
    for (int64_t t0 = 0; t0 < s.n; t0 += kConvTileRows) tiles.push_back({int32_t(i), int32_t(t0)});
  }
  if (tiles.size() > 0x7fffffffu) throw EngineError("CUDA gdn_conv: too many rows for one launch");
  ConvTables t;
  t.at_seqs = t.host.add(device_seqs.data(), device_seqs.size());
  t.at_states = t.host.add(conv_states.data(), conv_states.size());
  t.at_tiles = t.host.add(tiles.data(), tiles.size());
  t.tiles = unsigned(tiles.size());
  return t;
}

// Launches the conv kernel for the shape's width over uploaded tables at `base`: gdn_conv_kernel into `out`, or
// with `split`, gdn_conv_qkv_kernel.
void launch_conv(const ConvTables& t, const uint8_t* base, unsigned channel_blocks, int threads, const GdnShape& shape,
                 const float* mixed, const float* weight, const ConvSplit* split, float* out, cudaStream_t stream) {
  using Launch = void (*)(dim3, int, cudaStream_t, const float*, const ConvTile*, const DeviceSequence*,
                          float* const*, int64_t, const float*, const ConvSplit*, float*);
  constexpr Launch launches[kMaxConvKernel] = {launch_gdn_conv<1>, launch_gdn_conv<2>, launch_gdn_conv<3>,
                                               launch_gdn_conv<4>, launch_gdn_conv<5>, launch_gdn_conv<6>,
                                               launch_gdn_conv<7>, launch_gdn_conv<8>};
  launches[shape.conv_kernel - 1](dim3(t.tiles, channel_blocks), threads, stream, mixed,
                                  reinterpret_cast<const ConvTile*>(base + t.at_tiles),
                                  reinterpret_cast<const DeviceSequence*>(base + t.at_seqs),
                                  reinterpret_cast<float* const*>(base + t.at_states), shape.conv_channels(), weight,
                                  split, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::gdn_conv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                           const float* weight, StatePool& states, int32_t layer, float* out) {
  const ConvTables t = conv_tables(seqs, shape, states, layer);
  if (t.tiles == 0) return;
  const int64_t C = shape.conv_channels();
  const uint8_t* base = upload(t.host);
  if (tables_only()) return;
  launch_conv(t, base, unsigned((C + kConvThreads - 1) / kConvThreads), kConvThreads, shape, mixed,
              resident(weight, C * shape.conv_kernel), nullptr, out, stream_);
}

void CudaBackend::gdn_conv_qkv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                               const float* weight, StatePool& states, int32_t layer, float q_scale, float* q,
                               float* k, float* v) {
  const int32_t dk = shape.key_head_dim;
  if (reference_kernels_ || dk < 1 || dk > kMaxConvSplitThreads) {  // the twin: conv rows, then norms and copy
    int64_t rows = 0;
    for (const SequenceRows& s : seqs) rows = std::max(rows, s.row0 + s.n);
    const int64_t C = shape.conv_channels(), qk_width = int64_t(shape.num_key_heads) * dk;
    float* conv = scratch(gdn_conv_rows_, size_t(rows * C));
    CudaBackend::gdn_conv(mixed, seqs, shape, weight, states, layer, conv);  // not virtual: one timed op
    CudaBackend::l2norm_heads(conv, rows, shape.num_key_heads, dk, C, q_scale, q);
    CudaBackend::l2norm_heads(conv + qk_width, rows, shape.num_key_heads, dk, C, 1.0f, k);
    CudaBackend::copy_columns(conv + 2 * qk_width, rows, C, int64_t(shape.num_value_heads) * shape.value_head_dim, v);
    return;
  }
  const ConvTables t = conv_tables(seqs, shape, states, layer);
  if (t.tiles == 0) return;
  const int64_t C = shape.conv_channels();
  const ConvSplit split{shape.num_key_heads, dk, int64_t(shape.num_value_heads) * shape.value_head_dim, q_scale,
                        q, k, v};
  const uint8_t* base = upload(t.host);
  if (tables_only()) return;
  launch_conv(t, base, unsigned((C + dk - 1) / dk), (dk + 31) / 32 * 32, shape, mixed,
              resident(weight, C * shape.conv_kernel), &split, nullptr, stream_);
}

void CudaBackend::gdn_gates(const float* a, const float* b, int64_t rows, int32_t heads, const float* A_log,
                            const float* dt_bias, float* g, float* beta) {
  if (rows * heads <= 0 || tables_only()) return;
  launch_chained(gdn_gates_kernel, dim3(blocks_for(rows * heads)), dim3(kThreads), 0, stream_, a, b, rows, heads,
                 resident(A_log, heads), resident(dt_bias, heads), g, beta);
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
  GdnRuleArgs rule;
  rule.num_key_heads = shape.num_key_heads;
  rule.num_value_heads = shape.num_value_heads;
  rule.key_head_dim = shape.key_head_dim;
  rule.value_head_dim = shape.value_head_dim;
  rule.q = q;
  rule.k = k;
  rule.v = v;
  rule.g = g;
  rule.beta = beta;
  rule.states = reinterpret_cast<float* const*>(base + at_states);
  rule.out = out;
  if (decode_batch) {  // rows 0..B-1 are the B sequences' single tokens: the layout gdn_decode takes
    GdnDecodeArgs args;
    static_cast<GdnRuleArgs&>(args) = rule;
    args.batch = int32_t(seqs.size());
    gdn_decode(args, stream_);
    return;
  }
  GdnPrefillArgs args;
  static_cast<GdnRuleArgs&>(args) = rule;
  args.num_seqs = int32_t(seqs.size());
  args.seqs = reinterpret_cast<const DeviceSequence*>(base + at_seqs);
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
