// The host tier of the prefix cache: room in host memory for KV blocks and Gated DeltaNet state snapshots that the
// device tier evicted, and the index of what it holds, kept while no engine runs the model. One tier serves one
// model at a time (the router runs one engine at a time); it outlives the engine, so a model swapped out and loaded
// again resumes its conversations from it (the next engine adopts its index: attach).
//
// Its size is fixed by two numbers, EngineOptions::host_kv_mib and host_state_slots, and its storage (HostPool) is
// allocated at the first attach, when the model's page and slot sizes are known. An attach for another model, KV
// dtype or size forgets what it held and starts over (the index's hash chains start at the model key, so blocks of
// different models could never be confused anyway; this returns the room).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "cache/host_pool.h"
#include "cache/page_table.h"
#include "runtime/prefix_cache.h"

namespace ninfer {

struct HostTierStats {
  int64_t pages = 0, used_pages = 0, page_bytes = 0;
  int32_t slots = 0, used_slots = 0;
  int64_t slot_bytes = 0, bytes = 0;  // bytes: the storage allocated (0 until the first attach)
  bool parked = false;               // it holds an index no engine runs now
};

class HostTier {
 public:
  // kv_bytes of room for KV pages, state_slots snapshots (models without linear attention use none).
  HostTier(int64_t kv_bytes, int32_t state_slots) : kv_bytes_(kv_bytes), state_slots_(state_slots) {}

  int64_t kv_bytes() const { return kv_bytes_; }
  int32_t state_slots() const { return state_slots_; }

  // For an engine of `model_key` whose pages take `page_bytes` and state slots `state_bytes` (0: no state):
  // the index it left last time (attached to the engine's pools), or a new one. `memory` allocates the storage;
  // null keeps bookkeeping only (simulated pools). Throws EngineError when an engine holds it already.
  std::unique_ptr<PrefixCache> attach(uint64_t model_key, size_t page_bytes, size_t state_bytes, MemoryResource* memory,
                                      PageTable& pages, SlotTable* slots, CacheContents& contents);
  // The engine's index, detached from its pools (PrefixCache::detach), kept for the next attach.
  void park(std::unique_ptr<PrefixCache> index);

  HostPool* storage() { return storage_.get(); }
  HostTierStats stats() const;

 private:
  HostTierTables tables();
  void reset(uint64_t model_key, size_t page_bytes, size_t state_bytes);

  int64_t kv_bytes_;
  int32_t state_slots_;
  mutable std::mutex mu_;  // stats() may come from another thread than the engine's
  uint64_t model_key_ = 0;
  size_t page_bytes_ = 0, state_bytes_ = 0;
  bool sized_ = false, attached_ = false;
  std::unique_ptr<SlotTable> pages_, slots_;
  std::unique_ptr<HostPool> storage_;
  std::unique_ptr<PrefixCache> parked_;
};

}  // namespace ninfer
