#include "backend/cuda/op_timing.h"

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv.h"

namespace ninfer::cuda {
namespace {

// Start and end events around each outermost op on one stream (an op that calls another op counts once, under
// the outer name), summed per name when collected.
class OpTimer {
 public:
  explicit OpTimer(cudaStream_t stream) : stream_(stream) {}
  ~OpTimer() {
    for (const Pending& p : pending_) spare_.insert(spare_.end(), {p.start, p.end});
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  class Scope {
   public:
    Scope(OpTimer& timer, const char* op) : timer_(timer) { timer_.begin(op); }
    ~Scope() { timer_.end(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpTimer& timer_;
  };

  // Waits for the recorded ops and adds their times to the totals.
  void collect() {
    std::lock_guard lock(mu_);
    for (const Pending& p : pending_) {
      float ms = 0;
      NINFER_CUDA_CHECK(cudaEventSynchronize(p.end));
      NINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.end));
      OpTime& t = totals_[p.op];
      t.op = p.op;
      t.calls += 1;
      t.device_us += double(ms) * 1e3;
      spare_.insert(spare_.end(), {p.start, p.end});
    }
    pending_.clear();
  }

  std::vector<OpTime> totals() {
    collect();
    std::lock_guard lock(mu_);
    std::vector<OpTime> out;
    for (const auto& [op, t] : totals_) out.push_back(t);
    return out;
  }

 private:
  struct Pending {
    const char* op;
    cudaEvent_t start, end;
  };

  void begin(const char* op) {
    if (depth_++ > 0) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    NINFER_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    recording_ = capture == cudaStreamCaptureStatusNone;  // a captured decode pass is timed as a whole
    if (!recording_) return;
    std::lock_guard lock(mu_);
    current_ = {op, take(), take()};
    NINFER_CUDA_CHECK(cudaEventRecord(current_.start, stream_));
  }

  void end() noexcept {  // runs in a destructor, also when the op threw: never throws
    if (--depth_ > 0 || !recording_) return;
    std::lock_guard lock(mu_);
    if (cudaEventRecord(current_.end, stream_) == cudaSuccess) pending_.push_back(current_);
    else spare_.insert(spare_.end(), {current_.start, current_.end});
  }

  // A spare event, or a new one (caller holds mu_).
  cudaEvent_t take() {
    if (spare_.empty()) {
      cudaEvent_t e = nullptr;
      NINFER_CUDA_CHECK(cudaEventCreate(&e));
      return e;
    }
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }

  cudaStream_t stream_;
  int depth_ = 0;           // the scheduler thread's nesting of ops
  bool recording_ = false;  // whether the outermost op's events are being recorded
  Pending current_{};
  std::mutex mu_;           // pending_, spare_ and totals_: op_times() may come from another thread
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> spare_;
  std::map<std::string, OpTime> totals_;
};

// Each op as CudaBackend runs it, inside an OpTimer scope named after it (linear by the path its rows take).
class TimedCudaBackend final : public CudaBackend {
 public:
  explicit TimedCudaBackend(int device) : CudaBackend(device), timer_(stream()) {}

  void begin_pass(GraphPassShape shape) override {
    CudaBackend::begin_pass(shape);  // the stream has finished the previous pass's ops
    timer_.collect();
  }
  std::vector<OpTime> op_times() const override { return timer_.totals(); }

  void linear(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias) override {
    OpTimer::Scope s(timer_, rows > kMaxGemvRows ? "linear_gemm" : "linear_gemv");
    CudaBackend::linear(x, rows, w, y, bias);
  }
  void linear_shared_input(const float* x, int64_t rows, std::span<const LinearOut> outs) override {
    OpTimer::Scope s(timer_, rows > kMaxGemvRows ? "linear_gemm" : "linear_gemv");
    CudaBackend::linear_shared_input(x, rows, outs);
  }
  void embed(const int32_t* tokens, int64_t n, const TensorView& table, float* out) override {
    OpTimer::Scope s(timer_, "embed");
    CudaBackend::embed(tokens, n, table, out);
  }
  void gather_rows(const float* x, int64_t dim, const int64_t* rows, int64_t n, float* out) override {
    OpTimer::Scope s(timer_, "gather_rows");
    CudaBackend::gather_rows(x, dim, rows, n, out);
  }
  void embed_resident_ids(const int32_t* ids, int64_t n, const TensorView& table, float* out) override {
    OpTimer::Scope s(timer_, "embed");
    CudaBackend::embed_resident_ids(ids, n, table, out);
  }
  void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, const float* column_ids) override {
    OpTimer::Scope s(timer_, "argmax_rows");
    CudaBackend::argmax_rows(x, rows, cols, ids, column_ids);
  }
  void row_dots(const float* rows, int64_t n, int64_t dim, const float* x, float* out) override {
    OpTimer::Scope s(timer_, "row_dots");
    CudaBackend::row_dots(rows, n, dim, x, out);
  }
  void add(float* inout, const float* x, int64_t n) override {
    OpTimer::Scope s(timer_, "add");
    CudaBackend::add(inout, x, n);
  }
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override {
    OpTimer::Scope s(timer_, "swiglu");
    CudaBackend::swiglu(gate, up, n, out);
  }
  void copy_columns(const float* x, int64_t rows, int64_t x_stride, int64_t cols, float* out) override {
    OpTimer::Scope s(timer_, "copy_columns");
    CudaBackend::copy_columns(x, rows, x_stride, cols, out);
  }
  void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, NormKind kind, float eps,
               float* out, int64_t out_stride) override {
    OpTimer::Scope s(timer_, "rmsnorm");
    CudaBackend::rmsnorm(x, rows, dim, x_stride, w, kind, eps, out, out_stride);
  }
  void add_rmsnorm(float* hidden, const float* delta, int64_t rows, int64_t dim, const float* w, NormKind kind,
                   float eps, float* out) override {
    OpTimer::Scope s(timer_, "add_rmsnorm");
    CudaBackend::add_rmsnorm(hidden, delta, rows, dim, w, kind, eps, out);
  }
  void rope(float* x, int64_t rows, int32_t heads, int64_t head_stride, int64_t row_stride, const int64_t* positions,
            const RopeSpec& rope) override {
    OpTimer::Scope s(timer_, "rope");
    CudaBackend::rope(x, rows, heads, head_stride, row_stride, positions, rope);
  }
  void kv_write(const float* k, const float* v, std::span<const SequenceRows> seqs, KvPool& pool,
                int32_t layer) override {
    OpTimer::Scope s(timer_, "kv_write");
    CudaBackend::kv_write(k, v, seqs, pool, layer);
  }
  void attention(const float* q, int64_t q_row_stride, int64_t q_head_stride, std::span<const SequenceRows> seqs,
                 const KvPool& pool, int32_t layer, const AttentionShape& shape, float* out) override {
    OpTimer::Scope s(timer_, "attention");
    CudaBackend::attention(q, q_row_stride, q_head_stride, seqs, pool, layer, shape, out);
  }
  void sigmoid_gate(float* x, int64_t rows, int32_t heads, int32_t dim, const float* gate, int64_t gate_row_stride,
                    int64_t gate_head_stride) override {
    OpTimer::Scope s(timer_, "sigmoid_gate");
    CudaBackend::sigmoid_gate(x, rows, heads, dim, gate, gate_row_stride, gate_head_stride);
  }
  void moe_route(const float* logits, int64_t rows, int32_t experts, int32_t top_k, int32_t* ids,
                 float* weights) override {
    OpTimer::Scope s(timer_, "moe_route");
    CudaBackend::moe_route(logits, rows, experts, top_k, ids, weights);
  }
  void moe_experts(const float* x, int64_t rows, int64_t hidden, const int32_t* ids, const float* weights,
                   int32_t top_k, const TensorView& gate, const TensorView& up, const TensorView& down,
                   const SharedExpertTerm& shared, float* out) override {
    OpTimer::Scope s(timer_, "moe_experts");
    CudaBackend::moe_experts(x, rows, hidden, ids, weights, top_k, gate, up, down, shared, out);
  }
  void gdn_conv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape, const float* weight,
                StatePool& states, int32_t layer, float* out) override {
    OpTimer::Scope s(timer_, "gdn_conv");
    CudaBackend::gdn_conv(mixed, seqs, shape, weight, states, layer, out);
  }
  void l2norm_heads(const float* x, int64_t rows, int32_t heads, int32_t dim, int64_t x_stride, float scale,
                    float* out) override {
    OpTimer::Scope s(timer_, "l2norm_heads");
    CudaBackend::l2norm_heads(x, rows, heads, dim, x_stride, scale, out);
  }
  void gdn_gates(const float* a, const float* b, int64_t rows, int32_t heads, const float* A_log,
                 const float* dt_bias, float* g, float* beta) override {
    OpTimer::Scope s(timer_, "gdn_gates");
    CudaBackend::gdn_gates(a, b, rows, heads, A_log, dt_bias, g, beta);
  }
  void gdn_rule(const float* q, const float* k, const float* v, const float* g, const float* beta,
                std::span<const SequenceRows> seqs, const GdnShape& shape, StatePool& states, int32_t layer,
                float* out) override {
    OpTimer::Scope s(timer_, "gdn_rule");
    CudaBackend::gdn_rule(q, k, v, g, beta, seqs, shape, states, layer, out);
  }
  void gdn_conv_qkv(const float* mixed, std::span<const SequenceRows> seqs, const GdnShape& shape,
                    const float* weight, StatePool& states, int32_t layer, float q_scale, float* q, float* k,
                    float* v) override {
    OpTimer::Scope s(timer_, "gdn_conv_qkv");
    CudaBackend::gdn_conv_qkv(mixed, seqs, shape, weight, states, layer, q_scale, q, k, v);
  }
  void gated_rmsnorm(const float* x, const float* z, int64_t rows, int32_t heads, int32_t dim, const float* w,
                     float eps, float* out) override {
    OpTimer::Scope s(timer_, "gated_rmsnorm");
    CudaBackend::gated_rmsnorm(x, z, rows, heads, dim, w, eps, out);
  }
  void layernorm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                 float* out) override {
    OpTimer::Scope s(timer_, "layernorm");
    CudaBackend::layernorm(x, rows, dim, w, b, eps, out);
  }
  void gelu(const float* x, int64_t n, GeluKind kind, float* out) override {
    OpTimer::Scope s(timer_, "gelu");
    CudaBackend::gelu(x, n, kind, out);
  }
  void add_embedding_mix(const int32_t* ids, const float* weights, int64_t rows, int32_t taps,
                         const TensorView& table, float* inout) override {
    OpTimer::Scope s(timer_, "add_embedding_mix");
    CudaBackend::add_embedding_mix(ids, weights, rows, taps, table, inout);
  }
  void segment_attention(const float* q, const float* k, const float* v, int64_t row_stride,
                         std::span<const RowSegment> segments, int32_t heads, int32_t head_dim, float scale,
                         float* out) override {
    OpTimer::Scope s(timer_, "segment_attention");
    CudaBackend::segment_attention(q, k, v, row_stride, segments, heads, head_dim, scale, out);
  }

 private:
  mutable OpTimer timer_;
};

}  // namespace

std::unique_ptr<Backend> make_timed_cuda_backend(int device) { return std::make_unique<TimedCudaBackend>(device); }

}  // namespace ninfer::cuda
