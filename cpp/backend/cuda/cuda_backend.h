// The CUDA backend: every Backend op on device pointers, queued on one stream. Ops are spread over files by job like
// the CPU twins (cuda_backend.cu: memory, weights, matrices, elementwise; norm.cu, rope.cu, attention.cu, moe.cu,
// gdn_ops.cu; the vision tower's in gelu.cu, embedding_mix.cu, segment_attention.cu and norm.cu; prefill GEMM in
// prefill_gemm.cu (cuBLASLt) with its f32 twin in gemm.cu, decode GEMV in gemv.cu (CUDA cores) and gemv_mma.cu (tensor
// cores), GDN decode step in gdn_decode.cu, GDN chunked prefill in gdn_prefill.cu, fast attention in flash_prefill.cu
// and flash_decode.cu). The first version was correct first: simple kernels (tiled f32 GEMM, one block per row and head
// for attention, a per-token loop for the delta rule); the fast paths replace them one at a time against these, which
// stay as twins (set_reference_kernels).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/decode_graphs.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/prefill_gemm.h"
#include "backend/cuda/sampling.h"
#include "backend/cuda/step_tables.h"
#include "runtime/device_runtime.h"

namespace ninfer::cuda {

// Host-side tables of one op call packed into a single upload (SequenceRows, pages, positions, pointers).
class HostTables {
 public:
  template <class T>
  size_t add(const T* values, size_t count) {
    const size_t offset = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(offset + count * sizeof(T));
    if (count) std::memcpy(bytes_.data() + offset, values, count * sizeof(T));
    return offset;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// A sequence as the kernels see it (device copy of SequenceRows; pages at page_offset in the page table).
struct DeviceSequence {
  int64_t row0, n, start;
  int64_t page_offset;
};

class CudaBackend : public Backend, public DeviceRuntime {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  void bind_calling_thread() override;
  MemoryResource& memory() override { return memory_; }
  cudaStream_t stream() const { return stream_; }

  DeviceMemoryUse upload_weights(const Artifact& artifact) override;
  void begin_pass(GraphPassShape shape) override;
  void set_graphs_enabled(bool enabled) override { graphs_.enabled = enabled; }
  void set_max_sequence_tokens(int64_t tokens) override { max_sequence_tokens_ = tokens; }
  int64_t graph_bytes() const override { return graphs_.bytes(); }
  int32_t graphs_captured() const override { return graphs_.captured(); }
  int64_t graph_replays() const override { return graphs_.replays(); }
  GraphPassTimings graph_timings() const override { return graphs_.timings(); }
  int32_t decode_path_rows() const override { return kMaxGemvRows; }
  // Use the slow, obviously-right twin where an op has a fast kernel and a reference one (today: gdn_rule's
  // token-by-token kernel instead of the decode and chunked kernels; moe_experts' simple kernels instead of the
  // grouped matmul; gdn_conv_qkv as gdn_conv, l2norm_heads and copy_columns), so that tests can compare them.
  void set_reference_kernels(bool on) { reference_kernels_ = on; }
  void launch_pass() override;
  void sample(const float* logits, int64_t vocab, std::span<const DeviceSampleRow> rows,
              std::vector<SampledToken>& out) override;  // in sampling.cu
  // Use the f32 CUDA-core twin where an op has a tensor-core kernel whose operands are rounded (today: the GDN
  // chunked scan), so that tests can measure the rounding against an otherwise identical path.
  void set_f32_twins(bool on) { f32_twins_ = on; }
  // The prefill GEMM's implementation (EngineOptions::cuda_gemm): Auto (the fastest for each weight) or Twin, and
  // Auto's largest row count for the streamed GEMM.
  void set_prefill_gemm(GemmImpl impl, int64_t streamed_rows) {
    gemm_impl_ = impl;
    prefill_gemm_.set_streamed_rows(streamed_rows);
  }

  void linear(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias) override;
  void linear_shared_input(const float* x, int64_t rows, std::span<const LinearOut> outs) override;
  void embed(const int32_t* tokens, int64_t n, const TensorView& table, float* out) override;
  void embed_resident_ids(const int32_t* ids, int64_t n, const TensorView& table, float* out) override;
  void gather_rows(const float* x, int64_t dim, const int64_t* rows, int64_t n, float* out) override;
  void upload_floats(const float* host, int64_t count, float* out) override;
  void row_dots(const float* rows, int64_t n, int64_t dim, const float* x, float* out) override;
  void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, const float* column_ids) override;

  void add(float* inout, const float* x, int64_t n) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void copy_columns(const float* x, int64_t rows, int64_t x_stride, int64_t cols, float* out) override;

  void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, NormKind kind, float eps,
               float* out, int64_t out_stride) override;

  // A decode batch's add_rmsnorm after norm_feeds(w) with w an fp16-kind tensor-core weight also writes w's split
  // planes (norm.cu), which the next linear_shared_input on its output takes instead of splitting it again (not
  // with set_reference_kernels: the twin, norm then split kernel).
  void norm_feeds(const TensorView& reader) override;
  void add_rmsnorm(float* hidden, const float* delta, int64_t rows, int64_t dim, const float* w, NormKind kind,
                   float eps, float* out) override;

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

  // The vision tower's ops (norm.cu, gelu.cu, embedding_mix.cu, segment_attention.cu).
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
  // The device copy of a weight: itself when it already holds device pointers, else uploaded once (stored
  // encoding) and kept for the backend's life, keyed by its host data pointer.
  const TensorView& resident(const TensorView& w);
  // The same for a small f32 vector of `count` values.
  const float* resident(const float* values, int64_t count);
  // Puts `tables` into this pass's next slot of the step arena; returns its device address (valid for the pass).
  const uint8_t* upload(const HostTables& tables);
  // Whether this pass's ops only write their step tables, launching nothing (a decode graph's replay). An op
  // uploads exactly what it uploads when it runs, then returns before its first launch.
  bool tables_only() const { return graphs_.tables_only(); }
  // The tables every paged sequence op reads (device addresses in the step arena): sequences, their pages, and
  // each row's sequence (-1: none), with `rows` = 1 + the last row of any sequence. In a decode graph's pass
  // the page list is padded to a size fixed by the batch (so the pass's tables keep their offsets from step to
  // step) and uploaded once for all the pass's ops on the same sequences.
  struct SequenceSlots {
    const DeviceSequence* seqs;
    const int32_t* pages;
    const int32_t* row_seq;
    int64_t rows;
  };
  SequenceSlots sequence_tables(std::span<const SequenceRows> seqs, const KvPool& pool);
  // y[r, :] += bias for rows of w.rows() values (nothing when bias is null).
  void add_bias(float* y, int64_t rows, const TensorView& w, const float* bias);
  // A reused device buffer of at least `floats` floats.
  float* scratch(DeviceBuffer& buffer, size_t floats);

  int device_;
  cudaStream_t stream_ = nullptr;
  DeviceMemory memory_;
  std::unordered_map<const void*, DeviceWeight> weights_;
  using ReshapedKey = std::pair<const void*, std::vector<int64_t>>;  // (host data, shape read as)
  std::map<ReshapedKey, TensorView> reshaped_;                        // dense weights read in another shape
  std::unordered_map<const float*, DeviceBuffer> constants_;
  StepTables tables_;
  DecodeGraphs graphs_;
  int64_t max_sequence_tokens_ = 0;  // the engine's max_context (0: unknown, the KV pool bounds a sequence)
  // This graph pass's sequence tables and the sequences they were made for (cleared by begin_pass).
  std::vector<SequenceRows> pass_seqs_;
  SequenceSlots pass_seq_slots_{};
  DeviceBuffer moe_hidden_, moe_out_, moe_split_, moe_routing_;  // moe.cu
  GemvWorkspace gemv_workspace_;  // after tables_: constructed once the device is selected
  // norm_feeds' hint for the next add_rmsnorm (kind -1: none), and the planes that norm wrote into
  // gemv_workspace_ for the next linear_shared_input (x == nullptr: none; any other split there clears them).
  struct NormSplit {
    int kind = -1;
    int64_t cols = 0;
  };
  NormSplit norm_split_;
  SplitActivations norm_planes_;
  DeviceBuffer gdn_workspace_;  // the chunked delta rule's per-chunk products
  DeviceBuffer gdn_conv_rows_;  // gdn_conv_qkv's twin: the conv rows before the split
  bool reference_kernels_ = false;
  bool f32_twins_ = false;
  DeviceBuffer attention_partial_;  // split-KV decode partials (flash_decode)
  DeviceBuffer argmax_partial_;     // argmax_rows' per-chunk (value, column) pairs
  DeviceBuffer segment_planes_;     // segment_attention's bf16 q, k, v planes
  PrefillGemm prefill_gemm_;
  GemmImpl gemm_impl_ = GemmImpl::Auto;
  DeviceSampler sampler_;
};

}  // namespace ninfer::cuda

namespace ninfer {
// The CUDA backend on `device`, timing its ops when `time_ops` (op_timing.h). Throws EngineError when no usable
// device is there.
std::unique_ptr<Backend> make_cuda_backend(int device = 0, bool time_ops = false);
}  // namespace ninfer
