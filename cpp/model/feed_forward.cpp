// The feed-forward block: dense SwiGLU, or the sparse MoE (routed experts + sigmoid-gated shared expert).
#include "model/blocks.h"

namespace ninfer {
namespace {

// down(silu(gate x) * up x), using `gate_buf` / `up_buf` as scratch.
void swiglu_mlp(const PassContext& p, const MlpWeights& w, const float* x, Buf gate_buf, Buf up_buf, float* out) {
  const int64_t inter = w.gate->rows();
  float* gate = p.scratch.get(gate_buf, p.rows * inter);
  float* up = p.scratch.get(up_buf, p.rows * inter);
  const LinearOut gate_up[] = {{w.gate, gate}, {w.up, up}};
  p.backend.linear_shared_input(x, p.rows, gate_up);
  p.backend.swiglu(gate, up, p.rows * inter, gate);
  p.backend.linear(gate, p.rows, *w.down, out);
}

void moe(const PassContext& p, const MoeWeights& w, const float* x, float* out) {
  const MoeConfig& m = *p.config.moe;
  const int64_t rows = p.rows, hidden = p.config.hidden_size;
  Backend& be = p.backend;
  float* logits = p.scratch.get(Buf::RouterLogits, rows * m.num_experts);
  float* weights = p.scratch.get(Buf::RouteWeights, rows * m.top_k);
  int32_t* ids = p.scratch.route_ids(rows * m.top_k);
  be.linear(x, rows, *w.router, logits);
  be.moe_route(logits, rows, m.num_experts, m.top_k, ids, weights);
  // The shared expert runs first, so that moe_experts adds its gated output in the pass that writes `out`.
  SharedExpertTerm shared;
  if (w.shared.gate) {
    float* shared_out = p.scratch.get(Buf::SharedOut, rows * hidden);
    float* gate_logit = p.scratch.get(Buf::SharedLogit, rows);
    swiglu_mlp(p, w.shared, x, Buf::SharedGate, Buf::SharedUp, shared_out);
    be.linear(x, rows, *w.shared_expert_gate, gate_logit);
    shared = {shared_out, gate_logit};
  }
  be.moe_experts(x, rows, hidden, ids, weights, m.top_k, *w.experts_gate, *w.experts_up, *w.experts_down, shared,
                 out);
}

}  // namespace

void feed_forward_block(const PassContext& p, const LayerWeights& w, const float* x, float* out) {
  if (w.is_moe) moe(p, w.moe, x, out);
  else swiglu_mlp(p, w.mlp, x, Buf::FfnGate, Buf::FfnUp, out);
}

void decoder_layers(const PassContext& p, std::span<const LayerWeights> layers, float* hidden) {
  if (layers.empty()) return;
  const int64_t h = p.config.hidden_size;
  Backend& be = p.backend;
  float* normed = p.scratch.get(Buf::Normed, p.rows * h);
  float* out = p.scratch.get(Buf::BlockOut, p.rows * h);
  be.rmsnorm(hidden, p.rows, h, h, layers[0].input_norm.data(), p.norm_kind(), p.eps(), normed, h);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerWeights& w = layers[i];
    if (w.kind == LayerKind::FullAttention) attention_block(p, w.attn, normed, out);
    else gdn_block(p, w.gdn, normed, out);
    // Each residual add goes with the norm that reads its result (this layer's post-attention norm, the next
    // layer's input norm): one pass over the rows instead of two.
    be.add_rmsnorm(hidden, out, p.rows, h, w.post_attn_norm.data(), p.norm_kind(), p.eps(), normed);
    feed_forward_block(p, w, normed, out);
    if (i + 1 < layers.size())
      be.add_rmsnorm(hidden, out, p.rows, h, layers[i + 1].input_norm.data(), p.norm_kind(), p.eps(), normed);
    else
      be.add(hidden, out, p.rows * h);
  }
}

}  // namespace ninfer
