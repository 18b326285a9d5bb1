// What a caller asks of the engine and what it gets back: requests, events, usage and timings.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "runtime/prompt_media.h"
#include "runtime/sampler.h"

namespace ninfer {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_new_tokens = 256;
  std::vector<int32_t> stop_token_ids;  // generation ends when one is sampled; it is counted, not emitted
  // The caller supplies a token mask before each sampled token (Engine::provide_mask), e.g. from a grammar.
  bool constrained = false;
  // A constrained request whose caller can also answer for draft positions (MaskRequest::drafts, Engine::
  // provide_masks): it decodes speculatively like any other. Without it a constrained lane decodes plainly.
  bool masks_drafts = false;
  // A Progress event after each prefill chunk (what a UI shows while a long prompt is read); off by default, so
  // consumers that do not ask never see the extra kind of event.
  bool report_progress = false;
  // Images and videos in the prompt (null: text only); shared, so copying a request does not copy pixels.
  std::shared_ptr<const PromptMedia> media;
  // n > 1 (OpenAI's `n`): this many independent continuations of one prefill, 1..max_concurrency, each in a lane
  // of its own. Engine::submit returns the first's id; choice i has id + i and, with a seed, sampling seed + i.
  int32_t choices = 1;
};

// A decision job: one shared context, prefilled once and forked per question; each question continues it with its
// own suffix, and its answer is read at the suffix's last token over its candidate tokens only.
struct DecisionQuestion {
  std::vector<int32_t> suffix;      // at least one token
  std::vector<int32_t> candidates;  // the answer tokens, at least one
};

struct DecisionRequest {
  std::vector<int32_t> context;  // at least one token
  std::vector<DecisionQuestion> questions;
};

enum class FinishReason : uint8_t { None, Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens reused from the prefix cache (not computed by this request)
  int64_t generated_tokens = 0;
};

struct Timings {
  double queue_s = 0;          // submit -> admitted into a lane
  double ttft_s = 0;           // submit -> first token sampled
  double prefill_tokens_per_s = 0;  // prompt tokens computed (the cached ones not) over the time to compute them
  double decode_tokens_per_s = 0;  // tokens after the first over the time after the first
  double total_s = 0;
  int64_t draft_n = 0, draft_n_accepted = 0;  // speculative decoding: drafts verified and accepted (llama.cpp's)
};

// How far a request's prompt has been prefilled, after one of its prefill chunks.
struct PrefillProgress {
  int64_t total = 0;      // prompt tokens
  int64_t cached = 0;     // prompt tokens reused from the prefix cache, counted in `processed` too
  int64_t processed = 0;  // prompt tokens now in the request's cache, the cached ones included
  double elapsed_s = 0;   // since the prefill began (the request's admission into a lane)
};

enum class EventKind : uint8_t {
  Output,    // tokens and/or the finish
  Progress,  // `progress` only (GenerationRequest::report_progress); never the last event of a request
};
const char* event_kind_name(EventKind k);

// One step's news for one request. `finish` != None marks its last event, which carries usage and timings.
struct EngineEvent {
  uint64_t request_id = 0;
  EventKind kind = EventKind::Output;
  PrefillProgress progress;  // kind == Progress
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;                         // one per token when the request asked for logprobs
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // one list per token when top_logprobs > 0
  FinishReason finish = FinishReason::None;
  std::string error_type, error_message;  // finish == Error: the typed error's class name and message
  // A decision job's final event (finish Stop): per question, in order, the log-softmax over its candidates.
  std::vector<std::vector<float>> decision_logprobs;
  Usage usage;  // on the last event; a token event carries usage.cached_tokens only
  Timings timings;
};

// A constrained request is about to sample: its caller must answer with Engine::provide_mask. `new_tokens` are
// the tokens sampled since the previous mask request of that request (none for the first, right after prefill).
// A speculative round (GenerationRequest::masks_drafts) also carries its drafts: the caller may answer with
// Engine::provide_masks, masks for rows 0..j (j <= drafts.size()), mask i being the one after new_tokens and
// drafts[0, i). It gives fewer where it cannot speak for later rows (a draft its own mask forbids: that row's mask
// is still given, so the correction is drawn under it), and the engine then verifies only j drafts (0: the round
// is a plain step). The tokens the round emits are the next request's new_tokens, as with plain steps.
struct MaskRequest {
  uint64_t request_id = 0;
  std::vector<int32_t> new_tokens;
  std::vector<int32_t> drafts;
};

// What Engine::next_events hands the caller: finished steps' events and the masks the engine waits for.
struct EngineNews {
  std::vector<EngineEvent> events;
  std::vector<MaskRequest> mask_requests;
};

}  // namespace ninfer
