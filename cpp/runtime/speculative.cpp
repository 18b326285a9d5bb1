#include "runtime/speculative.h"

#include <algorithm>
#include <utility>

#include "errors.h"

namespace ninfer {
namespace {

// An MTP item: `n` rows from position `start`, logits of the last (the head's KV lives in the lane's pages).
ForwardItem mtp_item(const int32_t* next_tokens, int64_t n, int64_t start, std::span<const int32_t> pages) {
  ForwardItem item;
  item.tokens = next_tokens;
  item.n_tokens = n;
  item.start = start;
  item.pages = pages;
  return item;
}

// The tokens of a verify round: draw(row) for rows 0, 1, .. in order until a draw differs from its row's draft
// (that draw is the last) or every row is drawn. Returns how many drafts were accepted.
template <class Draw>
int32_t accept_in_order(std::span<const int32_t> drafts, std::vector<SampledToken>& tokens, Draw&& draw) {
  tokens.clear();
  for (size_t row = 0; row <= drafts.size(); ++row) {
    tokens.push_back(draw(row));
    if (row == drafts.size() || tokens.back().token != drafts[row]) break;
  }
  return int32_t(tokens.size()) - 1;
}

}  // namespace

int32_t drafts_this_round(int32_t draft_tokens, int64_t tokens_left, int64_t positions_left) {
  return int32_t(std::clamp<int64_t>(std::min(tokens_left, positions_left) - 1, 0, draft_tokens));
}

Drafter::Drafter(Model& model, CachePools& pools) : model_(model), pools_(pools) {}

void Drafter::prepare(LaneDrafts& d, std::span<const int32_t> tokens, std::span<const int32_t> pages,
                      int32_t drafts) {
  const int64_t h = model_.config().hidden_size;
  const int64_t rows = int64_t(d.pending_hidden.size()) / h;
  if (d.mtp_next + rows >= int64_t(tokens.size()))
    throw EngineError("MTP rows up to position " + std::to_string(d.mtp_next + rows - 1) + " need " +
                      std::to_string(d.mtp_next + rows + 1) + " tokens; the lane has " +
                      std::to_string(tokens.size()));
  d.verify_tokens.assign(1, tokens.back());
  if (rows == 0) {
    if (drafts > 0) throw EngineError("a lane drafts without the target's hidden row of its last token");
    return;
  }
  // The rows the target computed since, with the tokens after them; the last row drafts the first token, each
  // draft step the next (Model::mtp_draft).
  const int64_t last = d.mtp_next + rows - 1;  // the position of the target's last computed token
  if (drafts > 0 && last + 2 != int64_t(tokens.size()))
    throw EngineError("a lane drafts with " + std::to_string(tokens.size() - last - 2) + " tokens not yet verified");
  const ForwardItem item = mtp_item(tokens.data() + d.mtp_next + 1, rows, d.mtp_next, pages);
  model_.mtp_draft(d.pending_hidden.data(), item, pools_, drafts, drafted_);
  d.mtp_next += rows;
  d.pending_hidden.clear();
  d.verify_tokens.insert(d.verify_tokens.end(), drafted_.begin(), drafted_.end());
}

int32_t verify_drafts(std::span<const float> logits, int64_t vocab, std::span<const int32_t> drafts,
                      std::span<const std::vector<uint32_t>> masks, Sampler& sampler, TokenHistory history,
                      std::vector<SampledToken>& tokens) {
  std::vector<float> scratch;
  return accept_in_order(drafts, tokens, [&](size_t row) {
    if (row > 0) history.add_generated(drafts[row - 1]);  // the row before was accepted
    const std::span<const uint32_t> mask = row < masks.size() ? std::span(masks[row]) : std::span<const uint32_t>();
    return sampler.sample(masked_logits(logits.subspan(row * size_t(vocab), size_t(vocab)), mask, scratch), history);
  });
}

int32_t accept_drawn(std::span<const SampledToken> drawn, std::span<const int32_t> drafts,
                     std::vector<SampledToken>& tokens) {
  if (drawn.size() != drafts.size() + 1)
    throw EngineError("a verify round of " + std::to_string(drafts.size()) + " drafts drew " +
                      std::to_string(drawn.size()) + " rows");
  return accept_in_order(drafts, tokens, [&](size_t row) { return drawn[row]; });
}

int32_t drafts_checked(int32_t verified, std::span<const int32_t> drafts, std::span<const uint32_t> last_mask) {
  if (size_t(verified) >= drafts.size() || last_mask.empty()) return verified;
  const int32_t next = drafts[size_t(verified)];
  const bool forbidden = size_t(next >> 5) >= last_mask.size() || !((last_mask[size_t(next >> 5)] >> (next & 31)) & 1u);
  return verified + int32_t(forbidden);
}

void keep_accepted_state(SequenceCache& cache, int32_t accepted) {
  if (cache.state_slot >= 0) std::swap(cache.state_slot, cache.step_slots.at(size_t(accepted)));
}

}  // namespace ninfer
