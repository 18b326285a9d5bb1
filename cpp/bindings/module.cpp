#include "bindings/bindings.h"

NB_MODULE(_engine, m) {
  m.doc() = "ninfer engine: artifact reader, CPU (and CUDA) backends, runtime";
  ninfer::bindings::bind_errors(m);
  ninfer::bindings::bind_artifact(m);
  ninfer::bindings::bind_runtime(m);
}
