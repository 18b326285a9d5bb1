#include "runtime/scheduler.h"

#include <algorithm>

#include "errors.h"

namespace ninfer {
namespace {

// The next prefill chunk of a sequence at `begin` of `target` tokens: [begin, the next multiple of the chunk).
int64_t chunk_end(int64_t begin, int64_t target, int64_t chunk) { return std::min(target, (begin / chunk + 1) * chunk); }

// Adds a prefill slice within the step's budget (the first always runs).
void add_prefill(const PlannedSlice& slice, int64_t budget, std::vector<PlannedSlice>& prefills,
                 int64_t& prefill_tokens) {
  if (!prefills.empty() && prefill_tokens + (slice.end - slice.begin) > budget) return;
  prefill_tokens += slice.end - slice.begin;
  prefills.push_back(slice);
}

}  // namespace

Scheduler::Scheduler(int32_t num_lanes, int32_t decision_lanes, int64_t prefill_chunk, int64_t decision_pages,
                     CacheManager& cache, int32_t draft_tokens)
    : prefill_chunk_(prefill_chunk), draft_tokens_(draft_tokens), cache_(cache), chat_lanes_(num_lanes),
      decision_pages_(decision_pages),
      lanes_(num_lanes + decision_lanes) {}

int64_t Scheduler::decision_pages_unused() const {
  int64_t held = 0;
  for (int32_t i = chat_lanes_; i < num_lanes(); ++i)
    if (lanes_[i]) held += lanes_[i]->decision_held_pages;
  return std::max<int64_t>(0, decision_pages_ - held);
}

std::optional<Job> Scheduler::remove_queued(uint64_t id) {
  for (std::deque<Job>* queue : {&queue_, &decision_queue_}) {
    const auto it = std::find_if(queue->begin(), queue->end(), [&](const Job& j) { return j.id == id; });
    if (it == queue->end()) continue;
    Job job = std::move(*it);
    queue->erase(it);
    return job;
  }
  return std::nullopt;
}

std::vector<int32_t> Scheduler::admit() {
  std::vector<int32_t> filled;
  admit_from(queue_, 0, chat_lanes_, filled);
  admit_from(decision_queue_, chat_lanes_, num_lanes(), filled);
  for (int32_t i = chat_lanes_; i < num_lanes(); ++i)
    if (lanes_[i]) start_rows(*lanes_[i]);
  return filled;
}

void Scheduler::admit_from(std::deque<Job>& queue, int32_t first_lane, int32_t end_lane,
                           std::vector<int32_t>& filled) {
  for (int32_t i = first_lane; i < end_lane && !queue.empty(); ++i) {
    if (lanes_[i]) continue;
    const Job& head = queue.front();
    const bool deciding = head.output == JobOutput::Decide;
    // Media prompts decode plainly: their positions follow M-RoPE's, which the MTP head's catch-up does not take.
    const bool speculative = draft_tokens_ > 0 && head.output == JobOutput::Generate && !head.request.constrained &&
                             !head.request.media;
    // What only the prefix cache holds counts as free: admission evicts it on demand.
    if (!deciding && cache_.reclaimable().first - kv_pages_for(head.reservation) < decision_pages_unused()) break;
    // Scoring needs every prompt position's logits: it computes them all (and publishes them for others). Media
    // blocks are told apart by their salts (the same placeholder ids hold different pictures). A decision
    // context's last token needs no logits (its rows read the answers), so all of it may come from the cache.
    const bool reuse = head.output != JobOutput::PromptLogprobs;
    std::optional<CacheAdmission> admission = cache_.admit(head.reservation, head.request.prompt, head.block_salts,
                                                           reuse, speculative ? draft_tokens_ + 1 : 0, deciding);
    if (!admission) break;
    std::optional<CacheReserve> reserve;
    if (deciding) {
      reserve = cache_.reserve(head.decision_pages, head.decision_rows);
      if (!reserve) {
        cache_.release(admission->cache);
        break;
      }
    }
    Lane& lane = lanes_[i].emplace();
    lane.job = std::move(queue.front());
    queue.pop_front();
    lane.cache = std::move(admission->cache);
    lane.computed = lane.cached = admission->computed;
    lane.tokens = lane.job.request.prompt;
    lane.admitted = Clock::now();
    lane.speculative = speculative;
    // The MTP head catches up from the first token this lane computes: the hidden rows of a prefix already in the
    // cache are not recomputed, so neither are that prefix's MTP rows.
    lane.drafts.mtp_next = lane.computed;
    if (lane.job.output == JobOutput::Generate) {
      lane.sampler.emplace(lane.job.request.sampling);
      lane.history.add_prompt(lane.tokens);
    }
    if (lane.job.output == JobOutput::Decide) {
      lane.reserve = std::move(*reserve);
      lane.decision_held_pages = static_cast<int64_t>(lane.cache.pages.size() + lane.reserve.pages.size());
      lane.rows.resize(size_t(lane.job.decision_rows));
      lane.decision_logprobs.resize(lane.job.decision.questions.size());
    }
    filled.push_back(i);
  }
}

// Forks the context into every free row once it is in (the parent's state is then the state after the context's
// last token): a round of up to decision_rows questions, refilled as answers are read. The reserve was sized for
// the longest suffix, so a fork cannot fail.
void Scheduler::start_rows(Lane& lane) {
  const int64_t context = static_cast<int64_t>(lane.tokens.size());
  const auto& questions = lane.job.decision.questions;
  if (lane.computed < context) return;
  for (std::optional<DecisionRow>& row : lane.rows) {
    if (row || lane.next_question >= static_cast<int32_t>(questions.size())) continue;
    const int64_t suffix = static_cast<int64_t>(questions[size_t(lane.next_question)].suffix.size());
    std::optional<SequenceCache> fork = cache_.fork(lane.cache, context, context + suffix, &lane.reserve);
    if (!fork) throw EngineError("a decision row's fork did not fit its reserve");
    row.emplace(DecisionRow{lane.next_question++, std::move(*fork), context});
  }
}

void Scheduler::finish_row(int32_t index, int32_t row) {
  Lane& lane = *lanes_[index];
  cache_.return_fork(lane.rows[size_t(row)]->cache, static_cast<int64_t>(lane.tokens.size()), lane.reserve);
  lane.rows[size_t(row)].reset();
}

// NOTE: a lane's prefill chunks are [k * chunk, (k + 1) * chunk) clipped to its prompt, whatever else runs, so a
// request computes exactly the same slices alone or in company (and chunk ends sit on multiples of 64, where
// prefix snapshots go; a chunk also ends where the cache manager takes a state snapshot of the prompt, since only
// a chunk's end has that state at hand). The budget only decides how many chunks run in one step; the first
// always runs. A decision row's suffix follows the same rule from the context's end, so a question computes the
// same slices alone or among fifty.
StepPlan Scheduler::plan() const {
  StepPlan plan;
  std::vector<PlannedSlice> prefills;
  int64_t prefill_tokens = 0;
  for (int32_t i = 0; i < num_lanes(); ++i) {
    if (!lanes_[i]) continue;
    const Lane& lane = *lanes_[i];
    const int64_t begin = lane.computed, target = static_cast<int64_t>(lane.tokens.size());
    const bool deciding = lane.job.output == JobOutput::Decide;
    if (begin >= target) {
      if (deciding) plan_rows(i, lane, prefills, prefill_tokens);
      continue;
    }
    if (lane.speculative && lane.generated > 0) {  // decoding: verify the last token and this round's drafts
      const int32_t drafts = drafts_this_round(draft_tokens_, lane.job.request.max_new_tokens - lane.generated,
                                               lane.job.reservation - begin);
      if (drafts > 0) {
        PlannedSlice verify{i, begin, target, SliceKind::Verify, SliceOutput::Sample};
        verify.drafts = drafts;
        plan.slices.push_back(verify);
        continue;
      }
    }
    const int64_t prompt = static_cast<int64_t>(lane.job.request.prompt.size());
    const int64_t end = std::min(chunk_end(begin, target, prefill_chunk_), cache_.next_snapshot(begin, prompt));
    const bool scoring = lane.job.output == JobOutput::PromptLogprobs;
    const SliceOutput output = scoring    ? SliceOutput::PromptLogprobs
                               : deciding ? SliceOutput::None  // the context only: its rows read the answers
                               : end == target ? SliceOutput::Sample
                                               : SliceOutput::None;
    // One new token is a decode slice even when it is the prompt's last (a decode graph runs it the same way).
    const bool decode = end - begin == 1 && !scoring && !deciding;
    PlannedSlice slice{i, begin, end, decode ? SliceKind::Decode : SliceKind::Prefill, output};
    if (slice.kind == SliceKind::Decode)
      plan.slices.push_back(slice);
    else
      add_prefill(slice, prefill_chunk_, prefills, prefill_tokens);
  }
  plan.slices.insert(plan.slices.end(), prefills.begin(), prefills.end());
  return plan;
}

void Scheduler::plan_rows(int32_t index, const Lane& lane, std::vector<PlannedSlice>& prefills,
                          int64_t& prefill_tokens) const {
  const int64_t context = static_cast<int64_t>(lane.tokens.size());
  for (size_t r = 0; r < lane.rows.size(); ++r) {
    const std::optional<DecisionRow>& row = lane.rows[r];
    if (!row) continue;
    const int64_t target = context + static_cast<int64_t>(lane.job.decision.questions[size_t(row->question)].suffix.size());
    const int64_t end = chunk_end(row->computed, target, prefill_chunk_);
    PlannedSlice slice{index, row->computed, end, SliceKind::Prefill,
                       end == target ? SliceOutput::CandidateLogprobs : SliceOutput::None};
    slice.row = int32_t(r);
    add_prefill(slice, prefill_chunk_, prefills, prefill_tokens);
  }
}

void Scheduler::commit(int32_t index) {
  Lane& lane = *lanes_[index];
  const int64_t prompt = static_cast<int64_t>(lane.job.request.prompt.size());
  cache_.commit(lane.cache, lane.tokens, lane.computed, cache_.snapshot_use(lane.computed, prompt),
                lane.job.block_salts);
}

void Scheduler::finish(int32_t index) {
  if (!lanes_[index]) return;
  Lane& lane = *lanes_[index];
  for (int32_t r = 0; r < static_cast<int32_t>(lane.rows.size()); ++r)
    if (lane.rows[size_t(r)]) finish_row(index, r);
  cache_.release(lane.reserve);
  cache_.release(lane.cache);
  lanes_[index].reset();
}

std::vector<const Job*> Scheduler::queued() const {
  std::vector<const Job*> jobs;
  for (const std::deque<Job>* queue : {&queue_, &decision_queue_})
    for (const Job& job : *queue) jobs.push_back(&job);
  return jobs;
}

int32_t Scheduler::lane_of(uint64_t id) const {
  for (int32_t i = 0; i < num_lanes(); ++i)
    if (lanes_[i] && lanes_[i]->job.id == id) return i;
  return -1;
}

int32_t Scheduler::num_busy_chat_lanes() const {
  return static_cast<int32_t>(std::count_if(lanes_.begin(), lanes_.begin() + chat_lanes_,
                                            [](const auto& l) { return l.has_value(); }));
}

int32_t Scheduler::num_busy_lanes() const {
  return static_cast<int32_t>(std::count_if(lanes_.begin(), lanes_.end(), [](const auto& l) { return l.has_value(); }));
}

}  // namespace ninfer
