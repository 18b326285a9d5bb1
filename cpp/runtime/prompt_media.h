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

// A request's media after the tower ran: the rows and positions of any slice of its tokens.
class EncodedMedia {
 public:
  EncodedMedia(Model& model, std::shared_ptr<const PromptMedia> media, int64_t prompt_tokens);

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
