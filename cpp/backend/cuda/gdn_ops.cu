// Gated DeltaNet ops of the CUDA backend: the causal conv (parallel over tiles of a sequence's rows and over
// channels; alone, or fused with the q/k L2 norms and the split into q, k, v), the gates, and the delta rule: the
// decode kernel (gdn_decode.cu) for sequences of one new token and speculative verify chains (StateRun below),
// the chunked prefill kernels (gdn_prefill.cu) for the others, or their token-by-token twin when the key head dim
// is one the chunked kernels do not take or the backend is set to use the slow twins (which honour source slots
// sequence by sequence, as the CPU backend does).
#include <algorithm>
#include <unordered_map>

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

// Rows [t0, t0 + kConvTileRows) (clipped to its length) of run `seq` (a StateRun below).
struct ConvTile {
  int32_t seq;
  int32_t t0;
};

// A run as the conv kernels see it: rows [row0, row0 + n), its history read from history_in[run] and written to
// history_out[out_first] after its last row, or (per_row: a verify chain) after row t to history_out[out_first + t].
struct ConvRun {
  int64_t row0, n;
  int32_t out_first, per_row;
};

// Where one channel's conv history goes: out[0] + offset after the tile's sequence's last row, or out[t] + offset
// after each row t (per_row).
struct HistoryOut {
  float* const* out;
  int64_t offset;
  bool per_row;
};

// y[i] = silu(sum_j w[c, j] * input(t0 + i - (K-1) + j, c)) for the tile's rows t0 + i < n of one sequence and one
// channel, where input(t) for t < 0 is the carried history (oldest first); y[i] = 0 past the sequence's end. The
// caller with a sequence's first tile also writes that sequence's new history (the last K-1 entries of
// [old history | inputs]): no other thread reads the history, since later tiles start at least K-1 rows in. A
// per-row run (one tile: at most kConvTileRows rows) writes the history after each row instead.
// x points at input 0 of the sequence and channel (x[t * C]), taps at the channel's K taps, state at its history.
template <int K>
__device__ void conv_tile(const float* x, int64_t C, int64_t n, int32_t t0, const float* taps_in, const float* state,
                          const HistoryOut& out, float (&y)[kConvTileRows]) {
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
    if (out.per_row) {  // window[0..hist) holds inputs t - hist + 1 .. t: the history after row t
#pragma unroll
      for (int j = 0; j < hist; ++j) out.out[i][out.offset + j] = window[j];
    }
  }
  if (t0 != 0 || out.per_row) return;
#pragma unroll
  for (int i = 0; i < hist; ++i) {  // entry i is position i + n of [old history | inputs]
    const int64_t from = i + n;
    float v = 0.0f;
    if (from >= hist) v = x[(from - hist) * C];
#pragma unroll
    for (int j = 0; j < hist; ++j)  // select rather than index, so that old_history stays in registers
      if (from == j) v = old_history[j];
    out.out[0][out.offset + i] = v;
  }
}

// The histories of a call's runs: read from in[run], written through out (ConvRun).
struct ConvHistories {
  float* const* in;
  float* const* out;
};

__device__ __forceinline__ HistoryOut history_out(const ConvHistories& h, const ConvRun& s, int64_t c, int K) {
  return {h.out + s.out_first, c * (K - 1), s.per_row != 0};
}

// out [rows, C]: the conv of one tile (blockIdx.x) and kConvThreads channels (blockIdx.y).
template <int K>
__global__ void __launch_bounds__(kConvThreads) gdn_conv_kernel(const float* mixed, const ConvTile* tiles,
                                                                const ConvRun* seqs, ConvHistories histories,
                                                                int64_t C, const float* weight, float* out) {
  chain_start();
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const ConvTile tile = tiles[blockIdx.x];
  const ConvRun s = seqs[tile.seq];
  float y[kConvTileRows];
  conv_tile<K>(mixed + s.row0 * C + c, C, s.n, tile.t0, weight + c * K, histories.in[tile.seq] + c * (K - 1),
               history_out(histories, s, c, K), y);
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
                                                                           const ConvRun* seqs,
                                                                           ConvHistories histories, int64_t C,
                                                                           const float* weight, ConvSplit split) {
  chain_start();
  const int32_t group = blockIdx.y, dk = split.key_dim;
  const int64_t qk_width = int64_t(split.key_heads) * dk;
  const int64_t first = int64_t(group) * dk;  // the group's first channel
  const int64_t width = min(int64_t(dk), C - first);
  const bool active = threadIdx.x < width;
  const int64_t c = first + threadIdx.x;
  const ConvTile tile = tiles[blockIdx.x];
  const ConvRun s = seqs[tile.seq];
  float y[kConvTileRows];
  if (active)
    conv_tile<K>(mixed + s.row0 * C + c, C, s.n, tile.t0, weight + c * K, histories.in[tile.seq] + c * (K - 1),
                 history_out(histories, s, c, K), y);
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
                     const ConvRun* seqs, ConvHistories histories, int64_t C, const float* weight,
                     const ConvSplit* split, float* out) {
  if (split)
    launch_chained(gdn_conv_qkv_kernel<K>, grid, dim3(threads), 0, stream, mixed, tiles, seqs, histories, C, weight,
                   *split);
  else
    launch_chained(gdn_conv_kernel<K>, grid, dim3(threads), 0, stream, mixed, tiles, seqs, histories, C, weight, out);
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

// How the conv and the rule walk a call's sequences (SequenceRows::source_slot). A run is either a plain sequence,
// its state read from its source slot (or its own) and written to its own slot after its last row, or a verify
// chain: one-row sequences each continuing from the one before (source_slot == the previous one's state_slot, rows
// and positions consecutive), its state read once from the first one's source and written after every row into
// that row's own slot. A chain is one kernel's sequential work, so its rows need no order between launches.
struct StateRun {
  int64_t row0 = 0, n = 0;
  int32_t first = 0;  // its first sequence in the call
  bool chain = false;
  int32_t read_slot = -1;
};

bool continues(const SequenceRows& prev, const SequenceRows& s) {
  return s.source_slot >= 0 && s.source_slot == prev.state_slot && prev.n == 1 && s.n == 1 &&
         s.row0 == prev.row0 + 1 && s.start == prev.start + 1;
}

// The runs of `seqs`; EngineError when a run reads a slot another run writes (the kernels run them at once).
std::vector<StateRun> state_runs(std::span<const SequenceRows> seqs) {
  std::vector<StateRun> runs;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceRows& s = seqs[i];
    if (i > 0 && continues(seqs[i - 1], s) && (runs.back().chain || runs.back().n == 1)) {
      runs.back().chain = true;
      ++runs.back().n;
      continue;
    }
    runs.push_back({s.row0, s.n, int32_t(i), false, s.source_slot >= 0 ? s.source_slot : s.state_slot});
  }
  std::unordered_map<int32_t, size_t> writer;  // slot -> the run that writes it
  for (size_t r = 0; r < runs.size(); ++r)
    for (int64_t t = 0; t < (runs[r].chain ? runs[r].n : 1); ++t) writer[seqs[size_t(runs[r].first + t)].state_slot] = r;
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto it = writer.find(runs[r].read_slot);
    if (it != writer.end() && it->second != r)
      throw EngineError("CUDA Gated DeltaNet op: a sequence continues from state slot " +
                        std::to_string(runs[r].read_slot) + ", which another sequence of the same call writes");
  }
  return runs;
}

// The slot run `r`'s state goes to after its row t (a chain) or its last row.
int32_t written_slot(std::span<const SequenceRows> seqs, const StateRun& r, int64_t t) {
  return seqs[size_t(r.first + (r.chain ? t : 0))].state_slot;
}

// The slow, obviously-right way of honouring source slots (the CPU backend's): sequence by sequence, its state
// first copied from its source slot by `copy`, then `op` on that sequence alone.
template <class Copy, class Op>
void in_order(std::span<const SequenceRows> seqs, Copy&& copy, Op&& op) {
  for (const SequenceRows& s : seqs) {
    SequenceRows own = s;
    own.source_slot = -1;
    if (s.source_slot >= 0) copy(s.source_slot, s.state_slot);
    op(std::span<const SequenceRows>(&own, 1));
  }
}

bool has_sources(std::span<const SequenceRows> seqs) {
  return std::any_of(seqs.begin(), seqs.end(), [](const SequenceRows& s) { return s.source_slot >= 0; });
}

// The device tables of one conv call, before upload: runs, their history pointers (in, out), the tiles.
struct ConvTables {
  HostTables host;
  size_t at_seqs = 0, at_in = 0, at_out = 0, at_tiles = 0;
  unsigned tiles = 0;
};

ConvTables conv_tables(std::span<const SequenceRows> seqs, const GdnShape& shape, StatePool& states,
                       int32_t layer) {
  if (shape.conv_kernel < 1 || shape.conv_kernel > kMaxConvKernel)
    throw EngineError("CUDA gdn_conv: kernel width " + std::to_string(shape.conv_kernel) + " outside 1.." +
                      std::to_string(kMaxConvKernel));
  std::vector<ConvRun> runs;
  std::vector<float*> history_in, history_out;
  std::vector<ConvTile> tiles;
  for (const StateRun& r : state_runs(seqs)) {
    if (r.chain && r.n > kConvTileRows)
      throw EngineError("CUDA gdn_conv: a verify chain of " + std::to_string(r.n) + " rows (at most " +
                        std::to_string(kConvTileRows) + ")");
    const int32_t index = int32_t(runs.size());
    runs.push_back({r.row0, r.n, int32_t(history_out.size()), r.chain ? 1 : 0});
    history_in.push_back(states.conv(r.read_slot, layer));
    for (int64_t t = 0; t < (r.chain ? r.n : 1); ++t) history_out.push_back(states.conv(written_slot(seqs, r, t), layer));
    for (int64_t t0 = 0; t0 < r.n; t0 += kConvTileRows) tiles.push_back({index, int32_t(t0)});
  }
  if (tiles.size() > 0x7fffffffu) throw EngineError("CUDA gdn_conv: too many rows for one launch");
  ConvTables t;
  t.at_seqs = t.host.add(runs.data(), runs.size());
  t.at_in = t.host.add(history_in.data(), history_in.size());
  t.at_out = t.host.add(history_out.data(), history_out.size());
  t.at_tiles = t.host.add(tiles.data(), tiles.size());
  t.tiles = unsigned(tiles.size());
  return t;
}

// Launches the conv kernel for the shape's width over uploaded tables at `base`: gdn_conv_kernel into `out`, or
// with `split`, gdn_conv_qkv_kernel.
void launch_conv(const ConvTables& t, const uint8_t* base, unsigned channel_blocks, int threads, const GdnShape& shape,
                 const float* mixed, const float* weight, const ConvSplit* split, float* out, cudaStream_t stream) {
  using Launch = void (*)(dim3, int, cudaStream_t, const float*, const ConvTile*, const ConvRun*, ConvHistories,
                          int64_t, const float*, const ConvSplit*, float*);
  constexpr Launch launches[kMaxConvKernel] = {launch_gdn_conv<1>, launch_gdn_conv<2>, launch_gdn_conv<3>,
                                               launch_gdn_conv<4>, launch_gdn_conv<5>, launch_gdn_conv<6>,
                                               launch_gdn_conv<7>, launch_gdn_conv<8>};
  const ConvHistories histories{reinterpret_cast<float* const*>(base + t.at_in),
                                reinterpret_cast<float* const*>(base + t.at_out)};
  launches[shape.conv_kernel - 1](dim3(t.tiles, channel_blocks), threads, stream, mixed,
                                  reinterpret_cast<const ConvTile*>(base + t.at_tiles),
                                  reinterpret_cast<const ConvRun*>(base + t.at_seqs), histories,
                                  shape.conv_channels(), weight, split, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::gdn_conv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                           const float* weight, StatePool& states, int32_t layer, float* out) {
  if (reference_kernels_ && has_sources(seqs)) {
    in_order(
        seqs, [&](int32_t from, int32_t to) { if (!tables_only()) states.copy_conv(from, to, layer); },
        [&](std::span<const SequenceRows> one) { CudaBackend::gdn_conv(mixed, one, shape, weight, states, layer, out); });
    return;
  }
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
  const bool decode_kernel = !reference_kernels_ && decode_kernel_supports(shape.key_head_dim);
  if (!decode_kernel && has_sources(seqs)) {  // the twins: in order, each state copied from its source first
    in_order(
        seqs, [&](int32_t from, int32_t to) { if (!tables_only()) states.copy_recurrent(from, to, layer); },
        [&](std::span<const SequenceRows> one) {
          CudaBackend::gdn_rule(q, k, v, g, beta, one, shape, states, layer, out);
        });
    return;
  }
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
  rule.out = out;

  // Runs of decode steps (one-row sequences and verify chains) take the decode kernel; sequences of several new
  // tokens the chunked prefill kernels (or, without the decode kernel, everything the token-by-token twin).
  std::vector<GdnDecodeRun> decode_runs;
  std::vector<float*> decode_in, decode_out;
  std::vector<SequenceRows> prefill;
  for (const StateRun& r : state_runs(seqs)) {
    if (decode_kernel && (r.chain || r.n == 1)) {
      decode_runs.push_back({int32_t(r.row0), int32_t(r.n), int32_t(decode_out.size())});
      decode_in.push_back(states.recurrent(r.read_slot, layer));
      for (int64_t t = 0; t < r.n; ++t) decode_out.push_back(states.recurrent(written_slot(seqs, r, t), layer));
    } else {
      prefill.push_back(seqs[size_t(r.first)]);  // (a plain sequence: a chain's runs never get here)
    }
  }
  if (!decode_runs.empty()) {
    HostTables tables;
    const size_t at_runs = tables.add(decode_runs.data(), decode_runs.size());
    const size_t at_in = tables.add(decode_in.data(), decode_in.size());
    const size_t at_out = tables.add(decode_out.data(), decode_out.size());
    const uint8_t* base = upload(tables);
    if (!tables_only()) {  // (a decode graph's replay: the tables only)
      GdnDecodeArgs args;
      static_cast<GdnRuleArgs&>(args) = rule;
      args.batch = int32_t(decode_runs.size());
      args.runs = reinterpret_cast<const GdnDecodeRun*>(base + at_runs);
      args.states = reinterpret_cast<float* const*>(base + at_in);
      args.step_states = reinterpret_cast<float* const*>(base + at_out);
      gdn_decode(args, stream_);
    }
  }
  if (prefill.empty()) return;

  bool many_tokens = false;  // some sequence has more than one new token: worth the chunked form's workspace
  std::vector<DeviceSequence> device_seqs;
  std::vector<float*> recurrent;
  for (const SequenceRows& s : prefill) {
    many_tokens = many_tokens || s.n > 1;
    device_seqs.push_back({s.row0, s.n, s.start, 0});
    recurrent.push_back(states.recurrent(s.state_slot, layer));
  }
  HostTables tables;
  const size_t at_seqs = tables.add(device_seqs.data(), device_seqs.size());
  const size_t at_states = tables.add(recurrent.data(), recurrent.size());
  const uint8_t* base = upload(tables);
  if (tables_only()) return;  // (graph passes are decode steps only: nothing gets here in a replay)
  for (const SequenceRows& s : prefill)  // these run in place: a sequence that continues another starts from a copy
    if (s.source_slot >= 0) states.copy_recurrent(s.source_slot, s.state_slot, layer);
  GdnPrefillArgs args;
  static_cast<GdnRuleArgs&>(args) = rule;
  args.states = reinterpret_cast<float* const*>(base + at_states);
  args.num_seqs = int32_t(prefill.size());
  args.seqs = reinterpret_cast<const DeviceSequence*>(base + at_seqs);
  if (reference_kernels_ || !many_tokens || !gdn_chunked_supported(shape.key_head_dim))
    return gdn_prefill_sequential(args, stream_);

  // The chunk list: one entry per (sequence, chunk of 64 rows), and each sequence's first entry.
  std::vector<GdnChunkRef> chunks;
  std::vector<int64_t> first_chunk;
  for (size_t i = 0; i < prefill.size(); ++i) {
    first_chunk.push_back(int64_t(chunks.size()));
    for (int64_t c = 0; c * kGdnChunk < prefill[i].n; ++c) chunks.push_back({int32_t(i), int32_t(c)});
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
