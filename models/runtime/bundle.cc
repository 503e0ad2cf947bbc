#include "models/runtime/bundle.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <map>

#include <openssl/evp.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "kernels/gemv_int8.h"
#include "models/formats/checkpoint.h"
#include "models/formats/safetensors.h"
#include "base/status_macros.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Files a checkpoint directory may carry besides weights that belong with the tokenizer.
constexpr const char* kTokenizerFiles[] = {"tokenizer.model", "tokenizer.json",
                                           "tokenizer_config.json", "special_tokens_map.json",
                                           "generation_config.json"};

std::string_view KindName(BundleKind kind) {
  switch (kind) {
    case BundleKind::kDevice:
      return "device";
    case BundleKind::kCloud:
      return "cloud";
  }
  return "unknown";
}

json RangeJson(const LayerRange& r) { return json::array({r.begin, r.end}); }

absl::StatusOr<LayerRange> ParseRange(const json& j, const std::string& source, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() ||
      !(*it)[1].is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key '", key, "' must be [begin, end] layer indices"));
  }
  LayerRange r{(*it)[0].get<int64_t>(), (*it)[1].get<int64_t>()};
  if (r.begin < 0 || r.end < r.begin) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key '", key, "' is not a range"));
  }
  return r;
}

// The layer index of "model.layers.N.<...>", or -1 for tensors outside the decoder layers.
int64_t LayerOf(const std::string& name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  int64_t layer = -1;
  const char* begin = name.data() + kPrefix.size();
  auto [end, ec] = std::from_chars(begin, name.data() + name.size(), layer);
  if (ec != std::errc() || *end != '.') return -1;
  return layer;
}

absl::Status CopyFile(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot copy ", from.string(), " to ", to.string(),
                                            ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteManifest(const fs::path& dir, const BundleManifest& manifest) {
  std::ofstream out(dir / kBundleManifestFile);
  out << manifest.ToJson().dump(2) << "\n";
  if (!out) {
    return absl::InternalError(absl::StrCat((dir / kBundleManifestFile).string(), ": write failed"));
  }
  return absl::OkStatus();
}

// The weight matrices a device bundle stores as int8: every 2-D "*.weight" (the layers'
// projections, the embedding, the LM head); norms and biases stay as they are.
bool IsWeightMatrix(const std::string& name, const at::Tensor& tensor) {
  return tensor.dim() == 2 && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

// Each weight matrix of `tensors` as int8 values under its name and a float32 scale per row
// under "<name>_scale" (kernels/gemv_int8.h).
absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> QuantizeWeightMatrices(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& entry : tensors) {
    // Not a structured binding: Clang 14 cannot capture one in the lambda below.
    const std::string& name = entry.first;
    const at::Tensor& tensor = entry.second;
    if (!IsWeightMatrix(name, tensor)) {
      out.emplace_back(name, tensor);
      continue;
    }
    kernels::Int8Matrix quantized;
    TOPHAT_RETURN_IF_ERROR(CatchExceptions(absl::StrCat("split: quantizing '", name, "'"), [&] {
      quantized = kernels::QuantizeInt8PerRow(tensor);
    }));
    out.emplace_back(name, quantized.values);
    out.emplace_back(name + "_scale", quantized.scale);
  }
  return out;
}

absl::Status CheckRangesChain(const BundleManifest& m, const std::string& source) {
  if (m.input_layers.begin != 0 || m.input_layers.end != m.middle_layers.begin ||
      m.middle_layers.end != m.output_layers.begin ||
      m.output_layers.end != m.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": layer ranges input [", m.input_layers.begin, ", ", m.input_layers.end,
        "), middle [", m.middle_layers.begin, ", ", m.middle_layers.end, "), output [",
        m.output_layers.begin, ", ", m.output_layers.end, ") do not tile the model's ",
        m.num_hidden_layers, " layers"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> LoadBundleConfig(const fs::path& dir, const BundleManifest& manifest) {
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir / "config.json"));
  if (config.num_hidden_layers != manifest.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        (dir / kBundleManifestFile).string(), ": manifest says ", manifest.num_hidden_layers,
        " layers but config.json says ", config.num_hidden_layers));
  }
  return config;
}

json BundleManifest::ToJson() const {
  json j = {{"format", "tophat-bundle"},
          {"format_version", kFormatVersion},
          {"kind", std::string(KindName(kind))},
          {"source_model", source_model},
          {"source_architecture", source_architecture},
          {"num_hidden_layers", num_hidden_layers},
          {"input_layers", RangeJson(input_layers)},
          {"middle_layers", RangeJson(middle_layers)},
          {"output_layers", RangeJson(output_layers)},
          {"dtype", dtype},
          {"model_fingerprint", model_fingerprint},
          {"files", files}};
  if (adapter) j["adapter"] = adapter->ToJson();
  if (!weights.empty()) j["weights"] = weights;
  return j;
}

absl::StatusOr<BundleManifest> BundleManifest::FromJson(const json& j, const std::string& source) {
  if (!j.is_object() || j.value("format", "") != "tophat-bundle") {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a tophat bundle manifest (key 'format' must be "
                             "\"tophat-bundle\")"));
  }
  const auto version = j.value("format_version", -1);
  if (version != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key 'format_version' is ", version,
                                                   "; this build reads version ",
                                                   kFormatVersion));
  }
  BundleManifest m;
  const std::string kind = j.value("kind", "");
  if (kind == "device") {
    m.kind = BundleKind::kDevice;
  } else if (kind == "cloud") {
    m.kind = BundleKind::kCloud;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key 'kind' must be \"device\" or \"cloud\", got \"", kind, "\""));
  }
  m.source_model = j.value("source_model", "");
  m.source_architecture = j.value("source_architecture", "");
  m.num_hidden_layers = j.value("num_hidden_layers", int64_t{0});
  m.dtype = j.value("dtype", "");
  m.weights = j.value("weights", "");
  if (!m.weights.empty() && m.weights != "int8") {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": key 'weights' is \"", m.weights, "\"; this build reads \"int8\" or none"));
  }
  m.model_fingerprint = j.value("model_fingerprint", "");
  TOPHAT_ASSIGN_OR_RETURN(m.input_layers, ParseRange(j, source, "input_layers"));
  TOPHAT_ASSIGN_OR_RETURN(m.middle_layers, ParseRange(j, source, "middle_layers"));
  TOPHAT_ASSIGN_OR_RETURN(m.output_layers, ParseRange(j, source, "output_layers"));
  if (auto f = j.find("files"); f != j.end() && f->is_array()) {
    for (const auto& name : *f) {
      if (name.is_string()) m.files.push_back(name.get<std::string>());
    }
  }
  if (auto a = j.find("adapter"); a != j.end() && !a->is_null()) {
    TOPHAT_ASSIGN_OR_RETURN(m.adapter, AdapterInfo::FromJson(*a, absl::StrCat(source, ": adapter")));
  }
  TOPHAT_RETURN_IF_ERROR(CheckRangesChain(m, source));
  return m;
}

absl::StatusOr<BundleManifest> BundleManifest::Load(const fs::path& bundle_dir) {
  const fs::path path = bundle_dir / kBundleManifestFile;
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        path.string(), ": cannot open bundle manifest (is this a directory made by tophat split?)"));
  }
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not valid JSON"));
  // A key of the wrong type ("kind": 3) throws from nlohmann's value(): an error naming the
  // file, not a daemon that dies at start.
  try {
    return FromJson(j, path.string());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", e.what()));
  }
}

namespace {

// SHA-256 (OpenSSL's EVP) over what identifies a checkpoint's weights.
class Fingerprint {
 public:
  Fingerprint() : context_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(context_, EVP_sha256(), nullptr); }
  ~Fingerprint() { EVP_MD_CTX_free(context_); }
  Fingerprint(const Fingerprint&) = delete;
  Fingerprint& operator=(const Fingerprint&) = delete;

  absl::Status AddFile(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in && !in.eof()) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot read"));
    Add(bytes);
    return absl::OkStatus();
  }
  void AddTensor(const std::string& name, const at::Tensor& tensor) {
    Add(name);
    Add(TorchDtypeName(tensor.scalar_type()));
    for (int64_t size : tensor.sizes()) Add(std::to_string(size));
    const at::Tensor bytes = tensor.contiguous();
    EVP_DigestUpdate(context_, bytes.data_ptr(), bytes.nbytes());
  }
  absl::StatusOr<std::string> Finish() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    if (EVP_DigestFinal_ex(context_, digest, &length) != 1) {
      return absl::InternalError("split: computing the model fingerprint failed");
    }
    return absl::StrCat("sha256:", absl::BytesToHexString(absl::string_view(
                                       reinterpret_cast<const char*>(digest), length)));
  }

 private:
  // Each part is length-prefixed, so that no two sequences of parts hash alike.
  void Add(absl::string_view part) {
    const uint64_t length = part.size();
    EVP_DigestUpdate(context_, &length, sizeof(length));
    EVP_DigestUpdate(context_, part.data(), part.size());
  }
  EVP_MD_CTX* context_;
};

}  // namespace

absl::StatusOr<SplitResult> SplitCheckpoint(const SplitOptions& options) {
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig config,
                          ModelConfig::Load(options.model_dir / "config.json"));
  const int64_t layers = config.num_hidden_layers;
  const int64_t m = options.input_layers;
  const int64_t k = options.output_layers;
  if (m < 1 || k < 0 || m + k >= layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split: need --input-layers >= 1, --output-layers >= 0 and input + output < ", layers,
        " (the model's layers) so that the cloud holds at least one layer; got m = ", m,
        ", k = ", k));
  }
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> checkpoint,
                          CheckpointReader::Open(options.model_dir));

  SplitResult result;
  BundleManifest base;
  base.source_model = fs::absolute(options.model_dir).lexically_normal().string();
  base.source_architecture = std::string(ArchitectureName(config.architecture));
  base.num_hidden_layers = layers;
  base.input_layers = {0, m};
  base.middle_layers = {m, layers - k};
  base.output_layers = {layers - k, layers};

  std::vector<std::pair<std::string, at::Tensor>> device_tensors;
  std::vector<std::pair<std::string, at::Tensor>> cloud_tensors;
  std::map<std::string, int> dtypes;
  Fingerprint fingerprint;
  TOPHAT_RETURN_IF_ERROR(fingerprint.AddFile(options.model_dir / "config.json"));
  std::vector<std::string> names = checkpoint->TensorNames();
  std::sort(names.begin(), names.end());  // the fingerprint must not depend on file order
  for (const std::string& name : names) {
    const int64_t layer = LayerOf(name);
    std::vector<std::pair<std::string, at::Tensor>>* target = nullptr;
    if (layer >= 0) {
      target = (layer >= m && layer < layers - k) ? &cloud_tensors : &device_tensors;
    } else if (name.rfind("model.embed_tokens.", 0) == 0 || name.rfind("model.norm.", 0) == 0 ||
               name.rfind("lm_head.", 0) == 0) {
      target = &device_tensors;
    } else {
      // E.g. stale rotary buffers some exporters write; nothing here reads them.
      continue;
    }
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor tensor, checkpoint->LoadAsStored(name));
    ++dtypes[TorchDtypeName(tensor.scalar_type())];
    fingerprint.AddTensor(name, tensor);
    target->emplace_back(name, tensor);
  }
  base.dtype = dtypes.size() == 1 ? dtypes.begin()->first : std::string("mixed");
  TOPHAT_ASSIGN_OR_RETURN(base.model_fingerprint, fingerprint.Finish());

  std::optional<AdapterInfo> adapter;
  if (fs::exists(options.model_dir / kAdapterInfoFile)) {
    TOPHAT_ASSIGN_OR_RETURN(AdapterInfo info, AdapterInfo::Load(options.model_dir));
    if (info.input_layers == m) {
      adapter = info;
    } else {
      result.adapter_note = absl::StrCat(
          "the checkpoint's adapter was distilled for --input-layers ", info.input_layers,
          ", not ", m, "; the device bundle has none (run `tophat distill` for this split)");
    }
  }

  const bool int8 = options.device_weights == DeviceWeights::kInt8;
  if (int8) {
    TOPHAT_ASSIGN_OR_RETURN(device_tensors, QuantizeWeightMatrices(device_tensors));
  }

  const fs::path out = options.out_dir;
  for (BundleKind kind : {BundleKind::kDevice, BundleKind::kCloud}) {
    const bool device = kind == BundleKind::kDevice;
    const fs::path dir = out / std::string(KindName(kind));
    const fs::path staging = dir.string() + ".partial";
    std::error_code ec;
    fs::remove_all(staging, ec);
    fs::create_directories(staging, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat(staging.string(), ": cannot create: ", ec.message()));
    }
    BundleManifest manifest = base;
    manifest.kind = kind;
    if (device && int8) manifest.weights = "int8";
    TOPHAT_RETURN_IF_ERROR(CopyFile(options.model_dir / "config.json", staging / "config.json"));
    manifest.files.push_back("config.json");
    TOPHAT_RETURN_IF_ERROR(WriteSafetensors(staging / "model.safetensors",
                                            device ? device_tensors : cloud_tensors,
                                            {{"format", "pt"},
                                             {"tophat_bundle", std::string(KindName(kind))}}));
    manifest.files.push_back("model.safetensors");
    if (device) {
      // Tokenizer files stay on the device: the cloud never needs to map ids to text.
      for (const char* name : kTokenizerFiles) {
        if (fs::exists(options.model_dir / name)) {
          TOPHAT_RETURN_IF_ERROR(CopyFile(options.model_dir / name, staging / name));
          manifest.files.push_back(name);
        }
      }
      if (adapter) {
        if (int8) {
          // The adapter's matrices in int8 too, as the device computes it.
          TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                                  CheckpointReader::OpenFile(options.model_dir / adapter->file));
          std::vector<std::pair<std::string, at::Tensor>> adapter_tensors;
          for (const std::string& name : reader->TensorNames()) {
            TOPHAT_ASSIGN_OR_RETURN(at::Tensor tensor, reader->LoadAsStored(name));
            adapter_tensors.emplace_back(name, tensor);
          }
          TOPHAT_ASSIGN_OR_RETURN(adapter_tensors, QuantizeWeightMatrices(adapter_tensors));
          TOPHAT_RETURN_IF_ERROR(WriteSafetensors(staging / adapter->file, adapter_tensors,
                                                  {{"format", "pt"}}));
        } else {
          TOPHAT_RETURN_IF_ERROR(
              CopyFile(options.model_dir / adapter->file, staging / adapter->file));
        }
        TOPHAT_RETURN_IF_ERROR(
            CopyFile(options.model_dir / kAdapterInfoFile, staging / kAdapterInfoFile));
        manifest.files.push_back(adapter->file);
        manifest.files.push_back(kAdapterInfoFile);
        manifest.adapter = adapter;
      }
    }
    TOPHAT_RETURN_IF_ERROR(WriteManifest(staging, manifest));
    fs::remove_all(dir, ec);
    fs::rename(staging, dir, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot move ", staging.string(), " to ",
                                              dir.string(), ": ", ec.message()));
    }
    (device ? result.device_dir : result.cloud_dir) = dir;
    (device ? result.device : result.cloud) = manifest;
  }
  return result;
}

absl::StatusOr<BundleContents> InspectBundle(const fs::path& dir, BundleKind kind) {
  BundleContents contents;
  TOPHAT_ASSIGN_OR_RETURN(contents.manifest, BundleManifest::Load(dir));
  if (contents.manifest.kind != kind) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir.string(),
        kind == BundleKind::kCloud
            ? ": is a device bundle; the cloud daemon needs the cloud bundle"
            : ": is a cloud bundle; the device agent needs the device bundle"));
  }
  TOPHAT_ASSIGN_OR_RETURN(contents.config, LoadBundleConfig(dir, contents.manifest));
  TOPHAT_ASSIGN_OR_RETURN(contents.checkpoint, CheckpointReader::Open(dir));
  if (kind == BundleKind::kCloud) {
    // The cloud must never hold what maps between tokens and hidden states.
    for (const char* forbidden : {"model.embed_tokens.weight", "lm_head.weight"}) {
      if (contents.checkpoint->Has(forbidden)) {
        return absl::FailedPreconditionError(absl::StrCat(
            dir.string(), ": cloud bundle holds '", forbidden,
            "'; a cloud bundle must not contain the embedding or the LM head"));
      }
    }
  }
  return contents;
}

absl::StatusOr<DeviceBundle> DeviceBundle::Load(const fs::path& dir,
                                                const SubmodelOptions& requested) {
  DeviceBundle bundle;
  TOPHAT_ASSIGN_OR_RETURN(BundleContents contents, InspectBundle(dir, BundleKind::kDevice));
  bundle.manifest = std::move(contents.manifest);
  bundle.config = std::move(contents.config);
  const std::unique_ptr<CheckpointReader> checkpoint = std::move(contents.checkpoint);
  // An int8 bundle's matrices are int8 on disk; an adapter distilled into it afterwards is
  // float, and is quantized as it loads, so that the whole device computes one way.
  SubmodelOptions options = requested;
  if (bundle.manifest.weights == "int8") options.quantize_int8 = true;
  // The head first: with tied embeddings the input submodel then shares its table (on huge
  // pages, which the head's decode reads want) instead of holding a second copy.
  TOPHAT_ASSIGN_OR_RETURN(
      bundle.output, Submodel::Load(bundle.config, *checkpoint,
                                    {.layers = bundle.manifest.output_layers, .head = true},
                                    options));
  TOPHAT_ASSIGN_OR_RETURN(
      bundle.input,
      Submodel::Load(bundle.config, *checkpoint,
                     {.embedding = true, .layers = bundle.manifest.input_layers}, options,
                     bundle.config.tie_word_embeddings ? bundle.output.get() : nullptr));
  if (bundle.manifest.adapter) {
    TOPHAT_ASSIGN_OR_RETURN(bundle.adapter,
                            LoadAdapter(dir, bundle.config, *bundle.manifest.adapter,
                                        bundle.manifest.input_layers.end, options));
  }
  TOPHAT_ASSIGN_OR_RETURN(bundle.tokenizer, Tokenizer::Load(dir));
  return bundle;
}

absl::StatusOr<CloudBundle> CloudBundle::Load(const fs::path& dir, const SubmodelOptions& options,
                                              std::optional<LayerRange> layers) {
  CloudBundle bundle;
  TOPHAT_ASSIGN_OR_RETURN(BundleContents contents, InspectBundle(dir, BundleKind::kCloud));
  bundle.manifest = std::move(contents.manifest);
  bundle.config = std::move(contents.config);
  const std::unique_ptr<CheckpointReader> checkpoint = std::move(contents.checkpoint);
  const LayerRange middle = bundle.manifest.middle_layers;
  if (layers && (layers->begin < middle.begin || layers->end > middle.end ||
                 layers->begin >= layers->end)) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir.string(), ": layers [", layers->begin, ", ", layers->end,
        ") are not a part of this bundle's middle [", middle.begin, ", ", middle.end, ")"));
  }
  TOPHAT_ASSIGN_OR_RETURN(bundle.middle,
                          Submodel::Load(bundle.config, *checkpoint,
                                         {.layers = layers.value_or(middle)}, options));
  return bundle;
}

absl::Status AttachAdapterToBundle(const fs::path& dir) {
  TOPHAT_ASSIGN_OR_RETURN(BundleManifest manifest, BundleManifest::Load(dir));
  if (manifest.kind != BundleKind::kDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir.string(), ": an adapter belongs in a device bundle, this is a cloud bundle"));
  }
  TOPHAT_ASSIGN_OR_RETURN(AdapterInfo info, AdapterInfo::Load(dir));
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig config, LoadBundleConfig(dir, manifest));
  TOPHAT_RETURN_IF_ERROR(
      LoadAdapter(dir, config, info, manifest.input_layers.end, {.huge_pages = false}).status());
  for (const std::string& name : {info.file, std::string(kAdapterInfoFile)}) {
    if (std::find(manifest.files.begin(), manifest.files.end(), name) == manifest.files.end()) {
      manifest.files.push_back(name);
    }
  }
  manifest.adapter = info;
  return WriteManifest(dir, manifest);
}

}  // namespace tophat
