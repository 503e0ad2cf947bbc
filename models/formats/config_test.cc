#include "models/formats/config.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tophat {
namespace {

using json = nlohmann::json;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// config.json as transformers 5.17 writes it for LlamaForCausalLM with llama3 rope scaling
// (save_pretrained of LlamaConfig(..., rope_scaling={...}, rope_theta=500000)).
json Llama3ConfigV5() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "dtype": "bfloat16", "eos_token_id": 2, "head_dim": 24,
    "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
    "intermediate_size": 128, "max_position_embeddings": 128, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "pad_token_id": null, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
    "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                        "original_max_position_embeddings": 16, "rope_theta": 500000.0,
                        "rope_type": "llama3"},
    "tie_word_embeddings": false, "transformers_version": "5.17.0", "use_cache": true,
    "vocab_size": 256})");
}

// Qwen2Config(use_sliding_window=False) as transformers 5.17 writes it.
json Qwen2ConfigV5() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": null,
    "dtype": "float32", "eos_token_id": null, "hidden_act": "silu", "hidden_size": 64,
    "intermediate_size": 128, "layer_types": ["full_attention", "full_attention"],
    "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "sliding_window": null, "tie_word_embeddings": true, "use_cache": true,
    "use_sliding_window": false, "vocab_size": 256})");
}

TEST_CASE("A transformers 5 config reads rope_parameters and dtype", "[config]") {
  auto c = ModelConfig::FromJson(Llama3ConfigV5(), "llama3/config.json");
  REQUIRE(c.ok());
  CHECK(c->rope_theta == 500000.0);
  CHECK(c->rope_scaling.llama3);
  CHECK(c->rope_scaling.factor == 8.0);
  CHECK(c->rope_scaling.original_max_position_embeddings == 16);
  CHECK(c->head_dim == 24);
  CHECK(c->torch_dtype == "bfloat16");
  CHECK_FALSE(c->sliding_window);

  json plain = Llama3ConfigV5();
  plain["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
  auto d = ModelConfig::FromJson(plain, "plain/config.json");
  REQUIRE(d.ok());
  CHECK(d->rope_theta == 1e6);
  CHECK_FALSE(d->rope_scaling.llama3);
}

TEST_CASE("A transformers 4 config reads rope_theta, rope_scaling and torch_dtype", "[config]") {
  json j = Llama3ConfigV5();
  j.erase("rope_parameters");
  j.erase("dtype");
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"type", "llama3"},
                       {"factor", 32.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  j["torch_dtype"] = "float16";
  auto c = ModelConfig::FromJson(j, "v4/config.json");
  REQUIRE(c.ok());
  CHECK(c->rope_theta == 500000.0);
  CHECK(c->rope_scaling.llama3);
  CHECK(c->rope_scaling.factor == 32.0);
  CHECK(c->torch_dtype == "float16");
}

TEST_CASE("Qwen2's sliding window follows use_sliding_window and layer_types", "[config]") {
  SECTION("use_sliding_window false: no window") {
    json j = Qwen2ConfigV5();
    j["sliding_window"] = 8;
    auto c = ModelConfig::FromJson(j, "q/config.json");
    REQUIRE(c.ok());
    CHECK_FALSE(c->sliding_window);
    CHECK(c->attention_bias);
    CHECK(c->tie_word_embeddings);
  }
  SECTION("every layer sliding: the window") {
    json j = Qwen2ConfigV5();
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
    j["layer_types"] = {"sliding_attention", "sliding_attention"};
    auto c = ModelConfig::FromJson(j, "q/config.json");
    REQUIRE(c.ok());
    CHECK(c->sliding_window == 8);
  }
  SECTION("without layer_types, the layers from max_window_layers on slide") {
    json j = Qwen2ConfigV5();
    j.erase("layer_types");
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
    // The default 28 leaves both layers of this model at full attention, as in transformers.
    j.erase("max_window_layers");
    auto none = ModelConfig::FromJson(j, "q/config.json");
    REQUIRE(none.ok());
    CHECK_FALSE(none->sliding_window);
    j["max_window_layers"] = 0;
    auto all = ModelConfig::FromJson(j, "q/config.json");
    REQUIRE(all.ok());
    CHECK(all->sliding_window == 8);
    j["max_window_layers"] = 1;
    auto mixed = ModelConfig::FromJson(j, "q/config.json");
    REQUIRE_FALSE(mixed.ok());
    CHECK_THAT(Message(mixed.status()), Catch::Contains("q/config.json: key 'max_window_layers'"));
    CHECK_THAT(Message(mixed.status()), Catch::Contains("1 of 2 layers"));
  }
  SECTION("a mix of sliding and full layers is refused, naming layer_types") {
    json j = Qwen2ConfigV5();
    j["use_sliding_window"] = true;
    j["sliding_window"] = 8;
    j["layer_types"] = {"full_attention", "sliding_attention"};
    auto c = ModelConfig::FromJson(j, "q/config.json");
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(Message(c.status()), Catch::Contains("q/config.json: key 'layer_types'"));
    CHECK_THAT(Message(c.status()), Catch::Contains("not supported"));
    j["layer_types"] = {"full_attention"};
    auto short_list = ModelConfig::FromJson(j, "q/config.json");
    REQUIRE_FALSE(short_list.ok());
    CHECK_THAT(Message(short_list.status()), Catch::Contains("list of 2"));
  }
}

TEST_CASE("Mistral slides every layer, Llama never", "[config]") {
  json j = Llama3ConfigV5();
  j["sliding_window"] = 8;
  auto llama = ModelConfig::FromJson(j, "l/config.json");
  REQUIRE(llama.ok());
  CHECK_FALSE(llama->sliding_window);
  j["architectures"] = {"MistralForCausalLM"};
  auto mistral = ModelConfig::FromJson(j, "m/config.json");
  REQUIRE(mistral.ok());
  CHECK(mistral->sliding_window == 8);
}

TEST_CASE("What the runtime does not compute is refused, naming file and key", "[config]") {
  struct Case {
    const char* what;
    json::json_pointer pointer;
    json value;
    const char* expected;
  };
  const Case cases[] = {
      {"dynamic", json::json_pointer("/rope_parameters/rope_type"), "dynamic",
       "c.json: key 'rope_parameters.rope_type' 'dynamic' is not supported"},
      {"yarn's factor", json::json_pointer("/rope_parameters"),
       json{{"rope_type", "yarn"}, {"factor", -2.0}},
       "c.json: key 'rope_parameters.factor' must be > 0, got -2"},
      {"partial rotary", json::json_pointer("/rope_parameters/partial_rotary_factor"), 0.5,
       "c.json: key 'rope_parameters.partial_rotary_factor' 0.5 is not supported"},
      {"mlp bias", json::json_pointer("/mlp_bias"), true, "c.json: key 'mlp_bias'"},
      {"gelu", json::json_pointer("/hidden_act"), "gelu",
       "c.json: key 'hidden_act' \"gelu\" is not supported"},
      {"theta", json::json_pointer("/rope_parameters/rope_theta"), -1.0,
       "c.json: key 'rope_parameters.rope_theta' must be > 0"},
  };
  for (const Case& c : cases) {
    json j = Llama3ConfigV5();
    j[c.pointer] = c.value;
    auto config = ModelConfig::FromJson(j, "c.json");
    INFO(c.what);
    REQUIRE_FALSE(config.ok());
    CHECK_THAT(Message(config.status()), Catch::Contains(c.expected));
  }
}

// Qwen/Qwen3-0.6B's config.json (transformers 4.51's keys).
json Qwen3_0_6B() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

TEST_CASE(
    "Qwen3's config reads its head norms, a head_dim wider than hidden / heads, and "
    "no window",
    "[config]") {
  auto c = ModelConfig::FromJson(Qwen3_0_6B(), "qwen3/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->architecture == Architecture::kQwen3);
  CHECK(c->qk_norm());
  CHECK_FALSE(c->attention_bias);
  CHECK_FALSE(c->o_bias());
  CHECK(c->head_dim == 128);
  CHECK(c->q_size() == 2048);  // twice hidden_size: o_proj is [1024, 2048]
  CHECK(c->rope_theta == 1e6);
  CHECK_FALSE(c->sliding_window);
  CHECK(c->tie_word_embeddings);
  // Two [head_dim] norms a layer beside Llama's parameters of the same shape.
  ModelConfig llama = *c;
  llama.architecture = Architecture::kLlama;
  CHECK(c->LayerParameterCount() - llama.LayerParameterCount() == 2 * 128);
  auto back = ModelConfig::FromJson(c->ToJson(), "written/config.json");
  REQUIRE(back.ok());
  CHECK(back->architecture == Architecture::kQwen3);
  CHECK(back->ToJson()["model_type"] == "qwen3");
}

// Gemma 3 1B's shape in transformers 4.x's keys: one rope_theta for the full layers,
// rope_local_base_freq for the sliding ones, and every sixth layer full
// (sliding_window_pattern) rather than layer_types.
json Gemma3_1B_V4() {
  return json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})");
}

// Gemma3TextConfig(..., layer_types=[3 sliding, 1 full], rope_parameters per layer type) as
// transformers 5.17 writes it (to_json_string, the keys tophat reads).
json Gemma3ConfigV5() {
  return json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": null, "bos_token_id": 2, "dtype": "float32", "eos_token_id": 1,
    "final_logit_softcapping": null, "head_dim": 32, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 64, "intermediate_size": 128,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                    "full_attention"],
    "max_position_embeddings": 131072, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 4, "num_key_value_heads": 2, "pad_token_id": 0,
    "query_pre_attn_scalar": 24, "rms_norm_eps": 1e-06,
    "rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
    "sliding_window": 6, "tie_word_embeddings": true, "transformers_version": "5.17.0",
    "use_bidirectional_attention": false, "use_cache": true, "vocab_size": 256})");
}

TEST_CASE(
    "Gemma 3's config reads its sliding and full layers, two rotary bases and its score "
    "scale in either spelling",
    "[config]") {
  auto v4 = ModelConfig::FromJson(Gemma3_1B_V4(), "gemma3/config.json");
  INFO(v4.status().ToString());
  REQUIRE(v4.ok());
  CHECK(v4->architecture == Architecture::kGemma3);
  CHECK(v4->gemma());
  CHECK(v4->qk_norm());
  CHECK(v4->rope_theta == 1e6);
  CHECK(v4->rope_local_theta == 1e4);
  CHECK_FALSE(v4->rope_scaling.llama3);
  CHECK(v4->attention_scale() == 1.0 / 16);
  CHECK(v4->eos_token_ids == std::vector<int64_t>{1, 106});
  // Layers 5, 11, 17 and 23 attend in full; the others within 512 positions, each turning
  // with the local base.
  for (int64_t layer = 0; layer < 26; ++layer) {
    INFO("layer " << layer);
    const bool full = (layer + 1) % 6 == 0;
    CHECK(v4->LayerWindow(layer) == (full ? std::nullopt : std::optional<int64_t>(512)));
    CHECK(v4->LocalRope(layer) == !full);
  }
  // Two norms a layer more than Llama's.
  ModelConfig llama = *v4;
  llama.architecture = Architecture::kLlama;
  CHECK(v4->LayerParameterCount() - llama.LayerParameterCount() == 2 * 1152 + 2 * 256);

  auto v5 = ModelConfig::FromJson(Gemma3ConfigV5(), "gemma3-v5/config.json");
  INFO(v5.status().ToString());
  REQUIRE(v5.ok());
  CHECK(v5->rope_theta == 1e6);
  CHECK(v5->rope_local_theta == 1e4);
  CHECK(v5->attention_scale() == 1.0 / std::sqrt(24.0));
  CHECK(v5->LayerWindow(2) == 6);
  CHECK_FALSE(v5->LayerWindow(3));
  CHECK_FALSE(v5->LocalRope(3));

  // Written back (tophat's bundles and init-model) and read again: the same layers.
  for (const ModelConfig& original : {*v4, *v5}) {
    auto back = ModelConfig::FromJson(original.ToJson(), "written/config.json");
    REQUIRE(back.ok());
    CHECK(back->architecture == Architecture::kGemma3);
    CHECK(back->rope_theta == original.rope_theta);
    CHECK(back->rope_local_theta == original.rope_local_theta);
    CHECK(back->query_pre_attn_scalar == original.query_pre_attn_scalar);
    for (int64_t layer = 0; layer < original.num_hidden_layers; ++layer) {
      CHECK(back->LayerWindow(layer) == original.LayerWindow(layer));
    }
    CHECK(back->ToJson()["model_type"] == "gemma3_text");
    CHECK(back->ToJson()["hidden_activation"] == "gelu_pytorch_tanh");
  }
}

TEST_CASE(
    "Gemma 3's multimodal config reads its text model, with the defaults it leaves out "
    "and linear rope scaling",
    "[config]") {
  // Gemma 3 4B's shape: the text_config names little beyond its sizes, window and scaling.
  const json j = json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                    "model_type": "gemma3_text", "num_hidden_layers": 34,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}})");
  auto c = ModelConfig::FromJson(j, "gemma3-4b/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->architecture == Architecture::kGemma3);
  CHECK(c->multimodal_text);
  CHECK(c->hidden_size == 2560);
  CHECK(c->num_hidden_layers == 34);
  CHECK(c->num_attention_heads == 8);
  CHECK(c->num_key_value_heads == 4);
  CHECK(c->head_dim == 256);
  CHECK(c->vocab_size == 262208);
  CHECK(c->tie_word_embeddings);
  CHECK(c->eos_token_ids == std::vector<int64_t>{1, 106});
  CHECK(c->torch_dtype == "bfloat16");
  CHECK(c->rope_scaling.linear);
  CHECK(c->rope_scaling.factor == 8.0);
  CHECK(c->rope_local_theta == 1e4);
  CHECK(c->LayerWindow(0) == 1024);
  CHECK_FALSE(c->LayerWindow(5));

  json bare = j;
  bare.erase("text_config");
  auto missing = ModelConfig::FromJson(bare, "mm/config.json");
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(Message(missing.status()),
             Catch::Contains("mm/config.json: key 'text_config' must be an object"));
  json wrong = j;
  wrong["text_config"]["hidden_activation"] = "relu";
  auto refused = ModelConfig::FromJson(wrong, "mm/config.json");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(Message(refused.status()),
             Catch::Contains("mm/config.json text_config: key 'hidden_activation'"));
}

// A config changed at one key, and what its refusal must say.
struct Refusal {
  const char* what;
  json::json_pointer pointer;
  json value;
  const char* expected;
};

// Each of `refusals` applied to `base` alone is refused by FromJson(..., source) with its text.
void CheckRefusals(const json& base, const std::string& source,
                   std::initializer_list<Refusal> refusals) {
  for (const Refusal& r : refusals) {
    json j = base;
    j[r.pointer] = r.value;
    auto config = ModelConfig::FromJson(j, source);
    INFO(r.what);
    REQUIRE_FALSE(config.ok());
    CHECK_THAT(Message(config.status()), Catch::Contains(r.expected));
  }
}

TEST_CASE("What Gemma's runtime does not compute is refused, naming file and key", "[config]") {
  CheckRefusals(
      Gemma3ConfigV5(), "g.json",
      {
          {"Gemma 2's soft-capping", json::json_pointer("/final_logit_softcapping"), 30.0,
           "g.json: key 'final_logit_softcapping' 30.0 is not supported"},
          {"attention soft-capping", json::json_pointer("/attn_logit_softcapping"), 50.0,
           "g.json: key 'attn_logit_softcapping' 50.0 is not supported"},
          {"another activation", json::json_pointer("/hidden_activation"), "gelu",
           "g.json: key 'hidden_activation' \"gelu\" is not supported (gelu_pytorch_tanh only)"},
          {"bidirectional", json::json_pointer("/use_bidirectional_attention"), true,
           "g.json: key 'use_bidirectional_attention': bidirectional attention is not supported"},
          {"layer types", json::json_pointer("/layer_types"), json::array({"full_attention"}),
           "g.json: key 'layer_types' must be a list of 4 (num_hidden_layers) strings"},
          {"scaled local rope", json::json_pointer("/rope_parameters/sliding_attention/rope_type"),
           "dynamic", "'dynamic' is not supported"},
          {"scale", json::json_pointer("/query_pre_attn_scalar"), 0,
           "g.json: key 'query_pre_attn_scalar' must be > 0"},
      });
}

// Gemma 2 2B's config.json as Google publishes it (transformers 4.42): both caps, a window on
// every other layer left for Gemma2Config to derive, one rotary base.
json Gemma2_2B() {
  return json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 107], "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4",
    "use_cache": true, "vocab_size": 256000})");
}

TEST_CASE(
    "Gemma 2's config reads its caps, a window on every other layer and one rotary base, and "
    "writes them back",
    "[config]") {
  auto c = ModelConfig::FromJson(Gemma2_2B(), "gemma2/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->architecture == Architecture::kGemma2);
  CHECK(c->gemma());
  CHECK_FALSE(c->qk_norm());  // Gemma 3's head norms are not Gemma 2's
  CHECK(c->attn_logit_softcapping == 50.0);
  CHECK(c->final_logit_softcapping == 30.0);
  CHECK(c->rope_theta == 1e4);
  CHECK_FALSE(c->rope_local_theta);
  CHECK(c->attention_scale() == 1.0 / 16);
  CHECK(c->embedding_scale() == static_cast<float>(std::sqrt(2304.0)));
  CHECK(c->eos_token_ids == std::vector<int64_t>{1, 107});
  // Gemma2Config's layer_types: layer 0 slides, layer 1 attends in full, and so on.
  for (int64_t layer = 0; layer < 26; ++layer) {
    INFO("layer " << layer);
    CHECK(c->LayerWindow(layer) == (layer % 2 == 0 ? std::optional<int64_t>(4096) : std::nullopt));
    CHECK_FALSE(c->LocalRope(layer));
  }
  // Gemma 3's two extra norms a layer, without its head norms.
  ModelConfig llama = *c;
  llama.architecture = Architecture::kLlama;
  CHECK(c->LayerParameterCount() - llama.LayerParameterCount() == 2 * 2304);

  auto back = ModelConfig::FromJson(c->ToJson(), "written/config.json");
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  CHECK(back->architecture == Architecture::kGemma2);
  CHECK(back->ToJson()["model_type"] == "gemma2");
  CHECK(back->attn_logit_softcapping == 50.0);
  CHECK(back->final_logit_softcapping == 30.0);
  CHECK(back->sliding_layers == c->sliding_layers);
  CHECK_FALSE(back->rope_local_theta);

  // transformers 5's spelling, a cap turned off with null, and the caps' defaults where
  // the keys are absent (Gemma2Config's).
  json v5 = Gemma2_2B();
  v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  v5["layer_types"] = json::array();
  for (int i = 0; i < 26; ++i)
    v5["layer_types"].push_back(i < 13 ? "full_attention" : "sliding_attention");
  v5["final_logit_softcapping"] = nullptr;
  v5.erase("attn_logit_softcapping");
  auto five = ModelConfig::FromJson(v5, "gemma2-v5/config.json");
  INFO(five.status().ToString());
  REQUIRE(five.ok());
  CHECK(five->rope_theta == 1e4);
  CHECK(five->final_logit_softcapping == 0);
  CHECK(five->attn_logit_softcapping == 50.0);
  CHECK_FALSE(five->LayerWindow(12));
  CHECK(five->LayerWindow(13) == 4096);
  auto five_back = ModelConfig::FromJson(five->ToJson(), "written/config.json");
  REQUIRE(five_back.ok());
  CHECK(five_back->final_logit_softcapping == 0);
  CHECK(five_back->sliding_layers == five->sliding_layers);

  CheckRefusals(
      Gemma2_2B(), "g2.json",
      {
          {"a cap of 0", json::json_pointer("/attn_logit_softcapping"), 0.0,
           "g2.json: key 'attn_logit_softcapping' must be > 0 (or null for no cap)"},
          {"a negative cap", json::json_pointer("/final_logit_softcapping"), -30.0,
           "g2.json: key 'final_logit_softcapping' must be > 0 (or null for no cap)"},
          {"a cap that is text", json::json_pointer("/final_logit_softcapping"), "30",
           "g2.json: key 'final_logit_softcapping'"},
          {"longrope", json::json_pointer("/rope_scaling"),
           json{{"type", "longrope"},
                {"short_factor", std::vector<double>(128, 1.0)},
                {"long_factor", std::vector<double>(128, 2.0)}},
           "g2.json: key 'rope_scaling': longrope scaling is not supported for Gemma 2"},
          {"another activation", json::json_pointer("/hidden_activation"), "gelu",
           "g2.json: key 'hidden_activation' \"gelu\" is not supported (gelu_pytorch_tanh only)"},
      });
}

// Phi3Config with Phi-4-mini's features (rotary over 3/4 of each head, LongRoPE, tied
// embeddings) as transformers 5.17 writes it: partial_rotary_factor and
// original_max_position_embeddings both at the top level and in rope_parameters.
json Phi3ConfigV5() {
  return json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "dtype": "float32", "embd_pdrop": 0.0, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
    "max_position_embeddings": 256, "model_type": "phi3", "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "original_max_position_embeddings": 16,
    "pad_token_id": 0, "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_parameters": {"long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
                        "original_max_position_embeddings": 16, "partial_rotary_factor": 0.75,
                        "rope_theta": 10000.0, "rope_type": "longrope",
                        "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5], "type": "longrope"},
    "sliding_window": null, "tie_word_embeddings": true, "transformers_version": "5.17.0",
    "use_cache": true, "vocab_size": 256})");
}

// The shape of Phi-3-mini-4k-instruct's config.json (transformers 4.x keys): rotary over the
// whole head, no scaling, a window of 2047 on every layer.
json Phi3Mini4kV4() {
  return json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": true,
    "vocab_size": 32064})");
}

TEST_CASE("Phi-3's config reads partial rotary, LongRoPE and its window in either spelling",
          "[config]") {
  auto v5 = ModelConfig::FromJson(Phi3ConfigV5(), "phi4/config.json");
  INFO(v5.status().ToString());
  REQUIRE(v5.ok());
  CHECK(v5->architecture == Architecture::kPhi3);
  CHECK(v5->head_dim == 16);
  CHECK(v5->rotary_dim() == 12);
  const RopeScaling& s = v5->rope_scaling;
  CHECK(s.longrope);
  CHECK_FALSE(s.llama3);
  CHECK(s.original_max_position_embeddings == 16);
  CHECK(s.short_factor == std::vector<double>{1.0, 1.1, 1.2, 1.3, 1.4, 1.5});
  CHECK(s.long_factor == std::vector<double>{2.0, 3.0, 4.0, 5.0, 6.0, 7.0});
  // No factor given: max_position_embeddings over the original length, and the attention
  // factor LongRoPE derives from it.
  CHECK(s.factor == 16.0);
  CHECK(s.attention_factor == Approx(std::sqrt(1 + std::log(16.0) / std::log(16.0))));
  CHECK_FALSE(v5->sliding_window);

  // 4.x: rope_scaling with "type" and factors, the rest at the top level.
  json v4_json = Phi3ConfigV5();
  v4_json.erase("rope_parameters");
  v4_json["rope_scaling"] = {{"type", "longrope"},
                             {"short_factor", {1.0, 1.0, 1.0, 1.0, 1.0, 1.0}},
                             {"long_factor", {3.0, 3.0, 3.0, 3.0, 3.0, 3.0}}};
  v4_json["original_max_position_embeddings"] = 64;
  auto v4 = ModelConfig::FromJson(v4_json, "phi4-v4/config.json");
  INFO(v4.status().ToString());
  REQUIRE(v4.ok());
  CHECK(v4->rotary_dim() == 12);
  CHECK(v4->rope_scaling.original_max_position_embeddings == 64);
  CHECK(v4->rope_scaling.factor == 4.0);
  CHECK(v4->rope_scaling.long_factor[0] == 3.0);

  auto mini = ModelConfig::FromJson(Phi3Mini4kV4(), "phi3-mini/config.json");
  INFO(mini.status().ToString());
  REQUIRE(mini.ok());
  CHECK(mini->rotary_dim() == mini->head_dim);
  CHECK(mini->head_dim == 96);
  CHECK_FALSE(mini->rope_scaling.longrope);
  CHECK(mini->sliding_window == 2047);
  CHECK(mini->LayerWindow(31) == 2047);

  // Written back (tophat's bundles) and read again: the same rotary.
  for (const ModelConfig& original : {*v5, *v4, *mini}) {
    const json written = original.ToJson();
    auto back = ModelConfig::FromJson(written, "written/config.json");
    INFO(written.dump());
    REQUIRE(back.ok());
    CHECK(back->architecture == Architecture::kPhi3);
    CHECK(back->rotary_dim() == original.rotary_dim());
    CHECK(back->rope_scaling.longrope == original.rope_scaling.longrope);
    CHECK(back->rope_scaling.short_factor == original.rope_scaling.short_factor);
    CHECK(back->rope_scaling.long_factor == original.rope_scaling.long_factor);
    CHECK(back->rope_scaling.factor == original.rope_scaling.factor);
    CHECK(back->rope_scaling.attention_factor == original.rope_scaling.attention_factor);
    CHECK(back->rope_scaling.original_max_position_embeddings ==
          original.rope_scaling.original_max_position_embeddings);
    CHECK(back->sliding_window == original.sliding_window);
  }
}

TEST_CASE("Phi-4 (14B) reads as Phi-3's layer with whole-head rotary and no window", "[config]") {
  // microsoft/phi-4's config.json.
  const json phi4 = json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 100257, "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu",
    "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17920,
    "max_position_embeddings": 16384, "model_type": "phi3", "num_attention_heads": 40,
    "num_hidden_layers": 40, "num_key_value_heads": 10,
    "original_max_position_embeddings": 16384, "pad_token_id": 100349, "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 250000, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.47.0",
    "use_cache": true, "vocab_size": 100352})");
  auto c = ModelConfig::FromJson(phi4, "phi-4/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->architecture == Architecture::kPhi3);
  CHECK(c->head_dim == 128);
  CHECK(c->rotary_dim() == 128);
  CHECK(c->rope_theta == 250000.0);
  CHECK_FALSE(c->rope_scaling.longrope);
  CHECK_FALSE(c->sliding_window);
  CHECK(c->eos_token_ids == std::vector<int64_t>{100265});
  // 14.7B parameters: 40 layers of 5120 wide, untied 100k vocabulary.
  const int64_t parameters =
      c->num_hidden_layers * c->LayerParameterCount() + 2 * c->vocab_size * c->hidden_size;
  CHECK(parameters > 14'600'000'000);
  CHECK(parameters < 14'800'000'000);
}

TEST_CASE("Rotary settings Phi-3's runtime does not compute are refused, naming file and key",
          "[config]") {
  CheckRefusals(
      Phi3ConfigV5(), "p.json",
      {
          {"a short factor missing", json::json_pointer("/rope_parameters/short_factor"),
           json::array({1.0, 1.0}),
           "p.json: key 'rope_parameters.short_factor' has 2 entries; the rotary dimensions (12) "
           "need one for each pair, 6"},
          {"no long factors", json::json_pointer("/rope_parameters/long_factor"), nullptr,
           "p.json: key 'rope_parameters.long_factor' must be a non-empty list of numbers"},
          {"a factor of zero", json::json_pointer("/rope_parameters/long_factor/2"), 0,
           "p.json: key 'rope_parameters.long_factor' must hold numbers > 0, got 0"},
          {"an odd rotary width", json::json_pointer("/rope_parameters/partial_rotary_factor"),
           0.5625, "p.json: key 'partial_rotary_factor' 0.5625 turns 9 of head_dim 16 dimensions"},
          {"no rotary at all", json::json_pointer("/rope_parameters/partial_rotary_factor"), 0,
           "p.json: key 'rope_parameters.partial_rotary_factor' must be in (0, 1], got 0"},
      });
  // Llama's rotary turns the whole head: a partial factor there is refused, not ignored.
  json llama = Llama3ConfigV5();
  llama["partial_rotary_factor"] = 0.5;
  auto refused = ModelConfig::FromJson(llama, "l.json");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(Message(refused.status()),
             Catch::Contains("l.json: key 'partial_rotary_factor' 0.5 is not supported for "
                             "LlamaForCausalLM"));
}

// MixtralConfig(...) and Qwen3MoeConfig(...) as transformers 5.17 writes them (Qwen3-MoE's
// expert count under num_local_experts, where its checkpoints write num_experts).
json MixtralConfigV5() {
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "dtype": "float32", "eos_token_id": 2, "head_dim": null, "hidden_act": "silu",
    "hidden_size": 32, "intermediate_size": 48, "max_position_embeddings": 131072,
    "model_type": "mixtral", "num_attention_heads": 4, "num_experts_per_tok": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "sliding_window": null,
    "tie_word_embeddings": false, "vocab_size": 64})");
}

json Qwen3MoeConfigV5() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "bos_token_id": null,
    "decoder_sparse_step": 1, "dtype": "float32", "eos_token_id": null, "head_dim": 8,
    "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 48,
    "max_position_embeddings": 32768, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 24, "norm_topk_prob": false, "num_attention_heads": 4,
    "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "num_local_experts": 4, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "sliding_window": null, "tie_word_embeddings": false, "use_sliding_window": false,
    "vocab_size": 64})");
}

TEST_CASE("Mixtral's and Qwen3-MoE's configs read their experts, and read back", "[config]") {
  auto mixtral = ModelConfig::FromJson(MixtralConfigV5(), "mixtral/config.json");
  INFO(mixtral.status().ToString());
  REQUIRE(mixtral.ok());
  CHECK(mixtral->architecture == Architecture::kMixtral);
  CHECK(mixtral->num_experts == 4);
  CHECK(mixtral->num_experts_per_token == 2);
  CHECK(mixtral->moe_intermediate_size == 48);  // its intermediate_size
  CHECK(mixtral->normalize_expert_weights);
  CHECK(mixtral->MoeLayer(0));
  CHECK(mixtral->MoeLayer(1));
  CHECK_FALSE(mixtral->qk_norm());
  // Every expert's three matrices and a router row each, besides attention and norms.
  CHECK(mixtral->LayerParameterCount() ==
        4 * 32 * 32 + 4 * (3 * 32 * 48 + 32) + 2 * 32 - 2 * 32 * 16);

  auto qwen = ModelConfig::FromJson(Qwen3MoeConfigV5(), "qwen3_moe/config.json");
  INFO(qwen.status().ToString());
  REQUIRE(qwen.ok());
  CHECK(qwen->architecture == Architecture::kQwen3Moe);
  CHECK(qwen->num_experts == 4);
  CHECK(qwen->moe_intermediate_size == 24);
  CHECK_FALSE(qwen->normalize_expert_weights);
  CHECK(qwen->qk_norm());
  // A token multiplies the router and 2 of the 4 experts; the model stores all of them.
  CHECK(qwen->LayerActiveMatrixParameters(0) ==
        32 * (32 + 2 * 16) + 32 * 32 + 4 * 32 + 2 * 3 * 32 * 24);
  CHECK(qwen->ParameterCount() == 2 * 64 * 32 + 32 + 2 * qwen->LayerParameterCount(0));

  // A Qwen3-MoE checkpoint's spelling, with a dense layer among sparse ones: every second
  // layer sparse (decoder_sparse_step 2), layer 3 dense all the same.
  json checkpoint = Qwen3MoeConfigV5();
  checkpoint.erase("num_local_experts");
  checkpoint["num_experts"] = 8;
  checkpoint["num_hidden_layers"] = 4;
  checkpoint["decoder_sparse_step"] = 2;
  checkpoint["mlp_only_layers"] = {3};
  checkpoint["norm_topk_prob"] = true;
  auto sparse = ModelConfig::FromJson(checkpoint, "qwen3_moe/config.json");
  REQUIRE(sparse.ok());
  CHECK(sparse->num_experts == 8);
  CHECK(sparse->normalize_expert_weights);
  CHECK_FALSE(sparse->MoeLayer(0));
  CHECK(sparse->MoeLayer(1));
  CHECK_FALSE(sparse->MoeLayer(2));
  CHECK_FALSE(sparse->MoeLayer(3));

  for (const ModelConfig& original : {*mixtral, *sparse}) {
    auto back = ModelConfig::FromJson(original.ToJson(), "written/config.json");
    INFO(back.status().ToString());
    REQUIRE(back.ok());
    CHECK(back->architecture == original.architecture);
    CHECK(back->num_experts == original.num_experts);
    CHECK(back->num_experts_per_token == original.num_experts_per_token);
    CHECK(back->moe_intermediate_size == original.moe_intermediate_size);
    CHECK(back->normalize_expert_weights == original.normalize_expert_weights);
    CHECK(back->decoder_sparse_step == original.decoder_sparse_step);
    CHECK(back->mlp_only_layers == original.mlp_only_layers);
  }
}

TEST_CASE("Qwen2-MoE's config reads its shared expert and q/k/v biases, and reads back",
          "[config]") {
  // Qwen2MoeConfig(...) as transformers 5.17 writes it (sliding_window 0 when not used).
  const json written = json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": null,
    "decoder_sparse_step": 1, "dtype": "float32", "eos_token_id": null, "hidden_act": "silu",
    "hidden_size": 32, "intermediate_size": 48, "layer_types": ["full_attention",
    "full_attention"], "max_position_embeddings": 32768, "max_window_layers": 28,
    "mlp_only_layers": [], "model_type": "qwen2_moe", "moe_intermediate_size": 24,
    "norm_topk_prob": false, "num_attention_heads": 4, "num_experts": 6,
    "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "qkv_bias": true, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "shared_expert_intermediate_size": 40, "sliding_window": 0,
    "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 64})");
  auto c = ModelConfig::FromJson(written, "qwen2_moe/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->architecture == Architecture::kQwen2Moe);
  CHECK(c->num_experts == 6);
  CHECK(c->shared_expert_intermediate_size == 40);
  CHECK(c->attention_bias);
  CHECK_FALSE(c->o_bias());
  CHECK_FALSE(c->qk_norm());
  CHECK(c->SharedExpertParameters() == 3 * 32 * 40 + 32);
  auto back = ModelConfig::FromJson(c->ToJson(), "written/config.json");
  REQUIRE(back.ok());
  CHECK(back->shared_expert_intermediate_size == 40);
  CHECK(back->attention_bias);

  json no_bias = written;
  no_bias["qkv_bias"] = false;
  c = ModelConfig::FromJson(no_bias, "qwen2_moe/config.json");
  REQUIRE(c.ok());
  CHECK_FALSE(c->attention_bias);

  // A window without layer_types: Qwen2MoeConfig's rule is not Qwen2's, and none is guessed.
  json windowed = written;
  windowed.erase("layer_types");
  windowed["use_sliding_window"] = true;
  windowed["sliding_window"] = 16;
  c = ModelConfig::FromJson(windowed, "qwen2_moe/config.json");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(Message(c.status()), Catch::Contains("key 'use_sliding_window'"));
}

TEST_CASE("Expert settings out of range are refused, naming file and key", "[config]") {
  json too_many = MixtralConfigV5();
  too_many["num_experts_per_tok"] = 5;
  auto c = ModelConfig::FromJson(too_many, "mixtral/config.json");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(Message(c.status()),
             Catch::Contains("mixtral/config.json: key 'num_experts_per_tok' (5) is more than "
                             "the experts (num_local_experts: 4)"));

  json bad_layer = Qwen3MoeConfigV5();
  bad_layer["mlp_only_layers"] = {2};
  c = ModelConfig::FromJson(bad_layer, "qwen3_moe/config.json");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(Message(c.status()), Catch::Contains("mlp_only_layers"));
  CHECK_THAT(Message(c.status()), Catch::Contains("below num_hidden_layers (2)"));

  json zero = Qwen3MoeConfigV5();
  zero["num_local_experts"] = 0;
  c = ModelConfig::FromJson(zero, "qwen3_moe/config.json");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(Message(c.status()), Catch::Contains("num_local_experts"));
}

TEST_CASE("ToJson reads back, a Qwen2 window on every layer included", "[config]") {
  auto llama = ModelConfig::FromJson(Llama3ConfigV5(), "l/config.json");
  REQUIRE(llama.ok());
  json qwen_json = Qwen2ConfigV5();
  qwen_json["use_sliding_window"] = true;
  qwen_json["sliding_window"] = 8;
  qwen_json["layer_types"] = {"sliding_attention", "sliding_attention"};
  auto qwen = ModelConfig::FromJson(qwen_json, "q/config.json");
  REQUIRE(qwen.ok());
  for (const ModelConfig& original : {*llama, *qwen}) {
    auto back = ModelConfig::FromJson(original.ToJson(), "written/config.json");
    REQUIRE(back.ok());
    CHECK(back->rope_theta == original.rope_theta);
    CHECK(back->rope_scaling.llama3 == original.rope_scaling.llama3);
    CHECK(back->rope_scaling.factor == original.rope_scaling.factor);
    CHECK(back->sliding_window == original.sliding_window);
    CHECK(back->head_dim == original.head_dim);
    CHECK(back->tie_word_embeddings == original.tie_word_embeddings);
    CHECK(back->torch_dtype == original.torch_dtype);
  }
  // transformers reads Qwen2's window from max_window_layers (default 28) or layer_types.
  const json written = qwen->ToJson();
  CHECK(written["max_window_layers"] == 0);
  CHECK(written["layer_types"] == json({"sliding_attention", "sliding_attention"}));
}

TEST_CASE("YaRN reads as Qwen3's model card sets it, and as gpt-oss and DeepSeek spell it",
          "[config]") {
  // Qwen3's card for 131,072 positions: factor 4 over the original 32,768, in 4.x's spelling.
  json qwen3 = Qwen3_0_6B();
  qwen3["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  auto c = ModelConfig::FromJson(qwen3, "qwen3-yarn/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  const RopeScaling& s = c->rope_scaling;
  CHECK(s.yarn);
  CHECK(s.scaled());
  CHECK_FALSE(s.longrope);
  CHECK(s.factor == 4.0);
  CHECK(s.original_max_position_embeddings == 32768);
  CHECK(s.attention_factor == Approx(0.1 * std::log(4.0) + 1.0));
  CHECK(s.beta_fast == 32.0);
  CHECK(s.beta_slow == 1.0);
  CHECK(s.truncate);
  auto again = ModelConfig::FromJson(c->ToJson(), "round trip");
  REQUIRE(again.ok());
  CHECK(again->rope_scaling.yarn);
  CHECK(again->rope_scaling.factor == 4.0);
  CHECK(again->rope_scaling.attention_factor == s.attention_factor);
  CHECK(again->rope_scaling.original_max_position_embeddings == 32768);

  // gpt-oss's: transformers 5's rope_parameters, the ramp's ends not rounded.
  qwen3.erase("rope_scaling");
  qwen3["rope_parameters"] = {{"rope_type", "yarn"},
                              {"rope_theta", 150000.0},
                              {"factor", 32.0},
                              {"beta_fast", 32.0},
                              {"beta_slow", 1.0},
                              {"truncate", false},
                              {"original_max_position_embeddings", 4096}};
  c = ModelConfig::FromJson(qwen3, "gpt-oss/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->rope_theta == 150000.0);
  CHECK_FALSE(c->rope_scaling.truncate);
  CHECK(c->rope_scaling.attention_factor == Approx(0.1 * std::log(32.0) + 1.0));
  again = ModelConfig::FromJson(c->ToJson(), "round trip");
  REQUIRE(again.ok());
  CHECK_FALSE(again->rope_scaling.truncate);

  // DeepSeek's: no factor (max_position_embeddings over the original length), and the
  // attention factor from mscale over mscale_all_dim; beta 0 means the default.
  qwen3["max_position_embeddings"] = 16384;
  qwen3["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0},
                              {"mscale", 0.707},     {"mscale_all_dim", 1.0},
                              {"beta_fast", 0},      {"original_max_position_embeddings", 4096}};
  c = ModelConfig::FromJson(qwen3, "deepseek/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->rope_scaling.factor == 4.0);
  CHECK(c->rope_scaling.beta_fast == 32.0);
  CHECK(c->rope_scaling.attention_factor ==
        Approx((0.1 * 0.707 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0)));
}

// openai/gpt-oss-20b's config.json (transformers 4.55's keys).
json GptOss20B() {
  json j = json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
    "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
                            "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
                            "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": false},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0",
    "use_cache": true, "vocab_size": 201088})");
  std::vector<std::string> types;
  for (int i = 0; i < 24; ++i) types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  return j;
}

TEST_CASE("gpt-oss's config reads its sinks, windows, YaRN and MXFP4 experts, and reads back",
          "[config]") {
  auto c = ModelConfig::FromJson(GptOss20B(), "gpt-oss-20b/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->gpt_oss());
  CHECK(c->attention_bias);
  CHECK(c->o_bias());
  CHECK(c->sliding_window == 128);
  CHECK(c->LayerWindow(0) == 128);
  CHECK_FALSE(c->LayerWindow(1));
  CHECK(c->num_experts == 32);
  CHECK(c->num_experts_per_token == 4);
  CHECK(c->moe_intermediate_size == 2880);
  CHECK(c->normalize_expert_weights);
  CHECK(c->MoeLayer(0));
  CHECK(c->MoeLayer(23));
  CHECK(c->mxfp4_experts);
  CHECK(c->rope_theta == 150000.0);
  CHECK(c->rope_scaling.yarn);
  CHECK_FALSE(c->rope_scaling.truncate);
  CHECK(c->rope_scaling.factor == 32.0);
  CHECK(c->rope_scaling.original_max_position_embeddings == 4096);
  // OpenAI's count for gpt-oss-20b: 20.91B, the sinks and biases included.
  CHECK(c->ParameterCount() == 20914757184);
  auto again = ModelConfig::FromJson(c->ToJson(), "round trip");
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  CHECK(again->gpt_oss());
  CHECK(again->sliding_layers == c->sliding_layers);
  CHECK(again->num_experts == 32);
  CHECK(again->moe_intermediate_size == 2880);
  CHECK(again->mxfp4_experts);
  CHECK(again->rope_scaling.yarn);
  CHECK(again->ParameterCount() == c->ParameterCount());
  // Plain rope, named (a rope_scaling without a type), reads back plain, not as the default
  // YaRN (fuzz/regressions/model_config/gpt-oss-plain-rope-round-trip).
  json plain = GptOss20B();
  plain["rope_scaling"] = {{"factor", 32.0}};
  auto plain_rope = ModelConfig::FromJson(plain, "plain/config.json");
  REQUIRE(plain_rope.ok());
  CHECK_FALSE(plain_rope->rope_scaling.yarn);
  auto plain_again = ModelConfig::FromJson(plain_rope->ToJson(), "round trip");
  REQUIRE(plain_again.ok());
  CHECK_FALSE(plain_again->rope_scaling.yarn);

  // GptOssConfig's defaults: every other layer sliding from the first, over 128; YaRN by 32
  // from 4,096 positions on a base of 150,000; biases on.
  json bare = GptOss20B();
  for (const char* key : {"layer_types", "sliding_window", "rope_scaling", "rope_theta",
                          "attention_bias", "quantization_config"}) {
    bare.erase(key);
  }
  c = ModelConfig::FromJson(bare, "bare/config.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->LayerWindow(2) == 128);
  CHECK_FALSE(c->LayerWindow(3));
  CHECK(c->rope_theta == 150000.0);
  CHECK(c->rope_scaling.yarn);
  CHECK(c->rope_scaling.factor == 32.0);
  CHECK_FALSE(c->rope_scaling.truncate);
  CHECK(c->attention_bias);
  CHECK_FALSE(c->mxfp4_experts);
}

TEST_CASE("A clamp gpt-oss does not compute, and another tool's quantization, are refused",
          "[config]") {
  json clamp = GptOss20B();
  clamp["swiglu_limit"] = 5.0;
  auto c = ModelConfig::FromJson(clamp, "g.json");
  REQUIRE_FALSE(c.ok());
  CHECK(Message(c.status()) ==
        "g.json: key 'swiglu_limit' 5 is not supported (GptOssForCausalLM clamps its experts' "
        "SwiGLU at 7)");
  json gptq = Llama3ConfigV5();
  gptq["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  c = ModelConfig::FromJson(gptq, "q.json");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(Message(c.status()),
             Catch::StartsWith("q.json: key 'quantization_config.quant_method' 'gptq' is not "
                               "supported"));
  // MXFP4 is gpt-oss's only.
  json mxfp4 = Llama3ConfigV5();
  mxfp4["quantization_config"] = {{"quant_method", "mxfp4"}};
  CHECK_FALSE(ModelConfig::FromJson(mxfp4, "m.json").ok());
}
}  // namespace
}  // namespace tophat
