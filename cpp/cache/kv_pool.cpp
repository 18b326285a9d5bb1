#include "cache/kv_pool.h"

#include "errors.h"
#include "cache/kv_codec.h"
#include "cache/kv_quant.h"

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
}

void KvPool::copy_page(int32_t from, int32_t to) {
  if (from != to) storage_.memory().copy(row_ptr(to, 0, 0), row_ptr(from, 0, 0), size_t(page_bytes_));
}

void* KvPool::row_ptr(int32_t page, int32_t layer, int kv) {
  return storage_.get<uint8_t>() + page * page_bytes_ + (int64_t(layer) * 2 + kv) * block_bytes_;
}

float* KvPool::scale_ptr(int32_t page, int32_t layer, int kv) {
  if (!kv_dtype_is_quantized(dtype_)) return nullptr;
  return reinterpret_cast<float*>(static_cast<uint8_t*>(row_ptr(page, layer, kv)) + rows_bytes_);
}

}  // namespace ninfer
