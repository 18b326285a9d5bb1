#include "cache/page_table.h"

#include <string>

#include "errors.h"

namespace ninfer {

PageTable::PageTable(int64_t pages) : refs_(size_t(pages), 0) {
  free_.reserve(size_t(pages));
  for (int64_t p = pages - 1; p >= 0; --p) free_.push_back(int32_t(p));
}

bool PageTable::acquire(int64_t n, std::vector<int32_t>& out) {
  if (n > free()) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    refs_[size_t(p)] = 1;
    out.push_back(p);
  }
  return true;
}

// Misuse here would silently corrupt another sequence's KV later, so it throws instead.
void PageTable::retain(int32_t page) {
  if (refs_.at(size_t(page)) <= 0) throw EngineError("retaining free KV page " + std::to_string(page));
  if (++refs_[size_t(page)] == 2) ++shared_;
}

void PageTable::release(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    if (refs_.at(size_t(p)) <= 0) throw EngineError("releasing free KV page " + std::to_string(p));
    const int32_t left = --refs_[size_t(p)];
    if (left == 1) --shared_;
    if (left == 0) free_.push_back(p);
  }
}

SlotTable::SlotTable(int32_t slots) : used_(size_t(slots), false) {
  for (int32_t s = slots - 1; s >= 0; --s) free_.push_back(s);
}

int32_t SlotTable::acquire() {
  if (free_.empty()) return -1;
  const int32_t s = free_.back();
  free_.pop_back();
  used_[size_t(s)] = true;
  return s;
}

void SlotTable::release(int32_t slot) {
  if (slot < 0) return;
  if (!used_.at(size_t(slot))) throw EngineError("releasing free state slot " + std::to_string(slot));
  used_[size_t(slot)] = false;
  free_.push_back(slot);
}

}  // namespace ninfer
