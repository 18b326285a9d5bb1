// The engine's backends by name, and the device's op times as Python sees them: shared by the engine binding
// (runtime.cpp) and the testing module's models and ops (bindings/testing/).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "runtime/device_runtime.h"
#include "runtime/engine.h"

namespace ninfer::bindings {

// "cpu" (threads: 0 = all cores) or "cuda" (device 0, default CUDA options but for cuda_op_times); EngineError for
// other names, a build without CUDA, or cuda_op_times on the CPU.
std::unique_ptr<Backend> make_backend_named(const std::string& name, int32_t threads, bool cuda_op_times = false);
// The CUDA backend (device 0) with the engine's CUDA options (cuda_gemm, cuda_op_times), which must be valid
// (validate_engine_options); EngineError in a build without CUDA.
std::unique_ptr<Backend> make_engine_cuda_backend(const EngineOptions& options);

// The device time per op so far, {op: {"calls", "device_us"}} (DeviceRuntime::op_times); empty when `device` is
// null or does not time its ops.
nanobind::dict op_times_dict(const DeviceRuntime* device);

}  // namespace ninfer::bindings
