// exp() of 8 floats at once (AVX2 + FMA), for softmax: within ~2 ulp of std::exp over the inputs softmax gives it
// (x <= 0); tests/runtime/test_cpu_attention.py compares the attention that uses it with a float64 reference.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace ninfer::cpu::simd {

// e^x = 2^n * e^r with n = round(x / ln 2) and |r| <= ln 2 / 2; e^r by its degree-7 Taylor-like minimax polynomial
// (the classic single-precision coefficients); ln 2 split in two parts so r is exact enough. Inputs below
// -87.3 (e^x under the smallest normal float) give 0; NaN gives NaN.
inline __m256 exp8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.33654f);
  const __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  // min/max return their second operand when either is NaN: x goes second so a NaN stays NaN.
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lowest, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 er = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  // 2^n for n in [-126, 127]: the exponent field built directly.
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(er, _mm256_castsi256_ps(bits));
  return _mm256_andnot_ps(underflow, result);
}

}  // namespace ninfer::cpu::simd

#endif
