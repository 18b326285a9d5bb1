// Exact-shape CUDA graphs of the decode pass: one executable graph per pass shape (GraphPassShape: lanes 1..max,
// and rows per lane: 1 for plain decode steps, K + 1 for an MTP verify pass; or one lane's MTP drafting, keyed by
// its catch-up rows and drafts), captured once and then replayed step after step.
//
// A decode pass of shape B goes through three modes:
//   - eager: B's first pass (the warm-up). It makes every weight constant resident and grows the activation
//     buffers, neither of which may happen inside a capture.
//   - capture: B's second pass, or the first after any device buffer was allocated or freed (the allocation
//     epoch moved: a buffer the graph reads may have moved). The model's ops are captured on the backend's
//     stream, the graph instantiated (or B's executable updated in place), its step tables copied, launched.
//   - replay: every later pass of B. The model's ops run on the host only as far as writing their step tables
//     (StepTables, at the same offsets as in the capture: a graph pass pads every table to a size fixed by B);
//     no kernel is launched. Then one copy of the tables and one graph launch.
// A replay checks that it wrote the captured layout of tables and that no buffer moved; either failing is a bug
// and throws rather than launch a graph on the wrong addresses.
// The allocation epoch is process-wide and the backend's stream is a blocking one: a second CUDA engine that
// allocates, frees or copies through the legacy stream while this one replays makes that check throw, or breaks
// a capture. The router keeps one engine resident at a time; two CUDA engines decoding at once in one process
// would need a per-backend epoch and a non-blocking stream with stream-ordered uploads.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <map>
#include <cstdint>
#include <vector>

#include "backend/cuda/step_tables.h"
#include "runtime/device_runtime.h"

namespace ninfer::cuda {

class DecodeGraphs {
 public:
  enum class Mode { eager, capture, replay };

  explicit DecodeGraphs(int32_t max_batch = 64, int32_t max_rows = 8) : max_batch_(max_batch), max_rows_(max_rows) {}
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Starts a pass of `shape` (lanes 0: not a decode pass) and says how it runs; `epoch` is
  // device_allocation_epoch() now. The stream must be idle (nothing queued reads the step tables).
  Mode begin(cudaStream_t stream, GraphPassShape shape, uint64_t epoch);
  Mode mode() const { return mode_; }
  // Whether the pass's ops write their tables without launching kernels (a replay).
  bool tables_only() const { return mode_ == Mode::replay; }
  // Whether the pass's tables must keep the layout fixed for its batch (capture and replay).
  bool fixed_layout() const { return mode_ != Mode::eager; }
  // The shape of the captured or replayed pass (lanes 0 in an eager one).
  GraphPassShape shape() const { return batch_; }
  // Ends a captured or replayed pass: copies `tables` to the device and launches the batch's graph. Nothing
  // for an eager pass. Throws EngineError when a replay's tables or buffers differ from the capture's.
  void launch(cudaStream_t stream, const StepTables& tables, uint64_t epoch);
  // Leaves a pass broken by an error, discarding a capture in progress.
  void abandon(cudaStream_t stream);
  // Adds the previous graph launch's device time to the timings; call once the stream is idle.
  void collect_timing();
  const GraphPassTimings& timings() const { return timings_; }

  bool enabled = true;
  int64_t bytes() const { return bytes_; }
  int32_t captured() const;
  int64_t replays() const { return timings_.replays; }

 private:
  struct Batch {
    cudaGraphExec_t exec = nullptr;
    bool warm = false;              // ran eagerly once, to its end
    bool replayable = false;        // exec matches the buffers of `epoch` and the tables of `layout`
    uint64_t epoch = 0;
    std::vector<uint32_t> layout;   // the step-table slot sizes the capture wrote
  };

  // Instantiates the captured graph as `b`'s executable, or updates the one it has.
  void install(cudaStream_t stream, Batch& b, cudaGraph_t graph);
  void launch_timed(cudaStream_t stream, cudaGraphExec_t exec);

  int32_t max_batch_, max_rows_;
  std::map<GraphPassShape, Batch> batches_;  // (a map: its entries stay where they are as others are added)
  Mode mode_ = Mode::eager;
  GraphPassShape batch_;
  GraphPassShape warming_;  // the shape whose warm-up pass is running (lanes 0: none)
  uint64_t epoch_at_begin_ = 0;
  int64_t bytes_ = 0;
  GraphPassTimings timings_;
  std::chrono::steady_clock::time_point started_;
  cudaEvent_t launch_start_ = nullptr, launch_end_ = nullptr;
  bool launch_timed_ = false, launched_draft_ = false;  // the last launch timed; a drafting pass's (drafts > 0)
};

}  // namespace ninfer::cuda
