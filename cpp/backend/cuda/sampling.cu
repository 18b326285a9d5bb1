// The device sampler (see sampling.h for the plan). Kernels in the order they run: prepare_chunks, combine_rows,
// (top_logprob_chunks, top_logprob_rows), (radix sort, select_sorted), (distribution_rows, for tests), draw_chunks,
// finish_rows.
#include "backend/cuda/sampling.h"

#include <algorithm>
#include <bit>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cstring>
#include <limits>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {
namespace {

constexpr int kSampleThreads = 512;
constexpr int kMaxTop = 20;                  // top_logprobs' upper bound (sampling_params_validate)
constexpr int kMaxParts = 64;                // vocabulary chunks per row (combine_rows gives each a thread)
constexpr int64_t kTokensPerPart = 4096;
constexpr int32_t kNoToken = std::numeric_limits<int32_t>::max();
constexpr int64_t kNoIndex = std::numeric_limits<int64_t>::max();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kNegInfD = -std::numeric_limits<double>::infinity();

// What one row asks for, as the kernels read it.
struct RowArgs {
  int64_t logits_row;
  uint64_t seed, counter;
  float temperature, top_p, min_p, presence, frequency, repetition;
  int32_t top_k, top_logprobs;
  int32_t history_offset, history_count;  // its (token, generated count) pairs
  int64_t mask_offset;                    // its mask's first word; -1: no mask
  int32_t sort_segment;                   // its segment of the ordered candidates; -1: not ordered
  int32_t selected;                       // 1: the segment holds only its top_k (<= kMaxTop) best, selected
};

// One (row, chunk)'s share of the prepare pass.
struct ChunkStats {
  double exp_sum;    // sum of exp(logit - logit_max) over the masked logits
  float logit_max;
  double weight_sum;  // radix-sorted rows: sum of exp((z - z_max) / T) over the chunk (its own z_max)
  float z_max;       // of the penalised logits z, with its first index
  int32_t z_argmax;
  int32_t finite;    // tokens of z above -inf
};

struct RowState {
  double log_sum;     // log-sum-exp of the masked logits (the logprobs' normaliser)
  double weight_sum;  // radix-sorted rows: the CPU's total weight of every finite token
  float z_max;
  int32_t z_argmax, finite;
  int64_t keep;    // sorted rows: the kept prefix of the sorted order
};

// A token with a key to rank by: the larger key, then the smaller token (the CPU's first of equals) is better.
struct Candidate {
  double key;
  int32_t token;
};
__device__ __forceinline__ Candidate better(Candidate a, Candidate b) {
  return (b.key > a.key || (b.key == a.key && b.token < a.token)) ? b : a;
}
constexpr Candidate kNone{kNegInfD, kNoToken};

struct RowResult {
  int32_t token;
  float logprob;
  int32_t top_tokens[kMaxTop];
  float top_logprobs[kMaxTop];
};

struct BetterOp {
  __device__ Candidate operator()(Candidate a, Candidate b) const { return better(a, b); }
};
struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};
struct MinOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};

// Reduces `v` over the block; every thread gets the result. Safe to call again at once.
template <class T, class Op>
__device__ T block_all(T v, Op op) {
  using Reduce = cub::BlockReduce<T, kSampleThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ T result;
  const T r = Reduce(temp).Reduce(v, op);
  if (threadIdx.x == 0) result = r;
  __syncthreads();
  const T out = result;
  __syncthreads();
  return out;
}

__device__ __forceinline__ bool allowed(const uint32_t* mask, int64_t t) {
  return !mask || ((mask[t >> 5] >> (t & 31)) & 1u);
}

// Float bits ordered as the values are (-0 as +0, so that equal values tie), and back.
__device__ __forceinline__ uint32_t ordered_bits(float v) {
  const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_ordered_bits(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
// Sort keys: ascending order is segment by segment, larger z first, ties by token (the sort is stable).
__device__ __forceinline__ uint64_t sort_key(int32_t segment, float z) {
  return (uint64_t(segment) << 32) | uint64_t(~ordered_bits(z));
}
__device__ __forceinline__ float z_of_key(uint64_t key) { return from_ordered_bits(~uint32_t(key)); }

// Philox4x32-10 (Salmon et al., SC'11): a counter-based generator, 4 words per (counter, key).
__device__ __forceinline__ uint4 philox(uint4 c, uint2 k) {
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u;
    k.y += 0xBB67AE85u;
  }
  return c;
}

// A standard Gumbel variate for token `token` of draw number `counter` of the stream `seed`: -log(E) with
// E = -log(1 - U) ~ Exp(1), U uniform in (0, 1) from 53 bits.
__device__ __forceinline__ double gumbel(uint64_t seed, uint64_t counter, int32_t token) {
  const uint4 r = philox(make_uint4(uint32_t(token), 0u, uint32_t(counter), uint32_t(counter >> 32)),
                         make_uint2(uint32_t(seed), uint32_t(seed >> 32)));
  const uint64_t bits = (uint64_t(r.x) << 21) | (r.y >> 11);
  const double u = (double(bits) + 0.5) * 0x1p-53;
  return -log(-log1p(-u));
}

// The CPU's weight of a token: exp((z - z_max) / T), in double.
__device__ __forceinline__ double weight(float z, double z_max, double inv_t) { return exp((double(z) - z_max) * inv_t); }

// Keeps `held` best candidates (best first) of those offered in increasing token order.
__device__ void offer(Candidate* top, int& held, int n, Candidate c) {
  if (held == n && !(c.key > top[n - 1].key)) return;  // equal keys: the earlier token stays ahead
  int i = held < n ? held++ : n - 1;
  for (; i > 0 && c.key > top[i - 1].key; --i) top[i] = top[i - 1];
  top[i] = c;
}

// The block's best n candidates (n <= kMaxTop), best first, to out[0..n): each thread offers its own best ones
// (`held` of `top`, best first), then one winner per round.
__device__ void block_best(const Candidate* top, int held, int n, Candidate* out) {
  int head = 0;
  for (int k = 0; k < n; ++k) {
    const Candidate mine = head < held ? top[head] : kNone;
    const Candidate win = block_all(mine, BetterOp());
    if (win.token != kNoToken && mine.token == win.token) ++head;
    if (threadIdx.x == 0) out[k] = win;
  }
}

// The best n (<= kMaxTop) of a row's chunk lists (each best first, kMaxTop apart; a thread per chunk) to the
// shared `merged`.
__device__ void merge_chunk_lists(int parts, int n, const Candidate* lists, Candidate* merged) {
  Candidate mine[kMaxTop];
  const int held = int(threadIdx.x) < parts ? n : 0;
  for (int k = 0; k < held; ++k) mine[k] = lists[threadIdx.x * kMaxTop + k];
  block_best(mine, held, n, merged);
  __syncthreads();
}

// Pass 1, grid (parts, rows): a chunk of one row. Masked logits -> z, their max and exp-sum; then the penalties
// of the chunk's history tokens; then z's max and finite count, and for ordered rows the sort keys and total
// weight (radix-sorted rows) or the chunk's top_k best (selected rows).
__global__ void __launch_bounds__(kSampleThreads)
    prepare_chunks(const float* logits, int64_t vocab, int64_t chunk, const RowArgs* args, const int2* history,
                   const uint32_t* masks, float* z, ChunkStats* stats, uint64_t* sort_keys, int32_t* sort_tokens,
                   Candidate* best_lists) {
  const int row = blockIdx.y, part = blockIdx.x, parts = gridDim.x;
  const RowArgs a = args[row];
  const int64_t begin = part * chunk, end = min(begin + chunk, vocab);
  const float* l = logits + a.logits_row * vocab;
  const uint32_t* mask = a.mask_offset >= 0 ? masks + a.mask_offset : nullptr;
  float* zr = z + row * vocab;

  float m = kNegInf;
  double s = 0;
  for (int64_t t = begin + threadIdx.x; t < end; t += blockDim.x) {
    const float v = allowed(mask, t) ? l[t] : kNegInf;
    zr[t] = v;
    if (v > m) {
      s = s * exp(double(m) - double(v)) + 1.0;
      m = v;
    } else if (v > kNegInf) {
      s += exp(double(v) - double(m));
    }
  }
  __syncthreads();
  // Repetition (over prompt + output) before presence / frequency (over the output), as the CPU orders them.
  for (int32_t j = threadIdx.x; j < a.history_count; j += blockDim.x) {
    const int2 h = history[a.history_offset + j];
    if (h.x < begin || h.x >= end) continue;
    float v = zr[h.x];
    if (a.repetition != 1.0f) v = v > 0 ? v / a.repetition : v * a.repetition;
    if ((a.presence != 0.0f || a.frequency != 0.0f) && h.y > 0) v -= a.presence + a.frequency * float(h.y);
    zr[h.x] = v;
  }
  __syncthreads();
  const bool radix = a.sort_segment >= 0 && !a.selected;
  Candidate best = kNone;
  int32_t finite = 0;
  double w_sum = 0;  // radix-sorted rows: sum of exp((z - best) / T), rescaled as `best` grows
  const double inv_t = 1.0 / double(a.temperature);
  Candidate top[kMaxTop];  // selected rows: this thread's top_k best
  int held = 0;
  for (int64_t t = begin + threadIdx.x; t < end; t += blockDim.x) {
    const float v = zr[t];
    if (radix && v > kNegInf)
      w_sum = v > best.key ? w_sum * weight(float(best.key), v, inv_t) + 1.0 : w_sum + weight(v, best.key, inv_t);
    best = better(best, {double(v), int32_t(t)});
    finite += v > kNegInf;
    if (radix) {
      sort_keys[a.sort_segment * vocab + t] = sort_key(a.sort_segment, v);
      sort_tokens[a.sort_segment * vocab + t] = int32_t(t);
    } else if (a.selected) {
      offer(top, held, a.top_k, {double(v), int32_t(t)});
    }
  }
  if (a.selected) block_best(top, held, a.top_k, best_lists + (row * parts + part) * kMaxTop);
  const float m_all = block_all(m, MaxOp());
  const double s_all = block_all(m > kNegInf ? s * exp(double(m) - double(m_all)) : 0.0, SumOp());
  const Candidate thread_best = best;
  best = block_all(best, BetterOp());
  finite = block_all(finite, SumOp());
  if (radix)
    w_sum = block_all(w_sum > 0.0 ? w_sum * weight(float(thread_best.key), best.key, inv_t) : 0.0, SumOp());
  if (threadIdx.x == 0) stats[row * parts + part] = {s_all, m_all, w_sum, float(best.key), best.token, finite};
}

// Pass 2, one block per row: the chunks' figures combined.
__global__ void __launch_bounds__(kSampleThreads)
    combine_rows(int parts, const RowArgs* args, const ChunkStats* stats, RowState* states) {
  const int row = blockIdx.x, p = threadIdx.x;
  const RowArgs a = args[row];
  const ChunkStats* cs = stats + row * parts;
  const bool has = p < parts;
  const float m = block_all(has ? cs[p].logit_max : kNegInf, MaxOp());
  const double s =
      block_all(has && cs[p].logit_max > kNegInf ? cs[p].exp_sum * exp(double(cs[p].logit_max) - double(m)) : 0.0,
                SumOp());
  const Candidate best = block_all(has ? Candidate{double(cs[p].z_max), cs[p].z_argmax} : kNone, BetterOp());
  const int32_t finite = block_all(has ? cs[p].finite : 0, SumOp());
  const double log_sum = log(s) + double(m);
  const double inv_t = 1.0 / double(a.temperature);
  double weight_sum = 0;
  if (a.sort_segment >= 0 && !a.selected)
    weight_sum = block_all(
        has && cs[p].finite > 0 ? cs[p].weight_sum * weight(cs[p].z_max, best.key, inv_t) : 0.0, SumOp());
  if (p == 0) states[row] = {log_sum, weight_sum, float(best.key), best.token, finite, 0};
}

// top_logprobs, grid (parts, rows): each chunk's best tokens by the CPU's key, the float logprob
// float(logit - log_sum) of the masked logits, ties by token id (distinct logits can share a float logprob).
__global__ void __launch_bounds__(kSampleThreads)
    top_logprob_chunks(const float* logits, int64_t vocab, int64_t chunk, const RowArgs* args, const uint32_t* masks,
                       const RowState* states, Candidate* tops) {
  const int row = blockIdx.y, part = blockIdx.x, parts = gridDim.x;
  const RowArgs a = args[row];
  if (a.top_logprobs == 0) return;
  const double log_sum = states[row].log_sum;
  const float* l = logits + a.logits_row * vocab;
  const uint32_t* mask = a.mask_offset >= 0 ? masks + a.mask_offset : nullptr;
  Candidate top[kMaxTop];
  int held = 0;
  for (int64_t t = part * chunk + threadIdx.x; t < min(vocab, (part + 1) * chunk); t += blockDim.x) {
    const float v = allowed(mask, t) ? l[t] : kNegInf;
    offer(top, held, a.top_logprobs, {double(float(double(v) - log_sum)), int32_t(t)});
  }
  block_best(top, held, a.top_logprobs, tops + (row * parts + part) * kMaxTop);
}

// top_logprobs, one block per row: the best of the chunks' lists (a thread per chunk).
__global__ void __launch_bounds__(kSampleThreads)
    top_logprob_rows(int parts, const RowArgs* args, const Candidate* tops, RowResult* results) {
  const int row = blockIdx.x, p = threadIdx.x;
  const int n = args[row].top_logprobs;
  if (n == 0) return;
  __shared__ Candidate merged[kMaxTop];
  merge_chunk_lists(parts, n, tops + row * parts * kMaxTop, merged);
  if (p < n) {
    results[row].top_tokens[p] = merged[p].token;
    results[row].top_logprobs[p] = float(merged[p].key);
  }
}

// Selected rows, one block per row (after the radix sort): their top_k best, in order, into their segment of the
// sorted keys and tokens, where the passes after read ordered candidates.
__global__ void __launch_bounds__(kSampleThreads)
    place_selected_rows(int64_t vocab, int parts, const RowArgs* args, const Candidate* best_lists,
                        uint64_t* sorted_keys, int32_t* sorted_tokens) {
  const int row = blockIdx.x, p = threadIdx.x;
  const RowArgs a = args[row];
  if (!a.selected) return;
  __shared__ Candidate merged[kMaxTop];
  merge_chunk_lists(parts, a.top_k, best_lists + row * parts * kMaxTop, merged);
  if (p < a.top_k) {
    sorted_keys[a.sort_segment * vocab + p] = sort_key(a.sort_segment, float(merged[p].key));
    sorted_tokens[a.sort_segment * vocab + p] = merged[p].token;
  }
}

// Pass 3, one block per ordered row: the kept prefix of the sorted order, with the CPU's arithmetic: top-k, the
// -inf tail dropped, the smallest prefix whose cumulative probability reaches top_p, then min-p.
__global__ void __launch_bounds__(kSampleThreads)
    select_sorted(int64_t vocab, const RowArgs* args, const uint64_t* sorted_keys, RowState* states) {
  const int row = blockIdx.x;
  const RowArgs a = args[row];
  if (a.sort_segment < 0) return;
  const RowState st = states[row];
  const uint64_t* keys = sorted_keys + a.sort_segment * vocab;
  const double z_max = st.z_max, inv_t = 1.0 / double(a.temperature);
  const auto w = [&](int64_t j) { return weight(z_of_key(keys[j]), z_max, inv_t); };
  const int64_t k = a.top_k > 0 ? min(int64_t(a.top_k), vocab) : vocab;
  const int64_t candidates = max(int64_t(1), min(k, int64_t(st.finite)));
  double total = 0;  // every finite token's weight, summed in the prepare pass, unless top-k cuts
  if (candidates == st.finite && !a.selected) {
    total = st.weight_sum;
  } else {
    for (int64_t j = threadIdx.x; j < candidates; j += blockDim.x) total += w(j);
    total = block_all(total, SumOp());
  }
  int64_t keep = candidates;
  if (a.top_p < 1.0f) {
    using Scan = cub::BlockScan<double, kSampleThreads>;
    __shared__ typename Scan::TempStorage scan;
    __shared__ double tile_end;
    double carry = 0;
    for (int64_t base = 0; base < candidates; base += blockDim.x) {
      const int64_t j = base + threadIdx.x;
      double cumulative;
      Scan(scan).InclusiveSum(j < candidates ? w(j) / total : 0.0, cumulative);
      cumulative += carry;
      const int64_t first = block_all(
          j < candidates && cumulative >= double(a.top_p) ? j : kNoIndex, MinOp());
      if (first != kNoIndex) {
        keep = first + 1;
        break;
      }
      if (threadIdx.x == blockDim.x - 1) tile_end = cumulative;
      __syncthreads();
      carry = tile_end;
      __syncthreads();
    }
  }
  if (a.min_p > 0.0f) {  // the weights fall along the order: the kept ones are a prefix (the first always stays)
    int64_t above = 0;
    for (int64_t j = 1 + threadIdx.x; j < keep; j += blockDim.x) above += w(j) >= double(a.min_p);
    keep = 1 + block_all(above, SumOp());
  }
  if (threadIdx.x == 0) states[row].keep = keep;
}

// Pass 4, grid (parts, rows): each chunk's best Gumbel-max candidate among the kept tokens: the sorted prefix, or
// for unsorted rows every finite token that min-p keeps.
__global__ void __launch_bounds__(kSampleThreads)
    draw_chunks(int64_t vocab, int64_t chunk, const RowArgs* args, const float* z, const uint64_t* sorted_keys,
                const int32_t* sorted_tokens, const RowState* states, Candidate* draws) {
  const int row = blockIdx.y, part = blockIdx.x, parts = gridDim.x;
  const RowArgs a = args[row];
  if (a.temperature == 0.0f) return;
  const RowState st = states[row];
  const double z_max = st.z_max, inv_t = 1.0 / double(a.temperature);
  Candidate best = kNone;
  if (a.sort_segment >= 0) {
    const int64_t per = (st.keep + parts - 1) / parts, begin = part * per, end = min(st.keep, begin + per);
    const uint64_t* keys = sorted_keys + a.sort_segment * vocab;
    const int32_t* tokens = sorted_tokens + a.sort_segment * vocab;
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
      const double log_w = (double(z_of_key(keys[j])) - z_max) * inv_t;
      best = better(best, {log_w + gumbel(a.seed, a.counter, tokens[j]), tokens[j]});
    }
  } else {
    const float* zr = z + row * vocab;
    for (int64_t t = part * chunk + threadIdx.x; t < min(vocab, (part + 1) * chunk); t += blockDim.x) {
      const float v = zr[t];
      if (!(v > kNegInf) || (a.min_p > 0.0f && weight(v, z_max, inv_t) < double(a.min_p))) continue;
      best = better(best, {(double(v) - z_max) * inv_t + gumbel(a.seed, a.counter, int32_t(t)), int32_t(t)});
    }
  }
  best = block_all(best, BetterOp());
  if (threadIdx.x == 0) draws[row * parts + part] = best;
}

// Pass 5, a thread per row: the token (greedy: z's argmax; else the best draw, or the argmax when no token has a
// finite logit) and its logprob under the masked, unpenalised log-softmax.
__global__ void finish_rows(const float* logits, int64_t vocab, int parts, int rows, const RowArgs* args,
                            const uint32_t* masks, const RowState* states, const Candidate* draws,
                            RowResult* results) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const RowArgs a = args[row];
  const RowState st = states[row];
  int32_t token = st.z_argmax;
  if (a.temperature != 0.0f) {
    Candidate best = kNone;
    for (int p = 0; p < parts; ++p) best = better(best, draws[row * parts + p]);
    if (best.token != kNoToken) token = best.token;
  }
  const uint32_t* mask = a.mask_offset >= 0 ? masks + a.mask_offset : nullptr;
  const float v = allowed(mask, token) ? logits[a.logits_row * vocab + token] : kNegInf;
  results[row].token = token;
  results[row].logprob = float(double(v) - st.log_sum);
}

// The tests' twin of the draw, one block per row: the kept tokens' normalised weights ([rows, vocab]).
__global__ void __launch_bounds__(kSampleThreads)
    distribution_rows(int64_t vocab, const RowArgs* args, const float* z, const uint64_t* sorted_keys,
                      const int32_t* sorted_tokens, const RowState* states, float* probs) {
  const int row = blockIdx.x;
  const RowArgs a = args[row];
  const RowState st = states[row];
  float* out = probs + row * vocab;
  for (int64_t t = threadIdx.x; t < vocab; t += blockDim.x) out[t] = 0.0f;
  __syncthreads();
  const bool sorted = a.sort_segment >= 0;
  if (a.temperature == 0.0f || (!sorted && st.finite == 0)) {
    if (threadIdx.x == 0) out[st.z_argmax] = 1.0f;
    return;
  }
  const double z_max = st.z_max, inv_t = 1.0 / double(a.temperature);
  const float* zr = z + row * vocab;
  const uint64_t* keys = sorted ? sorted_keys + a.sort_segment * vocab : nullptr;
  const int32_t* tokens = sorted ? sorted_tokens + a.sort_segment * vocab : nullptr;
  const int64_t n = sorted ? st.keep : vocab;
  // Element j's token and weight, 0 when it is not kept.
  const auto kept = [&](int64_t j, int32_t& token) {
    token = sorted ? tokens[j] : int32_t(j);
    const float v = sorted ? z_of_key(keys[j]) : zr[j];
    if (!sorted && !(v > kNegInf)) return 0.0;
    const double wj = weight(v, z_max, inv_t);
    return !sorted && a.min_p > 0.0f && wj < double(a.min_p) ? 0.0 : wj;
  };
  double total = 0;
  int32_t token;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) total += kept(j, token);
  total = block_all(total, SumOp());
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const double wj = kept(j, token);
    if (wj > 0) out[token] = float(wj / total);
  }
}

// Pinned host memory, grown on demand (the transfers of each batch are asynchronous from it).
class PinnedBytes {
 public:
  ~PinnedBytes() {
    if (data_) cudaFreeHost(data_);
  }
  uint8_t* reserve(size_t bytes) {
    if (bytes > bytes_) {
      if (data_) cudaFreeHost(data_);
      data_ = nullptr;
      bytes_ = 0;
      NINFER_CUDA_CHECK(cudaMallocHost(&data_, bytes));
      bytes_ = bytes;
    }
    return static_cast<uint8_t*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A device buffer of at least `bytes`, grown by half again when it must grow (so a growing batch reallocates rarely).
template <class T>
T* at_least(DeviceBuffer& buffer, size_t count) {
  const size_t bytes = std::max<size_t>(count * sizeof(T), 16);
  if (buffer.bytes() < bytes) buffer = DeviceBuffer(bytes + bytes / 2);
  return buffer.as<T>();
}

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Rows that cut by rank or mass need their candidates in order: a radix sort of the whole row, or when top-k
// cuts to at most kMaxTop tokens, a selection of those (much cheaper; what top_k = 20 defaults get).
enum class Order { None, Sorted, Selected };
Order order_for(const SamplingParams& p, int64_t vocab) {
  const bool k_cuts = p.top_k > 0 && p.top_k < vocab;
  if (p.temperature == 0.0f || (!k_cuts && p.top_p >= 1.0f)) return Order::None;
  return k_cuts && p.top_k <= kMaxTop ? Order::Selected : Order::Sorted;
}

}  // namespace

struct DeviceSampler::Workspace {
  PinnedBytes input_host, results_host;
  DeviceBuffer input, z, stats, tops, best_lists, states, draws, results, sort_temp;
  DeviceBuffer keys[2], tokens[2];
};

DeviceSampler::DeviceSampler() : ws_(std::make_unique<Workspace>()) {}
DeviceSampler::~DeviceSampler() = default;

void DeviceSampler::run(cudaStream_t stream, const float* logits, int64_t vocab,
                        std::span<const DeviceSampleRow> rows, float* probs) {
  const int n_rows = int(rows.size());
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max())
    throw EngineError("device sampler: vocabulary of " + std::to_string(vocab) + " tokens");
  const int64_t words = token_mask_words(vocab);

  // The rows' arguments, history pairs and masks, packed for one upload.
  std::vector<RowArgs> args(rows.size());
  std::vector<int2> pairs;
  int64_t mask_words = 0;
  int32_t sorted_rows = 0, selected_rows = 0;
  bool top_logprobs = false;
  for (int r = 0; r < n_rows; ++r) {
    const DeviceSampleRow& row = rows[size_t(r)];
    const SamplingParams& p = *row.params;
    if (!row.mask.empty() && int64_t(row.mask.size()) != words)
      throw EngineError("device sampler: a token mask of " + std::to_string(row.mask.size()) + " words for " +
                        std::to_string(vocab) + " tokens");
    RowArgs& a = args[size_t(r)];
    a = {row.logits_row, row.seed, row.counter, p.temperature, p.top_p, p.min_p, p.presence_penalty,
         p.frequency_penalty, p.repetition_penalty, p.top_k, int32_t(std::min<int64_t>(p.top_logprobs, vocab)),
         int32_t(pairs.size()), 0, row.mask.empty() ? -1 : mask_words, -1, 0};
    const Order order = order_for(p, vocab);
    if (order == Order::Sorted) a.sort_segment = sorted_rows++;
    a.selected = order == Order::Selected;
    selected_rows += a.selected;
    for (const auto& [token, count] : row.history->seen) {
      const auto generated = row.history->generated.find(token);
      pairs.push_back({token, generated == row.history->generated.end() ? 0 : generated->second});
    }
    a.history_count = int32_t(pairs.size()) - a.history_offset;
    top_logprobs |= a.top_logprobs > 0;
    if (!row.mask.empty()) mask_words += words;
  }
  for (int r = 0, segment = sorted_rows; r < n_rows; ++r)  // selected rows' segments follow the sorted ones'
    if (args[size_t(r)].selected) args[size_t(r)].sort_segment = segment++;
  const size_t args_at = 0, pairs_at = align16(args.size() * sizeof(RowArgs)),
               masks_at = pairs_at + align16(pairs.size() * sizeof(int2)),
               input_bytes = masks_at + size_t(mask_words) * sizeof(uint32_t);
  uint8_t* host = ws_->input_host.reserve(input_bytes);
  std::memcpy(host + args_at, args.data(), args.size() * sizeof(RowArgs));
  std::memcpy(host + pairs_at, pairs.data(), pairs.size() * sizeof(int2));
  for (int r = 0, at = 0; r < n_rows; ++r)
    if (args[size_t(r)].mask_offset >= 0)
      std::memcpy(host + masks_at + size_t(at++ * words) * sizeof(uint32_t), rows[size_t(r)].mask.data(),
                  size_t(words) * sizeof(uint32_t));

  const int parts = int(std::clamp<int64_t>((vocab + kTokensPerPart - 1) / kTokensPerPart, 1, kMaxParts));
  const int64_t chunk = (vocab + parts - 1) / parts;
  const int64_t sort_items = int64_t(sorted_rows) * vocab, ordered_items = sort_items + selected_rows * vocab;
  uint8_t* input = at_least<uint8_t>(ws_->input, input_bytes);
  float* z = at_least<float>(ws_->z, size_t(n_rows * vocab));
  ChunkStats* stats = at_least<ChunkStats>(ws_->stats, size_t(n_rows * parts));
  Candidate* tops = at_least<Candidate>(ws_->tops, size_t(n_rows * parts * kMaxTop));
  Candidate* best_lists = at_least<Candidate>(ws_->best_lists, size_t(n_rows * parts * kMaxTop));
  RowState* states = at_least<RowState>(ws_->states, size_t(n_rows));
  Candidate* draws = at_least<Candidate>(ws_->draws, size_t(n_rows * parts));
  RowResult* results = at_least<RowResult>(ws_->results, size_t(n_rows));
  cub::DoubleBuffer<uint64_t> keys(at_least<uint64_t>(ws_->keys[0], size_t(ordered_items)),
                                   at_least<uint64_t>(ws_->keys[1], size_t(ordered_items)));
  cub::DoubleBuffer<int32_t> tokens(at_least<int32_t>(ws_->tokens[0], size_t(ordered_items)),
                                    at_least<int32_t>(ws_->tokens[1], size_t(ordered_items)));
  const int end_bit = 32 + int(std::bit_width(uint32_t(std::max(sorted_rows, 1) - 1)));
  size_t sort_temp_bytes = 0;
  if (sorted_rows > 0)
    NINFER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_temp_bytes, keys, tokens, sort_items, 0, end_bit,
                                                      stream));
  void* sort_temp = at_least<uint8_t>(ws_->sort_temp, sort_temp_bytes);

  NINFER_CUDA_CHECK(cudaMemcpyAsync(input, host, input_bytes, cudaMemcpyHostToDevice, stream));
  const auto* dargs = reinterpret_cast<const RowArgs*>(input + args_at);
  const auto* dpairs = reinterpret_cast<const int2*>(input + pairs_at);
  const auto* dmasks = reinterpret_cast<const uint32_t*>(input + masks_at);
  prepare_chunks<<<dim3(parts, n_rows), kSampleThreads, 0, stream>>>(logits, vocab, chunk, dargs, dpairs, dmasks, z,
                                                                     stats, keys.Current(), tokens.Current(),
                                                                     best_lists);
  NINFER_CUDA_CHECK_LAUNCH();
  combine_rows<<<n_rows, kSampleThreads, 0, stream>>>(parts, dargs, stats, states);
  NINFER_CUDA_CHECK_LAUNCH();
  if (top_logprobs) {
    top_logprob_chunks<<<dim3(parts, n_rows), kSampleThreads, 0, stream>>>(logits, vocab, chunk, dargs, dmasks,
                                                                           states, tops);
    NINFER_CUDA_CHECK_LAUNCH();
    top_logprob_rows<<<n_rows, kSampleThreads, 0, stream>>>(parts, dargs, tops, results);
    NINFER_CUDA_CHECK_LAUNCH();
  }
  if (sorted_rows > 0)
    NINFER_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_temp_bytes, keys, tokens, sort_items, 0,
                                                      end_bit, stream));
  if (selected_rows > 0) {
    place_selected_rows<<<n_rows, kSampleThreads, 0, stream>>>(vocab, parts, dargs, best_lists, keys.Current(),
                                                                tokens.Current());
    NINFER_CUDA_CHECK_LAUNCH();
  }
  if (sorted_rows + selected_rows > 0) {
    select_sorted<<<n_rows, kSampleThreads, 0, stream>>>(vocab, dargs, keys.Current(), states);
    NINFER_CUDA_CHECK_LAUNCH();
  }
  if (probs) {
    distribution_rows<<<n_rows, kSampleThreads, 0, stream>>>(vocab, dargs, z, keys.Current(), tokens.Current(),
                                                             states, probs);
    NINFER_CUDA_CHECK_LAUNCH();
  }
  draw_chunks<<<dim3(parts, n_rows), kSampleThreads, 0, stream>>>(vocab, chunk, dargs, z, keys.Current(),
                                                                  tokens.Current(), states, draws);
  NINFER_CUDA_CHECK_LAUNCH();
  finish_rows<<<(n_rows + 31) / 32, 32, 0, stream>>>(logits, vocab, parts, n_rows, dargs, dmasks, states, draws,
                                                     results);
  NINFER_CUDA_CHECK_LAUNCH();
}

void DeviceSampler::sample(cudaStream_t stream, const float* logits, int64_t vocab,
                           std::span<const DeviceSampleRow> rows, std::vector<SampledToken>& out) {
  out.clear();
  if (rows.empty()) return;
  run(stream, logits, vocab, rows, nullptr);
  auto* host = reinterpret_cast<RowResult*>(ws_->results_host.reserve(rows.size() * sizeof(RowResult)));
  NINFER_CUDA_CHECK(cudaMemcpyAsync(host, ws_->results.get(), rows.size() * sizeof(RowResult),
                                    cudaMemcpyDeviceToHost, stream));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t r = 0; r < rows.size(); ++r) {
    SampledToken& s = out.emplace_back();
    s.token = host[r].token;
    s.logprob = host[r].logprob;
    const int64_t n = std::min<int64_t>(rows[r].params->top_logprobs, vocab);
    for (int64_t k = 0; k < n; ++k) s.top.emplace_back(host[r].top_tokens[k], host[r].top_logprobs[k]);
  }
}

std::vector<float> DeviceSampler::distribution(cudaStream_t stream, const float* logits, int64_t vocab,
                                               std::span<const DeviceSampleRow> rows) {
  std::vector<float> out(rows.size() * size_t(vocab));
  if (rows.empty()) return out;
  DeviceBuffer probs(out.size() * sizeof(float));
  run(stream, logits, vocab, rows, probs.as<float>());
  NINFER_CUDA_CHECK(cudaMemcpyAsync(out.data(), probs.get(), probs.bytes(), cudaMemcpyDeviceToHost, stream));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

// The CUDA backend's DeviceRuntime::sample: after the pass that wrote the logits (launched if still captured).
void CudaBackend::sample(const float* logits, int64_t vocab, std::span<const DeviceSampleRow> rows,
                         std::vector<SampledToken>& out) {
  bind_calling_thread();
  launch_pass();
  sampler_.sample(stream_, logits, vocab, rows, out);
}

}  // namespace ninfer::cuda
