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
  // One training thread: CTest runs these cases beside others, where two OpenMP threads that
  // spin waiting for each other cost many times their work.
  o.threads = 1;
  return o;
}

TEST_CASE("An outline point's expansion is checked against its creature", "[toy]") {
  CHECK(IsToySentenceAbout("the sleepy cat chased the mouse in the garden .", "cat"));
  CHECK(IsToySentenceAbout("the cat caught the ball at night .", "cat"));
  CHECK(IsToySentenceAbout("the dog fetched the bone in the park in the evening .", "dog"));
  CHECK_FALSE(IsToySentenceAbout("the sleepy cat chased the mouse in the garden .", "dog"));
  CHECK_FALSE(IsToySentenceAbout("the cat fetched the mouse .", "cat"));  // a dog's verb
  CHECK_FALSE(IsToySentenceAbout("the cat chased the mouse", "cat"));     // unfinished
  CHECK_FALSE(IsToySentenceAbout("the cat chased the mouse . the cat", "cat"));
  CHECK_FALSE(IsToySentenceAbout("", "cat"));
  CHECK_FALSE(IsToySentenceAbout("the unicorn chased the mouse .", "unicorn"));

  const ToyOutlineScore score = ScoreToyOutlineAnswer(
      "one cat two dog . point one cat : the cat chased the mouse . point two dog : the dog "
      "chased the mouse . end .");
  CHECK(score.points == 2);
  CHECK(score.valid == 1);  // a dog does not chase
  // Every answer of the corpus's own outline documents is valid.
  for (const std::string& doc : GenerateToyCorpus(11, 300)) {
    if (!doc.starts_with("stories of")) continue;
    const ToyOutlineScore s = ScoreToyOutlineAnswer(doc);
    CHECK(s.points >= 2);
    CHECK(s.valid == s.points);
  }
}

TEST_CASE("The toy corpus is deterministic per seed", "[toy]") {
  CHECK(GenerateToyCorpus(5, 30) == GenerateToyCorpus(5, 30));
  CHECK(GenerateToyCorpus(5, 30) != GenerateToyCorpus(6, 30));
  CHECK(ToyPrompts(1, 4) == ToyPrompts(1, 4));
  // Outline answers are part of the corpus, and their prompts are drawn the same way.
  const std::vector<std::string> corpus = GenerateToyCorpus(5, 200);
  const auto outlines = std::count_if(corpus.begin(), corpus.end(), [](const std::string& d) {
    return d.starts_with("stories of") && d.find(" outline : one ") != std::string::npos &&
           d.find(" point two ") != std::string::npos && d.ends_with(" end .");
  });
  CHECK(outlines > 10);
  CHECK(outlines < 60);
  for (const std::string& prompt : ToyOutlinePrompts(3, 20)) {
    CHECK(prompt.starts_with("stories of the "));
    CHECK(prompt.ends_with(" ."));
  }
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
