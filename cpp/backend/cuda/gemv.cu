#include "backend/cuda/gemv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"

namespace ninfer::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Output rows per warp: the activations a warp loads are reused across them; fewer when there are many
// activation rows, so that the accumulators stay in registers.
__host__ __device__ constexpr int rows_per_warp(int activation_rows) {
  return activation_rows <= 2 ? 4 : (activation_rows <= 4 ? 2 : 1);
}

struct GemvArgs {
  const float* x;
  float* y;
  const uint8_t* q;
  const uint8_t* scale;
  const uint8_t* zero;
  float global_scale;
  int64_t out_rows, cols;
  int32_t group_size;
  const uint8_t* offset = nullptr;  // int4_affine
};

template <Encoding E>
__host__ __device__ constexpr int values_per_16_bytes() {
  if constexpr (E == Encoding::F32) return 4;
  if constexpr (E == Encoding::F16 || E == Encoding::BF16) return 8;
  if constexpr (E == Encoding::FP8_E4M3 || E == Encoding::INT8) return 16;
  return 32;  // INT4, NVFP4
}

// x[r, col .. col + N) for every activation row r, with the widest aligned loads.
template <int R, int N>
__device__ __forceinline__ void load_x(const float* x, int64_t cols, int64_t col, float (&xv)[R][8]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float* p = x + r * cols + col;
    if constexpr (N == 8 || N == 4) {
#pragma unroll
      for (int v = 0; v < N / 4; ++v) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(p) + v);
        xv[r][4 * v] = a.x; xv[r][4 * v + 1] = a.y; xv[r][4 * v + 2] = a.z; xv[r][4 * v + 3] = a.w;
      }
    } else if constexpr (N == 2) {
      const float2 a = __ldg(reinterpret_cast<const float2*>(p));
      xv[r][0] = a.x; xv[r][1] = a.y;
    } else {
      xv[r][0] = __ldg(p);
    }
  }
}

// Decode one 32-bit word of weights into up to 8 float values (raw codes for the quantized encodings:
// integers for int4/int8, unscaled e4m3/e2m1 values for fp8/nvfp4; scales are applied per chunk).
template <Encoding E>
__device__ __forceinline__ void decode_word(uint32_t word, float (&w)[8]) {
  if constexpr (E == Encoding::INT4 || E == Encoding::INT4_AFFINE) {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = small_uint_to_float((word >> (4 * i)) & 0xfu);
  } else if constexpr (E == Encoding::NVFP4) {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = e2m1_to_float((word >> (4 * i)) & 0xfu);
  } else if constexpr (E == Encoding::INT8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = small_uint_to_float((word >> (8 * i)) & 0xffu);
  } else if constexpr (E == Encoding::FP8_E4M3) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo));
    const float2 b = __half22float2(__half2(hi));
    w[0] = a.x; w[1] = a.y; w[2] = b.x; w[3] = b.y;
  } else if constexpr (E == Encoding::BF16) {
    w[0] = __uint_as_float(word << 16);
    w[1] = __uint_as_float(word & 0xffff0000u);
  } else if constexpr (E == Encoding::F16) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&word));
    w[0] = a.x; w[1] = a.y;
  } else {
    w[0] = __uint_as_float(word);
  }
}

// One warp, kRowsPerWarp output rows, R activation rows. Each lane streams 16-byte chunks of every weight row
// (coalesced: a warp reads 512 contiguous bytes per row per step).
template <Encoding E, int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_kernel(GemvArgs a, bool vector_path) {
  constexpr int kRowsPerWarp = rows_per_warp(R);
  constexpr int kValues = values_per_16_bytes<E>();
  constexpr int kValuesPerWord = kValues / 4;
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * kRowsPerWarp;
  if (row0 >= a.out_rows) return;
  const int n_rows = a.out_rows - row0 < kRowsPerWarp ? int(a.out_rows - row0) : kRowsPerWarp;
  const int64_t row_bytes = a.cols / kValues * 16;  // bytes of one weight row (vector path: cols % kValues == 0)
  const int64_t full_chunks = vector_path ? a.cols / kValues : 0;

  // acc: sums before the per-row scale (fp8) or global scale (nvfp4); tail: fully scaled scalar-path sums.
  float acc[kRowsPerWarp][R], tail[kRowsPerWarp][R];
#pragma unroll
  for (int n = 0; n < kRowsPerWarp; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = tail[n][r] = 0.0f;

  // Weights of the warp's rows as 16-byte vectors; rows past the end re-read the first row (results unused).
  const uint4* row_chunks[kRowsPerWarp];
#pragma unroll
  for (int n = 0; n < kRowsPerWarp; ++n)
    row_chunks[n] = reinterpret_cast<const uint4*>(a.q + (row0 + (n < n_rows ? n : 0)) * row_bytes);
  // Register double buffer: the next chunk's loads are in flight while the current one is decoded, so memory
  // latency hides behind the dequantization work instead of adding to it.
  uint4 next[kRowsPerWarp];
  if (lane < full_chunks) {
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n) next[n] = __ldg(row_chunks[n] + lane);
  }
  for (int64_t chunk = lane; chunk < full_chunks; chunk += 32) {
    const int64_t col0 = chunk * kValues;
    uint4 raw[kRowsPerWarp];
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n) raw[n] = next[n];
    if (chunk + 32 < full_chunks) {
#pragma unroll
      for (int n = 0; n < kRowsPerWarp; ++n) next[n] = __ldg(row_chunks[n] + chunk + 32);
    }
    // Per chunk and row: sum(code * x) over the part sharing one scale, and sum(x) for the zero point.
    float part[kRowsPerWarp][2][R];
    float xsum[2][R];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        xsum[h][r] = 0.0f;
#pragma unroll
        for (int n = 0; n < kRowsPerWarp; ++n) part[n][h][r] = 0.0f;
      }
#pragma unroll
    for (int word = 0; word < 4; ++word) {
      const int half = word / 2;  // nvfp4: words 0-1 and 2-3 are two blocks of 16 values
      float xv[R][8];
      load_x<R, kValuesPerWord>(a.x, a.cols, col0 + word * kValuesPerWord, xv);
      if constexpr (E == Encoding::INT4 || E == Encoding::INT8 || E == Encoding::INT4_AFFINE) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < kValuesPerWord; ++i) xsum[half][r] += xv[r][i];
      }
#pragma unroll
      for (int n = 0; n < kRowsPerWarp; ++n) {
        const uint32_t bits = (&raw[n].x)[word];
        float w[8];
        decode_word<E>(bits, w);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < kValuesPerWord; ++i) part[n][half][r] = fmaf(w[i], xv[r][i], part[n][half][r]);
      }
    }
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n) {
      const int64_t row = row0 + (n < n_rows ? n : 0);
      if constexpr (E == Encoding::INT4 || E == Encoding::INT8) {
        // A 16-byte chunk never straddles a group: groups are >= 32 columns and chunks start on multiples of 32/16.
        const int64_t g = row * (a.cols / a.group_size) + col0 / a.group_size;
        const float s = __half2float(reinterpret_cast<const __half*>(a.scale)[g]);
        const float z = float(a.zero[g]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float codes_x = part[n][0][r] + part[n][1][r];
          const float sum_x = xsum[0][r] + xsum[1][r];
          acc[n][r] = fmaf(s, codes_x - z * sum_x, acc[n][r]);
        }
      } else if constexpr (E == Encoding::INT4_AFFINE) {
        // sum(x * (code * scale + offset)) = scale * sum(code * x) + offset * sum(x), per group.
        const int64_t g = row * (a.cols / a.group_size) + col0 / a.group_size;
        const float s = __half2float(reinterpret_cast<const __half*>(a.scale)[g]);
        const float o = __half2float(reinterpret_cast<const __half*>(a.offset)[g]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float codes_x = part[n][0][r] + part[n][1][r];
          const float sum_x = xsum[0][r] + xsum[1][r];
          acc[n][r] = fmaf(s, codes_x, fmaf(o, sum_x, acc[n][r]));
        }
      } else if constexpr (E == Encoding::NVFP4) {
        const uint8_t* block_scales = a.scale + row * (a.cols / 16) + col0 / 16;
        const float s0 = e4m3_to_float(block_scales[0]);
        const float s1 = e4m3_to_float(block_scales[1]);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[n][r] += s0 * part[n][0][r] + s1 * part[n][1][r];
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[n][r] += part[n][0][r] + part[n][1][r];
      }
    }
  }

  // Columns the vector path did not cover (all of them for unaligned shapes), one element at a time.
  for (int64_t col = full_chunks * kValues + lane; col < a.cols; col += 32) {
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n) {
      const float w = weight_at<E>(a, row0 + (n < n_rows ? n : 0), col);
#pragma unroll
      for (int r = 0; r < R; ++r) tail[n][r] = fmaf(w, a.x[r * a.cols + col], tail[n][r]);
    }
  }

#pragma unroll
  for (int n = 0; n < kRowsPerWarp; ++n) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[n][r], t = tail[n][r];
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
        t += __shfl_xor_sync(0xffffffffu, t, offset);
      }
      acc[n][r] = v;
      tail[n][r] = t;
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n) {
      if (n >= n_rows) continue;
      float post = 1.0f;
      if constexpr (E == Encoding::FP8_E4M3) post = reinterpret_cast<const float*>(a.scale)[row0 + n];
      if constexpr (E == Encoding::NVFP4) post = a.global_scale;
#pragma unroll
      for (int r = 0; r < R; ++r) a.y[r * a.out_rows + row0 + n] = fmaf(acc[n][r], post, tail[n][r]);
    }
  }
}

template <Encoding E, int R>
void launch(const GemvArgs& a, cudaStream_t stream) {
  constexpr int kValues = values_per_16_bytes<E>();
  const int64_t row_bytes = a.cols * 16 / kValues;
  // The 16-byte path needs every weight row to start on a 16-byte boundary (blobs are 64-byte aligned).
  const bool vector_path = (a.cols % kValues == 0) && (row_bytes % 16 == 0) &&
                           (reinterpret_cast<uintptr_t>(a.q) % 16 == 0) && (a.cols % 4 == 0) &&
                           (reinterpret_cast<uintptr_t>(a.x) % 16 == 0);
  constexpr int kRowsPerWarp = rows_per_warp(R);
  const int64_t warps = (a.out_rows + kRowsPerWarp - 1) / kRowsPerWarp;
  const unsigned blocks = unsigned((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  gemv_kernel<E, R><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a, vector_path);
  NINFER_CUDA_CHECK_LAUNCH();
}

template <Encoding E>
void launch_rows(const GemvArgs& a, int rows, cudaStream_t stream) {
  switch (rows) {
    case 1: return launch<E, 1>(a, stream);
    case 2: return launch<E, 2>(a, stream);
    case 3: return launch<E, 3>(a, stream);
    case 4: return launch<E, 4>(a, stream);
    case 5: return launch<E, 5>(a, stream);
    case 6: return launch<E, 6>(a, stream);
    case 7: return launch<E, 7>(a, stream);
    case 8: return launch<E, 8>(a, stream);
  }
}

}  // namespace

void gemv(const float* x, int rows, const TensorView& w, float* y, cudaStream_t stream) {
  if (rows < 1 || rows > kMaxGemvRows) {
    throw EngineError("gemv: " + std::to_string(rows) + " activation rows; the decode kernel takes 1.." +
                      std::to_string(kMaxGemvRows));
  }
  if (w.shape.size() != 2) throw EngineError("gemv: weight " + w.name + " is not a 2-D matrix");
  GemvArgs a{x, y, w.data, w.scale, w.zero, w.global_scale, w.rows(), w.cols(), w.group_size, w.offset};
  switch (w.encoding) {
    case Encoding::F32: return launch_rows<Encoding::F32>(a, rows, stream);
    case Encoding::F16: return launch_rows<Encoding::F16>(a, rows, stream);
    case Encoding::BF16: return launch_rows<Encoding::BF16>(a, rows, stream);
    case Encoding::FP8_E4M3: return launch_rows<Encoding::FP8_E4M3>(a, rows, stream);
    case Encoding::INT8: return launch_rows<Encoding::INT8>(a, rows, stream);
    case Encoding::INT4: return launch_rows<Encoding::INT4>(a, rows, stream);
    case Encoding::INT4_AFFINE: return launch_rows<Encoding::INT4_AFFINE>(a, rows, stream);
    case Encoding::NVFP4: return launch_rows<Encoding::NVFP4>(a, rows, stream);
  }
}

}  // namespace ninfer::cuda
