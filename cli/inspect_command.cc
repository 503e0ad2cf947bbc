#include "cli/inspect_command.h"

#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "models/formats/checkpoint.h"
#include "models/formats/config.h"
#include "models/runtime/submodel.h"
#include "models/tokenizers/chat_template.h"
#include "models/tokenizers/tokenizer.h"

namespace tophat::cli {

namespace {

using json = nlohmann::json;

// The decoder layer a tensor belongs to ("model.layers.12.mlp.up_proj.weight": 12), or none.
std::optional<int64_t> LayerOf(std::string_view name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  int64_t layer = 0;
  size_t digits = 0;
  while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') {
    layer = layer * 10 + (name[digits] - '0');
    ++digits;
  }
  if (digits == 0 || digits == name.size() || name[digits] != '.') return std::nullopt;
  return layer;
}

std::string_view ThinkingName(ThinkingStyle style) {
  switch (style) {
    case ThinkingStyle::kNone:
      return "none";
    case ThinkingStyle::kSwitch:
      return "switched by enable_thinking";
    case ThinkingStyle::kOpened:
      return "opened by the prompt";
    case ThinkingStyle::kAlways:
      return "always";
  }
  return "none";
}

json RopeJson(const ModelConfig& c) {
  json rope = {{"theta", c.rope_theta}, {"rotary_dim", c.rotary_dim()}};
  if (c.rope_scaling.llama3) {
    rope["scaling"] = "llama3";
    rope["factor"] = c.rope_scaling.factor;
  } else if (c.rope_scaling.linear) {
    rope["scaling"] = "linear";
    rope["factor"] = c.rope_scaling.factor;
  } else if (c.rope_scaling.longrope) {
    rope["scaling"] = "longrope";
    rope["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
  } else if (c.rope_scaling.yarn) {
    rope["scaling"] = "yarn";
    rope["factor"] = c.rope_scaling.factor;
    rope["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
  }
  if (c.rope_local_theta) rope["local_theta"] = *c.rope_local_theta;
  return rope;
}

std::string Bytes(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  if (bytes >= 1e3) return absl::StrFormat("%.1f KB", bytes / 1e3);
  return absl::StrFormat("%.0f B", bytes);
}

std::string Count(double n) {
  if (n >= 1e9) return absl::StrFormat("%.2fB", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.1fM", n / 1e6);
  return absl::StrFormat("%.0f", n);
}

}  // namespace

absl::StatusOr<json> InspectCheckpoint(const InspectArgs& args) {
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(args.model / "config.json"));
  const int64_t layers = config.num_hidden_layers;
  const int64_t m = args.input_layers;
  const int64_t k = args.output_layers;
  if (m < 1 || k < 0 || m + k >= layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("-m ", m, " -k ", k, ": a split needs m >= 1, k >= 0 and m + k below the ",
                     layers, " layers, so that the cloud holds at least one"));
  }
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                          CheckpointReader::Open(args.model));

  json out;
  out["model"] = args.model.string();
  out["architecture"] = std::string(ArchitectureName(config.architecture));
  out["layers"] = layers;
  out["hidden_size"] = config.hidden_size;
  out["intermediate_size"] = config.intermediate_size;
  out["attention_heads"] = config.num_attention_heads;
  out["kv_heads"] = config.num_key_value_heads;
  out["head_dim"] = config.head_dim;
  out["vocab_size"] = config.vocab_size;
  out["tied_embeddings"] = config.tie_word_embeddings;
  out["max_position_embeddings"] = config.max_position_embeddings;
  out["rope"] = RopeJson(config);
  out["attention_scale"] = config.attention_scale();
  std::vector<int64_t> sliding;
  for (int64_t i = 0; i < layers; ++i) {
    if (config.LayerWindow(i)) sliding.push_back(i);
  }
  out["sliding_window"] = config.sliding_window ? json(*config.sliding_window) : json(nullptr);
  out["sliding_layers"] = sliding;
  out["attention_sinks"] = config.gpt_oss();
  out["attn_logit_softcapping"] = config.attn_logit_softcapping;
  out["final_logit_softcapping"] = config.final_logit_softcapping;
  if (config.num_experts > 0) {
    std::vector<int64_t> sparse;
    for (int64_t i = 0; i < layers; ++i) {
      if (config.MoeLayer(i)) sparse.push_back(i);
    }
    out["experts"] = {
        {"count", config.num_experts},
        {"per_token", config.num_experts_per_token},
        {"intermediate_size", config.moe_intermediate_size},
        {"renormalized", config.normalize_expert_weights},
        {"shared_expert_intermediate_size", config.shared_expert_intermediate_size},
        {"stored", config.gpt_oss() ? (config.mxfp4_experts ? "fused, mxfp4" : "fused")
                                    : "one tensor a matrix"},
        {"sparse_layers", sparse}};
  }

  // The weights as stored, and where a split (m, k) puts each: the device holds the
  // embedding, layers [0, m) and [L - k, L), the final norm and the head; the cloud the rest.
  std::map<std::string, int64_t> dtypes;  // stored dtype: bytes
  int64_t parameters = 0;
  int64_t device_bytes = 0;
  int64_t cloud_bytes = 0;
  int64_t unread_bytes = 0;  // a multimodal checkpoint's vision tower
  std::set<std::string> files;
  for (const std::string& name : reader->TensorNames()) {
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor stored, reader->LoadAsStored(name));
    TOPHAT_ASSIGN_OR_RETURN(SafetensorsDType dtype, reader->StoredDType(name));
    TOPHAT_ASSIGN_OR_RETURN(std::filesystem::path file, reader->FileOf(name));
    files.insert(file.filename().string());
    const int64_t bytes = stored.numel() * DTypeSize(dtype);
    dtypes[std::string(DTypeName(dtype))] += bytes;
    const std::optional<int64_t> layer = LayerOf(name);
    // MXFP4 (gpt-oss's experts): two values a byte of "_blocks", and "_scales" are no
    // parameters of their own.
    const int64_t values = dtype != SafetensorsDType::kU8 ? stored.numel()
                           : name.ends_with("_blocks")    ? 2 * stored.numel()
                                                          : 0;
    if (layer) {
      parameters += values;
      (*layer < m || *layer >= layers - k ? device_bytes : cloud_bytes) += bytes;
    } else if (name.starts_with("model.") || name.starts_with("lm_head.")) {
      parameters += values;
      device_bytes += bytes;
    } else {
      unread_bytes += bytes;
    }
  }
  out["files"] = std::vector<std::string>(files.begin(), files.end());
  out["stored_bytes_by_dtype"] = dtypes;
  out["parameters"] = parameters;
  // Float32 KV: 2 (key and value) x KV heads x head_dim values a layer and token.
  const int64_t kv_layer = 2 * config.num_key_value_heads * config.head_dim * 4;
  out["split"] = {{"m", m},
                  {"k", k},
                  {"device_bytes", device_bytes},
                  {"cloud_bytes", cloud_bytes},
                  {"device_kv_bytes_per_token_float32", (m + k) * kv_layer},
                  {"cloud_kv_bytes_per_token_float32", (layers - m - k) * kv_layer}};
  if (unread_bytes > 0) out["unread_bytes"] = unread_bytes;

  const absl::Status gpu = Submodel::ArchitectureRunsOn(config, at::Device(at::kCUDA, 0));
  out["gpu_cloud"] = gpu.ok() ? json("yes") : json(std::string(gpu.message()));

  // A tokenizer or template tophat cannot read stops serving only what needs it.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(args.model);
  if (tokenizer.ok()) {
    out["tokenizer"] = {{"vocab_size", (*tokenizer)->vocab_size()}};
  } else {
    out["tokenizer"] = {{"error", std::string(tokenizer.status().message())}};
  }
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::Load(args.model);
  if (chat.ok()) {
    out["chat_template"] = {{"family", std::string(ChatFamilyName(chat->family()))},
                            {"turn_ends", chat->turn_ends()},
                            {"tools", chat->takes_tools()},
                            {"thinking", std::string(ThinkingName(chat->thinking()))}};
  } else {
    out["chat_template"] = {{"error", std::string(chat.status().message())}};
  }
  return out;
}

std::string FormatInspection(const json& in) {
  std::string out;
  auto line = [&out](std::string_view key, const std::string& value) {
    absl::StrAppend(&out, absl::StrFormat("%-15s %s\n", key, value));
  };
  std::vector<std::string> stored;
  for (const auto& [dtype, bytes] : in["stored_bytes_by_dtype"].items()) {
    stored.push_back(absl::StrCat(dtype, " ", Bytes(bytes.get<double>())));
  }
  line("checkpoint", absl::StrCat(in["model"].get<std::string>(), ": ", in["files"].size(),
                                  " file(s), ", absl::StrJoin(stored, ", "), ", ",
                                  Count(in["parameters"].get<double>()), " parameters"));
  line("architecture",
       absl::StrCat(in["architecture"].get<std::string>(), ": ", in["layers"].get<int64_t>(),
                    " layers, hidden ", in["hidden_size"].get<int64_t>(), ", ",
                    in["attention_heads"].get<int64_t>(), " query heads and ",
                    in["kv_heads"].get<int64_t>(), " KV heads of ", in["head_dim"].get<int64_t>(),
                    ", MLP ", in["intermediate_size"].get<int64_t>(), ", vocabulary ",
                    in["vocab_size"].get<int64_t>(),
                    in["tied_embeddings"].get<bool>() ? " (tied)" : ""));
  std::string attention =
      absl::StrFormat("scores scaled by %.6g", in["attention_scale"].get<double>());
  const auto& sliding = in["sliding_layers"];
  if (!sliding.empty()) {
    absl::StrAppend(&attention, "; ", sliding.size(), " of ", in["layers"].get<int64_t>(),
                    " layers slide over ", in["sliding_window"].get<int64_t>(), " positions");
  }
  if (in.value("attention_sinks", false)) absl::StrAppend(&attention, "; a sink logit per head");
  if (const double cap = in["attn_logit_softcapping"].get<double>(); cap > 0) {
    absl::StrAppend(&attention, absl::StrFormat("; scores soft-capped at %g", cap));
  }
  if (const double cap = in["final_logit_softcapping"].get<double>(); cap > 0) {
    absl::StrAppend(&attention, absl::StrFormat("; logits soft-capped at %g", cap));
  }
  line("attention", attention);
  if (in.contains("experts")) {
    const json& experts = in["experts"];
    line("experts",
         absl::StrCat(experts["count"].get<int64_t>(), " of MLP ",
                      experts["intermediate_size"].get<int64_t>(), ", ",
                      experts["per_token"].get<int64_t>(), " a token",
                      experts["renormalized"].get<bool>() ? " (their weights renormalised)" : "",
                      experts["shared_expert_intermediate_size"].get<int64_t>() > 0
                          ? absl::StrCat(", and a shared expert of MLP ",
                                         experts["shared_expert_intermediate_size"].get<int64_t>())
                          : "",
                      ", in ", experts["sparse_layers"].size(), " of ", in["layers"].get<int64_t>(),
                      " layers",
                      experts.value("stored", "") == "one tensor a matrix"
                          ? ""
                          : absl::StrCat("; stored ", experts.value("stored", ""))));
  }
  const json& rope = in["rope"];
  std::string rotary =
      absl::StrFormat("theta %g, %d of each head's %d dimensions", rope["theta"].get<double>(),
                      rope["rotary_dim"].get<int64_t>(), in["head_dim"].get<int64_t>());
  if (rope.contains("scaling")) {
    absl::StrAppend(&rotary, ", ", rope["scaling"].get<std::string>(), " scaling");
  }
  if (rope.contains("local_theta")) {
    absl::StrAppend(
        &rotary, absl::StrFormat(", sliding layers' theta %g", rope["local_theta"].get<double>()));
  }
  line("rotary", absl::StrCat(rotary, "; context ", in["max_position_embeddings"].get<int64_t>()));
  const json& tokenizer = in["tokenizer"];
  line("tokenizer", tokenizer.contains("error")
                        ? absl::StrCat("not served: ", tokenizer["error"].get<std::string>())
                        : absl::StrCat(tokenizer["vocab_size"].get<int64_t>(), " tokens"));
  const json& chat = in["chat_template"];
  if (chat.contains("error")) {
    line("chat template", absl::StrCat("chat refused: ", chat["error"].get<std::string>()));
  } else {
    line("chat template",
         absl::StrCat(chat["family"].get<std::string>(), " (end of turn ",
                      chat["turn_ends"].empty()
                          ? "the EOS token"
                          : absl::StrJoin(chat["turn_ends"].get<std::vector<std::string>>(), " or "),
                      "; tools ", chat["tools"].get<bool>() ? "yes" : "no", "; thinking ",
                      chat["thinking"].get<std::string>(), ")"));
  }
  line("GPU cloud", in["gpu_cloud"].get<std::string>());
  const json& split = in["split"];
  line(absl::StrCat("split m=", split["m"].get<int64_t>(), " k=", split["k"].get<int64_t>()),
       absl::StrCat("device ", Bytes(split["device_bytes"].get<double>()), " of weights and ",
                    Bytes(split["device_kv_bytes_per_token_float32"].get<double>()),
                    " of float32 KV a position; cloud ", Bytes(split["cloud_bytes"].get<double>()),
                    " and ", Bytes(split["cloud_kv_bytes_per_token_float32"].get<double>())));
  if (in.contains("unread_bytes")) {
    line("not read", absl::StrCat(Bytes(in["unread_bytes"].get<double>()),
                                  " of other tensors (a vision tower): text only"));
  }
  return out;
}

int RunInspect(const InspectArgs& args) {
  absl::StatusOr<json> inspection = InspectCheckpoint(args);
  if (!inspection.ok()) {
    std::cerr << "tophat inspect: " << inspection.status().message() << "\n";
    return 1;
  }
  if (args.json) {
    std::cout << inspection->dump(1) << "\n";
  } else {
    std::cout << FormatInspection(*inspection);
  }
  return 0;
}

}  // namespace tophat::cli
