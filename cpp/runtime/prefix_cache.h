// Exact-prefix reuse: an index of content-addressed 64-token blocks (one KV page each) and the Gated DeltaNet
// state snapshots taken at some block boundaries.
//
// A block is named by a hash chain: hash(block i) = mix(hash(block i - 1), salt i, its 64 token ids), starting from
// a model key (the artifact's identity and the KV dtype), so one hash names the whole prefix up to the block's end.
// A lookup walks the prompt's blocks and compares each hit exactly (parent, salt and tokens), so a hash collision
// is a miss, never a wrong reuse. The salt is the extension point for what tokens alone do not name: media (an
// image's placeholder tokens are the same for every image), which gives each block the hash of the media whose
// embeddings fill its positions; text blocks have salt 0.
//
// The index holds one reference on each block's page (PageTable), so a page outlives the request that computed it;
// a running request holds its own references. Because a request's published blocks always continue the chain it
// matched, a block whose page only the index holds has no descendant any request holds: such blocks are exactly
// the evictable ones, evicted leaf first, least recently used first. Snapshots are single-owner state slots, never
// held by a request (admission copies one into the request's slot), so any of them can be evicted, LRU.
//
// KV can be reused up to any block boundary; a model with linear attention only up to a boundary with a snapshot
// (the recurrent state cannot be rolled back), hence the snapshot policy (SnapshotPolicy) and its chunk ends.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/kv_dtype.h"
#include "cache/page_table.h"

namespace ninfer {

// The root of every hash chain: the model's identity (e.g. the artifact's manifest, which holds every tensor's
// checksum) and the KV dtype, since the pages hold that dtype's codes.
uint64_t prefix_model_key(std::string_view model_identity, KvDtype dtype);

// Where a sequence's publication stands: its blocks [0, blocks) are in the index (its first `blocks` pages are the
// index's), the last of them at `node` with chain hash `hash`.
struct BlockCursor {
  int32_t node = -1;  // -1: the root (nothing published)
  uint64_t hash = 0;  // the chain hash at `node` (the model key at the root)
  int64_t blocks = 0;
  bool open = true;   // false after a hash collision: the sequence publishes nothing more
  // The frontier snapshot this sequence placed last (at a block boundary of its generated tokens), replaced by the
  // next one: only the latest is worth its slot.
  int32_t frontier_node = -1;
  uint64_t frontier_serial = 0;  // which snapshot (PrefixCache::snapshot_serial), 0: none
};

// Which snapshot, if any, to take once a sequence's first `position` tokens are computed.
enum class SnapshotUse : uint8_t {
  None,
  Keep,      // inside the prompt: its last block boundary, or a multiple of the interval
  Frontier,  // a block boundary of the generated tokens: the conversation's frontier so far
};

// Where snapshots go. Interior ones every `interval` tokens (a multiple of 64) let a branch or an edited message
// reuse the part before it; the prompt's last block boundary is what an identical or extended prompt reuses
// (past reasoning dropped by the chat template: the next turn diverges inside the answer); the frontier is what
// the next turn reuses when it sends the answer back verbatim.
struct SnapshotPolicy {
  int64_t interval = 4096;
  SnapshotUse at(int64_t position, int64_t prompt_tokens) const;
  // The first Keep position after `begin` (a prefill chunk ends there, so the state is at hand), or int64 max.
  int64_t next_keep(int64_t begin, int64_t prompt_tokens) const;
};

struct PrefixCacheStats {
  int64_t blocks = 0, snapshots = 0;  // in the index now
  int64_t evicted_blocks = 0, evicted_snapshots = 0;
};

class PrefixCache {
 public:
  // `slots` is null for models without linear attention: every block boundary is then reusable.
  PrefixCache(PageTable& pages, SlotTable* slots, uint64_t model_key);

  BlockCursor root() const;

  struct Match {
    std::vector<int32_t> path;  // matched blocks' nodes, from the first block
    int64_t blocks = 0;         // reusable: path[0, blocks) (the deepest with a snapshot, for models with state)
    int32_t snapshot = -1;      // its state slot (-1: none, or no state)
    std::vector<int32_t> pages;  // the reusable blocks' pages
    BlockCursor cursor;          // at the deepest reusable block (the root when none is)
  };
  // The longest reusable prefix of `tokens` that ends at or before `limit` tokens (the caller passes n - 1: a
  // prompt's last token is always computed, its logits are needed). `salts[i]` salts block i (0 beyond the span).
  Match match(std::span<const int32_t> tokens, std::span<const uint64_t> salts, int64_t limit) const;
  void touch(std::span<const int32_t> nodes);  // they were used now (LRU)

  // Publishes the block after `cursor` (its tokens, salt and the page holding its KV) and advances the cursor.
  // Returns the page the index keeps for it: `page` itself, or the page of the same block published earlier (the
  // caller then holds that one instead of its own copy). A closed cursor, or a collision, publishes nothing and
  // returns `page`.
  int32_t publish(BlockCursor& cursor, std::span<const int32_t> block, uint64_t salt, int32_t page);
  // The cursor of the ancestor `blocks` blocks deep along `cursor`'s chain (blocks <= cursor.blocks).
  BlockCursor ancestor(const BlockCursor& cursor, int64_t blocks) const;

  int32_t snapshot_of(int32_t node) const { return nodes_.at(size_t(node)).snapshot; }
  // Names the snapshot a node holds now, unlike its slot, which a later snapshot may reuse; 0 when it has none.
  uint64_t snapshot_serial(int32_t node) const { return nodes_.at(size_t(node)).snapshot_serial; }
  // The node has none; the slot becomes the index's. Returns its serial.
  uint64_t attach_snapshot(int32_t node, int32_t slot);
  void drop_snapshot(int32_t node);                   // frees its slot
  // Frees the least recently used snapshot other than `keep_node`'s; false when there is none.
  bool evict_snapshot(int32_t keep_node = -1);
  // Frees the least recently used block whose page only the index holds (a leaf); false when there is none.
  bool evict_block();
  int64_t evictable_blocks() const;  // blocks whose page only the index holds (all evictable, leaves first)
  int64_t snapshots() const { return int64_t(snapshot_lru_.size()); }
  PrefixCacheStats stats() const;

 private:
  struct Node {
    uint64_t hash = 0, salt = 0, used = 0, snapshot_serial = 0;
    int32_t parent = -1, children = 0, page = -1, snapshot = -1;
    std::array<int32_t, kKvPageTokens> tokens{};
    bool live = false;
  };
  bool same_block(const Node& n, int32_t parent, uint64_t salt, std::span<const int32_t> block) const;
  int32_t new_node();
  void remove(int32_t id);
  void set_used(int32_t id, uint64_t tick);

  PageTable& pages_;
  SlotTable* slots_;
  uint64_t model_key_;
  std::vector<Node> nodes_;
  std::vector<int32_t> free_nodes_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::set<std::pair<uint64_t, int32_t>> leaves_;        // (last use, node) of blocks without children
  std::set<std::pair<uint64_t, int32_t>> snapshot_lru_;  // (last use, node) of blocks with a snapshot
  uint64_t clock_ = 0, serials_ = 0;
  int64_t blocks_ = 0, evicted_blocks_ = 0, evicted_snapshots_ = 0;
};

}  // namespace ninfer
