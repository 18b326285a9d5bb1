#include "runtime/prefix_cache.h"

#include <algorithm>
#include <string>

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

PrefixCache::PrefixCache(PageTable& pages, SlotTable* slots, uint64_t model_key)
    : pages_(pages), slots_(slots), model_key_(model_key) {}

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
    if (const int32_t s = nodes_[size_t(m.path[size_t(d - 1)])].snapshot; s >= 0) {
      m.blocks = d;
      m.snapshot = s;
      break;
    }
  for (int64_t d = 0; d < m.blocks; ++d) m.pages.push_back(nodes_[size_t(m.path[size_t(d)])].page);
  if (m.blocks > 0) {
    m.cursor.node = m.path[size_t(m.blocks - 1)];
    m.cursor.hash = nodes_[size_t(m.cursor.node)].hash;
    m.cursor.blocks = m.blocks;
  }
  return m;
}

void PrefixCache::set_used(int32_t id, uint64_t tick) {
  Node& n = nodes_[size_t(id)];
  if (n.children == 0) {
    leaves_.erase({n.used, id});
    leaves_.insert({tick, id});
  }
  if (n.snapshot >= 0) {
    snapshot_lru_.erase({n.used, id});
    snapshot_lru_.insert({tick, id});
  }
  n.used = tick;
}

// One tick per node, root first: a chain's deeper blocks are the more recent, so LRU order is total.
void PrefixCache::touch(std::span<const int32_t> nodes) {
  for (int32_t id : nodes) set_used(id, ++clock_);
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
    kept = nodes_[size_t(id)].page;
  } else {
    id = new_node();
    Node& n = nodes_[size_t(id)];
    n = Node{};
    n.hash = hash;
    n.salt = salt;
    n.parent = cursor.node;
    n.page = page;
    n.live = true;
    std::copy(block.begin(), block.end(), n.tokens.begin());
    pages_.retain(page);
    by_hash_.emplace(hash, id);
    if (n.parent >= 0) {
      Node& p = nodes_[size_t(n.parent)];
      if (p.children++ == 0) leaves_.erase({p.used, n.parent});
    }
    leaves_.insert({0, id});  // set_used below moves it to now
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

uint64_t PrefixCache::attach_snapshot(int32_t node, int32_t slot) {
  Node& n = nodes_.at(size_t(node));
  if (n.snapshot >= 0) throw EngineError("block " + std::to_string(node) + " already has a state snapshot");
  n.snapshot = slot;
  n.snapshot_serial = ++serials_;
  snapshot_lru_.insert({n.used, node});
  return n.snapshot_serial;
}

void PrefixCache::drop_snapshot(int32_t node) {
  Node& n = nodes_.at(size_t(node));
  if (n.snapshot < 0) return;
  snapshot_lru_.erase({n.used, node});
  slots_->release(n.snapshot);
  n.snapshot = -1;
  n.snapshot_serial = 0;
}

bool PrefixCache::evict_snapshot(int32_t keep_node) {
  for (const auto& [used, id] : snapshot_lru_) {
    if (id == keep_node) continue;
    drop_snapshot(id);
    ++evicted_snapshots_;
    return true;
  }
  return false;
}

bool PrefixCache::evict_block() {
  for (const auto& [used, id] : leaves_) {
    if (pages_.refcount(nodes_[size_t(id)].page) != 1) continue;  // a running sequence reads it
    if (nodes_[size_t(id)].snapshot >= 0) ++evicted_snapshots_;
    remove(id);
    ++evicted_blocks_;
    return true;
  }
  return false;
}

void PrefixCache::remove(int32_t id) {
  Node& n = nodes_[size_t(id)];
  drop_snapshot(id);
  leaves_.erase({n.used, id});
  by_hash_.erase(n.hash);
  const int32_t page = n.page;
  pages_.release(std::span<const int32_t>(&page, 1));
  if (n.parent >= 0) {
    Node& p = nodes_[size_t(n.parent)];
    if (--p.children == 0) leaves_.insert({p.used, n.parent});
  }
  n.live = false;
  free_nodes_.push_back(id);
  --blocks_;
}

int64_t PrefixCache::evictable_blocks() const {
  int64_t n = 0;
  for (const Node& node : nodes_)
    if (node.live && pages_.refcount(node.page) == 1) ++n;
  return n;
}

PrefixCacheStats PrefixCache::stats() const {
  return {blocks_, snapshots(), evicted_blocks_, evicted_snapshots_};
}

}  // namespace ninfer
