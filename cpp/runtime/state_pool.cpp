#include "runtime/state_pool.h"

#include <algorithm>
#include <new>
#include <string>

#include "errors.h"

namespace ninfer {

StatePool::StatePool(int32_t slots, int32_t layers, int64_t conv_floats, int64_t recurrent_floats)
    : slots_(slots), layers_(layers), conv_floats_(conv_floats), recurrent_floats_(recurrent_floats),
      slot_floats_(int64_t(layers) * (conv_floats + recurrent_floats)) {
  try {
    storage_.assign(size_t(slot_floats_ * slots), 0.0f);
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError("Gated DeltaNet state pool of " + std::to_string(slots) + " slots (" +
                           std::to_string(slot_floats_ * slots * 4 >> 20) + " MiB) does not fit in memory");
  }
  for (int32_t s = slots - 1; s >= 0; --s) free_.push_back(s);
}

int32_t StatePool::acquire() {
  if (free_.empty()) return -1;
  int32_t s = free_.back();
  free_.pop_back();
  zero(s);
  return s;
}

void StatePool::release(int32_t slot) {
  if (slot >= 0) free_.push_back(slot);
}

void StatePool::copy(int32_t from, int32_t to) {
  if (from != to) std::copy_n(slot_base(from), slot_floats_, slot_base(to));
}

void StatePool::zero(int32_t slot) { std::fill_n(slot_base(slot), slot_floats_, 0.0f); }

}  // namespace ninfer
