// Normalisations of the CUDA backend: RMSNorm in both conventions (alone, or after a residual add), the GDN gated
// RMSNorm, per-head L2 norm, the vision tower's LayerNorm. One block per vector (gated RMSNorm: one warp per vector where float4 fits); each thread
// reads its elements before writing them, so `out` may alias `x`.
#include <utility>

#include "backend/cuda/activation_split.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/norm_split.h"

namespace ninfer::cuda {
namespace {

constexpr int kNormThreads = 128;

__device__ float sum_of_squares(const float* x, int64_t dim) {
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) s += x[j] * x[j];
  return block_reduce(s, SumOp{});
}

__global__ void rmsnorm_kernel(const float* x, int64_t dim, int64_t x_stride, const float* w, float offset, float eps,
                               float* out, int64_t out_stride) {
  chain_start();
  const float* xr = x + int64_t(blockIdx.x) * x_stride;
  float* yr = out + int64_t(blockIdx.x) * out_stride;
  const float inv = 1.0f / sqrtf(sum_of_squares(xr, dim) / float(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = xr[j] * inv * (offset + w[j]);
}

// LayerNorm with weight and bias, two passes over the row (mean, then the centred variance) as the CPU twin
// takes them: the one-pass E[x^2] - E[x]^2 loses digits on rows far from zero mean.
__global__ void layernorm_kernel(const float* x, int64_t dim, const float* w, const float* b, float eps, float* out) {
  chain_start();
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = out + int64_t(blockIdx.x) * dim;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) s += xr[j];
  const float mean = block_reduce(s, SumOp{}) / float(dim);
  float c = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) c += (xr[j] - mean) * (xr[j] - mean);
  const float inv = 1.0f / sqrtf(block_reduce(c, SumOp{}) / float(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = (xr[j] - mean) * inv * w[j] + b[j];
}

// Rows of V-float vectors: V = 4 moves 16 bytes per access where the row length and addresses allow it.
template <int V>
struct Floats {
  float v[V];
  __device__ static Floats load(const float* p) {
    Floats f;
    if constexpr (V == 4) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      f.v[0] = q.x, f.v[1] = q.y, f.v[2] = q.z, f.v[3] = q.w;
    } else {
      for (int i = 0; i < V; ++i) f.v[i] = p[i];
    }
    return f;
  }
  __device__ void store(float* p) const {
    if constexpr (V == 4) *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    else
      for (int i = 0; i < V; ++i) p[i] = v[i];
  }
};

constexpr int kAddNormThreads = 256;

// The tensor-core GEMV's split planes of the norm's output (gemv_mma.h's SplitActivations, fp16 kinds).
struct NormPlanes {
  uint16_t* hi = nullptr;
  uint16_t* lo = nullptr;
  int* exps = nullptr;
};

// hidden[r] += delta[r]; out[r] = hidden[r] * inv_rms * (offset + w): reads hidden and delta once and writes both
// results once; the second loop re-reads the row this thread just wrote (from cache). kOrder >= 0 (a tc::Order):
// the block also splits out[r] into `planes` for the fp16 GEMV kinds, the same ops on the same values as
// split_activations_kernel (activation_split.cuh), so the decode GEMVs reading out need no split kernel.
template <int V, int kOrder>
__global__ void __launch_bounds__(kAddNormThreads) add_rmsnorm_kernel(float* hidden, const float* delta, int64_t dim,
                                                                      const float* w, float offset, float eps,
                                                                      float* out, NormPlanes planes) {
  chain_start();
  const int64_t base = int64_t(blockIdx.x) * dim;
  float s = 0.0f;
  for (int64_t j = int64_t(threadIdx.x) * V; j < dim; j += int64_t(blockDim.x) * V) {
    Floats<V> h = Floats<V>::load(hidden + base + j);
    const Floats<V> d = Floats<V>::load(delta + base + j);
    for (int i = 0; i < V; ++i) {
      h.v[i] += d.v[i];
      s += h.v[i] * h.v[i];
    }
    h.store(hidden + base + j);
  }
  const float inv = 1.0f / sqrtf(block_reduce(s, SumOp{}) / float(dim) + eps);
  float amax = 0.0f;
  for (int64_t j = int64_t(threadIdx.x) * V; j < dim; j += int64_t(blockDim.x) * V) {
    Floats<V> y = Floats<V>::load(hidden + base + j);
    const Floats<V> wj = Floats<V>::load(w + j);
    for (int i = 0; i < V; ++i) {
      y.v[i] = y.v[i] * inv * (offset + wj.v[i]);
      if constexpr (kOrder >= 0) amax = fmaxf(amax, fabsf(y.v[i]));
    }
    y.store(out + base + j);
  }
  if constexpr (kOrder >= 0) {
    // The reduction's barriers also make every thread's stores of out above visible to the reads below.
    const int e = fp16_row_exponent(block_reduce(amax, MaxOp{}));
    if (threadIdx.x == 0) planes.exps[blockIdx.x] = e;
    split_columns<false, static_cast<tc::Order>(kOrder)>(out + base, 0, dim, kAddNormThreads, ldexpf(1.0f, e),
                                                         planes.hi + base, planes.lo + base);
  }
}

// add_rmsnorm_kernel for an activation split kind: planes for the fp16 kinds, none for others (-1, bf16).
template <int V>
auto add_rmsnorm_kernel_for(int split_kind) {
  switch (split_kind) {
    case split_kind_of(false, tc::Order::Natural): return add_rmsnorm_kernel<V, int(tc::Order::Natural)>;
    case split_kind_of(false, tc::Order::Nibble): return add_rmsnorm_kernel<V, int(tc::Order::Nibble)>;
    case split_kind_of(false, tc::Order::Byte): return add_rmsnorm_kernel<V, int(tc::Order::Byte)>;
    default: return add_rmsnorm_kernel<V, -1>;
  }
}

__global__ void gated_rmsnorm_kernel(const float* x, const float* z, int32_t dim, const float* w, float eps,
                                     float* out) {
  chain_start();
  const int64_t base = int64_t(blockIdx.x) * dim;
  const float inv = 1.0f / sqrtf(sum_of_squares(x + base, dim) / float(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    out[base + j] = (w[j] * (x[base + j] * inv)) * silu(z[base + j]);
}

// gated_rmsnorm with one warp per (row, head) vector and float4 accesses (dim % 4 == 0, 16-byte aligned): a
// head of 128 values is one float4 per lane, reduced by shuffles alone.
constexpr int kWarpNormWarps = 8;

__global__ void __launch_bounds__(32 * kWarpNormWarps) gated_rmsnorm_warp_kernel(const float* x, const float* z,
                                                                                 int64_t vectors, int32_t dim,
                                                                                 const float* w, float eps,
                                                                                 float* out) {
  chain_start();
  const int64_t vec = int64_t(blockIdx.x) * kWarpNormWarps + threadIdx.x / 32;
  if (vec >= vectors) return;
  const int lane = threadIdx.x % 32;
  const int64_t base = vec * dim;
  float s = 0.0f;
  for (int j = 4 * lane; j < dim; j += 128) {
    const Floats<4> v = Floats<4>::load(x + base + j);
    for (int i = 0; i < 4; ++i) s += v.v[i] * v.v[i];
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = 1.0f / sqrtf(s / float(dim) + eps);
  for (int j = 4 * lane; j < dim; j += 128) {
    Floats<4> y = Floats<4>::load(x + base + j);
    const Floats<4> zj = Floats<4>::load(z + base + j), wj = Floats<4>::load(w + j);
    for (int i = 0; i < 4; ++i) y.v[i] = (wj.v[i] * (y.v[i] * inv)) * silu(zj.v[i]);
    y.store(out + base + j);
  }
}

__global__ void l2norm_heads_kernel(const float* x, int32_t heads, int32_t dim, int64_t x_stride, float scale,
                                    float* out) {
  chain_start();
  const int64_t r = blockIdx.x / heads, h = blockIdx.x % heads;
  const float* xr = x + r * x_stride + h * dim;
  float* yr = out + int64_t(blockIdx.x) * dim;
  const float inv = 1.0f / sqrtf(sum_of_squares(xr, dim) + 1e-6f);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = xr[j] * inv * scale;
}

void check_grid(int64_t blocks, const char* op) {
  if (blocks > 0x7fffffff) throw EngineError(std::string("cuda ") + op + ": too many rows for one launch");
}

}  // namespace

void launch_add_rmsnorm(float* hidden, const float* delta, int64_t rows, int64_t dim, const float* w, float offset,
                        float eps, float* out, const SplitActivations* planes, cudaStream_t stream) {
  if (rows <= 0) return;
  check_grid(rows, "add_rmsnorm");
  NormPlanes p;
  int kind = -1;
  if (planes) {
    if (!split_has_planes(planes->kind) || planes->x != out || planes->rows != rows || planes->cols != dim)
      throw EngineError("add_rmsnorm: split planes laid out for other activations than the norm's output");
    p = {const_cast<uint16_t*>(planes->hi), const_cast<uint16_t*>(planes->lo), const_cast<int*>(planes->exps)};
    kind = planes->kind;
  }
  const bool vectors = dim % 4 == 0 && aligned16(hidden) && aligned16(delta) && aligned16(w) && aligned16(out);
  launch_chained(vectors ? add_rmsnorm_kernel_for<4>(kind) : add_rmsnorm_kernel_for<1>(kind), dim3(unsigned(rows)),
                 dim3(kAddNormThreads), 0, stream, hidden, delta, dim, w, offset, eps, out, p);
}

void CudaBackend::rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, NormKind kind,
                          float eps, float* out, int64_t out_stride) {
  if (rows <= 0 || tables_only()) return;
  check_grid(rows, "rmsnorm");
  launch_chained(rmsnorm_kernel, dim3(unsigned(rows)), dim3(kNormThreads), 0, stream_, x, dim, x_stride,
                 resident(w, dim), kind == NormKind::Offset ? 1.0f : 0.0f, eps, out, out_stride);
}

void CudaBackend::norm_feeds(const TensorView& reader) {
  const int kind = split_kind(reader);
  norm_split_ = {kind, kind >= 0 ? reader.cols() : 0};
}

void CudaBackend::add_rmsnorm(float* hidden, const float* delta, int64_t rows, int64_t dim, const float* w,
                              NormKind kind, float eps, float* out) {
  const NormSplit split = std::exchange(norm_split_, NormSplit{});  // the hint holds for this norm only
  if (rows <= 0 || tables_only()) return;
  // A decode batch whose output the tensor-core GEMV reads from fp16 planes: the norm writes them
  // (linear_shared_input takes them instead of splitting out again).
  const bool planes =
      !reference_kernels_ && split_has_planes(split.kind) && split.cols == dim && rows <= kMaxGemvRows;
  if (planes) norm_planes_ = split_layout(out, int(rows), dim, split.kind, gemv_workspace_, stream_);
  launch_add_rmsnorm(hidden, delta, rows, dim, resident(w, dim), kind == NormKind::Offset ? 1.0f : 0.0f, eps, out,
                     planes ? &norm_planes_ : nullptr, stream_);
}

void CudaBackend::gated_rmsnorm(const float* x, const float* z, int64_t rows, int32_t heads, int32_t dim,
                                const float* w, float eps, float* out) {
  if (rows * heads <= 0 || tables_only()) return;
  const float* dw = resident(w, dim);
  const int64_t vectors = rows * heads;
  if (dim % 4 == 0 && aligned16(x) && aligned16(z) && aligned16(dw) && aligned16(out)) {
    const int64_t blocks = (vectors + kWarpNormWarps - 1) / kWarpNormWarps;
    check_grid(blocks, "gated_rmsnorm");
    launch_chained(gated_rmsnorm_warp_kernel, dim3(unsigned(blocks)), dim3(32 * kWarpNormWarps), 0, stream_, x, z,
                   vectors, dim, dw, eps, out);
  } else {
    check_grid(vectors, "gated_rmsnorm");
    launch_chained(gated_rmsnorm_kernel, dim3(unsigned(vectors)), dim3(kNormThreads), 0, stream_, x, z, dim, dw, eps,
                   out);
  }
}

void CudaBackend::layernorm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                            float* out) {
  if (rows <= 0 || tables_only()) return;
  check_grid(rows, "layernorm");
  launch_chained(layernorm_kernel, dim3(unsigned(rows)), dim3(kNormThreads), 0, stream_, x, dim, resident(w, dim),
                 resident(b, dim), eps, out);
}

void CudaBackend::l2norm_heads(const float* x, int64_t rows, int32_t heads, int32_t dim, int64_t x_stride,
                               float scale, float* out) {
  if (rows * heads <= 0 || tables_only()) return;
  check_grid(rows * heads, "l2norm_heads");
  launch_chained(l2norm_heads_kernel, dim3(unsigned(rows * heads)), dim3(kNormThreads), 0, stream_, x, heads, dim,
                 x_stride, scale, out);
}

}  // namespace ninfer::cuda
