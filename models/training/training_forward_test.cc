#include "models/training/training_forward.h"

#include <catch2/catch.hpp>
#include <random>

#include "base/test_util.h"
#include "models/formats/checkpoint.h"
#include "models/runtime/model_init.h"
#include "models/runtime/submodel.h"

namespace tophat {
namespace {

// The trainers' batched forward is the runtime's layer math: an adapter distilled against
// other arithmetic (a bias or head norm left out, no sliding window) would draft for a model
// that is not the one served.
TEST_CASE("The training forward computes the runtime's logits for every architecture",
          "[training]") {
  std::mt19937 rng(3);
  for (const auto& [name, config] : TinyTestVariants()) {
    SECTION(name) {
      testing::TempDir dir;
      const NamedTensors init = InitWeights(config, 11);
      REQUIRE(WriteCheckpoint(config, init, dir.path()).ok());
      auto checkpoint = CheckpointReader::Open(dir.path());
      REQUIRE(checkpoint.ok());
      auto full = Submodel::Load(config, **checkpoint, SubmodelSpec::Full(config));
      REQUIRE(full.ok());
      WeightMap weights;
      for (const auto& [n, t] : init) weights.emplace(n, t);

      // Longer than the sliding-window variant's window, so that the window matters.
      std::uniform_int_distribution<int64_t> token(0, config.vocab_size - 1);
      std::vector<int64_t> ids(19);
      for (int64_t& id : ids) id = token(rng);
      const at::Tensor tokens = at::tensor(ids, at::kLong);
      KvCache cache = (*full)->NewCache();
      auto hidden = (*full)->Forward(*(*full)->Embed(tokens), cache);
      REQUIRE(hidden.ok());
      const at::Tensor runtime = *(*full)->Logits(*hidden);

      const RopeTable rope = RopeTable::Create(config, 32, at::kCPU);
      const at::Tensor training = TrainingLogits(config, weights, rope, tokens.unsqueeze(0))[0];
      CHECK((training - runtime).abs().max().item<float>() < 1e-4);
    }
  }
}

}  // namespace
}  // namespace tophat
