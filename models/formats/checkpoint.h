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

// Phi-3's fused projections: a stored matrix (its name after "model.layers.N.", before
// ".weight" or ".bias") and the Llama matrices it stacks, in row order.
struct FusedProjection {
  std::string stored;
  std::vector<std::string> parts;
};
const std::vector<FusedProjection>& Phi3FusedProjections();

class CheckpointReader {
 public:
  // Opens every safetensors file of the checkpoint in `dir`. With an index, each tensor it
  // names must exist in the shard it names. Errors name the file. A multimodal checkpoint's
  // language model reads under a text model's names (NameLanguageModel), and fused
  // projections as their parts (NameFusedProjections).
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
  // Phi-3 stores each layer's q, k and v projections as one matrix (`self_attn.qkv_proj`, q's
  // rows first) and the MLP's gate and up as another (`mlp.gate_up_proj`, gate's rows first),
  // the stacks the runtime builds from Llama's five: each part is named here as Llama's
  // (q_proj, k_proj, v_proj, gate_proj, up_proj), a range of the stored matrix's rows. The
  // widths come from the directory's config.json; errors name it, or the tensor whose rows do
  // not add up.
  absl::Status NameFusedProjections();

  struct StoredTensor {
    const SafetensorsFile* file = nullptr;
    std::string name;  // in the file
    // A range of the stored tensor's rows (its first dimension); rows < 0: all of it.
    int64_t first_row = 0;
    int64_t rows = -1;
  };
  // The shape a tensor reads as, and its values (a view into the mapping).
  static std::vector<int64_t> ShapeOf(const StoredTensor& stored);
  static absl::StatusOr<at::Tensor> Read(const StoredTensor& stored);
  std::filesystem::path dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, StoredTensor, std::less<>> tensor_to_file_;
};

}  // namespace tophat
