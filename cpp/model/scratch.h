// Activation buffers of a forward pass, reused from pass to pass (grown to the largest batch seen, never
// shrunk), so steady-state decode allocates nothing.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace ninfer {

enum class Buf : uint8_t {
  Hidden, Normed, BlockOut,                                 // the residual stream and its normed copy
  AttnQ, AttnK, AttnV, AttnOut,                             // full attention
  GdnMixed, GdnZ, GdnB, GdnA, GdnConv, GdnQ, GdnK, GdnV, GdnG, GdnBeta, GdnOut,
  FfnGate, FfnUp, RouterLogits, RouteWeights, SharedGate, SharedUp, SharedOut, SharedLogit,
  OutRows, MtpEmbed, MtpConcat,
  Count
};

class Scratch {
 public:
  // A buffer of at least n floats. Pointers stay valid until the same buffer is asked for more.
  float* get(Buf b, int64_t n) {
    auto& v = floats_[size_t(b)];
    if (v.size() < size_t(n)) v.resize(size_t(n));
    return v.data();
  }
  int32_t* route_ids(int64_t n) { return grow(route_ids_, n); }
  int64_t* positions(int64_t n) { return grow(positions_, n); }
  int64_t* row_index(int64_t n) { return grow(row_index_, n); }

 private:
  template <class T>
  static T* grow(std::vector<T>& v, int64_t n) {
    if (v.size() < size_t(n)) v.resize(size_t(n));
    return v.data();
  }
  std::array<std::vector<float>, size_t(Buf::Count)> floats_;
  std::vector<int32_t> route_ids_;
  std::vector<int64_t> positions_, row_index_;
};

}  // namespace ninfer
