#include "models/grammar/harmony_call_constraint.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "models/grammar/grammar_test_util.h"

namespace tophat {
namespace {

// Ids 0-7 are control tokens (no bytes); then pieces, then one token a printable ASCII byte.
enum Control : int32_t { kStart, kChannel, kMessage, kEnd, kConstrain, kCall, kReturn, kEos };
constexpr HarmonyCallIds kIds{.start = kStart,
                              .channel = kChannel,
                              .message = kMessage,
                              .end = kEnd,
                              .constrain = kConstrain,
                              .call = kCall};

std::shared_ptr<const TokenVocabulary> Vocabulary() {
  std::vector<std::optional<std::string>> tokens(8);
  for (const char* piece : {"analysis", "commentary", "final", " to", "=functions", ".get",
                            "_weather", "now", "assistant", "json", "{\"city\": ", "\"Paris\"",
                            "Eleven", " has two digits.", "\xC3", "\xA9"}) {
    tokens.emplace_back(piece);
  }
  for (char byte = ' '; byte <= '~'; ++byte) tokens.emplace_back(std::string(1, byte));
  return std::make_shared<const TokenVocabulary>(std::move(tokens));
}

constexpr char kWeather[] = R"({"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": false})";
constexpr char kNothing[] =
    R"({"type": "object", "properties": {}, "additionalProperties": false})";

std::shared_ptr<const HarmonyCallSpec> Spec(bool only_now = false) {
  std::vector<ToolCallTool> tools;
  if (!only_now) {
    tools.push_back({.name = "get_weather", .parameters = testing::CompiledSchemaOf(kWeather)});
  }
  tools.push_back({.name = "now", .parameters = testing::CompiledSchemaOf(kNothing)});
  absl::StatusOr<std::shared_ptr<const HarmonyCallSpec>> spec =
      HarmonyCallSpec::Create(kIds, std::move(tools));
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return *spec;
}

// Tokens spelling `text` from `pieces`, longest first, then single bytes.
std::vector<int32_t> Spell(const TokenVocabulary& vocabulary, std::string text) {
  std::vector<int32_t> ids;
  while (!text.empty()) {
    int32_t best = -1;
    size_t best_size = 0;
    for (int32_t id = 0; id < vocabulary.size(); ++id) {
      const std::string* bytes = vocabulary.bytes(id);
      if (bytes != nullptr && bytes->size() > best_size && text.starts_with(*bytes)) {
        best = id;
        best_size = bytes->size();
      }
    }
    REQUIRE(best >= 0);
    ids.push_back(best);
    text.erase(0, best_size);
  }
  return ids;
}

// An answer that reasons, then calls get_weather, as the model writes it.
std::vector<int32_t> ReasonThenCall(const TokenVocabulary& v) {
  std::vector<int32_t> answer = {kChannel};
  for (const auto& part :
       {Spell(v, "analysis"), std::vector<int32_t>{kMessage}, Spell(v, "Eleven has two digits."),
        std::vector<int32_t>{kEnd, kStart}, Spell(v, "assistant"), std::vector<int32_t>{kChannel},
        Spell(v, "commentary to=functions.get_weather "), std::vector<int32_t>{kConstrain},
        Spell(v, "json"), std::vector<int32_t>{kMessage}, Spell(v, R"({"city": "Paris"})"),
        std::vector<int32_t>{kCall}}) {
    answer.insert(answer.end(), part.begin(), part.end());
  }
  return answer;
}

bool Allows(const TokenConstraint& constraint, std::span<const int32_t> pending, int32_t token) {
  const std::shared_ptr<const std::vector<uint8_t>> mask = constraint.Allowed(pending);
  return mask == nullptr || (*mask)[static_cast<size_t>(token)] != 0;
}

std::vector<int32_t> AllowedIds(const TokenConstraint& constraint,
                                std::span<const int32_t> pending = {}) {
  const std::shared_ptr<const std::vector<uint8_t>> mask = constraint.Allowed(pending);
  REQUIRE(mask != nullptr);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < mask->size(); ++i) {
    if ((*mask)[i] != 0) ids.push_back(static_cast<int32_t>(i));
  }
  return ids;
}

TEST_CASE("harmony calls: reasoning then a call is allowed token by token, and complete",
          "[grammar][harmony]") {
  const auto vocabulary = Vocabulary();
  HarmonyCallConstraint constraint(vocabulary, {kReturn, kCall, kEos}, Spec());
  const std::vector<int32_t> answer = ReasonThenCall(*vocabulary);
  for (size_t i = 0; i < answer.size(); ++i) {
    INFO("token " << i << " (" << answer[i] << ")");
    REQUIRE(Allows(constraint, {}, answer[i]));
    REQUIRE_FALSE(constraint.complete());
    constraint.Commit(std::span<const int32_t>(&answer[i], 1));
  }
  CHECK(constraint.complete());
  // Past the call, only the request's ends.
  CHECK(AllowedIds(constraint) == std::vector<int32_t>{kCall, kReturn, kEos});
}

TEST_CASE("harmony calls: the final channel, a note and an end before the call are refused",
          "[grammar][harmony]") {
  const auto vocabulary = Vocabulary();
  const TokenVocabulary& v = *vocabulary;
  HarmonyCallConstraint constraint(vocabulary, {kReturn, kCall, kEos}, Spec());
  // The answer's first token opens a channel; nothing else.
  CHECK(AllowedIds(constraint) == std::vector<int32_t>{kChannel});
  const std::vector<int32_t> channel = {kChannel};
  CHECK(Allows(constraint, channel, testing::PieceId(v, "analysis")));
  CHECK(Allows(constraint, channel, testing::PieceId(v, "commentary")));
  CHECK_FALSE(Allows(constraint, channel, testing::PieceId(v, "final")));
  CHECK_FALSE(Allows(constraint, channel, kMessage));
  CHECK_FALSE(Allows(constraint, channel, kReturn));
  // "commentary" goes on only to a call's recipient: a note to the user has none.
  std::vector<int32_t> commentary = {kChannel, testing::PieceId(v, "commentary")};
  CHECK(AllowedIds(constraint, commentary) ==
        std::vector<int32_t>{testing::PieceId(v, " to"), testing::PieceId(v, " ")});
  // In the reasoning, any text and its end; no other control token, so no answer ends there.
  std::vector<int32_t> reasoning = {kChannel, testing::PieceId(v, "analysis"), kMessage};
  CHECK(Allows(constraint, reasoning, testing::PieceId(v, "Eleven")));
  CHECK(Allows(constraint, reasoning, testing::PieceId(v, "final")));
  CHECK(Allows(constraint, reasoning, kEnd));
  for (const int32_t control : {kStart, kChannel, kMessage, kConstrain, kCall, kReturn, kEos}) {
    CHECK_FALSE(Allows(constraint, reasoning, control));
  }
  // After it, the next message's header is forced up to its channel.
  reasoning.push_back(kEnd);
  CHECK(AllowedIds(constraint, reasoning) == std::vector<int32_t>{kStart});
  reasoning.push_back(kStart);
  CHECK(constraint.Forced(reasoning) ==
        ForcedDraft{.token = testing::PieceId(v, "assistant"), .only = false});
  reasoning.push_back(testing::PieceId(v, "assistant"));
  CHECK(AllowedIds(constraint, reasoning) == std::vector<int32_t>{kChannel});
  reasoning.push_back(kChannel);
  CHECK_FALSE(Allows(constraint, reasoning, testing::PieceId(v, "final")));
  CHECK(Allows(constraint, reasoning, testing::PieceId(v, "analysis")));
}

TEST_CASE("harmony calls: the recipient is a tool offered, the arguments its parameters'",
          "[grammar][harmony]") {
  const auto vocabulary = Vocabulary();
  const TokenVocabulary& v = *vocabulary;
  std::vector<int32_t> header = {kChannel};
  for (const int32_t id : Spell(v, "commentary to=functions.")) header.push_back(id);
  {
    HarmonyCallConstraint constraint(vocabulary, {kReturn, kCall, kEos}, Spec());
    CHECK_FALSE(Allows(constraint, header, testing::PieceId(v, ".get")));
    CHECK(Allows(constraint, header, testing::PieceId(v, "now")));
    CHECK(Allows(constraint, header, testing::PieceId(v, "g")));
    CHECK_FALSE(Allows(constraint, header, testing::PieceId(v, "x")));
  }
  {
    // A named function: the only recipient.
    HarmonyCallConstraint constraint(vocabulary, {kReturn, kCall, kEos}, Spec(/*only_now=*/true));
    CHECK(Allows(constraint, header, testing::PieceId(v, "now")));
    CHECK_FALSE(Allows(constraint, header, testing::PieceId(v, "g")));
  }
  HarmonyCallConstraint constraint(vocabulary, {kReturn, kCall, kEos}, Spec());
  std::vector<int32_t> call = header;
  for (const int32_t id : Spell(v, "get_weather")) call.push_back(id);
  // The space before <|constrain|>, then "json" and <|message|>, forced.
  CHECK(AllowedIds(constraint, call) == std::vector<int32_t>{testing::PieceId(v, " ")});
  call.push_back(testing::PieceId(v, " "));
  CHECK(constraint.Forced(call) == ForcedDraft{.token = kConstrain});
  call.push_back(kConstrain);
  CHECK(constraint.Forced(call) ==
        ForcedDraft{.token = testing::PieceId(v, "json"), .only = false});
  call.push_back(testing::PieceId(v, "json"));
  CHECK(AllowedIds(constraint, call) == std::vector<int32_t>{kMessage});
  call.push_back(kMessage);
  // The arguments: an object with its required city, then <|call|> and nothing before.
  CHECK_FALSE(Allows(constraint, call, kCall));
  call.push_back(testing::PieceId(v, "{"));
  CHECK_FALSE(Allows(constraint, call, testing::PieceId(v, "}")));
  CHECK_FALSE(Allows(constraint, call, kCall));
  call.pop_back();
  for (const int32_t id : Spell(v, R"({"city": "Paris"})")) call.push_back(id);
  CHECK(AllowedIds(constraint, call) == std::vector<int32_t>{kCall});
}

TEST_CASE("harmony calls: drafts across segments are masked as the committed answer",
          "[grammar][harmony]") {
  const auto vocabulary = Vocabulary();
  const std::vector<int32_t> answer = ReasonThenCall(*vocabulary);
  // The answer's reasoning message is 5 tokens with its header: a budget of 5 forces its
  // <|end|> where the model wrote it.
  const int64_t budget = GENERATE(-1, 5);
  // For every split of the answer into committed tokens and a draft, each draft token's mask
  // is the one a constraint that committed everything before it gives.
  for (size_t split = 0; split <= answer.size(); split += 3) {
    HarmonyCallConstraint drafted(vocabulary, {kReturn, kCall, kEos}, Spec(), budget);
    drafted.Commit(std::span<const int32_t>(answer).first(split));
    HarmonyCallConstraint stepped(vocabulary, {kReturn, kCall, kEos}, Spec(), budget);
    stepped.Commit(std::span<const int32_t>(answer).first(split));
    for (size_t i = split; i <= answer.size(); ++i) {
      INFO("split " << split << ", token " << i);
      const auto pending = std::span<const int32_t>(answer).subspan(split, i - split);
      REQUIRE(*drafted.Allowed(pending) == *stepped.Allowed({}));
      REQUIRE(drafted.Forced(pending) == stepped.Forced({}));
      if (i < answer.size()) stepped.Commit(std::span<const int32_t>(&answer[i], 1));
    }
  }
}

TEST_CASE("harmony calls: a spent thinking budget ends the reasoning, and then only a call",
          "[grammar][harmony]") {
  const auto vocabulary = Vocabulary();
  const TokenVocabulary& v = *vocabulary;
  const int32_t eleven = testing::PieceId(v, "Eleven");
  // Counted: <|channel|>, "analysis", <|message|>, then the reasoning's tokens.
  std::vector<int32_t> answer = {kChannel, testing::PieceId(v, "analysis"), kMessage, eleven};
  {
    HarmonyCallConstraint constraint(vocabulary, {kReturn, kCall, kEos}, Spec(), /*budget=*/5);
    CHECK(Allows(constraint, answer, eleven));
    CHECK(Allows(constraint, answer, kEnd));
    answer.push_back(eleven);
    CHECK(AllowedIds(constraint, answer) == std::vector<int32_t>{kEnd});
    CHECK(constraint.Forced(answer) == ForcedDraft{.token = kEnd});
    for (const int32_t id : {kEnd, kStart}) answer.push_back(id);
    for (const int32_t id : Spell(v, "assistant")) answer.push_back(id);
    answer.push_back(kChannel);
    // The next message can only be the call.
    CHECK_FALSE(Allows(constraint, answer, testing::PieceId(v, "analysis")));
    CHECK_FALSE(Allows(constraint, answer, testing::PieceId(v, "a")));
    CHECK(Allows(constraint, answer, testing::PieceId(v, "commentary")));
    answer.resize(4);
  }
  {
    // A message first: its tokens, then <|end|>.
    const int32_t dot = testing::PieceId(v, ".");
    HarmonyCallConstraint constraint(vocabulary, {kReturn, kCall, kEos}, Spec(), 4, {eleven, dot});
    CHECK(AllowedIds(constraint, answer) == std::vector<int32_t>{eleven});
    // A token that strays from the message is refused (fuzz/regressions/harmony_calls).
    std::vector<int32_t> strayed = answer;
    strayed.push_back(dot);
    CHECK(AllowedIds(constraint, strayed) == std::vector<int32_t>{kCall, kReturn, kEos});
    answer.push_back(eleven);
    CHECK(AllowedIds(constraint, answer) == std::vector<int32_t>{dot});
    answer.push_back(dot);
    CHECK(AllowedIds(constraint, answer) == std::vector<int32_t>{kEnd});
  }
  {
    // A character begun when the budget is spent is finished first.
    HarmonyCallConstraint constraint(vocabulary, {kReturn, kCall, kEos}, Spec(), 4);
    std::vector<int32_t> partial = {kChannel, testing::PieceId(v, "analysis"), kMessage,
                                    testing::PieceId(v, "\xC3")};
    CHECK(Allows(constraint, partial, testing::PieceId(v, "\xA9")));
    CHECK_FALSE(Allows(constraint, partial, kChannel));
    partial.push_back(testing::PieceId(v, "\xA9"));
    CHECK(AllowedIds(constraint, partial) == std::vector<int32_t>{kEnd});
  }
  {
    // Spent before any reasoning: the first message is the call.
    HarmonyCallConstraint constraint(vocabulary, {kReturn, kCall, kEos}, Spec(), 0);
    const std::vector<int32_t> channel = {kChannel};
    CHECK_FALSE(Allows(constraint, channel, testing::PieceId(v, "analysis")));
    CHECK(Allows(constraint, channel, testing::PieceId(v, "commentary")));
  }
}

TEST_CASE("harmony calls: a refused token leaves only the ends", "[grammar][harmony]") {
  const auto vocabulary = Vocabulary();
  HarmonyCallConstraint constraint(vocabulary, {kReturn, kEos}, Spec());
  const std::vector<int32_t> refused = {kChannel, testing::PieceId(*vocabulary, "final")};
  CHECK(AllowedIds(constraint, refused) == std::vector<int32_t>{kReturn, kEos});
  constraint.Commit(refused);
  CHECK(AllowedIds(constraint) == std::vector<int32_t>{kReturn, kEos});
  CHECK_FALSE(constraint.complete());
}

TEST_CASE("harmony calls: the spec names what is wrong", "[grammar][harmony]") {
  const auto error = [](HarmonyCallIds ids, std::vector<ToolCallTool> tools) {
    absl::StatusOr<std::shared_ptr<const HarmonyCallSpec>> spec =
        HarmonyCallSpec::Create(ids, std::move(tools));
    REQUIRE_FALSE(spec.ok());
    return std::string(spec.status().message());
  };
  const std::vector<ToolCallTool> now = {
      {.name = "now", .parameters = testing::CompiledSchemaOf(kNothing)}};
  HarmonyCallIds missing = kIds;
  missing.constrain = -1;
  CHECK(error(missing, now) == "harmony: the constrain token's id is missing");
  HarmonyCallIds twice = kIds;
  twice.call = kEnd;
  CHECK(error(twice, now) == "harmony: the call token's id 3 is the end token's");
  CHECK(error(kIds, {}) == "tools: none given (at least one)");
  CHECK(error(kIds, {{.name = "no spaces", .parameters = testing::CompiledSchemaOf(kNothing)}})
            .starts_with("tools[0]: name \"no spaces\""));
}

}  // namespace
}  // namespace tophat
