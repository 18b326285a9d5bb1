// Which KV pages and state slots are in use, without their memory: the bookkeeping half of the pools. The cache
// manager works on these alone (with CacheContents for the copies), so it runs over simulated pools in tests with
// the real pools' exact ids and order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ninfer {

// Reference-counted pages: a page is free when no sequence (and no prefix-tree node) holds it.
class PageTable {
 public:
  explicit PageTable(int64_t pages);

  int64_t total() const { return int64_t(refs_.size()); }
  int64_t free() const { return int64_t(free_.size()); }
  int64_t shared() const { return shared_; }  // pages with more than one holder
  int32_t refcount(int32_t page) const { return refs_.at(size_t(page)); }

  // Takes `n` pages with one holder each (appended to `out`), or none when fewer are free; returns whether it did.
  bool acquire(int64_t n, std::vector<int32_t>& out);
  void retain(int32_t page);  // one more holder of a page in use
  void release(std::span<const int32_t> pages);  // one holder fewer each; a page without holders is free again

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack: the most recently freed page is reused first
  int64_t shared_ = 0;
};

// Single-owner slots (Gated DeltaNet states: a lane's working state or a snapshot).
class SlotTable {
 public:
  explicit SlotTable(int32_t slots);

  int32_t total() const { return int32_t(used_.size()); }
  int32_t free() const { return int32_t(free_.size()); }
  bool in_use(int32_t slot) const { return used_.at(size_t(slot)); }

  int32_t acquire();  // a free slot, or -1 when none is
  void release(int32_t slot);

 private:
  std::vector<bool> used_;
  std::vector<int32_t> free_;  // a stack, lowest slot on top at first
};

}  // namespace ninfer
