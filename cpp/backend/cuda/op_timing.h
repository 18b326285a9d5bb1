// The CUDA backend's op-timing mode (EngineOptions::cuda_op_times, off by default): every op of an eager pass is
// bracketed by two CUDA events, and the device time between them is summed per op name, so one prefill can be
// broken down by op (bench/cuda_engine.py --op-times). Captured decode passes are not timed (events inside a
// graph cannot be read back); their device time is in graph_timings(). Events add a little host work per op and
// nothing between ops on the device.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace ninfer::cuda {

// A CudaBackend that times its ops (DeviceRuntime::op_times).
std::unique_ptr<Backend> make_timed_cuda_backend(int device);

}  // namespace ninfer::cuda
