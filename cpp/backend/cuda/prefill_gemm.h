// Prefill-size linear layers on tensor cores: y[r, o] = sum_i x[r, i] * W[o, i] (+ bias[o]) for rows above the
// decode GEMV's range, with x and y f32 and W in its stored encoding. Three implementations:
//   - Twin: gemm() in gemm.h, the f32 CUDA-core GEMM (exact f32 products; the reference the others are tested
//     against, and the path for f32/f16 weights and shapes the others do not take);
//   - Bf16: W dequantized into a bf16 slab (bf16 weights are used as they are), x rounded to bf16, and a cuBLASLt
//     bf16 x bf16 -> f32 product (f32 accumulation);
//   - Fp8 (W8A8, for fp8_e4m3 weights): each row of x quantized to e4m3 with its own scale s_x[r] = amax_r / 448
//     (the per-token dynamic activation quantization SGLang and vLLM use for FP8 models), a cuBLASLt e4m3 x e4m3
//     -> f32 product, and y[r, o] = acc[r, o] * s_x[r] * s_w[o] applied by cuBLASLt's outer-vector scaling where it
//     takes it (Fp8), else by a separate epilogue kernel (Fp8SeparateScaling);
//   - Streamed (int4/int8 weights in groups of 128s): the codes streamed through the tensor cores with no bf16 copy
//     (streamed_gemm.h), x rounded to bf16, W exact. Auto takes it up to kStreamedAutoRows rows, where writing the
//     bf16 copy would cost more than the GEMM's arithmetic.
// The bf16 and e4m3 roundings of the operands are the only differences from the twin's products.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>

#include "artifact/artifact.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/lt_matmul.h"

namespace ninfer::cuda {

enum class GemmImpl : uint8_t { Auto, Twin, Bf16, Fp8, Fp8SeparateScaling, Streamed };

// Auto's largest row count for the streamed implementation. 0 until the kernel has passed its GPU tests and the
// crossover with the bf16 path is measured (bench/cuda_gemm.py --streamed; bench/NOTES-cuda.md "Session 14"): it
// was written in a session without a device, so auto keeps the measured bf16 path meanwhile.
constexpr int64_t kStreamedAutoRows = 0;

const char* gemm_impl_name(GemmImpl impl);
GemmImpl gemm_impl_from_name(const std::string& name);  // EngineError for an unknown name

// The fastest implementation this weight's encoding and shape allow (never Auto).
GemmImpl preferred_gemm_impl(const TensorView& w);

// One product of PrefillGemm::run_shared: y = x W^T (+ bias), device pointers (`w` holds device pointers).
struct GemmOutput {
  const TensorView* w = nullptr;
  float* y = nullptr;     // [rows, w->rows()]
  const float* bias = nullptr;  // [w->rows()] or null
};

class PrefillGemm {
 public:
  // x [rows, W.cols()], y [rows, W.rows()], bias [W.rows()] or null: device pointers; `w` holds device pointers.
  // `impl` Auto runs Streamed where it takes the weight and rows <= streamed_rows(), else the preferred
  // implementation, stepping down (Fp8 -> Fp8SeparateScaling -> Bf16 -> Twin)
  // where cuBLASLt has no algorithm for the problem; any other value runs that one or throws EngineError.
  // Returns the implementation that ran. Allocates scratch (outside CUDA-graph capture only: decode passes never
  // come here).
  GemmImpl run(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias, cudaStream_t stream,
               GemmImpl impl = GemmImpl::Auto);
  // run() for several weights on the same x (a layer's projections): x is rounded to bf16, or quantized to e4m3
  // with its row scales, once for all products that take that form, not once per weight.
  void run_shared(const float* x, int64_t rows, std::span<const GemmOutput> outs, cudaStream_t stream,
                  GemmImpl impl = GemmImpl::Auto);
  // Auto's largest row count for the streamed GEMM (default kStreamedAutoRows).
  void set_streamed_rows(int64_t rows) { streamed_rows_ = rows; }

 private:
  enum class InputForm : uint8_t { None, Bf16, E4m3, StreamedNibble, StreamedByte };
  GemmImpl run_one(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias,
                   cudaStream_t stream, GemmImpl impl);
  bool run_bf16(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias, cudaStream_t stream);
  bool run_fp8(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias, LtScaling scaling,
               cudaStream_t stream);
  bool run_streamed(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias,
                    cudaStream_t stream);
  // A reused device buffer of at least `bytes` (grown after the stream has finished with the old one; growing
  // forgets the prepared input).
  void* scratch(DeviceBuffer& buffer, size_t bytes, cudaStream_t stream);
  // Whether x_low_ (and x_scale_) already hold `x` [rows, k] in `form` (queued by this run_shared call); marks it
  // so for the caller, which then queues the conversion, when not.
  bool input_ready(InputForm form, const float* x, int64_t rows, int64_t k);

  LtMatmul lt_;
  DeviceBuffer weight_slab_, x_low_, x_scale_, partials_;
  int64_t streamed_rows_ = kStreamedAutoRows;
  struct {
    InputForm form = InputForm::None;
    const float* x = nullptr;
    int64_t rows = 0, k = 0;
  } prepared_;  // what x_low_ holds; reset at every run()/run_shared() (x's contents may change between calls)
};

}  // namespace ninfer::cuda
