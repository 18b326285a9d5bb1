// `_engine.cuda`: the CUDA kernels exposed for their parity tests (against the CPU twins) and the kernel
// benchmarks. `built` says whether this extension has the CUDA backend; device_count() whether a GPU is usable.
#include "bindings/testing/backend_ops.h"
#include "bindings/testing/testing.h"

#ifdef NINFER_HAVE_CUDA
#include <cuda_runtime.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gdn_decode.h"
#include "backend/cuda/gdn_prefill.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/gemv_mma.h"
#include "backend/cuda/lt_matmul.h"
#include "backend/cuda/moe_grouped.h"
#include "backend/cuda/norm_split.h"
#include "backend/cuda/prefill_gemm.h"
#include "backend/cuda/sampling.h"
#include "bindings/array_out.h"
#include "bindings/artifact_handle.h"
#include "cache/kv_codec.h"
#include "cache/kv_pool.h"
#include "cache/page_table.h"
#include "cache/kv_quant.h"
#include "cache/state_pool.h"
#endif

namespace nb = nanobind;

namespace ninfer::bindings {

#ifdef NINFER_HAVE_CUDA
namespace {

using InFloats = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for the caller, just no GPU
    return 0;
  }
  return count;
}

cuda::DeviceBuffer to_device(const InFloats& a) {
  cuda::DeviceBuffer buffer(a.size() * sizeof(float));
  buffer.upload(a.data(), a.size() * sizeof(float));
  return buffer;
}

FloatArray to_host(const cuda::DeviceBuffer& buffer, const std::vector<int64_t>& shape) {
  size_t count = 1;
  for (int64_t d : shape) count *= size_t(d);
  OwnedFloats out = allocate_floats(count);
  buffer.download(out.data, count * sizeof(float));
  return as_array(out, shape);
}

// The decode GEMV that `impl` names: "mma" (tensor cores), "mma_v3" (its predecessor, until one more GPU run has
// compared them at 8 rows), "mma_planes" (v5 reading the split kernel's planes, the twin of its in-register
// split), "simt" (the CUDA-core twin), or "auto" (what the backend's linear() takes).
class GemvLauncher {
 public:
  GemvLauncher(const std::string& impl, const TensorView& w) {
    const bool variant = impl == "mma_v3" || impl == "mma_planes";
    if (impl != "auto" && impl != "mma" && !variant && impl != "simt")
      throw EngineError("cuda gemv: impl must be auto, mma, mma_v3, mma_planes or simt, not " + impl);
    mma_ = impl == "mma" || variant || (impl == "auto" && cuda::gemv_mma_supports(w));
    kernel_ = impl == "mma_v3"       ? cuda::MmaKernel::v3
              : impl == "mma_planes" ? cuda::MmaKernel::v5_planes
                                     : cuda::MmaKernel::v5;
    if (mma_ && !cuda::gemv_mma_supports(w))
      throw EngineError("cuda gemv: the tensor-core path does not take " + w.name);
  }
  void operator()(const float* x, int rows, const TensorView& w, float* y, cudaStream_t stream = nullptr) {
    if (mma_) {
      cuda::gemv_mma(x, rows, w, y, workspace_, stream, kernel_);
    } else {
      cuda::gemv(x, rows, w, y, stream);
    }
  }
  // Every weight of `ws` on one activation split, as the backend runs projections that share their input (the
  // tensor-core path only: the twin has no split).
  void shared_split(const float* x, int rows, const std::vector<cuda::DeviceWeight>& ws, float* y,
                    cudaStream_t stream) {
    if (!mma_) throw EngineError("cuda gemv: only the tensor-core path splits its activations");
    const TensorView& first = ws[0].view;
    const cuda::SplitActivations split =
        cuda::split_activations(x, rows, first.cols(), cuda::split_kind(first), workspace_, stream);
    for (const cuda::DeviceWeight& w : ws) {
      const cuda::MmaOutput out[] = {{&w.view, y}};
      cuda::gemv_mma(split, out, workspace_, stream, kernel_);
    }
  }

 private:
  bool mma_ = false;
  cuda::MmaKernel kernel_ = cuda::MmaKernel::v5;
  cuda::GemvWorkspace workspace_;
};

// y = x W^T on the GPU for x [rows, cols]; the output buffer is poisoned (NaN bytes) first. `x_offset` places x
// that many floats into its device buffer (1..3: activations not 16-byte aligned, as a slice of a row can be).
FloatArray linear(const InFloats& x, const ArtifactHandle& handle, const std::string& name, const std::string& impl,
                  int x_offset) {
  const TensorView& host = handle.get()->tensor(name);
  if (x.ndim() != 2 || x.shape(1) != size_t(host.cols())) {
    throw EngineError("cuda.linear: x must be [rows, " + std::to_string(host.cols()) + "]");
  }
  const int rows = int(x.shape(0));
  cuda::DeviceWeight weight = cuda::upload_weight(host);
  if (x_offset < 0 || x_offset > 3) throw EngineError("cuda.linear: x_offset must be 0..3 floats");
  GemvLauncher gemv(impl, weight.view);
  cuda::DeviceBuffer x_device((x.size() + size_t(x_offset)) * sizeof(float));
  NINFER_CUDA_CHECK(cudaMemcpy(x_device.as<float>() + x_offset, x.data(), x.size() * sizeof(float),
                               cudaMemcpyHostToDevice));
  cuda::DeviceBuffer y_device(size_t(rows) * size_t(host.rows()) * sizeof(float));
  NINFER_CUDA_CHECK(cudaMemset(y_device.get(), 0xff, y_device.bytes()));
  {
    nb::gil_scoped_release release;
    gemv(x_device.as<float>() + x_offset, rows, weight.view, y_device.as<float>());
    NINFER_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return to_host(y_device, {rows, host.rows()});
}

// add_rmsnorm of hidden + delta ([rows, dim], Offset weight w, eps 1e-6) on the GPU, then the tensor-core GEMV's split
// planes of its output for weight `name`'s split kind: written by the norm itself (`fused`), or by
// split_activations() after it (the twin). Returns (hidden, out, the planes and row exponents as raw bytes).
std::tuple<FloatArray, FloatArray, nb::bytes> add_rmsnorm_planes(const InFloats& hidden, const InFloats& delta,
                                                                  const InFloats& w, const ArtifactHandle& handle,
                                                                  const std::string& name, bool fused) {
  const TensorView& host = handle.get()->tensor(name);
  const int64_t dim = host.cols();
  if (hidden.ndim() != 2 || hidden.shape(1) != size_t(dim) || delta.size() != hidden.size() ||
      w.size() != size_t(dim))
    throw EngineError("cuda.add_rmsnorm_planes: hidden and delta must be [rows, " + std::to_string(dim) +
                      "], w [" + std::to_string(dim) + "]");
  const int rows = int(hidden.shape(0)), kind = cuda::split_kind(host);
  if (!cuda::split_has_planes(kind)) throw EngineError("cuda.add_rmsnorm_planes: " + name + " reads no split planes");
  cuda::DeviceBuffer h = to_device(hidden), d = to_device(delta), dw = to_device(w);
  cuda::DeviceBuffer out(hidden.size() * sizeof(float));
  cuda::GemvWorkspace workspace;
  const size_t plane_bytes = size_t(rows) * size_t(dim) * 2 * sizeof(uint16_t) + size_t(rows) * sizeof(int);
  std::string planes(plane_bytes, '\0');
  {
    nb::gil_scoped_release release;
    NINFER_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));
    const cuda::SplitActivations layout = cuda::split_layout(out.as<float>(), rows, dim, kind, workspace, nullptr);
    NINFER_CUDA_CHECK(cudaMemset(workspace.split_.get(), 0xff, workspace.split_.bytes()));
    cuda::launch_add_rmsnorm(h.as<float>(), d.as<float>(), rows, dim, dw.as<float>(), 1.0f, 1e-6f, out.as<float>(),
                             fused ? &layout : nullptr, nullptr);
    if (!fused) cuda::split_activations(out.as<float>(), rows, dim, kind, workspace, nullptr);
    NINFER_CUDA_CHECK(cudaDeviceSynchronize());
    NINFER_CUDA_CHECK(cudaMemcpy(planes.data(), layout.hi, plane_bytes, cudaMemcpyDeviceToHost));
  }
  return {to_host(h, {rows, dim}), to_host(out, {rows, dim}), nb::bytes(planes.data(), planes.size())};
}

// y = x W^T (+ bias) on the GPU by the prefill GEMM (`impl`: auto, twin, bf16, fp8, fp8_separate_scaling,
// streamed); the
// output buffer is poisoned (NaN bytes) first. Returns (y, the implementation that ran).
std::tuple<FloatArray, std::string> gemm(const InFloats& x, const ArtifactHandle& handle, const std::string& name,
                                         const std::string& impl, std::optional<InFloats> bias) {
  const TensorView& host = handle.get()->tensor(name);
  if (x.ndim() != 2 || x.shape(1) != size_t(host.cols()))
    throw EngineError("cuda.gemm: x must be [rows, " + std::to_string(host.cols()) + "]");
  if (bias && (bias->ndim() != 1 || bias->shape(0) != size_t(host.rows())))
    throw EngineError("cuda.gemm: bias must be [" + std::to_string(host.rows()) + "]");
  const int64_t rows = int64_t(x.shape(0));
  const cuda::GemmImpl requested = cuda::gemm_impl_from_name(impl);
  cuda::DeviceWeight weight = cuda::upload_weight(host);
  cuda::DeviceBuffer x_device = to_device(x);
  cuda::DeviceBuffer bias_device = bias ? to_device(*bias) : cuda::DeviceBuffer();
  cuda::DeviceBuffer y_device(size_t(rows) * size_t(host.rows()) * sizeof(float));
  NINFER_CUDA_CHECK(cudaMemset(y_device.get(), 0xff, y_device.bytes()));
  cuda::GemmImpl ran;
  {
    nb::gil_scoped_release release;
    cuda::PrefillGemm prefill;
    ran = prefill.run(x_device.as<float>(), rows, weight.view, y_device.as<float>(), bias_device.as<float>(),
                      nullptr, requested);
    NINFER_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return {to_host(y_device, {rows, host.rows()}), cuda::gemm_impl_name(ran)};
}

// One decode step of the gated delta rule for a batch: q, k [B, Hk, Dk], v [B, Hv, Dv], g, beta [B, Hv],
// states [B, Hv, Dk, Dv]. Returns (out [B, Hv, Dv], new states).
std::tuple<FloatArray, FloatArray> gdn_decode(const InFloats& q, const InFloats& k, const InFloats& v,
                                              const InFloats& g, const InFloats& beta, const InFloats& states) {
  if (q.ndim() != 3 || v.ndim() != 3 || states.ndim() != 4) {
    throw EngineError("cuda.gdn_decode: expected q/k [B,Hk,Dk], v [B,Hv,Dv], states [B,Hv,Dk,Dv]");
  }
  cuda::GdnDecodeArgs args;
  args.batch = int32_t(q.shape(0));
  args.num_key_heads = int32_t(q.shape(1));
  args.key_head_dim = int32_t(q.shape(2));
  args.num_value_heads = int32_t(v.shape(1));
  args.value_head_dim = int32_t(v.shape(2));
  cuda::DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dg = to_device(g),
                     dbeta = to_device(beta), dstates = to_device(states);
  cuda::DeviceBuffer dout(size_t(args.batch) * args.num_value_heads * args.value_head_dim * sizeof(float));
  NINFER_CUDA_CHECK(cudaMemset(dout.get(), 0xff, dout.bytes()));
  const size_t state_floats = size_t(args.num_value_heads) * args.key_head_dim * args.value_head_dim;
  std::vector<float*> pointers(args.batch);
  for (int b = 0; b < args.batch; ++b) pointers[b] = dstates.as<float>() + b * state_floats;
  cuda::DeviceBuffer dpointers(pointers.size() * sizeof(float*));
  dpointers.upload(pointers.data(), dpointers.bytes());
  args.q = dq.as<float>();
  args.k = dk.as<float>();
  args.v = dv.as<float>();
  args.g = dg.as<float>();
  args.beta = dbeta.as<float>();
  args.states = dpointers.as<float* const>();
  args.out = dout.as<float>();
  {
    nb::gil_scoped_release release;
    cuda::gdn_decode(args, nullptr);
    NINFER_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return {to_host(dout, {args.batch, args.num_value_heads, args.value_head_dim}),
          to_host(dstates, {args.batch, args.num_value_heads, args.key_head_dim, args.value_head_dim})};
}

// Median microseconds of the work `run(it)` enqueues on `stream`, timed with CUDA events around it, over
// `iterations` runs after one warm-up run (it = 0). `before(it)` runs on the host first, outside the timed span.
struct NoHostStep {
  void operator()(int) const {}
};
template <class Run, class Before = NoHostStep>
double median_event_micros(cudaStream_t stream, int iterations, Run run, Before before = {}) {
  cudaEvent_t start, stop;
  NINFER_CUDA_CHECK(cudaEventCreate(&start));
  NINFER_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int it = 0; it <= iterations; ++it) {
    before(it);
    NINFER_CUDA_CHECK(cudaEventRecord(start, stream));
    run(it);
    NINFER_CUDA_CHECK(cudaEventRecord(stop, stream));
    NINFER_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    NINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (it > 0) times.push_back(ms * 1000.0f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return double(times[times.size() / 2]);
}

// Median microseconds of one kernel launch `launch(it)` on the legacy stream, without the GIL.
template <class Launch>
double median_kernel_micros(int iterations, Launch launch) {
  nb::gil_scoped_release release;
  return median_event_micros(nullptr, iterations, launch);
}

// Median time of what `capture()` enqueues on `stream`, captured once in a CUDA graph (no host gaps between
// launches, as in a captured decode pass), over `iterations` graph launches after one warm-up launch.
template <class Capture>
double median_graph_micros(cudaStream_t stream, int iterations, Capture capture) {
  cudaGraph_t graph = nullptr;
  NINFER_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  capture();
  NINFER_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  NINFER_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double micros =
      median_event_micros(stream, iterations, [&](int) { NINFER_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return micros;
}

// Median time of the decode GEMV over `copies` device copies of the weight, one call per copy in turn (so that the
// set is larger than L2 and every call streams from device memory), the calls captured in one graph. Each call
// splits the activations itself, or (`shared_split`, tensor-core path) one split serves every copy, as for a
// layer's projections that share their input: then the time is mostly the GEMV kernel's. Returns (median
// microseconds per call, weight bytes per call).
std::tuple<double, double> bench_linear(const ArtifactHandle& handle, const std::string& name, int rows, int copies,
                                        int iterations, const std::string& impl, bool shared_split) {
  const TensorView& host = handle.get()->tensor(name);
  std::vector<cuda::DeviceWeight> weights;
  for (int c = 0; c < copies; ++c) weights.push_back(cuda::upload_weight(host));
  GemvLauncher gemv(impl, weights[0].view);
  const double bytes = double(cuda::data_bytes(host) + cuda::scale_bytes(host) + cuda::zero_bytes(host));
  std::vector<float> x_host(size_t(rows) * size_t(host.cols()));
  for (size_t i = 0; i < x_host.size(); ++i) x_host[i] = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  cuda::DeviceBuffer x(x_host.size() * sizeof(float));
  x.upload(x_host.data(), x.bytes());
  cuda::DeviceBuffer y(size_t(rows) * size_t(host.rows()) * sizeof(float));
  nb::gil_scoped_release release;
  NINFER_CUDA_CHECK(cudaDeviceSynchronize());  // the workspace's zeroed counters, on the legacy stream
  cudaStream_t stream = nullptr;
  NINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gemv(x.as<float>(), rows, weights[0].view, y.as<float>(), stream);  // grows the workspace outside the capture
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double micros = median_graph_micros(stream, iterations, [&] {
    if (shared_split) {
      gemv.shared_split(x.as<float>(), rows, weights, y.as<float>(), stream);
    } else {
      for (const cuda::DeviceWeight& w : weights) gemv(x.as<float>(), rows, w.view, y.as<float>(), stream);
    }
  });
  NINFER_CUDA_CHECK(cudaStreamDestroy(stream));
  return {micros / copies, bytes};
}

// Median time of the prefill GEMM for `rows` rows of x (deterministic values) by `impl`, activation preparation
// (bf16 or e4m3 rounding) and weight dequantization included. Returns (median microseconds, implementation run).
std::tuple<double, std::string> bench_gemm(const ArtifactHandle& handle, const std::string& name, int64_t rows,
                                           const std::string& impl, int iterations) {
  const TensorView& host = handle.get()->tensor(name);
  const cuda::GemmImpl requested = cuda::gemm_impl_from_name(impl);
  cuda::DeviceWeight weight = cuda::upload_weight(host);
  std::vector<float> x_host(size_t(rows) * size_t(host.cols()));
  for (size_t i = 0; i < x_host.size(); ++i) x_host[i] = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  cuda::DeviceBuffer x(x_host.size() * sizeof(float));
  x.upload(x_host.data(), x.bytes());
  cuda::DeviceBuffer y(size_t(rows) * size_t(host.rows()) * sizeof(float));
  cuda::PrefillGemm prefill;
  cuda::GemmImpl ran = requested;
  const double micros = median_kernel_micros(iterations, [&](int) {
    ran = prefill.run(x.as<float>(), rows, weight.view, y.as<float>(), nullptr, nullptr, requested);
  });
  return {micros, cuda::gemm_impl_name(ran)};
}

// Median time of one gated-delta-rule decode step (kernel only) for `batch` sequences; states are distinct
// per sequence, as in serving. Returns (median microseconds, state bytes read + written).
std::tuple<double, double> bench_gdn_decode(int batch, int hk, int hv, int dk, int dv, int iterations) {
  cuda::GdnDecodeArgs args;
  args.batch = batch;
  args.num_key_heads = hk;
  args.num_value_heads = hv;
  args.key_head_dim = dk;
  args.value_head_dim = dv;
  const size_t state_floats = size_t(hv) * dk * dv;
  cuda::DeviceBuffer q(size_t(batch) * hk * dk * 4), k(q.bytes()), v(size_t(batch) * hv * dv * 4),
      g(size_t(batch) * hv * 4), beta(g.bytes()), states(batch * state_floats * 4), out(v.bytes());
  for (cuda::DeviceBuffer* b : {&q, &k, &v, &g, &beta, &states}) NINFER_CUDA_CHECK(cudaMemset(b->get(), 0x3c, b->bytes()));
  NINFER_CUDA_CHECK(cudaMemset(g.get(), 0xbc, g.bytes()));  // negative log-decay
  std::vector<float*> pointers(batch);
  for (int b = 0; b < batch; ++b) pointers[b] = states.as<float>() + b * state_floats;
  cuda::DeviceBuffer device_pointers(pointers.size() * sizeof(float*));
  device_pointers.upload(pointers.data(), device_pointers.bytes());
  args.q = q.as<float>();
  args.k = k.as<float>();
  args.v = v.as<float>();
  args.g = g.as<float>();
  args.beta = beta.as<float>();
  args.states = device_pointers.as<float* const>();
  args.out = out.as<float>();
  const double micros = median_kernel_micros(iterations, [&](int) { cuda::gdn_decode(args, nullptr); });
  return {micros, 2.0 * double(states.bytes())};
}

// Median time of the gated delta rule over one sequence of `tokens` new tokens (kernels only). `impl`: "mma"
// (the chunked form with the tensor-core scan), "f32" (with the f32 scan), "prepare" (the chunked form's first
// kernel alone), "sequential" (the token-by-token twin). Returns (median microseconds, chunked workspace bytes).
std::tuple<double, double> bench_gdn_prefill(int64_t tokens, int hk, int hv, int dk, int dv, int iterations,
                                             const std::string& impl) {
  if (impl != "mma" && impl != "f32" && impl != "prepare" && impl != "sequential")
    throw EngineError("bench_gdn_prefill: impl is one of mma, f32, prepare, sequential; got " + impl);
  cuda::DeviceBuffer q(size_t(tokens) * hk * dk * 4), k(q.bytes()), v(size_t(tokens) * hv * dv * 4),
      g(size_t(tokens) * hv * 4), beta(g.bytes()), state(size_t(hv) * dk * dv * 4), out(v.bytes());
  // Values do not change the work done; these keep every product finite (0x3c3c3c3c ~ 0.0115, g ~ -0.0115).
  for (cuda::DeviceBuffer* b : {&q, &k, &v, &beta, &state}) NINFER_CUDA_CHECK(cudaMemset(b->get(), 0x3c, b->bytes()));
  NINFER_CUDA_CHECK(cudaMemset(g.get(), 0xbc, g.bytes()));
  const cuda::DeviceSequence seq{0, tokens, 0, 0};
  float* state_pointer = state.as<float>();
  std::vector<cuda::GdnChunkRef> chunks;
  for (int64_t c = 0; c * cuda::kGdnChunk < tokens; ++c) chunks.push_back({0, int32_t(c)});
  const int64_t first_chunk = 0;
  cuda::DeviceBuffer device_seq(sizeof seq), device_state(sizeof state_pointer),
      device_chunks(chunks.size() * sizeof(cuda::GdnChunkRef)), device_first(sizeof first_chunk);
  device_seq.upload(&seq, sizeof seq);
  device_state.upload(&state_pointer, sizeof state_pointer);
  device_chunks.upload(chunks.data(), device_chunks.bytes());
  device_first.upload(&first_chunk, sizeof first_chunk);
  const size_t workspace_floats = cuda::gdn_chunked_workspace_floats(int64_t(chunks.size()), hv, dk, dv);
  cuda::DeviceBuffer workspace(workspace_floats * sizeof(float));

  cuda::GdnPrefillArgs args;
  args.num_key_heads = hk;
  args.num_value_heads = hv;
  args.key_head_dim = dk;
  args.value_head_dim = dv;
  args.q = q.as<float>();
  args.k = k.as<float>();
  args.v = v.as<float>();
  args.g = g.as<float>();
  args.beta = beta.as<float>();
  args.num_seqs = 1;
  args.seqs = device_seq.as<const cuda::DeviceSequence>();
  args.states = device_state.as<float* const>();
  args.out = out.as<float>();
  cuda::GdnChunkTables tables;
  tables.total_chunks = int64_t(chunks.size());
  tables.chunks = device_chunks.as<const cuda::GdnChunkRef>();
  tables.first_chunk = device_first.as<const int64_t>();
  const double micros = median_kernel_micros(iterations, [&](int) {
    if (impl == "sequential")
      cuda::gdn_prefill_sequential(args, nullptr);
    else if (impl == "prepare")
      cuda::gdn_chunk_prepare(args, tables, workspace.as<float>(), nullptr);
    else
      cuda::gdn_prefill_chunked(args, tables, workspace.as<float>(),
                                impl == "f32" ? cuda::GdnScanImpl::f32 : cuda::GdnScanImpl::tensor_cores, nullptr);
  });
  return {micros, double(workspace.bytes())};
}

// Median time of one CudaBackend call of a prefill row op over `rows` rows (one sequence) at the Qwen3.5-27B shape:
// "gdn_conv" (10240 channels, kernel 4), "gdn_conv_qkv" (the same, L2-normed and split into q, k, v),
// "add_rmsnorm" (hidden 5120), "add_then_rmsnorm" (the separate add and rmsnorm that add_rmsnorm replaces),
// "swiglu" (intermediate 17408). Returns (median microseconds, the bytes the op's contract must move: each input
// read once, each output written once).
std::tuple<double, double> bench_prefill_op(const std::string& op, int64_t rows, int iterations) {
  constexpr int64_t kConvChannels = 10240, kConvKernel = 4, kHidden = 5120, kIntermediate = 17408;
  nb::gil_scoped_release release;
  cuda::CudaBackend backend(0);
  const bool conv = op == "gdn_conv" || op == "gdn_conv_qkv";
  const int64_t width = conv ? kConvChannels : op == "swiglu" ? kIntermediate : kHidden;
  cuda::DeviceBuffer a(size_t(rows * width) * sizeof(float)), b(a.bytes()), out(a.bytes());
  std::vector<float> weight_host(size_t(kConvChannels * kConvKernel));
  for (size_t i = 0; i < weight_host.size(); ++i) weight_host[i] = float((i * 2654435761u) % 2001) / 2000.0f - 0.5f;
  // Values do not change the work done; 0x3c3c3c3c ~ 0.0115 keeps everything finite.
  for (cuda::DeviceBuffer* buffer : {&a, &b}) NINFER_CUDA_CHECK(cudaMemset(buffer->get(), 0x3c, buffer->bytes()));
  StatePool states(1, 1, kConvChannels * (kConvKernel - 1), 1, backend.memory());
  const SequenceRows seq{0, rows, 0, nullptr, 0};
  const GdnShape conv_shape{16, 48, 128, 128, int32_t(kConvKernel)};
  double bytes = 0;
  std::function<void()> call;
  if (op == "gdn_conv") {
    call = [&] {
      backend.gdn_conv(a.as<float>(), {&seq, 1}, conv_shape, weight_host.data(), states, 0, out.as<float>());
    };
    bytes = 2.0 * double(a.bytes());
  } else if (op == "gdn_conv_qkv") {  // q, k and v side by side fill `out`
    const int64_t qk = int64_t(conv_shape.num_key_heads) * conv_shape.key_head_dim;
    call = [&] {
      float* q = out.as<float>();
      backend.gdn_conv_qkv(a.as<float>(), {&seq, 1}, conv_shape, weight_host.data(), states, 0, 0.088f, q,
                           q + rows * qk, q + 2 * rows * qk);
    };
    bytes = 2.0 * double(a.bytes());
  } else if (op == "add_rmsnorm") {
    call = [&] {
      backend.add_rmsnorm(a.as<float>(), b.as<float>(), rows, kHidden, weight_host.data(), NormKind::Offset, 1e-6f,
                          out.as<float>());
    };
    bytes = 4.0 * double(a.bytes());
  } else if (op == "add_then_rmsnorm") {
    call = [&] {
      backend.add(a.as<float>(), b.as<float>(), rows * kHidden);
      backend.rmsnorm(a.as<float>(), rows, kHidden, kHidden, weight_host.data(), NormKind::Offset, 1e-6f,
                      out.as<float>(), kHidden);
    };
    bytes = 5.0 * double(a.bytes());
  } else if (op == "swiglu") {
    call = [&] { backend.swiglu(a.as<float>(), b.as<float>(), rows * kIntermediate, out.as<float>()); };
    bytes = 3.0 * double(a.bytes());
  } else {
    throw EngineError("bench_prefill_op: op is one of gdn_conv, gdn_conv_qkv, add_rmsnorm, add_then_rmsnorm, "
                      "swiglu; got " + op);
  }
  // The first call warms up (and uploads the weight); each call is one pass of the backend's own.
  const double micros = median_event_micros(backend.stream(), iterations, [&](int) { call(); },
                                            [&](int) { backend.begin_pass({}); });
  return {micros, bytes};
}

// Median time of CudaBackend::attention for `batch` sequences of `context` positions each, the last `new_rows`
// of them new (prefill: new_rows = context; decode: 1), over random KV and q. `calls` back-to-back calls are
// captured in one CUDA graph (no host gaps, as in a captured decode pass); each graph launch is timed.
// Returns (median microseconds per call, K/V bytes in the pool that the call reads, scales included).
std::tuple<double, double> bench_attention(int32_t heads, int32_t kv_heads, int32_t head_dim,
                                           const std::string& kv_dtype, int64_t context, int64_t new_rows,
                                           int32_t batch, int32_t calls, int32_t iterations) {
  nb::gil_scoped_release release;
  cuda::CudaBackend backend(0);
  const KvDtype dtype = parse_kv_dtype(kv_dtype);
  const int64_t pages_per_seq = (context + kKvPageTokens - 1) / kKvPageTokens;
  const int64_t width = int64_t(kv_heads) * head_dim;
  KvPool pool(1, kv_heads, head_dim, pages_per_seq * batch, dtype, backend.memory());
  PageTable table(pages_per_seq * batch);
  std::vector<std::vector<int32_t>> pages(static_cast<size_t>(batch));
  for (auto& p : pages) table.acquire(pages_per_seq, p);

  // K and V: one random chunk of rows written again and again (speed does not depend on the values).
  const int64_t chunk = std::min<int64_t>(context, 4096);
  std::vector<float> host(size_t(chunk * width));
  for (size_t i = 0; i < host.size(); ++i) host[i] = float((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  cuda::DeviceBuffer kv(size_t(chunk * width) * sizeof(float));
  kv.upload(host.data(), kv.bytes());
  for (int32_t b = 0; b < batch; ++b)
    for (int64_t start = 0; start < context; start += chunk) {
      const SequenceRows s{0, std::min(chunk, context - start), start, pages[size_t(b)].data(), -1};
      backend.kv_write(kv.as<float>(), kv.as<float>(), {&s, 1}, pool, 0);
    }
  const int64_t rows = int64_t(batch) * new_rows;
  cuda::DeviceBuffer q(size_t(rows * heads * head_dim) * sizeof(float)), out(q.bytes());
  for (size_t at = 0; at < q.bytes(); at += host.size() * sizeof(float))
    NINFER_CUDA_CHECK(cudaMemcpy(q.as<uint8_t>() + at, host.data(),
                                 std::min(q.bytes() - at, host.size() * sizeof(float)), cudaMemcpyHostToDevice));
  std::vector<SequenceRows> seqs;
  for (int32_t b = 0; b < batch; ++b)
    seqs.push_back({b * new_rows, new_rows, context - new_rows, pages[size_t(b)].data(), -1});
  const AttentionShape shape{heads, kv_heads, head_dim, 1.0f / std::sqrt(float(head_dim))};
  auto attend = [&] {
    backend.attention(q.as<float>(), int64_t(heads) * head_dim, head_dim, seqs, pool, 0, shape, out.as<float>());
  };
  attend();                // grows the decode partials outside the capture
  backend.begin_pass({});   // synchronises, empties the table arena
  const double micros = median_graph_micros(backend.stream(), iterations, [&] {
    for (int32_t c = 0; c < calls; ++c) attend();
  }) / calls;
  // K and V of every (token, head): codes plus their row and block scales.
  const double kv_bytes =
      double(batch) * double(context) * kv_heads * double(kv_format_row_bytes(dtype, head_dim));
  return {micros, kv_bytes};
}

using MaskWords = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using SampledRow = std::tuple<int32_t, float, std::vector<TokenLogprob>>;

// Rows of host logits copied to the device, with what the device sampler reads for each row i (logits row i).
struct SamplerInputs {
  cuda::DeviceBuffer logits;
  int64_t vocab = 0;
  std::vector<SamplingParams> params;
  std::vector<TokenHistory> histories;
  std::vector<std::vector<uint32_t>> masks;
  std::vector<DeviceSampleRow> rows;
};

SamplerInputs sampler_inputs(const InFloats& logits, const std::vector<SamplingParams>& params,
                             const std::vector<uint64_t>& seeds, const std::vector<uint64_t>& counters,
                             const std::vector<std::vector<int32_t>>& prompts,
                             const std::vector<std::vector<int32_t>>& generated,
                             const std::vector<std::optional<MaskWords>>& masks) {
  if (logits.ndim() != 2) throw EngineError("cuda sampler: logits must be [rows, vocab]");
  const size_t n = logits.shape(0);
  for (size_t size : {params.size(), seeds.size(), counters.size(), prompts.size(), generated.size(), masks.size()})
    if (size != n) throw EngineError("cuda sampler: one params / seed / counter / history / mask per row");
  SamplerInputs in;
  in.vocab = int64_t(logits.shape(1));
  in.logits = to_device(logits);
  in.params = params;
  for (const SamplingParams& p : params) sampling_params_validate(p);
  const auto check = [&](const std::vector<int32_t>& tokens) {
    for (int32_t t : tokens)
      if (t < 0 || t >= in.vocab) throw EngineError("cuda sampler: history token " + std::to_string(t));
  };
  for (size_t i = 0; i < n; ++i) {
    check(prompts[i]);
    check(generated[i]);
    TokenHistory& h = in.histories.emplace_back();
    h.add_prompt(prompts[i]);
    for (int32_t t : generated[i]) h.add_generated(t);
    std::vector<uint32_t>& words = in.masks.emplace_back();
    if (masks[i]) words.assign(masks[i]->data(), masks[i]->data() + masks[i]->shape(0));
  }
  for (size_t i = 0; i < n; ++i)
    in.rows.push_back({int64_t(i), &in.params[i], seeds[i], counters[i], &in.histories[i], in.masks[i]});
  return in;
}

// One token per row sampled on the device: (token, logprob, top_logprobs).
std::vector<SampledRow> sample_rows(const InFloats& logits, const std::vector<SamplingParams>& params,
                                    const std::vector<uint64_t>& seeds, const std::vector<uint64_t>& counters,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    const std::vector<std::vector<int32_t>>& generated,
                                    const std::vector<std::optional<MaskWords>>& masks) {
  SamplerInputs in = sampler_inputs(logits, params, seeds, counters, prompts, generated, masks);
  std::vector<SampledToken> sampled;
  {
    nb::gil_scoped_release release;
    cuda::DeviceSampler sampler;
    sampler.sample(nullptr, in.logits.as<float>(), in.vocab, in.rows, sampled);
  }
  std::vector<SampledRow> out;
  for (SampledToken& s : sampled) out.emplace_back(s.token, s.logprob, std::move(s.top));
  return out;
}

// The distribution each row draws from on the device ([rows, vocab]), Sampler::distribution's twin.
FloatArray sampling_distribution(const InFloats& logits, const std::vector<SamplingParams>& params,
                                 const std::vector<std::vector<int32_t>>& prompts,
                                 const std::vector<std::vector<int32_t>>& generated,
                                 const std::vector<std::optional<MaskWords>>& masks) {
  const std::vector<uint64_t> zeros(params.size(), 0);
  SamplerInputs in = sampler_inputs(logits, params, zeros, zeros, prompts, generated, masks);
  std::vector<float> probs;
  {
    nb::gil_scoped_release release;
    cuda::DeviceSampler sampler;
    probs = sampler.distribution(nullptr, in.logits.as<float>(), in.vocab, in.rows);
  }
  OwnedFloats out = allocate_floats(probs.size());
  std::copy(probs.begin(), probs.end(), out.data);
  return as_array(out, {int64_t(in.rows.size()), in.vocab});
}

// Median microseconds of one device-sampler call (host packing, upload, kernels, result download) for `rows`
// rows of random N(0, 2) logits with the same params and a 64-token history each.
double bench_sampler(int rows, int64_t vocab, const SamplingParams& params, int iterations) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> host(size_t(rows) * size_t(vocab));
  for (float& v : host) v = normal(rng);
  cuda::DeviceBuffer logits(host.size() * sizeof(float));
  logits.upload(host.data(), logits.bytes());
  std::vector<TokenHistory> histories(static_cast<size_t>(rows));
  for (TokenHistory& h : histories)
    for (int i = 0; i < 64; ++i) h.add_generated(int32_t(rng() % uint32_t(vocab)));
  std::vector<DeviceSampleRow> sample_rows;
  for (int r = 0; r < rows; ++r) sample_rows.push_back({r, &params, uint64_t(r), 0, &histories[size_t(r)], {}});
  cuda::DeviceSampler sampler;
  std::vector<SampledToken> out;
  return median_kernel_micros(iterations, [&](int it) {
    for (DeviceSampleRow& row : sample_rows) row.counter = uint64_t(it);
    sampler.sample(nullptr, logits.as<float>(), vocab, sample_rows, out);
  });
}

// Median time of CudaBackend::moe_experts (the routed experts: bucketing, gate/up + SwiGLU, down, weighted sum) for
// `rows` rows of deterministic x, each routed to `top_k` distinct experts drawn uniformly (seeded). `calls` calls,
// each with its own routing, use `copies` device copies of the stacked weights in turn, captured in one CUDA graph,
// so that an expert's weights are rarely still in L2 from a recent call. impl: "grouped" (what the backend runs) or
// "reference" (the simple twin). Returns (median microseconds per call, mean weight bytes a call must read: its
// distinct experts' gate, up and down matrices with their scales).
std::tuple<double, double> bench_moe(const ArtifactHandle& handle, const std::string& gate, const std::string& up,
                                     const std::string& down, int64_t rows, int32_t top_k, int32_t copies,
                                     int32_t calls, int32_t iterations, const std::string& impl) {
  if (impl != "grouped" && impl != "reference")
    throw EngineError("bench_moe: impl is grouped or reference, not " + impl);
  const Artifact& art = *handle.get();
  const TensorView* host[3] = {&art.tensor(gate), &art.tensor(up), &art.tensor(down)};
  const int64_t experts = host[0]->matrices(), hidden = host[0]->cols();
  if (top_k < 1 || top_k > experts) throw EngineError("bench_moe: top_k outside 1.." + std::to_string(experts));
  if (copies < 1 || calls < 1) throw EngineError("bench_moe: copies and calls must be positive");
  nb::gil_scoped_release release;
  cuda::CudaBackend backend(0);
  backend.set_reference_kernels(impl == "reference");
  double expert_bytes = 0;
  for (const TensorView* w : host)
    expert_bytes += double(cuda::data_bytes(*w) + cuda::scale_bytes(*w) + cuda::zero_bytes(*w)) / double(experts);
  std::vector<cuda::DeviceWeight> weights;
  for (int32_t c = 0; c < copies; ++c)
    for (const TensorView* w : host) weights.push_back(cuda::upload_weight(*w));
  std::vector<cuda::DeviceBuffer> ids;
  std::mt19937 random(12345);
  std::vector<int32_t> order(static_cast<size_t>(experts)), routing(static_cast<size_t>(rows * top_k));
  double read_bytes = 0;
  for (int32_t c = 0; c < calls; ++c) {
    std::vector<bool> used(size_t(experts), false);
    for (int64_t r = 0; r < rows; ++r) {
      std::iota(order.begin(), order.end(), 0);
      for (int32_t j = 0; j < top_k; ++j) {  // a partial Fisher-Yates shuffle: top_k distinct experts
        std::swap(order[size_t(j)], order[size_t(j) + random() % size_t(experts - j)]);
        routing[size_t(r * top_k + j)] = order[size_t(j)];
        used[size_t(order[size_t(j)])] = true;
      }
    }
    read_bytes += expert_bytes * double(std::count(used.begin(), used.end(), true)) / calls;
    ids.emplace_back(routing.size() * sizeof(int32_t));
    ids.back().upload(routing.data(), ids.back().bytes());
  }
  std::vector<float> x_host(size_t(rows * hidden)), w_host(size_t(rows * top_k), 1.0f / float(top_k));
  for (size_t i = 0; i < x_host.size(); ++i) x_host[i] = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  cuda::DeviceBuffer x(x_host.size() * sizeof(float)), route_weights(w_host.size() * sizeof(float)), out(x.bytes());
  x.upload(x_host.data(), x.bytes());
  route_weights.upload(w_host.data(), route_weights.bytes());
  auto call = [&](int32_t c) {
    const cuda::DeviceWeight* w = &weights[size_t(c % copies) * 3];
    backend.moe_experts(x.as<float>(), rows, hidden, ids[size_t(c)].as<int32_t>(), route_weights.as<float>(), top_k,
                        w[0].view, w[1].view, w[2].view, SharedExpertTerm{}, out.as<float>());
  };
  call(0);  // grows the scratch buffers outside the capture
  NINFER_CUDA_CHECK(cudaStreamSynchronize(backend.stream()));
  const double micros = median_graph_micros(backend.stream(), iterations, [&] {
    for (int32_t c = 0; c < calls; ++c) call(c);
  });
  return {micros / calls, read_bytes};
}

bool moe_grouped_supports(const ArtifactHandle& handle, const std::string& gate, const std::string& up,
                          const std::string& down) {
  const Artifact& a = *handle.get();
  return cuda::moe_grouped_supports(a.tensor(gate), a.tensor(up), a.tensor(down), a.tensor(gate).cols());
}

std::string device_name() {
  cudaDeviceProp props{};
  NINFER_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
  return props.name;
}

}  // namespace
#endif

void bind_cuda(nb::module_& m) {
  nb::module_ sub = m.def_submodule("cuda", "CUDA kernels, exposed for parity tests and benchmarks");
  bind_backend_ops(sub);
#ifdef NINFER_HAVE_CUDA
  sub.attr("built") = true;
  sub.def("device_count", &device_count, "Usable CUDA devices (0 without a driver or GPU).");
  sub.def("device_name", &device_name);
  sub.def("linear", &linear, nb::arg("x"), nb::arg("artifact"), nb::arg("name"), nb::arg("impl") = "auto",
          nb::arg("x_offset") = 0,
          "x @ W.T on the GPU with the decode GEMV (1..8 rows), W in its stored encoding; impl: auto, mma, mma_v3, "
          "mma_planes, simt; x_offset: x starts that many floats into its device buffer (misaligned activations).");
  sub.def("add_rmsnorm_planes", &add_rmsnorm_planes, nb::arg("hidden"), nb::arg("delta"), nb::arg("w"),
          nb::arg("artifact"), nb::arg("name"), nb::arg("fused"),
          "(hidden + delta, its RMSNorm, the decode GEMV's split planes of it for weight `name`, as bytes): planes "
          "written by the norm (fused) or by the split kernel after it.");
  sub.attr("cublaslt") = cuda::LtMatmul::available();
  sub.attr("streamed_auto_rows") = cuda::kStreamedAutoRows;  // auto's largest row count for the streamed GEMM
  sub.def("gemm", &gemm, nb::arg("x"), nb::arg("artifact"), nb::arg("name"), nb::arg("impl") = "auto",
          nb::arg("bias") = nb::none(),
          "(x @ W.T + bias, implementation run) on the GPU by the prefill GEMM, W in its stored encoding.");
  sub.def("gdn_decode", &gdn_decode, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
          nb::arg("states"), "One gated-delta-rule decode step for a batch of sequences.");
  sub.def("bench_linear", &bench_linear, nb::arg("artifact"), nb::arg("name"), nb::arg("rows"),
          nb::arg("copies") = 4, nb::arg("iterations") = 50, nb::arg("impl") = "auto", nb::arg("shared_split") = false,
          "(median us per call, weight bytes) of the decode GEMV, one graph of calls cycling over device copies of "
          "the weight; shared_split: one activation split for all the calls (tensor-core impls).");
  sub.def("bench_attention", &bench_attention, nb::arg("heads"), nb::arg("kv_heads"), nb::arg("head_dim"),
          nb::arg("kv_dtype"), nb::arg("context"), nb::arg("new_rows"), nb::arg("batch"), nb::arg("calls") = 10,
          nb::arg("iterations") = 20,
          "(median us per call, K/V bytes read) of CudaBackend::attention, calls captured in a CUDA graph.");
  sub.def("moe_grouped_supports", &moe_grouped_supports, nb::arg("artifact"), nb::arg("gate"), nb::arg("up"),
          nb::arg("down"), "Whether moe_experts takes these stacked expert weights on the grouped tensor-core path.");
  sub.def("bench_moe", &bench_moe, nb::arg("artifact"), nb::arg("gate"), nb::arg("up"), nb::arg("down"),
          nb::arg("rows"), nb::arg("top_k"), nb::arg("copies") = 2, nb::arg("calls") = 16, nb::arg("iterations") = 10,
          nb::arg("impl") = "grouped",
          "(median us, weight bytes read) of CudaBackend::moe_experts on random routings; impl: grouped, reference.");
  sub.def("bench_gemm", &bench_gemm, nb::arg("artifact"), nb::arg("name"), nb::arg("rows"), nb::arg("impl") = "auto",
          nb::arg("iterations") = 20, "(median us, implementation run) of the prefill GEMM.");
  sub.def("bench_gdn_decode", &bench_gdn_decode, nb::arg("batch"), nb::arg("hk"), nb::arg("hv"), nb::arg("dk"),
          nb::arg("dv"), nb::arg("iterations") = 50, "(median us, state bytes moved) of one decode step.");
  sub.def("bench_gdn_prefill", &bench_gdn_prefill, nb::arg("tokens"), nb::arg("hk"), nb::arg("hv"), nb::arg("dk"),
          nb::arg("dv"), nb::arg("iterations") = 10, nb::arg("impl") = "mma",
          "(median us, chunked workspace bytes) of the delta rule over one sequence of `tokens` new tokens; "
          "impl: mma, f32, prepare (first kernel alone), sequential.");
  sub.def("bench_prefill_op", &bench_prefill_op, nb::arg("op"), nb::arg("rows"), nb::arg("iterations") = 20,
          "(median us, bytes its contract moves) of one CudaBackend prefill row op at the 27B shape; op: gdn_conv, "
          "gdn_conv_qkv, add_rmsnorm, add_then_rmsnorm, swiglu.");
  sub.def("sample_rows", &sample_rows, nb::arg("logits"), nb::arg("params"), nb::arg("seeds"), nb::arg("counters"),
          nb::arg("prompts"), nb::arg("generated"), nb::arg("masks"),
          "One token per row of [rows, vocab] logits sampled on the device: [(token, logprob, top_logprobs)].");
  sub.def("sampling_distribution", &sampling_distribution, nb::arg("logits"), nb::arg("params"),
          nb::arg("prompts"), nb::arg("generated"), nb::arg("masks"),
          "The distribution the device sampler draws each row from, [rows, vocab].");
  sub.def("bench_sampler", &bench_sampler, nb::arg("rows"), nb::arg("vocab"), nb::arg("params"),
          nb::arg("iterations") = 50, "Median us of one device-sampler call for `rows` rows of random logits.");
#else
  sub.attr("built") = false;
#endif
}

}  // namespace ninfer::bindings
