// Device and cloud bundles: the two halves `tophat split` makes of a checkpoint.
//
//   device bundle: embedding, layers [0, m), layers [L-k, L), final norm, LM head, tokenizer
//   cloud bundle:  layers [m, L-k) only: no embedding, no head, no tokenizer
//
// Each is a Hugging Face style directory (config.json of the full model + model.safetensors
// under the original tensor names) plus a manifest, tophat_bundle.json, that names the source
// model, the layer ranges and the dtype. Each loads on its own.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "models/runtime/adapter.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"
#include "models/runtime/submodel.h"
#include "models/tokenizers/tokenizer.h"

namespace tophat {

inline constexpr char kBundleManifestFile[] = "tophat_bundle.json";

enum class BundleKind { kDevice, kCloud };

struct BundleManifest {
  static constexpr int kFormatVersion = 1;
  BundleKind kind = BundleKind::kDevice;
  std::string source_model;         // path of the checkpoint that was split
  std::string source_architecture;  // e.g. LlamaForCausalLM
  int64_t num_hidden_layers = 0;
  LayerRange input_layers;   // device
  LayerRange middle_layers;  // cloud
  LayerRange output_layers;  // device
  std::string dtype;         // of the stored tensors: float32, float16 or bfloat16
  // "int8": the device bundle's weight matrices (its layers', the adapter's, the embedding
  // and the LM head) are stored as int8 with a float32 scale per row ("<name>_scale"), and
  // whatever else it loads as a matrix is quantized so too (kernels/gemv_int8.h). "": as
  // `dtype` says.
  std::string weights;
  // "sha256:<hex>" of the checkpoint the bundle was split from (config.json, then every
  // tensor's name, dtype, shape and bytes in name order): both halves of one split carry
  // the same, two checkpoints of one shape do not. "" in bundles split before it existed.
  std::string model_fingerprint;
  std::vector<std::string> files;
  // The drafter's adapter Λ (device bundles only), when one was distilled for this split.
  std::optional<AdapterInfo> adapter;

  nlohmann::json ToJson() const;
  static absl::StatusOr<BundleManifest> FromJson(const nlohmann::json& json,
                                                 const std::string& source);
  static absl::StatusOr<BundleManifest> Load(const std::filesystem::path& bundle_dir);
};

enum class DeviceWeights { kAsStored, kInt8 };

struct SplitOptions {
  std::filesystem::path model_dir;
  int64_t input_layers = 2;   // m
  int64_t output_layers = 0;  // k
  std::filesystem::path out_dir;  // receives device/ and cloud/
  // kInt8: the device bundle's weight matrices as int8 with per-row scales (the device's
  // memory: a quarter of float32's bytes). The cloud bundle keeps the checkpoint's dtype.
  DeviceWeights device_weights = DeviceWeights::kAsStored;
};

struct SplitResult {
  std::filesystem::path device_dir;
  std::filesystem::path cloud_dir;
  BundleManifest device;
  BundleManifest cloud;
  // Why the source's adapter was not carried into the device bundle ("" if it was, or if
  // the source has none).
  std::string adapter_note;
};

// Writes out_dir/device and out_dir/cloud. Requires 1 <= m and m + k < L, so that the cloud
// holds at least one layer and the device at least one (HAT keeps shallow layers on device
// so that what crosses the network is never the raw embedding).
// A checkpoint directory that holds adapter.json + adapter.safetensors distilled for the
// same m passes them on to the device bundle.
absl::StatusOr<SplitResult> SplitCheckpoint(const SplitOptions& options);

// Records the adapter.json + adapter.safetensors that `tophat distill` wrote into the device
// bundle `dir` in its manifest, after checking that they load against the bundle.
absl::Status AttachAdapterToBundle(const std::filesystem::path& dir);

// A bundle read as far as it can be without loading weights: its manifest, checked to be
// of `kind`; its model config; and its checkpoint's headers (a cloud bundle that holds the
// embedding or the LM head is refused). The loaders below start with this; `tophat-cloud
// --check-config` stops after it.
struct BundleContents {
  BundleManifest manifest;
  ModelConfig config;
  std::unique_ptr<CheckpointReader> checkpoint;
};
absl::StatusOr<BundleContents> InspectBundle(const std::filesystem::path& dir, BundleKind kind);

struct DeviceBundle {
  BundleManifest manifest;
  ModelConfig config;
  std::unique_ptr<Submodel> input;   // embedding + layers [0, m)
  std::unique_ptr<Submodel> output;  // layers [L-k, L) + norm + head
  std::unique_ptr<Submodel> adapter; // Λ, or null when the bundle has none
  std::unique_ptr<Tokenizer> tokenizer;

  static absl::StatusOr<DeviceBundle> Load(const std::filesystem::path& dir,
                                           const SubmodelOptions& options = {});
};

// The model config a bundle carries (`config.json`), checked against its manifest.
absl::StatusOr<ModelConfig> LoadBundleConfig(const std::filesystem::path& dir,
                                             const BundleManifest& manifest);

struct CloudBundle {
  BundleManifest manifest;
  ModelConfig config;
  std::unique_ptr<Submodel> middle;  // layers [m, L-k), or the `layers` asked for

  // `layers`, when given, loads only that part of the middle (one stage of the cloud's
  // pipeline); it must lie within the bundle's middle layers.
  static absl::StatusOr<CloudBundle> Load(const std::filesystem::path& dir,
                                          const SubmodelOptions& options = {},
                                          std::optional<LayerRange> layers = std::nullopt);
};

}  // namespace tophat
