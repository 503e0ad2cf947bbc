#include "models/runtime/adapter.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "models/formats/checkpoint.h"
#include "models/formats/safetensors.h"
#include "base/status_macros.h"

namespace tophat {

namespace fs = std::filesystem;
using json = nlohmann::json;

json AdapterInfo::ToJson() const {
  return {{"format", "tophat-adapter"},
          {"format_version", kFormatVersion},
          {"file", file},
          {"input_layers", input_layers},
          {"num_layers", num_layers},
          {"intermediate_size", intermediate_size},
          {"num_parameters", num_parameters},
          {"source_model", source_model},
          {"distillation", distillation}};
}

absl::StatusOr<AdapterInfo> AdapterInfo::FromJson(const json& j, const std::string& source) {
  if (!j.is_object() || j.value("format", "") != "tophat-adapter") {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": not an adapter description (key 'format' must be \"tophat-adapter\")"));
  }
  if (const int version = j.value("format_version", -1); version != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key 'format_version' is ", version,
                                                   "; this build reads version ",
                                                   kFormatVersion));
  }
  AdapterInfo info;
  auto integer = [&](const char* key, int64_t& out, int64_t min) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < min) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": key '", key, "' must be an integer >= ", min));
    }
    out = it->get<int64_t>();
    return absl::OkStatus();
  };
  TOPHAT_RETURN_IF_ERROR(integer("input_layers", info.input_layers, 1));
  TOPHAT_RETURN_IF_ERROR(integer("num_layers", info.num_layers, 1));
  TOPHAT_RETURN_IF_ERROR(integer("intermediate_size", info.intermediate_size, 1));
  info.num_parameters = j.value("num_parameters", int64_t{0});
  info.file = j.value("file", std::string(kAdapterWeightsFile));
  if (info.file.empty() || info.file.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key 'file' must be a file name in the same directory"));
  }
  info.source_model = j.value("source_model", "");
  if (auto it = j.find("distillation"); it != j.end() && it->is_object()) {
    info.distillation = *it;
  }
  return info;
}

absl::StatusOr<AdapterInfo> AdapterInfo::Load(const fs::path& dir) {
  const fs::path path = dir / kAdapterInfoFile;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not valid JSON"));
  }
  // A key of the wrong type throws from nlohmann's value(): an error naming the file.
  try {
    return FromJson(j, path.string());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", e.what()));
  }
}

ModelConfig AdapterModelConfig(const ModelConfig& model, const AdapterInfo& info) {
  ModelConfig config = model;
  config.num_hidden_layers = info.num_layers;
  config.intermediate_size = info.intermediate_size;
  // Λ's block is dense even where the model mixes experts: one MLP of intermediate_size.
  config.num_experts = 0;
  config.shared_expert_intermediate_size = 0;
  config.mlp_only_layers.clear();
  return config;
}

absl::StatusOr<std::unique_ptr<Submodel>> LoadAdapter(const fs::path& dir,
                                                      const ModelConfig& model,
                                                      const AdapterInfo& info,
                                                      int64_t input_layers,
                                                      const SubmodelOptions& options) {
  const fs::path file = dir / info.file;
  if (info.input_layers != input_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        file.string(), ": the adapter was distilled for ", info.input_layers,
        " input layers but this device bundle has ", input_layers,
        " — run `tophat distill` for this split"));
  }
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                          CheckpointReader::OpenFile(file));
  const ModelConfig config = AdapterModelConfig(model, info);
  absl::StatusOr<std::unique_ptr<Submodel>> adapter = Submodel::Load(
      config, *reader, {.layers = {0, info.num_layers}}, options);
  if (!adapter.ok()) {
    return absl::Status(adapter.status().code(),
                        absl::StrCat("adapter: ", adapter.status().message()));
  }
  return adapter;
}

absl::Status WriteAdapter(const fs::path& dir, const AdapterInfo& info,
                          const NamedTensors& weights) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir.string(), ": cannot create: ", ec.message()));
  // Write under temporary names and rename, so a crash never leaves a half-written adapter
  // next to a description that vouches for it.
  const fs::path weights_path = dir / info.file;
  const fs::path info_path = dir / kAdapterInfoFile;
  TOPHAT_RETURN_IF_ERROR(WriteSafetensors(weights_path.string() + ".tmp", weights,
                                          {{"format", "pt"}, {"tophat", "adapter"}}));
  {
    std::ofstream out(info_path.string() + ".tmp");
    out << info.ToJson().dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat(info_path.string(), ": write failed"));
  }
  fs::rename(weights_path.string() + ".tmp", weights_path, ec);
  if (!ec) fs::rename(info_path.string() + ".tmp", info_path, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(dir.string(), ": cannot rename: ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace tophat
