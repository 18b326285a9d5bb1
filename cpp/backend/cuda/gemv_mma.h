// The decode GEMV on the tensor cores: y[r, o] = sum_i x[r, i] * W[o, i] for 1..8 activation rows, W streamed
// once in its stored encoding and dequantized in registers straight into mma.sync operands.
//
// Numerics: the weight operand is exact (the integer codes of int4/int8 minus their zero point, e4m3 and e2m1
// values, bf16 values are all exact in the 16-bit operand type; group and row scales are applied in f32 after
// the products). The activations are split into a high and a low 16-bit part (x = hi + lo, both multiplied by
// the weights), which keeps about 22 significant bits: the result matches the f32 CUDA-core twin (gemv.h) to f32
// rounding, not to bf16 rounding. fp16 operands (the quantized encodings) get a per-row power-of-two activation
// scale so that the largest |x| of a row sits just under fp16's range.
//
// Determinism: the split of K over warps and blocks depends only on the weight's shape, and partial sums are
// reduced in a fixed order, so a row's result is bit-identical whatever else is in the batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "artifact/artifact.h"
#include "backend/cuda/device_buffer.h"

namespace ninfer::cuda {

// Device scratch the tensor-core GEMV needs: the split activations (grown on demand: grow outside graph capture,
// e.g. in a warm-up pass), and fixed-size split-K partial sums and arrival counters (zeroed once; every launch
// leaves the counters at zero).
class GemvWorkspace {
 public:
  GemvWorkspace();
  // Makes room for `rows` activation rows of `cols` values; synchronizes `stream` when it must grow.
  void reserve(int rows, int64_t cols, cudaStream_t stream);
  int64_t bytes() const { return int64_t(split_.bytes() + partials_.bytes() + counters_.bytes()); }

  DeviceBuffer split_, partials_, counters_;
};

// The activations as the tensor-core GEMV reads them (hi/lo planes in a lane pair order, per-row exponents):
// made once by split_activations() and usable by every weight of the same split_kind() — the projections that
// share one input (a layer's q/k/v, gate/up) split it once. The bf16 kind has no planes until a v3 launch needs
// them (`planes`): v5 splits the f32 activations `x` in registers.
struct SplitActivations {
  const float* x = nullptr;
  const uint16_t* hi = nullptr;
  const uint16_t* lo = nullptr;
  const int* exps = nullptr;
  int rows = 0, kind = -1;
  int64_t cols = 0;
  bool planes = false;
};

// Which split a weight needs (equal kinds share one); -1 when gemv_mma does not take the weight.
int split_kind(const TensorView& w);
// Whether v5 reads this kind from split planes (the fp16 kinds) rather than splitting x in registers (bf16).
bool split_has_planes(int kind);
SplitActivations split_activations(const float* x, int rows, int64_t cols, int kind, GemvWorkspace& workspace,
                                   cudaStream_t stream);
// Where split_activations() puts the planes of `rows` x `cols` activations (growing `workspace` if it must),
// without splitting: for a kernel that writes the planes itself (the norm that produces x, norm.cu). kind >= 0.
SplitActivations split_layout(const float* x, int rows, int64_t cols, int kind, GemvWorkspace& workspace,
                              cudaStream_t stream);
// Which kernel: v5 (16-byte chunks in a register ring, hi and lo in one mma) or v3 (the session-2 kernel). Session
// 5 measured v5 ahead at 1-4 rows for every encoding but int4 q_proj (even) and v3 ahead for int4 at 8 rows; v3
// stays for one more A/B at 8 rows (bench --gemv-impls), then goes.
// v5_planes is v5 reading the split kernel's planes for bf16 weights too: the twin of v5's in-register bf16 split
// (same bits). Session 8 measured an in-register split for the fp16 encodings (each block finding its rows'
// exponents) slower than the chained split kernel + planes at 35B-A3B's widths (~2 us on the largest launch), so
// they always read planes.
enum class MmaKernel { v3, v5, v5_planes };

// y_i = W_i x for activations split for these weights' kind; weights of one encoding and width share launches.
struct MmaOutput {
  const TensorView* w;  // on the device
  float* y;
};
void gemv_mma(const SplitActivations& x, std::span<const MmaOutput> outs, GemvWorkspace& workspace,
              cudaStream_t stream, MmaKernel kernel = MmaKernel::v5);

// Whether the tensor-core path takes this weight (quantized and bf16 encodings whose rows are whole 128-value
// tiles; int4 groups of 128, int8 groups of 128 or 64 (the lm_head's), the v3 kernel groups of 128 only); other
// weights take the CUDA-core gemv().
bool gemv_mma_supports(const TensorView& w);

// x [rows, W.cols()] and y [rows, W.rows()] f32 device pointers, 1 <= rows <= kMaxGemvRows; `w` on the device.
void gemv_mma(const float* x, int rows, const TensorView& w, float* y, GemvWorkspace& workspace,
              cudaStream_t stream, MmaKernel kernel = MmaKernel::v5);

}  // namespace ninfer::cuda
