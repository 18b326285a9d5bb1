// A step as data: the plan the scheduler makes (which tokens of which lanes one forward pass computes, and what
// each slice must produce) and the result the step executor returns for it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sampler.h"

namespace ninfer {

enum class SliceKind : uint8_t {
  Prefill,  // several tokens (a prompt chunk), or any slice of a scoring job
  Decode,   // one token (the one sampled last step, or a prompt's last): a pass of only these can run as a graph
  Verify,   // speculative decoding: the last sampled token and `drafts` MTP drafts, one output row each
};

enum class SliceOutput : uint8_t {
  None,            // a prefill chunk with more prompt after it
  Sample,          // the next token, from the last row's logits
  PromptLogprobs,  // logprob of each next prompt token, from every row's logits (scoring)
  // Log-softmax over the question's candidate tokens at the last row, projected onto those lm-head rows alone
  // (a decision readout: no full-vocabulary logits)
  CandidateLogprobs,
};

// Forward tokens[begin, end) of lane `lane`.
struct PlannedSlice {
  int32_t lane = 0;
  int64_t begin = 0, end = 0;
  SliceKind kind = SliceKind::Prefill;
  SliceOutput output = SliceOutput::None;
  int32_t drafts = 0;  // kind Verify: the drafts after tokens[begin] (the slice forwards drafts + 1 tokens)
  int32_t row = -1;  // a decision lane's question row (a fork of the lane's context); -1: the lane's own sequence
};

struct StepPlan {
  std::vector<PlannedSlice> slices;  // decode slices first-come, then prefill chunks; all in ONE forward
};

struct SliceResult {
  std::optional<SampledToken> token;  // output Sample, unless the lane's mask left nothing to sample
  std::vector<float> prompt_logprobs;  // output PromptLogprobs: one per row with a next prompt token
  // Kind Verify: every token the round emits (the accepted drafts, then the correction or bonus token).
  std::vector<SampledToken> verified;
  // Kind Verify: the drafts checked (draft_n): the plan's, fewer where the caller's masks stop (speculative.h)
  int32_t drafts_checked = 0;
  // Speculative lanes: the target's final-normed hidden of the rows the lane keeps (the MTP head's next input).
  std::vector<float> hidden;
  std::vector<float> candidate_logprobs;  // output CandidateLogprobs: one per candidate, in the question's order
};

struct StepResult {
  std::vector<SliceResult> slices;  // one per plan slice
  // The pass or the sampling failed: every slice's lane ends with this error (type "EngineError" or "NinferError").
  std::string error_type, error_message;
  bool failed() const { return !error_type.empty(); }
};

}  // namespace ninfer
