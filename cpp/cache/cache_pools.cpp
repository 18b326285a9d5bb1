#include "cache/cache_pools.h"

namespace ninfer {

CachePools::CachePools(const CacheLayout& l, const CacheCapacity& c, KvDtype dtype, MemoryResource& device)
    : device_(device), pages_(c.device_pages), slots_(l.state_layers > 0 ? c.device_state_slots : 0) {
  kv_ = std::make_unique<KvPool>(l.kv_layers, l.kv_heads, l.head_dim, c.device_pages, dtype, device);
  if (l.state_layers > 0)
    states_ = std::make_unique<StatePool>(c.device_state_slots, l.state_layers, l.conv_floats, l.recurrent_floats,
                                          device);
}

void CachePools::store_page(int32_t page, int32_t host_page) {
  device_.copy_to_pinned(host_->page(host_page), kv_->page_data(page), size_t(kv_->page_bytes()));
}

void CachePools::load_page(int32_t host_page, int32_t page) {
  device_.copy_from_pinned(kv_->page_data(page), host_->page(host_page), size_t(kv_->page_bytes()));
}

void CachePools::store_state(int32_t slot, int32_t host_slot) {
  device_.copy_to_pinned(host_->slot(host_slot), states_->slot_data(slot), states_->slot_bytes());
}

void CachePools::load_state(int32_t host_slot, int32_t slot) {
  device_.copy_from_pinned(states_->slot_data(slot), host_->slot(host_slot), states_->slot_bytes());
}

}  // namespace ninfer
