#include "models/formats/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <tuple>

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

// Rotary settings in either spelling: transformers 5 writes one `rope_parameters` object
// {"rope_type", "rope_theta", and the type's own keys}; 4.x wrote `rope_theta` and
// `rope_scaling` {"rope_type" or "type", ...} at the top level. Reading only the old keys
// would take a 5.x Llama 3 config for theta 10000 without scaling.
struct Rope {
  double theta = 10000.0;
  RopeScaling scaling;
  double partial_rotary_factor = 1.0;
};

// A list of positive numbers (longrope's short_factor, long_factor).
absl::StatusOr<std::vector<double>> GetFactors(const json& params, const std::string& source,
                                               const std::string& key, const char* name) {
  auto it = params.find(name);
  if (it == params.end() || !it->is_array() || it->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, key + "." + name), " must be a non-empty list of numbers"));
  }
  std::vector<double> factors;
  for (const json& v : *it) {
    if (!v.is_number() || v.get<double>() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, key + "." + name), " must hold numbers > 0, got ", v.dump()));
    }
    factors.push_back(v.get<double>());
  }
  return factors;
}

// `j` is the whole config: Phi-3 keeps original_max_position_embeddings and
// partial_rotary_factor at its top level, which transformers moves into the rope parameters.
// YaRN's keys, as transformers 5.17's _compute_yarn_parameters reads them.
absl::StatusOr<Rope> ParseYarn(const json& j, const json& params, const std::string& source,
                               const std::string& key, Rope rope) {
  RopeScaling& scaling = rope.scaling;
  scaling.yarn = true;
  const std::string scoped = absl::StrCat(source, " ", key);
  TOPHAT_ASSIGN_OR_RETURN(const int64_t max_positions,
                          GetInt(j, source, "max_position_embeddings", int64_t{2048}, 1));
  // A top-level original_max_position_embeddings comes first (transformers' config keeps it
  // as an attribute, which it prefers), then the parameters', then max_position_embeddings.
  TOPHAT_ASSIGN_OR_RETURN(
      int64_t original,
      GetInt(params, scoped, "original_max_position_embeddings", max_positions, 1));
  TOPHAT_ASSIGN_OR_RETURN(original,
                          GetInt(j, source, "original_max_position_embeddings", original, 1));
  scaling.original_max_position_embeddings = original;
  TOPHAT_ASSIGN_OR_RETURN(scaling.factor, GetDouble(params, scoped, "factor",
                                                    static_cast<double>(max_positions) /
                                                        static_cast<double>(original)));
  if (!(scaling.factor > 0) || !std::isfinite(scaling.factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, key + ".factor"), " must be > 0, got ", scaling.factor));
  }
  auto magnitude = [](double factor, double mscale) {
    return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
  };
  TOPHAT_ASSIGN_OR_RETURN(const double mscale, GetDouble(params, scoped, "mscale", 0.0));
  TOPHAT_ASSIGN_OR_RETURN(const double mscale_all_dim,
                          GetDouble(params, scoped, "mscale_all_dim", 0.0));
  const double fallback =
      mscale != 0 && mscale_all_dim != 0
          ? magnitude(scaling.factor, mscale) / magnitude(scaling.factor, mscale_all_dim)
          : magnitude(scaling.factor, 1.0);
  TOPHAT_ASSIGN_OR_RETURN(scaling.attention_factor,
                          GetDouble(params, scoped, "attention_factor", fallback));
  if (!(scaling.attention_factor > 0) || !std::isfinite(scaling.attention_factor)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(source, key + ".attention_factor"),
                                                   " must be > 0, got ", scaling.attention_factor));
  }
  // transformers' `or`: 0 and null mean the defaults.
  TOPHAT_ASSIGN_OR_RETURN(scaling.beta_fast, GetDouble(params, scoped, "beta_fast", 32.0));
  TOPHAT_ASSIGN_OR_RETURN(scaling.beta_slow, GetDouble(params, scoped, "beta_slow", 1.0));
  if (scaling.beta_fast == 0) scaling.beta_fast = 32.0;
  if (scaling.beta_slow == 0) scaling.beta_slow = 1.0;
  if (!(scaling.beta_fast > 0) || !(scaling.beta_slow > 0) || !std::isfinite(scaling.beta_fast) ||
      !std::isfinite(scaling.beta_slow)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, key), ": yarn's beta_fast and beta_slow must be > 0, got ",
                     scaling.beta_fast, " and ", scaling.beta_slow));
  }
  TOPHAT_ASSIGN_OR_RETURN(scaling.truncate, GetBool(params, scoped, "truncate", true));
  return rope;
}

absl::StatusOr<Rope> ParseRope(const json& j, const std::string& source,
                               Architecture architecture = Architecture::kLlama) {
  Rope rope;
  const json* params = nullptr;  // the object holding the rope type and its keys
  std::string key;               // its name, for errors
  // GptOssConfig's default_theta.
  const double default_theta = architecture == Architecture::kGptOss ? 150000.0 : 10000.0;
  TOPHAT_ASSIGN_OR_RETURN(rope.theta, GetDouble(j, source, "rope_theta", default_theta));
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, "rope_parameters"), " must be an object or null"));
    }
    params = &*it;
    key = "rope_parameters";
    TOPHAT_ASSIGN_OR_RETURN(rope.theta, GetDouble(*it, absl::StrCat(source, " rope_parameters"),
                                                  "rope_theta", rope.theta));
  } else if (auto s = j.find("rope_scaling"); s != j.end() && !s->is_null()) {
    if (!s->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, "rope_scaling"), " must be an object or null"));
    }
    params = &*s;
    key = "rope_scaling";
  }
  if (rope.theta <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, key == "rope_parameters" ? "rope_parameters.rope_theta" : "rope_theta"),
        " must be > 0"));
  }
  const std::string scoped = absl::StrCat(source, " ", key);
  std::string partial_key = "partial_rotary_factor";
  TOPHAT_ASSIGN_OR_RETURN(rope.partial_rotary_factor,
                          GetDouble(j, source, "partial_rotary_factor", 1.0));
  if (params != nullptr && params->contains("partial_rotary_factor")) {
    partial_key = key + ".partial_rotary_factor";
    TOPHAT_ASSIGN_OR_RETURN(rope.partial_rotary_factor,
                            GetDouble(*params, scoped, "partial_rotary_factor", 1.0));
  }
  if (rope.partial_rotary_factor != 1.0 && architecture != Architecture::kPhi3) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, partial_key), " ", rope.partial_rotary_factor,
                     " is not supported for ", std::string(ArchitectureName(architecture)),
                     " (rotary embeddings over part of the head: Phi3ForCausalLM only)"));
  }
  if (!(rope.partial_rotary_factor > 0 && rope.partial_rotary_factor <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, partial_key), " must be in (0, 1], got ", rope.partial_rotary_factor));
  }
  if (params == nullptr && architecture == Architecture::kGptOss) {
    // GptOssConfig's default: YaRN from 4,096 positions, by 32, the ramp not rounded.
    static const json* const kGptOssYarn = new json{
        {"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
        {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
    return ParseYarn(j, *kGptOssYarn, source, "rope_parameters", rope);
  }
  if (params == nullptr) return rope;
  std::string type = "default";
  // Older checkpoints spell it "type", newer ones "rope_type".
  for (const char* name : {"rope_type", "type"}) {
    if (auto t = params->find(name); t != params->end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "default") return rope;
  RopeScaling& scaling = rope.scaling;
  if (type == "linear") {
    scaling.linear = true;
    TOPHAT_ASSIGN_OR_RETURN(scaling.factor, GetDouble(*params, scoped, "factor", 1.0));
    if (scaling.factor <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, key + ".factor"), " must be > 0"));
    }
    return rope;
  }
  // "su": the name Phi-3's first configs gave LongRoPE (transformers reads it as longrope).
  if (type == "longrope" || type == "su") {
    scaling.longrope = true;
    TOPHAT_ASSIGN_OR_RETURN(scaling.short_factor, GetFactors(*params, source, key, "short_factor"));
    TOPHAT_ASSIGN_OR_RETURN(scaling.long_factor, GetFactors(*params, source, key, "long_factor"));
    TOPHAT_ASSIGN_OR_RETURN(const int64_t max_positions,
                            GetInt(j, source, "max_position_embeddings", int64_t{2048}, 1));
    // transformers gives a top-level original_max_position_embeddings priority; Phi3Config
    // always has one (default 4096); other configs fall back on max_position_embeddings.
    TOPHAT_ASSIGN_OR_RETURN(
        int64_t original,
        GetInt(*params, scoped, "original_max_position_embeddings",
               architecture == Architecture::kPhi3 ? int64_t{4096} : max_positions, 1));
    TOPHAT_ASSIGN_OR_RETURN(original,
                            GetInt(j, source, "original_max_position_embeddings", original, 1));
    scaling.original_max_position_embeddings = original;
    TOPHAT_ASSIGN_OR_RETURN(scaling.factor, GetDouble(*params, scoped, "factor",
                                                      static_cast<double>(max_positions) /
                                                          static_cast<double>(original)));
    if (scaling.factor <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, key + ".factor"), " must be > 0"));
    }
    // LongRoPE's default: sqrt(1 + ln(factor) / ln(original length)), as transformers.
    const double fallback =
        scaling.factor <= 1.0
            ? 1.0
            : std::sqrt(1.0 + std::log(scaling.factor) / std::log(static_cast<double>(original)));
    TOPHAT_ASSIGN_OR_RETURN(scaling.attention_factor,
                            GetDouble(*params, scoped, "attention_factor", fallback));
    if (scaling.attention_factor <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, key + ".attention_factor"), " must be > 0"));
    }
    return rope;
  }
  if (type == "yarn") return ParseYarn(j, *params, source, key, rope);
  if (type != "llama3") {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, key + ".rope_type"), " '", type,
                     "' is not supported (supported: llama3, linear, longrope, yarn, default)"));
  }
  scaling.llama3 = true;
  TOPHAT_ASSIGN_OR_RETURN(scaling.factor, GetDouble(*params, scoped, "factor", 8.0));
  TOPHAT_ASSIGN_OR_RETURN(scaling.low_freq_factor,
                          GetDouble(*params, scoped, "low_freq_factor", 1.0));
  TOPHAT_ASSIGN_OR_RETURN(scaling.high_freq_factor,
                          GetDouble(*params, scoped, "high_freq_factor", 4.0));
  TOPHAT_ASSIGN_OR_RETURN(
      scaling.original_max_position_embeddings,
      GetInt(*params, scoped, "original_max_position_embeddings", int64_t{8192}, 1));
  if (scaling.factor <= 0 || scaling.high_freq_factor <= scaling.low_freq_factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, key), ": need factor > 0 and high_freq_factor > low_freq_factor"));
  }
  return rope;
}

// The sliding window as transformers applies it, and the layers it applies to. Mistral:
// `sliding_window` on every layer (MistralForCausalLM ignores `layer_types`). Qwen2 and Qwen3:
// only with `use_sliding_window`, and then only on the layers `layer_types` marks
// "sliding_attention" (when absent, transformers derives it: layers from `max_window_layers`
// on, default 28); a mix of sliding and full layers is refused for them (no checkpoint has
// one to check it against). Gemma 3: always, on the layers `layer_types` marks, or (older
// configs) every layer but each `sliding_window_pattern`-th (default 6). Gemma 2: always, on
// the layers `layer_types` marks, or (older configs) every other layer from the first, as
// Gemma2Config derives it. Llama: never.
struct SlidingWindow {
  std::optional<int64_t> window;
  std::vector<bool> layers;  // empty: every layer
};

absl::StatusOr<std::vector<bool>> ParseLayerTypes(const json& types, const std::string& source,
                                                  int64_t num_layers) {
  if (!types.is_array() || static_cast<int64_t>(types.size()) != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(Where(source, "layer_types"),
                                                   " must be a list of ", num_layers,
                                                   " (num_hidden_layers) strings"));
  }
  std::vector<bool> sliding(static_cast<size_t>(num_layers));
  for (int64_t i = 0; i < num_layers; ++i) {
    const json& t = types[static_cast<size_t>(i)];
    if (t == "sliding_attention") {
      sliding[static_cast<size_t>(i)] = true;
    } else if (t != "full_attention") {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, "layer_types"), " entry ", i, ": ", t.dump(),
                       " is not supported (full_attention or sliding_attention)"));
    }
  }
  return sliding;
}

absl::StatusOr<SlidingWindow> ParseSlidingWindow(const json& j, const std::string& source,
                                                 Architecture architecture, int64_t num_layers) {
  if (architecture == Architecture::kLlama) return SlidingWindow{};
  const bool gpt_oss = architecture == Architecture::kGptOss;
  if (architecture == Architecture::kGemma3 || architecture == Architecture::kGemma2 || gpt_oss) {
    SlidingWindow result;
    TOPHAT_ASSIGN_OR_RETURN(result.window,
                            GetInt(j, source, "sliding_window", int64_t{gpt_oss ? 128 : 4096}, 1));
    if (auto types = j.find("layer_types"); types != j.end() && !types->is_null()) {
      TOPHAT_ASSIGN_OR_RETURN(result.layers, ParseLayerTypes(*types, source, num_layers));
    } else {
      // Gemma 2 and gpt-oss: every other layer from the first; Gemma 3: five of six.
      const int64_t default_pattern = architecture == Architecture::kGemma3 ? 6 : 2;
      TOPHAT_ASSIGN_OR_RETURN(int64_t pattern,
                              GetInt(j, source, "sliding_window_pattern", default_pattern, 1));
      result.layers.resize(static_cast<size_t>(num_layers));
      for (int64_t i = 0; i < num_layers; ++i) {
        result.layers[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
      }
    }
    return result;
  }
  auto sw = j.find("sliding_window");
  if (sw == j.end() || sw->is_null()) return SlidingWindow{};
  // Phi-3 mini windows every layer as Mistral does (transformers' Phi3 masks by
  // `sliding_window` alone).
  const bool window_alone = architecture == Architecture::kMistral ||
                            architecture == Architecture::kPhi3 ||
                            architecture == Architecture::kMixtral;
  if (!window_alone) {
    // The Qwen family's window is off unless use_sliding_window, whatever `sliding_window`
    // says (Qwen2MoeConfig writes 0 then).
    TOPHAT_ASSIGN_OR_RETURN(bool use, GetBool(j, source, "use_sliding_window", false));
    if (!use) return SlidingWindow{};
  }
  TOPHAT_ASSIGN_OR_RETURN(int64_t window, GetInt(j, source, "sliding_window", std::nullopt, 1));
  if (window_alone) return SlidingWindow{.window = window};

  std::vector<bool> sliding(static_cast<size_t>(num_layers));
  std::string key = "layer_types";
  if (auto types = j.find("layer_types"); types != j.end() && !types->is_null()) {
    TOPHAT_ASSIGN_OR_RETURN(sliding, ParseLayerTypes(*types, source, num_layers));
  } else if (architecture == Architecture::kQwen2Moe) {
    // Qwen2MoeConfig derives its windowed layers otherwise than Qwen2 (every other one below
    // max_window_layers); no Qwen2-MoE checkpoint uses a window to check that against.
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "use_sliding_window"),
                     ": a window without `layer_types` is not supported for Qwen2MoeForCausalLM"));
  } else {
    key = "max_window_layers";
    TOPHAT_ASSIGN_OR_RETURN(int64_t first, GetInt(j, source, "max_window_layers", int64_t{28}, 0));
    for (int64_t i = first; i < num_layers; ++i) sliding[static_cast<size_t>(i)] = true;
  }
  const auto count = std::count(sliding.begin(), sliding.end(), true);
  if (count == 0) return SlidingWindow{};
  if (count == num_layers) return SlidingWindow{.window = window};
  return absl::InvalidArgumentError(
      absl::StrCat(Where(source, key), ": ", count, " of ", num_layers,
                   " layers use sliding-window attention and the others full attention; for ",
                   std::string(ArchitectureName(architecture)),
                   " a window on some layers only is not supported (all "
                   "layers or none)"));
}

// A checkpoint stored quantized by another tool. gpt-oss's MXFP4 experts load (dequantized);
// any other method (GPTQ, AWQ, FP8, bitsandbytes...) is refused here, naming it, rather than
// failing later on a tensor the runtime cannot find. tophat's own int8 bundles say so in
// their manifest, not here.
absl::Status ParseQuantization(const json& j, const std::string& source, ModelConfig& c) {
  auto q = j.find("quantization_config");
  if (q == j.end() || q->is_null()) return absl::OkStatus();
  std::string method = "(none given)";
  if (q->is_object()) {
    if (auto m = q->find("quant_method"); m != q->end() && m->is_string()) {
      method = m->get<std::string>();
    }
  }
  if (method == "mxfp4" && c.gpt_oss()) {
    c.mxfp4_experts = true;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      Where(source, "quantization_config.quant_method"), " '", method,
      "' is not supported (tophat loads F32/F16/BF16 checkpoints, its own int8 bundles, and "
      "gpt-oss's mxfp4 experts; a full-precision checkpoint of the model loads)"));
}

// Mixtral's, Qwen3-MoE's and Qwen2-MoE's experts, with transformers' defaults for what a
// config leaves out. The count is `num_local_experts` (MixtralConfig; transformers 5 writes
// Qwen3-MoE's so too) or `num_experts` (the Qwen MoE checkpoints).
absl::Status ParseExperts(const json& j, const std::string& source, ModelConfig& c) {
  const bool gpt_oss = c.gpt_oss();
  // gpt-oss's experts are as wide as intermediate_size and renormalised as Mixtral's (its
  // softmax over the top K logits is the top K of the softmax renormalised).
  const bool mixtral = c.architecture == Architecture::kMixtral || gpt_oss;
  const bool qwen2 = c.architecture == Architecture::kQwen2Moe;
  const char* count_key = j.contains("num_local_experts") && !j["num_local_experts"].is_null()
                              ? "num_local_experts"
                          : j.contains("num_experts") ? "num_experts"
                          : mixtral                   ? "num_local_experts"
                                                      : "num_experts";
  TOPHAT_ASSIGN_OR_RETURN(c.num_experts, GetInt(j, source, count_key,
                                                int64_t{gpt_oss   ? 128
                                                        : mixtral ? 8
                                                        : qwen2   ? 60
                                                                  : 128},
                                                1));
  TOPHAT_ASSIGN_OR_RETURN(c.num_experts_per_token, GetInt(j, source, "num_experts_per_tok",
                                                          int64_t{gpt_oss   ? 4
                                                                  : mixtral ? 2
                                                                  : qwen2   ? 4
                                                                            : 8},
                                                          1));
  if (c.num_experts_per_token > c.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "num_experts_per_tok"), " (", c.num_experts_per_token,
                     ") is more than the experts (", count_key, ": ", c.num_experts, ")"));
  }
  if (mixtral) {
    // Mixtral's experts are as wide as its intermediate_size, and always renormalised.
    c.moe_intermediate_size = c.intermediate_size;
    c.normalize_expert_weights = true;
    return absl::OkStatus();
  }
  TOPHAT_ASSIGN_OR_RETURN(c.moe_intermediate_size, GetInt(j, source, "moe_intermediate_size",
                                                          int64_t{qwen2 ? 1408 : 768}, 1));
  if (qwen2) {
    TOPHAT_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                            GetInt(j, source, "shared_expert_intermediate_size", int64_t{5632}, 1));
  }
  TOPHAT_ASSIGN_OR_RETURN(c.normalize_expert_weights, GetBool(j, source, "norm_topk_prob", false));
  TOPHAT_ASSIGN_OR_RETURN(c.decoder_sparse_step,
                          GetInt(j, source, "decoder_sparse_step", int64_t{1}, 1));
  if (auto only = j.find("mlp_only_layers"); only != j.end() && !only->is_null()) {
    if (!only->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, "mlp_only_layers"), " must be a list of layer indices"));
    }
    for (const json& layer : *only) {
      if (!layer.is_number_integer() || layer.get<int64_t>() < 0 ||
          layer.get<int64_t>() >= c.num_hidden_layers) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(source, "mlp_only_layers"), ": ", layer.dump(),
            " is not a layer index below num_hidden_layers (", c.num_hidden_layers, ")"));
      }
      c.mlp_only_layers.push_back(layer.get<int64_t>());
    }
  }
  return absl::OkStatus();
}

// Gemma 3's two rotary bases: transformers 5 writes `rope_parameters` keyed by layer type
// ({"full_attention": {...}, "sliding_attention": {...}}), 4.x `rope_theta` and
// `rope_scaling` for the full layers and `rope_local_base_freq` for the sliding ones.
absl::Status ParseGemmaRope(const json& j, const std::string& source, ModelConfig& c) {
  double local = 10000.0;
  Rope global;
  auto params = j.find("rope_parameters");
  if (params != j.end() && params->is_object() && params->contains("full_attention")) {
    const std::string scoped = absl::StrCat(source, " rope_parameters");
    TOPHAT_ASSIGN_OR_RETURN(
        global, ParseRope(json{{"rope_parameters", (*params)["full_attention"]}}, scoped));
    if (auto sliding = params->find("sliding_attention"); sliding != params->end()) {
      TOPHAT_ASSIGN_OR_RETURN(
          Rope rope, ParseRope(json{{"rope_parameters", *sliding}}, scoped + ".sliding_attention"));
      if (rope.scaling.scaled()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(source, "rope_parameters.sliding_attention"),
                         ": scaling of the sliding layers' rotary embeddings is not supported"));
      }
      local = rope.theta;
    }
  } else {
    TOPHAT_ASSIGN_OR_RETURN(global, ParseRope(j, source, c.architecture));
    TOPHAT_ASSIGN_OR_RETURN(local, GetDouble(j, source, "rope_local_base_freq", 10000.0));
  }
  if (global.scaling.longrope || global.scaling.yarn) {
    return absl::InvalidArgumentError(absl::StrCat(Where(source, "rope_parameters"), ": ",
                                                   global.scaling.yarn ? "yarn" : "longrope",
                                                   " scaling is not supported for Gemma 3"));
  }
  if (local <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "rope_local_base_freq"), " must be > 0"));
  }
  c.rope_theta = global.theta;
  c.rope_scaling = global.scaling;
  c.rope_local_theta = local;
  return absl::OkStatus();
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

// Gemma3TextConfig's defaults, which a multimodal checkpoint's text_config leaves out (Gemma 3
// 4B's writes its sizes, the window and the scaling, and little else).
json GemmaTextDefaults() {
  return json{{"vocab_size", 262208},
              {"hidden_size", 2304},
              {"intermediate_size", 9216},
              {"num_hidden_layers", 26},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"head_dim", 256},
              {"max_position_embeddings", 131072},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 1000000.0},
              {"rope_local_base_freq", 10000.0},
              {"query_pre_attn_scalar", 256},
              {"sliding_window", 4096},
              {"tie_word_embeddings", true},
              {"bos_token_id", 2},
              {"eos_token_id", 1}};
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::GemmaTextModel(const json& j, const std::string& source) {
  auto text = j.find("text_config");
  if (text == j.end() || !text->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(source, "text_config"),
        " must be an object: Gemma3ForConditionalGeneration's text model is read from it"));
  }
  json config = GemmaTextDefaults();
  // The outer config's token ids and dtype where the text model's own are absent.
  for (const char* key : {"bos_token_id", "eos_token_id", "torch_dtype", "dtype"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) config[key] = *it;
  }
  config.update(*text);
  config["architectures"] = {"Gemma3ForCausalLM"};
  TOPHAT_ASSIGN_OR_RETURN(ModelConfig c, FromJson(config, absl::StrCat(source, " text_config")));
  c.multimodal_text = true;
  return c;
}

std::string_view ArchitectureName(Architecture architecture) {
  switch (architecture) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
    case Architecture::kGemma3:
      return "Gemma3ForCausalLM";
    case Architecture::kPhi3:
      return "Phi3ForCausalLM";
    case Architecture::kGemma2:
      return "Gemma2ForCausalLM";
    case Architecture::kMixtral:
      return "MixtralForCausalLM";
    case Architecture::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
    case Architecture::kQwen2Moe:
      return "Qwen2MoeForCausalLM";
    case Architecture::kGptOss:
      return "GptOssForCausalLM";
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
  if (name == "Gemma3ForConditionalGeneration") return GemmaTextModel(j, source);
  if (name == "LlamaForCausalLM") {
    c.architecture = Architecture::kLlama;
  } else if (name == "MistralForCausalLM") {
    c.architecture = Architecture::kMistral;
  } else if (name == "Qwen2ForCausalLM") {
    c.architecture = Architecture::kQwen2;
  } else if (name == "Qwen3ForCausalLM") {
    c.architecture = Architecture::kQwen3;
  } else if (name == "Gemma3ForCausalLM") {
    c.architecture = Architecture::kGemma3;
  } else if (name == "Phi3ForCausalLM") {
    c.architecture = Architecture::kPhi3;
  } else if (name == "Gemma2ForCausalLM") {
    c.architecture = Architecture::kGemma2;
  } else if (name == "MixtralForCausalLM") {
    c.architecture = Architecture::kMixtral;
  } else if (name == "Qwen3MoeForCausalLM") {
    c.architecture = Architecture::kQwen3Moe;
  } else if (name == "Qwen2MoeForCausalLM") {
    c.architecture = Architecture::kQwen2Moe;
  } else if (name == "GptOssForCausalLM") {
    c.architecture = Architecture::kGptOss;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "architectures"), ": architecture '", name,
                     "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                     "Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, "
                     "Gemma3ForConditionalGeneration's text, Gemma2ForCausalLM, "
                     "Phi3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM, "
                     "Qwen2MoeForCausalLM, GptOssForCausalLM)"));
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
  if (c.architecture == Architecture::kGemma3) {
    TOPHAT_RETURN_IF_ERROR(ParseGemmaRope(j, source, c));
  } else {
    TOPHAT_ASSIGN_OR_RETURN(Rope rope, ParseRope(j, source, c.architecture));
    if (c.gemma() && (rope.scaling.longrope || rope.scaling.yarn)) {
      const auto params = j.find("rope_parameters");
      return absl::InvalidArgumentError(absl::StrCat(
          Where(source,
                params != j.end() && !params->is_null() ? "rope_parameters" : "rope_scaling"),
          ": ", rope.scaling.yarn ? "yarn" : "longrope", " scaling is not supported for Gemma 2"));
    }
    c.rope_theta = rope.theta;
    c.rope_scaling = rope.scaling;
    c.partial_rotary_factor = rope.partial_rotary_factor;
  }
  if (c.gemma()) {
    TOPHAT_ASSIGN_OR_RETURN(c.query_pre_attn_scalar,
                            GetDouble(j, source, "query_pre_attn_scalar", 256.0));
    if (c.query_pre_attn_scalar <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, "query_pre_attn_scalar"), " must be > 0"));
    }
  }
  const int64_t rotary_dim = c.rotary_dim();
  if (rotary_dim < 2 || rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "partial_rotary_factor"), " ", c.partial_rotary_factor,
                     " turns ", rotary_dim, " of head_dim ", c.head_dim,
                     " dimensions: rotary embeddings need an even number, at least 2"));
  }
  if (c.rope_scaling.longrope) {
    const auto params = j.find("rope_parameters");
    const std::string key =
        params != j.end() && !params->is_null() ? "rope_parameters" : "rope_scaling";
    for (const auto* factors : {&c.rope_scaling.short_factor, &c.rope_scaling.long_factor}) {
      if (static_cast<int64_t>(factors->size()) != rotary_dim / 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(source, absl::StrCat(key, ".",
                                       factors == &c.rope_scaling.short_factor ? "short_factor"
                                                                               : "long_factor")),
            " has ", factors->size(), " entries; the rotary dimensions (", rotary_dim,
            ") need one for each pair, ", rotary_dim / 2));
      }
    }
  }
  TOPHAT_ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, source, "rms_norm_eps", 1e-6));
  if (c.rms_norm_eps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "rms_norm_eps"), " must be > 0"));
  }
  TOPHAT_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                          GetBool(j, source, "tie_word_embeddings", false));
  TOPHAT_ASSIGN_OR_RETURN(
      c.attention_bias,
      GetBool(j, source, "attention_bias", c.architecture == Architecture::kQwen2 || c.gpt_oss()));
  if (c.architecture == Architecture::kQwen2) c.attention_bias = true;
  // Qwen2-MoE names its q/k/v biases `qkv_bias` (on by default; o_proj has none).
  if (c.architecture == Architecture::kQwen2Moe) {
    TOPHAT_ASSIGN_OR_RETURN(c.attention_bias, GetBool(j, source, "qkv_bias", true));
  }

  // What the runtime does not compute must not load as something else.
  TOPHAT_ASSIGN_OR_RETURN(bool mlp_bias, GetBool(j, source, "mlp_bias", false));
  if (mlp_bias) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(source, "mlp_bias"), ": MLP biases are not supported"));
  }
  if (c.gemma()) {
    // Gemma's configs name it hidden_activation (some also hidden_act); transformers' Gemma 3
    // computes the first.
    for (const char* key : {"hidden_activation", "hidden_act"}) {
      if (auto act = j.find(key);
          act != j.end() && !act->is_null() && *act != "gelu_pytorch_tanh") {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(source, key), " ", act->dump(), " is not supported (gelu_pytorch_tanh only)"));
      }
    }
    if (c.architecture == Architecture::kGemma2) {
      // Gemma2Config's defaults where the key is absent; null turns a cap off.
      for (auto [key, cap, fallback] :
           {std::tuple{"attn_logit_softcapping", &c.attn_logit_softcapping, 50.0},
            std::tuple{"final_logit_softcapping", &c.final_logit_softcapping, 30.0}}) {
        auto it = j.find(key);
        if (it != j.end() && it->is_null()) continue;
        TOPHAT_ASSIGN_OR_RETURN(*cap, GetDouble(j, source, key, fallback));
        if (!(*cap > 0) || !std::isfinite(*cap)) {
          return absl::InvalidArgumentError(
              absl::StrCat(Where(source, key), " must be > 0 (or null for no cap)"));
        }
      }
    } else {
      for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
        if (auto cap = j.find(key); cap != j.end() && !cap->is_null()) {
          return absl::InvalidArgumentError(
              absl::StrCat(Where(source, key), " ", cap->dump(),
                           " is not supported (soft-capping: Gemma 2's, not Gemma 3's)"));
        }
      }
    }
    TOPHAT_ASSIGN_OR_RETURN(bool bidirectional,
                            GetBool(j, source, "use_bidirectional_attention", false));
    if (bidirectional) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, "use_bidirectional_attention"),
                       ": bidirectional attention is not supported (a causal model only)"));
    }
  } else if (auto act = j.find("hidden_act"); act != j.end() && !act->is_null() && *act != "silu") {
    return absl::InvalidArgumentError(absl::StrCat(Where(source, "hidden_act"), " ", act->dump(),
                                                   " is not supported (silu only)"));
  }
  if (c.architecture == Architecture::kMixtral || c.architecture == Architecture::kQwen3Moe ||
      c.architecture == Architecture::kQwen2Moe || c.gpt_oss()) {
    TOPHAT_RETURN_IF_ERROR(ParseExperts(j, source, c));
  }
  if (c.gpt_oss()) {
    // transformers computes the clamp at 7 whatever the config says: a config that says
    // otherwise would compute something its authors did not mean.
    TOPHAT_ASSIGN_OR_RETURN(const double limit, GetDouble(j, source, "swiglu_limit", 7.0));
    if (limit != 7.0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(source, "swiglu_limit"), " ", limit,
                       " is not supported (GptOssForCausalLM clamps its experts' SwiGLU at 7)"));
    }
  }
  TOPHAT_RETURN_IF_ERROR(ParseQuantization(j, source, c));
  TOPHAT_ASSIGN_OR_RETURN(SlidingWindow window,
                          ParseSlidingWindow(j, source, c.architecture, c.num_hidden_layers));
  c.sliding_window = window.window;
  c.sliding_layers = std::move(window.layers);
  TOPHAT_ASSIGN_OR_RETURN(std::vector<int64_t> bos, ParseTokenIds(j, source, "bos_token_id"));
  if (!bos.empty()) c.bos_token_id = bos.front();
  TOPHAT_ASSIGN_OR_RETURN(c.eos_token_ids, ParseTokenIds(j, source, "eos_token_id"));
  for (int64_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(Where(source, "eos_token_id"), " ", id,
                                                     " is outside the vocabulary"));
    }
  }
  // transformers 5 writes `dtype`, 4.x `torch_dtype`.
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (auto dt = j.find(key); dt != j.end() && dt->is_string()) {
      c.torch_dtype = dt->get<std::string>();
      break;
    }
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
    case Architecture::kQwen3:
      j["model_type"] = "qwen3";
      break;
    case Architecture::kGemma3:
      j["model_type"] = "gemma3_text";
      break;
    case Architecture::kPhi3:
      j["model_type"] = "phi3";
      break;
    case Architecture::kGemma2:
      j["model_type"] = "gemma2";
      break;
    case Architecture::kMixtral:
      j["model_type"] = "mixtral";
      break;
    case Architecture::kQwen3Moe:
      j["model_type"] = "qwen3_moe";
      break;
    case Architecture::kQwen2Moe:
      j["model_type"] = "qwen2_moe";
      break;
    case Architecture::kGptOss:
      j["model_type"] = "gpt_oss";
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
  } else if (rope_scaling.linear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
  } else if (rope_scaling.longrope) {
    j["rope_scaling"] = {
        {"rope_type", "longrope"},
        {"short_factor", rope_scaling.short_factor},
        {"long_factor", rope_scaling.long_factor},
        {"factor", rope_scaling.factor},
        {"attention_factor", rope_scaling.attention_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
    // Where transformers looks first.
    j["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
  } else if (rope_scaling.yarn) {
    j["rope_scaling"] = {
        {"rope_type", "yarn"},
        {"factor", rope_scaling.factor},
        {"attention_factor", rope_scaling.attention_factor},
        {"beta_fast", rope_scaling.beta_fast},
        {"beta_slow", rope_scaling.beta_slow},
        {"truncate", rope_scaling.truncate},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  } else {
    // gpt-oss without any reads as GptOssConfig's default YaRN: plain rope is named.
    j["rope_scaling"] = gpt_oss() ? json{{"rope_type", "default"}} : json(nullptr);
  }
  if (partial_rotary_factor != 1.0) j["partial_rotary_factor"] = partial_rotary_factor;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  if (gemma() || gpt_oss()) {
    // transformers 4.x's spelling, which 5.x reads too.
    if (architecture == Architecture::kGemma3) {
      j["rope_local_base_freq"] = rope_local_theta.value_or(10000.0);
    }
    if (gemma()) {
      j["query_pre_attn_scalar"] = query_pre_attn_scalar;
      auto cap = [](double value) { return value > 0 ? json(value) : json(nullptr); };
      j["final_logit_softcapping"] = cap(final_logit_softcapping);
      j["attn_logit_softcapping"] = cap(attn_logit_softcapping);
    }
    j["sliding_window"] = sliding_window.value_or(gpt_oss() ? 128 : 4096);
    std::vector<std::string> types;
    for (int64_t i = 0; i < num_hidden_layers; ++i) {
      types.push_back(LayerWindow(i) ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
  } else if (sliding_window) {
    j["sliding_window"] = *sliding_window;
    if (architecture == Architecture::kQwen2 || architecture == Architecture::kQwen3 ||
        architecture == Architecture::kQwen3Moe || architecture == Architecture::kQwen2Moe) {
      // Qwen2 (and Qwen3) slides only the layers from max_window_layers on (default 28): all of
      // them.
      j["use_sliding_window"] = true;
      j["max_window_layers"] = 0;
      j["layer_types"] =
          std::vector<std::string>(static_cast<size_t>(num_hidden_layers), "sliding_attention");
    }
  }
  if (architecture == Architecture::kMixtral || gpt_oss()) {
    j["num_local_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_token;
    if (mxfp4_experts) j["quantization_config"] = {{"quant_method", "mxfp4"}};
  } else if (architecture == Architecture::kQwen3Moe || architecture == Architecture::kQwen2Moe) {
    if (architecture == Architecture::kQwen2Moe) {
      j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
      j["qkv_bias"] = attention_bias;
    }
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_token;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = normalize_expert_weights;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
  }
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids.front();
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  j["torch_dtype"] = torch_dtype;
  if (gemma()) {
    j["hidden_activation"] = "gelu_pytorch_tanh";
  } else {
    j["hidden_act"] = "silu";
  }
  return j;
}

int64_t ModelConfig::LayerActiveMatrixParameters(int64_t layer) const {
  const int64_t attention = hidden_size * (q_size() + 2 * kv_size()) + q_size() * hidden_size;
  const int64_t mlp = MoeLayer(layer)
                          ? num_experts * hidden_size +
                                num_experts_per_token * 3 * hidden_size * moe_intermediate_size +
                                SharedExpertParameters()
                          : 3 * hidden_size * intermediate_size;
  return attention + mlp;
}

int64_t ModelConfig::SharedExpertParameters() const {
  return shared_expert_intermediate_size > 0
             ? 3 * hidden_size * shared_expert_intermediate_size + hidden_size  // + its gate
             : 0;
}

int64_t ModelConfig::ParameterCount() const {
  int64_t count = vocab_size * hidden_size + hidden_size;
  if (!tie_word_embeddings) count += vocab_size * hidden_size;
  for (int64_t layer = 0; layer < num_hidden_layers; ++layer) {
    count += LayerParameterCount(layer);
  }
  return count;
}

double ModelConfig::attention_scale() const { return 1.0 / std::sqrt(attention_scalar()); }

float ModelConfig::embedding_scale() const {
  return gemma() ? static_cast<float>(std::sqrt(static_cast<double>(hidden_size))) : 1.0f;
}

int64_t ModelConfig::LayerParameterCount(int64_t layer) const {
  const int64_t attention = hidden_size * (q_size() + 2 * kv_size()) + q_size() * hidden_size;
  const int64_t bias =
      (attention_bias ? q_size() + 2 * kv_size() : 0) + (o_bias() ? hidden_size : 0);
  const int64_t head_norms = qk_norm() ? 2 * head_dim : 0;
  const int64_t mlp =
      MoeLayer(layer)
          ? num_experts * (3 * hidden_size * moe_intermediate_size + hidden_size) +  // + router
                SharedExpertParameters()
          : 3 * hidden_size * intermediate_size;
  const int64_t norms = (gemma() ? 4 : 2) * hidden_size;
  // gpt-oss: a sink per query head; the router's bias, and each expert's two biases.
  const int64_t gpt_oss_extra =
      !gpt_oss() ? 0
                 : num_attention_heads +
                       (MoeLayer(layer)
                            ? num_experts + num_experts * (2 * moe_intermediate_size + hidden_size)
                            : 0);
  return attention + bias + head_norms + mlp + norms + gpt_oss_extra;
}

}  // namespace tophat
