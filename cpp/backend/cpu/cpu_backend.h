// The CPU backend: host memory, OpenMP threads. Its ops are spread over files by job (norm.cpp, rope.cpp,
// attention.cpp, moe.cpp, gdn_ops.cpp, vision_ops.cpp, cpu_backend.cpp for matrices and elementwise ops).
#pragma once

#include <vector>

#include "backend/backend.h"

namespace ninfer::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int32_t threads) : threads_(threads) {}

  void bind_calling_thread() override;

  void linear(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias) override;
  void linear_shared_input(const float* x, int64_t rows, std::span<const LinearOut> outs) override;
  void embed(const int32_t* tokens, int64_t n, const TensorView& table, float* out) override;
  void embed_resident_ids(const int32_t* ids, int64_t n, const TensorView& table, float* out) override {
    embed(ids, n, table, out);  // host memory is the backend's
  }
  void gather_rows(const float* x, int64_t dim, const int64_t* rows, int64_t n, float* out) override;
  void row_dots(const float* rows, int64_t n, int64_t dim, const float* x, float* out) override;
  void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, const float* column_ids) override;

  void add(float* inout, const float* x, int64_t n) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void copy_columns(const float* x, int64_t rows, int64_t x_stride, int64_t cols, float* out) override;

  void add_rmsnorm(float* hidden, const float* delta, int64_t rows, int64_t dim, const float* w, NormKind kind,
                   float eps, float* out) override;
  void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, NormKind kind, float eps,
               float* out, int64_t out_stride) override;

  void rope(float* x, int64_t rows, int32_t heads, int64_t head_stride, int64_t row_stride, const int64_t* positions,
            const RopeSpec& rope) override;
  void kv_write(const float* k, const float* v, std::span<const SequenceRows> seqs, KvPool& pool,
                int32_t layer) override;
  void attention(const float* q, int64_t q_row_stride, int64_t q_head_stride, std::span<const SequenceRows> seqs,
                 const KvPool& pool, int32_t layer, const AttentionShape& shape, float* out) override;
  void sigmoid_gate(float* x, int64_t rows, int32_t heads, int32_t dim, const float* gate, int64_t gate_row_stride,
                    int64_t gate_head_stride) override;

  void moe_route(const float* logits, int64_t rows, int32_t experts, int32_t top_k, int32_t* ids,
                 float* weights) override;
  void moe_experts(const float* x, int64_t rows, int64_t hidden, const int32_t* ids, const float* weights,
                   int32_t top_k, const TensorView& gate, const TensorView& up, const TensorView& down,
                   const SharedExpertTerm& shared, float* out) override;

  void gdn_conv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape, const float* weight,
                StatePool& states, int32_t layer, float* out) override;
  void gdn_conv_qkv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                    const float* weight, StatePool& states, int32_t layer, float q_scale, float* q, float* k,
                    float* v) override;
  void l2norm_heads(const float* x, int64_t rows, int32_t heads, int32_t dim, int64_t x_stride, float scale,
                    float* out) override;
  void gdn_gates(const float* a, const float* b, int64_t rows, int32_t heads, const float* A_log,
                 const float* dt_bias, float* g, float* beta) override;
  void gdn_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                std::span<const SequenceRows> seqs, const GdnShape& shape, StatePool& states, int32_t layer,
                float* out) override;
  void gated_rmsnorm(const float* x, const float* z, int64_t rows, int32_t heads, int32_t dim, const float* w,
                     float eps, float* out) override;

  bool has_vision_ops() const override { return true; }
  void layernorm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                 float* out) override;
  void gelu(const float* x, int64_t n, GeluKind kind, float* out) override;
  void add_embedding_mix(const int32_t* ids, const float* weights, int64_t rows, int32_t taps,
                         const TensorView& table, float* inout) override;
  void segment_attention(const float* q, const float* k, const float* v, int64_t row_stride,
                         std::span<const RowSegment> segments, int32_t heads, int32_t head_dim, float scale,
                         float* out) override;

 private:
  int32_t threads_;
  // Scratch reused across calls (grown, never shrunk), so the hot loop does not allocate.
  std::vector<float> attn_scores_;          // one score row per thread
  std::vector<int32_t> attn_row_seq_;       // row -> index of its sequence
  std::vector<float> moe_x_, moe_gate_, moe_up_, moe_out_, moe_w_;  // one expert's gathered rows
  std::vector<int64_t> moe_rows_;
  std::vector<float> moe_probs_;             // one row's routing probabilities
  std::vector<int32_t> moe_order_;
  std::vector<float> gdn_conv_rows_;          // gdn_conv_qkv: the conv rows before the split
};

}  // namespace ninfer::cpu
