#include "runtime/prefix_cache.h"

#include <algorithm>
#include <string>

#include "cache/cache_pools.h"
#include "errors.h"
#include "runtime/content_hash.h"

namespace ninfer {
namespace {

uint64_t block_hash(uint64_t parent, uint64_t salt, std::span<const int32_t> block) {
  uint64_t h = hash_mix(parent + 0x9e3779b97f4a7c15ULL);
  h = hash_mix(h ^ salt);
  for (int32_t t : block) h = hash_mix(h + uint32_t(t));
  return h;
}

}  // namespace

uint64_t prefix_model_key(std::string_view model_identity, KvDtype dtype) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the bytes, then mixed with the dtype
  for (unsigned char c : model_identity) h = (h ^ c) * 0x100000001b3ULL;
  return hash_mix(h ^ (uint64_t(dtype) + 1));
}

SnapshotUse SnapshotPolicy::at(int64_t position, int64_t prompt_tokens) const {
  if (position <= 0 || position % kKvPageTokens) return SnapshotUse::None;
  if (position > prompt_tokens) return SnapshotUse::Frontier;
  if (position == prompt_tokens / kKvPageTokens * kKvPageTokens) return SnapshotUse::Keep;
  return interval > 0 && position % interval == 0 ? SnapshotUse::Keep : SnapshotUse::None;
}

int64_t SnapshotPolicy::next_keep(int64_t begin, int64_t prompt_tokens) const {
  const int64_t last = prompt_tokens / kKvPageTokens * kKvPageTokens;
  if (last <= begin) return std::numeric_limits<int64_t>::max();
  return interval > 0 ? std::min(last, (begin / interval + 1) * interval) : last;
}

PrefixCache::PrefixCache(PageTable& pages, SlotTable* slots, uint64_t model_key, CacheContents* contents,
                         const HostTierTables& host)
    : pages_(&pages), slots_(slots), model_key_(model_key), contents_(contents), host_(host) {}

BlockCursor PrefixCache::root() const {
  BlockCursor c;
  c.hash = model_key_;
  return c;
}

bool PrefixCache::same_block(const Node& n, int32_t parent, uint64_t salt, std::span<const int32_t> block) const {
  return n.parent == parent && n.salt == salt && std::equal(block.begin(), block.end(), n.tokens.begin());
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> tokens, std::span<const uint64_t> salts,
                                      int64_t limit) const {
  Match m;
  m.cursor = root();
  const int64_t full = std::min<int64_t>(int64_t(tokens.size()), limit) / kKvPageTokens;
  uint64_t hash = model_key_;
  int32_t parent = -1;
  for (int64_t i = 0; i < full; ++i) {
    const uint64_t salt = size_t(i) < salts.size() ? salts[size_t(i)] : 0;
    const std::span<const int32_t> block = tokens.subspan(size_t(i * kKvPageTokens), size_t(kKvPageTokens));
    hash = block_hash(hash, salt, block);
    const auto it = by_hash_.find(hash);
    if (it == by_hash_.end() || !same_block(nodes_[size_t(it->second)], parent, salt, block)) break;
    parent = it->second;
    m.path.push_back(parent);
  }
  if (!slots_) m.blocks = int64_t(m.path.size());
  for (int64_t d = int64_t(m.path.size()); slots_ && d > 0; --d)
    if (const Node& n = nodes_[size_t(m.path[size_t(d - 1)])]; n.snapshot >= 0 || n.host_snapshot >= 0) {
      m.blocks = d;
      m.snapshot = n.snapshot;
      m.host_snapshot = n.host_snapshot;
      break;
    }
  for (int64_t d = 0; d < m.blocks; ++d) {
    const int32_t page = nodes_[size_t(m.path[size_t(d)])].page;
    m.pages.push_back(page);
    m.host_blocks += page < 0;
  }
  if (m.blocks > 0) {
    m.cursor.node = m.path[size_t(m.blocks - 1)];
    m.cursor.hash = nodes_[size_t(m.cursor.node)].hash;
    m.cursor.blocks = m.blocks;
  }
  return m;
}

void PrefixCache::pin(const Match& m, int32_t delta) {
  for (int64_t d = 0; d < m.blocks; ++d) {
    const int32_t id = m.path[size_t(d)];
    unindex(id);
    nodes_[size_t(id)].pins += delta;
    index(id);
  }
}

// The device pages were freed just before (CacheManager::take_pages evicts them, queuing their stores to the host),
// and the free pages are a stack, so the page freed first comes last: the blocks take them from the back, and the
// first load goes to the page whose store was queued first. Each load waits only for the store of its own page
// (backend/cuda/device_memory.h), so the loads overlap the stores still running instead of waiting for all of them.
void PrefixCache::restore(Match& m) {
  std::vector<int32_t> pages;
  if (!pages_->acquire(m.host_blocks, pages)) throw EngineError("restoring host blocks without free device pages");
  for (int64_t d = 0; d < m.blocks; ++d) {
    if (m.pages[size_t(d)] >= 0) continue;
    const int32_t id = m.path[size_t(d)];
    Node& n = nodes_[size_t(id)];
    if (pages.empty()) throw EngineError("a match with more host blocks than it counted");
    const int32_t page = pages.back();
    pages.pop_back();
    contents_->load_page(n.host_page, page);
    to_device(id, page);  // (its parent is on the device by now: restored in order)
    m.pages[size_t(d)] = page;
    ++counters_.host_restored_blocks;
  }
  m.host_blocks = 0;
  if (m.host_snapshot >= 0) ++counters_.host_restored_snapshots;
}

// A host block's KV is in device page `page` now (one reference, the index's): its host page is free again.
void PrefixCache::to_device(int32_t id, int32_t page) {
  Node& n = nodes_[size_t(id)];
  if (n.parent >= 0) {
    unindex(n.parent);
    ++nodes_[size_t(n.parent)].device_children;
    index(n.parent);
  }
  unindex(id);
  host_.pages->release(n.host_page);
  n.host_page = -1;
  n.page = page;
  --host_blocks_;
  ++blocks_;
  index(id);
}

void PrefixCache::set_used(int32_t id, uint64_t tick) {
  unindex(id);
  nodes_[size_t(id)].used = tick;
  index(id);
}

// One tick per node, root first: a chain's deeper blocks are the more recent, so LRU order is total. Each is one
// more reuse (GDSF's frequency, read when the block or its snapshot moves to the host).
void PrefixCache::touch(std::span<const int32_t> nodes) {
  for (int32_t id : nodes) {
    ++nodes_[size_t(id)].hits;
    set_used(id, ++clock_);
  }
  if (nodes.empty()) return;
  // The snapshot the reuse started from: a host one is worth more now (its priority rises with its frequency).
  const int32_t last = nodes.back();
  Node& n = nodes_[size_t(last)];
  ++n.snapshot_hits;
  if (n.host_snapshot >= 0) {
    unindex(last);
    n.snapshot_priority = host_snapshot_clock_ + double(1 + n.snapshot_hits) * double(n.depth * kKvPageTokens) /
                                                     double(std::max<int64_t>(1, host_.state_bytes));
    index(last);
  }
}

void PrefixCache::unindex(int32_t id) {
  const Node& n = nodes_[size_t(id)];
  device_leaves_.erase({n.used, id});
  snapshot_lru_.erase({n.used, id});
  host_leaves_.erase({n.priority, n.used, id});
  host_snapshots_.erase({n.snapshot_priority, n.used, id});
}

// Pinned nodes are in no eviction set.
void PrefixCache::index(int32_t id) {
  const Node& n = nodes_[size_t(id)];
  if (!n.live || n.pins > 0) return;
  if (n.page >= 0 && n.device_children == 0) device_leaves_.insert({n.used, id});
  if (n.snapshot >= 0) snapshot_lru_.insert({n.used, id});
  if (n.host_page >= 0 && n.children == 0) host_leaves_.insert({n.priority, n.used, id});
  if (n.host_snapshot >= 0) host_snapshots_.insert({n.snapshot_priority, n.used, id});
}

int32_t PrefixCache::new_node() {
  if (free_nodes_.empty()) {
    nodes_.emplace_back();
    return int32_t(nodes_.size() - 1);
  }
  const int32_t id = free_nodes_.back();
  free_nodes_.pop_back();
  return id;
}

int32_t PrefixCache::publish(BlockCursor& cursor, std::span<const int32_t> block, uint64_t salt, int32_t page) {
  if (!cursor.open) return page;
  if (int64_t(block.size()) != kKvPageTokens) throw EngineError("publishing a partial KV block");
  const uint64_t hash = block_hash(cursor.hash, salt, block);
  int32_t id = -1, kept = page;
  if (const auto it = by_hash_.find(hash); it != by_hash_.end()) {
    if (!same_block(nodes_[size_t(it->second)], cursor.node, salt, block)) {
      cursor.open = false;  // another prefix has this hash: this one stays unpublished
      return page;
    }
    id = it->second;
    Node& n = nodes_[size_t(id)];
    if (n.page < 0) {  // on the host: the sequence's own device copy takes its place
      pages_->retain(page);
      to_device(id, page);
    }
    kept = n.page;
  } else {
    id = new_node();
    Node& n = nodes_[size_t(id)];
    n = Node{};
    n.hash = hash;
    n.salt = salt;
    n.parent = cursor.node;
    n.page = page;
    n.depth = int32_t(cursor.blocks + 1);
    std::copy(block.begin(), block.end(), n.tokens.begin());
    pages_->retain(page);
    by_hash_.emplace(hash, id);
    if (n.parent >= 0) {
      unindex(n.parent);
      Node& p = nodes_[size_t(n.parent)];
      ++p.children;
      ++p.device_children;
      index(n.parent);
    }
    n.live = true;
    index(id);
    ++blocks_;
  }
  set_used(id, ++clock_);
  cursor.node = id;
  cursor.hash = hash;
  ++cursor.blocks;
  return kept;
}

BlockCursor PrefixCache::ancestor(const BlockCursor& cursor, int64_t blocks) const {
  if (blocks > cursor.blocks) throw EngineError("a prefix cursor has no ancestor below itself");
  BlockCursor c = root();
  c.open = cursor.open;
  int32_t node = cursor.node;
  for (int64_t up = cursor.blocks; up > blocks; --up) node = nodes_[size_t(node)].parent;
  if (node >= 0) {
    c.node = node;
    c.hash = nodes_[size_t(node)].hash;
    c.blocks = blocks;
  }
  return c;
}

bool PrefixCache::has_snapshot(int32_t node) const {
  const Node& n = nodes_.at(size_t(node));
  return n.snapshot >= 0 || n.host_snapshot >= 0;
}

uint64_t PrefixCache::attach_snapshot(int32_t node, int32_t slot) {
  if (has_snapshot(node)) throw EngineError("block " + std::to_string(node) + " already has a state snapshot");
  unindex(node);
  Node& n = nodes_.at(size_t(node));
  n.snapshot = slot;
  n.snapshot_serial = ++serials_;
  n.snapshot_hits = 0;
  ++snapshots_;
  index(node);
  return n.snapshot_serial;
}

void PrefixCache::drop_snapshot(int32_t node) {
  Node& n = nodes_.at(size_t(node));
  if (n.snapshot < 0 && n.host_snapshot < 0) return;
  unindex(node);
  if (n.snapshot >= 0) {
    slots_->release(n.snapshot);
    --snapshots_;
  }
  if (n.host_snapshot >= 0) {
    host_.slots->release(n.host_snapshot);
    --host_snapshots_count_;
  }
  n.snapshot = n.host_snapshot = -1;
  n.snapshot_serial = 0;
  index(node);
}

int32_t PrefixCache::host_page() {
  if (!host_.pages || host_.pages->total() == 0) return -1;
  if (host_.pages->free() == 0) {
    if (host_leaves_.empty()) return -1;
    const auto [priority, used, id] = *host_leaves_.begin();
    host_clock_ = priority;
    if (nodes_[size_t(id)].snapshot >= 0) ++counters_.evicted_snapshots;
    if (nodes_[size_t(id)].host_snapshot >= 0) ++counters_.host_evicted_snapshots;
    remove(id);
    ++counters_.host_evicted_blocks;
  }
  return host_.pages->acquire();
}

int32_t PrefixCache::host_slot() {
  if (!host_.slots || host_.slots->total() == 0) return -1;
  if (host_.slots->free() == 0) {
    if (host_snapshots_.empty()) return -1;
    const auto [priority, used, id] = *host_snapshots_.begin();
    host_snapshot_clock_ = priority;
    drop_snapshot(id);
    ++counters_.host_evicted_snapshots;
  }
  return host_.slots->acquire();
}

void PrefixCache::demote_block(int32_t id) {
  const int32_t to = host_page();
  Node& n = nodes_[size_t(id)];
  if (to < 0) {
    if (n.children > 0) throw EngineError("a device block with host children and no host page for it");
    if (n.snapshot >= 0 || n.host_snapshot >= 0) ++counters_.evicted_snapshots;
    remove(id);
    ++counters_.evicted_blocks;
    return;
  }
  contents_->store_page(n.page, to);
  if (n.parent >= 0) {
    unindex(n.parent);
    --nodes_[size_t(n.parent)].device_children;
    index(n.parent);
  }
  unindex(id);
  const int32_t page = n.page;
  pages_->release(std::span<const int32_t>(&page, 1));
  n.page = -1;
  n.host_page = to;
  n.priority = host_clock_ + double(1 + n.hits) * double(kKvPageTokens) / double(std::max<int64_t>(1, host_.page_bytes));
  --blocks_;
  ++host_blocks_;
  index(id);
  ++counters_.evicted_blocks;
  ++counters_.stored_blocks;
}

void PrefixCache::demote_snapshot(int32_t id) {
  const int32_t to = host_slot();
  Node& n = nodes_[size_t(id)];
  ++counters_.evicted_snapshots;
  if (to < 0) {
    drop_snapshot(id);
    return;
  }
  contents_->store_state(n.snapshot, to);
  unindex(id);
  slots_->release(n.snapshot);
  n.snapshot = -1;
  n.host_snapshot = to;
  --snapshots_;
  ++host_snapshots_count_;
  n.snapshot_priority = host_snapshot_clock_ + double(1 + n.snapshot_hits) * double(n.depth * kKvPageTokens) /
                                                   double(std::max<int64_t>(1, host_.state_bytes));
  index(id);
  ++counters_.stored_snapshots;
}

bool PrefixCache::evict_snapshot() {
  if (snapshot_lru_.empty()) return false;
  demote_snapshot(snapshot_lru_.begin()->second);
  return true;
}

bool PrefixCache::evict_block() {
  for (const auto& [used, id] : device_leaves_) {
    if (pages_->refcount(nodes_[size_t(id)].page) != 1) continue;  // a running sequence reads it
    demote_block(id);
    return true;
  }
  return false;
}

void PrefixCache::remove(int32_t id) {
  Node& n = nodes_[size_t(id)];
  if (n.children > 0) throw EngineError("removing a prefix block that has children");
  drop_snapshot(id);
  unindex(id);
  by_hash_.erase(n.hash);
  if (n.page >= 0) {
    const int32_t page = n.page;
    pages_->release(std::span<const int32_t>(&page, 1));
    --blocks_;
  }
  if (n.host_page >= 0) {
    host_.pages->release(n.host_page);
    --host_blocks_;
  }
  if (n.parent >= 0) {
    unindex(n.parent);
    Node& p = nodes_[size_t(n.parent)];
    --p.children;
    if (n.page >= 0) --p.device_children;
    index(n.parent);
  }
  n.live = false;
  free_nodes_.push_back(id);
}

int64_t PrefixCache::evictable_blocks() const {
  int64_t n = 0;
  for (const Node& node : nodes_)
    if (node.live && node.page >= 0 && pages_->refcount(node.page) == 1) ++n;
  return n;
}

int64_t PrefixCache::evictable_snapshots() const { return int64_t(snapshot_lru_.size()); }

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = counters_;
  s.blocks = blocks_;
  s.snapshots = snapshots();
  s.host_blocks = host_blocks_;
  s.host_snapshots = host_snapshots_count_;
  s.host_pages = host_.pages ? host_.pages->total() : 0;
  s.host_slots = host_.slots ? host_.slots->total() : 0;
  return s;
}

// Device leaves first, least recently used first (as eviction would take them), so the freshest conversations
// enter the host tier last: GDSF's rising clock gives them the higher priorities.
void PrefixCache::detach() {
  while (!device_leaves_.empty()) demote_block(device_leaves_.begin()->second);
  while (!snapshot_lru_.empty()) demote_snapshot(snapshot_lru_.begin()->second);
  for (const Node& n : nodes_)
    if (n.live && (n.page >= 0 || n.snapshot >= 0 || n.pins > 0))
      throw EngineError("detaching a prefix cache that a running sequence still uses");
  if (contents_) contents_->wait_host_copies();
  pages_ = nullptr;
  slots_ = nullptr;
  contents_ = nullptr;
}

void PrefixCache::attach(PageTable& pages, SlotTable* slots, CacheContents* contents, const HostTierTables& host) {
  pages_ = &pages;
  slots_ = slots;
  contents_ = contents;
  host_ = host;
  counters_ = {};  // the counts are the engine's (from zero, like its other counters); the contents stay
}

}  // namespace ninfer
