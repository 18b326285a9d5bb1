#include "bindings/backend_ops.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings/array_out.h"
#include "bindings/artifact_handle.h"
#include "errors.h"
#include "cache/kv_pool.h"
#include "cache/state_pool.h"

#ifdef NINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace nb = nanobind;

namespace ninfer::bindings {

std::unique_ptr<Backend> make_engine_cuda_backend(const EngineOptions& options) {
#ifdef NINFER_HAVE_CUDA
  std::unique_ptr<Backend> backend = make_cuda_backend(0, options.cuda_op_times);
  // cuda_gemm is auto, twin or streamed (validate_engine_options): the backend's choice for prefill GEMMs;
  // streamed is auto with the streamed GEMM taking every row count it can.
  auto& cuda_backend = static_cast<cuda::CudaBackend&>(*backend);
  if (options.cuda_gemm == "streamed")
    cuda_backend.set_prefill_gemm(cuda::GemmImpl::Auto, std::numeric_limits<int64_t>::max());
  else
    cuda_backend.set_prefill_gemm(cuda::gemm_impl_from_name(options.cuda_gemm), cuda::kStreamedAutoRows);
  return backend;
#else
  throw EngineError("backend \"cuda\": this build of ninfer has no CUDA backend (built without nvcc)");
#endif
}

std::unique_ptr<Backend> make_backend_named(const std::string& name, int32_t threads, bool cuda_op_times) {
  if (name == "cuda") {
    EngineOptions options;
    options.cuda_op_times = cuda_op_times;
    return make_engine_cuda_backend(options);
  }
  if (cuda_op_times) throw EngineError("op times need the cuda backend, not \"" + name + "\"");
  if (name == "cpu") return make_cpu_backend(threads);
  throw EngineError("unknown backend \"" + name + "\" (expected \"cpu\" or \"cuda\")");
}

nanobind::dict op_times_dict(const DeviceRuntime* device) {
  nanobind::dict out;
  if (!device) return out;
  for (const OpTime& t : device->op_times()) {
    nanobind::dict one;
    one["calls"] = t.calls;
    one["device_us"] = t.device_us;
    out[t.op.c_str()] = one;
  }
  return out;
}

namespace {

template <class T>
using In = nb::ndarray<const T, nb::c_contig, nb::device::cpu>;
using IntArray = nb::ndarray<nb::numpy, int32_t>;

// A sequence of an op call as Python gives it: (start, n, pages).
using PySeq = std::tuple<int64_t, int64_t, std::vector<int32_t>>;

// A backend by name, plus "cuda-reference": the CUDA backend with its slow, obviously-right twins in place of the
// fast kernels (CudaBackend::set_reference_kernels), and "cuda-f32": with the f32 twins of its tensor-core kernels
// (CudaBackend::set_f32_twins), so that tests can compare them on the GPU.
std::unique_ptr<Backend> make_ops_backend(const std::string& name) {
#ifdef NINFER_HAVE_CUDA
  if (name == "cuda-reference") {
    std::unique_ptr<Backend> backend = make_cuda_backend(0);
    static_cast<cuda::CudaBackend&>(*backend).set_reference_kernels(true);
    return backend;
  }
  if (name == "cuda-f32") {
    std::unique_ptr<Backend> backend = make_cuda_backend(0);
    static_cast<cuda::CudaBackend&>(*backend).set_f32_twins(true);
    return backend;
  }
#endif
  return make_backend_named(name, 0);
}

// Runs ops of one backend on host arrays: inputs are copied into the backend's memory, outputs are poisoned
// (NaN bytes) before the op and copied back after it.
class Ops {
 public:
  explicit Ops(const std::string& backend) : name_(backend), be_(make_ops_backend(backend)) {}
  const std::string& name() const { return name_; }

  FloatArray linear(In<float> x, const ArtifactHandle& art, const std::string& name, std::optional<In<float>> bias) {
    const TensorView& w = art.get()->tensor(name);
    const int64_t rows = rows_of(x, w.cols(), "x");
    MemoryBlock dx = put(x), dy = poisoned<float>(rows * w.rows()), db;
    if (bias) db = put(*bias);
    run([&] { be_->linear(dx.get<float>(), rows, w, dy.get<float>(), bias ? db.get<float>() : nullptr); });
    return get(dy, {rows, w.rows()});
  }

  // linear_shared_input over the named weights (all with x's width): one output per weight.
  std::vector<FloatArray> linear_shared_input(In<float> x, const ArtifactHandle& art,
                                              const std::vector<std::string>& names) {
    if (names.empty()) throw EngineError("linear_shared_input: no weights named");
    const int64_t rows = rows_of(x, art.get()->tensor(names[0]).cols(), "x");
    MemoryBlock dx = put(x);
    std::vector<MemoryBlock> ys;
    std::vector<LinearOut> outs;
    for (const std::string& name : names) {
      const TensorView& w = art.get()->tensor(name);
      rows_of(x, w.cols(), "x");
      ys.push_back(poisoned<float>(rows * w.rows()));
      outs.push_back({&w, nullptr, nullptr});
    }
    for (size_t i = 0; i < outs.size(); ++i) outs[i].y = ys[i].get<float>();
    run([&] { be_->linear_shared_input(dx.get<float>(), rows, outs); });
    std::vector<FloatArray> result;
    for (size_t i = 0; i < outs.size(); ++i) result.push_back(get(ys[i], {rows, outs[i].w->rows()}));
    return result;
  }

  FloatArray embed(In<int32_t> tokens, const ArtifactHandle& art, const std::string& name) {
    const TensorView& t = art.get()->tensor(name);
    const int64_t n = int64_t(tokens.size());
    MemoryBlock out = poisoned<float>(n * t.cols());
    run([&] { be_->embed(tokens.data(), n, t, out.get<float>()); });
    return get(out, {n, t.cols()});
  }

  FloatArray gather_rows(In<float> x, int64_t dim, In<int64_t> rows) {
    const int64_t n = int64_t(rows.size());
    MemoryBlock dx = put(x), out = poisoned<float>(n * dim);
    run([&] { be_->gather_rows(dx.get<float>(), dim, rows.data(), n, out.get<float>()); });
    return get(out, {n, dim});
  }

  FloatArray add(In<float> a, In<float> b) {
    MemoryBlock da = put(a), db = put(b);
    run([&] { be_->add(da.get<float>(), db.get<float>(), int64_t(a.size())); });
    return get(da, {int64_t(a.size())});
  }

  FloatArray swiglu(In<float> gate, In<float> up) {
    const int64_t n = int64_t(gate.size());
    MemoryBlock dg = put(gate), du = put(up), out = poisoned<float>(n);
    run([&] { be_->swiglu(dg.get<float>(), du.get<float>(), n, out.get<float>()); });
    return get(out, {n});
  }

  FloatArray copy_columns(In<float> x, int64_t rows, int64_t x_stride, int64_t cols) {
    MemoryBlock dx = put(x), out = poisoned<float>(rows * cols);
    run([&] { be_->copy_columns(dx.get<float>(), rows, x_stride, cols, out.get<float>()); });
    return get(out, {rows, cols});
  }

  FloatArray sigmoid_gate(In<float> x, int64_t rows, int32_t heads, int32_t dim, In<float> gate,
                          int64_t gate_row_stride, int64_t gate_head_stride) {
    MemoryBlock dx = put(x), dg = put(gate);
    run([&] { be_->sigmoid_gate(dx.get<float>(), rows, heads, dim, dg.get<float>(), gate_row_stride, gate_head_stride); });
    return get(dx, {rows, int64_t(heads) * dim});
  }

  // Returns the whole [rows, out_stride] output; columns past dim keep the poison.
  FloatArray rmsnorm(In<float> x, int64_t rows, int64_t dim, int64_t x_stride, In<float> w, bool offset, float eps,
                     int64_t out_stride) {
    MemoryBlock dx = put(x), dw = put(w), out = poisoned<float>(rows * out_stride);
    run([&] {
      be_->rmsnorm(dx.get<float>(), rows, dim, x_stride, dw.get<float>(), offset ? NormKind::Offset : NormKind::Plain,
                   eps, out.get<float>(), out_stride);
    });
    return get(out, {rows, out_stride});
  }

  // (hidden + delta, rmsnorm of it), both [rows, dim].
  std::tuple<FloatArray, FloatArray> add_rmsnorm(In<float> hidden, In<float> delta, int64_t rows, int64_t dim,
                                                 In<float> w, bool offset, float eps) {
    MemoryBlock dh = put(hidden), dd = put(delta), dw = put(w), out = poisoned<float>(rows * dim);
    run([&] {
      be_->add_rmsnorm(dh.get<float>(), dd.get<float>(), rows, dim, dw.get<float>(),
                       offset ? NormKind::Offset : NormKind::Plain, eps, out.get<float>());
    });
    return {get(dh, {rows, dim}), get(out, {rows, dim})};
  }

  // add_rmsnorm told (norm_feeds) that the named weights read its output, then linear_shared_input over them, as
  // a decode layer runs them: (hidden + delta, the norm, one output per weight).
  std::tuple<FloatArray, FloatArray, std::vector<FloatArray>> add_rmsnorm_linear(
      In<float> hidden, In<float> delta, int64_t rows, int64_t dim, In<float> w, bool offset, float eps,
      const ArtifactHandle& art, const std::vector<std::string>& names) {
    if (names.empty()) throw EngineError("add_rmsnorm_linear: no weights named");
    MemoryBlock dh = put(hidden), dd = put(delta), dw = put(w), out = poisoned<float>(rows * dim);
    std::vector<MemoryBlock> ys;
    std::vector<LinearOut> outs;
    for (const std::string& name : names) {
      const TensorView& t = art.get()->tensor(name);
      if (t.cols() != dim) throw EngineError("add_rmsnorm_linear: " + name + " does not take rows of " +
                                             std::to_string(dim));
      ys.push_back(poisoned<float>(rows * t.rows()));
      outs.push_back({&t, nullptr, nullptr});
    }
    for (size_t i = 0; i < outs.size(); ++i) outs[i].y = ys[i].get<float>();
    run([&] {
      be_->norm_feeds(*outs[0].w);
      be_->add_rmsnorm(dh.get<float>(), dd.get<float>(), rows, dim, dw.get<float>(),
                       offset ? NormKind::Offset : NormKind::Plain, eps, out.get<float>());
      be_->linear_shared_input(out.get<float>(), rows, outs);
    });
    std::vector<FloatArray> result;
    for (size_t i = 0; i < outs.size(); ++i) result.push_back(get(ys[i], {rows, outs[i].w->rows()}));
    return {get(dh, {rows, dim}), get(out, {rows, dim}), std::move(result)};
  }

  FloatArray gated_rmsnorm(In<float> x, In<float> z, int64_t rows, int32_t heads, int32_t dim, In<float> w, float eps) {
    MemoryBlock dx = put(x), dz = put(z), dw = put(w), out = poisoned<float>(rows * heads * dim);
    run([&] { be_->gated_rmsnorm(dx.get<float>(), dz.get<float>(), rows, heads, dim, dw.get<float>(), eps, out.get<float>()); });
    return get(out, {rows, int64_t(heads) * dim});
  }

  FloatArray l2norm_heads(In<float> x, int64_t rows, int32_t heads, int32_t dim, int64_t x_stride, float scale) {
    MemoryBlock dx = put(x), out = poisoned<float>(rows * heads * dim);
    run([&] { be_->l2norm_heads(dx.get<float>(), rows, heads, dim, x_stride, scale, out.get<float>()); });
    return get(out, {rows, int64_t(heads) * dim});
  }

  std::tuple<FloatArray, FloatArray> gdn_gates(In<float> a, In<float> b, int64_t rows, int32_t heads, In<float> A_log,
                                               In<float> dt_bias) {
    MemoryBlock da = put(a), db = put(b), dA = put(A_log), dd = put(dt_bias), g = poisoned<float>(rows * heads),
                beta = poisoned<float>(rows * heads);
    run([&] {
      be_->gdn_gates(da.get<float>(), db.get<float>(), rows, heads, dA.get<float>(), dd.get<float>(), g.get<float>(),
                     beta.get<float>());
    });
    return {get(g, {rows, heads}), get(beta, {rows, heads})};
  }

  // With freq_stream (one stream index per frequency): positions holds rows x streams values, stream s of row r
  // at r * streams + s, streams = positions.size() / rows.
  FloatArray rope(In<float> x, int64_t rows, int32_t heads, int64_t head_stride, int64_t row_stride,
                  In<int64_t> positions, In<float> inv_freq, bool interleaved, std::optional<In<uint8_t>> freq_stream) {
    const int32_t streams = freq_stream ? int32_t(positions.size() / size_t(std::max<int64_t>(rows, 1))) : 1;
    if (int64_t(positions.size()) != rows * streams || (freq_stream && freq_stream->size() != inv_freq.size()))
      throw EngineError("rope: positions must be rows x streams, freq_stream one per frequency");
    if (freq_stream)
      for (size_t i = 0; i < freq_stream->size(); ++i)
        if (freq_stream->data()[i] >= streams) throw EngineError("rope: a frequency names a stream past the last");
    MemoryBlock dx = put(x);
    const RopeSpec spec{interleaved ? RopePairing::Interleaved : RopePairing::Half, int32_t(2 * inv_freq.size()),
                        inv_freq.data(), streams, freq_stream ? freq_stream->data() : nullptr};
    run([&] { be_->rope(dx.get<float>(), rows, heads, head_stride, row_stride, positions.data(), spec); });
    return get(dx, {rows, row_stride});
  }

  // --- the vision tower's ops ---
  FloatArray layernorm(In<float> x, int64_t rows, int64_t dim, In<float> w, In<float> b, float eps) {
    if (int64_t(x.size()) != rows * dim || int64_t(w.size()) != dim || int64_t(b.size()) != dim)
      throw EngineError("layernorm: x must be rows x dim, w and b dim values");
    MemoryBlock dx = put(x), dw = put(w), db = put(b), out = poisoned<float>(rows * dim);
    run([&] { be_->layernorm(dx.get<float>(), rows, dim, dw.get<float>(), db.get<float>(), eps, out.get<float>()); });
    return get(out, {rows, dim});
  }

  // kind: "tanh" or "erf".
  FloatArray gelu(In<float> x, const std::string& kind) {
    if (kind != "tanh" && kind != "erf") throw EngineError("gelu: kind must be \"tanh\" or \"erf\"");
    const int64_t n = int64_t(x.size());
    MemoryBlock dx = put(x), out = poisoned<float>(n);
    run([&] { be_->gelu(dx.get<float>(), n, kind == "tanh" ? GeluKind::Tanh : GeluKind::Erf, out.get<float>()); });
    return get(out, {n});
  }

  // x [rows, cols of the table] plus the mix of the named table's rows; ids and weights [rows, taps] (host tables).
  FloatArray add_embedding_mix(In<float> x, In<int32_t> ids, In<float> weights, int32_t taps, const ArtifactHandle& art,
                               const std::string& name) {
    const TensorView& table = art.get()->tensor(name);
    const int64_t rows = rows_of(x, table.cols(), "x");
    if (taps <= 0 || int64_t(ids.size()) != rows * taps || weights.size() != ids.size())
      throw EngineError("add_embedding_mix: ids and weights must be rows x taps");
    MemoryBlock dx = put(x);
    run([&] { be_->add_embedding_mix(ids.data(), weights.data(), rows, taps, table, dx.get<float>()); });
    return get(dx, {rows, table.cols()});
  }

  // q, k, v [rows, row_stride] each, head h of a row at h * head_dim; segments (row0, n). Returns out
  // [rows, heads * head_dim]; rows outside every segment keep the poison.
  FloatArray segment_attention(In<float> q, In<float> k, In<float> v, int64_t row_stride,
                               const std::vector<std::pair<int64_t, int64_t>>& segments, int32_t heads,
                               int32_t head_dim, float scale) {
    const int64_t rows = row_stride > 0 ? int64_t(q.size()) / row_stride : 0;
    if (rows * row_stride != int64_t(q.size()) || k.size() != q.size() || v.size() != q.size() ||
        int64_t(heads) * head_dim > row_stride)
      throw EngineError("segment_attention: q, k, v must be rows x row_stride, heads x head_dim <= row_stride");
    std::vector<RowSegment> segs;
    for (const auto& [row0, n] : segments) {
      if (row0 < 0 || n < 0 || row0 + n > rows) throw EngineError("segment_attention: a segment outside the rows");
      segs.push_back({row0, n});
    }
    MemoryBlock dq = put(q), dk = put(k), dv = put(v), out = poisoned<float>(rows * heads * head_dim);
    run([&] {
      be_->segment_attention(dq.get<float>(), dk.get<float>(), dv.get<float>(), row_stride, segs, heads, head_dim,
                             scale, out.get<float>());
    });
    return get(out, {rows, int64_t(heads) * head_dim});
  }

  // Writes each sequence's history rows (positions 0..start-1) and then its new rows into a fresh pool, in one
  // kv_write call each, and attends the new rows' queries. history_k/v hold the histories one after another,
  // new_k/v and q the new rows one after another. Returns out [new rows, heads * head_dim].
  FloatArray attention(In<float> q, int64_t q_row_stride, int64_t q_head_stride, In<float> history_k,
                       In<float> history_v, In<float> new_k, In<float> new_v, const std::vector<PySeq>& seqs,
                       int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, float scale,
                       const std::string& kv_dtype, int64_t pool_pages, int32_t layers, int32_t layer) {
    KvPool pool(layers, num_kv_heads, head_dim, pool_pages, parse_kv_dtype(kv_dtype), be_->memory());
    std::vector<SequenceRows> history, fresh;
    int64_t history_rows = 0, rows = 0;
    for (const auto& [start, n, pages] : seqs) {
      if (int64_t(pages.size()) * kKvPageTokens < start + n) throw EngineError("attention: too few pages for a sequence");
      history.push_back({history_rows, start, 0, pages.data(), -1});
      fresh.push_back({rows, n, start, pages.data(), -1});
      history_rows += start;
      rows += n;
    }
    MemoryBlock dq = put(q), dhk = put(history_k), dhv = put(history_v), dnk = put(new_k), dnv = put(new_v),
                out = poisoned<float>(rows * num_heads * head_dim);
    run([&] {
      be_->kv_write(dhk.get<float>(), dhv.get<float>(), history, pool, layer);
      be_->kv_write(dnk.get<float>(), dnv.get<float>(), fresh, pool, layer);
      be_->attention(dq.get<float>(), q_row_stride, q_head_stride, fresh, pool, layer,
                     AttentionShape{num_heads, num_kv_heads, head_dim, scale}, out.get<float>());
    });
    return get(out, {rows, int64_t(num_heads) * head_dim});
  }

  std::tuple<IntArray, FloatArray> moe_route(In<float> logits, int64_t rows, int32_t experts, int32_t top_k) {
    MemoryBlock dl = put(logits), ids = poisoned<int32_t>(rows * top_k), w = poisoned<float>(rows * top_k);
    run([&] { be_->moe_route(dl.get<float>(), rows, experts, top_k, ids.get<int32_t>(), w.get<float>()); });
    return {get_ids(ids, rows, top_k), get(w, {rows, top_k})};
  }

  IntArray argmax_rows(In<float> x, int64_t rows, int64_t cols) {
    MemoryBlock dx = put(x), ids = poisoned<int32_t>(rows);
    run([&] { be_->argmax_rows(dx.get<float>(), rows, cols, ids.get<int32_t>()); });
    return get_ids(ids, rows, 1);
  }

  // With shared_out [rows, hidden] and shared_logit [rows]: plus the gated shared expert.
  FloatArray moe_experts(In<float> x, int64_t rows, int64_t hidden, In<int32_t> ids, In<float> weights, int32_t top_k,
                         const ArtifactHandle& art, const std::string& gate, const std::string& up,
                         const std::string& down, std::optional<In<float>> shared_out,
                         std::optional<In<float>> shared_logit) {
    if (shared_out.has_value() != shared_logit.has_value())
      throw EngineError("moe_experts: shared_out and shared_logit go together");
    const Artifact& a = *art.get();
    MemoryBlock dx = put(x), di = put(ids), dw = put(weights), out = poisoned<float>(rows * hidden), ds, dl;
    SharedExpertTerm shared;
    if (shared_out) {
      if (rows_of(*shared_out, hidden, "shared_out") != rows || int64_t(shared_logit->size()) != rows)
        throw EngineError("moe_experts: shared_out and shared_logit need one row per x row");
      ds = put(*shared_out);
      dl = put(*shared_logit);
      shared = {ds.get<float>(), dl.get<float>()};
    }
    run([&] {
      be_->moe_experts(dx.get<float>(), rows, hidden, di.get<int32_t>(), dw.get<float>(), top_k, a.tensor(gate),
                       a.tensor(up), a.tensor(down), shared, out.get<float>());
    });
    return get(out, {rows, hidden});
  }

  // Sequence i holds rows n_0 + .. + n_{i-1} onwards and uses state slot slots[i]; states_in [slots, floats].
  // `sources` (empty, or one per sequence): SequenceRows::source_slot (-1: none).
  std::tuple<FloatArray, FloatArray> gdn_conv(In<float> mixed, const std::vector<int64_t>& ns,
                                              const std::vector<int32_t>& slots, int64_t channels, In<float> weight,
                                              int32_t kernel, In<float> states_in,
                                              const std::vector<int32_t>& sources) {
    const GdnShape shape = conv_shape(channels, kernel);
    const int64_t conv_floats = channels * (kernel - 1);
    StatePool states(int32_t(states_in.size() / std::max<int64_t>(conv_floats, 1)), 1, conv_floats, 1,
                     be_->memory());
    load_states(states, states_in, conv_floats, [&](int32_t s) { return states.conv(s, 0); });
    const std::vector<SequenceRows> seqs = sequences(ns, slots, sources);
    const int64_t rows = total(ns);
    MemoryBlock dm = put(mixed), dw = put(weight), out = poisoned<float>(rows * channels);
    run([&] { be_->gdn_conv(dm.get<float>(), seqs, shape, dw.get<float>(), states, 0, out.get<float>()); });
    return {get(out, {rows, channels}), read_states(states, conv_floats, [&](int32_t s) { return states.conv(s, 0); })};
  }

  // gdn_conv_qkv over mixed [rows, 2 hk dk + hv dv], sequences and states as gdn_conv takes them: (q, k, v,
  // states out).
  std::tuple<FloatArray, FloatArray, FloatArray, FloatArray> gdn_conv_qkv(
      In<float> mixed, const std::vector<int64_t>& ns, const std::vector<int32_t>& slots, int32_t hk, int32_t hv,
      int32_t dk, int32_t dv, In<float> weight, int32_t kernel, float q_scale, In<float> states_in,
      const std::vector<int32_t>& sources) {
    const GdnShape shape{hk, hv, dk, dv, kernel, 64};
    const int64_t channels = shape.conv_channels(), conv_floats = channels * (kernel - 1);
    const int64_t qk_width = int64_t(hk) * dk, v_width = int64_t(hv) * dv;
    StatePool states(int32_t(states_in.size() / std::max<int64_t>(conv_floats, 1)), 1, conv_floats, 1,
                     be_->memory());
    load_states(states, states_in, conv_floats, [&](int32_t s) { return states.conv(s, 0); });
    const std::vector<SequenceRows> seqs = sequences(ns, slots, sources);
    const int64_t rows = total(ns);
    MemoryBlock dm = put(mixed), dw = put(weight), q = poisoned<float>(rows * qk_width),
                k = poisoned<float>(rows * qk_width), v = poisoned<float>(rows * v_width);
    run([&] {
      be_->gdn_conv_qkv(dm.get<float>(), seqs, shape, dw.get<float>(), states, 0, q_scale, q.get<float>(),
                        k.get<float>(), v.get<float>());
    });
    return {get(q, {rows, qk_width}), get(k, {rows, qk_width}), get(v, {rows, v_width}),
            read_states(states, conv_floats, [&](int32_t s) { return states.conv(s, 0); })};
  }

  std::tuple<FloatArray, FloatArray> gdn_rule(In<float> q, In<float> k, In<float> v, In<float> g, In<float> beta,
                                              const std::vector<int64_t>& ns, const std::vector<int32_t>& slots,
                                              int32_t hk, int32_t hv, int32_t dk, int32_t dv, int32_t chunk,
                                              In<float> states_in, const std::vector<int32_t>& sources) {
    const GdnShape shape{hk, hv, dk, dv, 4, chunk};
    const int64_t state_floats = int64_t(hv) * dk * dv;
    StatePool states(int32_t(states_in.size() / state_floats), 1, 1, state_floats, be_->memory());
    load_states(states, states_in, state_floats, [&](int32_t s) { return states.recurrent(s, 0); });
    const std::vector<SequenceRows> seqs = sequences(ns, slots, sources);
    const int64_t rows = total(ns);
    MemoryBlock dq = put(q), dk_ = put(k), dv_ = put(v), dg = put(g), db = put(beta),
                out = poisoned<float>(rows * hv * dv);
    run([&] {
      be_->gdn_rule(dq.get<float>(), dk_.get<float>(), dv_.get<float>(), dg.get<float>(), db.get<float>(), seqs, shape,
                    states, 0, out.get<float>());
    });
    return {get(out, {rows, int64_t(hv) * dv}),
            read_states(states, state_floats, [&](int32_t s) { return states.recurrent(s, 0); })};
  }

 private:
  template <class T>
  MemoryBlock put(const In<T>& a) {
    MemoryBlock block(be_->memory(), std::max<size_t>(a.size(), 1) * sizeof(T), "test input");
    if (a.size()) be_->memory().from_host(block.get(), a.data(), a.size() * sizeof(T));
    return block;
  }
  template <class T>
  MemoryBlock poisoned(int64_t count) {
    MemoryBlock block(be_->memory(), size_t(std::max<int64_t>(count, 1)) * sizeof(T), "test output");
    be_->memory().fill(block.get(), 0xff, block.bytes());  // NaN as f32, -1 as int32
    return block;
  }
  IntArray get_ids(const MemoryBlock& block, int64_t rows, int64_t cols) {
    int32_t* host_ids = new int32_t[size_t(std::max<int64_t>(rows * cols, 1))];
    nb::capsule owner(host_ids, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
    be_->memory().to_host(host_ids, block.get(), size_t(rows * cols) * sizeof(int32_t));
    const size_t shape[2] = {size_t(rows), size_t(cols)};
    return IntArray(host_ids, 2, shape, owner);
  }
  FloatArray get(const MemoryBlock& block, const std::vector<int64_t>& shape) {
    size_t count = 1;
    for (int64_t d : shape) count *= size_t(d);
    OwnedFloats out = allocate_floats(count);
    be_->memory().to_host(out.data, block.get(), count * sizeof(float));
    return as_array(out, shape);
  }
  template <class Fn>
  void run(Fn&& fn) {
    nb::gil_scoped_release release;
    be_->bind_calling_thread();
    fn();
  }
  static int64_t rows_of(const In<float>& x, int64_t cols, const char* what) {
    if (x.ndim() != 2 || int64_t(x.shape(1)) != cols)
      throw EngineError(std::string(what) + " must be [rows, " + std::to_string(cols) + "]");
    return int64_t(x.shape(0));
  }
  static GdnShape conv_shape(int64_t channels, int32_t kernel) {
    // conv_channels() = 2 Hk Dk + Hv Dv: one key head of 0 width and `channels` value columns reproduce any C.
    return GdnShape{1, 1, 0, int32_t(channels), kernel, 64};
  }
  static int64_t total(const std::vector<int64_t>& ns) {
    int64_t t = 0;
    for (int64_t n : ns) t += n;
    return t;
  }
  static std::vector<SequenceRows> sequences(const std::vector<int64_t>& ns, const std::vector<int32_t>& slots,
                                             const std::vector<int32_t>& sources) {
    if (ns.size() != slots.size()) throw EngineError("one state slot per sequence");
    if (!sources.empty() && sources.size() != ns.size()) throw EngineError("one source slot per sequence, or none");
    std::vector<SequenceRows> seqs;
    int64_t row0 = 0;
    for (size_t i = 0; i < ns.size(); ++i) {
      // Positions: a one-row sequence that continues the one before sits one position after it (a verify chain).
      const int64_t start = i > 0 && !sources.empty() && sources[i] == slots[i - 1] ? seqs.back().start + seqs.back().n : 0;
      seqs.push_back({row0, ns[i], start, nullptr, slots[i], sources.empty() ? -1 : sources[i]});
      row0 += ns[i];
    }
    return seqs;
  }
  template <class At>
  void load_states(StatePool& states, const In<float>& host, int64_t floats, At at) {
    for (int32_t s = 0; s < states.total_slots(); ++s)
      be_->memory().from_host(at(s), host.data() + s * floats, size_t(floats) * sizeof(float));
  }
  template <class At>
  FloatArray read_states(StatePool& states, int64_t floats, At at) {
    OwnedFloats out = allocate_floats(size_t(states.total_slots() * floats));
    for (int32_t s = 0; s < states.total_slots(); ++s)
      be_->memory().to_host(out.data + s * floats, at(s), size_t(floats) * sizeof(float));
    return as_array(out, {states.total_slots(), floats});
  }

  std::string name_;
  std::unique_ptr<Backend> be_;
};

}  // namespace

void bind_backend_ops(nb::module_& m) {
  nb::class_<Ops>(m, "Ops", "Every Backend op on numpy arrays, for one backend (\"cpu\", \"cuda\" or "
                            "\"cuda-reference\": CUDA with its slow twins; \"cuda-f32\": with the f32 twins of its "
                            "tensor-core kernels); outputs are NaN-poisoned before each op.")
      .def(nb::init<const std::string&>(), nb::arg("backend"))
      .def_prop_ro("backend", &Ops::name)
      .def("linear", &Ops::linear, nb::arg("x"), nb::arg("artifact"), nb::arg("name"), nb::arg("bias").none() = nb::none())
      .def("linear_shared_input", &Ops::linear_shared_input, nb::arg("x"), nb::arg("artifact"), nb::arg("names"))
      .def("embed", &Ops::embed)
      .def("gather_rows", &Ops::gather_rows)
      .def("add", &Ops::add)
      .def("swiglu", &Ops::swiglu)
      .def("copy_columns", &Ops::copy_columns)
      .def("sigmoid_gate", &Ops::sigmoid_gate)
      .def("rmsnorm", &Ops::rmsnorm)
      .def("add_rmsnorm", &Ops::add_rmsnorm)
      .def("add_rmsnorm_linear", &Ops::add_rmsnorm_linear)
      .def("gated_rmsnorm", &Ops::gated_rmsnorm)
      .def("l2norm_heads", &Ops::l2norm_heads)
      .def("gdn_gates", &Ops::gdn_gates)
      .def("rope", &Ops::rope, nb::arg("x"), nb::arg("rows"), nb::arg("heads"), nb::arg("head_stride"),
           nb::arg("row_stride"), nb::arg("positions"), nb::arg("inv_freq"), nb::arg("interleaved"),
           nb::arg("freq_stream").none() = nb::none())
      .def("layernorm", &Ops::layernorm)
      .def("gelu", &Ops::gelu)
      .def("add_embedding_mix", &Ops::add_embedding_mix)
      .def("segment_attention", &Ops::segment_attention)
      .def("attention", &Ops::attention)
      .def("moe_route", &Ops::moe_route)
      .def("argmax_rows", &Ops::argmax_rows, nb::arg("x"), nb::arg("rows"), nb::arg("cols"))
      .def("moe_experts", &Ops::moe_experts, nb::arg("x"), nb::arg("rows"), nb::arg("hidden"), nb::arg("ids"),
           nb::arg("weights"), nb::arg("top_k"), nb::arg("artifact"), nb::arg("gate"), nb::arg("up"), nb::arg("down"),
           nb::arg("shared_out").none() = nb::none(), nb::arg("shared_logit").none() = nb::none())
      .def("gdn_conv", &Ops::gdn_conv, nb::arg("mixed"), nb::arg("ns"), nb::arg("slots"), nb::arg("channels"),
           nb::arg("weight"), nb::arg("kernel"), nb::arg("states_in"), nb::arg("sources") = std::vector<int32_t>{})
      .def("gdn_conv_qkv", &Ops::gdn_conv_qkv, nb::arg("mixed"), nb::arg("ns"), nb::arg("slots"), nb::arg("hk"),
           nb::arg("hv"), nb::arg("dk"), nb::arg("dv"), nb::arg("weight"), nb::arg("kernel"), nb::arg("q_scale"),
           nb::arg("states_in"), nb::arg("sources") = std::vector<int32_t>{})
      .def("gdn_rule", &Ops::gdn_rule, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
           nb::arg("ns"), nb::arg("slots"), nb::arg("hk"), nb::arg("hv"), nb::arg("dk"), nb::arg("dv"),
           nb::arg("chunk"), nb::arg("states_in"), nb::arg("sources") = std::vector<int32_t>{});
}

}  // namespace ninfer::bindings
