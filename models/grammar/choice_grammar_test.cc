#include "models/grammar/choice_grammar.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/grammar/grammar_test_util.h"

namespace tophat {
namespace {

std::shared_ptr<const ChoiceSpec> Spec(const std::vector<std::string>& choices) {
  absl::StatusOr<std::shared_ptr<const ChoiceSpec>> spec = ChoiceSpec::Create(choices);
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return *spec;
}

bool Takes(const ChoiceSpec& spec, std::string_view text) {
  ChoiceGrammar grammar(&spec);
  return grammar.Feed(text) && grammar.can_end();
}

TEST_CASE("A choice is one of the strings, whole, each taken literally", "[grammar][choice]") {
  const auto spec = Spec({"a.b", "x+", "[y]", "yes", "yes sir", "no"});
  for (const char* choice : {"a.b", "x+", "[y]", "yes", "yes sir", "no"}) {
    INFO(choice);
    CHECK(Takes(*spec, choice));
  }
  for (const char* other : {"axb", "xx", "y", "", "ye", "yes si", "nope", "n"}) {
    INFO(other);
    CHECK_FALSE(Takes(*spec, other));
  }
  // A choice another goes on from may end or go on; one nothing goes on from is complete.
  ChoiceGrammar yes(spec.get());
  REQUIRE(yes.Feed("yes"));
  CHECK(yes.can_end());
  CHECK_FALSE(yes.complete());
  CHECK(yes.Feed(" "));
  CHECK_FALSE(yes.can_end());
  ChoiceGrammar no(spec.get());
  REQUIRE(no.Feed("no"));
  CHECK(no.complete());
  CHECK_FALSE(no.Feed("t"));
  CHECK_FALSE(no.Feed("t"));  // refused stays refused
}

TEST_CASE("Choices that cannot be held to are refused, saying what", "[grammar][choice]") {
  const auto message = [](const std::vector<std::string>& choices) {
    absl::StatusOr<std::shared_ptr<const ChoiceSpec>> spec = ChoiceSpec::Create(choices);
    REQUIRE_FALSE(spec.ok());
    CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(spec.status().message());
  };
  CHECK(message({}) == "choice: none given");
  CHECK(message({"a", ""}) == "choice[1]: empty");
  CHECK(message(std::vector<std::string>(ChoiceSpec::kMaxChoices + 1, "a")) ==
        "choice: 65537 given, at most 65536");
  CHECK(message({std::string(ChoiceSpec::kMaxChoiceBytes, 'a'), "b"}) ==
        "choice: 262145 bytes in all, at most 262144");
  // A choice given twice is one; the limits themselves are taken.
  CHECK(Spec({"a", "a"})->size() == 2);
  CHECK(ChoiceSpec::Create({std::string(ChoiceSpec::kMaxChoiceBytes, 'a')}).ok());
}

TEST_CASE(
    "A choice constraint's masks are each token fed on its own, over thousands of labels, and "
    "each walk ends on a whole choice",
    "[grammar][choice]") {
  // 3,000 labels sharing prefixes ("label 1", "label 12", ...), and a vocabulary whose pieces
  // cross their boundaries.
  std::vector<std::string> choices;
  for (int i = 0; i < 3000; ++i) choices.push_back(absl::StrCat("label ", i));
  choices.push_back("other");
  const auto spec = Spec(choices);
  constexpr int32_t kEnd = 2;
  const auto vocabulary = testing::PieceVocabulary(
      {"label", "label ", "lab", "el ", " 1", "12", "0", "1", "2", "3", "9", "99", "oth",
       "er",    "other",  "x",   " ",   "l",  "a",  "b", "e", "o", "t", "h", "r"});
  std::mt19937_64 rng(3);
  int ended = 0;
  for (int walk = 0; walk < 60; ++walk) {
    auto constraint = MakeChoiceConstraint(vocabulary, {kEnd}, spec);
    ChoiceGrammar state(spec.get());
    std::string text;
    for (int step = 0; step < 20; ++step) {
      INFO("walk " << walk << " after: " << text);
      const auto allowed = constraint->Allowed({});
      const std::vector<int32_t> ids = testing::Ids(*allowed);
      REQUIRE(ids == testing::TokensTaken(state, *vocabulary, kEnd));
      int32_t next = ids[rng() % ids.size()];
      if (state.can_end() && std::bernoulli_distribution(0.3)(rng)) next = kEnd;
      if (next == kEnd) {
        CHECK(std::find(choices.begin(), choices.end(), text) != choices.end());
        ++ended;
        break;
      }
      text += *vocabulary->bytes(next);
      REQUIRE(state.Feed(*vocabulary->bytes(next)));
      constraint->Commit(std::vector<int32_t>{next});
      CHECK(constraint->complete() == state.complete());
    }
  }
  CHECK(ended >= 55);
}

}  // namespace
}  // namespace tophat
