// The testing extension `ninfer._testing`, built for the tests and benchmarks only (CMake NINFER_TESTING=ON, which
// `make build` and bench/gpu_run.sh set): the kernels, models, simulated caches and CUDA ops they compare against
// their references. It takes `_engine`'s objects (an Artifact, SamplingParams): nanobind shares the types of
// extensions built with the same ABI.
#pragma once
#include <nanobind/nanobind.h>

namespace ninfer::bindings {
void bind_kernels(nanobind::module_& m);        // kernels.cpp: CPU op entry points
void bind_gdn(nanobind::module_& m);            // gdn.cpp: Gated DeltaNet kernels
void bind_model(nanobind::module_& m);          // model.cpp: the model on a backend, forward by forward
void bind_cache(nanobind::module_& m);          // cache.cpp: the cache manager over simulated pools
void bind_runtime_hooks(nanobind::module_& m);  // runtime_hooks.cpp: sampler, token mask, KV row codecs
void bind_cuda(nanobind::module_& m);           // cuda.cpp: CUDA kernels and backend ops (when built)
}  // namespace ninfer::bindings
