#include "bindings/bindings.h"
#include "bindings/testing/testing.h"

NB_MODULE(_testing, m) {
  m.doc() = "ninfer's test and benchmark entry points: kernels, models, simulated caches, CUDA ops";
  // `_engine` first: it registers the types these functions take (Artifact, SamplingParams, ...).
  nanobind::module_::import_("ninfer._engine");
  ninfer::bindings::bind_errors(m);  // this module's own copy of the C++ error types translates to ninfer.errors
  ninfer::bindings::bind_kernels(m);
  ninfer::bindings::bind_gdn(m);
  ninfer::bindings::bind_model(m);
  ninfer::bindings::bind_cache(m);
  ninfer::bindings::bind_runtime_hooks(m);
  ninfer::bindings::bind_cuda(m);
}
