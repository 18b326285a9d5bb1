// NOTE: linear() is a GEMM whose B operand arrives encoded. Each thread owns tiles of kTileRows weight rows;
// it decodes a tile kChunkCols columns at a time into an L1 buffer (8 KiB) and multiplies that chunk against a
// block of input rows with a register-blocked f32 micro-kernel. With rows <= the input-row block (every decode
// step and small batch) each weight byte is read and decoded exactly once per call; longer prefills walk the
// input rows in L2-sized blocks and decode the weights once per block, which costs little beside the FMAs.
// Grouped-integer weights (int4 / int8 / int4_affine) go to linear_int16 instead unless the caller asks for f32
// activations (LinearPath::F32): these f32 kernels are then its twin.
#include "backend/cpu/linear.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/linear_decode.h"
#include "backend/cpu/linear_grouped.h"
#include "backend/cpu/linear_int16.h"
#include "backend/cpu/linear_tiling.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NINFER_LINEAR_AVX2 1
#endif
#if defined(NINFER_LINEAR_AVX2) && defined(NINFER_DECODE_AVX2)
#include <type_traits>

#include "backend/cpu/linear_simd.h"
#define NINFER_LINEAR_DIRECT 1
#endif

namespace ninfer::cpu {

namespace {

// acc[r * kTileRows + t] += dot(x[r, 0:n], wbuf[t, 0:n]) for r < rows; x rows are `ldx` floats apart, the decoded
// weight rows kChunkCols apart (zero rows pad a short last tile).
#ifdef NINFER_LINEAR_AVX2

// Scalar tail of columns [from, n) for one input row.
inline __m128 tail_dot(const float* x, const float* wbuf, int64_t from, int64_t n) {
  float s[kTileRows] = {0, 0, 0, 0};
  for (int64_t k = from; k < n; ++k)
    for (int64_t t = 0; t < kTileRows; ++t) s[t] += x[k] * wbuf[t * kChunkCols + k];
  return _mm_loadu_ps(s);
}

void tile_dot(const float* x, int64_t ldx, int64_t rows, const float* wbuf, int64_t n, float* acc) {
  static_assert(kTileRows == 4, "the micro-kernel is written for 4 weight rows");
  const int64_t n8 = n & ~int64_t(7);
  const float* w0 = wbuf;
  const float* w1 = wbuf + kChunkCols;
  const float* w2 = wbuf + 2 * kChunkCols;
  const float* w3 = wbuf + 3 * kChunkCols;
  int64_t r = 0;
  // Two input rows x four weight rows: 8 accumulators, 6 loads per 8 FMAs.
  for (; r + 2 <= rows; r += 2) {
    const float* xa = x + r * ldx;
    const float* xb = xa + ldx;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t k = 0; k < n8; k += 8) {
      const __m256 va = _mm256_loadu_ps(xa + k), vb = _mm256_loadu_ps(xb + k);
      const __m256 v0 = _mm256_load_ps(w0 + k), v1 = _mm256_load_ps(w1 + k);
      const __m256 v2 = _mm256_load_ps(w2 + k), v3 = _mm256_load_ps(w3 + k);
      a0 = _mm256_fmadd_ps(va, v0, a0); b0 = _mm256_fmadd_ps(vb, v0, b0);
      a1 = _mm256_fmadd_ps(va, v1, a1); b1 = _mm256_fmadd_ps(vb, v1, b1);
      a2 = _mm256_fmadd_ps(va, v2, a2); b2 = _mm256_fmadd_ps(vb, v2, b2);
      a3 = _mm256_fmadd_ps(va, v3, a3); b3 = _mm256_fmadd_ps(vb, v3, b3);
    }
    float* ra = acc + r * kTileRows;
    float* rb = ra + kTileRows;
    __m128 sa = _mm_add_ps(sum_lanes4(a0, a1, a2, a3), tail_dot(xa, wbuf, n8, n));
    __m128 sb = _mm_add_ps(sum_lanes4(b0, b1, b2, b3), tail_dot(xb, wbuf, n8, n));
    _mm_storeu_ps(ra, _mm_add_ps(_mm_loadu_ps(ra), sa));
    _mm_storeu_ps(rb, _mm_add_ps(_mm_loadu_ps(rb), sb));
  }
  if (r < rows) {
    // The odd row (and every decode step) does exactly the arithmetic of one row of the pair loop above, in the
    // same order: a row's result never depends on how many rows share the call (batch invariance: a sequence
    // decodes the same tokens alone or beside others).
    const float* xa = x + r * ldx;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < n8; k += 8) {
      const __m256 va = _mm256_loadu_ps(xa + k);
      a0 = _mm256_fmadd_ps(va, _mm256_load_ps(w0 + k), a0);
      a1 = _mm256_fmadd_ps(va, _mm256_load_ps(w1 + k), a1);
      a2 = _mm256_fmadd_ps(va, _mm256_load_ps(w2 + k), a2);
      a3 = _mm256_fmadd_ps(va, _mm256_load_ps(w3 + k), a3);
    }
    float* ra = acc + r * kTileRows;
    const __m128 sa = _mm_add_ps(sum_lanes4(a0, a1, a2, a3), tail_dot(xa, wbuf, n8, n));
    _mm_storeu_ps(ra, _mm_add_ps(_mm_loadu_ps(ra), sa));
  }
}

#ifdef NINFER_LINEAR_DIRECT

// The decode step (one input row): tile_dot's single-row arithmetic, in the same order (per chunk, 8-lane
// accumulators over k, then sum_lanes4 plus the empty tail), on weights decoded into registers instead of through
// wbuf: no store and reload of the decoded chunk. The decoders are the ones decode_span uses, so every value and
// every sum is bit-identical to the batched path (batch invariance holds). Needs cols % 16 == 0.
template <class Decoder>
void row_tile_direct(const float* x, const TensorView& w, int64_t o0, float* acc) {
  const int64_t cols = w.cols(), last = w.rows() - 1;
  // A short last tile decodes its last row again in the missing slots; those sums are never written out.
  const Decoder d0(w, o0), d1(w, std::min(o0 + 1, last)), d2(w, std::min(o0 + 2, last)),
      d3(w, std::min(o0 + 3, last));
  for (int64_t c0 = 0; c0 < cols; c0 += kChunkCols) {
    const int64_t n = std::min(kChunkCols, cols - c0);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, lo, hi;
    for (int64_t k = c0; k < c0 + n; k += 16) {
      const __m256 xl = _mm256_loadu_ps(x + k), xh = _mm256_loadu_ps(x + k + 8);
      d0.at(k, lo, hi);
      a0 = _mm256_fmadd_ps(xh, hi, _mm256_fmadd_ps(xl, lo, a0));
      d1.at(k, lo, hi);
      a1 = _mm256_fmadd_ps(xh, hi, _mm256_fmadd_ps(xl, lo, a1));
      d2.at(k, lo, hi);
      a2 = _mm256_fmadd_ps(xh, hi, _mm256_fmadd_ps(xl, lo, a2));
      d3.at(k, lo, hi);
      a3 = _mm256_fmadd_ps(xh, hi, _mm256_fmadd_ps(xl, lo, a3));
    }
    const __m128 sum = _mm_add_ps(sum_lanes4(a0, a1, a2, a3), _mm_setzero_ps());  // + tile_dot's empty tail
    _mm_storeu_ps(acc, _mm_add_ps(_mm_loadu_ps(acc), sum));
  }
}

template <class Decoder>
void linear_one_row(const float* x, const TensorView& w, float* y, const float* bias, int64_t chunk) {
  const int64_t out = w.rows(), tiles = (out + kTileRows - 1) / kTileRows;
#pragma omp parallel for schedule(dynamic, chunk)
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t o0 = tile * kTileRows, tile_rows = std::min(kTileRows, out - o0);
    alignas(16) float acc[kTileRows] = {0.0f, 0.0f, 0.0f, 0.0f};
    row_tile_direct<Decoder>(x, w, o0, acc);
    for (int64_t t = 0; t < tile_rows; ++t) y[o0 + t] = acc[t] + (bias ? bias[o0 + t] : 0.0f);
  }
}

#endif  // NINFER_LINEAR_DIRECT

#else

void tile_dot(const float* x, int64_t ldx, int64_t rows, const float* wbuf, int64_t n, float* acc) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < kTileRows; ++t) {
      float sum = 0.0f;
      for (int64_t k = 0; k < n; ++k) sum += x[r * ldx + k] * wbuf[t * kChunkCols + k];
      acc[r * kTileRows + t] += sum;
    }
}

#endif

Int16Form int16_form(LinearPath path) {
  return path == LinearPath::Int16Avx2 ? Int16Form::Avx2 : Int16Form::Widest;
}

}  // namespace

void linear(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias, LinearPath path) {
  if (w.shape.size() != 2)
    throw EngineError("linear: weight " + w.name + " must be a 2-D matrix (take one with TensorView::matrix)");
  const int64_t out = w.rows(), cols = w.cols();
  const int64_t tiles = (out + kTileRows - 1) / kTileRows;

  const int64_t chunk = tile_chunk_size(tiles);

  if (path != LinearPath::F32 && linear_int16_applies(w)) {
    linear_int16(x, rows, w, y, bias, int16_form(path));
    return;
  }
  if (linear_grouped_applies(w)) {
    linear_grouped(x, rows, w, y, bias, chunk);
    return;
  }
#ifdef NINFER_LINEAR_DIRECT
  if (rows == 1 && cols % 16 == 0) {
    simd::dispatch_decoder(w, [&](auto* tag) {
      linear_one_row<std::remove_pointer_t<decltype(tag)>>(x, w, y, bias, chunk);
    });
    return;
  }
#endif

  struct Scratch {
    alignas(64) float wbuf[kTileRows * kChunkCols];
    alignas(64) float acc[kMaxRowBlock * kTileRows];
  };
  for_each_tile_of_row_blocks<Scratch>(rows, cols, out, chunk, [&](Scratch& s, int64_t r0, int64_t block_rows,
                                                                    int64_t o0) {
    const int64_t tile_rows = std::min(kTileRows, out - o0);
    std::fill(s.acc, s.acc + block_rows * kTileRows, 0.0f);
    for (int64_t c0 = 0; c0 < cols; c0 += kChunkCols) {
      const int64_t n = std::min(kChunkCols, cols - c0);
      for (int64_t t = 0; t < kTileRows; ++t) {
        if (t < tile_rows) decode_span(w, o0 + t, c0, n, s.wbuf + t * kChunkCols);
        else std::fill(s.wbuf + t * kChunkCols, s.wbuf + t * kChunkCols + n, 0.0f);  // last tile's missing rows
      }
      tile_dot(x + r0 * cols + c0, cols, block_rows, s.wbuf, n, s.acc);
    }
    for (int64_t r = 0; r < block_rows; ++r)
      for (int64_t t = 0; t < tile_rows; ++t)
        y[(r0 + r) * out + o0 + t] = s.acc[r * kTileRows + t] + (bias ? bias[o0 + t] : 0.0f);
  });
}

void linear_shared_input(const float* x, int64_t rows, std::span<const LinearOut> outs, LinearPath path) {
  // The weights linear_int16 takes, one linear_int16_shared call per group size (a layer's projections have one):
  // each call rounds x once. The others, and every weight on the F32 path, go through linear() one by one.
  // thread_local scratch: a decode step's calls allocate nothing once these have grown.
  static thread_local std::vector<char> done;
  static thread_local std::vector<LinearOut> same_group;
  // (A stacked weight is left to linear(), which refuses it.)
  auto int16 = [](const TensorView& w) { return w.shape.size() == 2 && linear_int16_applies(w); };
  done.assign(outs.size(), 0);
  if (path != LinearPath::F32) {
    for (size_t i = 0; i < outs.size(); ++i) {
      if (done[i] || !int16(*outs[i].w)) continue;
      same_group.clear();
      for (size_t j = i; j < outs.size(); ++j)
        if (!done[j] && int16(*outs[j].w) && outs[j].w->group_size == outs[i].w->group_size) {
          same_group.push_back(outs[j]);
          done[j] = 1;
        }
      linear_int16_shared(x, rows, same_group, int16_form(path));
    }
  }
  for (size_t i = 0; i < outs.size(); ++i)
    if (!done[i]) linear(x, rows, *outs[i].w, outs[i].y, outs[i].bias, path);
}

void dequantize_row(const TensorView& w, int64_t row, float* out) {
  decode_span_reference(w, row, 0, w.cols(), out);
}

void dequantize(const TensorView& w, float* out) {
  const int64_t rows = w.numel() / w.cols(), cols = w.cols();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) dequantize_row(w, r, out + r * cols);
}

}  // namespace ninfer::cpu
