#include "runtime/kv_pool.h"

#include "errors.h"
#include "runtime/kv_codec.h"
#include "runtime/kv_quant.h"

namespace ninfer {

KvPool::KvPool(int32_t layers, int32_t kv_heads, int32_t head_dim, int64_t pages, KvDtype dtype,
               MemoryResource& memory)
    : dtype_(dtype), layers_(layers), kv_heads_(kv_heads), row_elements_(int64_t(kv_heads) * head_dim),
      element_bytes_(int64_t(kv_element_bytes(dtype))), total_pages_(pages) {
  rows_bytes_ = kKvPageTokens * row_elements_ * element_bytes_;
  const int64_t scale_bytes = kv_dtype_is_quantized(dtype) ? kKvPageTokens * kv_heads * int64_t(sizeof(float)) : 0;
  block_bytes_ = rows_bytes_ + scale_bytes;
  page_bytes_ = int64_t(layers) * 2 * block_bytes_;
  storage_ = MemoryBlock(memory, size_t(page_bytes_ * pages), "KV pool of " + std::to_string(pages) + " pages");
  free_.reserve(size_t(pages));
  for (int64_t p = pages - 1; p >= 0; --p) free_.push_back(int32_t(p));
}

bool KvPool::acquire(int64_t n, std::vector<int32_t>& out) {
  if (n > free_pages()) return false;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvPool::release(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) free_.push_back(p);
}

void* KvPool::row_ptr(int32_t page, int32_t layer, int kv) {
  return storage_.get<uint8_t>() + page * page_bytes_ + (int64_t(layer) * 2 + kv) * block_bytes_;
}

float* KvPool::scale_ptr(int32_t page, int32_t layer, int kv) {
  if (!kv_dtype_is_quantized(dtype_)) return nullptr;
  return reinterpret_cast<float*>(static_cast<uint8_t*>(row_ptr(page, layer, kv)) + rows_bytes_);
}

}  // namespace ninfer
