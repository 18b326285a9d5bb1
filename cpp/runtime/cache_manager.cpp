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

std::optional<SequenceCache> CacheManager::fork(const SequenceCache& parent, int64_t tokens, int64_t reserve_tokens,
                                               CacheReserve* from) {
  if (tokens > int64_t(parent.pages.size()) * kKvPageTokens || tokens > reserve_tokens)
    throw EngineError("fork after " + std::to_string(tokens) + " tokens of a sequence of " +
                      std::to_string(parent.pages.size() * kKvPageTokens) + " reserved, into " +
                      std::to_string(reserve_tokens));
  const int64_t shared = tokens / kKvPageTokens;  // full pages: read-only for both from now on
  const int64_t fresh = kv_pages_for(reserve_tokens) - shared;
  const int64_t free_pages = from ? int64_t(from->pages.size()) : pages_.free();
  const bool slot_free = !slots_ || (from ? !from->slots.empty() : slots_->free() > 0);
  if (fresh > free_pages || !slot_free) return std::nullopt;
  SequenceCache child;
  child.pages.assign(parent.pages.begin(), parent.pages.begin() + shared);
  for (int32_t p : child.pages) pages_.retain(p);
  if (from) {
    child.pages.insert(child.pages.end(), from->pages.end() - fresh, from->pages.end());
    from->pages.resize(from->pages.size() - size_t(fresh));
  } else {
    pages_.acquire(fresh, child.pages);
  }
  if (tokens % kKvPageTokens) contents_.copy_page(parent.pages[size_t(shared)], child.pages[size_t(shared)]);
  if (slots_) {
    if (from) {
      child.state_slot = from->slots.back();
      from->slots.pop_back();
    } else {
      child.state_slot = slots_->acquire();
    }
    contents_.copy_state(parent.state_slot, child.state_slot);
  }
  return child;
}

void CacheManager::return_fork(SequenceCache& child, int64_t tokens, CacheReserve& into) {
  const size_t shared = size_t(tokens / kKvPageTokens);
  pages_.release(std::span<const int32_t>(child.pages.data(), shared));
  into.pages.insert(into.pages.end(), child.pages.begin() + shared, child.pages.end());
  if (child.state_slot >= 0) into.slots.push_back(child.state_slot);
  child.pages.clear();
  child.state_slot = -1;
}

std::optional<CacheReserve> CacheManager::reserve(int64_t pages, int32_t slots) {
  if (!slots_) slots = 0;
  if (pages > pages_.free() || (slots > 0 && slots_->free() < slots)) return std::nullopt;
  CacheReserve r;
  pages_.acquire(pages, r.pages);
  for (int32_t i = 0; i < slots; ++i) r.slots.push_back(slots_->acquire());
  return r;
}

void CacheManager::release(CacheReserve& reserve) {
  pages_.release(reserve.pages);
  reserve.pages.clear();
  for (int32_t slot : reserve.slots) slots_->release(slot);
  reserve.slots.clear();
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
