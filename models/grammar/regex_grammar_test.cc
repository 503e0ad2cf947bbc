#include "models/grammar/regex_grammar.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "models/grammar/mask_reference.h"

namespace tophat {
namespace {

constexpr int32_t kEnd = 2;

// Single bytes and pieces that cross the patterns' parts, special tokens (nullopt), a token
// that adds nothing, and a character cut between tokens.
std::shared_ptr<const TokenVocabulary> MakeVocabulary() {
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt, ""};
  for (const char* piece :
       {"A",   "B", "Z",   "AB",   "ABC",  "AB-",      "ABC-",      "-",  "-1",
        "1",   "2", "9",   "12",   "123",  "1234",     "y",         "ye", "yes",
        "e",   "s", "n",   "no",   "o",    "yesno",    "a",         "a.", ".",
        ".b",  "b", "a.b", "ax",   "(",    "(x",       "x",         ")",  "x)",
        "(x)", " ", "\n",  "\xC3", "\xA9", "\xC3\xA9", "\xC3\xA9x", "/",  "\\"}) {
    tokens.emplace_back(piece);
  }
  return std::make_shared<const TokenVocabulary>(std::move(tokens));
}

std::shared_ptr<const StringPattern> Compiled(std::string_view regex) {
  auto pattern = CompileRegexFormat(regex);
  INFO(regex);
  REQUIRE(pattern.ok());
  return *std::move(pattern);
}

TEST_CASE(
    "A regex constraint allows exactly the tokens after which a match can still be "
    "written, and every answer it ends is a match",
    "[grammar]") {
  const auto vocabulary = MakeVocabulary();
  std::mt19937_64 rng(5);
  for (const std::string& regex : {std::string(R"([A-Z]{2,3}-\d{2,4})"), std::string("^(yes|no)$"),
                                   std::string(R"(a\.b|\(x\)|yes|no|1\/2)"),
                                   std::string("(é|a)+x?"), std::string(R"(\w+( \w+)*\n?)")}) {
    const auto pattern = Compiled(regex);
    int ended_walks = 0;
    for (int walk = 0; walk < 100; ++walk) {
      RegexConstraint constraint(vocabulary, {kEnd}, RegexGrammar(pattern.get()));
      RegexGrammar state(pattern.get());
      std::string text;
      for (int step = 0; step < 40; ++step) {
        INFO(regex << " walk " << walk << " after: " << text);
        const auto allowed = constraint.Allowed({});
        const std::vector<int32_t> ids = testing::Ids(*allowed);
        REQUIRE(ids == testing::TokensTaken(state, *vocabulary, kEnd));
        // Past a few steps, the end wherever it is allowed.
        int32_t next = ids[rng() % ids.size()];
        if (step >= 6 && (*allowed)[kEnd] != 0) next = kEnd;
        if (next == kEnd) {
          // A match, unless no token of this vocabulary could go on (then the end alone is
          // allowed, so that the answer ends rather than runs on unconstrained).
          CHECK(pattern->Matches(text) == state.can_end());
          CHECK((state.can_end() || ids == std::vector<int32_t>{kEnd}));
          ended_walks += state.can_end() ? 1 : 0;
          break;
        }
        text += *vocabulary->bytes(next);
        REQUIRE(state.Feed(*vocabulary->bytes(next)));
        constraint.Commit(std::vector<int32_t>{next});
        CHECK(constraint.complete() == state.complete());
      }
    }
    INFO(regex);
    CHECK(ended_walks >= 90);
  }
}

// The id of `piece` in `vocabulary`.
int32_t IdOf(const TokenVocabulary& vocabulary, std::string_view piece) {
  for (int32_t id = 0; id < vocabulary.size(); ++id) {
    if (vocabulary.bytes(id) != nullptr && *vocabulary.bytes(id) == piece) return id;
  }
  FAIL("no token " << piece);
  return -1;
}

TEST_CASE(
    "A format's forced draft: the one token allowed, else the longest of a prefix chain as a "
    "guess, and nothing where the ways part, the end may come, or the longest is tied",
    "[grammar]") {
  const auto vocabulary = MakeVocabulary();
  const auto forced = [&](std::string_view regex, std::string_view committed) {
    const auto pattern = Compiled(regex);
    RegexConstraint constraint(vocabulary, {kEnd}, RegexGrammar(pattern.get()));
    std::vector<int32_t> pending;
    if (!committed.empty()) pending.push_back(IdOf(*vocabulary, committed));
    return constraint.Forced(pending);
  };
  // "y", "ye" and "yes" each start "yes": the longest, a guess ("yesno" would not end it).
  CHECK(forced("yes", "") == ForcedDraft{.token = IdOf(*vocabulary, "yes"), .only = false});
  // After "y", "e" alone ("es" is no token).
  CHECK(forced("yes", "y") == ForcedDraft{.token = IdOf(*vocabulary, "e"), .only = true});
  CHECK(forced("1234(A|B)", "") == ForcedDraft{.token = IdOf(*vocabulary, "1234"), .only = false});
  // The ways part: "A" or "B"; "y..." or "n...".
  CHECK_FALSE(forced("1234(A|B)", "1234").has_value());
  CHECK_FALSE(forced("yes|no", "").has_value());
  // The end may come before "yes": never drafted past.
  CHECK_FALSE(forced("(yes)?", "").has_value());
  // Once complete, only the end, which Forced names (the sampler never drafts an end).
  CHECK(forced("yes", "yes") == ForcedDraft{.token = kEnd, .only = true});

  // Two spellings of the longest: no guess.
  const auto tied = std::make_shared<const TokenVocabulary>(std::vector<std::optional<std::string>>{
      std::nullopt, std::nullopt, std::nullopt, "a", "ab", "ab", "c"});
  const auto abc = Compiled("abc");
  RegexConstraint tie(tied, {kEnd}, RegexGrammar(abc.get()));
  CHECK_FALSE(tie.Forced({}).has_value());
  // More ways than kMaxForcedWays: none looked at.
  std::vector<std::optional<std::string>> runs = {std::nullopt, std::nullopt, std::nullopt};
  for (int length = 1; length <= 80; ++length) runs.emplace_back(std::string(length, 'x'));
  const auto xs = std::make_shared<const TokenVocabulary>(std::move(runs));
  const auto within = Compiled("x{64}y");
  RegexConstraint under_bound(xs, {kEnd}, RegexGrammar(within.get()));
  REQUIRE(under_bound.Forced({}).has_value());
  CHECK(*xs->bytes(under_bound.Forced({})->token) == std::string(64, 'x'));
  const auto past = Compiled("x{65}y");
  RegexConstraint over_bound(xs, {kEnd}, RegexGrammar(past.get()));
  CHECK_FALSE(over_bound.Forced({}).has_value());
}

TEST_CASE("A regex format matches the whole answer, with or without its anchors") {
  for (const std::string_view regex : {"abc", "^abc$", "^abc", "abc$"}) {
    const auto pattern = Compiled(regex);
    CHECK(pattern->Matches("abc"));
    CHECK_FALSE(pattern->Matches("xabc"));
    CHECK_FALSE(pattern->Matches("abcx"));
  }
  // A '|' at the top stays inside the anchors.
  const auto either = Compiled("^a|b$");
  CHECK(either->Matches("a"));
  CHECK(either->Matches("b"));
  CHECK_FALSE(either->Matches("ab"));
  // An escaped '$' is the character.
  CHECK(Compiled(R"(a\$)")->Matches("a$"));
  // A match that nothing extends is complete; one that may go on is not.
  const auto yes_or_no = Compiled("yes|no");
  RegexGrammar yes(yes_or_no.get());
  CHECK_FALSE(yes.can_end());
  REQUIRE(yes.Feed("yes"));
  CHECK(yes.complete());
  const auto more = Compiled("a+");
  RegexGrammar a(more.get());
  REQUIRE(a.Feed("a"));
  CHECK(a.can_end());
  CHECK_FALSE(a.complete());
  CHECK_FALSE(a.Feed("b"));
}

TEST_CASE("A regex format refuses what it cannot hold an answer to, saying what") {
  for (const auto& [regex, message] : std::vector<std::pair<std::string, std::string>>{
           {"(?=a)b", "regex: "},
           // Offsets are the caller's, with or without its anchor.
           {R"((a)\1)", "regex: a backreference at offset 4 is not supported"},
           {R"(^(a)\1)", "regex: a backreference at offset 5 is not supported"},
           {"a{2,1}", "regex: "},
           {std::string(kMaxRegexFormatBytes + 1, 'a'), "longer than"}}) {
    INFO(regex);
    const auto pattern = CompileRegexFormat(regex);
    REQUIRE_FALSE(pattern.ok());
    CHECK(pattern.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(pattern.status().message()),
               Catch::StartsWith("regex: ") && Catch::Contains(message));
    CHECK_THAT(std::string(pattern.status().message()), !Catch::Contains("pattern: "));
  }
}

}  // namespace
}  // namespace tophat
