// The step executor: runs a StepPlan's forward pass over the cache pools and turns its logits into each slice's
// output (sampled tokens on the device or the host, prompt logprobs). It touches no lane: what it needs of one is
// gathered into a SliceInput first, so both phases can run without the engine's lock.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/cache_pools.h"
#include "model/model.h"
#include "runtime/device_runtime.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"
#include "runtime/step_plan.h"

namespace ninfer {

struct SliceInput {
  ForwardItem item;             // the slice's tokens, where they go, and whether every row's logits are needed
  const int32_t* tokens = nullptr;  // the lane's tokens (PromptLogprobs reads each row's next one); null once it ended
  int64_t total_tokens = 0;
  bool host_sampler = false;    // the lane uses a sampler stage only the host sampler has (needs_host_sampler)
  // Output Sample, filled once the lane's mask is known; `sample` false: the lane samples nothing this step
  // (it ended, or its mask ends it).
  bool sample = false;
  const SamplingParams* params = nullptr;
  Sampler* sampler = nullptr;
  const TokenHistory* history = nullptr;
  uint64_t counter = 0;          // tokens the lane generated so far (the device sampler's RNG counter)
  // The caller's mask of each row from the first (LaneMask::rows); an empty one, or none, leaves a row unconstrained
  std::span<const std::vector<uint32_t>> masks;
  int32_t verified = 0;            // kind Verify: the drafts this round verifies (fewer than planned where masks stop)
  LaneDrafts* drafts = nullptr;    // a speculative lane's: its MTP rows catch up before the pass (kind Verify: drafts)
  std::span<const int32_t> round_drafts() const {  // kind Verify: every draft of the round (the drafter's)
    return std::span<const int32_t>(drafts->verify_tokens).subspan(1);
  }
  std::span<const uint32_t> mask(size_t row) const {
    return row < masks.size() ? std::span<const uint32_t>(masks[row]) : std::span<const uint32_t>();
  }
};

class StepExecutor {
 public:
  // `device`: the model's backend when it has its own memory; it samples there when `device_sampling`.
  // `drafter`: speculative decoding's MTP side (null without).
  StepExecutor(Model& model, CachePools& pools, DeviceRuntime* device, bool device_sampling,
               Drafter* drafter = nullptr);

  // The MTP head catches up with each speculative lane's new target rows and drafts for its Verify slice (whose
  // item then forwards the drafts), before run_pass: a constrained lane's mask request carries the drafts.
  StepResult draft(const StepPlan& plan, std::span<SliceInput> inputs);
  // The plan's forward pass; a failure comes back as the result's error (its slices stay empty).
  StepResult run_pass(const StepPlan& plan, std::span<const SliceInput> inputs);
  // Each slice's output from that pass, into result.slices (or result's error).
  void collect(const StepPlan& plan, std::span<const SliceInput> inputs, StepResult& result);

 private:
  void sample_on_device(const StepPlan& plan, std::span<const SliceInput> inputs, StepResult& result);
  void collect_on_host(const StepPlan& plan, std::span<const SliceInput> inputs, StepResult& result);
  void keep_hidden(size_t slice, const PlannedSlice& s, SliceResult& result) const;
  void collect_candidates(const StepPlan& plan, std::span<const SliceInput> inputs, StepResult& result);

  Model& model_;
  CachePools& pools_;
  DeviceRuntime* device_;
  bool device_sampling_;
  Drafter* drafter_;
  ForwardOutput out_;
};

}  // namespace ninfer
