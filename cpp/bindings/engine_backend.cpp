// The engine's backends by name: the CPU backend, and the CUDA backend with the engine's CUDA options.
#include "bindings/engine_backend.h"

#include <limits>
#include <string>

#include "errors.h"

#ifdef NINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/prefill_gemm.h"
#endif

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

}  // namespace ninfer::bindings
