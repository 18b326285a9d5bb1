#include "runtime/output_processor.h"

#include <algorithm>

#include "errors.h"

namespace ninfer {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

OutputProcessor::OutputProcessor(Scheduler& scheduler, std::function<void(EngineEvent)> publish,
                                 std::function<void(JobOutput)> ended)
    : scheduler_(scheduler), publish_(std::move(publish)), ended_(std::move(ended)) {}

void OutputProcessor::absorb(const StepPlan& plan, const StepResult& result) {
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const int32_t lane = plan.slices[i].lane;
    if (!scheduler_.lane(lane)) continue;  // cancelled since the plan was made
    if (result.failed())
      end_lane(lane, FinishReason::Error, result.error_type, result.error_message);
    else if (plan.slices[i].row >= 0)
      absorb_row(plan.slices[i], result.slices[i]);
    else
      absorb_slice(plan.slices[i], result.slices[i]);
  }
}

void OutputProcessor::end_lane(int32_t index, FinishReason reason, const std::string& error_type,
                               const std::string& error_message) {
  // n > 1: the choices still waiting for this one's prefill end with it (cancelled, or its error).
  for (const std::vector<int32_t> waiting = scheduler_.lane(index)->forks; int32_t j : waiting)
    end_lane(j, reason, error_type, error_message);
  Lane& lane = *scheduler_.lane(index);
  const Clock::time_point now = Clock::now();
  EngineEvent ev;
  ev.request_id = lane.job.id;
  ev.finish = reason;
  ev.error_type = error_type;
  ev.error_message = error_message;
  const int64_t prompt = static_cast<int64_t>(lane.job.request.prompt.size());
  ev.usage = {prompt, lane.cached, lane.generated};
  ev.timings.draft_n = lane.drafts.drafted;
  ev.timings.draft_n_accepted = lane.drafts.accepted;
  ev.timings.queue_s = seconds(lane.admitted - lane.job.submitted);
  ev.timings.total_s = seconds(now - lane.job.submitted);
  if (lane.generated > 0) {
    ev.timings.ttft_s = seconds(lane.first_token - lane.job.submitted);
    ev.timings.prefill_tokens_per_s = (prompt - lane.cached) / std::max(1e-9, seconds(lane.first_token - lane.admitted));
    if (lane.generated > 1)
      ev.timings.decode_tokens_per_s = (lane.generated - 1) / std::max(1e-9, seconds(now - lane.first_token));
  }
  const JobOutput output = lane.job.output;
  const bool publishing = output != JobOutput::PromptLogprobs;
  if (output == JobOutput::Decide && reason == FinishReason::Stop) ev.decision_logprobs = std::move(lane.decision_logprobs);
  if (output == JobOutput::PromptLogprobs) {
    if (reason == FinishReason::Length)
      lane.job.score_result->set_value(std::move(lane.score_logprobs));
    else
      lane.job.score_result->set_exception(std::make_exception_ptr(EngineError(
          reason == FinishReason::Error ? error_message : std::string("scoring was cancelled"))));
  }
  scheduler_.finish(index);
  ++counters_.requests_finished;
  ended_(output);
  if (publishing) publish_(std::move(ev));
}

// A decision row's chunk: its answer once the suffix is in, then its fork goes back to the lane's reserve; the
// lane ends with its last answer.
void OutputProcessor::absorb_row(const PlannedSlice& slice, SliceResult result) {
  Lane& lane = *scheduler_.lane(slice.lane);
  DecisionRow& row = *lane.rows[size_t(slice.row)];
  counters_.tokens_prefilled += slice.end - slice.begin;
  row.computed = slice.end;
  if (slice.output != SliceOutput::CandidateLogprobs) return;
  lane.decision_logprobs[size_t(row.question)] = std::move(result.candidate_logprobs);
  scheduler_.finish_row(slice.lane, slice.row);
  if (++lane.answered == static_cast<int32_t>(lane.job.decision.questions.size()))
    end_lane(slice.lane, FinishReason::Stop);
}

void OutputProcessor::absorb_slice(const PlannedSlice& slice, const SliceResult& result) {
  Lane& lane = *scheduler_.lane(slice.lane);
  lane.drafts.pending_hidden.insert(lane.drafts.pending_hidden.end(), result.hidden.begin(), result.hidden.end());
  if (slice.kind == SliceKind::Verify) {
    if (!ended_by_mask(lane, slice.lane)) absorb_verified(lane, slice, result);
    return;
  }
  counters_.tokens_prefilled += slice.end - slice.begin;
  lane.computed = slice.end;
  scheduler_.commit(slice.lane);  // only a completed pass's blocks become reusable
  if (slice.output == SliceOutput::PromptLogprobs) {
    lane.score_logprobs.insert(lane.score_logprobs.end(), result.prompt_logprobs.begin(),
                               result.prompt_logprobs.end());
    if (slice.end == static_cast<int64_t>(lane.tokens.size())) end_lane(slice.lane, FinishReason::Length);
    return;
  }
  report_progress(lane, slice);
  if (slice.output != SliceOutput::Sample) return;  // more prompt to prefill
  if (!ended_by_mask(lane, slice.lane)) take_token(lane, slice.lane, *result.token);
}

// The caller's answer to the lane's mask request ends it instead of letting it sample (it sampled nothing).
bool OutputProcessor::ended_by_mask(const Lane& lane, int32_t index) {
  if (!lane.mask.error.empty())
    end_lane(index, FinishReason::Error, "EngineError", lane.mask.error);
  else if (lane.mask.allows_none)
    end_lane(index, FinishReason::Error, "EngineError", "the request's token mask allows no token");
  else
    return false;
  return true;
}

// A verify round: the lane keeps the cache of its last token and the accepted drafts, then takes the round's
// tokens one by one (a stop token or the length ends it there, so nothing past either is emitted).
void OutputProcessor::absorb_verified(Lane& lane, const PlannedSlice& slice, const SliceResult& result) {
  const int32_t accepted = int32_t(result.verified.size()) - 1;
  lane.computed = slice.begin + accepted + 1;
  keep_accepted_state(lane.cache, accepted);
  lane.drafts.drafted += result.drafts_checked;
  lane.drafts.accepted += accepted;
  counters_.draft_tokens += result.drafts_checked;
  counters_.draft_tokens_accepted += accepted;
  for (const SampledToken& token : result.verified) {
    take_token(lane, slice.lane, token);
    if (!scheduler_.lane(slice.lane)) return;  // it ended (this round's blocks are not published)
  }
  // Once the accepted tokens are in lane.tokens: commit publishes blocks by their tokens. (A frontier snapshot
  // is taken only when a round ends on a block boundary.)
  scheduler_.commit(slice.lane);
}

void OutputProcessor::take_token(Lane& lane, int32_t index, const SampledToken& s) {
  if (lane.job.request.constrained) lane.mask.unreported.push_back(s.token);
  if (lane.generated++ == 0) lane.first_token = Clock::now();
  ++counters_.tokens_generated;
  lane.history.add_generated(s.token);
  const GenerationRequest& req = lane.job.request;
  const bool stop = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), s.token) != req.stop_token_ids.end();
  if (!stop) {
    lane.tokens.push_back(s.token);
    EngineEvent ev;
    ev.request_id = lane.job.id;
    ev.tokens = {s.token};
    ev.usage.cached_tokens = lane.cached;  // known since admission: what /slots shows while it runs
    if (req.sampling.logprobs || req.sampling.top_logprobs > 0) ev.logprobs = {s.logprob};
    if (req.sampling.top_logprobs > 0) ev.top_logprobs = {s.top};
    publish_(std::move(ev));
  }
  if (stop)
    end_lane(index, FinishReason::Stop);
  else if (lane.generated >= req.max_new_tokens || static_cast<int64_t>(lane.tokens.size()) >= lane.job.reservation)
    end_lane(index, FinishReason::Length);
}

// A Progress event when the slice was a prefill chunk of a lane that asked for them: published before the token
// its last chunk samples, so a consumer sees every chunk's progress first.
void OutputProcessor::report_progress(const Lane& lane, const PlannedSlice& slice) {
  const int64_t prompt = static_cast<int64_t>(lane.job.request.prompt.size());
  if (!lane.job.request.report_progress || slice.begin >= prompt) return;
  EngineEvent ev;
  ev.request_id = lane.job.id;
  ev.kind = EventKind::Progress;
  ev.progress.total = prompt;
  ev.progress.cached = lane.cached;
  ev.progress.processed = std::min(slice.end, prompt);
  ev.progress.elapsed_s = seconds(Clock::now() - lane.admitted);
  publish_(std::move(ev));
}

}  // namespace ninfer
