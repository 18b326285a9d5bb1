// Gated DeltaNet state slots: per slot and linear-attention layer, the causal-conv history (the last K-1
// pre-conv inputs, f32) and the recurrent matrix state (f32). Slots can be copied, so snapshots, forks
// (decision scoring) and MTP rollback are slot copies. The pool is storage only: which slots are in use is SlotTable's business (cache/page_table.h).
#pragma once

#include <cstdint>

#include "backend/memory.h"

namespace ninfer {

class StatePool {
 public:
  // Storage in `memory` (the backend's: conv() and recurrent() point there).
  StatePool(int32_t slots, int32_t layers, int64_t conv_floats, int64_t recurrent_floats,
            MemoryResource& memory = host_memory());

  int32_t total_slots() const { return slots_; }
  size_t slot_bytes() const { return size_t(slot_floats_) * sizeof(float); }
  float* slot_data(int32_t slot) { return slot_base(slot); }  // slot_bytes() from here

  void copy(int32_t from, int32_t to);
  void zero(int32_t slot);  // a fresh sequence's state
  // One layer's conv history or recurrent state of slot `from` into slot `to` (SequenceRows::source_slot).
  void copy_conv(int32_t from, int32_t to, int32_t layer);
  void copy_recurrent(int32_t from, int32_t to, int32_t layer);

  float* conv(int32_t slot, int32_t layer) { return slot_base(slot) + layer * layer_floats(); }
  float* recurrent(int32_t slot, int32_t layer) { return conv(slot, layer) + conv_floats_; }

 private:
  int64_t layer_floats() const { return conv_floats_ + recurrent_floats_; }
  float* slot_base(int32_t slot) const { return storage_.get<float>() + slot * slot_floats_; }
  int32_t slots_, layers_;
  int64_t conv_floats_, recurrent_floats_, slot_floats_;
  MemoryBlock storage_;
};

}  // namespace ninfer
