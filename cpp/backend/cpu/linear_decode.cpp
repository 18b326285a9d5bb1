#include "backend/cpu/linear_decode.h"

#include <cstring>

#include "artifact/numeric.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define NINFER_DECODE_AVX2 1
#endif

namespace ninfer::cpu {

namespace {

uint16_t load_u16(const uint8_t* p, int64_t index) {
  uint16_t v;
  std::memcpy(&v, p + 2 * index, 2);
  return v;
}

float load_f32(const uint8_t* p, int64_t index) {
  float v;
  std::memcpy(&v, p + 4 * index, 4);
  return v;
}

// The code of column c of a row of packed nibbles: low nibble = even column.
uint8_t nibble(const uint8_t* packed_row, int64_t c) {
  const uint8_t byte = packed_row[c >> 1];
  return (c & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xf);
}

}  // namespace

void decode_span_reference(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out) {
  const int64_t cols = w.cols();
  switch (w.encoding) {
    case Encoding::F32:
      for (int64_t i = 0; i < n; ++i) out[i] = load_f32(w.data, row * cols + c0 + i);
      return;
    case Encoding::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_u16(w.data, row * cols + c0 + i));
      return;
    case Encoding::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load_u16(w.data, row * cols + c0 + i));
      return;
    case Encoding::FP8_E4M3: {
      const float scale = load_f32(w.scale, row);
      for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(w.data[row * cols + c0 + i]) * scale;
      return;
    }
    case Encoding::INT8:
    case Encoding::INT4: {
      const int64_t groups_per_row = cols / w.group_size;
      const uint8_t* q = w.data + row * (w.encoding == Encoding::INT8 ? cols : cols / 2);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t c = c0 + i;
        const int64_t g = row * groups_per_row + c / w.group_size;
        const float code = float(w.encoding == Encoding::INT8 ? q[c] : nibble(q, c));
        out[i] = (code - float(w.zero[g])) * f16_to_f32(load_u16(w.scale, g));
      }
      return;
    }
    case Encoding::NVFP4: {
      const uint8_t* q = w.data + row * (cols / 2);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t c = c0 + i;
        const float block = e4m3_to_f32(w.scale[row * (cols / 16) + c / 16]);
        out[i] = (e2m1_to_f32(nibble(q, c)) * block) * w.global_scale;
      }
      return;
    }
  }
}

#ifdef NINFER_DECODE_AVX2

namespace {

// 16 consecutive nibble codes (8 bytes) in column order: low nibble first, as the format packs them.
inline __m128i unpack_nibbles16(const uint8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  return _mm_unpacklo_epi8(lo, hi);
}

// (code - zero) * scale for 8 u8 codes in the low half of `codes`: the integer subtraction is exact, then one
// rounding, as in the reference.
inline __m256 int_codes_to_f32(__m128i codes, __m256i zero, __m256 scale) {
  const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(codes), zero);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale);
}

void decode_grouped(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out) {
  const int64_t cols = w.cols(), group = w.group_size;
  const bool int4 = w.encoding == Encoding::INT4;
  const uint8_t* q = w.data + row * (int4 ? cols / 2 : cols);
  for (int64_t c = c0; c < c0 + n; c += group) {
    const int64_t g = row * (cols / group) + c / group;
    const __m256i zero = _mm256_set1_epi32(w.zero[g]);
    const __m256 scale = _mm256_set1_ps(_cvtsh_ss(load_u16(w.scale, g)));
    float* dst = out + (c - c0);
    for (int64_t i = 0; i < group; i += 16) {
      const __m128i codes = int4 ? unpack_nibbles16(q + (c + i) / 2)
                                 : _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c + i));
      _mm256_storeu_ps(dst + i, int_codes_to_f32(codes, zero, scale));
      _mm256_storeu_ps(dst + i + 8, int_codes_to_f32(_mm_srli_si128(codes, 8), zero, scale));
    }
  }
}

void decode_nvfp4(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out) {
  const int64_t cols = w.cols();
  const uint8_t* q = w.data + row * (cols / 2);
  // Twice each e2m1 value is an integer, so a byte shuffle decodes 16 codes at once; halving the block scale
  // compensates exactly, and (2v * block/2) * global equals the reference's (v * block) * global bit for bit.
  const __m128i doubled = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m256 global = _mm256_set1_ps(w.global_scale);
  for (int64_t c = c0; c < c0 + n; c += 16) {
    const __m256 block = _mm256_set1_ps(e4m3_to_f32(w.scale[row * (cols / 16) + c / 16]) * 0.5f);
    const __m128i values = _mm_shuffle_epi8(doubled, unpack_nibbles16(q + c / 2));
    const __m256 v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(values));
    const __m256 v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(values, 8)));
    _mm256_storeu_ps(out + (c - c0), _mm256_mul_ps(_mm256_mul_ps(v0, block), global));
    _mm256_storeu_ps(out + (c - c0) + 8, _mm256_mul_ps(_mm256_mul_ps(v1, block), global));
  }
}

// e4m3 shifted into an f16's bit positions is the same number times 2^-8 (subnormals included, since both
// formats' subnormals continue their normals), so F16C converts it and a scale times 2^8 restores it exactly.
void decode_fp8(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out) {
  const uint8_t* q = w.data + row * w.cols() + c0;
  const float scale = load_f32(w.scale, row);
  const __m256 scale256 = _mm256_set1_ps(scale * 256.0f);
  const __m128i magnitude_mask = _mm_set1_epi16(0x7f), sign_mask = _mm_set1_epi16(0x80);
  const __m128i f16_nan = _mm_set1_epi16(0x7e00);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i codes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
    const __m128i magnitude = _mm_and_si128(codes, magnitude_mask);
    __m128i half = _mm_or_si128(_mm_slli_epi16(magnitude, 7), _mm_slli_epi16(_mm_and_si128(codes, sign_mask), 8));
    half = _mm_or_si128(half, _mm_and_si128(_mm_cmpeq_epi16(magnitude, magnitude_mask), f16_nan));  // 0x7f: NaN
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(half), scale256));
  }
  for (; i < n; ++i) out[i] = e4m3_to_f32(q[i]) * scale;
}

void decode_half(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out) {
  const uint8_t* p = w.data + 2 * (row * w.cols() + c0);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    const __m256 v = w.encoding == Encoding::F16
                         ? _mm256_cvtph_ps(bits)
                         : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    _mm256_storeu_ps(out + i, v);
  }
  for (; i < n; ++i)
    out[i] = w.encoding == Encoding::F16 ? f16_to_f32(load_u16(p, i)) : bf16_to_f32(load_u16(p, i));
}

}  // namespace

void decode_span(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out) {
  switch (w.encoding) {
    case Encoding::F32: std::memcpy(out, w.data + 4 * (row * w.cols() + c0), size_t(n) * 4); return;
    case Encoding::F16:
    case Encoding::BF16: decode_half(w, row, c0, n, out); return;
    case Encoding::FP8_E4M3: decode_fp8(w, row, c0, n, out); return;
    case Encoding::INT8:
    case Encoding::INT4: decode_grouped(w, row, c0, n, out); return;
    case Encoding::NVFP4: decode_nvfp4(w, row, c0, n, out); return;
  }
}

#else

void decode_span(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out) {
  decode_span_reference(w, row, c0, n, out);
}

#endif

}  // namespace ninfer::cpu
