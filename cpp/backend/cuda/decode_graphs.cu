#include "backend/cuda/decode_graphs.h"

#include "backend/cuda/cuda_check.h"

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

}  // namespace

DecodeGraphs::~DecodeGraphs() {
  for (cudaGraphExec_t e : execs_)
    if (e) cudaGraphExecDestroy(e);
  if (launch_start_) cudaEventDestroy(launch_start_);
  if (launch_end_) cudaEventDestroy(launch_end_);
}

bool DecodeGraphs::should_capture(int32_t batch) {
  if (!enabled || batch <= 0 || size_t(batch) >= execs_.size()) return false;
  if (warm_[size_t(batch)]) return true;
  warm_[size_t(batch)] = true;
  return false;
}

void DecodeGraphs::begin_capture(cudaStream_t stream, int32_t batch) {
  // Relaxed: allocations made by the host side of a pass (none once warm) are not refused mid-capture.
  NINFER_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  batch_ = batch;
  capture_started_ = std::chrono::steady_clock::now();
}

cudaGraph_t DecodeGraphs::end_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  pending_ = batch_;
  batch_ = 0;
  NINFER_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  timings_.capture_host_us += micros_since(capture_started_);
  return graph;
}

void DecodeGraphs::launch(cudaStream_t stream, cudaGraph_t graph) {
  struct Destroy {
    cudaGraph_t g;
    ~Destroy() { cudaGraphDestroy(g); }
  } destroy{graph};
  const auto update_started = std::chrono::steady_clock::now();
  cudaGraphExec_t& exec = execs_[size_t(pending_)];
  if (exec) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec, graph, &info) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
  }
  if (!exec) {
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t before = free_device_bytes();
    NINFER_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    NINFER_CUDA_CHECK(cudaGraphUpload(exec, stream));
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream));
    bytes_ += before - free_device_bytes();
  }
  timings_.update_host_us += micros_since(update_started);
  if (!launch_start_) {
    NINFER_CUDA_CHECK(cudaEventCreate(&launch_start_));
    NINFER_CUDA_CHECK(cudaEventCreate(&launch_end_));
  }
  NINFER_CUDA_CHECK(cudaEventRecord(launch_start_, stream));
  NINFER_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  NINFER_CUDA_CHECK(cudaEventRecord(launch_end_, stream));
  launch_timed_ = true;
  ++replays_;
}

void DecodeGraphs::collect_timing() {
  if (!launch_timed_) return;
  launch_timed_ = false;
  float ms = 0.0f;
  NINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, launch_start_, launch_end_));
  timings_.device_us += double(ms) * 1000.0;
  ++timings_.passes;
}

void DecodeGraphs::abandon(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &status);
  if (status != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
  }
  cudaGetLastError();
  batch_ = 0;
}

int32_t DecodeGraphs::captured() const {
  int32_t n = 0;
  for (cudaGraphExec_t e : execs_) n += e != nullptr;
  return n;
}

}  // namespace ninfer::cuda
