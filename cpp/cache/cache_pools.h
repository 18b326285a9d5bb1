// The pools the runtime owns, in one place: the KV pool and Gated DeltaNet state pool in the backend's memory, with
// their bookkeeping. The model gives the layout (Model::cache_layout); the runtime chooses the capacities. (A host
// tier comes with the prefix cache that restores from it.)
#pragma once

#include <cstdint>
#include <memory>

#include "backend/memory.h"
#include "cache/kv_dtype.h"
#include "cache/kv_pool.h"
#include "cache/page_table.h"
#include "cache/state_pool.h"

namespace ninfer {

// What one page and one state slot hold, from the model's layer plan.
struct CacheLayout {
  int32_t kv_layers = 0, kv_heads = 0, head_dim = 0;  // full-attention layers (the MTP layer counts as one)
  int32_t state_layers = 0;                           // Gated DeltaNet layers; 0: no state pool
  int64_t conv_floats = 0, recurrent_floats = 0;      // per slot and GDN layer
};

struct CacheCapacity {
  int64_t device_pages = 0;
  int32_t device_state_slots = 0;  // the lanes' working states, plus snapshot slots
};

// What the cache manager does to cache contents, as opposed to its bookkeeping: CachePools does it to memory;
// tests over simulated pools record the calls instead.
class CacheContents {
 public:
  virtual ~CacheContents() = default;
  virtual void zero_state(int32_t slot) = 0;
  virtual void copy_state(int32_t from, int32_t to) = 0;
  virtual void copy_page(int32_t from, int32_t to) = 0;
};

// kv() always exists, states() only for GDN models.
class CachePools final : public CacheContents {
 public:
  CachePools(const CacheLayout& layout, const CacheCapacity& capacity, KvDtype dtype, MemoryResource& device);

  KvPool& kv() { return *kv_; }
  StatePool* states() { return states_.get(); }
  PageTable& pages() { return pages_; }
  SlotTable& slots() { return slots_; }

  void zero_state(int32_t slot) override { states_->zero(slot); }
  void copy_state(int32_t from, int32_t to) override { states_->copy(from, to); }
  void copy_page(int32_t from, int32_t to) override { kv_->copy_page(from, to); }

 private:
  std::unique_ptr<KvPool> kv_;
  std::unique_ptr<StatePool> states_;
  PageTable pages_;
  SlotTable slots_;
};

}  // namespace ninfer
