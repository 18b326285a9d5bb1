// Output processing: turns a step's result into the lanes' progress and the callers' events — tokens appended,
// stop and length checks, progress reports, usage and timings, lanes ended. Called with the engine's lock held;
// it knows nothing of threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/request.h"
#include "runtime/scheduler.h"
#include "runtime/step_plan.h"

namespace ninfer {

struct OutputCounters {
  int64_t requests_finished = 0, tokens_generated = 0, tokens_prefilled = 0;
  int64_t draft_tokens = 0, draft_tokens_accepted = 0;  // speculative decoding's, over all requests
};

class OutputProcessor {
 public:
  // `publish` hands an event to the callers; `ended` runs once per request that leaves a lane (with what the job
  // produced), after its cache is freed and before its final event.
  OutputProcessor(Scheduler& scheduler, std::function<void(EngineEvent)> publish,
                  std::function<void(JobOutput)> ended);

  // Applies `result` (for `plan`) to the lanes still running; a failed result ends them all with its error.
  void absorb(const StepPlan& plan, const StepResult& result);
  // Ends lane `index`: frees it and its cache first, so that whoever sees the final event sees them free.
  void end_lane(int32_t index, FinishReason reason, const std::string& error_type = {},
                const std::string& error_message = {});
  const OutputCounters& counters() const { return counters_; }

 private:
  void absorb_slice(const PlannedSlice& slice, const SliceResult& result);
  void absorb_verified(Lane& lane, const PlannedSlice& slice, const SliceResult& result);
  bool ended_by_mask(const Lane& lane, int32_t index);
  void absorb_row(const PlannedSlice& slice, SliceResult result);
  void take_token(Lane& lane, int32_t index, const SampledToken& s);
  void report_progress(const Lane& lane, const PlannedSlice& slice);

  Scheduler& scheduler_;
  std::function<void(EngineEvent)> publish_;
  std::function<void(JobOutput)> ended_;
  OutputCounters counters_;
};

}  // namespace ninfer
