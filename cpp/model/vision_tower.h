// The Qwen3.5 vision tower (architecture reference §7.1-7.3): patch embedding, the learned position table
// resampled to each grid, ViT blocks with 2-D rotary attending within one image or one video frame group, and the
// 2x2 merger into the decoder's width. Built from backend ops only, like the decoder.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "artifact/artifact.h"
#include "backend/backend.h"
#include "model/config.h"
#include "model/scratch.h"

namespace ninfer {

// One image (t = 1) or video (t temporal groups) in patch units: h x w patches per group, in the preprocessor's
// merge-block order (each 2x2 block is four consecutive patches).
struct VisionGrid {
  int32_t t = 0, h = 0, w = 0;
  int64_t patches() const { return int64_t(t) * h * w; }
};

class VisionTower {
 public:
  // Looks up and checks every `visual.*` tensor; throws ArtifactError naming the tensor, EngineError when the
  // backend has no vision kernels.
  VisionTower(const Artifact& artifact, const VisionConfig& config, Backend& backend);

  const VisionConfig& config() const { return config_; }
  // Decoder tokens (merger outputs) of a grid.
  int64_t tokens(const VisionGrid& g) const { return g.patches() / config_.merge_unit(); }
  // Bytes of the tower's weights in the artifact (what loading it adds to the memory plan).
  int64_t weight_bytes() const { return weight_bytes_; }

  // patches [sum of grid patches, config().patch_values()] (host) -> `out` [sum of tokens, out_hidden_size]
  // (host), grid after grid. Throws EngineError for a grid that does not fit the config or the patch count.
  void encode(std::span<const float> patches, std::span<const VisionGrid> grids, std::vector<float>& out);

 private:
  struct Block {
    std::vector<float> norm1_w, norm1_b, norm2_w, norm2_b, qkv_b, proj_b, fc1_b, fc2_b;
    const TensorView *qkv = nullptr, *proj = nullptr, *fc1 = nullptr, *fc2 = nullptr;
  };
  void check_grids(std::span<const VisionGrid> grids, int64_t patch_rows) const;
  void prepare_tables(std::span<const VisionGrid> grids);
  void block(const Block& b, int64_t rows, float* hidden);

  VisionConfig config_;
  Backend& backend_;
  Scratch scratch_;
  TensorView patch_proj_;  // the Conv3d kernel as the linear map it is on a flattened patch: [hidden, patch_values]
  std::vector<float> patch_b_;
  const TensorView* pos_embed_ = nullptr;
  std::vector<Block> blocks_;
  std::vector<float> merger_norm_w_, merger_norm_b_, merger_fc1_b_, merger_fc2_b_;
  const TensorView *merger_fc1_ = nullptr, *merger_fc2_ = nullptr;
  int64_t weight_bytes_ = 0;

  // 2-D rotary: frequencies concat(inv, inv) over half the head, the first quarter from the row stream, the
  // second from the column stream.
  std::vector<float> inv_freq_;
  std::vector<uint8_t> freq_stream_;
  // Per-pass host tables: (row, col) of each patch; the position table's 4 bilinear taps and weights per patch;
  // the attention segments.
  std::vector<int64_t> positions_;
  std::vector<int32_t> taps_;
  std::vector<float> tap_weights_;
  std::vector<RowSegment> segments_;
};

}  // namespace ninfer
