// Tensor-core matrix products through cuBLASLt for the prefill GEMM: y[m, j] = sum_k x[m, k] * w[j, k] with
// w [n, k] and x [m, k] row-major in bf16 or e4m3 (both "K-major": cuBLASLt's TN layout, the one its fp8 kernels
// require) and y f32 with row stride ldy. One handle, one workspace and a cache of chosen algorithms per backend.
// Built without cuBLASLt (NINFER_HAVE_CUBLASLT unset), available() is false and run() is never called.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/device_buffer.h"
#include "runtime/memory_plan.h"

namespace ninfer::cuda {

enum class LtOperands : uint8_t { BF16, E4M3 };

// For e4m3 operands: how the per-row dequantization scales reach y.
enum class LtScaling : uint8_t {
  None,         // y is the raw product (the caller scales it afterwards)
  OuterVector,  // cuBLASLt multiplies y[m, j] by x_scale[m] * w_scale[j] in its epilogue
};

struct LtProblem {
  LtOperands operands = LtOperands::BF16;
  LtScaling scaling = LtScaling::None;
  const void* w = nullptr;  // [n, k]
  const void* x = nullptr;  // [m, k]
  float* y = nullptr;       // [m, ldy], columns 0..n written
  int64_t n = 0, m = 0, k = 0, ldy = 0;
  const float* w_scale = nullptr;  // [n], OuterVector only
  const float* x_scale = nullptr;  // [m], OuterVector only
};

class LtMatmul {
 public:
  // Bytes of the cuBLASLt workspace (the size NVIDIA recommends for Hopper); the memory plan counts it.
  static constexpr size_t kWorkspaceBytes = size_t(kGemmLtWorkspaceBytes);

  LtMatmul();
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // Whether this build has cuBLASLt (and a device it runs on).
  static bool available();
  // Whether cuBLASLt has an algorithm for this problem (its layout, pointer alignments and scaling mode on this
  // device); the answer is cached. Creates the handle and the workspace on first use: call it once outside
  // CUDA-graph capture before any captured use.
  bool supports(const LtProblem& p);
  // Queues the product on `stream`; false (nothing queued) when it is not supported.
  bool run(const LtProblem& p, cudaStream_t stream);

 private:
  struct Algorithm;  // cublasLtMatmulAlgo_t, or none found
  // (operands, scaling, m, n, k, ldy, alignment of w/x/y in bytes): the algorithm cuBLASLt's heuristic chose.
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int, int, int>;
  const Algorithm& algorithm(const LtProblem& p);

  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  std::map<Key, std::unique_ptr<Algorithm>> algorithms_;
};

}  // namespace ninfer::cuda
