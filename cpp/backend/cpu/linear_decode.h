// Decoding a span of one weight row into f32: the scalar reference (the definition, mirrored from
// python/ninfer/artifact/encodings.py `decode`) and the SIMD twin linear() uses. Both give bit-identical values
// (same operations in the same order), which the tests check through linear() with an identity input.
#pragma once

#include <cstdint>

#include "artifact/artifact.h"

// The SIMD decoders (backend/cpu/linear_simd.h) need AVX2 and F16C; without them decode_span is the reference.
#if defined(__AVX2__) && defined(__F16C__)
#define NINFER_DECODE_AVX2 1
#endif

namespace ninfer::cpu {

// out[i] = W[row, c0 + i] for i < n, where `row` indexes the [R, cols] view of the tensor (R = all leading axes).
// c0 and n must respect the encoding's blocks: multiples of 2 for int4, of 16 for nvfp4, of the group for int8.
void decode_span_reference(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out);

// Same values, vectorised where the build target allows (AVX2 + F16C); otherwise the reference.
void decode_span(const TensorView& w, int64_t row, int64_t c0, int64_t n, float* out);

}  // namespace ninfer::cpu
