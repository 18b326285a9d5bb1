#include "backend/cpu/linear_decode.h"

#include <cstring>

#include "artifact/numeric.h"

#ifdef NINFER_DECODE_AVX2
#include <type_traits>

#include "backend/cpu/linear_simd.h"
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
    case Encoding::INT4_AFFINE: {
      // code * scale is exact in f32 (4 + 11 significant bits): one rounding whether or not it is fused.
      const int64_t groups_per_row = cols / w.group_size;
      const uint8_t* q = w.data + row * (cols / 2);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t c = c0 + i;
        const int64_t g = row * groups_per_row + c / w.group_size;
        out[i] = float(nibble(q, c)) * f16_to_f32(load_u16(w.scale, g)) + f16_to_f32(load_u16(w.offset, g));
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

// Whole 16-column steps through the shared SIMD decoders; a tail (only where cols is not a multiple of 16: f32,
// f16, bf16, fp8) through the reference, whose values are the same.
void decode_span(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out) {
  const int64_t n16 = n & ~int64_t(15);
  simd::dispatch_decoder(w, [&](auto* tag) {
    using Decoder = std::remove_pointer_t<decltype(tag)>;
    const Decoder d(w, row);
    __m256 lo, hi;
    for (int64_t i = 0; i < n16; i += 16) {
      d.at(c0 + i, lo, hi);
      _mm256_storeu_ps(out + i, lo);
      _mm256_storeu_ps(out + i + 8, hi);
    }
  });
  if (n16 < n) decode_span_reference(w, row, c0 + n16, n - n16, out + n16);
}

#else

void decode_span(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out) {
  decode_span_reference(w, row, c0, n, out);
}

#endif

}  // namespace ninfer::cpu
