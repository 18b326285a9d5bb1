// linear() for grouped-integer weights (int4, int8, int4_affine) on int16 activations: each 32-column block of an
// input row is rounded to int16 with a power-of-two step, and the weights' unsigned codes are multiplied against
// it with integer multiply-adds (AVX2 `vpmaddwd`); each block's exact int32 sums are then scaled in f32 by the
// block's step and the weight group's scale, and the group's offset (int4_affine's, or -zero * scale) is applied
// once per group through the rounded activations' sum. That halves a decode step's instructions per weight against
// the f32 kernels (decode code to f32, multiply-add), which bench/NOTES-cpu.md measured as the bound.
//
// Why 16 bits: rounding activations to 8 bits (llama.cpp's Q8 blocks) moved the 135M default model's greedy chat
// answers (bench/NOTES-cpu.md, session 9); int16 keeps 15-16 significant bits per block's largest value.
//
// What it computes, exactly: y = x' @ W.T + bias up to f32 rounding of the sums, where x' is x rounded per block:
// x'_k = step_b * round(x_k / step_b), step_b the least power of two with max|x_b| / step_b <= 32767.5 (so
// |x_k - x'_k| <= step_b / 2 <= max|x_b| / 32767). A block holding a NaN or an infinity makes the outputs NaN.
// The f32 kernels (linear() with LinearPath::F32) are its obviously-right twin; tests/test_cpu_linear.py compares
// the two, and each against float64 with that bound. With x = I every product is exact and so is the result.
// The single-row path (every decode step) and the batched path share one routine per block, so a row's output
// does not depend on the batch it is computed in.
//
// Several weights that read the same x (a layer's q/k/v, its gate/up: Backend::linear_shared_input) share one
// rounding of x, and a decode step (rows == 1) computes the tiles of all of them in one OpenMP parallel region
// instead of one region each. Every tile's arithmetic is the same as in a call for its weight alone, so each output
// equals that call's bit for bit (tests/test_cpu_linear.py compares them).
//
// Per 512-column chunk and weight row, both forms first take the chunk's group scales and offsets as vectors: each
// block's factor step x scale (exact: the step is a power of two, unless the product leaves f32's range, i.e.
// blocks below ~2^-100), and the offsets times the groups' activation sums as the accumulator's start. Then, AVX2
// (the fallback): per block and weight row, two `vpmaddwd` into 8 int32 lanes, converted, times the factor, into
// the accumulator. AVX-512 (BW, VL, VNNI; built where the compiler targets them, -march=native): two blocks at a
// time, two `vpdpwssd` into 16 int32 lanes (8 per block), likewise. The int32 lanes hold the same exact integers in
// both; the forms differ in f32 rounding order only, so each holds the bound above (tests/test_cpu_linear.py checks
// both against float64 and the f32 kernels, and against each other). Per-group scalar work (a scale and an offset
// per row and group, 1/4 of int4 g32's time before: bench/NOTES-cpu.md, session 13) is gone from the inner loop.
#pragma once

#include <cstdint>
#include <span>

#include "artifact/artifact.h"
#include "backend/backend.h"

namespace ninfer::cpu {

// Which form linear_int16 runs: Widest, the AVX-512 form where built, else AVX2; Avx2, the AVX2 form always (what a
// CPU without AVX-512 runs, selectable so that both are tested and benchmarked on one machine).
enum class Int16Form { Widest, Avx2 };

// Whether this build has the AVX-512 form.
bool linear_int16_avx512_built();

// Whether linear_int16 serves `w` in this build (AVX2 + F16C + FMA; int4 / int8 / int4_affine in groups of
// 32 .. 512 columns, a multiple of 32). Without AVX2 linear() keeps the f32 kernels for every weight.
bool linear_int16_applies(const TensorView& w);

// linear() for such a w: y[r, o] = sum_i x[r, i] * W[o, i] (+ bias[o]).
void linear_int16(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias,
                  Int16Form form = Int16Form::Widest);

// linear_int16 for each of `outs` on the same x [rows, cols]: every weight one that linear_int16_applies to, with
// `cols` columns and one group size (all of them the same; refused otherwise). x is rounded once for all.
void linear_int16_shared(const float* x, int64_t rows, std::span<const LinearOut> outs,
                         Int16Form form = Int16Form::Widest);

}  // namespace ninfer::cpu
