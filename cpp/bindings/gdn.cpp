#include "bindings/bindings.h"

namespace ninfer::bindings {
// Filled by the component's owner.
void bind_gdn(nanobind::module_& m) {}
}  // namespace ninfer::bindings
