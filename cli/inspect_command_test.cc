#include "cli/inspect_command.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "base/test_util.h"
#include "models/runtime/model_init.h"

namespace tophat::cli {
namespace {

ModelConfig Variant(const std::string& wanted) {
  for (const auto& [name, config] : TinyTestVariants()) {
    if (name == wanted) return config;
  }
  FAIL("no test variant " << wanted);
  return {};
}

// A checkpoint of `config` (float32) in `dir`, with seed 7's weights.
void Write(const ModelConfig& config, const std::filesystem::path& dir) {
  REQUIRE(WriteCheckpoint(config, InitWeights(config, 7), dir).ok());
}

TEST_CASE(
    "inspect reads a Gemma 2 checkpoint as serving does: windows, caps, the GPU verdict "
    "and each side's bytes",
    "[cli]") {
  testing::TempDir dir;
  const ModelConfig config = Variant("gemma2_softcap");
  Write(config, dir.path());
  auto inspection = InspectCheckpoint({.model = dir.path(), .input_layers = 1, .output_layers = 1});
  INFO(inspection.status().ToString());
  REQUIRE(inspection.ok());
  const nlohmann::json& in = *inspection;
  CHECK(in["architecture"] == "Gemma2ForCausalLM");
  CHECK(in["sliding_layers"] == std::vector<int64_t>{0, 2});
  CHECK(in["attn_logit_softcapping"].get<double>() == config.attn_logit_softcapping);
  CHECK(in["final_logit_softcapping"].get<double>() == config.final_logit_softcapping);
  CHECK_THAT(in["gpu_cloud"].get<std::string>(),
             Catch::Contains("Gemma2ForCausalLM runs on the CPU only for now"));
  // Float32: four bytes a parameter, split by layer (the device: the tied embedding, layers
  // 0 and 3, the norms; the cloud: layers 1 and 2).
  const int64_t layer_bytes = 4 * config.LayerParameterCount();
  CHECK(in["split"]["cloud_bytes"] == 2 * layer_bytes);
  CHECK(in["split"]["device_bytes"] ==
        2 * layer_bytes + 4 * (config.vocab_size * config.hidden_size + config.hidden_size));
  CHECK(in["stored_bytes_by_dtype"]["F32"] ==
        in["split"]["cloud_bytes"].get<int64_t>() + in["split"]["device_bytes"].get<int64_t>());
  CHECK(in["split"]["cloud_kv_bytes_per_token_float32"] ==
        2 * (2 * config.num_key_value_heads * config.head_dim * 4));
  // No tokenizer or template was written: reported, not fatal, naming what is missing.
  CHECK(in["tokenizer"].contains("error"));
  CHECK_THAT(in["chat_template"]["error"].get<std::string>(),
             Catch::Contains("tokenizer_config.json"));

  const std::string text = FormatInspection(in);
  CHECK_THAT(text, Catch::Contains("2 of 4 layers slide over 6 positions"));
  CHECK_THAT(text, Catch::Contains("scores soft-capped at 0.03; logits soft-capped at 0.1"));
  CHECK_THAT(text, Catch::Contains("split m=1 k=1"));
  CHECK_THAT(text, Catch::Contains("chat refused:"));
}

TEST_CASE("inspect names the chat template's family and a GPU cloud's yes for Llama", "[cli]") {
  testing::TempDir dir;
  Write(TinyTestConfig(), dir.path());
  std::ofstream(dir.path() / "tokenizer_config.json")
      << R"({"chat_template": "{% for message in messages %}<|im_start|>{{ message['role'] }})"
      << R"(\n{{ message['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"})";
  auto inspection = InspectCheckpoint({.model = dir.path()});
  INFO(inspection.status().ToString());
  REQUIRE(inspection.ok());
  CHECK((*inspection)["gpu_cloud"] == "yes");
  CHECK((*inspection)["chat_template"]["family"] == "chatml");
  CHECK((*inspection)["chat_template"]["turn_ends"] == nlohmann::json::array({"<|im_end|>"}));
  CHECK((*inspection)["sliding_layers"].empty());
  CHECK_THAT(FormatInspection(*inspection), Catch::Contains("chatml (end of turn <|im_end|>"));
}

TEST_CASE("inspect reads a mixture of experts: its experts, sparse layers and GPU verdict",
          "[cli]") {
  testing::TempDir dir;
  const ModelConfig config = Variant("qwen3_moe_mixed");
  Write(config, dir.path());
  auto inspection = InspectCheckpoint({.model = dir.path(), .input_layers = 1, .output_layers = 1});
  INFO(inspection.status().ToString());
  REQUIRE(inspection.ok());
  const nlohmann::json& in = *inspection;
  CHECK(in["architecture"] == "Qwen3MoeForCausalLM");
  CHECK(in["experts"]["count"] == 8);
  CHECK(in["experts"]["per_token"] == 3);
  CHECK(in["experts"]["sparse_layers"] == std::vector<int64_t>{0, 1, 3});
  CHECK_THAT(in["gpu_cloud"].get<std::string>(),
             Catch::Contains("Qwen3MoeForCausalLM runs on the CPU only for now"));
  // The cloud holds layers 1 (sparse) and 2 (dense).
  CHECK(in["split"]["cloud_bytes"] ==
        4 * (config.LayerParameterCount(1) + config.LayerParameterCount(2)));
  CHECK(config.LayerParameterCount(1) > config.LayerParameterCount(2));
  CHECK_THAT(FormatInspection(in), Catch::Contains("8 of MLP 48, 3 a token, in 3 of 4 layers"));
}

TEST_CASE("inspect refuses what serving would refuse, naming it", "[cli]") {
  testing::TempDir dir;
  auto missing = InspectCheckpoint({.model = dir.path()});
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("config.json"));

  Write(TinyTestConfig(), dir.path());
  auto whole = InspectCheckpoint({.model = dir.path(), .input_layers = 3, .output_layers = 1});
  REQUIRE_FALSE(whole.ok());
  CHECK_THAT(std::string(whole.status().message()),
             Catch::Contains("-m 3 -k 1: a split needs m >= 1, k >= 0 and m + k below the 4"));

  std::filesystem::remove(dir.path() / "model.safetensors");
  auto weightless = InspectCheckpoint({.model = dir.path()});
  REQUIRE_FALSE(weightless.ok());
  INFO(weightless.status().ToString());
  CHECK_THAT(std::string(weightless.status().message()), Catch::Contains(dir.path().string()));
}

}  // namespace
}  // namespace tophat::cli
