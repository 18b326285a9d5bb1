// Exact-batch CUDA graphs of the decode pass: one executable graph per batch size (1..max lanes). A decode pass
// of batch B is captured on the backend's stream as the model issues its ops; the captured graph then updates
// B's executable (cudaGraphExecUpdate: same topology, new kernel arguments — buffers may have moved) or is
// instantiated the first time, and is launched. So every decode pass runs as one graph launch on the GPU, with
// no gaps between its ~1000 kernels, and stays correct when activation buffers are reallocated.
// The first decode pass of each batch size runs eagerly: it makes every weight constant resident and grows the
// activation buffers, neither of which may happen inside a capture.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "runtime/device_runtime.h"

namespace ninfer::cuda {

class DecodeGraphs {
 public:
  explicit DecodeGraphs(int32_t max_batch = 64) : execs_(size_t(max_batch) + 1, nullptr), warm_(execs_.size()) {}
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Whether a pass of `batch` should be captured (graphs on, batch known, warmed up); records the warm-up.
  bool should_capture(int32_t batch);
  void begin_capture(cudaStream_t stream, int32_t batch);
  bool capturing() const { return batch_ > 0; }
  // Ends the capture, runs `before_launch` (the tables copy), then launches the batch's executable.
  template <class Fn>
  void end_and_launch(cudaStream_t stream, Fn&& before_launch) {
    cudaGraph_t graph = end_capture(stream);
    before_launch();
    launch(stream, graph);
  }
  // Leaves a capture broken by an error, discarding it.
  void abandon(cudaStream_t stream);
  // Adds the previous graph launch's device time to the timings; call once the stream is idle.
  void collect_timing();
  const GraphPassTimings& timings() const { return timings_; }

  bool enabled = true;
  int64_t bytes() const { return bytes_; }
  int32_t captured() const;
  int64_t replays() const { return replays_; }

 private:
  cudaGraph_t end_capture(cudaStream_t stream);
  void launch(cudaStream_t stream, cudaGraph_t graph);

  std::vector<cudaGraphExec_t> execs_;
  std::vector<bool> warm_;
  int32_t batch_ = 0;    // the batch being captured, 0 when none
  int32_t pending_ = 0;  // the batch whose captured graph launch() takes
  int64_t bytes_ = 0, replays_ = 0;
  // Where a captured pass's time goes: the host issuing the model's ops into the capture, the executable's
  // update, and the graph on the device (events around the launch).
  GraphPassTimings timings_;
  std::chrono::steady_clock::time_point capture_started_;
  cudaEvent_t launch_start_ = nullptr, launch_end_ = nullptr;
  bool launch_timed_ = false;
};

}  // namespace ninfer::cuda
