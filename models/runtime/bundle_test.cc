#include "models/runtime/bundle.h"

#include <catch2/catch.hpp>

#include "base/test_util.h"
#include <fstream>

#include "models/runtime/model_init.h"
#include "models/runtime/submodel.h"
#include "models/tokenizers/bpe_tokenizer.h"

namespace tophat {
namespace {

TEST_CASE("A split's two bundles carry the fingerprint of the checkpoint's weights", "[bundle]") {
  const ModelConfig config = TinyTestConfig();
  testing::TempDir dir;
  auto split = [&](uint64_t seed, const std::string& name) {
    const auto model = dir.path() / ("model-" + name);
    REQUIRE(WriteCheckpoint(config, InitWeights(config, seed), model).ok());
    auto result = SplitCheckpoint(
        {.model_dir = model, .input_layers = 1, .output_layers = 1, .out_dir = dir.path() / name});
    REQUIRE(result.ok());
    return *result;
  };
  const SplitResult first = split(1, "a");
  const SplitResult again = split(1, "b");     // the same weights, written again
  const SplitResult other = split(2, "c");     // the same shapes, other weights
  REQUIRE(first.device.model_fingerprint.starts_with("sha256:"));
  CHECK(first.device.model_fingerprint.size() == 7 + 64);
  CHECK(first.cloud.model_fingerprint == first.device.model_fingerprint);
  CHECK(again.device.model_fingerprint == first.device.model_fingerprint);
  CHECK(other.device.model_fingerprint != first.device.model_fingerprint);
  // It survives the manifest's round trip.
  auto loaded = BundleManifest::Load(first.cloud_dir);
  REQUIRE(loaded.ok());
  CHECK(loaded->model_fingerprint == first.cloud.model_fingerprint);
}

TEST_CASE("A device bundle of a model with tied embeddings holds the table once", "[bundle]") {
  testing::TempDir dir;
  for (bool tied : {true, false}) {
    INFO("tied " << tied);
    ModelConfig config = TinyTestConfig();
    config.tie_word_embeddings = tied;
    const auto model = dir.path() / (tied ? "tied" : "untied");
    REQUIRE(WriteCheckpoint(config, InitWeights(config, 4), model).ok());
    std::ofstream(model / "tokenizer.json") << PlaceholderByteLevelTokenizerJson(300, 298, 299);
    auto split = SplitCheckpoint({.model_dir = model, .input_layers = 1, .output_layers = 1,
                                  .out_dir = model / "split"});
    REQUIRE(split.ok());
    auto bundle = DeviceBundle::Load(split->device_dir);
    INFO(bundle.status().ToString());
    REQUIRE(bundle.ok());
    const at::Tensor& embedding = bundle->input->embedding().dense;
    const at::Tensor& head = bundle->output->lm_head().dense;
    CHECK(embedding.is_same(head) == tied);
    // Either way each holds the checkpoint's values.
    auto full = LoadFullModel(model, {.huge_pages = false});
    REQUIRE(full.ok());
    CHECK(at::equal(embedding, (*full)->embedding().dense));
    CHECK(at::equal(head, (*full)->lm_head().dense));
  }
}

TEST_CASE("An int8 device bundle stores its matrices as int8, loads as int8, and computes what "
          "the checkpoint quantized at load computes",
          "[bundle]") {
  testing::TempDir dir;
  for (bool tied : {true, false}) {
    INFO("tied " << tied);
    ModelConfig config = TinyTestConfig();
    config.tie_word_embeddings = tied;
    const auto model = dir.path() / (tied ? "tied" : "untied");
    REQUIRE(WriteCheckpoint(config, InitWeights(config, 4), model).ok());
    std::ofstream(model / "tokenizer.json") << PlaceholderByteLevelTokenizerJson(300, 298, 299);
    auto plain = SplitCheckpoint({.model_dir = model, .input_layers = 1, .output_layers = 1,
                                  .out_dir = model / "plain"});
    auto split = SplitCheckpoint({.model_dir = model, .input_layers = 1, .output_layers = 1,
                                  .out_dir = model / "int8",
                                  .device_weights = DeviceWeights::kInt8});
    REQUIRE(plain.ok());
    REQUIRE(split.ok());
    CHECK(split->device.weights == "int8");
    CHECK(split->cloud.weights.empty());
    // The cloud's half is the same either way, the device's is int8 on disk.
    CHECK(std::filesystem::file_size(split->cloud_dir / "model.safetensors") ==
          std::filesystem::file_size(plain->cloud_dir / "model.safetensors"));
    const double ratio =
        static_cast<double>(std::filesystem::file_size(split->device_dir / "model.safetensors")) /
        static_cast<double>(std::filesystem::file_size(plain->device_dir / "model.safetensors"));
    CHECK(ratio < 0.3);
    auto reader = CheckpointReader::Open(split->device_dir);
    REQUIRE(reader.ok());
    for (const std::string name : {"model.layers.0.self_attn.q_proj.weight",
                                   "model.layers.3.mlp.down_proj.weight",
                                   "model.embed_tokens.weight"}) {
      INFO(name);
      auto stored = (*reader)->StoredDType(name);
      REQUIRE(stored.ok());
      CHECK(*stored == SafetensorsDType::kI8);
      CHECK((*reader)->Has(name + "_scale"));
    }
    auto manifest = BundleManifest::Load(split->device_dir);
    REQUIRE(manifest.ok());
    CHECK(manifest->weights == "int8");

    auto bundle = DeviceBundle::Load(split->device_dir);
    INFO(bundle.status().ToString());
    REQUIRE(bundle.ok());
    CHECK(bundle->input->int8_weights());
    CHECK(bundle->output->int8_weights());
    CHECK(bundle->input->embedding().int8.values.is_same(bundle->output->lm_head().int8.values) ==
          tied);
    // The same numbers as the float32 bundle's matrices quantized as they load.
    auto quantized = DeviceBundle::Load(plain->device_dir, {.quantize_int8 = true});
    REQUIRE(quantized.ok());
    const at::Tensor ids = at::tensor({5, 17, 250, 3}, at::kLong);
    auto hidden = bundle->input->Embed(ids);
    auto expected = quantized->input->Embed(ids);
    REQUIRE(hidden.ok());
    REQUIRE(expected.ok());
    CHECK(at::equal(*hidden, *expected));
    auto logits = bundle->output->Logits(*hidden);
    auto expected_logits = quantized->output->Logits(*expected);
    REQUIRE(logits.ok());
    REQUIRE(expected_logits.ok());
    CHECK(at::equal(*logits, *expected_logits));
    // On another compute dtype the int8 matrices are dequantized as they load.
    auto bf16 = DeviceBundle::Load(split->device_dir, {.dtype = at::kBFloat16});
    REQUIRE(bf16.ok());
    CHECK_FALSE(bf16->output->int8_weights());
    CHECK(bf16->output->lm_head().dense.scalar_type() == at::kBFloat16);
  }
}

TEST_CASE("A manifest or adapter file with a key of the wrong type is an error naming the "
          "file, not an exception",
          "[bundle]") {
  testing::TempDir dir;
  testing::WriteBytes(dir.path() / kBundleManifestFile,
                      R"({"format": "tophat-bundle", "kind": 3})");
  absl::StatusOr<BundleManifest> manifest;
  REQUIRE_NOTHROW(manifest = BundleManifest::Load(dir.path()));
  REQUIRE_FALSE(manifest.ok());
  CHECK_THAT(std::string(manifest.status().message()), Catch::Contains(kBundleManifestFile));
  testing::WriteBytes(dir.path() / kAdapterInfoFile, R"({"format": ["tophat-adapter"]})");
  absl::StatusOr<AdapterInfo> adapter;
  REQUIRE_NOTHROW(adapter = AdapterInfo::Load(dir.path()));
  REQUIRE_FALSE(adapter.ok());
  CHECK_THAT(std::string(adapter.status().message()), Catch::Contains(kAdapterInfoFile));
}

TEST_CASE("A manifest's weights key takes int8 or nothing", "[bundle]") {
  nlohmann::json manifest = {{"format", "tophat-bundle"},
                             {"format_version", 1},
                             {"kind", "device"},
                             {"num_hidden_layers", 4},
                             {"input_layers", {0, 1}},
                             {"middle_layers", {1, 3}},
                             {"output_layers", {3, 4}},
                             {"weights", "int4"}};
  auto parsed = BundleManifest::FromJson(manifest, "m.json");
  REQUIRE_FALSE(parsed.ok());
  CHECK_THAT(std::string(parsed.status().message()), Catch::Contains("'weights'"));
  manifest["weights"] = "int8";
  REQUIRE(BundleManifest::FromJson(manifest, "m.json").ok());
}

}  // namespace
}  // namespace tophat
