// The paged KV pool as the CUDA attention kernels see it: the device twins of cache/kv_codec.h (one codec per
// row codec: element type, load, store), a layer's K or V pages with their per-(token, head) scales (and nvfp4's
// block scales), and the arguments every attention kernel takes. Kernels take a key codec and a value codec
// (a KV format names one each: cache/kv_dtype.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/dequant.cuh"
#include "cache/kv_dtype.h"
#include "cache/kv_fp4.h"

namespace ninfer::cuda {

// A codec stores one (token, head) row of codes; a stored value is scale * load(code) with scale 1 for the
// unscaled dtypes. 8-bit rows get scale = max|x| / kCodeMax and codes encode(x / scale), as kv_quantize_row;
// nvfp4 rows as kv_quantize_row_fp4 (kv_write_kernel), their values read through load_value / load_values8.
template <KvDtype D>
struct KvDevice;

template <>
struct KvDevice<KvDtype::F32> {
  using Element = float;
  static constexpr bool kScaled = false;
  static constexpr bool kBlockScaled = false;
  __device__ static float load(Element e) { return e; }
  __device__ static Element encode(float x) { return x; }
};

template <>
struct KvDevice<KvDtype::BF16> {
  using Element = uint16_t;
  static constexpr bool kScaled = false;
  static constexpr bool kBlockScaled = false;
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
  static constexpr bool kBlockScaled = false;
  static constexpr float kCodeMax = 448.0f;
  __device__ static float load(Element e) { return e4m3_to_float(e); }
  __device__ static Element encode(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
};

template <>
struct KvDevice<KvDtype::INT8> {
  using Element = uint8_t;
  static constexpr bool kScaled = true;
  static constexpr bool kBlockScaled = false;
  static constexpr float kCodeMax = 127.0f;
  __device__ static float load(Element e) { return float(int8_t(e)); }
  __device__ static Element encode(float x) { return uint8_t(int8_t(fminf(fmaxf(rintf(x), -127.0f), 127.0f))); }
};

// nvfp4: an element is a byte of two e2m1 codes (value 2i in the low nibble); each 16 values have an e4m3 block
// scale, which load_value / load_values8 multiply in; the f32 row scale stays outside as for the 8-bit codecs.
template <>
struct KvDevice<KvDtype::NVFP4> {
  using Element = uint8_t;
  static constexpr bool kScaled = true;
  static constexpr bool kBlockScaled = true;
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
// `width` values (`row_bytes` bytes of codes each), then (scaled codecs) the scales at + scale_offset,
// [token in page][kv_heads], then (nvfp4) the e4m3 block scales at + block_offset, [(token * width + i) / 16].
struct PagedRows {
  uint8_t* base;
  int64_t page_bytes, width, row_bytes, scale_offset, block_offset;
  int32_t kv_heads;
  __device__ uint8_t* page(const int32_t* pages, int64_t page_offset, int64_t page_index) const {
    return base + pages[page_offset + page_index] * page_bytes;
  }
  __device__ float* scales(uint8_t* page_block) const { return reinterpret_cast<float*>(page_block + scale_offset); }
  __device__ uint8_t* blocks(uint8_t* page_block) const { return page_block + block_offset; }
};

// nvfp4: the block scale of value `col` of token `row`: the row's part of the index apart from the column's, so
// that the compiler shares it between the unrolled loads of one row (width is a multiple of 16).
__device__ __forceinline__ const uint8_t* block_scale(const PagedRows& pr, const uint8_t* block, int64_t row,
                                                      int64_t col) {
  return block + pr.block_offset + row * (pr.width / kKvFp4Block) + col / kKvFp4Block;
}

// Eight nvfp4 values from one 32-bit word of codes (value k in bits 4k .. 4k + 3) and their block scale (the
// products are exact: at most 6 significant bits).
__device__ __forceinline__ void decode_fp4x8(uint32_t word, float scale, float out[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = e2m1_to_float(word >> (4 * k)) * scale;
}

// Value `col` (counting over the row's kv_heads * head_dim values) of token `row` of a page block: load(code),
// times the block scale for nvfp4 (the row scale is the caller's).
template <class Kv>
__device__ __forceinline__ float load_value(const PagedRows& pr, const uint8_t* block, int64_t row, int64_t col) {
  using E = typename Kv::Element;
  const uint8_t* codes = block + row * pr.row_bytes;
  if constexpr (Kv::kBlockScaled) {
    const uint32_t code = uint32_t(codes[col / 2]) >> (4 * (col % 2));
    return e2m1_to_float(code) * e4m3_to_float(*block_scale(pr, block, row, col));
  } else {
    return Kv::load(reinterpret_cast<const E*>(codes)[col]);
  }
}

// load_value of the 8 values col .. col + 7 (col a multiple of 8), with one vector load of codes (and one
// block-scale byte: 8 values at a multiple of 8 are in one block of 16).
template <class Kv>
__device__ __forceinline__ void load_values8(const PagedRows& pr, const uint8_t* block, int64_t row, int64_t col,
                                             float out[8]) {
  using E = typename Kv::Element;
  const uint8_t* codes = block + row * pr.row_bytes;
  if constexpr (Kv::kBlockScaled) {
    decode_fp4x8(*reinterpret_cast<const uint32_t*>(codes + col / 2), e4m3_to_float(*block_scale(pr, block, row, col)),
                 out);
  } else {
    load8<Kv>(reinterpret_cast<const E*>(codes) + col, out);
  }
}

// The block scales of one (token, head) row of D values, for a kernel that reads the whole row (flash decode's
// keys): nvfp4 holds the row's D / 16 e4m3 bytes in registers, read as 32-bit words where they are whole words
// (D >= 64: the row's first block index, row * width / 16 + head * D / 16, is then a multiple of 4), so a row
// costs D / 64 scale loads instead of one per 8 values (at D = 256, 16 byte loads in flight made ptxas spill).
// The other codecs have none: scale 1.
template <class Kv, int D>
struct RowBlockScales {
  __device__ RowBlockScales(const PagedRows&, const uint8_t*, int64_t, int64_t) {}
  __device__ float of(int64_t) const { return 1.0f; }
};

template <int D>
struct RowBlockScales<KvDevice<KvDtype::NVFP4>, D> {
  static constexpr int kBlocks = D / int(kKvFp4Block), kWords = (kBlocks + 3) / 4;
  uint32_t words[kWords];
  __device__ RowBlockScales(const PagedRows& pr, const uint8_t* block, int64_t row, int64_t col0) {
    const uint8_t* p = block_scale(pr, block, row, col0);
    if constexpr (kBlocks % 4 == 0) {
#pragma unroll
      for (int w = 0; w < kWords; ++w) words[w] = reinterpret_cast<const uint32_t*>(p)[w];
    } else {
      words[0] = 0;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) words[0] |= uint32_t(p[b]) << (8 * b);
    }
  }
  // The scale of value `i` of the row (0 <= i < D).
  __device__ float of(int64_t i) const {
    const int b = int(i / kKvFp4Block);
    return e4m3_to_float(uint8_t(words[b / 4] >> (8 * (b % 4))));
  }
};

// load_values8 of row values col0 + i .. col0 + i + 7 with the row's block scales already in registers.
template <class Kv, int D>
__device__ __forceinline__ void load_values8(const PagedRows& pr, const uint8_t* block, int64_t row, int64_t col0,
                                             int64_t i, const RowBlockScales<Kv, D>& scales, float out[8]) {
  if constexpr (Kv::kBlockScaled) {
    decode_fp4x8(*reinterpret_cast<const uint32_t*>(block + row * pr.row_bytes + (col0 + i) / 2), scales.of(i), out);
  } else {
    load_values8<Kv>(pr, block, row, col0 + i, out);
  }
}

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

// Calls fn(KeyCodec{}, ValueCodec{}) for the pool's format: only the pairs that formats name are instantiated.
template <class Fn>
void dispatch_kv_device(KvDtype format, Fn&& fn) {
  switch (format) {
    case KvDtype::F32: return fn(KvDevice<KvDtype::F32>{}, KvDevice<KvDtype::F32>{});
    case KvDtype::BF16: return fn(KvDevice<KvDtype::BF16>{}, KvDevice<KvDtype::BF16>{});
    case KvDtype::FP8: return fn(KvDevice<KvDtype::FP8>{}, KvDevice<KvDtype::FP8>{});
    case KvDtype::INT8: return fn(KvDevice<KvDtype::INT8>{}, KvDevice<KvDtype::INT8>{});
    case KvDtype::NVFP4: return fn(KvDevice<KvDtype::NVFP4>{}, KvDevice<KvDtype::NVFP4>{});
    case KvDtype::K8V4: return fn(KvDevice<KvDtype::INT8>{}, KvDevice<KvDtype::NVFP4>{});
  }
}

}  // namespace ninfer::cuda
