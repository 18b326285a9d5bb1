// Error checking for CUDA calls: every failure becomes a typed engine error with the call and the reason.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "errors.h"

namespace ninfer::cuda {

inline void check(cudaError_t status, const char* what, const char* file, int line) {
  if (status == cudaSuccess) return;
  const std::string message = std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                              "): " + cudaGetErrorString(status);
  if (status == cudaErrorMemoryAllocation) throw OutOfMemoryError(message);
  throw EngineError(message);
}

}  // namespace ninfer::cuda

#define NINFER_CUDA_CHECK(call) ::ninfer::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors show up here, not at the launch.
#define NINFER_CUDA_CHECK_LAUNCH() ::ninfer::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
