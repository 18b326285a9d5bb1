#include "cache/kv_pool.h"

#include "errors.h"
#include "cache/kv_fp4.h"
#include "cache/kv_quant.h"

namespace ninfer {

KvPool::KvPool(int32_t layers, int32_t kv_heads, int32_t head_dim, int64_t pages, KvDtype dtype,
               MemoryResource& memory)
    : dtype_(dtype), layers_(layers), kv_heads_(kv_heads), row_elements_(int64_t(kv_heads) * head_dim),
      total_pages_(pages) {
  if (kv_value_dtype(dtype) == KvDtype::NVFP4 && head_dim % kKvFp4Block != 0)
    throw EngineError(std::string("KV format ") + kv_dtype_name(dtype) + " needs head_dim a multiple of 16, not " +
                      std::to_string(head_dim));
  layer_bytes_ = 0;
  for (int kv = 0; kv < 2; ++kv) {
    const KvDtype d = kv == 0 ? kv_key_dtype(dtype) : kv_value_dtype(dtype);
    const int64_t rows = kKvPageTokens * kv_heads;
    const int64_t codes = kKvPageTokens * kv_code_bytes(d, row_elements_);
    // The row scales and block scales are what kv_row_bytes counts past the codes.
    const int64_t extra = rows * (kv_row_bytes(d, head_dim) - kv_code_bytes(d, head_dim));
    const int64_t scales = kv_dtype_is_quantized(d) ? rows * int64_t(sizeof(float)) : 0;
    side_[kv] = {d, codes, scales, codes + extra};
    layer_bytes_ += side_[kv].block_bytes;
  }
  page_bytes_ = int64_t(layers) * layer_bytes_;
  storage_ = MemoryBlock(memory, size_t(page_bytes_ * pages), "KV pool of " + std::to_string(pages) + " pages");
}

void KvPool::copy_page(int32_t from, int32_t to) {
  if (from != to) storage_.memory().copy(row_ptr(to, 0, 0), row_ptr(from, 0, 0), size_t(page_bytes_));
}

void* KvPool::row_ptr(int32_t page, int32_t layer, int kv) {
  return storage_.get<uint8_t>() + page * page_bytes_ + int64_t(layer) * layer_bytes_ +
         (kv ? side_[0].block_bytes : 0);
}

float* KvPool::scale_ptr(int32_t page, int32_t layer, int kv) {
  if (side_[kv].scales_bytes == 0) return nullptr;
  return reinterpret_cast<float*>(static_cast<uint8_t*>(row_ptr(page, layer, kv)) + side_[kv].codes_bytes);
}

uint8_t* KvPool::block_ptr(int32_t page, int32_t layer, int kv) {
  if (side_[kv].dtype != KvDtype::NVFP4) return nullptr;
  return static_cast<uint8_t*>(row_ptr(page, layer, kv)) + side_[kv].codes_bytes + side_[kv].scales_bytes;
}

}  // namespace ninfer
