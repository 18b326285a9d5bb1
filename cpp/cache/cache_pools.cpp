#include "cache/cache_pools.h"

namespace ninfer {

CachePools::CachePools(const CacheLayout& l, const CacheCapacity& c, KvDtype dtype, MemoryResource& device)
    : pages_(c.device_pages), slots_(l.state_layers > 0 ? c.device_state_slots : 0) {
  kv_ = std::make_unique<KvPool>(l.kv_layers, l.kv_heads, l.head_dim, c.device_pages, dtype, device);
  if (l.state_layers > 0)
    states_ = std::make_unique<StatePool>(c.device_state_slots, l.state_layers, l.conv_floats, l.recurrent_floats,
                                          device);
}

}  // namespace ninfer
