#include "backend/cuda/decode_graphs.h"

#include <string>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "errors.h"

namespace ninfer::cuda {
namespace {

int64_t free_device_bytes() {
  size_t free_bytes = 0, total = 0;
  NINFER_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return int64_t(free_bytes);
}

double micros_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
}

// Ends the capture on `stream`, if one is in progress, discarding what it caught.
void discard_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &status);
  if (status == cudaStreamCaptureStatusNone) return;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
}

}  // namespace

DecodeGraphs::~DecodeGraphs() {
  for (auto& [shape, b] : batches_)
    if (b.exec) cudaGraphExecDestroy(b.exec);
  if (launch_start_) cudaEventDestroy(launch_start_);
  if (launch_end_) cudaEventDestroy(launch_end_);
}

DecodeGraphs::Mode DecodeGraphs::begin(cudaStream_t stream, GraphPassShape shape, uint64_t epoch) {
  mode_ = Mode::eager;
  batch_ = {};
  warming_ = {};
  if (!enabled || shape.lanes <= 0 || shape.lanes > max_batch_ || shape.rows < 1 || shape.rows > max_rows_)
    return mode_;
  Batch& b = batches_[shape];
  if (!b.warm) {
    warming_ = shape;  // warm once this pass reaches launch(); one that throws leaves the shape cold
    return mode_;
  }
  batch_ = shape;
  epoch_at_begin_ = epoch;
  started_ = std::chrono::steady_clock::now();
  mode_ = b.exec && b.replayable && b.epoch == epoch ? Mode::replay : Mode::capture;
  // A replay captures too, into a graph it throws away: an op that launches kernels without asking
  // tables_only() (none should) then lands there instead of running outside the replayed graph. Relaxed: the
  // host side of a pass may allocate (never once warm; a capture that did is not replayed).
  NINFER_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  return mode_;
}

void DecodeGraphs::install(cudaStream_t stream, Batch& b, cudaGraph_t graph) {
  if (b.exec) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(b.exec, graph, &info) == cudaSuccess) return;
    cudaGetLastError();
    cudaGraphExecDestroy(b.exec);
    b.exec = nullptr;
  }
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t before = free_device_bytes();
  // Through a local: a failed instantiation leaves b.exec null, not undefined (the next capture would update it).
  cudaGraphExec_t exec = nullptr;
  NINFER_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  b.exec = exec;
  NINFER_CUDA_CHECK(cudaGraphUpload(b.exec, stream));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));
  bytes_ += before - free_device_bytes();
}

void DecodeGraphs::launch(cudaStream_t stream, const StepTables& tables, uint64_t epoch) {
  if (mode_ == Mode::eager) {
    if (warming_.lanes > 0) batches_[std::exchange(warming_, GraphPassShape{})].warm = true;
    return;
  }
  Batch& b = batches_[batch_];
  const Mode mode = mode_;
  mode_ = Mode::eager;  // the pass is over whatever happens below
  cudaGraph_t graph = nullptr;
  NINFER_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  struct Destroy {
    cudaGraph_t g;
    ~Destroy() {
      if (g) cudaGraphDestroy(g);
    }
  } destroy{graph};
  if (mode == Mode::capture) {
    install(stream, b, graph);
    // Replayable only when no buffer moved while the pass was being captured (its first half may have used
    // one that its second half freed); else the next pass captures again.
    b.replayable = epoch == epoch_at_begin_;
    b.epoch = epoch;
    b.layout = tables.layout();
  } else if (epoch != epoch_at_begin_ || tables.layout() != b.layout) {
    b.replayable = false;
    throw EngineError(std::string("CUDA decode graph of ") + std::to_string(batch_.lanes) + " lanes x " +
                      std::to_string(batch_.rows) + " rows: the replayed pass " +
                      (epoch != epoch_at_begin_ ? "allocated device memory" : "wrote other step tables") +
                      " than its capture (a bug: the graph would read the wrong addresses)");
  }
  tables.copy_all(stream);
  launch_timed(stream, b.exec);
  if (mode == Mode::capture) {
    ++timings_.captures;
    timings_.capture_host_us += micros_since(started_);
  } else {
    ++timings_.replays;
    timings_.replay_host_us += micros_since(started_);
  }
}

void DecodeGraphs::launch_timed(cudaStream_t stream, cudaGraphExec_t exec) {
  if (!launch_start_) {
    NINFER_CUDA_CHECK(cudaEventCreate(&launch_start_));
    NINFER_CUDA_CHECK(cudaEventCreate(&launch_end_));
  }
  NINFER_CUDA_CHECK(cudaEventRecord(launch_start_, stream));
  NINFER_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  NINFER_CUDA_CHECK(cudaEventRecord(launch_end_, stream));
  launch_timed_ = true;
  launched_draft_ = batch_.drafts > 0;
}

void DecodeGraphs::collect_timing() {
  if (!launch_timed_) return;
  launch_timed_ = false;
  float ms = 0.0f;
  NINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, launch_start_, launch_end_));
  if (launched_draft_) {
    timings_.draft_device_us += double(ms) * 1000.0;
    ++timings_.draft_passes;
    return;
  }
  timings_.device_us += double(ms) * 1000.0;
  ++timings_.passes;
}

void DecodeGraphs::abandon(cudaStream_t stream) {
  discard_capture(stream);
  cudaGetLastError();
  if (mode_ == Mode::capture) batches_[batch_].replayable = false;
  mode_ = Mode::eager;
  warming_ = {};
}

int32_t DecodeGraphs::captured() const {
  int32_t n = 0;
  for (const auto& [shape, b] : batches_) n += b.exec != nullptr;
  return n;
}

}  // namespace ninfer::cuda
