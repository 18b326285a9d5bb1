// The feed-forward block: dense SwiGLU, or the sparse MoE (routed experts + sigmoid-gated shared expert).
#include "model/blocks.h"

namespace ninfer {
namespace {

// down(silu(gate) * up) into `out`, gate and up [rows, inter] already projected (the result overwrites `gate`).
void swiglu_down(const PassContext& p, const MlpWeights& w, float* gate, const float* up, float* out) {
  p.backend.swiglu(gate, up, p.rows * w.gate->rows(), gate);
  p.backend.linear(gate, p.rows, *w.down, out);
}

// down(silu(gate x) * up x), using `gate_buf` / `up_buf` as scratch.
void swiglu_mlp(const PassContext& p, const MlpWeights& w, const float* x, Buf gate_buf, Buf up_buf, float* out) {
  const int64_t inter = w.gate->rows();
  float* gate = p.scratch.get(gate_buf, p.rows * inter);
  float* up = p.scratch.get(up_buf, p.rows * inter);
  const LinearOut gate_up[] = {{w.gate, gate}, {w.up, up}};
  p.backend.linear_shared_input(x, p.rows, gate_up);
  swiglu_down(p, w, gate, up, out);
}

void moe(const PassContext& p, const MoeWeights& w, const float* x, float* out) {
  const MoeConfig& m = *p.config.moe;
  const int64_t rows = p.rows, hidden = p.config.hidden_size;
  Backend& be = p.backend;
  float* logits = p.scratch.get(Buf::RouterLogits, rows * m.num_experts);
  float* weights = p.scratch.get(Buf::RouteWeights, rows * m.top_k);
  int32_t* ids = p.scratch.route_ids(rows * m.top_k);
  // The shared expert runs first, so that moe_experts adds its gated output in the pass that writes `out`. The
  // router, the shared expert's gate and its gate/up projections all read x: one linear_shared_input, so that a
  // decode step splits x once per split kind and runs weights of one kind and encoding in one GEMV launch.
  SharedExpertTerm shared;
  if (w.shared.gate) {
    const int64_t inter = w.shared.gate->rows();
    float* shared_out = p.scratch.get(Buf::SharedOut, rows * hidden);
    float* gate_logit = p.scratch.get(Buf::SharedLogit, rows);
    float* gate = p.scratch.get(Buf::SharedGate, rows * inter);
    float* up = p.scratch.get(Buf::SharedUp, rows * inter);
    const LinearOut projections[] = {{w.router, logits}, {w.shared_expert_gate, gate_logit}, {w.shared.gate, gate},
                                     {w.shared.up, up}};
    be.linear_shared_input(x, rows, projections);
    swiglu_down(p, w.shared, gate, up, shared_out);
    shared = {shared_out, gate_logit};
  } else {
    be.linear(x, rows, *w.router, logits);
  }
  be.moe_route(logits, rows, m.num_experts, m.top_k, ids, weights);
  be.moe_experts(x, rows, hidden, ids, weights, m.top_k, *w.experts_gate, *w.experts_up, *w.experts_down, shared,
                 out);
}

// The main projection that reads a layer's block input (norm_feeds' hint for the norm that produces it).
const TensorView& block_input_reader(const LayerWeights& w) {
  return w.kind == LayerKind::FullAttention ? *w.attn.q_proj : *w.gdn.in_qkv;
}

// The same for the feed-forward input: the shared expert's gate/up (the router is small), or the MLP's gate.
const TensorView& feed_forward_input_reader(const LayerWeights& w) {
  if (!w.is_moe) return *w.mlp.gate;
  return w.moe.shared.gate ? *w.moe.shared.gate : *w.moe.router;
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
    be.norm_feeds(feed_forward_input_reader(w));
    be.add_rmsnorm(hidden, out, p.rows, h, w.post_attn_norm.data(), p.norm_kind(), p.eps(), normed);
    feed_forward_block(p, w, normed, out);
    if (i + 1 < layers.size()) {
      be.norm_feeds(block_input_reader(layers[i + 1]));
      be.add_rmsnorm(hidden, out, p.rows, h, layers[i + 1].input_norm.data(), p.norm_kind(), p.eps(), normed);
    } else {
      be.add(hidden, out, p.rows * h);
    }
  }
}

}  // namespace ninfer
