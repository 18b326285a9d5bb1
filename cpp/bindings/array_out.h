// A fresh f32 numpy array that owns its buffer (C++ fills it, Python frees it).
#pragma once

#include <nanobind/ndarray.h>

#include <cstdint>
#include <vector>

namespace ninfer::bindings {

using FloatArray = nanobind::ndarray<nanobind::numpy, float>;

struct OwnedFloats {
  float* data;
  nanobind::capsule owner;
};

inline OwnedFloats allocate_floats(size_t count) {
  float* data = new float[count > 0 ? count : 1];
  return {data, nanobind::capsule(data, [](void* p) noexcept { delete[] static_cast<float*>(p); })};
}

inline FloatArray as_array(OwnedFloats& buffer, const std::vector<int64_t>& shape) {
  std::vector<size_t> dims(shape.begin(), shape.end());
  return FloatArray(buffer.data, dims.size(), dims.data(), buffer.owner);
}

}  // namespace ninfer::bindings
