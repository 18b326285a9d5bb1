// Scalar decoding of every stored weight encoding on the device: the obviously-right element access that the
// GEMV's tails, the prefill GEMM, the embedding and the MoE kernels share (the CPU twin is
// cpu::dequantize_row). `W` is any struct with q, scale, zero, global_scale, cols, group_size.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "artifact/artifact.h"

namespace ninfer::cuda {

// Exact integer-to-float for 0..255 without the quarter-rate I2F: the bits of 2^23 + q, minus 2^23.
__device__ __forceinline__ float small_uint_to_float(uint32_t q) {
  return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

__device__ __forceinline__ float e4m3_to_float(uint8_t bits) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(bits, __NV_E4M3);
  return __half2float(__half(h));
}

// e2m1 magnitudes times two (0, 1, 2, 3, 4, 6, 8, 12) as bytes of two words, picked with one byte permute.
__device__ __forceinline__ float e2m1_to_float(uint32_t code) {
  const uint32_t twice = __byte_perm(0x03020100u, 0x0C080604u, code & 7u) & 0xffu;
  const float magnitude = small_uint_to_float(twice) * 0.5f;
  return (code & 8u) ? -magnitude : magnitude;
}

// Element (row, col) of a weight whose rows are `cols` long; `row` counts over stacked matrices too.
template <Encoding E, class W>
__device__ __forceinline__ float weight_at(const W& a, int64_t row, int64_t col) {
  const int64_t index = row * a.cols + col;
  if constexpr (E == Encoding::F32) {
    return reinterpret_cast<const float*>(a.q)[index];
  } else if constexpr (E == Encoding::F16) {
    return __half2float(reinterpret_cast<const __half*>(a.q)[index]);
  } else if constexpr (E == Encoding::BF16) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.q)[index]);
  } else if constexpr (E == Encoding::FP8_E4M3) {
    return e4m3_to_float(a.q[index]) * reinterpret_cast<const float*>(a.scale)[row];
  } else if constexpr (E == Encoding::INT8 || E == Encoding::INT4) {
    const int64_t groups = a.cols / a.group_size;
    const int64_t g = row * groups + col / a.group_size;
    uint32_t q;
    if constexpr (E == Encoding::INT8) {
      q = a.q[index];
    } else {
      q = (a.q[index >> 1] >> ((index & 1) * 4)) & 0xfu;
    }
    const float s = __half2float(reinterpret_cast<const __half*>(a.scale)[g]);
    return (float(q) - float(a.zero[g])) * s;
  } else {  // NVFP4
    const uint32_t code = (a.q[index >> 1] >> ((index & 1) * 4)) & 0xfu;
    const float block_scale = e4m3_to_float(a.scale[row * (a.cols / 16) + col / 16]);
    return e2m1_to_float(code) * block_scale * a.global_scale;
  }
}

// A device weight as the kernels take it (by value).
struct WeightRef {
  const uint8_t* q = nullptr;
  const uint8_t* scale = nullptr;
  const uint8_t* zero = nullptr;
  float global_scale = 1.0f;
  int64_t cols = 0;
  int32_t group_size = 0;
};

inline WeightRef weight_ref(const TensorView& device_view) {
  return {device_view.data, device_view.scale, device_view.zero, device_view.global_scale, device_view.cols(),
          device_view.group_size};
}

// Calls fn(std::integral_constant<Encoding, e>{}) so kernels are instantiated per encoding.
template <class Fn>
void dispatch_encoding(Encoding e, Fn&& fn) {
  switch (e) {
    case Encoding::F32: return fn(std::integral_constant<Encoding, Encoding::F32>{});
    case Encoding::F16: return fn(std::integral_constant<Encoding, Encoding::F16>{});
    case Encoding::BF16: return fn(std::integral_constant<Encoding, Encoding::BF16>{});
    case Encoding::FP8_E4M3: return fn(std::integral_constant<Encoding, Encoding::FP8_E4M3>{});
    case Encoding::INT8: return fn(std::integral_constant<Encoding, Encoding::INT8>{});
    case Encoding::INT4: return fn(std::integral_constant<Encoding, Encoding::INT4>{});
    case Encoding::NVFP4: return fn(std::integral_constant<Encoding, Encoding::NVFP4>{});
  }
}

}  // namespace ninfer::cuda
