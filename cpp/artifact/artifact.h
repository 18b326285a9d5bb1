// The .ninfer v3 reader: maps the file read-only and hands out tensors by logical name (docs/artifact-format.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "artifact/json.h"
#include "errors.h"

namespace ninfer {

// Every refusal of the reader is an ArtifactError (errors.h) whose message names the file and the problem.

// INT4_AFFINE: code * scale + offset per group (GGUF Q4_1 exactly); INT8 / INT4: (code - zero) * scale.
enum class Encoding : uint8_t { F32, F16, BF16, FP8_E4M3, INT8, INT4, NVFP4, INT4_AFFINE };

const char* encoding_name(Encoding e);
// Throws ArtifactError for an unknown name.
Encoding parse_encoding(const std::string& name, const std::string& context);

// A tensor in its stored encoding. Pointers point into the mapping (or, for a backend copy, into its memory).
// For a weight of shape [..., rows, cols], `cols` is the input (reduction) axis; leading axes stack matrices.
struct TensorView {
  std::string name;
  Encoding encoding = Encoding::F32;
  std::vector<int64_t> shape;
  int32_t group_size = 0;          // int8 / int4 / int4_affine groups; 16 for nvfp4
  const uint8_t* data = nullptr;   // values (`data`) or quantized codes (`q`)
  const uint8_t* scale = nullptr;  // f32 per row (fp8), f16 per group (int8/int4/int4_affine), e4m3 per 16 (nvfp4)
  const uint8_t* zero = nullptr;   // u8 per group (int8/int4)
  const uint8_t* offset = nullptr; // f16 per group (int4_affine)
  float global_scale = 1.0f;       // nvfp4

  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  int64_t rows() const { return shape.size() < 2 ? 1 : shape[shape.size() - 2]; }
  int64_t matrices() const;        // product of the leading axes (1 for a 2-D weight)
  int64_t numel() const;
  // The view of matrix `index` of a stacked [E, rows, cols] tensor (e.g. one expert).
  TensorView matrix(int64_t index) const;
};

class Artifact {
 public:
  // Maps `path`, validates header, manifest, blob bounds and sizes; verifies every blob's CRC-32 when asked.
  static std::shared_ptr<Artifact> open(const std::string& path, bool verify_checksums = true);
  ~Artifact();
  Artifact(const Artifact&) = delete;
  Artifact& operator=(const Artifact&) = delete;

  const std::string& path() const { return path_; }
  const json::Value& manifest() const { return manifest_; }
  // The manifest's bytes as stored (UTF-8 JSON), for `ninfer inspect` and tools that want the text itself.
  std::string_view manifest_text() const { return manifest_text_; }
  const json::Value& config() const { return manifest_["config"]; }

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws ArtifactError naming the file and tensor when missing, or when `expected_shape` is given and differs.
  const TensorView& tensor(const std::string& name, const std::vector<int64_t>& expected_shape = {}) const;
  std::vector<std::string> tensor_names() const;
  uint64_t file_size() const { return size_; }

 private:
  Artifact() = default;
  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::string_view manifest_text_;  // into the mapping
  json::Value manifest_;
  std::unordered_map<std::string, TensorView> tensors_;
};

}  // namespace ninfer
