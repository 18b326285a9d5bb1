#include "cache/state_pool.h"

#include <algorithm>
#include <new>
#include <string>

#include "errors.h"

namespace ninfer {

StatePool::StatePool(int32_t slots, int32_t layers, int64_t conv_floats, int64_t recurrent_floats,
                     MemoryResource& memory)
    : slots_(slots), layers_(layers), conv_floats_(conv_floats), recurrent_floats_(recurrent_floats),
      slot_floats_(int64_t(layers) * (conv_floats + recurrent_floats)) {
  storage_ = MemoryBlock(memory, size_t(slot_floats_ * slots) * sizeof(float),
                         "Gated DeltaNet state pool of " + std::to_string(slots) + " slots");
}

void StatePool::copy(int32_t from, int32_t to) {
  if (from != to) storage_.memory().copy(slot_base(to), slot_base(from), size_t(slot_floats_) * sizeof(float));
}

void StatePool::copy_conv(int32_t from, int32_t to, int32_t layer) {
  if (from != to) storage_.memory().copy(conv(to, layer), conv(from, layer), size_t(conv_floats_) * sizeof(float));
}

void StatePool::copy_recurrent(int32_t from, int32_t to, int32_t layer) {
  if (from != to)
    storage_.memory().copy(recurrent(to, layer), recurrent(from, layer), size_t(recurrent_floats_) * sizeof(float));
}

void StatePool::zero(int32_t slot) { storage_.memory().fill(slot_base(slot), 0, size_t(slot_floats_) * sizeof(float)); }

}  // namespace ninfer
