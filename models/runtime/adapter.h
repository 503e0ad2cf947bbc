// The adapter Λ of HAT's drafter: one decoder block with the model's structure (its own
// weights and KV cache) that maps the input submodel's shallow states to an approximation of
// the deep states before the head. The drafter is input submodel -> Λ -> final norm + LM head.
//
// On disk Λ is `adapter.safetensors` (the tensors of a one-layer Llama stack, named
// model.layers.0.*) plus its hyperparameters: `adapter.json` where `tophat distill` wrote it,
// and the "adapter" object of tophat_bundle.json once it is part of a device bundle.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "models/formats/config.h"
#include "models/runtime/model_init.h"
#include "models/runtime/submodel.h"

namespace tophat {

inline constexpr char kAdapterWeightsFile[] = "adapter.safetensors";
inline constexpr char kAdapterInfoFile[] = "adapter.json";

struct AdapterInfo {
  static constexpr int kFormatVersion = 1;
  std::string file = kAdapterWeightsFile;
  int64_t input_layers = 0;       // m: the adapter reads the states after layer m - 1
  int64_t num_layers = 1;         // decoder blocks in Λ (HAT: one)
  int64_t intermediate_size = 0;  // MLP width of Λ's block
  int64_t num_parameters = 0;
  std::string source_model;       // checkpoint it was distilled from
  nlohmann::json distillation = nlohmann::json::object();  // options and report of the run

  nlohmann::json ToJson() const;
  // `source` names the file (and key) in errors.
  static absl::StatusOr<AdapterInfo> FromJson(const nlohmann::json& json,
                                              const std::string& source);
  static absl::StatusOr<AdapterInfo> Load(const std::filesystem::path& dir);  // adapter.json
};

// The config Λ's block is loaded with: the model's, with `num_layers` layers and the
// adapter's MLP width.
ModelConfig AdapterModelConfig(const ModelConfig& model, const AdapterInfo& info);

// Loads Λ from `dir`/info.file as a Submodel with no embedding and no head. Checks that it
// was distilled for `input_layers` and that every tensor has the shape the config implies;
// errors name the file and the tensor.
absl::StatusOr<std::unique_ptr<Submodel>> LoadAdapter(const std::filesystem::path& dir,
                                                      const ModelConfig& model,
                                                      const AdapterInfo& info,
                                                      int64_t input_layers,
                                                      const SubmodelOptions& options = {});

// Writes adapter.safetensors (float32) and adapter.json into `dir`.
absl::Status WriteAdapter(const std::filesystem::path& dir, const AdapterInfo& info,
                          const NamedTensors& weights);

}  // namespace tophat
