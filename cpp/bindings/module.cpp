#include "bindings/bindings.h"

NB_MODULE(_engine, m) {
  m.doc() = "ninfer engine: artifact reader, model, CPU (and CUDA) backends, runtime";
  ninfer::bindings::bind_errors(m);
  ninfer::bindings::bind_artifact(m);
  ninfer::bindings::bind_kernels(m);
  ninfer::bindings::bind_gdn(m);
  ninfer::bindings::bind_model(m);
  ninfer::bindings::bind_runtime(m);
  ninfer::bindings::bind_cache(m);
  ninfer::bindings::bind_cuda(m);
}
