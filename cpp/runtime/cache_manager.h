// The cache manager: which pages and state slots each running job holds. Admission gives a job its pages, its
// state slot and the count of prompt tokens already computed; release gives them back; fork shares a sequence's
// pages with a new one (decision scoring, n > 1); snapshot keeps a copy of a lane's state in a spare slot.
//
// It works on the pools' bookkeeping (PageTable, SlotTable) and asks CacheContents for the copies, so tests run it
// over simulated pools and check exact page ids and slot numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cache/cache_pools.h"
#include "cache/page_table.h"

namespace ninfer {

// One running sequence's share of the pools.
struct SequenceCache {
  std::vector<int32_t> pages;  // KV pages in order; page p holds positions [64p, 64p + 64)
  int32_t state_slot = -1;     // GDN state slot, -1 for models without linear attention
  // Speculative decoding: a verify pass writes the state after each of its rows into these (ForwardItem::
  // step_slots), and the accepted row's then becomes state_slot, the old state_slot taking its place here.
  std::vector<int32_t> step_slots;
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
  int64_t total_pages = 0, free_pages = 0, shared_pages = 0;  // shared: held by more than one sequence
  int32_t total_state_slots = 0, free_state_slots = 0, snapshots = 0;
};

class CacheManager {
 public:
  // `slots` is null for models without linear attention (no state to keep).
  CacheManager(PageTable& pages, SlotTable* slots, CacheContents& contents);

  // Pages for `reserve_tokens` tokens, a zeroed state slot and `step_slots` more (speculative decoding's; none for
  // models without linear attention); nullopt, changing nothing, when they do not fit now.
  std::optional<CacheAdmission> admit(int64_t reserve_tokens, int32_t step_slots = 0);
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
  CacheStats stats() const;

 private:
  PageTable& pages_;
  SlotTable* slots_;
  CacheContents& contents_;
  int32_t snapshots_ = 0;
};

}  // namespace ninfer
