// The cache manager: which pages and state slots each running job holds, and the prefix cache around them.
// Admission gives a job its pages, its state slot and the count of prompt tokens already computed (a cached
// prefix: its pages shared, its state restored from a snapshot); commit publishes what a job has computed since
// (whole blocks, and a state snapshot where the policy wants one); release gives a job's holdings back; fork
// shares a sequence's pages with a new one (decision scoring); snapshot keeps a copy of a lane's state in a spare
// slot.
//
// It works on the pools' bookkeeping (PageTable, SlotTable) and asks CacheContents for the copies, so tests run it
// over simulated pools and check exact page ids and slot numbers. With a host tier (runtime/host_tier.h) the prefix
// cache's evictions move blocks and snapshots there and admission restores from it; close() leaves the index to the
// host tier for the next engine of the model.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "cache/cache_pools.h"
#include "cache/page_table.h"
#include "runtime/host_tier.h"
#include "runtime/prefix_cache.h"

namespace ninfer {

// One running sequence's share of the pools.
struct SequenceCache {
  std::vector<int32_t> pages;  // KV pages in order; page p holds positions [64p, 64p + 64)
  int32_t state_slot = -1;     // GDN state slot, -1 for models without linear attention
  // Speculative decoding: a verify pass writes the state after each of its rows into these (ForwardItem::
  // step_slots), and the accepted row's then becomes state_slot, the old state_slot taking its place here.
  std::vector<int32_t> step_slots;
  BlockCursor published;       // its blocks in the prefix cache (the first published.blocks pages are shared)
  bool held = false;           // admitted or forked, not yet released
};

struct CacheAdmission {
  SequenceCache cache;
  int64_t computed = 0;  // prompt tokens already in the cache (the job prefills the rest)
};

// Pages and state slots set aside for one job's forks (a decision job's question rows), so that no other
// admission can take them while the job runs; its forks draw on it and give back to it.
struct CacheReserve {
  std::vector<int32_t> pages;
  std::vector<int32_t> slots;
};

struct CacheStats {
  int64_t total_pages = 0, free_pages = 0, shared_pages = 0;  // shared: held by more than one sequence or block
  int32_t total_state_slots = 0, free_state_slots = 0, snapshots = 0;  // snapshots: every slot not a lane's
  // The prefix cache (all zero when it is off).
  int64_t cached_blocks = 0, cached_snapshots = 0;
  int64_t lookups = 0, hits = 0, cached_tokens = 0, restores = 0;  // admissions that looked, reused, tokens, device copies
  int64_t evicted_blocks = 0, evicted_snapshots = 0;  // that left the device tier
  // The host tier (all zero without one; PrefixCacheStats): held now, room, moved in, forgotten, restored.
  int64_t host_blocks = 0, host_snapshots = 0, host_pages = 0, host_slots = 0;
  int64_t host_stored_blocks = 0, host_stored_snapshots = 0, host_evicted_blocks = 0, host_evicted_snapshots = 0;
  int64_t host_restored_blocks = 0, host_restored_snapshots = 0;
};

struct CacheManagerOptions {
  bool prefix_cache = false;
  uint64_t model_key = 0;    // prefix_model_key
  int32_t lanes = 1;         // sequences that may run at once: their state slots are never taken by snapshots
  // Speculative decoding's step slots per lane (admit's step_slots): an idle lane's are kept from snapshots too
  // (counted for every lane, decision lanes included, which never draft: a conservative reserve).
  int32_t step_slots = 0;
  SnapshotPolicy snapshots;  // where commit takes state snapshots
  // The host tier (with the prefix cache only), its storage in `host_memory` (null: bookkeeping only), and the
  // sizes of one page and one state slot, for its storage and its GDSF.
  HostTier* host = nullptr;
  MemoryResource* host_memory = nullptr;
  size_t page_bytes = 0, state_bytes = 0;
};

class CacheManager {
 public:
  // `slots` is null for models without linear attention (no state to keep).
  CacheManager(PageTable& pages, SlotTable* slots, CacheContents& contents, const CacheManagerOptions& options = {});
  ~CacheManager();
  CacheManager(const CacheManager&) = delete;
  CacheManager& operator=(const CacheManager&) = delete;
  // Hands the prefix cache to the host tier (what the device holds moves there as far as it has room); nothing
  // without one. Every sequence must be released first. Idempotent; the destructor calls it.
  void close();

  // Pages for `reserve_tokens` tokens, a state slot and `step_slots` more (speculative decoding's verify rows; none
  // for models without linear attention); nullopt, changing nothing, when they do not fit now (after
  // evicting what the prefix cache may). With `reuse` and the prefix cache on, the longest cached prefix of
  // `prompt` (before its last token, or all of it with `whole_prompt`: a prompt whose last token's logits are not
  // needed) is shared and its state restored; else the state is zeroed. `salts` salt the prompt's blocks
  // (PrefixCache::match).
  std::optional<CacheAdmission> admit(int64_t reserve_tokens, std::span<const int32_t> prompt = {},
                                      std::span<const uint64_t> salts = {}, bool reuse = true, int32_t step_slots = 0,
                                      bool whole_prompt = false);
  // The sequence's first `computed` tokens (`tokens`) are in its pages and its state is the state after them:
  // publishes its new whole blocks, then takes the snapshot `use` asks for (when `computed` is a block boundary
  // and a slot is free or can be freed). Nothing when the prefix cache is off.
  void commit(SequenceCache& cache, std::span<const int32_t> tokens, int64_t computed, SnapshotUse use,
              std::span<const uint64_t> salts = {});
  void release(SequenceCache& cache);  // gives its pages and slot back now; `cache` is left empty
  // A new sequence that continues `parent` after its first `tokens` tokens, with room for `reserve_tokens`: it
  // shares the parent's full pages below `tokens`, gets a copy of the partly filled page (if any) so both can
  // write on, fresh pages for the rest, and a copy of the parent's state (which must be the state after `tokens`).
  // With `from`, the fork's fresh pages and its slot come out of that reserve instead of the pools.
  std::optional<SequenceCache> fork(const SequenceCache& parent, int64_t tokens, int64_t reserve_tokens,
                                    CacheReserve* from = nullptr);
  // Gives a fork made from `into` after `tokens` back: its shared pages lose a holder, its own pages and its slot
  // return to the reserve. `child` is left empty.
  void return_fork(SequenceCache& child, int64_t tokens, CacheReserve& into);
  // `pages` pages and `slots` state slots (none for a model without state), or nullopt, changing nothing.
  std::optional<CacheReserve> reserve(int64_t pages, int32_t slots);
  void release(CacheReserve& reserve);  // back to the pools; `reserve` is left empty
  // A spare slot holding a copy of the sequence's state as it is now (the caller takes it at the position it
  // records); -1 when no slot is free or the model keeps no state.
  int32_t snapshot(const SequenceCache& cache);
  void restore(int32_t snapshot, const SequenceCache& cache);  // copies the snapshot into the sequence's slot
  void drop_snapshot(int32_t snapshot);

  bool prefix_cache() const { return bool(prefix_); }
  // Snapshot positions the prefill chunks must end on (none without the prefix cache or without state).
  int64_t next_snapshot(int64_t begin, int64_t prompt_tokens) const;
  SnapshotUse snapshot_use(int64_t position, int64_t prompt_tokens) const;
  CacheStats stats() const;
  // Pages and state slots a new sequence can have now: the free ones and those the prefix cache alone holds
  // (evicted on demand). O(cached blocks).
  std::pair<int64_t, int32_t> reclaimable() const;

 private:
  bool take_pages(int64_t n);  // makes n pages free, evicting cached blocks; false (evicting nothing) if it cannot
  void take_state_snapshot(SequenceCache& cache, SnapshotUse use);

  PageTable& pages_;
  SlotTable* slots_;
  CacheContents& contents_;
  CacheManagerOptions options_;
  std::unique_ptr<PrefixCache> prefix_;
  int32_t snapshots_ = 0;  // taken with snapshot()
  int32_t held_ = 0;       // sequences holding a slot
  int64_t lookups_ = 0, hits_ = 0, cached_tokens_ = 0, restores_ = 0;
};

}  // namespace ninfer
