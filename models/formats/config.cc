#include "models/formats/config.h"

#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace tophat {
namespace {

using json = nlohmann::json;

std::string Where(const std::string& source, const std::string& key) {
  return absl::StrCat(source, ": key '", key, "'");
}

absl::StatusOr<int64_t> GetInt(const json& j, const std::string& source, const char* key,
                               std::optional<int64_t> fallback, int64_t min_value) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(Where(source, key), " is required"));
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, key), " must be an integer, got ", it->dump()));
  }
  int64_t value = it->get<int64_t>();
  if (value < min_value) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, key), " must be >= ", min_value, ", got ", value));
  }
  return value;
}

absl::StatusOr<double> GetDouble(const json& j, const std::string& source, const char* key,
                                 double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, key), " must be a number, got ", it->dump()));
  }
  return it->get<double>();
}

absl::StatusOr<bool> GetBool(const json& j, const std::string& source, const char* key,
                             bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, key), " must be true or false, got ", it->dump()));
  }
  return it->get<bool>();
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const json& j, const std::string& source) {
  RopeScaling scaling;
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return scaling;
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "rope_scaling"), " must be an object or null"));
  }
  std::string type;
  // Older checkpoints spell it "type", newer ones "rope_type".
  for (const char* key : {"rope_type", "type"}) {
    if (auto t = it->find(key); t != it->end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "default") return scaling;
  if (type != "llama3") {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "rope_scaling.rope_type"), " '", type,
                     "' is not supported (supported: llama3, default)"));
  }
  scaling.llama3 = true;
  const std::string scoped = absl::StrCat(source, " rope_scaling");
  TOPHAT_ASSIGN_OR_RETURN(scaling.factor, GetDouble(*it, scoped, "factor", 8.0));
  TOPHAT_ASSIGN_OR_RETURN(scaling.low_freq_factor, GetDouble(*it, scoped, "low_freq_factor", 1.0));
  TOPHAT_ASSIGN_OR_RETURN(scaling.high_freq_factor,
                          GetDouble(*it, scoped, "high_freq_factor", 4.0));
  TOPHAT_ASSIGN_OR_RETURN(
      scaling.original_max_position_embeddings,
      GetInt(*it, scoped, "original_max_position_embeddings", int64_t{8192}, 1));
  if (scaling.factor <= 0 || scaling.high_freq_factor <= scaling.low_freq_factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, "rope_scaling"),
        ": need factor > 0 and high_freq_factor > low_freq_factor"));
  }
  return scaling;
}

absl::StatusOr<std::vector<int64_t>> ParseTokenIds(const json& j, const std::string& source,
                                                   const char* key) {
  std::vector<int64_t> ids;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ids;
  if (it->is_number_integer()) {
    ids.push_back(it->get<int64_t>());
    return ids;
  }
  if (it->is_array()) {
    for (const auto& v : *it) {
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(source, key), " must hold integers, got ", v.dump()));
      }
      ids.push_back(v.get<int64_t>());
    }
    return ids;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(Where(source, key), " must be an integer or a list of integers"));
}

}  // namespace

std::string_view ArchitectureName(Architecture architecture) {
  switch (architecture) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
  }
  return "unknown";
}

std::string TorchDtypeName(at::ScalarType dtype) {
  if (dtype == at::kFloat) return "float32";
  if (dtype == at::kHalf) return "float16";
  if (dtype == at::kBFloat16) return "bfloat16";
  return c10::toString(dtype);
}

absl::StatusOr<at::ScalarType> ParseTorchDtypeName(std::string_view name, std::string_view key) {
  if (name == "float32") return at::kFloat;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  return absl::InvalidArgumentError(absl::StrCat(std::string(key), ": unknown dtype \"",
                                                 std::string(name),
                                                 "\" (float32, float16 or bfloat16)"));
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const json& j, const std::string& source) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": must hold a JSON object"));
  }
  ModelConfig c;
  auto arch = j.find("architectures");
  if (arch == j.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, "architectures"), " must be a non-empty list of architecture names"));
  }
  const std::string name = (*arch)[0].get<std::string>();
  if (name == "LlamaForCausalLM") {
    c.architecture = Architecture::kLlama;
  } else if (name == "MistralForCausalLM") {
    c.architecture = Architecture::kMistral;
  } else if (name == "Qwen2ForCausalLM") {
    c.architecture = Architecture::kQwen2;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, "architectures"), ": architecture '", name,
        "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
        "Qwen2ForCausalLM)"));
  }

  TOPHAT_ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, source, "vocab_size", std::nullopt, 1));
  TOPHAT_ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, source, "hidden_size", std::nullopt, 1));
  TOPHAT_ASSIGN_OR_RETURN(c.intermediate_size,
                          GetInt(j, source, "intermediate_size", std::nullopt, 1));
  TOPHAT_ASSIGN_OR_RETURN(c.num_hidden_layers,
                          GetInt(j, source, "num_hidden_layers", std::nullopt, 1));
  TOPHAT_ASSIGN_OR_RETURN(c.num_attention_heads,
                          GetInt(j, source, "num_attention_heads", std::nullopt, 1));
  TOPHAT_ASSIGN_OR_RETURN(c.num_key_value_heads,
                          GetInt(j, source, "num_key_value_heads", c.num_attention_heads, 1));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, "num_key_value_heads"), " (", c.num_key_value_heads,
        ") must divide num_attention_heads (", c.num_attention_heads, ")"));
  }
  const bool head_dim_given = j.contains("head_dim") && !j["head_dim"].is_null();
  if (!head_dim_given && c.hidden_size % c.num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, "hidden_size"), " (", c.hidden_size,
        ") is not divisible by num_attention_heads and no head_dim is given"));
  }
  TOPHAT_ASSIGN_OR_RETURN(
      c.head_dim, GetInt(j, source, "head_dim", c.hidden_size / c.num_attention_heads, 2));
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "head_dim"), " must be even for rotary embeddings"));
  }
  TOPHAT_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          GetInt(j, source, "max_position_embeddings", int64_t{2048}, 1));
  TOPHAT_ASSIGN_OR_RETURN(c.rope_theta, GetDouble(j, source, "rope_theta", 10000.0));
  if (c.rope_theta <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(Where(source, "rope_theta"), " must be > 0"));
  }
  TOPHAT_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j, source));
  TOPHAT_ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, source, "rms_norm_eps", 1e-6));
  if (c.rms_norm_eps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "rms_norm_eps"), " must be > 0"));
  }
  TOPHAT_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                          GetBool(j, source, "tie_word_embeddings", false));
  TOPHAT_ASSIGN_OR_RETURN(
      c.attention_bias,
      GetBool(j, source, "attention_bias", c.architecture == Architecture::kQwen2));
  if (c.architecture == Architecture::kQwen2) c.attention_bias = true;

  if (c.architecture == Architecture::kMistral ||
      (c.architecture == Architecture::kQwen2 && j.value("use_sliding_window", false))) {
    if (auto sw = j.find("sliding_window"); sw != j.end() && !sw->is_null()) {
      TOPHAT_ASSIGN_OR_RETURN(c.sliding_window,
                              GetInt(j, source, "sliding_window", std::nullopt, 1));
    }
  }
  TOPHAT_ASSIGN_OR_RETURN(std::vector<int64_t> bos, ParseTokenIds(j, source, "bos_token_id"));
  if (!bos.empty()) c.bos_token_id = bos.front();
  TOPHAT_ASSIGN_OR_RETURN(c.eos_token_ids, ParseTokenIds(j, source, "eos_token_id"));
  for (int64_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(Where(source, "eos_token_id"), " ", id,
                                                     " is outside the vocabulary"));
    }
  }
  if (auto dt = j.find("torch_dtype"); dt != j.end() && dt->is_string()) {
    c.torch_dtype = dt->get<std::string>();
  }
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::Load(const std::filesystem::path& config_json) {
  std::ifstream in(config_json);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(config_json.string(), ": cannot open model config"));
  }
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(config_json.string(), ": not valid JSON"));
  }
  return FromJson(j, config_json.string());
}

json ModelConfig::ToJson() const {
  json j;
  j["architectures"] = {std::string(ArchitectureName(architecture))};
  switch (architecture) {
    case Architecture::kLlama:
      j["model_type"] = "llama";
      break;
    case Architecture::kMistral:
      j["model_type"] = "mistral";
      break;
    case Architecture::kQwen2:
      j["model_type"] = "qwen2";
      break;
  }
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  if (rope_scaling.llama3) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  if (sliding_window) {
    j["sliding_window"] = *sliding_window;
    if (architecture == Architecture::kQwen2) j["use_sliding_window"] = true;
  }
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids.front();
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  j["torch_dtype"] = torch_dtype;
  j["hidden_act"] = "silu";
  return j;
}

int64_t ModelConfig::LayerParameterCount() const {
  const int64_t attention = hidden_size * (q_size() + 2 * kv_size()) + q_size() * hidden_size;
  const int64_t bias = attention_bias ? q_size() + 2 * kv_size() : 0;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  return attention + bias + mlp + 2 * hidden_size;
}

}  // namespace tophat
