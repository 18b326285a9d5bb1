// A request's images and videos: the vision tower's input for each, where its placeholder tokens sit in the
// prompt, and the prompt's M-RoPE positions. The frontend computes all of it (python/ninfer/frontend/
// vision_prompt.py); the engine checks it against the prompt at submit, runs the tower when the request's prefill
// begins (EncodedMedia), and hands each prefill slice its rows and positions.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/vision_tower.h"

namespace ninfer {

struct ForwardItem;
struct EmbeddingRows;
class Model;

struct MediaInput {
  VisionGrid grid;
  std::vector<float> patches;         // [grid.patches(), patch values], in the preprocessor's order
  std::vector<int64_t> group_starts;  // prompt index of each temporal group's first placeholder (grid.t of them)
};

struct PromptMedia {
  std::vector<MediaInput> items;
  std::vector<int64_t> mrope_positions;  // [prompt tokens][3]: (t, h, w) of every prompt token
  int64_t rope_delta = 0;                // a token after the prompt at index i has position i + rope_delta
};

// Throws EngineError naming the first thing that does not fit: media without a loaded tower, a grid or patch
// count the tower cannot take, a placeholder run that is not the grid's pad tokens, pad tokens of no medium,
// positions that are not [prompt tokens][3].
void check_prompt_media(const PromptMedia& media, std::span<const int32_t> prompt, const VisionConfig* vision);

// What names a medium's effect on the model: a 64-bit hash of the tower's exact input (the grid and every patch
// value's bits, after decoding, resizing and normalisation), so the same picture sent again (in any file format
// that decodes to the same pixels) matches and any other picture does not, barring a 2^-64 collision.
uint64_t media_content_hash(const MediaInput& item);

// The prefix cache's salt of each 64-token block of the prompt (PrefixCache::match): 0 for a block without vision
// placeholders, else a hash of, for each placeholder in it, its medium's content hash, which of the medium's rows
// it takes and its M-RoPE position. The hash chain carries a block's salt into every block after it; a text
// token's position follows from the positions before it (one past the highest), so the placeholders' positions
// name the text's too. Placeholders outside the prompt are skipped (check_prompt_media refuses such media).
// `merge_unit`: the tower's rows per placeholder group are h * w / merge_unit (VisionConfig::merge_unit).
std::vector<uint64_t> media_block_salts(const PromptMedia& media, int64_t prompt_tokens, int32_t merge_unit);

// A request's media after the tower ran: the rows and positions of any slice of its tokens.
class EncodedMedia {
 public:
  // Runs the tower on the media with placeholders at or after `first_computed` (those before it are in the
  // request's cached prefix: their rows are never needed).
  EncodedMedia(Model& model, std::shared_ptr<const PromptMedia> media, int64_t prompt_tokens, int64_t first_computed);

  // Sets the media fields of `item`, which forwards tokens [begin, end) of the request: the rows of the
  // placeholders among them (into `rows`) and their M-RoPE positions (into `positions`; tokens after the prompt
  // get index + rope_delta). Both vectors must outlive the pass.
  void fill(ForwardItem& item, int64_t begin, int64_t end, std::vector<EmbeddingRows>& rows,
            std::vector<int64_t>& positions) const;

 private:
  struct Run {
    int64_t start = 0, count = 0, row = 0;  // prompt tokens [start, start + count) take rows [row, row + count)
  };
  std::shared_ptr<const PromptMedia> media_;
  int64_t prompt_tokens_ = 0, width_ = 0;
  std::vector<float> rows_;
  std::vector<Run> runs_;
};

}  // namespace ninfer
