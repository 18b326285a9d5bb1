// linear() for grouped-integer weights (int8 / int4: W = (code - zero) * scale, one u8 zero and f16 scale per
// group of columns) with the scale factored out of each group: per weight row and group, the kernel sums
// x_k * (code_k - zero) (each factor exact in f32: a small integer) in 8-lane partial sums, then adds
// scale * that sum into the row's 8-lane accumulator. That drops the per-weight multiply by the scale that the
// generic path (decode to f32, then dot) pays. linear() takes it with LinearPath::F32: the f32 twin of
// linear_int16, which serves these weights by default.
// The result differs from the generic path only in rounding; it equals decode(W).T exactly for x = I (one product
// per group). The single-row path (every decode step) and the batched path do the same arithmetic in the same
// order, so a row's output does not depend on the batch it is computed in.
#pragma once

#include <cstdint>

#include "artifact/artifact.h"

namespace ninfer::cpu {

// Whether linear_grouped serves `w` in this build (AVX2 + F16C + FMA, and w is int8 or int4).
bool linear_grouped_applies(const TensorView& w);

// linear() for such a w: y[r, o] = sum_i x[r, i] * W[o, i] (+ bias[o]); `chunk` is the OpenMP chunk in tiles.
void linear_grouped(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias, int64_t chunk);

}  // namespace ninfer::cpu
