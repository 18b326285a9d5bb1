#include "runtime/cache_manager.h"

#include <limits>

#include "errors.h"

namespace ninfer {

CacheManager::CacheManager(PageTable& pages, SlotTable* slots, CacheContents& contents,
                           const CacheManagerOptions& options)
    : pages_(pages), slots_(slots), contents_(contents), options_(options) {
  if (!options_.prefix_cache) return;
  if (options_.host)
    prefix_ = options_.host->attach(options_.model_key, options_.page_bytes, options_.state_bytes,
                                    options_.host_memory, pages_, slots_, contents_);
  else
    prefix_ = std::make_unique<PrefixCache>(pages_, slots_, options_.model_key);
}

CacheManager::~CacheManager() {
  try {
    close();
  } catch (const std::exception&) {
    // (a device error while copying to the host tier: what it held is lost with the engine)
  }
}

void CacheManager::close() {
  if (!options_.host || !prefix_) return;
  prefix_->detach();
  options_.host->park(std::move(prefix_));
}

bool CacheManager::take_pages(int64_t n) {
  if (n <= pages_.free()) return true;
  if (!prefix_ || n > pages_.free() + prefix_->evictable_blocks()) return false;
  while (pages_.free() < n) prefix_->evict_block();  // cannot fail: the evictable blocks are leaves or above them
  return true;
}

std::optional<CacheAdmission> CacheManager::admit(int64_t reserve_tokens, std::span<const int32_t> prompt,
                                                  std::span<const uint64_t> salts, bool reuse, int32_t step_slots,
                                                  bool whole_prompt) {
  PrefixCache::Match match;
  const bool look = prefix_ && reuse && !prompt.empty();
  if (look) match = prefix_->match(prompt, salts, int64_t(prompt.size()) - (whole_prompt ? 0 : 1));
  else if (prefix_) match.cursor = prefix_->root();  // publishes from the chain's root (the model key), as lookups start
  const int64_t fresh = kv_pages_for(reserve_tokens) - match.blocks;
  if (fresh < 0) throw EngineError("admitting a sequence shorter than its cached prefix");
  // The reused device pages are held, and the match pinned, before anything is evicted, so none of its blocks (nor
  // its snapshot) can be; its host blocks need device pages too.
  const std::vector<int32_t> matched = match.pages;
  for (int32_t p : matched)
    if (p >= 0) pages_.retain(p);
  if (look) prefix_->pin(match, 1);
  const int64_t evictable_snapshots = prefix_ ? prefix_->evictable_snapshots() : 0;
  const bool slot_free = !slots_ || slots_->free() + evictable_snapshots >= 1 + step_slots;
  if (!slot_free || !take_pages(fresh + match.host_blocks)) {
    for (int32_t p : matched)
      if (p >= 0) pages_.release(std::span<const int32_t>(&p, 1));
    if (look) prefix_->pin(match, -1);
    return std::nullopt;
  }
  if (look) prefix_->restore(match);
  for (size_t i = 0; i < matched.size(); ++i)
    if (matched[i] < 0) pages_.retain(match.pages[i]);  // restored: the index's page, now the sequence's too
  CacheAdmission a;
  a.cache.pages = std::move(match.pages);
  pages_.acquire(fresh, a.cache.pages);
  if (slots_) {
    while (slots_->free() < 1 + step_slots) prefix_->evict_snapshot();  // cannot fail: counted above
    a.cache.state_slot = slots_->acquire();
    for (int32_t i = 0; i < step_slots; ++i) a.cache.step_slots.push_back(slots_->acquire());
    if (match.snapshot >= 0) {
      contents_.copy_state(match.snapshot, a.cache.state_slot);
      ++restores_;
    } else if (match.host_snapshot >= 0) {
      contents_.load_state(match.host_snapshot, a.cache.state_slot);  // (counted by the prefix cache's restore)
    } else {
      contents_.zero_state(a.cache.state_slot);
    }
  }
  if (look) prefix_->pin(match, -1);
  if (prefix_) a.cache.published = match.cursor;
  a.cache.held = true;
  ++held_;
  a.computed = match.blocks * kKvPageTokens;
  if (look) {
    ++lookups_;
    if (match.blocks > 0) {
      ++hits_;
      cached_tokens_ += a.computed;
      prefix_->touch(std::span<const int32_t>(match.path.data(), size_t(match.blocks)));
    }
  }
  contents_.fence_host_copies();
  return a;
}

void CacheManager::commit(SequenceCache& cache, std::span<const int32_t> tokens, int64_t computed, SnapshotUse use,
                          std::span<const uint64_t> salts) {
  if (!prefix_) return;
  BlockCursor& c = cache.published;
  while (c.open && (c.blocks + 1) * kKvPageTokens <= computed) {
    const size_t i = size_t(c.blocks);
    const int32_t own = cache.pages.at(i);
    const int32_t kept = prefix_->publish(c, tokens.subspan(i * kKvPageTokens, kKvPageTokens),
                                          i < salts.size() ? salts[i] : 0, own);
    if (kept != own) {  // the same block was published first by another sequence: hold that copy instead
      pages_.retain(kept);
      pages_.release(std::span<const int32_t>(&own, 1));
      cache.pages[i] = kept;
    }
  }
  if (use != SnapshotUse::None && slots_ && c.open && c.blocks * kKvPageTokens == computed && c.blocks > 0)
    take_state_snapshot(cache, use);
  contents_.fence_host_copies();
}

// Snapshot slots never take the slot a sequence yet to be admitted needs: at least one per idle lane stays free.
void CacheManager::take_state_snapshot(SequenceCache& cache, SnapshotUse use) {
  BlockCursor& c = cache.published;
  if (use == SnapshotUse::Frontier && c.frontier_serial && prefix_->snapshot_serial(c.frontier_node) == c.frontier_serial)
    prefix_->drop_snapshot(c.frontier_node);  // superseded by this one
  if (prefix_->has_snapshot(c.node)) return;
  const int32_t idle_lanes = std::max(0, options_.lanes - held_) * (1 + options_.step_slots);
  if (slots_->free() <= idle_lanes && !prefix_->evict_snapshot()) return;
  if (slots_->free() <= idle_lanes) return;
  const int32_t slot = slots_->acquire();
  contents_.copy_state(cache.state_slot, slot);
  const uint64_t serial = prefix_->attach_snapshot(c.node, slot);
  if (use == SnapshotUse::Frontier) {
    c.frontier_node = c.node;
    c.frontier_serial = serial;
  }
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
  if (cache.held) --held_;
  cache.held = false;
  cache.published = {};
}

std::optional<SequenceCache> CacheManager::fork(const SequenceCache& parent, int64_t tokens, int64_t reserve_tokens,
                                               CacheReserve* from) {
  if (tokens > int64_t(parent.pages.size()) * kKvPageTokens || tokens > reserve_tokens)
    throw EngineError("fork after " + std::to_string(tokens) + " tokens of a sequence of " +
                      std::to_string(parent.pages.size() * kKvPageTokens) + " reserved, into " +
                      std::to_string(reserve_tokens));
  const int64_t shared = tokens / kKvPageTokens;  // full pages: read-only for both from now on
  const int64_t fresh = kv_pages_for(reserve_tokens) - shared;
  if (from ? fresh > int64_t(from->pages.size()) || (slots_ && from->slots.empty())
           : slots_ && slots_->free() == 0 && !(prefix_ && prefix_->evictable_snapshots() > 0))
    return std::nullopt;
  for (int64_t i = 0; i < shared; ++i) pages_.retain(parent.pages[size_t(i)]);
  if (!from && !take_pages(fresh)) {
    pages_.release(std::span<const int32_t>(parent.pages.data(), size_t(shared)));
    return std::nullopt;
  }
  SequenceCache child;
  child.pages.assign(parent.pages.begin(), parent.pages.begin() + shared);
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
      if (slots_->free() == 0) prefix_->evict_snapshot();
      child.state_slot = slots_->acquire();
    }
    contents_.copy_state(parent.state_slot, child.state_slot);
  }
  if (prefix_) child.published = prefix_->ancestor(parent.published, std::min(shared, parent.published.blocks));
  child.held = true;
  ++held_;
  contents_.fence_host_copies();
  return child;
}

void CacheManager::return_fork(SequenceCache& child, int64_t tokens, CacheReserve& into) {
  const size_t shared = size_t(tokens / kKvPageTokens);
  pages_.release(std::span<const int32_t>(child.pages.data(), shared));
  into.pages.insert(into.pages.end(), child.pages.begin() + shared, child.pages.end());
  if (child.state_slot >= 0) into.slots.push_back(child.state_slot);
  child.pages.clear();
  child.state_slot = -1;
  if (child.held) --held_;
  child.held = false;
  child.published = {};
}

std::optional<CacheReserve> CacheManager::reserve(int64_t pages, int32_t slots) {
  if (!slots_) slots = 0;
  // What only the prefix cache holds counts as free: its snapshots and blocks are evicted for the reserve.
  const int64_t spare_slots = slots_ ? slots_->free() + (prefix_ ? prefix_->evictable_snapshots() : 0) : 0;
  if (slots > spare_slots || !take_pages(pages)) return std::nullopt;
  while (slots_ && slots_->free() < slots)
    if (!prefix_->evict_snapshot()) return std::nullopt;  // (only evictions happened)
  CacheReserve r;
  pages_.acquire(pages, r.pages);
  for (int32_t i = 0; i < slots; ++i) r.slots.push_back(slots_->acquire());
  contents_.fence_host_copies();
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

int64_t CacheManager::next_snapshot(int64_t begin, int64_t prompt_tokens) const {
  if (!prefix_ || !slots_) return std::numeric_limits<int64_t>::max();
  return options_.snapshots.next_keep(begin, prompt_tokens);
}

SnapshotUse CacheManager::snapshot_use(int64_t position, int64_t prompt_tokens) const {
  return prefix_ && slots_ ? options_.snapshots.at(position, prompt_tokens) : SnapshotUse::None;
}

std::pair<int64_t, int32_t> CacheManager::reclaimable() const {
  const int64_t pages = pages_.free() + (prefix_ ? prefix_->evictable_blocks() : 0);
  const int32_t slots = slots_ ? slots_->free() + int32_t(prefix_ ? prefix_->evictable_snapshots() : 0) : 0;
  return {pages, slots};
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
  if (prefix_) {
    const PrefixCacheStats p = prefix_->stats();
    s.cached_blocks = p.blocks;
    s.cached_snapshots = p.snapshots;
    s.snapshots += int32_t(p.snapshots);
    s.evicted_blocks = p.evicted_blocks;
    s.evicted_snapshots = p.evicted_snapshots;
    s.host_blocks = p.host_blocks;
    s.host_snapshots = p.host_snapshots;
    s.host_pages = p.host_pages;
    s.host_slots = p.host_slots;
    s.host_stored_blocks = p.stored_blocks;
    s.host_stored_snapshots = p.stored_snapshots;
    s.host_evicted_blocks = p.host_evicted_blocks;
    s.host_evicted_snapshots = p.host_evicted_snapshots;
    s.host_restored_blocks = p.host_restored_blocks;
    s.host_restored_snapshots = p.host_restored_snapshots;
  }
  s.lookups = lookups_;
  s.hits = hits_;
  s.cached_tokens = cached_tokens_;
  s.restores = restores_;
  return s;
}

}  // namespace ninfer
