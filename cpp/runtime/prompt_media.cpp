#include "runtime/prompt_media.h"

#include <algorithm>
#include <string>

#include "cache/kv_dtype.h"
#include "errors.h"
#include "model/model.h"
#include "runtime/content_hash.h"

namespace ninfer {
namespace {

// "media i (t, h, w)", appended piece by piece (GCC 12 warns falsely on a chain of string + here).
std::string media_name(size_t i, const VisionGrid& g) {
  std::string s = "media ";
  s += std::to_string(i);
  s += " (";
  s += std::to_string(g.t);
  s += ", ";
  s += std::to_string(g.h);
  s += ", ";
  s += std::to_string(g.w);
  s += ")";
  return s;
}

}  // namespace

void check_prompt_media(const PromptMedia& media, std::span<const int32_t> prompt, const VisionConfig* vision) {
  if (media.items.empty()) return;
  if (!vision)
    throw EngineError("this engine runs without the vision tower: requests with images or video need --vision");
  const int64_t n = int64_t(prompt.size());
  if (int64_t(media.mrope_positions.size()) != 3 * n)
    throw EngineError("media: M-RoPE positions must be [" + std::to_string(n) + " prompt tokens][3], got " +
                      std::to_string(media.mrope_positions.size()) + " values");
  const int32_t m = vision->spatial_merge_size;
  std::vector<char> claimed(size_t(n), 0);
  for (size_t i = 0; i < media.items.size(); ++i) {
    const MediaInput& item = media.items[i];
    const VisionGrid& g = item.grid;
    const std::string name = media_name(i, g);
    if (g.t <= 0 || g.h <= 0 || g.w <= 0 || g.h % m || g.w % m)
      throw EngineError(name + ": the grid must be positive with h and w multiples of " + std::to_string(m));
    if (int64_t(item.patches.size()) != g.patches() * vision->patch_values())
      throw EngineError(name + ": " + std::to_string(item.patches.size()) + " patch values, the grid needs " +
                        std::to_string(g.patches() * vision->patch_values()));
    if (int64_t(item.group_starts.size()) != g.t)
      throw EngineError(name + ": " + std::to_string(item.group_starts.size()) + " placeholder runs for " +
                        std::to_string(g.t) + " temporal groups");
    const int64_t per_group = int64_t(g.h) * g.w / (int64_t(m) * m);
    for (const int64_t start : item.group_starts) {
      if (start < 0 || start + per_group > n)
        throw EngineError(name + ": placeholders at " + std::to_string(start) + " run past the prompt");
      for (int64_t t = start; t < start + per_group; ++t) {
        if (prompt[size_t(t)] != vision->image_token_id && prompt[size_t(t)] != vision->video_token_id)
          throw EngineError(name + ": prompt token " + std::to_string(t) + " is not an image or video pad token");
        if (claimed[size_t(t)]++) throw EngineError(name + ": its placeholders overlap another medium's");
      }
    }
  }
  for (int64_t t = 0; t < n; ++t)
    if (!claimed[size_t(t)] && (prompt[size_t(t)] == vision->image_token_id || prompt[size_t(t)] == vision->video_token_id))
      throw EngineError("prompt token " + std::to_string(t) + " is a vision pad token of no medium");
}

uint64_t media_content_hash(const MediaInput& item) {
  const int64_t grid[3] = {item.grid.t, item.grid.h, item.grid.w};
  const uint64_t seed = hash_bytes(std::as_bytes(std::span(grid)));
  return hash_bytes(std::as_bytes(std::span(item.patches)), seed);
}

std::vector<uint64_t> media_block_salts(const PromptMedia& media, int64_t prompt_tokens, int32_t merge_unit) {
  std::vector<uint64_t> salts;
  const bool positioned = int64_t(media.mrope_positions.size()) == 3 * prompt_tokens;
  for (const MediaInput& item : media.items) {
    if (item.group_starts.empty()) continue;
    const uint64_t content = media_content_hash(item);
    const int64_t per_group = int64_t(item.grid.h) * item.grid.w / std::max(1, merge_unit);
    int64_t row = 0;  // which of the medium's rows
    for (const int64_t start : item.group_starts)
      for (int64_t t = start; t < start + per_group; ++t, ++row) {
        if (t < 0 || t >= prompt_tokens) continue;
        const size_t block = size_t(t / kKvPageTokens);
        if (salts.size() <= block) salts.resize(block + 1, 0);
        uint64_t h = hash_mix(salts[block] ^ content);
        h = hash_mix(h + uint64_t(row));
        for (int64_t k = 0; positioned && k < 3; ++k) h = hash_mix(h + uint64_t(media.mrope_positions[size_t(t * 3 + k)]));
        salts[block] = h;
      }
  }
  return salts;
}

EncodedMedia::EncodedMedia(Model& model, std::shared_ptr<const PromptMedia> media, int64_t prompt_tokens,
                           int64_t first_computed)
    : media_(std::move(media)), prompt_tokens_(prompt_tokens), width_(model.config().hidden_size) {
  const int32_t unit = model.config().vision->merge_unit();
  const auto needed = [&](const MediaInput& item) {
    const int64_t per_group = int64_t(item.grid.h) * item.grid.w / unit;
    return std::any_of(item.group_starts.begin(), item.group_starts.end(),
                       [&](int64_t start) { return start + per_group > first_computed; });
  };
  std::vector<float> patches;
  std::vector<VisionGrid> grids;
  for (const MediaInput& item : media_->items) {
    if (!needed(item)) continue;
    patches.insert(patches.end(), item.patches.begin(), item.patches.end());
    grids.push_back(item.grid);
  }
  if (!grids.empty()) model.encode_vision(patches, grids, rows_);
  int64_t row = 0;
  for (const MediaInput& item : media_->items) {
    if (!needed(item)) continue;
    const int64_t per_group = int64_t(item.grid.h) * item.grid.w / unit;
    for (const int64_t start : item.group_starts) {
      runs_.push_back({start, per_group, row});
      row += per_group;
    }
  }
}

void EncodedMedia::fill(ForwardItem& item, int64_t begin, int64_t end, std::vector<EmbeddingRows>& rows,
                        std::vector<int64_t>& positions) const {
  rows.clear();
  positions.clear();
  for (const Run& r : runs_) {
    const int64_t from = std::max(begin, r.start), to = std::min(end, r.start + r.count);
    if (from < to) rows.push_back({from - begin, to - from, rows_.data() + (r.row + from - r.start) * width_});
  }
  item.embeddings = rows;
  if (begin >= prompt_tokens_) {  // generated text only: one stream suffices
    item.mrope_positions = nullptr;
    item.position_offset = media_->rope_delta;
    return;
  }
  for (int64_t t = begin; t < end; ++t)
    for (int64_t k = 0; k < 3; ++k)
      positions.push_back(t < prompt_tokens_ ? media_->mrope_positions[size_t(t * 3 + k)] : t + media_->rope_delta);
  item.mrope_positions = positions.data();
}

}  // namespace ninfer
