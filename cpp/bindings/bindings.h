// The production extension `ninfer._engine`: the artifact reader, the engine and what a request carries. The
// entry points tests and benchmarks use besides live in the testing module (bindings/testing/, `ninfer._testing`).
#pragma once
#include <nanobind/nanobind.h>

namespace ninfer::bindings {
void bind_errors(nanobind::module_& m);    // errors.cpp: C++ error types -> ninfer.errors classes
void bind_artifact(nanobind::module_& m);  // artifact.cpp
void bind_runtime(nanobind::module_& m);   // runtime.cpp: scheduler / engine
}  // namespace ninfer::bindings
