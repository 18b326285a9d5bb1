// One binding function per component; module.cpp calls them all. Each lives in the file named after it.
#pragma once
#include <nanobind/nanobind.h>

namespace ninfer::bindings {
void bind_errors(nanobind::module_& m);    // errors.cpp: C++ error types -> ninfer.errors classes
void bind_artifact(nanobind::module_& m);  // artifact.cpp
void bind_kernels(nanobind::module_& m);   // kernels.cpp: CPU op entry points for tests
void bind_gdn(nanobind::module_& m);       // gdn.cpp: Gated DeltaNet kernels for tests
void bind_model(nanobind::module_& m);     // model.cpp
void bind_runtime(nanobind::module_& m);   // runtime.cpp: scheduler / engine
void bind_cache(nanobind::module_& m);     // cache.cpp: the cache manager over simulated pools, for tests
void bind_cuda(nanobind::module_& m);      // cuda.cpp: CUDA kernels for tests and benchmarks (when built)
}  // namespace ninfer::bindings
