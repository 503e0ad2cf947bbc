#include "models/grammar/json_constraint.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "models/grammar/grammar_test_util.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

constexpr int32_t kEnd = 2;

// A small vocabulary with what real ones have: single bytes, pieces that cross JSON's token
// boundaries ("\": "), literals cut anywhere, escapes, characters cut between tokens,
// special tokens (nullopt) and a token that adds nothing.
std::shared_ptr<const TokenVocabulary> MakeVocabulary() {
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt, ""};
  for (const char* piece :
       {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "  ", "{\"", "\":", "\": ", "\",", "\"}",
        "},", "}}", "a", "ab", "abc", "key", "\"key\"", "1", "12", "0", "-", ".", "5", "e", "E",
        "+", "true", "tr", "ue", "t", "r", "u", "fal", "se", "null", "nu", "ll", "\\", "\\n",
        "\\u", "00", "e9", "D83C", "DFA9", "\\uD83C", "\xC3", "\xA9", "\xC3\xA9", "\xF0\x9F",
        "\x8E\xA9", "x\"", "\t", "1}", "[]", "{}", "\"\"", "\x01", "\xFF"}) {
    tokens.emplace_back(piece);
  }
  return std::make_shared<const TokenVocabulary>(std::move(tokens));
}

// The allowed tokens written out: each token tried from the state on its own.
std::vector<uint8_t> BruteForce(const TokenVocabulary& vocabulary, const std::string& text) {
  JsonGrammar state;
  REQUIRE(state.Feed(text));
  std::vector<uint8_t> allowed(static_cast<size_t>(vocabulary.size()), 0);
  if (state.complete()) {
    allowed[kEnd] = 1;
    return allowed;
  }
  for (int32_t id = 0; id < vocabulary.size(); ++id) {
    const std::string* bytes = vocabulary.bytes(id);
    JsonGrammar next = state;
    allowed[id] = bytes != nullptr && !bytes->empty() && next.Feed(*bytes) ? 1 : 0;
  }
  return allowed;
}

TEST_CASE("JsonConstraint allows exactly the tokens that keep a JSON object possible, and "
          "every answer it allows ends as one",
          "[grammar]") {
  const auto vocabulary = MakeVocabulary();
  std::mt19937_64 rng(3);
  // After this many tokens each walk prefers the tokens that close things, so it ends.
  constexpr int kWander = 40;
  const std::vector<std::string> closing = {"\"", "}", "]", "0", ":"};
  int walks_with_escapes = 0;
  for (int walk = 0; walk < 300; ++walk) {
    JsonConstraint constraint(vocabulary, {kEnd});
    std::string text;
    bool ended = false;
    for (int step = 0; step < 400 && !ended; ++step) {
      const auto allowed = constraint.Allowed({});
      INFO("walk " << walk << " after: " << text);
      REQUIRE(testing::Ids(*allowed) == testing::Ids(BruteForce(*vocabulary, text)));
      const std::vector<int32_t> ids = testing::Ids(*allowed);
      REQUIRE_FALSE(ids.empty());
      int32_t next = ids[rng() % ids.size()];
      if (step >= kWander) {
        for (const std::string& piece : closing) {
          const auto it = std::find_if(ids.begin(), ids.end(), [&](int32_t id) {
            return vocabulary->bytes(id) != nullptr && *vocabulary->bytes(id) == piece;
          });
          if (it != ids.end()) {
            next = *it;
            break;
          }
        }
      }
      if (next == kEnd) {
        CHECK(constraint.complete());
        ended = true;
        break;
      }
      text += *vocabulary->bytes(next);
      constraint.Commit(std::vector<int32_t>{next});
    }
    INFO(text);
    REQUIRE(ended);
    bool object = true;
    try {
      object = nlohmann::json::parse(text).is_object();
    } catch (const nlohmann::json::out_of_range&) {
      // A number past a double's range (9e999): JSON all the same.
    }
    CHECK(object);
    walks_with_escapes += text.find('\\') != std::string::npos ? 1 : 0;
  }
  CHECK(walks_with_escapes > 10);
}

TEST_CASE("JsonConstraint counts pending tokens as committed ones, and keeps masks by state",
          "[grammar]") {
  const auto vocabulary = MakeVocabulary();
  const auto id = [&](std::string_view piece) { return testing::PieceId(*vocabulary, piece); };
  const std::vector<int32_t> drafts = {id("{\""), id("ab"), id("\": "), id("[]"), id(",")};
  JsonConstraint committed(vocabulary, {kEnd});
  JsonConstraint pending(vocabulary, {kEnd});
  for (size_t n = 0; n <= drafts.size(); ++n) {
    INFO(n << " drafts");
    CHECK(*pending.Allowed(std::span(drafts).first(n)) == *committed.Allowed({}));
    if (n < drafts.size()) committed.Commit(std::span(drafts).subspan(n, 1));
  }

  SECTION("Inside a string the state repeats: one walk serves every character") {
    JsonConstraint string(vocabulary, {kEnd});
    string.Commit(std::vector<int32_t>{id("{\"")});
    const auto first = string.Allowed({});
    const int64_t computed = string.masks_computed();
    string.Commit(std::vector<int32_t>{id("a"), id("abc"), id("key")});
    CHECK(string.Allowed({}) == first);
    CHECK(string.Allowed(std::vector<int32_t>{id("ab")}) == first);
    CHECK(string.masks_computed() == computed);
  }
  SECTION("A refused token, committed or pending, leaves only the end") {
    JsonConstraint refused(vocabulary, {kEnd});
    const std::vector<int32_t> end_only = {kEnd};
    CHECK(testing::Ids(*refused.Allowed(std::vector<int32_t>{id("}")})) == end_only);
    CHECK(testing::Ids(*refused.Allowed(std::vector<int32_t>{0})) == end_only);  // a special token
    refused.Commit(std::vector<int32_t>{id("[]")});
    CHECK(testing::Ids(*refused.Allowed({})) == end_only);
    CHECK_FALSE(refused.complete());
  }
  SECTION("A complete object allows only the end ids") {
    JsonConstraint complete(vocabulary, {kEnd, 1});
    complete.Commit(std::vector<int32_t>{id("{}")});
    CHECK(complete.complete());
    CHECK(testing::Ids(*complete.Allowed({})) == std::vector<int32_t>{1, kEnd});
  }
  SECTION("A vocabulary that cannot go on ends the answer") {
    const auto small = std::make_shared<const TokenVocabulary>(
        std::vector<std::optional<std::string>>{std::nullopt, std::nullopt, std::nullopt, "{",
                                                "\"", "a"});
    JsonConstraint stuck(small, {kEnd});
    stuck.Commit(std::vector<int32_t>{3, 4, 5, 4});  // {"a" and no ':' to follow
    CHECK(testing::Ids(*stuck.Allowed({})) == std::vector<int32_t>{kEnd});
  }
}

}  // namespace
}  // namespace tophat
