// The pools the runtime owns, in one place: the KV pool and Gated DeltaNet state pool in the backend's memory, with
// their bookkeeping, and the copies to and from the host tier (HostPool). The model gives the layout
// (Model::cache_layout); the runtime chooses the capacities.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/memory.h"
#include "cache/kv_dtype.h"
#include "cache/kv_pool.h"
#include "cache/host_pool.h"
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
  // The host tier: a device page or state slot into a host one and back. They are queued (on the CUDA backend on a
  // copy stream, after the work queued before them); fence_host_copies() makes the work queued after it wait for
  // them, wait_host_copies() waits for them on the host (before host memory they read or write changes hands).
  virtual void store_page(int32_t page, int32_t host_page) = 0;
  virtual void load_page(int32_t host_page, int32_t page) = 0;
  virtual void store_state(int32_t slot, int32_t host_slot) = 0;
  virtual void load_state(int32_t host_slot, int32_t slot) = 0;
  virtual void fence_host_copies() = 0;
  virtual void wait_host_copies() = 0;
};

// kv() always exists, states() only for GDN models.
class CachePools final : public CacheContents {
 public:
  CachePools(const CacheLayout& layout, const CacheCapacity& capacity, KvDtype dtype, MemoryResource& device);
  // The host tier's storage (its pages of kv().page_bytes(), its slots of state_bytes()), once it has some.
  void set_host(HostPool* host) { host_ = host; }
  size_t state_bytes() const { return states_ ? states_->slot_bytes() : 0; }

  KvPool& kv() { return *kv_; }
  StatePool* states() { return states_.get(); }
  PageTable& pages() { return pages_; }
  SlotTable& slots() { return slots_; }

  void zero_state(int32_t slot) override { states_->zero(slot); }
  void copy_state(int32_t from, int32_t to) override { states_->copy(from, to); }
  void copy_page(int32_t from, int32_t to) override { kv_->copy_page(from, to); }
  void store_page(int32_t page, int32_t host_page) override;
  void load_page(int32_t host_page, int32_t page) override;
  void store_state(int32_t slot, int32_t host_slot) override;
  void load_state(int32_t host_slot, int32_t slot) override;
  void fence_host_copies() override { device_.fence_pinned_copies(); }
  void wait_host_copies() override { device_.wait_pinned_copies(); }

 private:
  MemoryResource& device_;
  HostPool* host_ = nullptr;
  std::unique_ptr<KvPool> kv_;
  std::unique_ptr<StatePool> states_;
  PageTable pages_;
  SlotTable slots_;
};

}  // namespace ninfer
