#include "backend/cuda/streamed_gemm.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "errors.h"

namespace ninfer::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kStepCols = 128;                // one k-step: the 4 lanes' 32-column segments of a quad; one group
constexpr int kBlockRows = 32 * kWarps;       // weight rows of a block: two 16-row mma tiles per warp
constexpr int kPlaneRowBytes = 2 * kStepCols;  // one activation row of a step, bf16
constexpr int kPlaneChunks = kPlaneRowBytes / 16;
static_assert(kBlockRows == kBlockThreads, "one thread copies each weight row's group scale and zero point");

template <Encoding E>
__host__ __device__ constexpr int code_row_bytes() { return kStepCols * tc::code_bits<E>() / 8; }  // 64 (int4) or 128 (int8)

// Steps in flight: enough bytes to cover the memory latency at 2 blocks an SM within the shared memory they get.
template <Encoding E>
__host__ __device__ constexpr int stages() { return E == Encoding::INT4 ? 4 : 3; }

// One stage of shared memory: the codes of the block's rows, the activation tile, the 4-byte words holding each
// row's group scale and zero point (cp.async copies no fewer than 4 bytes; the reader picks its half or byte).
template <Encoding E, int kNTiles>
struct Stage {
  static constexpr int kCodes = kBlockRows * code_row_bytes<E>();
  static constexpr int kPlane = kNTiles * 8 * kPlaneRowBytes;
  static constexpr int kBytes = kCodes + kPlane + 2 * kBlockRows * 4;
  static constexpr int kShared = stages<E>() * kBytes;
};

// Shared-memory swizzles that keep a quarter-warp's 16-byte loads on distinct banks. Codes: lanes of a quarter-warp
// read rows g and g + 1 at their quad's segment; 64-byte int4 rows put those in distinct banks as they are, 128-byte
// int8 rows need row-parity XOR. Plane: lanes read rows g, g + 1 at chunks 4q + jj; the XOR of bit 3 and the row
// parity into bits 1 and 0 separates all eight.
template <Encoding E>
__device__ __forceinline__ int code_unit(int row, int unit) {
  return code_row_bytes<E>() == 128 ? unit ^ (row & 1) : unit;
}
__device__ __forceinline__ int plane_chunk(int row, int chunk) {
  return chunk ^ ((((chunk >> 3) & 1) << 1) | (row & 1));
}

struct Args {
  const uint16_t* plane;
  int64_t rows, k;
  const uint8_t* q;
  const uint8_t* scale;
  const uint8_t* zero;
  int64_t n;
  int32_t group_size, splits;
  float* y;
  const float* bias;
  float* partials;  // [splits][rows][n] when splits > 1
};

// Queues the copies of step `step` (128 columns) for the block's weight rows from n0 and activation rows from m0.
template <Encoding E, int kNTiles>
__device__ __forceinline__ void fill(const Args& a, uint8_t* stage, int64_t n0, int64_t m0, int64_t step) {
  using S = Stage<E, kNTiles>;
  constexpr int kUnits = code_row_bytes<E>() / 16;
  const int64_t col0 = step * kStepCols;
  for (int i = threadIdx.x; i < kBlockRows * kUnits; i += kBlockThreads) {
    const int r = i / kUnits, u = i % kUnits;
    const int64_t row = min(n0 + r, a.n - 1);  // rows past the end copy the last row, never written out
    cp_async16(stage + r * code_row_bytes<E>() + 16 * code_unit<E>(r, u),
               a.q + (row * a.k + col0) * tc::code_bits<E>() / 8 + 16 * u, true);
  }
  uint8_t* plane = stage + S::kCodes;
  for (int i = threadIdx.x; i < kNTiles * 8 * kPlaneChunks; i += kBlockThreads) {
    const int r = i / kPlaneChunks, c = i % kPlaneChunks;
    const bool valid = m0 + r < a.rows;  // rows past the batch are zeros
    cp_async16(plane + r * kPlaneRowBytes + 16 * plane_chunk(r, c), a.plane + (valid ? m0 + r : 0) * a.k + col0 + 8 * c,
               valid);
  }
  // The aligned word holding a byte stays inside its allocation (allocations are at least 4-byte aligned and sized).
  const int r = threadIdx.x;
  const int64_t row = min(n0 + r, a.n - 1);
  const int64_t group = row * (a.k / a.group_size) + col0 / a.group_size;
  uint32_t* words = reinterpret_cast<uint32_t*>(plane + S::kPlane);
  cp_async4(words + r, reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(a.scale + 2 * group) & ~uintptr_t(3)));
  cp_async4(words + kBlockRows + r,
            reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(a.zero + group) & ~uintptr_t(3)));
}

// acc += this step's products: each 16-row tile t of the warp against every 8-row activation tile, one group's sum
// at a time scaled by its group scale.
template <Encoding E, int kNTiles>
__device__ __forceinline__ void compute(const Args& a, const uint8_t* stage, int64_t n0, int64_t step,
                                        float (&acc)[2][kNTiles][4]) {
  using S = Stage<E, kNTiles>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const uint8_t* plane = stage + S::kCodes;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(plane + S::kPlane);
  tc::Segment<E> seg[2][2];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 32 + t * 16 + g + 8 * h;
#pragma unroll
      for (int v = 0; v < tc::segment_vectors<E>(); ++v)
        seg[t][h].codes[v] = *reinterpret_cast<const uint4*>(
            stage + r * code_row_bytes<E>() + 16 * code_unit<E>(r, q * tc::segment_vectors<E>() + v));
      const int64_t row = min(n0 + r, a.n - 1);
      const int64_t group = row * (a.k / a.group_size) + step * kStepCols / a.group_size;
      const int scale_shift = int((reinterpret_cast<uintptr_t>(a.scale) + 2 * group) & 2) * 8;
      const int zero_shift = int((reinterpret_cast<uintptr_t>(a.zero) + group) & 3) * 8;
      tc::set_group<E>(uint16_t(words[r] >> scale_shift), (words[kBlockRows + r] >> zero_shift) & 0xffu, seg[t][h]);
    }
  float tile[2][kNTiles][4] = {};
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) {  // pairs 4 jj .. 4 jj + 3 of each lane's segment: two k16 mma steps
    uint32_t op[2][2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) op[t][h][i] = tc::bf16_pair<E>(seg[t][h], 4 * jj + i);
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int r = n * 8 + g;
      const uint4 b = *reinterpret_cast<const uint4*>(plane + r * kPlaneRowBytes + 16 * plane_chunk(r, 4 * q + jj));
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        tc::mma_bf16_16816(tile[t][n], op[t][0][0], op[t][1][0], op[t][0][1], op[t][1][1], b.x, b.y);
        tc::mma_bf16_16816(tile[t][n], op[t][0][2], op[t][1][2], op[t][0][3], op[t][1][3], b.z, b.w);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][n][e] = fmaf(seg[t][e / 2].group_scale, tile[t][n][e], acc[t][n][e]);
}

// Grid: x activation tiles (fastest, so the blocks that read one weight tile run together and share it in L2),
// y weight tiles, z column splits.
template <Encoding E, int kNTiles>
__global__ void __launch_bounds__(kBlockThreads) streamed_gemm_kernel(Args a) {
  using S = Stage<E, kNTiles>;
  constexpr int kStages = stages<E>();
  extern __shared__ __align__(16) uint8_t shared[];
  const int64_t m0 = int64_t(blockIdx.x) * kNTiles * 8, n0 = int64_t(blockIdx.y) * kBlockRows;
  const int64_t steps = a.k / kStepCols;
  const int64_t first = blockIdx.z * steps / a.splits, count = (blockIdx.z + 1) * steps / a.splits - first;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) fill<E, kNTiles>(a, shared + s * S::kBytes, n0, m0, first + s);
    cp_async_commit();
  }
  float acc[2][kNTiles][4] = {};
  for (int64_t i = 0; i < count; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // step i is in for every thread, and every thread is done with step i - 1's stage
    if (i + kStages - 1 < count)
      fill<E, kNTiles>(a, shared + (i + kStages - 1) % kStages * S::kBytes, n0, m0, first + i + kStages - 1);
    cp_async_commit();
    compute<E, kNTiles>(a, shared + i % kStages * S::kBytes, n0, first + i, acc);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // c0, c1: weight row g, activation rows 2q, 2q + 1; c2, c3: row g + 8
        const int64_t out = n0 + warp * 32 + t * 16 + g + 8 * (e / 2), row = m0 + n * 8 + 2 * q + e % 2;
        if (out >= a.n || row >= a.rows) continue;
        if (a.splits == 1)
          a.y[row * a.n + out] = acc[t][n][e] + (a.bias ? a.bias[out] : 0.0f);
        else
          a.partials[(blockIdx.z * a.rows + row) * a.n + out] = acc[t][n][e];
      }
}

// y = the splits' partial sums added in split order (+ bias).
__global__ void sum_splits_kernel(const float* partials, int32_t splits, int64_t rows, int64_t n, const float* bias,
                                  float* y) {
  NINFER_GRID_STRIDE(i, rows * n) {
    float v = partials[i];
    for (int s = 1; s < splits; ++s) v += partials[s * rows * n + i];
    y[i] = v + (bias ? bias[i % n] : 0.0f);
  }
}

// x rounded to bf16 in operand order: plane positions 8c .. 8c + 7 of a 32-column segment hold source columns
// 8c + source_column(order, 0 .. 7) (both orders permute within eights), so a thread turns 8 floats into 16 bytes.
template <tc::Order kOrder>
__global__ void prepare_kernel(const float4* x, int64_t chunks, uint4* plane) {
  NINFER_GRID_STRIDE(i, chunks) {
    const float4 lo = x[2 * i], hi = x[2 * i + 1];
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint32_t w[4];
#pragma unroll
    for (int p = 0; p < 4; ++p)
      w[p] = tc::bf16x2_of(v[tc::source_column(kOrder, 2 * p)], v[tc::source_column(kOrder, 2 * p + 1)]);
    plane[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The launch shape: activation tiles of 16, 32 or 64 rows (fewer idle mma rows for small batches), and the columns
// split over blocks until about two blocks an SM are busy, each split keeping at least 4 steps.
struct Plan {
  int n_tiles;  // 8-row mma tiles per activation tile
  int64_t act_tiles, weight_tiles;
  int splits;
};

Plan plan_for(int64_t rows, const TensorView& w) {
  Plan p{};
  p.n_tiles = rows <= 16 ? 2 : (rows <= 32 ? 4 : 8);
  p.act_tiles = (rows + 8 * p.n_tiles - 1) / (8 * p.n_tiles);
  p.weight_tiles = (w.rows() + kBlockRows - 1) / kBlockRows;
  const int64_t blocks = p.act_tiles * p.weight_tiles, wave = 2 * int64_t(device_sms());
  const int64_t steps = w.cols() / kStepCols;
  p.splits = blocks >= wave ? 1 : int(std::min((wave + blocks - 1) / blocks, std::max<int64_t>(1, steps / 4)));
  return p;
}

template <Encoding E, int kNTiles>
void launch(const Args& a, const Plan& p, cudaStream_t stream) {
  using S = Stage<E, kNTiles>;
  static const bool configured = [] {
    NINFER_CUDA_CHECK(cudaFuncSetAttribute(streamed_gemm_kernel<E, kNTiles>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, S::kShared));
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned(p.act_tiles), unsigned(p.weight_tiles), unsigned(p.splits));
  streamed_gemm_kernel<E, kNTiles><<<grid, kBlockThreads, S::kShared, stream>>>(a);
  NINFER_CUDA_CHECK_LAUNCH();
}

template <Encoding E>
void launch_for_rows(const Args& a, const Plan& p, cudaStream_t stream) {
  switch (p.n_tiles) {
    case 2: return launch<E, 2>(a, p, stream);
    case 4: return launch<E, 4>(a, p, stream);
    default: return launch<E, 8>(a, p, stream);
  }
}

}  // namespace

bool streamed_gemm_supports(const TensorView& w) {
  return (w.encoding == Encoding::INT4 || w.encoding == Encoding::INT8) && w.shape.size() == 2 &&
         w.cols() % kStepCols == 0 && w.group_size > 0 && w.group_size % kStepCols == 0;
}

int streamed_gemm_order(const TensorView& w) {
  return int(w.encoding == Encoding::INT4 ? tc::order<Encoding::INT4>() : tc::order<Encoding::INT8>());
}

void streamed_gemm_prepare(const float* x, int64_t rows, int64_t k, int order, uint16_t* plane, cudaStream_t stream) {
  if (k % kStepCols != 0 || !aligned16(x)) throw EngineError("streamed GEMM: activations need 16-byte rows of 128s");
  const int64_t chunks = rows * k / 8;
  const auto* in = reinterpret_cast<const float4*>(x);
  auto* out = reinterpret_cast<uint4*>(plane);
  if (order == int(tc::Order::Nibble))
    prepare_kernel<tc::Order::Nibble><<<blocks_for(chunks), kThreads, 0, stream>>>(in, chunks, out);
  else if (order == int(tc::Order::Byte))
    prepare_kernel<tc::Order::Byte><<<blocks_for(chunks), kThreads, 0, stream>>>(in, chunks, out);
  else
    throw EngineError("streamed GEMM: unknown operand order " + std::to_string(order));
  NINFER_CUDA_CHECK_LAUNCH();
}

size_t streamed_gemm_partial_bytes(int64_t rows, const TensorView& w) {
  const Plan p = plan_for(rows, w);
  return p.splits > 1 ? size_t(p.splits) * size_t(rows) * size_t(w.rows()) * sizeof(float) : 0;
}

void streamed_gemm(const uint16_t* plane, int64_t rows, const TensorView& w, float* y, const float* bias,
                   float* partials, cudaStream_t stream) {
  if (!streamed_gemm_supports(w)) throw EngineError("streamed GEMM: cannot run " + w.name);
  if (rows < 1) return;
  const Plan p = plan_for(rows, w);
  if (p.splits > 1 && !partials) throw EngineError("streamed GEMM: split-K needs its partial-sum scratch");
  const Args a{plane, rows, w.cols(), w.data, w.scale, w.zero, w.rows(), w.group_size, p.splits, y, bias, partials};
  if (w.encoding == Encoding::INT4)
    launch_for_rows<Encoding::INT4>(a, p, stream);
  else
    launch_for_rows<Encoding::INT8>(a, p, stream);
  if (p.splits > 1) {
    sum_splits_kernel<<<blocks_for(rows * w.rows()), kThreads, 0, stream>>>(partials, p.splits, rows, w.rows(), bias,
                                                                            y);
    NINFER_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace ninfer::cuda
