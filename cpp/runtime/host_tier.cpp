#include "runtime/host_tier.h"

#include "errors.h"

namespace ninfer {

HostTierTables HostTier::tables() {
  HostTierTables t;
  t.pages = pages_.get();
  t.slots = slots_.get();
  t.page_bytes = int64_t(page_bytes_);
  t.state_bytes = int64_t(state_bytes_);
  return t;
}

void HostTier::reset(uint64_t model_key, size_t page_bytes, size_t state_bytes) {
  parked_.reset();
  storage_.reset();
  model_key_ = model_key;
  page_bytes_ = page_bytes;
  state_bytes_ = state_bytes;
  const int64_t pages = page_bytes ? kv_bytes_ / int64_t(page_bytes) : 0;
  const int32_t slots = state_bytes ? state_slots_ : 0;
  pages_ = std::make_unique<SlotTable>(int32_t(pages));
  slots_ = std::make_unique<SlotTable>(slots);
  sized_ = true;
}

std::unique_ptr<PrefixCache> HostTier::attach(uint64_t model_key, size_t page_bytes, size_t state_bytes,
                                              MemoryResource* memory, PageTable& pages, SlotTable* slots,
                                              CacheContents& contents) {
  std::unique_lock lock(mu_);
  if (attached_) throw EngineError("the host tier is in use by another engine");
  if (!sized_ || model_key != model_key_ || page_bytes != page_bytes_ || state_bytes != state_bytes_)
    reset(model_key, page_bytes, state_bytes);
  if (memory && !storage_)
    storage_ = std::make_unique<HostPool>(pages_->total(), page_bytes_, slots_->total(), state_bytes_, *memory);
  attached_ = true;
  if (parked_) {
    std::unique_ptr<PrefixCache> index = std::move(parked_);
    index->attach(pages, slots, &contents, tables());
    return index;
  }
  return std::make_unique<PrefixCache>(pages, slots, model_key, &contents, tables());
}

void HostTier::park(std::unique_ptr<PrefixCache> index) {
  std::unique_lock lock(mu_);
  parked_ = std::move(index);
  attached_ = false;
}

HostTierStats HostTier::stats() const {
  std::unique_lock lock(mu_);
  HostTierStats s;
  if (!sized_) return s;
  s.pages = pages_->total();
  s.used_pages = pages_->total() - pages_->free();
  s.page_bytes = int64_t(page_bytes_);
  s.slots = slots_->total();
  s.used_slots = slots_->total() - slots_->free();
  s.slot_bytes = int64_t(state_bytes_);
  s.bytes = storage_ ? int64_t(storage_->bytes()) : 0;
  s.parked = bool(parked_);
  return s;
}

}  // namespace ninfer
