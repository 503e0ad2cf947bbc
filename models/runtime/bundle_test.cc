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

}  // namespace
}  // namespace tophat
