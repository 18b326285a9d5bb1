// The paged KV pool shared by every sequence: pages of kKvPageTokens tokens, each holding K and V of those tokens
// for every full-attention layer (the MTP layer counts as one more). A page is one contiguous block, so a page is
// copied to another page as a unit. The pool is storage only:
// which pages are in use is PageTable's business (cache/page_table.h).
//
// The pool's format (cache/kv_dtype.h) names a row codec for K and one for V (the same but for k8v4). Page
// layout: for each layer, the K block then the V block; a block is kKvPageTokens rows of the side's codes for
// kv_heads * head_dim values, then for the scaled codecs (fp8, int8, nvfp4) kKvPageTokens * kv_heads f32 scales,
// one per (token, head) row (cache/kv_quant.h), then for nvfp4 kKvPageTokens * kv_heads * head_dim / 16 e4m3
// block scales, in row order. f32 and bf16 blocks have no scales, so their layout is plain rows.
#pragma once

#include <cstdint>
#include "backend/memory.h"
#include "cache/kv_dtype.h"

namespace ninfer {

class KvPool {
 public:
  // `layers` KV layers of `kv_heads * head_dim` values per token for K and for V, stored in `memory` (the
  // backend's: the row pointers below point there).
  KvPool(int32_t layers, int32_t kv_heads, int32_t head_dim, int64_t pages, KvDtype dtype,
         MemoryResource& memory = host_memory());

  KvDtype dtype() const { return dtype_; }  // the format
  KvDtype key_dtype() const { return side_[0].dtype; }
  KvDtype value_dtype() const { return side_[1].dtype; }
  int32_t layers() const { return layers_; }
  int64_t row_elements() const { return row_elements_; }  // kv_heads * head_dim (values, not code bytes)
  int64_t total_pages() const { return total_pages_; }
  int64_t page_bytes() const { return page_bytes_; }  // page p + 1 starts page_bytes() after page p

  void copy_page(int32_t from, int32_t to);
  void* page_data(int32_t page) { return row_ptr(page, 0, 0); }  // page_bytes() from here

  // Start of the K (or V) codes of `page` for `layer`; rows of one page and layer are contiguous, so a page
  // holds kKvPageTokens consecutive rows per (layer, K|V).
  void* k_rows(int32_t page, int32_t layer) { return row_ptr(page, layer, 0); }
  void* v_rows(int32_t page, int32_t layer) { return row_ptr(page, layer, 1); }
  const void* k_rows(int32_t page, int32_t layer) const { return const_cast<KvPool*>(this)->row_ptr(page, layer, 0); }
  const void* v_rows(int32_t page, int32_t layer) const { return const_cast<KvPool*>(this)->row_ptr(page, layer, 1); }

  // The scales of a page's K (or V) rows for `layer` (scaled codecs only; nullptr otherwise): the scale of token
  // `offset`, head `h` is at [offset * kv_heads + h].
  float* k_scales(int32_t page, int32_t layer) { return scale_ptr(page, layer, 0); }
  float* v_scales(int32_t page, int32_t layer) { return scale_ptr(page, layer, 1); }
  const float* k_scales(int32_t page, int32_t layer) const {
    return const_cast<KvPool*>(this)->scale_ptr(page, layer, 0);
  }
  const float* v_scales(int32_t page, int32_t layer) const {
    return const_cast<KvPool*>(this)->scale_ptr(page, layer, 1);
  }
  // The e4m3 block scales of a page's K (or V) rows (nvfp4 only; nullptr otherwise): value i of token `offset`'s
  // row (i counting over all kv_heads * head_dim values) has its scale at [(offset * row_elements() + i) / 16].
  uint8_t* k_blocks(int32_t page, int32_t layer) { return block_ptr(page, layer, 0); }
  uint8_t* v_blocks(int32_t page, int32_t layer) { return block_ptr(page, layer, 1); }
  const uint8_t* k_blocks(int32_t page, int32_t layer) const {
    return const_cast<KvPool*>(this)->block_ptr(page, layer, 0);
  }
  const uint8_t* v_blocks(int32_t page, int32_t layer) const {
    return const_cast<KvPool*>(this)->block_ptr(page, layer, 1);
  }
  int32_t kv_heads() const { return kv_heads_; }

 private:
  // One side's (K's or V's) layout within a layer: codes, then scales, then block scales.
  struct Side {
    KvDtype dtype;
    int64_t codes_bytes, scales_bytes, block_bytes;  // block_bytes: the whole side
  };
  void* row_ptr(int32_t page, int32_t layer, int kv);
  float* scale_ptr(int32_t page, int32_t layer, int kv);
  uint8_t* block_ptr(int32_t page, int32_t layer, int kv);
  KvDtype dtype_;
  int32_t layers_, kv_heads_;
  int64_t row_elements_, layer_bytes_, page_bytes_, total_pages_;
  Side side_[2];
  MemoryBlock storage_;
};

}  // namespace ninfer
