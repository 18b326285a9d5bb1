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
                     CacheManager& cache, int32_t draft_tokens, int32_t verify_rows, int64_t decoding_prefill_chunk)
    : prefill_chunk_(prefill_chunk),
      decoding_prefill_chunk_(decoding_prefill_chunk > 0 ? decoding_prefill_chunk : prefill_chunk),
      draft_tokens_(draft_tokens), verify_rows_(verify_rows), cache_(cache),
      chat_lanes_(num_lanes),
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
    const auto it = std::find_if(queue->begin(), queue->end(), [&](const Job& j) { return j.holds(id); });
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
  for (int32_t i = 0; i < chat_lanes_; ++i)
    if (lanes_[i] && !lanes_[i]->forks.empty()) start_forks(*lanes_[i]);
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
    const int32_t forks = head.request.choices - 1;
    // The other choices' lanes: free ones after this, all taken at once (FIFO: the head waits until they are).
    std::vector<int32_t> fork_lanes;
    for (int32_t j = i + 1; j < end_lane && int32_t(fork_lanes.size()) < forks; ++j)
      if (!lanes_[j]) fork_lanes.push_back(j);
    if (int32_t(fork_lanes.size()) < forks) break;
    // Media prompts decode plainly: their positions follow M-RoPE's, which the MTP head's catch-up does not take.
    // So do the choices of n > 1 (their forks take no step slots).
    // A constrained request drafts when its caller can mask the draft rows too (MaskRequest::drafts).
    const bool speculative = draft_tokens_ > 0 && head.output == JobOutput::Generate &&
                             (!head.request.constrained || head.request.masks_drafts) && !head.request.media &&
                             forks == 0;
    // What only the prefix cache holds counts as free: admission evicts it on demand.
    if (!deciding && cache_.reclaimable().first - kv_pages_for(head.reservation) - forks * head.fork_pages <
                         decision_pages_unused())
      break;
    // Scoring needs every prompt position's logits: it computes them all (and publishes them for others). Media
    // blocks are told apart by their salts (the same placeholder ids hold different pictures). A decision
    // context's last token needs no logits (its rows read the answers), so all of it may come from the cache.
    const bool reuse = head.output != JobOutput::PromptLogprobs;
    std::optional<CacheAdmission> admission = cache_.admit(head.reservation, head.request.prompt, head.block_salts,
                                                           reuse, speculative ? draft_tokens_ + 1 : 0, deciding);
    if (!admission) break;
    std::optional<CacheReserve> reserve;
    if (deciding || forks > 0) {
      reserve = deciding ? cache_.reserve(head.decision_pages, head.decision_rows)
                         : cache_.reserve(forks * head.fork_pages, forks);
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
      lane.history.counted = reads_token_counts(lane.job.request.sampling);
      lane.history.add_prompt(lane.tokens);
    }
    for (int32_t k = 1; k <= forks; ++k) {  // the other choices wait for the prompt but its last token
      const int32_t j = fork_lanes[size_t(k - 1)];
      Lane& choice = lanes_[j].emplace();
      choice.job = lane.job;
      choice.job.id = lane.job.id + uint64_t(k);
      SamplingParams& sampling = choice.job.request.sampling;
      if (sampling.has_seed) sampling.seed += uint64_t(k);  // (unseeded: each Sampler draws its own seed)
      choice.fork_of = i;
      choice.tokens = lane.tokens;
      choice.admitted = lane.admitted;
      choice.sampler.emplace(choice.job.request.sampling);
      choice.history.counted = lane.history.counted;
      choice.history.add_prompt(choice.tokens);
      lane.forks.push_back(j);
      filled.push_back(j);
    }
    if (forks > 0) lane.reserve = std::move(*reserve);
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

// Once the first choice has computed the prompt but its last token (its state is the state after them), each
// other choice gets a fork of it: the full pages shared, the partly filled one copied, the state copied. Every
// choice then computes the last token and samples on its own (so each is the request it would be alone with its
// seed). The reserve was sized for exactly these forks, so a fork cannot fail; what is left of it goes back.
void Scheduler::start_forks(Lane& lane) {
  const int64_t tokens = static_cast<int64_t>(lane.job.request.prompt.size()) - 1;
  if (lane.computed < tokens) return;
  for (int32_t j : lane.forks) {
    Lane& choice = *lanes_[j];
    std::optional<SequenceCache> fork = cache_.fork(lane.cache, tokens, lane.job.reservation, &lane.reserve);
    if (!fork) throw EngineError("a choice's fork did not fit its reserve");
    choice.cache = std::move(*fork);
    choice.computed = tokens;
    choice.cached = lane.cached;
    choice.media = lane.media;
    choice.fork_of = -1;
  }
  lane.forks.clear();
  cache_.release(lane.reserve);
}

void Scheduler::finish_row(int32_t index, int32_t row) {
  Lane& lane = *lanes_[index];
  cache_.return_fork(lane.rows[size_t(row)]->cache, static_cast<int64_t>(lane.tokens.size()), lane.reserve);
  lane.rows[size_t(row)].reset();
}

// NOTE: a lane's prefill chunks are [k * chunk, (k + 1) * chunk) clipped to its prompt, so a request computes the
// same slices alone or in company of other prefills (and chunk ends sit on multiples of 64, where prefix snapshots
// go; a chunk also ends where the cache manager takes a state snapshot of the prompt, since only a chunk's end has
// that state at hand). The chunk is prefill_chunk_ unless some lane is decoding: then it is the smaller
// decoding_prefill_chunk_ (chunk_now), so that a long prompt holds each of their tokens back by one small pass.
// So the slices of a prompt do depend on whether others decode meanwhile: on the CPU backend the results do not
// (its ops do not depend on how a prompt is cut at multiples of 64), on a device backend within its rounding (a
// GEMM of other rows may sum in another order). The budget only decides how many chunks run in one step; the
// first always runs. A decision row's suffix follows the same rule from the context's end, so a question computes
// the same slices alone or among fifty.
int64_t Scheduler::chunk_now() const {
  for (const std::optional<Lane>& lane : lanes_)
    if (lane && lane->job.output == JobOutput::Generate && lane->generated > 0) return decoding_prefill_chunk_;
  return prefill_chunk_;
}

int32_t Scheduler::drafts_per_lane() const {
  if (verify_rows_ <= 0 || draft_tokens_ == 0) return draft_tokens_;
  int32_t decoding = 0;  // lanes past their prompt: each runs a decode or a verify slice
  for (const std::optional<Lane>& lane : lanes_)
    decoding += lane && lane->generated > 0 && lane->computed < int64_t(lane->tokens.size());
  return std::clamp(verify_rows_ / std::max(decoding, 1) - 1, 0, draft_tokens_);
}

StepPlan Scheduler::plan() const {
  StepPlan plan;
  const int32_t draft_tokens = drafts_per_lane();
  const int64_t chunk = chunk_now();
  std::vector<PlannedSlice> prefills;
  int64_t prefill_tokens = 0;
  for (int32_t i = 0; i < num_lanes(); ++i) {
    if (!lanes_[i]) continue;
    const Lane& lane = *lanes_[i];
    if (lane.waiting_for_fork()) continue;
    const int64_t begin = lane.computed;
    // The first choice of n > 1 stops before the prompt's last token until it has forked (start_forks).
    const int64_t target = static_cast<int64_t>(lane.tokens.size()) - (lane.forks.empty() ? 0 : 1);
    const bool deciding = lane.job.output == JobOutput::Decide;
    if (begin >= target) {
      if (deciding) plan_rows(i, lane, chunk, prefills, prefill_tokens);
      continue;
    }
    if (lane.speculative && lane.generated > 0) {  // decoding: verify the last token and this round's drafts
      const int32_t drafts = drafts_this_round(draft_tokens, lane.job.request.max_new_tokens - lane.generated,
                                               lane.job.reservation - begin);
      if (drafts > 0) {
        PlannedSlice verify{i, begin, target, SliceKind::Verify, SliceOutput::Sample};
        verify.drafts = drafts;
        plan.slices.push_back(verify);
        continue;
      }
    }
    const int64_t prompt = static_cast<int64_t>(lane.job.request.prompt.size());
    const int64_t end = std::min(chunk_end(begin, target, chunk), cache_.next_snapshot(begin, prompt));
    const bool scoring = lane.job.output == JobOutput::PromptLogprobs;
    const bool forking = !lane.forks.empty();
    // A decision's context (its rows read the answers) and the first choice of n > 1 before its fork (every
    // choice samples after it) sample nothing.
    const SliceOutput output = scoring               ? SliceOutput::PromptLogprobs
                               : deciding || forking ? SliceOutput::None
                               : end == target       ? SliceOutput::Sample
                                                     : SliceOutput::None;
    // One new token is a decode slice even when it is the prompt's last (a decode graph runs it the same way).
    const bool decode = end - begin == 1 && !scoring && !deciding && !forking;
    PlannedSlice slice{i, begin, end, decode ? SliceKind::Decode : SliceKind::Prefill, output};
    if (slice.kind == SliceKind::Decode)
      plan.slices.push_back(slice);
    else
      add_prefill(slice, chunk, prefills, prefill_tokens);
  }
  plan.slices.insert(plan.slices.end(), prefills.begin(), prefills.end());
  return plan;
}

void Scheduler::plan_rows(int32_t index, const Lane& lane, int64_t chunk, std::vector<PlannedSlice>& prefills,
                          int64_t& prefill_tokens) const {
  const int64_t context = static_cast<int64_t>(lane.tokens.size());
  for (size_t r = 0; r < lane.rows.size(); ++r) {
    const std::optional<DecisionRow>& row = lane.rows[r];
    if (!row) continue;
    const int64_t target = context + static_cast<int64_t>(lane.job.decision.questions[size_t(row->question)].suffix.size());
    const int64_t end = chunk_end(row->computed, target, chunk);
    PlannedSlice slice{index, row->computed, end, SliceKind::Prefill,
                       end == target ? SliceOutput::CandidateLogprobs : SliceOutput::None};
    slice.row = int32_t(r);
    add_prefill(slice, chunk, prefills, prefill_tokens);
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
  // A choice that ends before its fork: its share of the reserve stays with the first choice until that forks or
  // ends. The first choice cannot end before its forks (OutputProcessor::end_lane ends them first).
  if (lane.waiting_for_fork()) {
    std::vector<int32_t>& forks = lanes_[lane.fork_of]->forks;
    forks.erase(std::remove(forks.begin(), forks.end(), index), forks.end());
  }
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
