// The pools the runtime owns, in one place: the device KV pool and Gated DeltaNet state pool with their
// bookkeeping, and the host tier (a KV pool and a state pool in host memory) that device pages and slots are
// copied to and back from. The model gives the layout (Model::cache_layout); the runtime chooses the capacities.
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
  int64_t host_pages = 0;          // host tier (0: none)
  int32_t host_state_slots = 0;
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

// Pools on both tiers; a tier with no capacity has no pool (kv() always exists, states() only for GDN models).
class CachePools final : public CacheContents {
 public:
  CachePools(const CacheLayout& layout, const CacheCapacity& capacity, KvDtype dtype, MemoryResource& device);

  KvPool& kv() { return *kv_; }
  StatePool* states() { return states_.get(); }
  PageTable& pages() { return pages_; }
  SlotTable& slots() { return slots_; }
  KvPool* host_kv() { return host_kv_.get(); }
  StatePool* host_states() { return host_states_.get(); }
  PageTable& host_pages() { return host_pages_; }
  SlotTable& host_slots() { return host_slots_; }

  void zero_state(int32_t slot) override { states_->zero(slot); }
  void copy_state(int32_t from, int32_t to) override { states_->copy(from, to); }
  void copy_page(int32_t from, int32_t to) override { kv_->copy_page(from, to); }

 private:
  std::unique_ptr<KvPool> kv_, host_kv_;
  std::unique_ptr<StatePool> states_, host_states_;
  PageTable pages_, host_pages_;
  SlotTable slots_, host_slots_;
};

}  // namespace ninfer
