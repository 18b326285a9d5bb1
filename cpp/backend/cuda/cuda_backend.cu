// Memory, weights, host tables, matrices and elementwise ops of the CUDA backend.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemv.h"
#include "backend/cuda/op_timing.h"
#include "cache/kv_dtype.h"
#include "cache/kv_pool.h"

namespace ninfer {

std::unique_ptr<Backend> make_cuda_backend(int device, bool time_ops) {
  if (time_ops) return cuda::make_timed_cuda_backend(device);
  return std::make_unique<cuda::CudaBackend>(device);
}

namespace cuda {
namespace {

template <Encoding E>
__global__ void embed_kernel(const int32_t* tokens, int64_t n, WeightRef table, float* out) {
  chain_start();
  NINFER_GRID_STRIDE(i, n * table.cols) {
    const int64_t t = i / table.cols, c = i % table.cols;
    out[i] = weight_at<E>(table, tokens[t], c);
  }
}

__global__ void gather_rows_kernel(const float* x, int64_t dim, const int64_t* rows, int64_t n, float* out) {
  chain_start();
  NINFER_GRID_STRIDE(i, n * dim) out[i] = x[rows[i / dim] * dim + i % dim];
}

// argmax_rows in two launches: a row of the vocabulary is 1 MB, so one block per row would read it at one SM's
// rate. Stage 1: block (chunk, row) reduces its chunk of the row to (largest value, lowest column holding it);
// stage 2: one block per row reduces the chunks' pairs. A NaN never wins (`>` is false), as in the CPU backend's
// std::max_element for finite rows.
constexpr int kArgmaxChunks = 128;

struct ValueColumn {
  float value;
  int32_t column;
};

// The block's best (value, column) over each thread's (value, column); ties go to the lower column.
__device__ ValueColumn block_argmax(ValueColumn mine) {
  __shared__ ValueColumn best[kThreads];
  best[threadIdx.x] = mine;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const ValueColumn other = best[threadIdx.x + half];
      if (other.value > best[threadIdx.x].value ||
          (other.value == best[threadIdx.x].value && other.column < best[threadIdx.x].column))
        best[threadIdx.x] = other;
    }
    __syncthreads();
  }
  return best[0];
}

__global__ void argmax_chunks_kernel(const float* x, int64_t cols, ValueColumn* partial) {
  chain_start();
  const float* row = x + int64_t(blockIdx.y) * cols;
  const int64_t per_chunk = (cols + gridDim.x - 1) / gridDim.x;
  const int64_t begin = int64_t(blockIdx.x) * per_chunk, end = begin + per_chunk < cols ? begin + per_chunk : cols;
  ValueColumn mine{-INFINITY, int32_t(cols)};  // none yet
  for (int64_t c = begin + threadIdx.x; c < end; c += blockDim.x)
    if (row[c] > mine.value) mine = {row[c], int32_t(c)};  // a thread's columns rise: its first maximum is kept
  const ValueColumn best = block_argmax(mine);
  if (threadIdx.x == 0) partial[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = best;
}

__global__ void argmax_finish_kernel(const ValueColumn* partial, int32_t chunks, int64_t cols,
                                     const float* column_ids, int32_t* ids) {
  chain_start();
  const ValueColumn mine = threadIdx.x < chunks ? partial[int64_t(blockIdx.x) * chunks + threadIdx.x]
                                                : ValueColumn{-INFINITY, int32_t(cols)};
  const ValueColumn best = block_argmax(mine);
  if (threadIdx.x == 0) {
    const int32_t column = best.column < cols ? best.column : 0;  // nothing finite: column 0
    ids[blockIdx.x] = column_ids ? int32_t(column_ids[column]) : column;
  }
}

// One block per row: out[j] = <rows[j], x>.
__global__ void row_dots_kernel(const float* rows, int64_t dim, const float* x, float* out) {
  chain_start();
  const float* row = rows + int64_t(blockIdx.x) * dim;
  float s = 0;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) s += row[c] * x[c];
  s = block_reduce(s, SumOp{});
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

__global__ void add_bias_kernel(float* y, int64_t rows, int64_t cols, const float* bias) {
  chain_start();
  NINFER_GRID_STRIDE(i, rows * cols) y[i] += bias[i % cols];
}

// Elementwise kernels take V floats per step: V = 4 (16-byte accesses) when every pointer is 16-byte aligned and
// n % 4 == 0 (float4_elementwise), else 1.
template <int V>
__global__ void add_kernel(float* inout, const float* x, int64_t n) {
  chain_start();
  NINFER_GRID_STRIDE(i, n / V) {
    if constexpr (V == 4) {
      float4 a = reinterpret_cast<float4*>(inout)[i];
      const float4 b = reinterpret_cast<const float4*>(x)[i];
      a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      reinterpret_cast<float4*>(inout)[i] = a;
    } else {
      inout[i] += x[i];
    }
  }
}

template <int V>
__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  chain_start();
  NINFER_GRID_STRIDE(i, n / V) {
    if constexpr (V == 4) {
      const float4 g = reinterpret_cast<const float4*>(gate)[i], u = reinterpret_cast<const float4*>(up)[i];
      reinterpret_cast<float4*>(out)[i] =
          make_float4(silu(g.x) * u.x, silu(g.y) * u.y, silu(g.z) * u.z, silu(g.w) * u.w);
    } else {
      out[i] = silu(gate[i]) * up[i];
    }
  }
}

bool float4_elementwise(int64_t n, std::initializer_list<const void*> pointers) {
  if (n % 4 != 0) return false;
  for (const void* p : pointers)
    if (!aligned16(p)) return false;
  return true;
}

__global__ void copy_columns_kernel(const float* x, int64_t rows, int64_t x_stride, int64_t cols, float* out) {
  chain_start();
  NINFER_GRID_STRIDE(i, rows * cols) out[i] = x[(i / cols) * x_stride + i % cols];
}

__global__ void sigmoid_gate_kernel(float* x, int64_t rows, int32_t heads, int32_t dim, const float* gate,
                                    int64_t gate_row_stride, int64_t gate_head_stride) {
  chain_start();
  NINFER_GRID_STRIDE(i, rows * heads * dim) {
    const int64_t r = i / (int64_t(heads) * dim), h = (i / dim) % heads, j = i % dim;
    x[i] *= sigmoid(gate[r * gate_row_stride + h * gate_head_stride + j]);
  }
}

// Makes `device` current (before any member allocates); EngineError when there is no such device.
void select_device(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    throw EngineError("CUDA backend: no usable CUDA device " + std::to_string(device) + " (" +
                      std::to_string(count) + " visible)");
  }
  NINFER_CUDA_CHECK(cudaSetDevice(device));
}

}  // namespace

// Room for every table of one pass (a 32k-token prefill chunk needs well under 1 MiB; a decode pass of 8 lanes
// at 32k context, ~600 KiB).
constexpr size_t kStepTableBytes = size_t(16) << 20;

CudaBackend::CudaBackend(int device)
    : device_(device), memory_(nullptr), tables_((select_device(device), kStepTableBytes)) {
  NINFER_CUDA_CHECK(cudaStreamCreate(&stream_));
  memory_ = DeviceMemory(stream_);
  // A captured decode pass ends where its outputs are first read back: launch its graph there.
  memory_.set_before_host_read([this] { launch_pass(); });
}

DeviceMemoryUse CudaBackend::upload_weights(const Artifact& artifact) {
  bind_calling_thread();
  size_t free_before = 0, total = 0;
  NINFER_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
  const std::vector<std::string> names = artifact.tensor_names();
  size_t needed = 0;
  for (const std::string& name : names) {
    const TensorView& t = artifact.tensor(name);
    needed += data_bytes(t) + scale_bytes(t) + zero_bytes(t) + offset_bytes(t);
  }
  if (needed > free_before)
    throw OutOfMemoryError("the weights of " + artifact.path() + " (" + std::to_string(needed >> 20) +
                           " MiB) do not fit in device memory (" + std::to_string(free_before >> 20) + " MiB free of " +
                           std::to_string(total >> 20) + " MiB)");
  for (const std::string& name : names) resident(artifact.tensor(name));
  NINFER_CUDA_CHECK(cudaDeviceSynchronize());
  size_t free_after = 0;
  NINFER_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
  return {int64_t(total), int64_t(free_before) - int64_t(free_after), int64_t(free_after)};
}

void CudaBackend::begin_pass(GraphPassShape shape) {
  bind_calling_thread();
  // The previous pass threw before its outputs were read.
  if (graphs_.mode() != DecodeGraphs::Mode::eager) graphs_.abandon(stream_);
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // nothing queued still reads the arena's slots
  graphs_.collect_timing();
  tables_.reset();
  pass_seqs_.clear();
  graphs_.begin(stream_, shape, device_allocation_epoch());
}

void CudaBackend::launch_pass() { graphs_.launch(stream_, tables_, device_allocation_epoch()); }

CudaBackend::~CudaBackend() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

void CudaBackend::bind_calling_thread() { NINFER_CUDA_CHECK(cudaSetDevice(device_)); }

const TensorView& CudaBackend::resident(const TensorView& w) {
  if (!w.data || is_device_pointer(w.data)) return w;
  auto it = weights_.find(w.data);
  if (it == weights_.end()) it = weights_.emplace(w.data, upload_weight(w)).first;
  const TensorView& d = it->second.view;
  if (d.encoding == w.encoding && d.shape == w.shape) return d;
  // A dense weight may be read with another shape over the same elements (the vision tower's Conv3d kernel as
  // the [hidden, patch values] matrix it is): row-major data does not change with the view, scales would.
  const bool dense = w.encoding == Encoding::F32 || w.encoding == Encoding::F16 || w.encoding == Encoding::BF16;
  if (d.encoding != w.encoding || !dense || d.numel() != w.numel())
    throw EngineError("CUDA backend: host weight " + w.name + " changed shape or encoding after its upload");
  const ReshapedKey key{w.data, w.shape};
  auto view = reshaped_.find(key);
  if (view == reshaped_.end()) {
    TensorView reshaped = d;
    reshaped.shape = w.shape;
    view = reshaped_.emplace(key, reshaped).first;
  }
  return view->second;
}

const float* CudaBackend::resident(const float* values, int64_t count) {
  if (!values || is_device_pointer(values)) return values;
  auto it = constants_.find(values);
  if (it == constants_.end()) {
    DeviceBuffer buffer(size_t(count) * sizeof(float));
    buffer.upload(values, buffer.bytes());
    it = constants_.emplace(values, std::move(buffer)).first;
  } else if (it->second.bytes() < size_t(count) * sizeof(float)) {
    throw EngineError("CUDA backend: host vector of " + std::to_string(count) + " floats used with " +
                      std::to_string(it->second.bytes() / 4) + " before");
  }
  return it->second.as<const float>();
}

const uint8_t* CudaBackend::upload(const HostTables& tables) {
  const std::vector<uint8_t>& bytes = tables.bytes();
  const bool eager = !graphs_.fixed_layout();  // a graph pass copies all its slots at once before the launch
  bool fits = false;
  const uint8_t* slot = tables_.put(bytes.data(), bytes.size(), eager, stream_, fits);
  if (!fits && eager) {  // ops called outside passes fill the arena up: start again once its copies are done
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    tables_.reset();
    slot = tables_.put(bytes.data(), bytes.size(), eager, stream_, fits);
  }
  if (!fits)
    throw EngineError("CUDA backend: op tables of " + std::to_string(bytes.size()) + " bytes overflow the " +
                      std::to_string(tables_.capacity() >> 20) + " MiB step arena");
  return slot;
}

namespace {

bool same_sequences(std::span<const SequenceRows> a, std::span<const SequenceRows> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const SequenceRows& x, const SequenceRows& y) {
    return x.row0 == y.row0 && x.n == y.n && x.start == y.start && x.pages == y.pages && x.state_slot == y.state_slot;
  });
}

}  // namespace

CudaBackend::SequenceSlots CudaBackend::sequence_tables(std::span<const SequenceRows> seqs, const KvPool& pool) {
  const bool fixed = graphs_.fixed_layout();
  if (fixed && !pass_seqs_.empty() && same_sequences(seqs, pass_seqs_)) return pass_seq_slots_;
  std::vector<DeviceSequence> device_seqs;
  std::vector<int32_t> pages;
  int64_t rows = 0;
  for (const SequenceRows& s : seqs) {
    const int64_t page_count = s.pages ? (s.start + s.n + kKvPageTokens - 1) / kKvPageTokens : 0;
    device_seqs.push_back({s.row0, s.n, s.start, int64_t(pages.size())});
    pages.insert(pages.end(), s.pages, s.pages + page_count);
    rows = std::max(rows, s.row0 + s.n);
  }
  if (fixed) {
    // No sequence holds more pages than max_context needs, and all together no more than the pool has (each
    // page listed once per row of a verify pass: its rows are sequences of one row over the same pages).
    int64_t bound = pool.total_pages() * graphs_.shape().rows;
    if (max_sequence_tokens_ > 0)
      bound = std::min(bound, int64_t(seqs.size()) * ((max_sequence_tokens_ + kKvPageTokens - 1) / kKvPageTokens));
    if (int64_t(pages.size()) > bound)
      throw EngineError("CUDA decode graph: " + std::to_string(pages.size()) + " KV pages in one pass, above the " +
                        std::to_string(bound) + " its page table holds");
    pages.resize(size_t(bound), 0);
  }
  std::vector<int32_t> row_seq(size_t(rows), -1);
  for (size_t i = 0; i < seqs.size(); ++i)
    std::fill_n(row_seq.begin() + seqs[i].row0, seqs[i].n, int32_t(i));
  HostTables tables;
  const size_t at_seqs = tables.add(device_seqs.data(), device_seqs.size());
  const size_t at_pages = tables.add(pages.data(), pages.size());
  const size_t at_row_seq = tables.add(row_seq.data(), row_seq.size());
  const uint8_t* base = upload(tables);
  const SequenceSlots slots{reinterpret_cast<const DeviceSequence*>(base + at_seqs),
                            reinterpret_cast<const int32_t*>(base + at_pages),
                            reinterpret_cast<const int32_t*>(base + at_row_seq), rows};
  if (fixed) {
    pass_seqs_.assign(seqs.begin(), seqs.end());
    pass_seq_slots_ = slots;
  }
  return slots;
}

float* CudaBackend::scratch(DeviceBuffer& buffer, size_t floats) {
  if (buffer.bytes() < floats * sizeof(float)) {
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    buffer = DeviceBuffer(floats * sizeof(float));
  }
  return buffer.as<float>();
}

void CudaBackend::add_bias(float* y, int64_t rows, const TensorView& w, const float* bias) {
  if (!bias) return;
  launch_chained(add_bias_kernel, dim3(blocks_for(rows * w.rows())), dim3(kThreads), 0, stream_, y, rows, w.rows(),
                 resident(bias, w.rows()));
}

void CudaBackend::linear(const float* x, int64_t rows, const TensorView& w, float* y, const float* bias) {
  if (rows <= 0 || tables_only()) return;
  if (rows <= kMaxGemvRows) {
    const LinearOut one[] = {{&w, y, bias}};
    linear_shared_input(x, rows, one);
    return;
  }
  prefill_gemm_.run(x, rows, resident(w), y, resident(bias, w.rows()), stream_, gemm_impl_);
}

// Decode batches: the tensor-core GEMV splits x once per split kind and runs every weight of that kind on it;
// other weights take the CUDA-core GEMV. Prefill batches: the prefill GEMM converts x once for all weights.
void CudaBackend::linear_shared_input(const float* x, int64_t rows, std::span<const LinearOut> outs) {
  SplitActivations norm_planes = std::exchange(norm_planes_, SplitActivations{});  // for this call at most
  norm_split_ = {};
  if (rows <= 0 || tables_only()) return;
  if (rows > kMaxGemvRows) {
    std::vector<GemmOutput> gemm_outs;
    for (const LinearOut& o : outs) gemm_outs.push_back({&resident(*o.w), o.y, resident(o.bias, o.w->rows())});
    prefill_gemm_.run_shared(x, rows, gemm_outs, stream_, gemm_impl_);
    return;
  }
  std::vector<bool> done(outs.size(), false);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (done[i]) continue;
    const TensorView& first = resident(*outs[i].w);
    const int kind = split_kind(first);
    if (kind < 0) {
      gemv(x, int(rows), first, outs[i].y, stream_);
      add_bias(outs[i].y, rows, first, outs[i].bias);
      continue;
    }
    // The planes add_rmsnorm wrote for x when they are this kind's; otherwise a split (which overwrites them).
    const bool from_norm = norm_planes.x == x && norm_planes.rows == rows && norm_planes.kind == kind &&
                           norm_planes.cols == first.cols();
    const SplitActivations split =
        from_norm ? norm_planes : split_activations(x, int(rows), first.cols(), kind, gemv_workspace_, stream_);
    if (!from_norm && split.planes) norm_planes = {};
    // Every remaining weight of this kind and width, one launch per encoding.
    while (true) {
      std::vector<MmaOutput> same;
      std::vector<size_t> members;
      for (size_t j = i; j < outs.size(); ++j) {
        const TensorView& w = resident(*outs[j].w);
        if (done[j] || split_kind(w) != kind || w.cols() != first.cols()) continue;
        if (!same.empty() && w.encoding != same[0].w->encoding) continue;
        same.push_back({&w, outs[j].y});
        members.push_back(j);
      }
      if (same.empty()) break;
      gemv_mma(split, same, gemv_workspace_, stream_);
      for (size_t j : members) {
        add_bias(outs[j].y, rows, *outs[j].w, outs[j].bias);
        done[j] = true;
      }
    }
  }
}

void CudaBackend::embed(const int32_t* tokens, int64_t n, const TensorView& table, float* out) {
  if (n <= 0) return;
  HostTables tables;
  const size_t at = tables.add(tokens, size_t(n));
  const int32_t* dtokens = reinterpret_cast<const int32_t*>(upload(tables) + at);
  if (tables_only()) return;
  const TensorView& dt = resident(table);
  dispatch_encoding(dt.encoding, [&](auto encoding) {
    launch_chained(embed_kernel<decltype(encoding)::value>, dim3(blocks_for(n * dt.cols())), dim3(kThreads), 0,
                   stream_, dtokens, n, weight_ref(dt), out);
  });
}

void CudaBackend::embed_resident_ids(const int32_t* ids, int64_t n, const TensorView& table, float* out) {
  if (n <= 0 || tables_only()) return;
  const TensorView& dt = resident(table);
  dispatch_encoding(dt.encoding, [&](auto encoding) {
    launch_chained(embed_kernel<decltype(encoding)::value>, dim3(blocks_for(n * dt.cols())), dim3(kThreads), 0,
                   stream_, ids, n, weight_ref(dt), out);
  });
}

void CudaBackend::argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, const float* column_ids) {
  if (rows <= 0 || tables_only()) return;
  if (cols >= int64_t(INT32_MAX)) throw EngineError("argmax_rows: " + std::to_string(cols) + " columns");
  static_assert(kArgmaxChunks <= kThreads && sizeof(ValueColumn) == 2 * sizeof(float));
  const int32_t chunks = int32_t(std::min<int64_t>(kArgmaxChunks, (cols + kThreads - 1) / kThreads));
  auto* partial = reinterpret_cast<ValueColumn*>(scratch(argmax_partial_, size_t(2 * rows * chunks)));
  launch_chained(argmax_chunks_kernel, dim3(unsigned(chunks), unsigned(rows)), dim3(kThreads), 0, stream_, x, cols,
                 partial);
  const float* device_ids = column_ids ? resident(column_ids, cols) : nullptr;
  launch_chained(argmax_finish_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream_, partial, chunks, cols,
                 device_ids, ids);
}

// Through the step tables (pinned, copied to the device before the pass or its graph launch), then a device copy:
// captured as a copy node from the tables' fixed slot, which a replay fills anew.
void CudaBackend::upload_floats(const float* host, int64_t count, float* out) {
  if (count <= 0) return;
  HostTables tables;
  const size_t at = tables.add(host, size_t(count));
  const uint8_t* slot = upload(tables) + at;
  if (tables_only()) return;
  NINFER_CUDA_CHECK(cudaMemcpyAsync(out, slot, size_t(count) * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::gather_rows(const float* x, int64_t dim, const int64_t* rows, int64_t n, float* out) {
  if (n <= 0) return;
  HostTables tables;
  const size_t at = tables.add(rows, size_t(n));
  const int64_t* drows = reinterpret_cast<const int64_t*>(upload(tables) + at);
  if (tables_only()) return;
  launch_chained(gather_rows_kernel, dim3(blocks_for(n * dim)), dim3(kThreads), 0, stream_, x, dim, drows, n, out);
}

void CudaBackend::row_dots(const float* rows, int64_t n, int64_t dim, const float* x, float* out) {
  if (n <= 0 || tables_only()) return;
  launch_chained(row_dots_kernel, dim3(unsigned(n)), dim3(kThreads), 0, stream_, rows, dim, x, out);
}

void CudaBackend::add(float* inout, const float* x, int64_t n) {
  if (n <= 0 || tables_only()) return;
  const bool vectors = float4_elementwise(n, {inout, x});
  launch_chained(vectors ? add_kernel<4> : add_kernel<1>, dim3(blocks_for(vectors ? n / 4 : n)), dim3(kThreads), 0,
                 stream_, inout, x, n);
}

void CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  if (n <= 0 || tables_only()) return;
  const bool vectors = float4_elementwise(n, {gate, up, out});
  launch_chained(vectors ? swiglu_kernel<4> : swiglu_kernel<1>, dim3(blocks_for(vectors ? n / 4 : n)), dim3(kThreads),
                 0, stream_, gate, up, n, out);
}

void CudaBackend::copy_columns(const float* x, int64_t rows, int64_t x_stride, int64_t cols, float* out) {
  if (rows * cols <= 0 || tables_only()) return;
  launch_chained(copy_columns_kernel, dim3(blocks_for(rows * cols)), dim3(kThreads), 0, stream_, x, rows, x_stride,
                 cols, out);
}

void CudaBackend::sigmoid_gate(float* x, int64_t rows, int32_t heads, int32_t dim, const float* gate,
                               int64_t gate_row_stride, int64_t gate_head_stride) {
  const int64_t n = rows * heads * dim;
  if (n <= 0 || tables_only()) return;
  launch_chained(sigmoid_gate_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream_, x, rows, heads, dim, gate,
                 gate_row_stride, gate_head_stride);
}

}  // namespace cuda
}  // namespace ninfer
