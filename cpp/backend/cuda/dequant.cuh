// Scalar decoding of every stored weight encoding on the device: the obviously-right element access that the
// GEMV's tails, the prefill GEMM, the embedding and the MoE kernels share (the CPU twin is
// cpu::dequantize_row). `W` is any struct with q, scale, zero, offset, global_scale, cols, group_size.
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
  } else if constexpr (E == Encoding::INT4_AFFINE) {
    const int64_t g = row * (a.cols / a.group_size) + col / a.group_size;
    const uint32_t q = (a.q[index >> 1] >> ((index & 1) * 4)) & 0xfu;
    // q * scale is exact in f32, so the fused and the separate form round the same.
    return fmaf(float(q), __half2float(reinterpret_cast<const __half*>(a.scale)[g]),
                __half2float(reinterpret_cast<const __half*>(a.offset)[g]));
  } else {  // NVFP4
    const uint32_t code = (a.q[index >> 1] >> ((index & 1) * 4)) & 0xfu;
    const float block_scale = e4m3_to_float(a.scale[row * (a.cols / 16) + col / 16]);
    return e2m1_to_float(code) * block_scale * a.global_scale;
  }
}

// --- Tensor-core weight operands (bf16) ---------------------------------------------------------------------
// A lane of an mma.sync.m16n8k16 kernel holds 32 consecutive columns of a weight row (its segment: one 16-byte
// load for 4-bit codes) and turns them into the 16 bf16 pairs of the A operand. Every encoding's dequantized value
// is exact in bf16 (int codes minus zero point: at most 8 significant bits; e4m3: 4; e2m1 times an e4m3 block
// scale: 6), so one operand type serves all; group scales (int8/int4) and row or tensor scales (fp8, nvfp4) are
// applied to the f32 sums instead. Which source column sits in which k-slot does not matter as long as the
// activations use the same assignment, so each encoding keeps the order its codes unpack in (Order) and the
// activations are permuted to match. The decode GEMV (gemv_mma.cu) and the MoE expert matmul share these.
namespace tc {

constexpr int kSegmentCols = 32;

enum class Order { Natural, Nibble, Byte };

template <Encoding E>
__host__ __device__ constexpr Order order() {
  if constexpr (E == Encoding::INT4 || E == Encoding::NVFP4) return Order::Nibble;
  if constexpr (E == Encoding::INT8) return Order::Byte;
  return Order::Natural;
}

template <Encoding E>
__host__ __device__ constexpr int code_bits() {
  if constexpr (E == Encoding::INT4 || E == Encoding::NVFP4) return 4;
  if constexpr (E == Encoding::INT8 || E == Encoding::FP8_E4M3) return 8;
  return 16;
}

// 16-byte loads per segment.
template <Encoding E>
__host__ __device__ constexpr int segment_vectors() { return kSegmentCols * code_bits<E>() / 128; }

// Source column (0..31) of operand slot j (pair j / 2, half j % 2). Nibble: word p / 4 yields the pair
// (i, i + 4) by one shift and mask; Byte: word p / 2 yields (i, i + 2).
__host__ __device__ constexpr int source_column(Order order, int j) {
  const int p = j / 2, h = j % 2;
  if (order == Order::Nibble) return 8 * (p / 4) + p % 4 + 4 * h;
  if (order == Order::Byte) return 4 * (p / 2) + p % 2 + 2 * h;
  return j;
}

// The operand slot of source column c (0..31): the inverse of source_column.
__host__ __device__ constexpr int operand_slot(Order order, int c) {
  if (order == Order::Nibble) return 2 * (4 * (c / 8) + c % 4) + (c % 8) / 4;
  if (order == Order::Byte) return 2 * (2 * (c / 4) + c % 2) + (c % 4) / 2;
  return c;
}

// Weights are read once: keep them out of L1 and let L2 fetch ahead.
__device__ __forceinline__ uint4 load_streaming(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <int N>
__device__ __forceinline__ uint32_t word(const uint4 (&v)[N], int i) {
  const uint4& u = v[i / 4];
  const int k = i % 4;
  return k == 0 ? u.x : (k == 1 ? u.y : (k == 2 ? u.z : u.w));
}

__device__ __forceinline__ uint32_t bf16x2_of(float lo, float hi) {
  const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t bf16x2_of_half2(uint32_t h) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return bf16x2_of(f.x, f.y);
}

// One segment of one weight row as loaded: the codes and what decoding them needs besides.
template <Encoding E>
struct Segment {
  uint4 codes[segment_vectors<E>()];
  uint32_t zero2 = 0;                 // int4: bf16 pair of 128 + zero (exact for zero < 128; the encoder's are
                                      // < 16); int8: fp16 pair of 1024 + zero
  uint32_t block_scale[2] = {0, 0};   // nvfp4: fp16 pairs of half of each 16-column block's scale
  float group_scale = 1.0f;           // int8/int4: the group's scale (the caller keeps one group per segment run)
};

// int8/int4: the group's fp16 scale (its bits) and zero point as a segment carries them.
template <Encoding E>
__device__ __forceinline__ void set_group(uint16_t scale_bits, uint32_t zero, Segment<E>& s) {
  s.group_scale = __half2float(__ushort_as_half(scale_bits));
  if constexpr (E == Encoding::INT4) {
    const uint32_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(128.0f + float(zero)));
    s.zero2 = bits | (bits << 16);
  } else {
    const uint32_t bits = 0x6400u + zero;  // fp16 1024 + z
    s.zero2 = bits | (bits << 16);
  }
}

// Loads the segment of `row` (counted over stacked matrices) starting at column col0 (a multiple of 32).
// int8/int4 need group_size a multiple of 32, so the segment lies in one group.
template <Encoding E, class W>
__device__ __forceinline__ void load_segment(const W& w, int64_t row, int64_t col0, Segment<E>& s) {
  const uint8_t* p = w.q + (row * w.cols + col0) * code_bits<E>() / 8;
#pragma unroll
  for (int v = 0; v < segment_vectors<E>(); ++v) s.codes[v] = load_streaming(p + 16 * v);
  if constexpr (E == Encoding::INT4 || E == Encoding::INT8) {
    const int64_t group = row * (w.cols / w.group_size) + col0 / w.group_size;
    set_group<E>(reinterpret_cast<const uint16_t*>(w.scale)[group], w.zero[group], s);
  } else if constexpr (E == Encoding::NVFP4) {
    const uint8_t* block = w.scale + row * (w.cols / 16) + col0 / 16;
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const __half half_scale = __hmul(__half(__nv_cvt_fp8_to_halfraw(block[b], __NV_E4M3)), __float2half(0.5f));
      const uint32_t bits = __half_as_ushort(half_scale);
      s.block_scale[b] = bits | (bits << 16);
    }
  }
}

// fp16 bits of twice the e2m1 magnitudes (0, 1, 2, 3, 4, 6, 8, 12): high bytes picked by the low 3 code bits.
constexpr uint32_t kE2m1TwiceHighLo = 0x42403C00u, kE2m1TwiceHighHi = 0x4A484644u;

// Operand pair p (0..15, in order<E>()) of a segment as bf16: integer codes minus their zero point, e4m3 values,
// e2m1 values times their block scale, or the stored bf16 values; all exact.
template <Encoding E>
__device__ __forceinline__ uint32_t bf16_pair(const Segment<E>& s, int p) {
  if constexpr (E == Encoding::INT4) {
    const uint32_t codes = ((word(s.codes, p / 4) >> (4 * (p % 4))) & 0x000F000Fu) | 0x43004300u;  // 128 + q
    const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&codes),
                                     *reinterpret_cast<const __nv_bfloat162*>(&s.zero2));
    return *reinterpret_cast<const uint32_t*>(&d);
  } else if constexpr (E == Encoding::INT8) {
    const uint32_t codes = ((word(s.codes, p / 2) >> (8 * (p % 2))) & 0x00FF00FFu) | 0x64006400u;  // 1024 + q
    const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&codes), *reinterpret_cast<const __half2*>(&s.zero2));
    return bf16x2_of_half2(*reinterpret_cast<const uint32_t*>(&d));
  } else if constexpr (E == Encoding::FP8_E4M3) {
    const uint32_t bytes = (word(s.codes, p / 2) >> (16 * (p % 2))) & 0xFFFFu;
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(bytes), __NV_E4M3);
    return bf16x2_of_half2(uint32_t(h.x) | (uint32_t(h.y) << 16));
  } else if constexpr (E == Encoding::NVFP4) {
    const uint32_t u = word(s.codes, p / 4) >> (4 * (p % 4));  // the pair's codes at bits 0-3 and 16-19
    const uint32_t select = ((u << 4) & 0x70u) | ((u >> 4) & 0x7000u);
    const uint32_t twice = __byte_perm(kE2m1TwiceHighLo, kE2m1TwiceHighHi, select) | ((u << 12) & 0x80008000u);
    const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&twice),
                              *reinterpret_cast<const __half2*>(&s.block_scale[p / 8]));
    return bf16x2_of_half2(*reinterpret_cast<const uint32_t*>(&v));
  } else {  // BF16: the stored pairs are the operands
    return word(s.codes, p);
  }
}

// All 16 operand pairs of a segment.
template <Encoding E>
__device__ __forceinline__ void bf16_pairs(const Segment<E>& s, uint32_t (&a)[16]) {
#pragma unroll
  for (int p = 0; p < 16; ++p) a[p] = bf16_pair<E>(s, p);
}

// What multiplies a row's f32 sum: fp8's row scale, nvfp4's tensor scale, 1 otherwise (group scales are the
// caller's: they change along the row).
template <Encoding E, class W>
__device__ __forceinline__ float row_scale(const W& w, int64_t row) {
  if constexpr (E == Encoding::FP8_E4M3) return reinterpret_cast<const float*>(w.scale)[row];
  if constexpr (E == Encoding::NVFP4) return w.global_scale;
  return 1.0f;
}

// c += a * b for one m16n8k16 bf16 tile: a0/a2 row g, a1/a3 row g + 8 (k-slots 2q.. and 2q + 8..), b0/b1 column g.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// f32 v as hi + lo, both bf16 (8 significant bits each, so |v - hi - lo| <= 2^-16 |v|): a weight times both keeps
// 16 bits of v where bf16 alone keeps 8. (fp16 planes would keep 22 but need a per-row scale into fp16's range.)
__device__ __forceinline__ void split_bf16(float v, uint16_t& hi, uint16_t& lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  hi = __bfloat16_as_ushort(h);
  lo = __bfloat16_as_ushort(__float2bfloat16_rn(v - __bfloat162float(h)));
}

}  // namespace tc

// A device weight as the kernels take it (by value).
struct WeightRef {
  const uint8_t* q = nullptr;
  const uint8_t* scale = nullptr;
  const uint8_t* zero = nullptr;
  float global_scale = 1.0f;
  int64_t cols = 0;
  int32_t group_size = 0;
  const uint8_t* offset = nullptr;  // int4_affine
};

inline WeightRef weight_ref(const TensorView& device_view) {
  return {device_view.data, device_view.scale, device_view.zero, device_view.global_scale, device_view.cols(),
          device_view.group_size, device_view.offset};
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
    case Encoding::INT4_AFFINE: return fn(std::integral_constant<Encoding, Encoding::INT4_AFFINE>{});
  }
}

}  // namespace ninfer::cuda
