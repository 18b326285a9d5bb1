// The paged KV pool as the CUDA attention kernels see it: the device twins of cache/kv_codec.h (one codec per
// KV dtype: element type, load, store), a layer's K or V pages with their per-(token, head) scales, and the
// arguments every attention kernel takes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/dequant.cuh"
#include "cache/kv_dtype.h"

namespace ninfer::cuda {

// A codec stores one (token, head) row of codes; a stored value is scale * load(code) with scale 1 for the
// unscaled dtypes. 8-bit rows get scale = max|x| / kCodeMax and codes encode(x / scale), as kv_quantize_row.
template <KvDtype D>
struct KvDevice;

template <>
struct KvDevice<KvDtype::F32> {
  using Element = float;
  static constexpr bool kScaled = false;
  __device__ static float load(Element e) { return e; }
  __device__ static Element encode(float x) { return x; }
};

template <>
struct KvDevice<KvDtype::BF16> {
  using Element = uint16_t;
  static constexpr bool kScaled = false;
  __device__ static float load(Element e) { return __uint_as_float(uint32_t(e) << 16); }
  // Round to nearest even, NaN kept (artifact/numeric.h f32_to_bf16).
  __device__ static Element encode(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
};

template <>
struct KvDevice<KvDtype::FP8> {
  using Element = uint8_t;
  static constexpr bool kScaled = true;
  static constexpr float kCodeMax = 448.0f;
  __device__ static float load(Element e) { return e4m3_to_float(e); }
  __device__ static Element encode(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
};

template <>
struct KvDevice<KvDtype::INT8> {
  using Element = uint8_t;
  static constexpr bool kScaled = true;
  static constexpr float kCodeMax = 127.0f;
  __device__ static float load(Element e) { return float(int8_t(e)); }
  __device__ static Element encode(float x) { return uint8_t(int8_t(fminf(fmaxf(rintf(x), -127.0f), 127.0f))); }
};

// Eight consecutive codes at `p` (8-element aligned) as floats, with one vector load.
template <class Kv>
__device__ __forceinline__ void load8(const typename Kv::Element* p, float out[8]) {
  if constexpr (sizeof(typename Kv::Element) == 2) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  } else if constexpr (sizeof(typename Kv::Element) == 1) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    const uint32_t words[2] = {w.x, w.y};
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = Kv::load(uint8_t(words[i / 4] >> (8 * (i % 4))));
  } else {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  }
}

// Layer `layer`'s K (or V) pages: page p's block starts at base + p * page_bytes with kKvPageTokens rows of
// `width` elements, then (8-bit dtypes) the scales at + scale_offset, [token in page][kv_heads].
struct PagedRows {
  uint8_t* base;
  int64_t page_bytes, width, scale_offset;
  int32_t kv_heads;
  __device__ uint8_t* page(const int32_t* pages, int64_t page_offset, int64_t page_index) const {
    return base + pages[page_offset + page_index] * page_bytes;
  }
  template <class E>
  __device__ E* row(const int32_t* pages, int64_t page_offset, int64_t pos) const {
    return reinterpret_cast<E*>(page(pages, page_offset, pos / kKvPageTokens)) + (pos % kKvPageTokens) * width;
  }
  __device__ float* scales(uint8_t* page_block) const { return reinterpret_cast<float*>(page_block + scale_offset); }
};

struct SeqTables {
  const DeviceSequence* seqs;
  const int32_t* pages;
  const int32_t* row_seq;
};

// Everything an attention kernel reads and writes (by value).
struct AttentionArgs {
  const float* q;
  int64_t q_row_stride, q_head_stride;
  SeqTables t;
  PagedRows k, v;
  AttentionShape shape;
  float* out;
};

// Calls fn(KvDevice<d>{}) for the pool's dtype.
template <class Fn>
void dispatch_kv_device(KvDtype d, Fn&& fn) {
  switch (d) {
    case KvDtype::F32: return fn(KvDevice<KvDtype::F32>{});
    case KvDtype::BF16: return fn(KvDevice<KvDtype::BF16>{});
    case KvDtype::FP8: return fn(KvDevice<KvDtype::FP8>{});
    case KvDtype::INT8: return fn(KvDevice<KvDtype::INT8>{});
  }
}

}  // namespace ninfer::cuda
