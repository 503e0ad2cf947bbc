// Reading and writing the safetensors checkpoint format
// (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length, a JSON
// header mapping tensor names to {dtype, shape, data_offsets}, then the raw data.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"

namespace tophat {

// Element types the format names. Only F32, F16 and BF16 can be model weights; the others
// are parsed so that a checkpoint holding one gets a precise error instead of a parse failure.
enum class SafetensorsDType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

std::string_view DTypeName(SafetensorsDType dtype);

// A shape as errors print it: "[2, 3]".
std::string ShapeString(at::IntArrayRef shape);
int64_t DTypeSize(SafetensorsDType dtype);

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // byte offsets relative to the start of the data section
  uint64_t data_end = 0;
};

// A safetensors file mapped read-only into memory. Tensors returned by Tensor() alias the
// mapping where alignment allows and keep the file mapped for as long as they live.
class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  // Validates the whole header up front: its length against the file size, the JSON, every
  // dtype, shape and offset range (in bounds, sized to match the shape, non-overlapping).
  // Errors name the file and, where one is at fault, the tensor.
  static absl::StatusOr<std::shared_ptr<SafetensorsFile>> Open(const std::filesystem::path& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor in its stored dtype (F32/F16/BF16 only). NotFound if absent.
  absl::StatusOr<at::Tensor> Tensor(std::string_view name) const;

 private:
  SafetensorsFile() = default;

  std::filesystem::path path_;
  const uint8_t* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  const uint8_t* data_section_ = nullptr;
  std::map<std::string, SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (F32, F16 or BF16, any device; copied to contiguous CPU) in the given
// order, with the header padded so that the data section is 8-byte aligned. The file is
// written to a temporary name and renamed, so a crash never leaves a half-written checkpoint.
absl::Status WriteSafetensors(const std::filesystem::path& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace tophat
