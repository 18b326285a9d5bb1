// Mixture of experts on the CUDA backend: routing (softmax, top-k, renormalise) one warp per row (one thread per
// row past kRouteWarpExperts experts, and as the twin), and the routed
// experts: per (row, slot) pair y = down_e(silu(gate_e x) * up_e x), then out[r] = sum_j weights[r, j] y[r, j]
// (j in order, so a row's result does not depend on the batch). y comes from the grouped tensor-core matmul
// (moe_grouped.cu) where it takes the weights, else from the simple kernels here: one warp per output value and
// scalar decoding, the obviously-right twin (set_reference_kernels) and the path for widths and encodings the
// grouped one does not take (f32, f16, int groups below 128, widths not multiples of 128).
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/moe_grouped.h"

namespace ninfer::cuda {
namespace {

constexpr int kWarps = 8;

// Highest probability first, ties to the lower expert id: the CPU twin's order.
__device__ __forceinline__ bool ranks_before(float pa, int32_t a, float pb, int32_t b) {
  return pa > pb || (pa == pb && a < b);
}

// The obviously-right routing: one thread per row, softmax, then top_k passes over all experts (the j-th pick is
// the best expert ranked after pick j - 1). Session 5 measured it at 202 us a call for 256 experts: half of a
// 35B-A3B decode step.
__global__ void moe_route_kernel(const float* logits, int64_t rows, int32_t experts, int32_t top_k, int32_t* ids,
                                 float* weights) {
  chain_start();
  NINFER_GRID_STRIDE(r, rows) {
    const float* l = logits + r * experts;
    float max_logit = l[0];
    for (int32_t e = 1; e < experts; ++e) max_logit = fmaxf(max_logit, l[e]);
    float sum = 0.0f;
    for (int32_t e = 0; e < experts; ++e) sum += expf(l[e] - max_logit);
    // The j-th pick is the best expert ranked after pick j - 1.
    float prev_p = INFINITY, top_sum = 0.0f;
    int32_t prev_e = -1;
    for (int32_t j = 0; j < top_k; ++j) {
      float best_p = -1.0f;
      int32_t best_e = -1;
      for (int32_t e = 0; e < experts; ++e) {
        const float p = expf(l[e] - max_logit) / sum;
        if (ranks_before(prev_p, prev_e, p, e) && (best_e < 0 || ranks_before(p, e, best_p, best_e))) {
          best_p = p;
          best_e = e;
        }
      }
      ids[r * top_k + j] = best_e;
      weights[r * top_k + j] = best_p;
      top_sum += best_p;
      prev_p = best_p;
      prev_e = best_e;
    }
    for (int32_t j = 0; j < top_k; ++j) weights[r * top_k + j] /= top_sum;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Experts per lane of the warp routing kernel (in registers); more experts than 32 x this take the thread kernel.
constexpr int kRouteLaneExperts = 16;
constexpr int kRouteWarpExperts = 32 * kRouteLaneExperts;
constexpr int kRouteWarpsPerBlock = 4;

// One warp per row: lane i holds the probabilities of experts i, i + 32, ...; each pick is a warp-wide arg-max with
// the thread kernel's order (higher probability, then lower expert id), after which the picked expert drops out.
// Probabilities are expf(l - max) / sum as in the thread kernel; only the sum's order of addition differs.
__global__ void moe_route_warp_kernel(const float* logits, int64_t rows, int32_t experts, int32_t top_k,
                                      int32_t* ids, float* weights) {
  chain_start();
  const int64_t r = int64_t(blockIdx.x) * kRouteWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* l = logits + r * experts;
  float p[kRouteLaneExperts];
  float max_logit = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRouteLaneExperts; ++i) {
    const int32_t e = lane + 32 * i;
    p[i] = e < experts ? l[e] : -INFINITY;
    max_logit = fmaxf(max_logit, p[i]);
  }
  for (int o = 16; o > 0; o >>= 1) max_logit = fmaxf(max_logit, __shfl_xor_sync(0xffffffffu, max_logit, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kRouteLaneExperts; ++i) {
    p[i] = lane + 32 * i < experts ? expf(p[i] - max_logit) : 0.0f;
    sum += p[i];
  }
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < kRouteLaneExperts; ++i) p[i] = lane + 32 * i < experts ? p[i] / sum : -1.0f;  // -1: no expert
  float top_sum = 0.0f;
  for (int32_t j = 0; j < top_k; ++j) {
    float best_p = -1.0f;
    int32_t best_e = INT32_MAX;
#pragma unroll
    for (int i = 0; i < kRouteLaneExperts; ++i)
      if (p[i] >= 0.0f && ranks_before(p[i], lane + 32 * i, best_p, best_e)) {
        best_p = p[i];
        best_e = lane + 32 * i;
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float other_p = __shfl_xor_sync(0xffffffffu, best_p, o);
      const int32_t other_e = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ranks_before(other_p, other_e, best_p, best_e)) {
        best_p = other_p;
        best_e = other_e;
      }
    }
    // Every lane now holds the same pick; its owner drops it.
#pragma unroll
    for (int i = 0; i < kRouteLaneExperts; ++i)
      if (lane + 32 * i == best_e) p[i] = -1.0f;
    if (lane == 0) {
      ids[r * top_k + j] = best_e;
      weights[r * top_k + j] = best_p;
    }
    top_sum += best_p;
  }
  if (lane == 0)
    for (int32_t j = 0; j < top_k; ++j) weights[r * top_k + j] /= top_sum;
}

// hidden_out[p, i] = silu(gate_e[i] . x[r]) * (up_e[i] . x[r]) for pair p = r * top_k + j, e = ids[p].
template <Encoding E>
__global__ void experts_up_kernel(const float* x, int64_t pairs, int64_t hidden, const int32_t* ids, int32_t top_k,
                                  WeightRef gate, WeightRef up, int64_t inter, float* hidden_out) {
  const int64_t p = blockIdx.x, i = int64_t(blockIdx.y) * kWarps + threadIdx.x / 32;
  if (i >= inter) return;
  const int64_t row = int64_t(ids[p]) * inter + i;
  const float* xr = x + (p / top_k) * hidden;
  float g = 0.0f, u = 0.0f;
  for (int64_t c = threadIdx.x % 32; c < hidden; c += 32) {
    g += xr[c] * weight_at<E>(gate, row, c);
    u += xr[c] * weight_at<E>(up, row, c);
  }
  g = warp_sum(g);
  u = warp_sum(u);
  if (threadIdx.x % 32 == 0) hidden_out[p * inter + i] = silu(g) * u;
}

// y[p, c] = down_e[c] . hidden_out[p]
template <Encoding E>
__global__ void experts_down_kernel(const float* h, int64_t inter, const int32_t* ids, WeightRef down,
                                    int64_t hidden, float* y) {
  const int64_t p = blockIdx.x, c = int64_t(blockIdx.y) * kWarps + threadIdx.x / 32;
  if (c >= hidden) return;
  const int64_t row = int64_t(ids[p]) * hidden + c;
  const float* hp = h + p * inter;
  float s = 0.0f;
  for (int64_t i = threadIdx.x % 32; i < inter; i += 32) s += hp[i] * weight_at<E>(down, row, i);
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) y[p * hidden + c] = s;
}

// The block's output: the routed experts' weighted sum, then the gated shared expert (if any) added to it.
__global__ void experts_sum_kernel(const float* y, int64_t rows, int64_t hidden, const float* weights, int32_t top_k,
                                   SharedExpertTerm shared, float* out) {
  chain_start();
  NINFER_GRID_STRIDE(i, rows * hidden) {
    const int64_t r = i / hidden, c = i % hidden;
    float s = 0.0f;
    for (int32_t j = 0; j < top_k; ++j) s += weights[r * top_k + j] * y[(r * top_k + j) * hidden + c];
    if (shared.out) s += sigmoid(shared.logit[r]) * shared.out[i];
    out[i] = s;
  }
}

}  // namespace

void CudaBackend::moe_route(const float* logits, int64_t rows, int32_t experts, int32_t top_k, int32_t* ids,
                            float* weights) {
  if (rows <= 0) return;
  if (top_k <= 0 || top_k > experts)
    throw EngineError("moe_route: top_k " + std::to_string(top_k) + " outside 1.." + std::to_string(experts));
  if (tables_only()) return;  // a replayed decode pass: the routing is in the graph and writes no step tables
  if (experts <= kRouteWarpExperts && !reference_kernels_) {
    const unsigned blocks = unsigned((rows + kRouteWarpsPerBlock - 1) / kRouteWarpsPerBlock);
    launch_chained(moe_route_warp_kernel, dim3(blocks), dim3(32 * kRouteWarpsPerBlock), 0, stream_, logits, rows,
                   experts, top_k, ids, weights);
  } else {
    launch_chained(moe_route_kernel, dim3(blocks_for(rows, 64)), dim3(64), 0, stream_, logits, rows, experts, top_k,
                   ids, weights);
  }
}

void CudaBackend::moe_experts(const float* x, int64_t rows, int64_t hidden, const int32_t* ids, const float* weights,
                              int32_t top_k, const TensorView& gate, const TensorView& up, const TensorView& down,
                              const SharedExpertTerm& shared, float* out) {
  if (rows <= 0 || tables_only()) return;
  const TensorView& g = resident(gate);
  const TensorView& u = resident(up);
  const TensorView& d = resident(down);
  if (g.encoding != u.encoding || g.encoding != d.encoding)
    throw EngineError("CUDA moe_experts: gate, up and down must share one encoding (" +
                      std::string(encoding_name(g.encoding)) + ", " + encoding_name(u.encoding) + ", " +
                      encoding_name(d.encoding) + ")");
  const int64_t pairs = rows * top_k, inter = g.rows();
  float* y = scratch(moe_out_, size_t(pairs * hidden));
  if (!reference_kernels_ && moe_grouped_supports(g, u, d, hidden)) {
    const auto floats = [](size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); };
    MoeScratch s;
    s.x_split = scratch(moe_split_, floats(moe_grouped_x_split_bytes(rows, hidden)));
    s.h_split = scratch(moe_hidden_, floats(moe_grouped_h_split_bytes(pairs, inter)));
    s.routing = scratch(moe_routing_, floats(moe_grouped_routing_bytes(pairs)));
    moe_grouped_experts(x, rows, hidden, ids, top_k, g, u, d, s, y, stream_);
  } else {
    if ((inter + kWarps - 1) / kWarps > 65535 || (hidden + kWarps - 1) / kWarps > 65535)
      throw EngineError("CUDA moe_experts: expert width above one launch's grid");
    float* h = scratch(moe_hidden_, size_t(pairs * inter));
    dispatch_encoding(g.encoding, [&](auto encoding) {
      constexpr Encoding E = decltype(encoding)::value;
      experts_up_kernel<E><<<dim3(unsigned(pairs), unsigned((inter + kWarps - 1) / kWarps)), kWarps * 32, 0,
                             stream_>>>(x, pairs, hidden, ids, top_k, weight_ref(g), weight_ref(u), inter, h);
      NINFER_CUDA_CHECK_LAUNCH();
      experts_down_kernel<E><<<dim3(unsigned(pairs), unsigned((hidden + kWarps - 1) / kWarps)), kWarps * 32, 0,
                               stream_>>>(h, inter, ids, weight_ref(d), hidden, y);
      NINFER_CUDA_CHECK_LAUNCH();
    });
  }
  launch_chained(experts_sum_kernel, dim3(blocks_for(rows * hidden)), dim3(kThreads), 0, stream_, y, rows, hidden,
                 weights, top_k, shared, out);
}

}  // namespace ninfer::cuda
