#include "model/vision_tower.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/linear.h"
#include "errors.h"

namespace ninfer {
namespace {

constexpr float kLayerNormEps = 1e-6f;

int64_t element_bytes(const TensorView& t) {
  switch (t.encoding) {
    case Encoding::F32: return 4;
    case Encoding::F16:
    case Encoding::BF16: return 2;
    default: throw ArtifactError(t.name + ": the vision tower takes f32, f16 or bf16 weights, not " +
                                 std::string(encoding_name(t.encoding)));
  }
}

// Bilinear taps (align_corners=True) of target index `i` on an axis of `size` into a table axis of `side`: the two
// source indices and their weights, in f32 as the reference forms them.
void axis_taps(int64_t i, int64_t size, int64_t side, int32_t taps[2], float weights[2]) {
  const float src = float(i) * float(side - 1) / float(std::max<int64_t>(size - 1, 1));
  const float floor = std::floor(src);
  for (int j = 0; j < 2; ++j) {
    taps[j] = int32_t(std::clamp<int64_t>(int64_t(floor) + j, 0, side - 1));
    weights[j] = std::max(0.0f, 1.0f - std::fabs(src - floor - float(j)));
  }
}

}  // namespace

VisionTower::VisionTower(const Artifact& artifact, const VisionConfig& config, Backend& backend)
    : config_(config), backend_(backend), scratch_(backend.memory()) {
  if (!backend.has_vision_ops())
    throw EngineError("this backend has no vision kernels: the vision tower runs on the CPU and CUDA backends");
  const int64_t d = config.hidden_size, inner = config.intermediate_size, merged = d * config.merge_unit();
  auto matrix = [&](const std::string& name, std::vector<int64_t> shape) {
    const TensorView* t = &artifact.tensor(name, shape);
    weight_bytes_ += t->numel() * element_bytes(*t);
    return t;
  };
  auto vector = [&](const std::string& name, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    const TensorView& t = artifact.tensor(name, {n});
    weight_bytes_ += t.numel() * element_bytes(t);
    cpu::dequantize(t, out.data());
    return out;
  };
  const TensorView* conv = matrix("visual.patch_embed.proj.weight",
                                  {d, config.in_channels, config.temporal_patch_size, config.patch_size,
                                   config.patch_size});
  patch_proj_ = *conv;
  patch_proj_.shape = {d, config.patch_values()};  // a dense kernel is already row-major over (c, t, y, x)
  patch_b_ = vector("visual.patch_embed.proj.bias", d);
  pos_embed_ = matrix("visual.pos_embed.weight", {config.num_position_embeddings, d});
  for (int32_t i = 0; i < config.depth; ++i) {
    const std::string p = "visual.blocks." + std::to_string(i) + ".";
    Block b;
    b.norm1_w = vector(p + "norm1.weight", d);
    b.norm1_b = vector(p + "norm1.bias", d);
    b.norm2_w = vector(p + "norm2.weight", d);
    b.norm2_b = vector(p + "norm2.bias", d);
    b.qkv = matrix(p + "attn.qkv.weight", {3 * d, d});
    b.qkv_b = vector(p + "attn.qkv.bias", 3 * d);
    b.proj = matrix(p + "attn.proj.weight", {d, d});
    b.proj_b = vector(p + "attn.proj.bias", d);
    b.fc1 = matrix(p + "mlp.linear_fc1.weight", {inner, d});
    b.fc1_b = vector(p + "mlp.linear_fc1.bias", inner);
    b.fc2 = matrix(p + "mlp.linear_fc2.weight", {d, inner});
    b.fc2_b = vector(p + "mlp.linear_fc2.bias", d);
    blocks_.push_back(std::move(b));
  }
  merger_norm_w_ = vector("visual.merger.norm.weight", d);
  merger_norm_b_ = vector("visual.merger.norm.bias", d);
  merger_fc1_ = matrix("visual.merger.linear_fc1.weight", {merged, merged});
  merger_fc1_b_ = vector("visual.merger.linear_fc1.bias", merged);
  merger_fc2_ = matrix("visual.merger.linear_fc2.weight", {config.out_hidden_size, merged});
  merger_fc2_b_ = vector("visual.merger.linear_fc2.bias", config.out_hidden_size);

  const int32_t quarter = config.head_dim() / 4;
  for (int32_t stream = 0; stream < 2; ++stream)
    for (int32_t i = 0; i < quarter; ++i) {
      inv_freq_.push_back(float(1.0 / std::pow(config.rope_theta, double(2 * i) / double(2 * quarter))));
      freq_stream_.push_back(uint8_t(stream));
    }
}

void VisionTower::check_grids(std::span<const VisionGrid> grids, int64_t patch_rows) const {
  int64_t total = 0;
  const int32_t m = config_.spatial_merge_size;
  for (size_t i = 0; i < grids.size(); ++i) {
    const VisionGrid& g = grids[i];
    if (g.t <= 0 || g.h <= 0 || g.w <= 0 || g.h % m != 0 || g.w % m != 0)
      throw EngineError("vision grid " + std::to_string(i) + " (" + std::to_string(g.t) + ", " +
                        std::to_string(g.h) + ", " + std::to_string(g.w) +
                        ") must be positive with h and w multiples of " + std::to_string(m));
    total += g.patches();
  }
  if (total != patch_rows)
    throw EngineError("the vision grids hold " + std::to_string(total) + " patches, the input " +
                      std::to_string(patch_rows));
}

void VisionTower::prepare_tables(std::span<const VisionGrid> grids) {
  const int64_t side = std::lround(std::sqrt(double(config_.num_position_embeddings)));
  const int32_t m = config_.spatial_merge_size;
  positions_.clear();
  taps_.clear();
  tap_weights_.clear();
  segments_.clear();
  int64_t row0 = 0;
  for (const VisionGrid& g : grids) {
    for (int32_t t = 0; t < g.t; ++t) {
      segments_.push_back({row0, int64_t(g.h) * g.w});
      row0 += int64_t(g.h) * g.w;
      // Patches come in merge-block order: block (br, bc), then (ir, ic) inside it.
      for (int64_t k = 0; k < int64_t(g.h) * g.w; ++k) {
        const int64_t in_col = k % m, in_row = (k / m) % m, block = k / (m * m);
        const int64_t row = (block / (g.w / m)) * m + in_row, col = (block % (g.w / m)) * m + in_col;
        positions_.push_back(row);
        positions_.push_back(col);
        int32_t rt[2], ct[2];
        float rw[2], cw[2];
        axis_taps(row, g.h, side, rt, rw);
        axis_taps(col, g.w, side, ct, cw);
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b) {
            taps_.push_back(int32_t(rt[a] * side + ct[b]));
            tap_weights_.push_back(rw[a] * cw[b]);
          }
      }
    }
  }
}

void VisionTower::encode(std::span<const float> patches, std::span<const VisionGrid> grids,
                         std::vector<float>& out) {
  const int64_t pv = config_.patch_values(), d = config_.hidden_size;
  if (int64_t(patches.size()) % pv != 0)
    throw EngineError("vision patches: " + std::to_string(patches.size()) + " values are not rows of " +
                      std::to_string(pv));
  const int64_t rows = int64_t(patches.size()) / pv;
  check_grids(grids, rows);
  prepare_tables(grids);
  backend_.bind_calling_thread();
  MemoryResource& memory = backend_.memory();

  float* input = scratch_.get(Buf::VisionPatches, rows * pv);
  memory.from_host(input, patches.data(), patches.size() * sizeof(float));
  float* hidden = scratch_.get(Buf::VisionHidden, rows * d);
  backend_.linear(input, rows, patch_proj_, hidden, patch_b_.data());
  backend_.add_embedding_mix(taps_.data(), tap_weights_.data(), rows, 4, *pos_embed_, hidden);
  for (const Block& b : blocks_) block(b, rows, hidden);

  const int64_t merged_rows = rows / config_.merge_unit(), merged = d * config_.merge_unit();
  float* normed = scratch_.get(Buf::VisionNormed, rows * d);
  backend_.layernorm(hidden, rows, d, merger_norm_w_.data(), merger_norm_b_.data(), kLayerNormEps, normed);
  // Four consecutive patches (one merge block) are one row of `merged` values: the normed buffer read as such.
  float* inner = scratch_.get(Buf::VisionMerged, merged_rows * merged);
  backend_.linear(normed, merged_rows, *merger_fc1_, inner, merger_fc1_b_.data());
  backend_.gelu(inner, merged_rows * merged, GeluKind::Erf, inner);
  float* result = scratch_.get(Buf::VisionOut, merged_rows * config_.out_hidden_size);
  backend_.linear(inner, merged_rows, *merger_fc2_, result, merger_fc2_b_.data());
  out.resize(size_t(merged_rows * config_.out_hidden_size));
  memory.to_host(out.data(), result, out.size() * sizeof(float));
}

void VisionTower::block(const Block& b, int64_t rows, float* hidden) {
  const int64_t d = config_.hidden_size, hd = config_.head_dim();
  const int32_t heads = config_.num_heads;
  float* normed = scratch_.get(Buf::VisionNormed, rows * d);
  float* qkv = scratch_.get(Buf::VisionQkv, rows * 3 * d);
  float* attn = scratch_.get(Buf::VisionAttn, rows * d);
  backend_.layernorm(hidden, rows, d, b.norm1_w.data(), b.norm1_b.data(), kLayerNormEps, normed);
  backend_.linear(normed, rows, *b.qkv, qkv, b.qkv_b.data());
  // qkv rows are [q | k | v], each `heads` heads of hd values; the rotary spans the whole head.
  const RopeSpec rope{RopePairing::Half, int32_t(hd), inv_freq_.data(), 2, freq_stream_.data()};
  backend_.rope(qkv, rows, heads, hd, 3 * d, positions_.data(), rope);
  backend_.rope(qkv + d, rows, heads, hd, 3 * d, positions_.data(), rope);
  backend_.segment_attention(qkv, qkv + d, qkv + 2 * d, 3 * d, segments_, heads, int32_t(hd),
                             float(1.0 / std::sqrt(double(hd))), attn);
  backend_.linear(attn, rows, *b.proj, normed, b.proj_b.data());
  backend_.add(hidden, normed, rows * d);

  float* mlp = scratch_.get(Buf::VisionMlp, rows * config_.intermediate_size);
  backend_.layernorm(hidden, rows, d, b.norm2_w.data(), b.norm2_b.data(), kLayerNormEps, normed);
  backend_.linear(normed, rows, *b.fc1, mlp, b.fc1_b.data());
  backend_.gelu(mlp, rows * config_.intermediate_size, GeluKind::Tanh, mlp);
  backend_.linear(mlp, rows, *b.fc2, normed, b.fc2_b.data());
  backend_.add(hidden, normed, rows * d);
}

}  // namespace ninfer
