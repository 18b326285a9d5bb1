// Linear layers of the CPU backend for every weight encoding. Weights are consumed in their stored encoding and
// dequantized inside the kernel, a block at a time; nothing is expanded at load. Uses all cores (OpenMP).
#pragma once

#include <cstdint>
#include <span>

#include "artifact/artifact.h"
#include "backend/backend.h"

namespace ninfer::cpu {

// How linear() treats its input. Fast: int4 / int8 / int4_affine weights take linear_int16 where it is built
// (x rounded per 32-column block to int16, linear_int16.h states the error), every other weight the f32 kernels.
// Int16Avx2: as Fast, with linear_int16 in its AVX2 form even where its AVX-512 form is built (what a CPU without
// AVX-512 runs; tests and benchmarks compare the two forms on one machine).
// F32: the f32 kernels for every weight, x used as given: the twin the tests compare Fast against.
enum class LinearPath { Fast, Int16Avx2, F32 };

// y[r, o] = sum_i x[r, i] * W[o, i] (+ bias[o]) for r < rows, o < W.rows(); W is 2-D (use TensorView::matrix
// for one matrix of a stack). x is [rows, W.cols()] row-major f32, y is [rows, W.rows()]. Accumulates in f32.
// Weight rows are streamed once per call whatever `rows` is (decode batches share the weight traffic).
void linear(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias = nullptr,
            LinearPath path = LinearPath::Fast);

// linear() for each of `outs` on the same x (Backend::linear_shared_input: a layer's q/k/v, its gate/up), each
// output equal to its linear() call bit for bit. On the Fast path the int16 weights of one group size share one
// rounding of x, and at rows == 1 one parallel region (linear_int16_shared); x's width must be every weight's.
void linear_shared_input(const float* x, int64_t rows, std::span<const LinearOut> outs,
                         LinearPath path = LinearPath::Fast);

// The reference dequantization (the obviously-right twin of linear's inner loops).
void dequantize_row(const TensorView& w, int64_t row, float* out);  // row of a 2-D view, W.cols() values
void dequantize(const TensorView& w, float* out);                   // every element, numel() values

}  // namespace ninfer::cpu
