// Where the host-side tables of one pass (token ids, positions, sequences, page lists, state pointers) go on
// their way to the device: a pinned host arena mirrored by a device arena, bump-allocated per pass. Each op's
// tables get their own slot, so a whole pass can be captured as a CUDA graph and its tables refreshed by one
// copy before each launch; in eager passes each slot is copied as it is written (pinned, so asynchronously).
// A captured graph keeps reading the slots it was captured with: it may be replayed with new tables as long as
// every slot of the pass has the size it had (same sizes in the same order: same offsets), which layout() tells.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/device_buffer.h"

namespace ninfer::cuda {

class StepTables {
 public:
  explicit StepTables(size_t capacity);
  ~StepTables();
  StepTables(const StepTables&) = delete;
  StepTables& operator=(const StepTables&) = delete;

  // Starts a pass: slots are handed out from the beginning again. The caller makes sure no queued copy or
  // kernel still uses the previous pass's slots (a stream synchronisation).
  void reset() {
    used_ = 0;
    layout_.clear();
  }
  // Copies `bytes` into the next host slot; returns the slot's device address. `copy_now` queues its transfer
  // on `stream` (eager passes); otherwise copy_all() brings every slot over before a graph launch.
  // False in `fits` when the arena is full (the caller synchronises, resets and retries, or gives up).
  const uint8_t* put(const void* data, size_t bytes, bool copy_now, cudaStream_t stream, bool& fits);
  void copy_all(cudaStream_t stream) const;
  size_t capacity() const { return capacity_; }
  // The byte size of each slot handed out since reset(), in order.
  const std::vector<uint32_t>& layout() const { return layout_; }

 private:
  size_t capacity_, used_ = 0;
  std::vector<uint32_t> layout_;
  uint8_t* host_ = nullptr;  // pinned
  DeviceBuffer device_;
};

}  // namespace ninfer::cuda
