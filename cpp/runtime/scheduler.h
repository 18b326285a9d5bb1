// The scheduler: lanes, the FIFO admission queue and the plan of each step. Backend-neutral: it holds caches
// only through the CacheManager and never includes the model.
//
// NOTE (counter model, after vLLM v1): a lane knows `tokens` (prompt + sampled so far) and `computed` (how many of
// them are in its cache). Each step forwards a slice of the uncomputed tokens; when none are left the lane samples.
// Prefill, decode, and later resume and MTP verification are the one rule, with no phase flags.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/cache_manager.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"
#include "runtime/step_plan.h"

namespace ninfer {

using Clock = std::chrono::steady_clock;

// What a job produces: sampled tokens (events), the prompt's per-token logprobs (a future), or a decision's
// per-question candidate logprobs (its final event).
enum class JobOutput : uint8_t { Generate, PromptLogprobs, Decide };

// A request waiting in the queue or running in a lane.
struct Job {
  uint64_t id = 0;
  GenerationRequest request;
  JobOutput output = JobOutput::Generate;
  std::shared_ptr<std::promise<std::vector<float>>> score_result;  // output PromptLogprobs: the result goes here
  int64_t reservation = 0;  // KV tokens reserved at admission: prompt + max_new_tokens, capped at max_context
  // The prefix cache's salt of each prompt block (media_block_salts; empty for a text prompt: all 0)
  std::vector<uint64_t> block_salts;
  Clock::time_point submitted;
  // output Decide: the request (its context is also request.prompt), how many questions run at once, and the
  // pages those rows need beyond the context (reserved at admission with `rows` state slots)
  DecisionRequest decision;
  int32_t decision_rows = 0;
  int64_t decision_pages = 0;
  // request.choices > 1: the pages each choice after the first needs of its own (its fork of the prompt but its
  // last token: the partly filled page and the rest of its reservation), reserved at admission with a slot each
  int64_t fork_pages = 0;
  bool holds(uint64_t request_id) const { return request_id >= id && request_id - id < uint64_t(request.choices); }
};

// One question of a decision lane in flight: a fork of the lane's context continued by the question's suffix.
struct DecisionRow {
  int32_t question = 0;
  SequenceCache cache;
  int64_t computed = 0;  // tokens of context + suffix in `cache`
};

// A constrained lane's side of the mask exchange with the caller (Engine::provide_mask, provide_masks).
struct LaneMask {
  std::vector<int32_t> unreported;  // tokens sampled since the last mask request
  bool pending = false;             // requested for this step, not answered yet
  size_t row_limit = 1;             // the rows the pending request may be answered for (its drafts + 1)
  // The answer: a mask per row it speaks for, from the step's first (one for a plain step; a verify round verifies
  // at most rows.size() - 1 drafts); an empty row is unconstrained. Bit t % 32 of word t / 32 allows token t.
  std::vector<std::vector<uint32_t>> rows;
  bool allows_none = false;         // the first row allows no token (the request ends with an error)
  std::string error;                // the caller could not compute the mask: the request ends with this error
  // The answer ends the request instead of letting it sample.
  bool ends_request() const { return !error.empty() || allows_none; }
};

struct Lane {
  Job job;
  SequenceCache cache;
  int64_t computed = 0;         // tokens[0, computed) are in the cache
  int64_t cached = 0;           // prompt tokens the cache held at admission (not computed by this job)
  std::vector<int32_t> tokens;  // prompt, then every sampled token
  int64_t generated = 0;        // sampled tokens, stop token included
  std::optional<Sampler> sampler;
  TokenHistory history;
  LaneMask mask;                      // used only when job.request.constrained
  std::vector<float> score_logprobs;  // output PromptLogprobs: logprob of tokens[i + 1], filled chunk by chunk
  // It drafts with the MTP head (a generation lane without media, spec on, unconstrained or with a caller that
  // masks drafts: GenerationRequest::masks_drafts)
  bool speculative = false;
  LaneDrafts drafts;                          // speculative lanes only
  std::shared_ptr<const EncodedMedia> media;  // the prompt's media rows, encoded at its first slice
  Clock::time_point admitted, first_token;
  // output Decide: the rows in flight (job.decision_rows places), the reserve they fork from, the next question
  // to start, and each question's answer once read
  std::vector<std::optional<DecisionRow>> rows;
  CacheReserve reserve;
  int32_t next_question = 0, answered = 0;
  int64_t decision_held_pages = 0;  // context pages + reserve, for the decision share's accounting
  std::vector<std::vector<float>> decision_logprobs;
  // n > 1: the first choice's lane prefills the prompt but its last token, then forks into the lanes of the other
  // choices (`forks`, each waiting till then with `fork_of` = this lane), and every choice computes the last token
  // itself and samples its own stream. The forks' pages and slots wait in `reserve`.
  std::vector<int32_t> forks;
  int32_t fork_of = -1;
  bool waiting_for_fork() const { return fork_of >= 0; }
};

class Scheduler {
 public:
  // `decision_lanes` more lanes, after the others, run decision jobs only (their own queue too), and chat jobs
  // leave `decision_pages` KV pages (less what decision jobs hold) free for them: chat traffic cannot starve
  // decisions, nor decisions chat. `draft_tokens` > 0: speculative decoding with that many MTP drafts per round
  // (each speculative lane then holds draft_tokens + 1 step slots for the verify pass's states). `verify_rows` > 0:
  // a step's decode and verify rows stay within that many (the backend's decode path, DeviceRuntime::
  // decode_path_rows): each decoding lane then drafts at most verify_rows / lanes - 1 tokens, none from that many
  // lanes on, since a pass of more rows costs several decode passes.
  // `decoding_prefill_chunk` (0: prefill_chunk; the engine resolves it to at most prefill_chunk) is the chunk and
  // the step's prefill budget while some lane decodes (EngineOptions::decoding_prefill_chunk).
  Scheduler(int32_t num_lanes, int32_t decision_lanes, int64_t prefill_chunk, int64_t decision_pages,
            CacheManager& cache, int32_t draft_tokens = 0, int32_t verify_rows = 0,
            int64_t decoding_prefill_chunk = 0);

  void enqueue(Job job) { (job.output == JobOutput::Decide ? decision_queue_ : queue_).push_back(std::move(job)); }
  // Removes a queued job and returns it; nullopt when `id` is not queued.
  std::optional<Job> remove_queued(uint64_t id);
  // Moves queue heads into free lanes while their reservation fits; FIFO: a head that does not fit waits, and
  // so does everything behind it. Then starts the next questions of decision lanes whose context is in. Returns
  // the lanes filled.
  std::vector<int32_t> admit();
  StepPlan plan() const;
  // Hands what lane `index` has computed (Lane::computed) to the cache manager: its new whole blocks, and the
  // state snapshot due at that position.
  void commit(int32_t index);
  // Frees lane `index` and its cache (a decision lane's rows and reserve too) at once.
  void finish(int32_t index);
  // A decision row whose answer was read: its fork goes back to the lane's reserve.
  void finish_row(int32_t index, int32_t row);

  std::optional<Lane>& lane(int32_t index) { return lanes_[index]; }
  int32_t lane_of(uint64_t id) const;  // -1 when no lane runs it
  int32_t num_lanes() const { return static_cast<int32_t>(lanes_.size()); }  // decision lanes included
  int32_t num_busy_lanes() const;  // decision lanes included
  int32_t num_chat_lanes() const { return chat_lanes_; }
  int32_t num_busy_chat_lanes() const;
  int64_t num_queued() const { return static_cast<int64_t>(queue_.size() + decision_queue_.size()); }
  bool idle() const { return num_busy_lanes() == 0; }
  // Every queued job (close() ends them).
  std::vector<const Job*> queued() const;

 private:
  void admit_from(std::deque<Job>& queue, int32_t first_lane, int32_t end_lane, std::vector<int32_t>& filled);
  void start_rows(Lane& lane);
  void start_forks(Lane& lane);
  void plan_rows(int32_t index, const Lane& lane, int64_t chunk, std::vector<PlannedSlice>& prefills,
                 int64_t& prefill_tokens) const;
  int64_t chunk_now() const;  // this step's prefill chunk: decoding_prefill_chunk_ while some lane decodes

  int64_t decision_pages_unused() const;  // the decision share's pages no decision job holds
  int32_t drafts_per_lane() const;        // draft_tokens_ within verify_rows_ for this step's decoding lanes

  int64_t prefill_chunk_, decoding_prefill_chunk_;
  int32_t draft_tokens_, verify_rows_;
  CacheManager& cache_;
  int32_t chat_lanes_;
  int64_t decision_pages_;
  std::vector<std::optional<Lane>> lanes_;
  std::deque<Job> queue_, decision_queue_;
};

}  // namespace ninfer
