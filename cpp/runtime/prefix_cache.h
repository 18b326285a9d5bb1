// Exact-prefix reuse: an index of content-addressed 64-token blocks (one KV page each) and the Gated DeltaNet
// state snapshots taken at some block boundaries, in two tiers: the device (the pools the passes read) and, when the
// engine has one, the host tier (runtime/host_tier.h: pinned host memory that outlives the engine).
//
// A block is named by a hash chain: hash(block i) = mix(hash(block i - 1), salt i, its 64 token ids), starting from
// a model key (the artifact's identity and the KV dtype), so one hash names the whole prefix up to the block's end.
// A lookup walks the prompt's blocks and compares each hit exactly (parent, salt and tokens), so a hash collision
// is a miss, never a wrong reuse. The salt is the extension point for what tokens alone do not name: media (an
// image's placeholder tokens are the same for every image), which gives each block the hash of the media whose
// embeddings fill its positions; text blocks have salt 0.
//
// The index holds one reference on each device block's page (PageTable), so a page outlives the request that
// computed it; a running request holds its own references. Because a request's published blocks always continue
// the chain it matched, a block whose page only the index holds has no descendant any request holds: such blocks
// are exactly the evictable ones, evicted leaf first (a device leaf: no child on the device), least recently used
// first. Snapshots are single-owner state slots, never held by a request (admission copies one into the request's
// slot), so any of them can be evicted, LRU.
//
// Tiers are exclusive: a block's KV is on the device or on the host, a snapshot in a device slot or a host slot.
// With a host tier, what the device evicts moves there (a copy) instead of being forgotten, and admission moves the
// host blocks of the prefix it reuses back to device pages (a copy; a host snapshot is copied into the request's
// slot and stays). A device block's parent is always on the device (eviction takes device leaves, admission
// restores whole prefixes), so the device blocks are the top of the tree and the host blocks hang below them. The
// host tier evicts by GreedyDual-Size-Frequency: an entry's priority is clock + frequency * cost / size, where
// frequency is 1 + the admissions that reused it, cost the prefill tokens it saves (64 for a block, its position
// for a snapshot), size its bytes; the lowest priority goes first and the clock rises to it, so entries not
// reused for a while age out. Blocks leave the host leaf first (a host block's children are all on the host), so
// the tree never loses an inner block. Entries of a prefix an admission is restoring are pinned meanwhile.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
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
  int64_t blocks = 0, snapshots = 0;  // on the device now
  int64_t evicted_blocks = 0, evicted_snapshots = 0;  // that left the device (to the host tier or forgotten)
  // The host tier (all 0 without one): what it holds now and its room, what moved in, what it forgot, and what
  // admissions restored from it.
  int64_t host_blocks = 0, host_snapshots = 0, host_pages = 0, host_slots = 0;
  int64_t stored_blocks = 0, stored_snapshots = 0;
  int64_t host_evicted_blocks = 0, host_evicted_snapshots = 0;
  int64_t host_restored_blocks = 0, host_restored_snapshots = 0;
};

class CacheContents;

// The host tier's bookkeeping as the index sees it: its page and slot tables and the copies to and from it.
struct HostTierTables {
  SlotTable* pages = nullptr;  // one KV page each
  SlotTable* slots = nullptr;  // state snapshots (null or empty for models without linear attention)
  int64_t page_bytes = 0, state_bytes = 0;  // GDSF's sizes
};

class PrefixCache {
 public:
  // `slots` is null for models without linear attention: every block boundary is then reusable. `contents`
  // makes the copies between tiers (needed with a host tier only).
  PrefixCache(PageTable& pages, SlotTable* slots, uint64_t model_key, CacheContents* contents = nullptr,
              const HostTierTables& host = {});

  uint64_t model_key() const { return model_key_; }
  BlockCursor root() const;

  struct Match {
    std::vector<int32_t> path;  // matched blocks' nodes, from the first block
    int64_t blocks = 0;         // reusable: path[0, blocks) (the deepest with a snapshot, for models with state)
    int32_t snapshot = -1;      // its device state slot (-1: none, or no state, or on the host)
    int32_t host_snapshot = -1; // its host state slot when the snapshot is on the host
    std::vector<int32_t> pages;  // the reusable blocks' device pages; -1 for a block on the host (restore() fills)
    int64_t host_blocks = 0;     // how many of them are on the host
    BlockCursor cursor;          // at the deepest reusable block (the root when none is)
  };
  // The longest reusable prefix of `tokens` that ends at or before `limit` tokens (the caller passes n - 1: a
  // prompt's last token is always computed, its logits are needed). `salts[i]` salts block i (0 beyond the span).
  Match match(std::span<const int32_t> tokens, std::span<const uint64_t> salts, int64_t limit) const;
  // While pinned, the match's blocks and snapshot stay where they are (no tier evicts them); unpin after restore.
  void pin(const Match& m, int32_t delta);
  // Moves the match's host blocks into free device pages (the caller made room) and fills their pages in; counts
  // a host snapshot restored (the caller copies it into the sequence's slot).
  void restore(Match& m);
  void touch(std::span<const int32_t> nodes);  // they were used now (LRU, and the reuse frequency)

  // Publishes the block after `cursor` (its tokens, salt and the page holding its KV) and advances the cursor.
  // Returns the page the index keeps for it: `page` itself, or the page of the same block published earlier (the
  // caller then holds that one instead of its own copy). A closed cursor, or a collision, publishes nothing and
  // returns `page`.
  int32_t publish(BlockCursor& cursor, std::span<const int32_t> block, uint64_t salt, int32_t page);
  // The cursor of the ancestor `blocks` blocks deep along `cursor`'s chain (blocks <= cursor.blocks).
  BlockCursor ancestor(const BlockCursor& cursor, int64_t blocks) const;

  bool has_snapshot(int32_t node) const;  // in either tier
  // Names the snapshot a node holds now, unlike its slot, which a later snapshot may reuse; 0 when it has none.
  uint64_t snapshot_serial(int32_t node) const { return nodes_.at(size_t(node)).snapshot_serial; }
  // The node has none; the slot becomes the index's. Returns its serial.
  uint64_t attach_snapshot(int32_t node, int32_t slot);
  void drop_snapshot(int32_t node);                   // frees its slot (either tier)
  // Frees the device slot of the least recently used unpinned device snapshot (moved to the host tier when it
  // has slots); false when there is none.
  bool evict_snapshot();
  // Frees the device page of the least recently used device leaf only the index holds (moved to the host tier
  // when it has pages); false when there is none.
  bool evict_block();
  int64_t evictable_blocks() const;  // device blocks whose page only the index holds (all evictable, leaves first)
  int64_t snapshots() const { return snapshots_; }  // on the device
  int64_t evictable_snapshots() const;  // unpinned, on the device
  PrefixCacheStats stats() const;

  // The engine is closing: moves every device block and snapshot it can to the host tier (GDSF decides what
  // stays when it is full), forgets the rest, and lets go of the device pools, so a later engine of the same model
  // can adopt the index with attach().
  void detach();
  void attach(PageTable& pages, SlotTable* slots, CacheContents* contents, const HostTierTables& host);

 private:
  struct Node {
    uint64_t hash = 0, salt = 0, used = 0, snapshot_serial = 0;
    int32_t parent = -1, children = 0, device_children = 0, page = -1, host_page = -1, snapshot = -1,
            host_snapshot = -1, pins = 0, depth = 0;
    int64_t hits = 0, snapshot_hits = 0;  // admissions that reused the block, that restored its snapshot
    double priority = 0, snapshot_priority = 0;  // GDSF, while on the host
    std::array<int32_t, kKvPageTokens> tokens{};
    bool live = false;
  };
  bool same_block(const Node& n, int32_t parent, uint64_t salt, std::span<const int32_t> block) const;
  int32_t new_node();
  void remove(int32_t id);  // a node without children, from both tiers
  void set_used(int32_t id, uint64_t tick);
  // The ordered sets a node belongs to follow its fields: take it out, change them, put it back.
  void unindex(int32_t id);
  void index(int32_t id);
  int32_t host_page();  // a free host page, evicting the lowest-priority host leaf; -1 when none can be had
  int32_t host_slot();  // the same for snapshots
  void demote_block(int32_t id);
  void to_device(int32_t id, int32_t page);
  void demote_snapshot(int32_t id);

  PageTable* pages_;
  SlotTable* slots_;
  uint64_t model_key_;
  CacheContents* contents_;
  HostTierTables host_;
  std::vector<Node> nodes_;
  std::vector<int32_t> free_nodes_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::set<std::pair<uint64_t, int32_t>> device_leaves_;  // (last use, node): on the device, no device child
  std::set<std::pair<uint64_t, int32_t>> snapshot_lru_;   // (last use, node): a device snapshot
  // GDSF's order: priority, then last use (every node's is its own), so ties go least recently used first.
  using HostOrder = std::set<std::tuple<double, uint64_t, int32_t>>;
  HostOrder host_leaves_;     // (priority, last use, node): on the host, no child
  HostOrder host_snapshots_;  // (priority, last use, node): a host snapshot
  uint64_t clock_ = 0, serials_ = 0;
  double host_clock_ = 0, host_snapshot_clock_ = 0;  // GDSF's clocks: the priority last evicted
  int64_t blocks_ = 0, host_blocks_ = 0, snapshots_ = 0, host_snapshots_count_ = 0;
  PrefixCacheStats counters_;  // the eviction / storage / restore counts
};

}  // namespace ninfer
