// Activation buffers of a forward pass, reused from pass to pass (grown to the largest batch seen, never
// shrunk), so steady-state decode allocates nothing. They live in the backend's memory (device memory for the
// CUDA backend); positions and row indices are host-side tables the ops read as arguments.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "backend/memory.h"

namespace ninfer {

enum class Buf : uint8_t {
  Hidden, Normed, BlockOut,                                 // the residual stream and its normed copy
  AttnQ, AttnK, AttnV, AttnOut,                             // full attention
  GdnMixed, GdnZ, GdnB, GdnA, GdnQ, GdnK, GdnV, GdnG, GdnBeta, GdnOut,
  FfnGate, FfnUp, RouterLogits, RouteWeights, SharedGate, SharedUp, SharedOut, SharedLogit,
  OutRows, Logits, CandidateRows, CandidateLogits, MtpEmbed, MtpConcat, MtpHidden,
  VisionPatches, VisionHidden, VisionNormed, VisionQkv, VisionAttn, VisionMlp, VisionMerged, VisionOut,  // tower
  Count
};

class Scratch {
 public:
  explicit Scratch(MemoryResource& memory = host_memory()) : memory_(memory) {}

  // A buffer of at least n floats. Pointers stay valid until the same buffer is asked for more.
  float* get(Buf b, int64_t n) { return grow<float>(floats_[size_t(b)], n); }
  int32_t* route_ids(int64_t n) { return grow<int32_t>(route_ids_, n); }
  int32_t* draft_ids(int64_t n) { return grow<int32_t>(draft_ids_, n); }
  int64_t* positions(int64_t n) { return grow_host(positions_, n); }
  int64_t* row_index(int64_t n) { return grow_host(row_index_, n); }

 private:
  // Grown buffers keep their contents.
  template <class T>
  T* grow(MemoryBlock& block, int64_t n) {
    const size_t bytes = size_t(n) * sizeof(T);
    if (block.bytes() < bytes) {
      MemoryBlock bigger(memory_, bytes, "activation buffer");
      if (block.bytes()) memory_.copy(bigger.get(), block.get(), block.bytes());
      block = std::move(bigger);
    }
    return block.get<T>();
  }
  template <class T>
  static T* grow_host(std::vector<T>& v, int64_t n) {
    if (v.size() < size_t(n)) v.resize(size_t(n));
    return v.data();
  }
  MemoryResource& memory_;
  std::array<MemoryBlock, size_t(Buf::Count)> floats_;
  MemoryBlock route_ids_, draft_ids_;
  std::vector<int64_t> positions_, row_index_;
};

}  // namespace ninfer
