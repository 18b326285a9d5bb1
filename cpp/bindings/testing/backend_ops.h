// `_testing.cuda.Ops`: every Backend op callable from Python on numpy arrays, the same code for the CPU and the
// CUDA backend, so a test compares the two op by op.
#pragma once

#include <nanobind/nanobind.h>

namespace ninfer::bindings {

void bind_backend_ops(nanobind::module_& cuda_module);  // cuda.cpp calls it

}  // namespace ninfer::bindings
