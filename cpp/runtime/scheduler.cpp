#include "runtime/scheduler.h"

#include <algorithm>

namespace ninfer {

Scheduler::Scheduler(int32_t num_lanes, int64_t prefill_chunk, CacheManager& cache, int32_t draft_tokens)
    : prefill_chunk_(prefill_chunk), draft_tokens_(draft_tokens), cache_(cache), lanes_(num_lanes) {}

bool Scheduler::remove_queued(uint64_t id) {
  const auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Job& j) { return j.id == id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

std::vector<int32_t> Scheduler::admit() {
  std::vector<int32_t> filled;
  for (int32_t i = 0; i < num_lanes() && !queue_.empty(); ++i) {
    if (lanes_[i]) continue;
    const Job& head = queue_.front();
    const bool speculative = draft_tokens_ > 0 && head.output == JobOutput::Generate && !head.request.constrained;
    std::optional<CacheAdmission> admission = cache_.admit(head.reservation, speculative ? draft_tokens_ + 1 : 0);
    if (!admission) break;
    Lane& lane = lanes_[i].emplace();
    lane.job = std::move(queue_.front());
    queue_.pop_front();
    lane.cache = std::move(admission->cache);
    lane.computed = lane.cached = admission->computed;
    lane.tokens = lane.job.request.prompt;
    lane.admitted = Clock::now();
    lane.speculative = speculative;
    if (lane.job.output == JobOutput::Generate) {
      lane.sampler.emplace(lane.job.request.sampling);
      lane.history.add_prompt(lane.tokens);
    }
    filled.push_back(i);
  }
  return filled;
}

// NOTE: a lane's prefill chunks are [k * chunk, (k + 1) * chunk) clipped to its prompt, whatever else runs, so a
// request computes exactly the same slices alone or in company (and chunk ends sit on multiples of 64, where
// prefix snapshots will go). The budget only decides how many chunks run in one step; the first always runs.
StepPlan Scheduler::plan() const {
  StepPlan plan;
  std::vector<PlannedSlice> prefills;
  int64_t prefill_tokens = 0;
  for (int32_t i = 0; i < num_lanes(); ++i) {
    if (!lanes_[i]) continue;
    const Lane& lane = *lanes_[i];
    const int64_t begin = lane.computed, target = static_cast<int64_t>(lane.tokens.size());
    if (begin >= target) continue;
    const int64_t end = std::min(target, (begin / prefill_chunk_ + 1) * prefill_chunk_);
    const bool scoring = lane.job.output == JobOutput::PromptLogprobs;
    if (lane.speculative && lane.generated > 0) {  // decoding: verify the last token and this round's drafts
      const int32_t drafts = drafts_this_round(draft_tokens_, lane.job.request.max_new_tokens - lane.generated,
                                               lane.job.reservation - begin);
      if (drafts > 0) {
        plan.slices.push_back({i, begin, target, SliceKind::Verify, SliceOutput::Sample, drafts});
        continue;
      }
    }
    // One new token is a decode slice even when it is the prompt's last (a decode graph runs it the same way).
    PlannedSlice slice{i, begin, end, end - begin == 1 && !scoring ? SliceKind::Decode : SliceKind::Prefill,
                       scoring ? SliceOutput::PromptLogprobs : end == target ? SliceOutput::Sample : SliceOutput::None};
    if (slice.kind == SliceKind::Decode) {
      plan.slices.push_back(slice);
    } else if (prefills.empty() || prefill_tokens + (end - begin) <= prefill_chunk_) {
      prefill_tokens += end - begin;
      prefills.push_back(slice);
    }
  }
  plan.slices.insert(plan.slices.end(), prefills.begin(), prefills.end());
  return plan;
}

void Scheduler::finish(int32_t index) {
  if (!lanes_[index]) return;
  cache_.release(lanes_[index]->cache);
  lanes_[index].reset();
}

int32_t Scheduler::lane_of(uint64_t id) const {
  for (int32_t i = 0; i < num_lanes(); ++i)
    if (lanes_[i] && lanes_[i]->job.id == id) return i;
  return -1;
}

int32_t Scheduler::num_busy_lanes() const {
  return static_cast<int32_t>(std::count_if(lanes_.begin(), lanes_.end(), [](const auto& l) { return l.has_value(); }));
}

}  // namespace ninfer
