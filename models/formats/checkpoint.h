// A Hugging Face checkpoint directory: config.json plus either model.safetensors or shards
// listed in model.safetensors.index.json.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "models/formats/safetensors.h"

namespace tophat {

class CheckpointReader {
 public:
  // Opens every safetensors file of the checkpoint in `dir`. With an index, each tensor it
  // names must exist in the shard it names. Errors name the file. A multimodal checkpoint's
  // language model reads under a text model's names (NameLanguageModel).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::filesystem::path& dir);
  // One safetensors file on its own (an adapter, a test file).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenFile(
      const std::filesystem::path& file);

  const std::filesystem::path& dir() const { return dir_; }
  bool Has(std::string_view name) const;
  std::vector<std::string> TensorNames() const;

  // Loads `name`, checks its shape equals `expected_shape` and that it is a floating dtype
  // (F32/F16/BF16), and converts it to `dtype`. Errors name the shard file and the tensor.
  absl::StatusOr<at::Tensor> Load(std::string_view name, at::IntArrayRef expected_shape,
                                  at::ScalarType dtype) const;

  // The tensor exactly as stored (F32/F16/BF16), for tools that copy tensors through.
  absl::StatusOr<at::Tensor> LoadAsStored(std::string_view name) const;

  // The stored dtype of a tensor, and the file that holds it.
  absl::StatusOr<SafetensorsDType> StoredDType(std::string_view name) const;
  absl::StatusOr<std::filesystem::path> FileOf(std::string_view name) const;

 private:
  CheckpointReader() = default;

  // A multimodal checkpoint keeps its language model under a prefix
  // (Gemma3ForConditionalGeneration: `language_model.model.` and `language_model.lm_head.`
  // as transformers 4.50 and 5 save it, `model.language_model.` as 4.52 to 4.57 do): its
  // tensors are named here as a text model's (`model.`, `lm_head.`), the others (the vision
  // tower's) as stored.
  void NameLanguageModel();

  struct StoredTensor {
    const SafetensorsFile* file = nullptr;
    std::string name;  // in the file
  };
  std::filesystem::path dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, StoredTensor, std::less<>> tensor_to_file_;
};

}  // namespace tophat
