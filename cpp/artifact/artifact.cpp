// The .ninfer v3 reader. NOTE: validation happens once, here, in the order the bytes are trusted: header fields
// against the file size, the manifest against its CRC, then every tensor entry against its encoding's layout,
// then (optionally) every blob against its CRC. After open() the views are known to lie inside the mapping, so
// kernels never bounds-check.
#include "artifact/artifact.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "artifact/crc32.h"

namespace ninfer {

namespace {

constexpr char kMagic[8] = {'N', 'I', 'N', 'F', 'E', 'R', '\x00', '\x1a'};
constexpr uint32_t kVersion = 3;
constexpr uint64_t kHeaderSize = 64;
constexpr uint64_t kDataAlignment = 4096;
constexpr uint64_t kBlobAlignment = 64;
// No real dimension comes near this; it keeps every size product far from overflowing 64 bits.
constexpr int64_t kMaxDim = int64_t(1) << 40;
constexpr int64_t kMaxNumel = int64_t(1) << 50;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t flags;
  uint64_t manifest_offset;
  uint64_t manifest_size;
  uint64_t data_offset;
  uint64_t data_size;
  uint32_t manifest_crc32;
  uint8_t reserved[12];
};
static_assert(sizeof(Header) == kHeaderSize);

// A blob as the manifest records it, before it becomes a pointer.
struct BlobEntry {
  std::string tensor;
  std::string name;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  uint32_t crc32 = 0;
};

// The size in bytes each blob of `encoding` must have for `shape` (docs/artifact-format.md, Encodings).
struct BlobSize {
  const char* name;
  uint64_t nbytes;
};

std::vector<BlobSize> expected_blobs(Encoding e, const std::vector<int64_t>& shape, int64_t group_size) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t cols = shape.back();
  const uint64_t rows_total = uint64_t(numel / cols);  // product of every axis but the last
  switch (e) {
    case Encoding::F32: return {{"data", uint64_t(numel) * 4}};
    case Encoding::F16:
    case Encoding::BF16: return {{"data", uint64_t(numel) * 2}};
    case Encoding::FP8_E4M3: return {{"q", uint64_t(numel)}, {"scale", rows_total * 4}};
    case Encoding::INT8:
    case Encoding::INT4: {
      const uint64_t groups = rows_total * uint64_t(cols / group_size);
      const uint64_t q = e == Encoding::INT8 ? uint64_t(numel) : uint64_t(numel) / 2;
      return {{"q", q}, {"scale", groups * 2}, {"zero", groups}};
    }
    case Encoding::INT4_AFFINE: {
      const uint64_t groups = rows_total * uint64_t(cols / group_size);
      return {{"q", uint64_t(numel) / 2}, {"scale", groups * 2}, {"offset", groups * 2}};
    }
    case Encoding::NVFP4:
      return {{"q", uint64_t(numel) / 2}, {"scale", uint64_t(numel) / 16}, {"global_scale", 4}};
  }
  return {};
}

uint32_t parse_crc_hex(const std::string& text, const std::string& where) {
  if (text.size() != 8) throw json::TypeError(where + ": crc32 must be 8 lowercase hex digits, not \"" + text + "\"");
  uint32_t v = 0;
  for (char c : text) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
    else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
    else throw json::TypeError(where + ": crc32 must be 8 lowercase hex digits, not \"" + text + "\"");
  }
  return v;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

}  // namespace

const char* encoding_name(Encoding e) {
  switch (e) {
    case Encoding::F32: return "f32";
    case Encoding::F16: return "f16";
    case Encoding::BF16: return "bf16";
    case Encoding::FP8_E4M3: return "fp8_e4m3";
    case Encoding::INT8: return "int8";
    case Encoding::INT4: return "int4";
    case Encoding::NVFP4: return "nvfp4";
    case Encoding::INT4_AFFINE: return "int4_affine";
  }
  return "?";
}

Encoding parse_encoding(const std::string& name, const std::string& context) {
  for (Encoding e : {Encoding::F32, Encoding::F16, Encoding::BF16, Encoding::FP8_E4M3, Encoding::INT8, Encoding::INT4,
                     Encoding::INT4_AFFINE, Encoding::NVFP4})
    if (name == encoding_name(e)) return e;
  throw ArtifactError(context + ": unknown encoding \"" + name +
                      "\" (known: f32, f16, bf16, fp8_e4m3, int8, int4, int4_affine, nvfp4)");
}

int64_t TensorView::matrices() const {
  int64_t n = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TensorView TensorView::matrix(int64_t index) const {
  if (shape.size() < 2 || index < 0 || index >= matrices())
    throw ArtifactError("tensor " + name + " of shape " + shape_text(shape) + " has no matrix " +
                        std::to_string(index));
  const int64_t r = rows(), c = cols();
  TensorView m = *this;
  m.name = name + "[" + std::to_string(index) + "]";
  m.shape = {r, c};
  // Every encoding is laid out matrix after matrix, so each blob advances by one matrix's share of it.
  switch (encoding) {
    case Encoding::F32: m.data += index * r * c * 4; break;
    case Encoding::F16:
    case Encoding::BF16: m.data += index * r * c * 2; break;
    case Encoding::FP8_E4M3:
      m.data += index * r * c;
      m.scale += index * r * 4;
      break;
    case Encoding::INT8:
    case Encoding::INT4: {
      const int64_t groups = r * (c / group_size);
      m.data += index * r * (encoding == Encoding::INT8 ? c : c / 2);
      m.scale += index * groups * 2;
      m.zero += index * groups;
      break;
    }
    case Encoding::INT4_AFFINE: {
      const int64_t groups = r * (c / group_size);
      m.data += index * r * c / 2;
      m.scale += index * groups * 2;
      m.offset += index * groups * 2;
      break;
    }
    case Encoding::NVFP4:
      m.data += index * r * c / 2;
      m.scale += index * r * c / 16;
      break;
  }
  return m;
}

namespace {

// The checks of Artifact::open, one stage per method, all refusing with the file's path in the message.
class Validator {
 public:
  Validator(const std::string& path, const uint8_t* base, uint64_t size) : path_(path), base_(base), size_(size) {}

  ArtifactError refuse(const std::string& problem) const { return ArtifactError(path_ + ": " + problem); }

  // The header's fields against each other and against the file size; then the manifest against its CRC.
  std::string_view check_header() {
    std::memcpy(&h_, base_, sizeof h_);
    if (std::memcmp(h_.magic, kMagic, 8) != 0) throw refuse("wrong magic: not a .ninfer artifact");
    if (h_.version != kVersion)
      throw refuse("unsupported format version " + std::to_string(h_.version) + " (this reader reads version 3)");
    if (h_.manifest_offset != kHeaderSize)
      throw refuse("corrupt header: manifest_offset " + std::to_string(h_.manifest_offset) + ", expected 64");
    if (h_.data_offset % kDataAlignment != 0)
      throw refuse("corrupt header: data_offset " + std::to_string(h_.data_offset) + " is not a multiple of 4096");
    if (h_.data_offset < kHeaderSize || h_.manifest_size > h_.data_offset - kHeaderSize)
      throw refuse("corrupt header: the manifest (" + std::to_string(h_.manifest_size) +
                   " bytes) overruns data_offset " + std::to_string(h_.data_offset));
    if (h_.data_size > std::numeric_limits<uint64_t>::max() - h_.data_offset)
      throw refuse("corrupt header: data_size " + std::to_string(h_.data_size) + " overflows");
    const uint64_t expected_size = h_.data_offset + h_.data_size;
    if (size_ < expected_size)
      throw refuse("truncated: " + std::to_string(size_) + " bytes, the header says " + std::to_string(expected_size));
    if (size_ > expected_size)
      throw refuse("trailing bytes: " + std::to_string(size_) + " bytes, the header says " +
                   std::to_string(expected_size));
    const uint8_t* manifest = base_ + h_.manifest_offset;
    const uint32_t crc = crc32(manifest, h_.manifest_size);
    if (crc != h_.manifest_crc32)
      throw refuse("manifest checksum mismatch (crc32 " + hex8(crc) + ", header says " + hex8(h_.manifest_crc32) +
                   ")");
    return {reinterpret_cast<const char*>(manifest), h_.manifest_size};
  }

  json::Value parse_manifest(std::string_view text) const {
    try {
      return json::Value::parse(text);
    } catch (const json::ParseError& e) {
      throw refuse(std::string("manifest is not valid JSON: ") + e.what());
    }
  }

  // Every tensor entry; a value of the wrong JSON type is reported with the entry being read.
  std::unordered_map<std::string, TensorView> parse_tensors(const json::Value& m) {
    std::unordered_map<std::string, TensorView> tensors;
    where_ = "manifest";
    try {
      if (m["format"].as_string() != "ninfer") throw refuse("manifest format is not \"ninfer\"");
      if (m["version"].as_int() != int64_t(kVersion))
        throw refuse("manifest version " + std::to_string(m["version"].as_int()) +
                     " does not match format version 3");
      m["config"].as_object();
      for (const json::Value& entry : m["tensors"].as_array()) {
        TensorView t = parse_tensor(entry);
        const std::string name = t.name;
        if (!tensors.emplace(name, std::move(t)).second) throw refuse("duplicate tensor name " + name);
      }
    } catch (const json::TypeError& e) {
      throw refuse("malformed manifest (" + where_ + "): " + e.what());
    }
    return tensors;
  }

  // Blobs may not share bytes: a corrupt offset would otherwise alias two tensors silently.
  void check_overlaps() {
    std::sort(blobs_.begin(), blobs_.end(), [](const BlobEntry& x, const BlobEntry& y) { return x.offset < y.offset; });
    for (size_t i = 1; i < blobs_.size(); ++i)
      if (blobs_[i - 1].offset + blobs_[i - 1].nbytes > blobs_[i].offset)
        throw refuse("tensor " + blobs_[i].tensor + " blob " + blobs_[i].name + " overlaps tensor " +
                     blobs_[i - 1].tensor + " blob " + blobs_[i - 1].name);
  }

  void verify_checksums() {
    // Largest blobs first so that the dynamic schedule ends with small ones and the cores finish together.
    std::sort(blobs_.begin(), blobs_.end(), [](const BlobEntry& x, const BlobEntry& y) { return x.nbytes > y.nbytes; });
    const uint8_t* data = base_ + h_.data_offset;
    std::vector<uint32_t> actual(blobs_.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < blobs_.size(); ++i) actual[i] = crc32(data + blobs_[i].offset, blobs_[i].nbytes);
    for (size_t i = 0; i < blobs_.size(); ++i)
      if (actual[i] != blobs_[i].crc32)
        throw refuse("checksum mismatch in tensor " + blobs_[i].tensor + " blob " + blobs_[i].name + " (crc32 " +
                     hex8(actual[i]) + ", manifest says " + hex8(blobs_[i].crc32) + ")");
  }

 private:
  const std::string& path_;
  const uint8_t* base_;
  uint64_t size_;
  Header h_{};
  std::vector<BlobEntry> blobs_;
  std::string where_;  // what was being read, for the message of a malformed entry

  TensorView parse_tensor(const json::Value& entry) {
    where_ = "a tensor entry";
    TensorView t;
    t.name = entry["name"].as_string();
    where_ = "tensor " + t.name;
    t.encoding = parse_encoding(entry["encoding"].as_string(), path_ + ": tensor " + t.name);
    const auto& dims = entry["shape"].as_array();
    if (dims.empty()) throw refuse("tensor " + t.name + ": empty shape");
    int64_t numel = 1;
    for (const auto& d : dims) {
      const int64_t n = d.as_int();
      if (n < 1 || n > kMaxDim) throw refuse("tensor " + t.name + ": bad dimension " + std::to_string(n));
      t.shape.push_back(n);
      numel *= n;
      if (numel > kMaxNumel) throw refuse("tensor " + t.name + ": implausibly many elements");
    }
    t.group_size = check_layout(t, entry.int_or("group_size", 0));
    parse_blobs(t, entry["blobs"]);
    return t;
  }

  // What the encoding asks of the shape; returns the view's group size (16 for nvfp4's blocks).
  int32_t check_layout(const TensorView& t, int64_t group) const {
    const int64_t cols = t.cols();
    const bool grouped =
        t.encoding == Encoding::INT8 || t.encoding == Encoding::INT4 || t.encoding == Encoding::INT4_AFFINE;
    const bool quantized = grouped || t.encoding == Encoding::FP8_E4M3 || t.encoding == Encoding::NVFP4;
    if (quantized && t.shape.size() < 2)
      throw refuse("tensor " + t.name + ": " + encoding_name(t.encoding) + " needs a matrix, not shape " +
                   shape_text(t.shape));
    if (grouped) {
      if (group != 32 && group != 64 && group != 128)
        throw refuse("tensor " + t.name + ": " + encoding_name(t.encoding) + " group_size " + std::to_string(group) +
                     " is not 32, 64 or 128");
      if (cols % group != 0)
        throw refuse("tensor " + t.name + ": cols " + std::to_string(cols) + " is not a multiple of group_size " +
                     std::to_string(group));
      return int32_t(group);
    }
    if (t.encoding == Encoding::NVFP4) {
      if (cols % 16 != 0)
        throw refuse("tensor " + t.name + ": nvfp4 cols " + std::to_string(cols) + " is not a multiple of 16");
      return 16;
    }
    return 0;
  }

  // Exactly the encoding's blobs, each of the size the shape needs, aligned and inside the data region.
  void parse_blobs(TensorView& t, const json::Value& table) {
    const auto expected = expected_blobs(t.encoding, t.shape, t.group_size);
    if (table.size() != expected.size()) {
      std::string names;
      for (const auto& b : expected) names += std::string(names.empty() ? "" : ", ") + b.name;
      throw refuse("tensor " + t.name + ": " + encoding_name(t.encoding) + " takes exactly the blobs " + names +
                   ", found " + std::to_string(table.size()));
    }
    for (const BlobSize& want : expected) {
      if (!table.contains(want.name)) throw refuse("tensor " + t.name + ": missing blob \"" + want.name + "\"");
      const std::string blob = "tensor " + t.name + " blob " + want.name;
      where_ = blob;
      const json::Value& b = table[want.name];
      const int64_t offset = b["offset"].as_int(), nbytes = b["nbytes"].as_int();
      if (offset < 0 || nbytes < 0) throw refuse(blob + ": negative offset or size");
      if (uint64_t(nbytes) != want.nbytes)
        throw refuse(blob + ": size mismatch, " + std::to_string(nbytes) + " bytes where shape " +
                     shape_text(t.shape) + " in " + encoding_name(t.encoding) + " needs " +
                     std::to_string(want.nbytes));
      if (uint64_t(offset) % kBlobAlignment != 0)
        throw refuse(blob + ": offset " + std::to_string(offset) + " is not 64-byte aligned");
      if (uint64_t(offset) > h_.data_size || uint64_t(nbytes) > h_.data_size - uint64_t(offset))
        throw refuse(blob + ": out of bounds, bytes " + std::to_string(offset) + ".." +
                     std::to_string(offset + nbytes) + " outside the data region of " + std::to_string(h_.data_size) +
                     " bytes");
      blobs_.push_back({t.name, want.name, uint64_t(offset), uint64_t(nbytes),
                        parse_crc_hex(b["crc32"].as_string(), blob)});
      const uint8_t* p = base_ + h_.data_offset + offset;
      const std::string_view name = want.name;
      if (name == "data" || name == "q") t.data = p;
      else if (name == "scale") t.scale = p;
      else if (name == "zero") t.zero = p;
      else if (name == "offset") t.offset = p;
      else std::memcpy(&t.global_scale, p, 4);
    }
  }
};

}  // namespace

std::shared_ptr<Artifact> Artifact::open(const std::string& path, bool verify_checksums) {
  std::shared_ptr<Artifact> a(new Artifact());  // the destructor unmaps and closes whatever was opened
  a->path_ = path;
  auto refuse = [&](const std::string& problem) { return ArtifactError(path + ": " + problem); };
  a->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (a->fd_ < 0) throw refuse(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(a->fd_, &st) != 0) throw refuse(std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw refuse("not a regular file");
  a->size_ = uint64_t(st.st_size);
  if (a->size_ < kHeaderSize)
    throw refuse("truncated: " + std::to_string(a->size_) + " bytes, shorter than the 64-byte header");
  void* map = mmap(nullptr, a->size_, PROT_READ, MAP_SHARED, a->fd_, 0);
  if (map == MAP_FAILED) throw refuse(std::string("cannot map: ") + std::strerror(errno));
  a->base_ = static_cast<const uint8_t*>(map);

  Validator check(path, a->base_, a->size_);
  a->manifest_text_ = check.check_header();
  a->manifest_ = check.parse_manifest(a->manifest_text_);
  a->tensors_ = check.parse_tensors(a->manifest_);
  check.check_overlaps();
  if (verify_checksums) check.verify_checksums();
  return a;
}

Artifact::~Artifact() {
  if (base_) munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

const TensorView& Artifact::tensor(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw ArtifactError(path_ + ": missing tensor " + name);
  if (!expected_shape.empty() && it->second.shape != expected_shape)
    throw ArtifactError(path_ + ": tensor " + name + " has shape " + shape_text(it->second.shape) + ", expected " +
                        shape_text(expected_shape));
  return it->second;
}

std::vector<std::string> Artifact::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ninfer
