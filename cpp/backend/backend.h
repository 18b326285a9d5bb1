// The ops the model is built from. The model calls only these; a backend implements them for its memory
// (host pointers for the CPU backend; device pointers, a stream and graph capture for the CUDA backend).
// Every op works on a batch of rows at once; per-sequence structure arrives as a SequenceRows table, so no op
// needs host-side logic per token.
//
// Pointers: activations (x, y, out, q, k, v, g, beta, logits, ids, weights of moe_*) and pools live in the
// backend's memory(). Host-side tables are always host memory: token ids, positions, row indices, SequenceRows
// (and its pages), RopeSpec::inv_freq and freq_stream, RowSegments, add_embedding_mix's ids and weights. Model weights (TensorViews and the small f32 vectors: norms, biases, conv
// taps, gates) may be given as host pointers that stay valid and unchanged for the backend's life; a backend
// with its own memory copies each once (in its stored encoding) and reuses the copy.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "artifact/artifact.h"
#include "backend/memory.h"
#include "backend/rope_pairing.h"

namespace ninfer {

class KvPool;
class StatePool;

// RMSNorm conventions: Plain multiplies by w (llama family, the GDN output norm); Offset by (1 + w) (Qwen3.5).
enum class NormKind : uint8_t { Plain, Offset };

// One sequence's rows within a batch: rows [row0, row0 + n) hold positions start .. start + n - 1.
// `pages` are its KV pages (page p holds positions [64p, 64p + 64)); `state_slot` its GDN state slot.
struct SequenceRows {
  int64_t row0 = 0, n = 0, start = 0;
  const int32_t* pages = nullptr;
  int32_t state_slot = -1;
  // >= 0: the rows continue from this slot's state, not state_slot's own: each op copies that layer's state into
  // state_slot first (an MTP verify row starts from the row before it; runtime/speculative.h). Ops handle the
  // sequences in order, so a sequence may continue from the slot an earlier one of the same call just wrote (the
  // CUDA backend runs such a chain of one-row sequences in one kernel, its state in registers between the rows).
  int32_t source_slot = -1;
};

struct RopeSpec {
  RopePairing pairing = RopePairing::Half;
  int32_t rotary_dim = 0;
  const float* inv_freq = nullptr;  // rotary_dim / 2 frequencies
  // Several position streams per row (M-RoPE's t/h/w, the vision tower's row/column): row r has `streams`
  // positions at positions[r * streams + s], and frequency i takes its angle from stream freq_stream[i]
  // (rotary_dim / 2 host entries). streams == 1: one position per row, freq_stream unused.
  int32_t streams = 1;
  const uint8_t* freq_stream = nullptr;
};

// GELU forms: Tanh is the tanh approximation (gelu_pytorch_tanh, the vision blocks' MLP), Erf the exact one (the
// vision merger's nn.GELU()).
enum class GeluKind : uint8_t { Tanh, Erf };

// One segment of rows that attend to each other (bidirectionally) and to nothing else: rows [row0, row0 + n).
struct RowSegment {
  int64_t row0 = 0, n = 0;
};

struct AttentionShape {
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
};

struct GdnShape {
  int32_t num_key_heads = 0, num_value_heads = 0, key_head_dim = 0, value_head_dim = 0, conv_kernel = 0;
  int32_t chunk = 64;  // chunk length of the chunked rule, used for sequences with more than one new token
  int64_t conv_channels() const { return 2LL * num_key_heads * key_head_dim + int64_t(num_value_heads) * value_head_dim; }
};

// An MoE block's shared expert as moe_experts adds it: sigmoid(logit[r]) * out[r] (out [rows, hidden], logit
// [rows]: the shared expert's gate). No shared expert: out == nullptr.
struct SharedExpertTerm {
  const float* out = nullptr;
  const float* logit = nullptr;
};

// One of several linear layers applied to the same activations (see Backend::linear_shared_input).
struct LinearOut {
  const TensorView* w = nullptr;
  float* y = nullptr;
  const float* bias = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Called by the model on the thread that runs a pass, before any op (the CPU backend sets its OpenMP threads
  // there, since OpenMP's thread count is a per-thread setting).
  virtual void bind_calling_thread() = 0;

  // The memory the ops read and write (see the pointer rules above); host memory unless overridden.
  virtual MemoryResource& memory() { return host_memory(); }

  // --- matrices: `w` in its stored encoding (never expanded) ---
  // y[r] = W x[r] (+ bias) for every row.
  virtual void linear(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias = nullptr) = 0;
  // linear() for several weights on the same x (a layer's projections): a backend may prepare x once for all.
  virtual void linear_shared_input(const float* x, int64_t rows, std::span<const LinearOut> outs) {
    for (const LinearOut& o : outs) linear(x, rows, *o.w, o.y, o.bias);
  }
  // out[i] = row tokens[i] of `table` (any encoding).
  virtual void embed(const int32_t* tokens, int64_t n, const TensorView& table, float* out) = 0;
  // embed with the token ids in memory() rather than on the host: ids an earlier op wrote (an MTP draft step's
  // token is the step before's argmax_rows), so that no host round trip sits between the two.
  virtual void embed_resident_ids(const int32_t* ids, int64_t n, const TensorView& table, float* out) = 0;
  // out[i] = x[rows[i]] (rows of `dim` values).
  virtual void gather_rows(const float* x, int64_t dim, const int64_t* rows, int64_t n, float* out) = 0;
  // out[0..count) = host[0..count): values from host memory into memory(), as an op of the pass, so that a pass
  // replayed as a CUDA graph copies the values of its own call (memory().from_host is not part of a graph, so the
  // CUDA backend overrides this; elsewhere it is that copy).
  virtual void upload_floats(const float* host, int64_t count, float* out) {
    if (count > 0) memory().from_host(out, host, size_t(count) * sizeof(float));
  }
  // out[j] = <rows[j], x> for n rows of `dim` values (a GEMV over rows gathered by embed: the candidate projection
  // of a decision readout, a handful of lm-head rows instead of the whole vocabulary).
  virtual void row_dots(const float* rows, int64_t n, int64_t dim, const float* x, float* out) = 0;
  // ids[r] = the column of row r's largest value, the lowest such column on ties (std::max_element's choice), or
  // with `column_ids` (a host vector of `cols` exact integers, like the weights' small vectors) that column's id:
  // a draft shortlist's token. `ids` in memory().
  virtual void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids,
                           const float* column_ids = nullptr) = 0;

  // --- elementwise ---
  virtual void add(float* inout, const float* x, int64_t n) = 0;
  // out = silu(gate) * up, n values. `out` may alias either input.
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* out) = 0;
  // out[r, j] = x[r * x_stride + j] for j < cols (a column slice made contiguous).
  virtual void copy_columns(const float* x, int64_t rows, int64_t x_stride, int64_t cols, float* out) = 0;

  // --- norms ---
  // RMSNorm of `rows` vectors of `dim` values at `x_stride`, into `out` at `out_stride` (may alias x).
  virtual void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, NormKind kind,
                       float eps, float* out, int64_t out_stride) = 0;
  // hidden += delta, then out = RMSNorm(hidden), over rows of `dim` contiguous values: a residual add and the norm
  // after it in one pass over the rows. `out` aliases neither input.
  virtual void add_rmsnorm(float* hidden, const float* delta, int64_t rows, int64_t dim, const float* w,
                           NormKind kind, float eps, float* out) = 0;
  // A hint for the next add_rmsnorm: `reader` is a weight of the linear_shared_input that reads its output next
  // (unchanged). A backend may have the norm also write its output in the form that weight reads (the CUDA decode
  // GEMV's split activations); results are the same with or without the hint.
  virtual void norm_feeds(const TensorView& /*reader*/) {}

  // --- full attention ---
  // Rotates the first rotary_dim values of each of `heads` heads (head h of row r at x + r*row_stride + h*head_stride)
  // by the angles of positions[r].
  virtual void rope(float* x, int64_t rows, int32_t heads, int64_t head_stride, int64_t row_stride,
                    const int64_t* positions, const RopeSpec& rope) = 0;
  // Stores the new rows' K and V ([rows, kv_heads * head_dim] each) into the sequences' pages of `layer`.
  virtual void kv_write(const float* k, const float* v, std::span<const SequenceRows> seqs, KvPool& pool,
                        int32_t layer) = 0;
  // Causal softmax attention of each row's query heads (row r at q + r*q_row_stride, head h at + h*q_head_stride)
  // over its sequence's positions 0 .. its own, GQA (head h reads KV head h / (heads / kv_heads)).
  // out [rows, heads * head_dim].
  virtual void attention(const float* q, int64_t q_row_stride, int64_t q_head_stride,
                         std::span<const SequenceRows> seqs, const KvPool& pool, int32_t layer,
                         const AttentionShape& shape, float* out) = 0;
  // x[r, h, :] *= sigmoid(gate[r * gate_row_stride + h * gate_head_stride + :]) for x [rows, heads, dim].
  virtual void sigmoid_gate(float* x, int64_t rows, int32_t heads, int32_t dim, const float* gate,
                            int64_t gate_row_stride, int64_t gate_head_stride) = 0;

  // --- mixture of experts ---
  // Softmax over all experts (f32), top-k, renormalised: ids/weights [rows, top_k].
  virtual void moe_route(const float* logits, int64_t rows, int32_t experts, int32_t top_k, int32_t* ids,
                         float* weights) = 0;
  // out[r] = sum_j weights[r, j] * down_e(silu(gate_e x[r]) * up_e x[r]), e = ids[r, j], plus the shared
  // expert's gated output sigmoid(shared.logit[r]) * shared.out[r] when shared.out is set (in that order, the
  // block's output in one pass instead of three: the routed sum, the gate, the add). Stacked [E, ., .] weights.
  virtual void moe_experts(const float* x, int64_t rows, int64_t hidden, const int32_t* ids, const float* weights,
                           int32_t top_k, const TensorView& gate, const TensorView& up, const TensorView& down,
                           const SharedExpertTerm& shared, float* out) = 0;

  // --- Gated DeltaNet ---
  // Causal depthwise conv + SiLU per sequence over mixed [rows, C], with each sequence's conv history in
  // `states` (linear layer `layer`). weight [C, K] f32.
  virtual void gdn_conv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                        const float* weight, StatePool& states, int32_t layer, float* out) = 0;
  // gdn_conv, then split the way the delta rule takes it (the conv's rows are [q | k | v]): q = l2norm_heads of
  // the Hk key heads times q_scale, k = l2norm_heads of the next Hk, v = the value columns; each contiguous
  // ([rows, Hk*Dk], [rows, Hk*Dk], [rows, Hv*Dv]). One pass instead of four for a backend that fuses them.
  virtual void gdn_conv_qkv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                            const float* weight, StatePool& states, int32_t layer, float q_scale, float* q, float* k,
                            float* v) = 0;
  // Per head: out = x / sqrt(sum(x^2) + 1e-6) * scale; x heads at x + r*x_stride + h*dim, out contiguous.
  virtual void l2norm_heads(const float* x, int64_t rows, int32_t heads, int32_t dim, int64_t x_stride, float scale,
                            float* out) = 0;
  // g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); all [rows, heads].
  virtual void gdn_gates(const float* a, const float* b, int64_t rows, int32_t heads, const float* A_log,
                         const float* dt_bias, float* g, float* beta) = 0;
  // The gated delta rule per sequence (chunked for several new tokens, recurrent for one), state in `states`.
  virtual void gdn_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                        std::span<const SequenceRows> seqs, const GdnShape& shape, StatePool& states, int32_t layer,
                        float* out) = 0;
  // out[r, h] = (w * rmsnorm(x[r, h])) * silu(z[r, h]) over heads of `dim` values (plain weight).
  virtual void gated_rmsnorm(const float* x, const float* z, int64_t rows, int32_t heads, int32_t dim,
                             const float* w, float eps, float* out) = 0;

  // --- vision tower (a backend without these kernels keeps the defaults: has_vision_ops() false, and each op
  // throws EngineError; the model refuses to load a tower onto such a backend) ---
  virtual bool has_vision_ops() const { return false; }
  // out = LayerNorm(x) * w + b over rows of `dim` contiguous values (biased variance, eps inside the sqrt).
  virtual void layernorm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                         float* out);
  // out = gelu(x), n values; `out` may alias x.
  virtual void gelu(const float* x, int64_t n, GeluKind kind, float* out);
  // inout[r] += sum_j weights[r * taps + j] * row ids[r * taps + j] of `table` (any encoding): a resampled
  // embedding (the vision tower's bilinear position embedding) added to `rows` rows of table.cols() values.
  virtual void add_embedding_mix(const int32_t* ids, const float* weights, int64_t rows, int32_t taps,
                                 const TensorView& table, float* inout);
  // Throws EngineError unless each of the `count` ids is a row of a table of `table_rows` rows (add_embedding_mix's
  // check, the same in every backend).
  static void check_embedding_taps(const int32_t* ids, int64_t count, int64_t table_rows);

  // Softmax attention without a mask inside each segment: every row of a segment attends to all rows of it, no
  // row to another segment's. q, k, v: head h of row r at x + r * row_stride + h * head_dim; out
  // [rows, heads * head_dim].
  virtual void segment_attention(const float* q, const float* k, const float* v, int64_t row_stride,
                                 std::span<const RowSegment> segments, int32_t heads, int32_t head_dim, float scale,
                                 float* out);
};

// The CPU backend; `threads` OpenMP threads for every op (0: all cores).
std::unique_ptr<Backend> make_cpu_backend(int32_t threads);

}  // namespace ninfer
