#include "runtime/cache_manager.h"

#include "errors.h"

namespace ninfer {

CacheManager::CacheManager(PageTable& pages, SlotTable* slots, CacheContents& contents)
    : pages_(pages), slots_(slots), contents_(contents) {}

std::optional<CacheAdmission> CacheManager::admit(int64_t reserve_tokens, int32_t step_slots) {
  const int64_t n = kv_pages_for(reserve_tokens);
  if (n > pages_.free() || (slots_ && slots_->free() < 1 + step_slots)) return std::nullopt;
  CacheAdmission a;
  pages_.acquire(n, a.cache.pages);
  if (slots_) {
    a.cache.state_slot = slots_->acquire();
    contents_.zero_state(a.cache.state_slot);
    for (int32_t i = 0; i < step_slots; ++i) a.cache.step_slots.push_back(slots_->acquire());
  }
  return a;
}

void CacheManager::release(SequenceCache& cache) {
  pages_.release(cache.pages);
  cache.pages.clear();
  if (slots_) {
    slots_->release(cache.state_slot);
    for (int32_t slot : cache.step_slots) slots_->release(slot);
  }
  cache.state_slot = -1;
  cache.step_slots.clear();
}

std::optional<SequenceCache> CacheManager::fork(const SequenceCache& parent, int64_t tokens, int64_t reserve_tokens) {
  if (tokens > int64_t(parent.pages.size()) * kKvPageTokens || tokens > reserve_tokens)
    throw EngineError("fork after " + std::to_string(tokens) + " tokens of a sequence of " +
                      std::to_string(parent.pages.size() * kKvPageTokens) + " reserved, into " +
                      std::to_string(reserve_tokens));
  const int64_t shared = tokens / kKvPageTokens;  // full pages: read-only for both from now on
  const int64_t fresh = kv_pages_for(reserve_tokens) - shared;
  if (fresh > pages_.free() || (slots_ && slots_->free() == 0)) return std::nullopt;
  SequenceCache child;
  child.pages.assign(parent.pages.begin(), parent.pages.begin() + shared);
  for (int32_t p : child.pages) pages_.retain(p);
  pages_.acquire(fresh, child.pages);
  if (tokens % kKvPageTokens) contents_.copy_page(parent.pages[size_t(shared)], child.pages[size_t(shared)]);
  if (slots_) {
    child.state_slot = slots_->acquire();
    contents_.copy_state(parent.state_slot, child.state_slot);
  }
  return child;
}

int32_t CacheManager::snapshot(const SequenceCache& cache) {
  if (!slots_) return -1;
  const int32_t slot = slots_->acquire();
  if (slot < 0) return -1;
  contents_.copy_state(cache.state_slot, slot);
  ++snapshots_;
  return slot;
}

void CacheManager::restore(int32_t snapshot, const SequenceCache& cache) {
  contents_.copy_state(snapshot, cache.state_slot);
}

void CacheManager::drop_snapshot(int32_t snapshot) {
  slots_->release(snapshot);
  --snapshots_;
}

CacheStats CacheManager::stats() const {
  CacheStats s;
  s.total_pages = pages_.total();
  s.free_pages = pages_.free();
  s.shared_pages = pages_.shared();
  if (slots_) {
    s.total_state_slots = slots_->total();
    s.free_state_slots = slots_->free();
  }
  s.snapshots = snapshots_;
  return s;
}

}  // namespace ninfer
