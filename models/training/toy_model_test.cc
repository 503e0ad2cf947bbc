#include "models/training/toy_model.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/test_util.h"
#include "models/training/toy_corpus.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

namespace fs = std::filesystem;
using testing::ReadBytes;

ToyModelOptions TinyOptions(const fs::path& out) {
  ToyModelOptions o;
  o.out_dir = out;
  o.hidden_size = 32;
  o.intermediate_size = 64;
  o.num_layers = 2;
  o.num_heads = 2;
  o.num_kv_heads = 1;
  o.sequence_length = 32;
  o.batch_size = 4;
  o.steps = 3;
  o.corpus_documents = 400;
  o.vocab_size = 320;
  o.adapter_input_layers = 1;
  o.adapter_steps = 3;
  return o;
}

TEST_CASE("The toy corpus is deterministic per seed", "[toy]") {
  CHECK(GenerateToyCorpus(5, 30) == GenerateToyCorpus(5, 30));
  CHECK(GenerateToyCorpus(5, 30) != GenerateToyCorpus(6, 30));
  CHECK(ToyPrompts(1, 4) == ToyPrompts(1, 4));
}

TEST_CASE("Toy model training is deterministic and cached", "[toy]") {
  const fs::path base = fs::temp_directory_path() / ("tophat_toy_det_" + std::to_string(::getpid()));
  fs::remove_all(base);
  auto a = MakeToyModel(TinyOptions(base / "a"));
  auto b = MakeToyModel(TinyOptions(base / "b"));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK_FALSE(a->reused_cache);
  CHECK(fs::exists(base / "a" / "adapter.safetensors"));
  CHECK(a->adapter_parameters > 0);
  for (const char* file : {"model.safetensors", "tokenizer.model", "config.json",
                           "adapter.safetensors"}) {
    INFO(file);
    CHECK(ReadBytes(base / "a" / file) == ReadBytes(base / "b" / file));
  }
  // Same options again: reused, not retrained. Different options: retrained.
  auto again = MakeToyModel(TinyOptions(base / "a"));
  REQUIRE(again.ok());
  CHECK(again->reused_cache);
  ToyModelOptions other = TinyOptions(base / "a");
  other.seed = 99;
  auto retrained = MakeToyModel(other);
  REQUIRE(retrained.ok());
  CHECK_FALSE(retrained->reused_cache);
  CHECK(ReadBytes(base / "a" / "model.safetensors") != ReadBytes(base / "b" / "model.safetensors"));
  fs::remove_all(base);
}

}  // namespace
}  // namespace tophat
