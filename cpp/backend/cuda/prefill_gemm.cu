#include "backend/cuda/prefill_gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/streamed_gemm.h"
#include "errors.h"

namespace ninfer::cuda {
namespace {

constexpr float kE4m3Max = 448.0f;  // the largest finite e4m3 value

// 8 consecutive weights W[row, col .. col + 8) as floats, with one load of their codes and of their scale: col is
// a multiple of 8 and a group (int4/int8; group_size % 8 == 0) or block (nvfp4: 16) never splits them. The
// formulas and their order of operations are weight_at's, so the values are bit-identical to the twin's.
template <Encoding E>
__device__ __forceinline__ void dequantize8(const WeightRef& w, int64_t row, int64_t col, float (&v)[8]) {
  const int64_t index = row * w.cols + col;
  if constexpr (E == Encoding::FP8_E4M3) {
    const uint2 q = *reinterpret_cast<const uint2*>(w.q + index);
    const float s = reinterpret_cast<const float*>(w.scale)[row];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = e4m3_to_float(uint8_t(((i < 4 ? q.x : q.y) >> (8 * (i % 4))) & 0xffu)) * s;
  } else if constexpr (E == Encoding::INT8 || E == Encoding::INT4) {
    const int64_t g = row * (w.cols / w.group_size) + col / w.group_size;
    const float s = __half2float(reinterpret_cast<const __half*>(w.scale)[g]);
    const float zero = float(w.zero[g]);
    if constexpr (E == Encoding::INT8) {
      const uint2 q = *reinterpret_cast<const uint2*>(w.q + index);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = (float(((i < 4 ? q.x : q.y) >> (8 * (i % 4))) & 0xffu) - zero) * s;
    } else {
      const uint32_t q = *reinterpret_cast<const uint32_t*>(w.q + index / 2);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = (float((q >> (4 * i)) & 0xfu) - zero) * s;
    }
  } else {
    static_assert(E == Encoding::NVFP4, "dequantize8: encodings with their own bf16 path or none");
    const uint32_t q = *reinterpret_cast<const uint32_t*>(w.q + index / 2);
    const float block_scale = e4m3_to_float(w.scale[row * (w.cols / 16) + col / 16]);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = e2m1_to_float((q >> (4 * i)) & 0xfu) * block_scale * w.global_scale;
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&v)[8]) {
  uint4 out;
  uint32_t* words = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    words[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return out;
}

// Rows row0 .. row0 + rows of W as bf16 [rows, cols] (cols % 8 == 0): one 16-byte store per thread.
template <Encoding E>
__global__ void dequantize_to_bf16_kernel(WeightRef w, int64_t row0, int64_t rows, uint4* out) {
  const int64_t chunks_per_row = w.cols / 8;
  NINFER_GRID_STRIDE(i, rows * chunks_per_row) {
    float v[8];
    dequantize8<E>(w, row0 + i / chunks_per_row, (i % chunks_per_row) * 8, v);
    out[i] = pack_bf16x8(v);
  }
}

// x f32 -> bf16, 8 values per thread (the count is a multiple of 8).
__global__ void to_bf16_kernel(const float4* x, int64_t chunks, uint4* out) {
  NINFER_GRID_STRIDE(i, chunks) {
    const float4 a = x[2 * i], b = x[2 * i + 1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    out[i] = pack_bf16x8(v);
  }
}

// One block per row r of x [rows, cols] (cols % 16 == 0): s[r] = amax_r / 448 (1 for an all-zero row) and
// q[r, i] = e4m3(x[r, i] / s[r]), rounded to nearest and saturated to +-448.
__global__ void quantize_rows_e4m3_kernel(const float* x, int64_t cols, uint8_t* q, float* scale) {
  const int64_t r = blockIdx.x;
  const float4* row = reinterpret_cast<const float4*>(x + r * cols);
  const int64_t quads = cols / 4;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < quads; i += blockDim.x) {
    const float4 v = row[i];
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  amax = block_reduce(amax, MaxOp{});
  const float s = amax > 0.0f ? amax / kE4m3Max : 1.0f;
  if (threadIdx.x == 0) scale[r] = s;
  uint32_t* out = reinterpret_cast<uint32_t*>(q + r * cols);
  for (int64_t i = threadIdx.x; i < quads; i += blockDim.x) {
    const float4 v = row[i];
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x / s, v.y / s), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z / s, v.w / s), __NV_SATFINITE, __NV_E4M3);
    out[i] = lo | (hi << 16);
  }
}

// y[r, c] = y[r, c] * row_scale[r] * col_scale[c] + bias[c]; the scales (both or neither) and bias may be null.
__global__ void scale_and_bias_kernel(float* y, int64_t rows, int64_t cols, const float* row_scale,
                                      const float* col_scale, const float* bias) {
  NINFER_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    float v = y[i];
    if (row_scale) v = v * row_scale[r] * col_scale[c];
    if (bias) v += bias[c];
    y[i] = v;
  }
}

void scale_and_bias(float* y, int64_t rows, int64_t cols, const float* row_scale, const float* col_scale,
                    const float* bias, cudaStream_t stream) {
  if (!row_scale && !bias) return;
  scale_and_bias_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(y, rows, cols, row_scale, col_scale, bias);
  NINFER_CUDA_CHECK_LAUNCH();
}

// The shape and encoding rules of each implementation (cuBLASLt's alignment rules included: bf16 rows of
// 16 bytes; e4m3 needs k and n multiples of 16).
bool can_run(GemmImpl impl, const TensorView& w) {
  const int64_t n = w.rows(), k = w.cols();
  switch (impl) {
    case GemmImpl::Auto: return false;
    case GemmImpl::Twin: return true;
    case GemmImpl::Bf16:
      if (!LtMatmul::available() || k % 8 != 0) return false;
      switch (w.encoding) {
        case Encoding::BF16:
        case Encoding::FP8_E4M3:
        case Encoding::NVFP4: return true;
        case Encoding::INT8:
        case Encoding::INT4: return w.group_size % 8 == 0;
        case Encoding::INT4_AFFINE:  // code * scale + offset has up to 20 significant bits: not exact in bf16
        case Encoding::F32:  // full precision kept: tiny models and tests
        case Encoding::F16:  // bf16 would drop 3 of its mantissa bits
          return false;
      }
      return false;
    case GemmImpl::Fp8:
    case GemmImpl::Fp8SeparateScaling:
      return LtMatmul::available() && w.encoding == Encoding::FP8_E4M3 && k % 16 == 0 && n % 16 == 0;
    case GemmImpl::Streamed: return streamed_gemm_supports(w);
  }
  return false;
}

// Fastest first; Auto steps down this list from the preferred implementation.
constexpr GemmImpl kByPreference[] = {GemmImpl::Fp8, GemmImpl::Fp8SeparateScaling, GemmImpl::Bf16, GemmImpl::Twin};
constexpr int64_t kFastGemmMinCols = 512;  // Auto takes the twin below this inner dimension

}  // namespace

const char* gemm_impl_name(GemmImpl impl) {
  switch (impl) {
    case GemmImpl::Auto: return "auto";
    case GemmImpl::Twin: return "twin";
    case GemmImpl::Bf16: return "bf16";
    case GemmImpl::Fp8: return "fp8";
    case GemmImpl::Fp8SeparateScaling: return "fp8_separate_scaling";
    case GemmImpl::Streamed: return "streamed";
  }
  return "?";
}

GemmImpl gemm_impl_from_name(const std::string& name) {
  for (GemmImpl impl : {GemmImpl::Auto, GemmImpl::Twin, GemmImpl::Bf16, GemmImpl::Fp8, GemmImpl::Fp8SeparateScaling,
                        GemmImpl::Streamed})
    if (name == gemm_impl_name(impl)) return impl;
  throw EngineError("unknown GEMM implementation '" + name +
                    "' (auto, twin, bf16, fp8, fp8_separate_scaling, streamed)");
}

GemmImpl preferred_gemm_impl(const TensorView& w) {
  for (GemmImpl impl : kByPreference)
    if (can_run(impl, w)) return impl;
  return GemmImpl::Twin;
}

GemmImpl PrefillGemm::run(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias,
                          cudaStream_t stream, GemmImpl impl) {
  prepared_ = {};
  return run_one(x, rows, w, y, bias, stream, impl);
}

void PrefillGemm::run_shared(const float* x, int64_t rows, std::span<const GemmOutput> outs, cudaStream_t stream,
                             GemmImpl impl) {
  prepared_ = {};
  for (const GemmOutput& o : outs) run_one(x, rows, *o.w, o.y, o.bias, stream, impl);
}

bool PrefillGemm::input_ready(InputForm form, const float* x, int64_t rows, int64_t k) {
  const bool ready = prepared_.form == form && prepared_.x == x && prepared_.rows == rows && prepared_.k == k;
  prepared_ = {form, x, rows, k};
  return ready;
}

GemmImpl PrefillGemm::run_one(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias,
                              cudaStream_t stream, GemmImpl impl) {
  const auto attempt = [&](GemmImpl which) {
    switch (which) {
      case GemmImpl::Bf16: return run_bf16(x, rows, w, y, bias, stream);
      case GemmImpl::Fp8: return run_fp8(x, rows, w, y, bias, LtScaling::OuterVector, stream);
      case GemmImpl::Fp8SeparateScaling: return run_fp8(x, rows, w, y, bias, LtScaling::None, stream);
      case GemmImpl::Streamed: return run_streamed(x, rows, w, y, bias, stream);
      default: gemm(x, rows, w, y, bias, stream); return true;
    }
  };
  // The activation kernels of the fast paths read x 16 bytes at a time.
  const bool x_aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const auto runs = [&](GemmImpl which) {
    return (x_aligned || which == GemmImpl::Twin) && can_run(which, w) && attempt(which);
  };
  if (impl != GemmImpl::Auto) {
    if (!runs(impl))
      throw EngineError(std::string("prefill GEMM '") + gemm_impl_name(impl) + "' cannot run " + w.name + " (" +
                        std::to_string(w.rows()) + " x " + std::to_string(w.cols()) + ")");
    return impl;
  }
  // Inner dimensions this small (test models) are too little work for the fast paths to pay; the exact twin keeps
  // their results comparable to the CPU backend's.
  if (w.cols() < kFastGemmMinCols) {
    runs(GemmImpl::Twin);
    return GemmImpl::Twin;
  }
  if (rows <= streamed_rows_ && runs(GemmImpl::Streamed)) return GemmImpl::Streamed;
  for (GemmImpl which : kByPreference)
    if (runs(which)) return which;
  return GemmImpl::Twin;  // unreachable: the twin always runs
}

bool PrefillGemm::run_bf16(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias,
                           cudaStream_t stream) {
  const int64_t n = w.rows(), k = w.cols();
  const bool dequantize = w.encoding != Encoding::BF16;  // bf16 weights are used as they are
  // Weights larger than the slab (the lm_head) run a slab of rows at a time; 16-row steps keep y + row0 aligned.
  const int64_t slab_rows =
      dequantize ? std::min(n, std::max<int64_t>(16, kGemmWeightSlabBytes / (2 * k) / 16 * 16)) : n;
  void* slab = dequantize ? scratch(weight_slab_, size_t(slab_rows * k) * 2, stream) : nullptr;
  void* xb = scratch(x_low_, size_t(rows * k) * 2, stream);
  const LtProblem first{LtOperands::BF16, LtScaling::None, dequantize ? slab : w.data, xb, y, slab_rows, rows, k, n};
  if (!lt_.supports(first)) return false;
  if (!input_ready(InputForm::Bf16, x, rows, k)) {
    to_bf16_kernel<<<blocks_for(rows * k / 8), kThreads, 0, stream>>>(reinterpret_cast<const float4*>(x),
                                                                       rows * k / 8, static_cast<uint4*>(xb));
    NINFER_CUDA_CHECK_LAUNCH();
  }
  if (!dequantize) {
    if (!lt_.run(first, stream)) return false;
  } else {
    for (int64_t row0 = 0; row0 < n; row0 += slab_rows) {
      const int64_t slab_n = std::min(slab_rows, n - row0);
      dispatch_encoding(w.encoding, [&](auto encoding) {
        constexpr Encoding E = decltype(encoding)::value;
        if constexpr (E == Encoding::FP8_E4M3 || E == Encoding::INT8 || E == Encoding::INT4 ||
                      E == Encoding::NVFP4) {
          dequantize_to_bf16_kernel<E><<<blocks_for(slab_n * k / 8), kThreads, 0, stream>>>(
              weight_ref(w), row0, slab_n, static_cast<uint4*>(slab));
        }
      });
      NINFER_CUDA_CHECK_LAUNCH();
      if (!lt_.run({LtOperands::BF16, LtScaling::None, slab, xb, y + row0, slab_n, rows, k, n}, stream)) return false;
    }
  }
  scale_and_bias(y, rows, n, nullptr, nullptr, bias, stream);
  return true;
}

bool PrefillGemm::run_fp8(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias,
                          LtScaling scaling, cudaStream_t stream) {
  const int64_t n = w.rows(), k = w.cols();
  auto* xq = static_cast<uint8_t*>(scratch(x_low_, size_t(rows * k), stream));
  auto* x_scale = static_cast<float*>(scratch(x_scale_, size_t(rows) * sizeof(float), stream));
  const auto* w_scale = reinterpret_cast<const float*>(w.scale);
  const LtProblem problem{LtOperands::E4M3, scaling, w.data, xq, y, n, rows, k, n, w_scale, x_scale};
  if (!lt_.supports(problem)) return false;
  if (!input_ready(InputForm::E4m3, x, rows, k)) {
    quantize_rows_e4m3_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, k, xq, x_scale);
    NINFER_CUDA_CHECK_LAUNCH();
  }
  if (!lt_.run(problem, stream)) return false;
  if (scaling == LtScaling::None)
    scale_and_bias(y, rows, n, x_scale, w_scale, bias, stream);
  else
    scale_and_bias(y, rows, n, nullptr, nullptr, bias, stream);
  return true;
}

bool PrefillGemm::run_streamed(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias,
                               cudaStream_t stream) {
  const int64_t k = w.cols();
  const size_t partial_bytes = streamed_gemm_partial_bytes(rows, w);
  auto* partials = partial_bytes ? static_cast<float*>(scratch(partials_, partial_bytes, stream)) : nullptr;
  auto* plane = static_cast<uint16_t*>(scratch(x_low_, size_t(rows * k) * 2, stream));
  // int4 and int8 codes pair their columns differently (tc::Order), so their planes differ.
  const InputForm form = w.encoding == Encoding::INT4 ? InputForm::StreamedNibble : InputForm::StreamedByte;
  if (!input_ready(form, x, rows, k)) streamed_gemm_prepare(x, rows, k, streamed_gemm_order(w), plane, stream);
  streamed_gemm(plane, rows, w, y, bias, partials, stream);
  return true;
}

void* PrefillGemm::scratch(DeviceBuffer& buffer, size_t bytes, cudaStream_t stream) {
  if (buffer.bytes() < bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    NINFER_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone)  // the eager warm-up pass of each decode batch sizes it first
      throw EngineError("prefill GEMM: scratch of " + std::to_string(bytes) + " bytes needed inside a graph capture");
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));  // queued work may still read the old buffer
    buffer = DeviceBuffer(bytes);
    prepared_ = {};
  }
  return buffer.get();
}

}  // namespace ninfer::cuda
