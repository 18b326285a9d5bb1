// Speculative decoding with the model's MTP head (qwen35-architecture.md section 6): each round the head drafts K
// tokens after a lane's last one, and the target verifies the last token and the drafts in one pass (a Verify
// slice of K + 1 rows). Lossless by construction: row i is computed exactly as a decode step would compute it (the
// CPU backend is batch-invariant, and a verify row runs the recurrent state as one decode step from the row before
// it, into its own step slot), and row i's token is drawn by the lane's own sampler from row i's logits with the
// history of the tokens before it, the very draw plain decoding would make. A draft is accepted when that draw
// equals it; the first draw that differs is the round's correction, and when every draft is accepted the last row
// gives a bonus token. With deterministic (argmax) drafts this is speculative sampling with a point-mass proposal:
// min(1, p/q) = p(draft), and the normalised residual of a rejection is p without the draft, which is what the
// draw gives when it differs. After the round the lane keeps the state of its last accepted row (a slot swap, no
// copy) and its KV past that row is simply overwritten later.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/cache_pools.h"
#include "model/model.h"
#include "runtime/cache_manager.h"
#include "runtime/sampler.h"

namespace ninfer {

inline constexpr int32_t kMaxDraftTokens = 5;

// A lane's drafting state.
struct LaneDrafts {
  // MTP positions [mtp_next, mtp_next + pending rows) have the target's final-normed hidden here and still need
  // their MTP KV row, which needs the token after each (MTP row p reads the hidden at p and token p + 1).
  int64_t mtp_next = 0;
  std::vector<float> pending_hidden;
  int64_t pending_rows(int64_t hidden_size) const { return int64_t(pending_hidden.size()) / hidden_size; }
  std::vector<int32_t> verify_tokens;     // this round's verify input: the last token, then the drafts
  int64_t drafted = 0, accepted = 0;      // over the request (llama.cpp's draft_n, draft_n_accepted)
};

// The drafts a lane verifies this round: `draft_tokens`, fewer when fewer tokens remain to generate (a round
// emits at most drafts + 1) or fewer positions remain reserved; 0 means a plain decode step.
int32_t drafts_this_round(int32_t draft_tokens, int64_t tokens_left, int64_t positions_left);

// The MTP head's side: its KV rows for the target's new hidden rows, then the drafts.
class Drafter {
 public:
  Drafter(Model& model, CachePools& pools);

  // Computes the MTP rows of every pending hidden row (the lane's `tokens` must hold the token after each), then,
  // when `drafts` > 0, drafts that many tokens after the last of `tokens` into d.verify_tokens (which starts with
  // that last token).
  void prepare(LaneDrafts& d, std::span<const int32_t> tokens, std::span<const int32_t> pages, int32_t drafts);

 private:
  Model& model_;
  CachePools& pools_;
  std::vector<int32_t> drafted_;
};

// The tokens a verify pass emits: rows of `logits` ([drafts + 1, vocab]) drawn in order by `sampler` with the
// history growing by each drawn token, until a draw differs from its row's draft (that draw is the last) or every
// row is drawn. Row i is drawn under masks[i] when there is one (a constrained lane: the caller's mask after the
// drafts before row i, so a draft its grammar forbids is never drawn, hence rejected; an empty one is no mask).
// Returns how many drafts were accepted (tokens.size() - 1).
int32_t verify_drafts(std::span<const float> logits, int64_t vocab, std::span<const int32_t> drafts,
                      std::span<const std::vector<uint32_t>> masks, Sampler& sampler, TokenHistory history,
                      std::vector<SampledToken>& tokens);

// verify_drafts for rows a device sampler drew all at once: row i with the history grown by the drafts before it
// (and its RNG counter by i), the draw plain decoding would make had drafts 0..i-1 been emitted. A counter-based
// draw has no state, so rows past the first rejection cost nothing but their draw. Same result as verify_drafts.
int32_t accept_drawn(std::span<const SampledToken> drawn, std::span<const int32_t> drafts,
                     std::vector<SampledToken>& tokens);

// The drafts a round checked (draft_n): the `verified` ones, and the next of `drafts` (every draft of the round)
// when `last_mask`, the mask of the round's last drawn row, forbids it: the grammar rejected it, so its row's draw,
// under that mask, is the correction.
int32_t drafts_checked(int32_t verified, std::span<const int32_t> drafts, std::span<const uint32_t> last_mask);

// After a verify round that accepted `accepted` drafts: the state of that row becomes the lane's (a slot swap).
void keep_accepted_state(SequenceCache& cache, int32_t accepted);

}  // namespace ninfer
