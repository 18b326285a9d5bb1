// Linear layers of integer weights (int4, int4_affine, int8; groups of a multiple of 32 columns) on activations
// rounded to 8 bits: each input row is cut into 32-column blocks, and block b is stored as a scale d_b and 32
// signed bytes q with x ≈ d_b * q (d_b = max|x| / 127, q = x / d_b rounded to nearest even). A weight row's dot
// product with a block is then one integer dot product of its codes with q (exact in i32: u8 x s8 products, VNNI
// or maddubs), turned into floats once per block:
//   int4 / int8:  sum_k W_k * d_b q_k = d_b s_g (sum_k c_k q_k) - (s_g z_g) (d_b sum_k q_k)
//   int4_affine:  sum_k W_k * d_b q_k = d_b s_g (sum_k c_k q_k) + m_g (d_b sum_k q_k)
// with c the codes, s/z/m the group's scale, zero point and offset. So y = W x̂ with x̂ the rounded activations,
// up to f32 rounding of the per-block terms: what llama.cpp does for Q4_1 x Q8_1 and Q8_0 x Q8_0, several times
// fewer instructions per weight than decoding W to f32. The obviously-right twin is decode(W) @ x̂ in float64
// (tests/test_cpu_linear.py), with x̂ computed independently in numpy.
//
// Each output element depends only on its own input row and weight row (integer sums are exact, the per-block
// float terms are added in column order), so a row's result is the same alone or in any batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "artifact/artifact.h"
#include "backend/backend.h"

namespace ninfer::cpu {

constexpr int64_t kQ8Block = 32;  // columns per activation block

// Byte order of the 32 q values of a block: as the columns (int8 weights), or the even columns first, then the odd
// ones (int4 weights: a packed byte holds an even column's code in its low nibble and the next column's in its high
// one, so the kernel splits 16 bytes into the two halves without interleaving them).
enum class Q8Order { Columns, NibbleHalves };

// Rows of activations rounded to 8 bits per 32-column block, in one byte order.
struct Q8Rows {
  int64_t rows = 0, cols = 0;
  Q8Order order = Q8Order::Columns;
  std::vector<int8_t> q;        // rows * cols bytes
  std::vector<float> scale;     // d_b, rows * cols / 32
  std::vector<float> dsum;      // d_b * sum of the block's q (the zero point / offset term), rows * cols / 32
};

// Whether linear_q8 serves `w` in this build: int4 / int4_affine / int8 with groups of a multiple of 32 columns,
// and AVX2 + FMA + F16C (without them the CPU backend keeps f32 activations).
bool linear_q8_applies(const TensorView& w);
// The byte order `w`'s codes are multiplied in.
Q8Order q8_order(const TensorView& w);

// Rounds rows x [rows, cols] (cols a multiple of 32) into `out` (its buffers grown as needed, never shrunk).
void quantize_rows_q8(const float* x, int64_t rows, int64_t cols, Q8Order order, Q8Rows& out);

// y = W x̂ (+ bias) for every weight of `outs` (each accepted by linear_q8_applies, taking `x`'s order and width),
// all in one parallel region: several small projections of one input (q/k/v, gate/up) share one fork/join.
void linear_q8(const Q8Rows& x, std::span<const LinearOut> outs);

}  // namespace ninfer::cpu
