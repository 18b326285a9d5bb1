// The vision ops' defaults for a backend without vision kernels: each refuses with the same message (the model
// checks has_vision_ops() at load, so a request never reaches them).
#include <string>

#include "backend/backend.h"
#include "errors.h"

namespace ninfer {
namespace {

[[noreturn]] void refuse(const char* op) {
  throw EngineError(std::string("this backend has no vision kernels (") + op +
                    "); the vision tower runs on the CPU backend");
}

}  // namespace

void Backend::layernorm(const float*, int64_t, int64_t, const float*, const float*, float, float*) {
  refuse("layernorm");
}
void Backend::gelu(const float*, int64_t, GeluKind, float*) { refuse("gelu"); }
void Backend::add_embedding_mix(const int32_t*, const float*, int64_t, int32_t, const TensorView&, float*) {
  refuse("add_embedding_mix");
}
void Backend::segment_attention(const float*, const float*, const float*, int64_t, std::span<const RowSegment>,
                                int32_t, int32_t, float, float*) {
  refuse("segment_attention");
}

}  // namespace ninfer
