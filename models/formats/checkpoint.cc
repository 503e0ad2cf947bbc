#include "models/formats/checkpoint.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "models/formats/config.h"

namespace tophat {
namespace {

// Debian builds Abseil with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0),
// which std::string_view does not convert to implicitly, so StrCat needs this bridge.
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";

absl::Status MissingTensor(const std::filesystem::path& dir, std::string_view name) {
  return absl::NotFoundError(
      absl::StrCat("checkpoint ", dir.string(), ": no tensor '", Sv(name), "'"));
}

bool IsFile(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

// Reads the index's weight_map: tensor name -> shard file name relative to the directory.
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(
    const std::filesystem::path& index_path) {
  const std::string name = index_path.string();
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(name, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(name, ": read failed"));

  std::map<std::string, std::string> weight_map;
  try {
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(buffer.str());
    } catch (const nlohmann::json::parse_error& e) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": not valid JSON: ", e.what()));
    }
    if (!index.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": is a JSON ", index.type_name(), ", expected an object"));
    }
    auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": no \"weight_map\" object"));
    }
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string() || shard.get_ref<const std::string&>().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": weight_map entry for tensor '",
                                                       tensor, "' is not a shard file name"));
      }
      // Shards must sit in the checkpoint directory: an index is data and must not be able
      // to point the loader at arbitrary files.
      const std::filesystem::path shard_path(shard.get<std::string>());
      if (shard_path.is_absolute() || shard_path.has_parent_path()) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": weight_map entry for tensor '", tensor, "' names shard '",
            shard.get<std::string>(), "', which is not a file name inside the checkpoint directory"));
      }
      weight_map.emplace(tensor, shard.get<std::string>());
    }
  } catch (const std::exception& e) {
    // Backstop: every access above is type-checked, but no exception may leave the API.
    return absl::InternalError(absl::StrCat(name, ": cannot read: ", e.what()));
  }
  if (weight_map.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": weight_map lists no tensors"));
  }
  return weight_map;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::OpenFile(
    const std::filesystem::path& file) {
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader());
  reader->dir_ = file.parent_path();
  TOPHAT_ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsFile> opened, SafetensorsFile::Open(file));
  for (const auto& [name, info] : opened->tensors()) {
    reader->tensor_to_file_.emplace(name, StoredTensor{opened.get(), name});
  }
  reader->files_.push_back(std::move(opened));
  return reader;
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::filesystem::path& dir) {
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader());
  reader->dir_ = dir;
  const std::filesystem::path index_path = dir / kIndexFile;
  const std::filesystem::path single_path = dir / kSingleFile;

  if (!IsFile(index_path)) {
    if (!IsFile(single_path)) {
      std::error_code ec;
      const bool is_dir = std::filesystem::is_directory(dir, ec);
      return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir.string(),
                                              is_dir ? " has" : " does not exist, so has",
                                              " neither ", kIndexFile, " nor ", kSingleFile));
    }
    TOPHAT_ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsFile> file,
                            SafetensorsFile::Open(single_path));
    for (const auto& [name, info] : file->tensors()) {
      reader->tensor_to_file_.emplace(name, StoredTensor{file.get(), name});
    }
    reader->files_.push_back(std::move(file));
    reader->NameLanguageModel();
    TOPHAT_RETURN_IF_ERROR(reader->NameFusedProjections());
    return reader;
  }

  const std::string index_name = index_path.string();
  TOPHAT_ASSIGN_OR_RETURN(auto weight_map, ReadWeightMap(index_path));
  // Shards are opened once each, however many tensors name them; opening validates every
  // shard header in full before any tensor is handed out.
  std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
  for (const auto& [tensor, shard] : weight_map) {
    if (shards.contains(shard)) continue;
    absl::StatusOr<std::shared_ptr<SafetensorsFile>> file = SafetensorsFile::Open(dir / shard);
    if (!file.ok()) {
      return absl::Status(file.status().code(),
                          absl::StrCat(index_name, ": shard '", shard, "' (holding tensor '",
                                       tensor, "'): ", file.status().message()));
    }
    shards.emplace(shard, *std::move(file));
  }

  // A name in two shards would make the result depend on which one the index happens to
  // point at, so it is refused even when the index is consistent with one of them.
  std::map<std::string_view, const SafetensorsFile*> owner;
  for (const auto& [shard, file] : shards) {
    for (const auto& [name, info] : file->tensors()) {
      auto [it, inserted] = owner.emplace(name, file.get());
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_name, ": tensor '", name, "' appears in both ",
                         it->second->path().string(), " and ", file->path().string()));
      }
    }
  }

  for (const auto& [tensor, shard] : weight_map) {
    const SafetensorsFile* file = shards.at(shard).get();
    if (!file->tensors().contains(tensor)) {
      return absl::NotFoundError(absl::StrCat(index_name, ": tensor '", tensor,
                                              "' is mapped to shard '", shard, "', but ",
                                              file->path().string(), " has no such tensor"));
    }
    reader->tensor_to_file_.emplace(tensor, StoredTensor{file, tensor});
  }
  for (auto& [shard, file] : shards) reader->files_.push_back(std::move(file));
  reader->NameLanguageModel();
  TOPHAT_RETURN_IF_ERROR(reader->NameFusedProjections());
  return reader;
}

const std::vector<FusedProjection>& Phi3FusedProjections() {
  static const std::vector<FusedProjection> fused = {
      {"self_attn.qkv_proj", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}},
      {"mlp.gate_up_proj", {"mlp.gate_proj", "mlp.up_proj"}}};
  return fused;
}

absl::Status CheckpointReader::NameFusedProjections() {
  auto find = [&](std::string_view name) -> const FusedProjection* {
    if (!name.starts_with("model.layers.")) return nullptr;
    for (const FusedProjection& f : Phi3FusedProjections()) {
      for (std::string_view kind : {".weight", ".bias"}) {
        const std::string tail = absl::StrCat(f.stored, Sv(kind));
        if (name.ends_with(tail)) return &f;
      }
    }
    return nullptr;
  };
  if (std::none_of(tensor_to_file_.begin(), tensor_to_file_.end(),
                   [&](const auto& entry) { return find(entry.first) != nullptr; })) {
    return absl::OkStatus();
  }
  const std::filesystem::path config_path = dir_ / "config.json";
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(config_path);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat("checkpoint ", dir_.string(),
                                     " stores fused projections (qkv_proj, gate_up_proj), whose "
                                     "parts' widths its config gives: ",
                                     config.status().message()));
  }
  std::map<std::string, StoredTensor, std::less<>> named;
  for (auto& [name, stored] : tensor_to_file_) {
    const FusedProjection* f = find(name);
    if (f == nullptr) {
      named.emplace(name, std::move(stored));
      continue;
    }
    const std::vector<int64_t> widths =
        f->parts.size() == 3
            ? std::vector<int64_t>{config->q_size(), config->kv_size(), config->kv_size()}
            : std::vector<int64_t>{config->intermediate_size, config->intermediate_size};
    const std::vector<int64_t> shape = ShapeOf(stored);
    int64_t total = 0;
    for (int64_t w : widths) total += w;
    if (shape.empty() || shape[0] != total) {
      return absl::InvalidArgumentError(
          absl::StrCat(stored.file->path().string(), ": tensor '", stored.name, "' has shape ",
                       ShapeString(shape), "; its parts (", absl::StrJoin(f->parts, ", "),
                       ") need ", total, " rows by ", config_path.string()));
    }
    const size_t at = name.rfind(f->stored);
    const std::string prefix = name.substr(0, at);
    const std::string kind = name.substr(at + f->stored.size());  // ".weight" or ".bias"
    int64_t first = 0;
    for (size_t i = 0; i < widths.size(); ++i) {
      StoredTensor part = stored;
      part.first_row = first;
      part.rows = widths[i];
      first += widths[i];
      named.emplace(absl::StrCat(prefix, f->parts[i], kind), std::move(part));
    }
  }
  tensor_to_file_ = std::move(named);
  return absl::OkStatus();
}

std::vector<int64_t> CheckpointReader::ShapeOf(const StoredTensor& stored) {
  std::vector<int64_t> shape = stored.file->tensors().at(stored.name).shape;
  if (stored.rows >= 0 && !shape.empty()) shape[0] = stored.rows;
  return shape;
}

absl::StatusOr<at::Tensor> CheckpointReader::Read(const StoredTensor& stored) {
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor tensor, stored.file->Tensor(stored.name));
  if (stored.rows >= 0) tensor = tensor.narrow(0, stored.first_row, stored.rows);
  return tensor;
}

void CheckpointReader::NameLanguageModel() {
  if (tensor_to_file_.contains("model.embed_tokens.weight")) return;
  struct Layout {
    std::string_view model;  // stored prefix of the text model's `model.`
    std::string_view head;   // and of its `lm_head.`
  };
  for (const Layout layout : {Layout{"language_model.model.", "language_model.lm_head."},
                              Layout{"model.language_model.", "lm_head."}}) {
    if (!tensor_to_file_.contains(std::string(layout.model) + "embed_tokens.weight")) continue;
    std::map<std::string, StoredTensor, std::less<>> renamed;
    for (auto& [name, stored] : tensor_to_file_) {
      std::string logical = name;
      if (name.starts_with(layout.model)) {
        logical = "model." + name.substr(layout.model.size());
      } else if (name.starts_with(layout.head)) {
        logical = "lm_head." + name.substr(layout.head.size());
      }
      renamed.emplace(std::move(logical), std::move(stored));
    }
    tensor_to_file_ = std::move(renamed);
    return;
  }
}

bool CheckpointReader::Has(std::string_view name) const {
  return tensor_to_file_.find(name) != tensor_to_file_.end();
}

std::vector<std::string> CheckpointReader::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensor_to_file_.size());
  for (const auto& [name, stored] : tensor_to_file_) names.push_back(name);
  return names;
}

absl::StatusOr<std::filesystem::path> CheckpointReader::FileOf(std::string_view name) const {
  auto it = tensor_to_file_.find(name);
  if (it == tensor_to_file_.end()) {
    return MissingTensor(dir_, name);
  }
  return it->second.file->path();
}

absl::StatusOr<SafetensorsDType> CheckpointReader::StoredDType(std::string_view name) const {
  auto it = tensor_to_file_.find(name);
  if (it == tensor_to_file_.end()) {
    return MissingTensor(dir_, name);
  }
  return it->second.file->tensors().at(it->second.name).dtype;
}

absl::StatusOr<at::Tensor> CheckpointReader::Load(std::string_view name,
                                                  at::IntArrayRef expected_shape,
                                                  at::ScalarType dtype) const {
  auto it = tensor_to_file_.find(name);
  if (it == tensor_to_file_.end()) {
    return MissingTensor(dir_, name);
  }
  const SafetensorsFile& file = *it->second.file;
  const std::string& stored_name = it->second.name;
  const SafetensorsTensorInfo& info = file.tensors().at(stored_name);
  std::string where = absl::StrCat(file.path().string(), ": tensor '", stored_name, "'");
  if (it->second.rows >= 0) {
    absl::StrAppend(&where, " rows [", it->second.first_row, ", ",
                    it->second.first_row + it->second.rows, ") ('", Sv(name), "')");
  }
  const std::vector<int64_t> shape = ShapeOf(it->second);
  if (at::IntArrayRef(shape) != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has shape ", ShapeString(shape),
                                                   ", expected ", ShapeString(expected_shape)));
  }
  if (info.dtype != SafetensorsDType::kF32 && info.dtype != SafetensorsDType::kF16 &&
      info.dtype != SafetensorsDType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has dtype ", Sv(DTypeName(info.dtype)),
                                                   ", expected a floating type (F32, F16, BF16)"));
  }
  TOPHAT_ASSIGN_OR_RETURN(at::Tensor stored, Read(it->second));
  // to() returns `stored` itself when the dtype already matches, so the result keeps
  // aliasing the read-only mapping; a conversion yields a fresh, writable tensor.
  at::Tensor result;
  TOPHAT_RETURN_IF_ERROR(CatchExceptions(where, [&] { result = stored.to(dtype); }));
  return result;
}

absl::StatusOr<at::Tensor> CheckpointReader::LoadAsStored(std::string_view name) const {
  auto it = tensor_to_file_.find(name);
  if (it == tensor_to_file_.end()) return MissingTensor(dir_, name);
  return Read(it->second);
}

}  // namespace tophat
