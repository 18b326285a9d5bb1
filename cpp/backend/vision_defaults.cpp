// What the vision ops of every backend share: the defaults of a backend without vision kernels, each refusing with
// the same message (the model checks has_vision_ops() at load, so a request never reaches them), and the checks of
// host tables that every implementation makes alike.
#include <string>

#include "backend/backend.h"
#include "errors.h"

namespace ninfer {
namespace {

[[noreturn]] void refuse(const char* op) {
  throw EngineError(std::string("this backend has no vision kernels (") + op +
                    "); the vision tower runs on the CPU and CUDA backends");
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

void Backend::check_embedding_taps(const int32_t* ids, int64_t count, int64_t table_rows) {
  for (int64_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= table_rows)
      throw EngineError("add_embedding_mix: row " + std::to_string(ids[i]) + " outside the table of " +
                        std::to_string(table_rows));
}

}  // namespace ninfer
