#include "backend/cuda/decode_graphs.h"

#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {
namespace {

int64_t free_device_bytes() {
  size_t free_bytes = 0, total = 0;
  NINFER_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return int64_t(free_bytes);
}

}  // namespace

DecodeGraphs::~DecodeGraphs() {
  for (cudaGraphExec_t e : execs_)
    if (e) cudaGraphExecDestroy(e);
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
}

cudaGraph_t DecodeGraphs::end_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  pending_ = batch_;
  batch_ = 0;
  NINFER_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  return graph;
}

void DecodeGraphs::launch(cudaStream_t stream, cudaGraph_t graph) {
  struct Destroy {
    cudaGraph_t g;
    ~Destroy() { cudaGraphDestroy(g); }
  } destroy{graph};
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
  NINFER_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  ++replays_;
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
