// AVX2 decoders of one weight row, 16 columns at a time, shared by decode_span (which stores them) and the
// decode-step kernel of linear() (which multiplies them straight from registers). One definition serves both, so
// the values are the same bits either way; each is a vectorised twin of decode_span_reference, compared with it
// by the tests through linear(). Only included where NINFER_DECODE_AVX2 is defined (AVX2 + F16C + FMA).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "artifact/artifact.h"
#include "artifact/numeric.h"

namespace ninfer::cpu::simd {

inline uint16_t load_u16(const uint8_t* p, int64_t index) {
  uint16_t v;
  std::memcpy(&v, p + 2 * index, 2);
  return v;
}

// 16 consecutive nibble codes (8 bytes) in column order: low nibble first, as the format packs them.
inline __m128i unpack_nibbles16(const uint8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  return _mm_unpacklo_epi8(lo, hi);
}

// Each decoder is built for one row and gives columns [c, c + 16) as two 8-vectors; c is a multiple of 16.

struct DecodeF32 {
  const float* p;
  DecodeF32(const TensorView& w, int64_t row) : p(reinterpret_cast<const float*>(w.data) + row * w.cols()) {}
  void at(int64_t c, __m256& lo, __m256& hi) const {
    lo = _mm256_loadu_ps(p + c);
    hi = _mm256_loadu_ps(p + c + 8);
  }
};

template <bool F16>
struct DecodeHalf {
  const uint8_t* p;
  DecodeHalf(const TensorView& w, int64_t row) : p(w.data + 2 * row * w.cols()) {}
  static __m256 eight(const uint8_t* bytes) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
    if constexpr (F16) return _mm256_cvtph_ps(bits);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
  void at(int64_t c, __m256& lo, __m256& hi) const {
    lo = eight(p + 2 * c);
    hi = eight(p + 2 * c + 16);
  }
};

// e4m3 shifted into an f16's bit positions is the same number times 2^-8 (subnormals included, since both
// formats' subnormals continue their normals), so F16C converts it and a scale times 2^8 restores it exactly.
// 8 e4m3 codes at p times 2^-8 (0x7f above: NaN).
inline __m256 e4m3x8_over_256(const uint8_t* p) {
  const __m128i magnitude_mask = _mm_set1_epi16(0x7f), sign_mask = _mm_set1_epi16(0x80);
  const __m128i codes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i magnitude = _mm_and_si128(codes, magnitude_mask);
  __m128i half = _mm_or_si128(_mm_slli_epi16(magnitude, 7), _mm_slli_epi16(_mm_and_si128(codes, sign_mask), 8));
  half = _mm_or_si128(half, _mm_and_si128(_mm_cmpeq_epi16(magnitude, magnitude_mask), _mm_set1_epi16(0x7e00)));
  return _mm256_cvtph_ps(half);
}

struct DecodeFp8 {
  const uint8_t* q;
  __m256 scale256;
  DecodeFp8(const TensorView& w, int64_t row) : q(w.data + row * w.cols()) {
    float scale;
    std::memcpy(&scale, w.scale + 4 * row, 4);
    scale256 = _mm256_set1_ps(scale * 256.0f);
  }
  __m256 eight(const uint8_t* p) const { return _mm256_mul_ps(e4m3x8_over_256(p), scale256); }
  void at(int64_t c, __m256& lo, __m256& hi) const {
    lo = eight(q + c);
    hi = eight(q + c + 8);
  }
};

// int8 / int4 with a u8 zero point and an f16 scale per group (a multiple of 16 columns): (code - zero) * scale,
// the integer subtraction exact, then one rounding, as in the reference. Columns are visited in increasing order
// within a group, so the group's zero and scale are loaded once per group, not once per 16 columns (a decoder is
// per row and per thread: the cached group is its only state).
template <bool Int4>
struct DecodeGrouped {
  const uint8_t* q;
  const TensorView& w;
  int64_t first_group;
  mutable int64_t group_begin = 0, group_end = 0;  // columns of the cached group; empty at first
  mutable __m256i zero = _mm256_setzero_si256();
  mutable __m256 scale = _mm256_setzero_ps();
  DecodeGrouped(const TensorView& view, int64_t row)
      : q(view.data + row * (Int4 ? view.cols() / 2 : view.cols())), w(view),
        first_group(row * (view.cols() / view.group_size)) {}
  static __m256 eight(__m128i codes, __m256i zero, __m256 scale) {
    const __m256i v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(codes), zero);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(v), scale);
  }
  void at(int64_t c, __m256& lo, __m256& hi) const {
    if (c < group_begin || c >= group_end) {
      const int64_t index = c / w.group_size, g = first_group + index;
      group_begin = index * w.group_size;
      group_end = group_begin + w.group_size;
      zero = _mm256_set1_epi32(w.zero[g]);
      scale = _mm256_set1_ps(_cvtsh_ss(load_u16(w.scale, g)));
    }
    const __m128i codes =
        Int4 ? unpack_nibbles16(q + c / 2) : _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c));
    lo = eight(codes, zero, scale);
    hi = eight(_mm_srli_si128(codes, 8), zero, scale);
  }
};

// int4_affine: code * scale + offset per group (a multiple of 16 columns); the product is exact, so this equals
// the reference bit for bit. The group's scale and offset are cached as in DecodeGrouped.
struct DecodeAffine {
  const uint8_t* q;
  const TensorView& w;
  int64_t first_group;
  mutable int64_t group_begin = 0, group_end = 0;  // columns of the cached group; empty at first
  mutable __m256 scale = _mm256_setzero_ps(), offset = _mm256_setzero_ps();
  DecodeAffine(const TensorView& view, int64_t row)
      : q(view.data + row * (view.cols() / 2)), w(view), first_group(row * (view.cols() / view.group_size)) {}
  void at(int64_t c, __m256& lo, __m256& hi) const {
    if (c < group_begin || c >= group_end) {
      const int64_t index = c / w.group_size, g = first_group + index;
      group_begin = index * w.group_size;
      group_end = group_begin + w.group_size;
      scale = _mm256_set1_ps(_cvtsh_ss(load_u16(w.scale, g)));
      offset = _mm256_set1_ps(_cvtsh_ss(load_u16(w.offset, g)));
    }
    const __m128i codes = unpack_nibbles16(q + c / 2);
    lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)), scale, offset);
    hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))), scale, offset);
  }
};

// Twice each e2m1 value is an integer, so a byte shuffle decodes 16 codes at once; halving the block scale
// compensates exactly, and (2v * block/2) * global equals the reference's (v * block) * global bit for bit.
struct DecodeNvfp4 {
  const uint8_t* q;
  const uint8_t* block_scales;
  __m256 global;
  DecodeNvfp4(const TensorView& w, int64_t row)
      : q(w.data + row * (w.cols() / 2)), block_scales(w.scale + row * (w.cols() / 16)),
        global(_mm256_set1_ps(w.global_scale)) {}
  void at(int64_t c, __m256& lo, __m256& hi) const {
    const __m128i doubled = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m256 block = _mm256_set1_ps(e4m3_to_f32(block_scales[c / 16]) * 0.5f);
    const __m128i values = _mm_shuffle_epi8(doubled, unpack_nibbles16(q + c / 2));
    const __m256 v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(values));
    const __m256 v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(values, 8)));
    lo = _mm256_mul_ps(_mm256_mul_ps(v0, block), global);
    hi = _mm256_mul_ps(_mm256_mul_ps(v1, block), global);
  }
};

// Calls fn(Decoder-type tag) for the encoding of `w`.
template <class Fn>
decltype(auto) dispatch_decoder(const TensorView& w, Fn&& fn) {
  switch (w.encoding) {
    case Encoding::F32: return fn(static_cast<DecodeF32*>(nullptr));
    case Encoding::F16: return fn(static_cast<DecodeHalf<true>*>(nullptr));
    case Encoding::BF16: return fn(static_cast<DecodeHalf<false>*>(nullptr));
    case Encoding::FP8_E4M3: return fn(static_cast<DecodeFp8*>(nullptr));
    case Encoding::INT8: return fn(static_cast<DecodeGrouped<false>*>(nullptr));
    case Encoding::INT4: return fn(static_cast<DecodeGrouped<true>*>(nullptr));
    case Encoding::NVFP4: return fn(static_cast<DecodeNvfp4*>(nullptr));
    case Encoding::INT4_AFFINE: return fn(static_cast<DecodeAffine*>(nullptr));
  }
  return fn(static_cast<DecodeF32*>(nullptr));  // unreachable: every encoding is listed
}

}  // namespace ninfer::cpu::simd
