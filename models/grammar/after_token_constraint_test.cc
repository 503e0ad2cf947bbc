#include "models/grammar/after_token_constraint.h"

#include <catch2/catch.hpp>

#include "models/grammar/grammar_test_util.h"

namespace tophat {
namespace {

using testing::PieceId;
using testing::PieceVocabulary;

constexpr int32_t kEnd = 1;

// A thinking model's vocabulary in small: its </think>, a word of reasoning, JSON's pieces.
struct ThinkingVocabulary {
  std::shared_ptr<const TokenVocabulary> vocabulary =
      PieceVocabulary({"</think>", "hmm", "{", "}", "{}", " "});
  int32_t gate = PieceId(*vocabulary, "</think>");
  int32_t hmm = PieceId(*vocabulary, "hmm");
  int32_t open = PieceId(*vocabulary, "{");
  int32_t close = PieceId(*vocabulary, "}");
};

// Whether `mask` allows `token` alone.
bool OnlyAllows(const std::shared_ptr<const std::vector<uint8_t>>& mask, int32_t token) {
  if (mask == nullptr) return false;
  for (size_t id = 0; id < mask->size(); ++id) {
    if ((*mask)[id] != (static_cast<int32_t>(id) == token ? 1 : 0)) return false;
  }
  return token >= 0 && static_cast<size_t>(token) < mask->size();
}

TEST_CASE(
    "A format after a token allows anything before it, and holds from the token after "
    "it as if the answer began there",
    "[after_token]") {
  const auto [vocabulary, gate, hmm, open, close] = ThinkingVocabulary();
  AfterTokenConstraint gated(vocabulary, gate,
                             std::make_unique<JsonConstraint>(vocabulary, std::vector{kEnd}));
  JsonConstraint plain(vocabulary, {kEnd});

  // Reasoning: every token, the end of sequence included (an answer cut off while thinking):
  // no mask at all.
  CHECK(gated.Allowed({}) == nullptr);
  CHECK(gated.Allowed(std::vector{hmm, hmm}) == nullptr);
  CHECK_FALSE(gated.complete());
  // A draft that holds the gate: the object's first token after it.
  CHECK(*gated.Allowed(std::vector{hmm, gate}) == *plain.Allowed({}));
  CHECK((*gated.Allowed(std::vector{hmm, gate}))[hmm] == 0);
  CHECK(*gated.Allowed(std::vector{gate, open}) == *plain.Allowed(std::vector{open}));

  // Committed in pieces across the gate.
  gated.Commit(std::vector{hmm, hmm});
  CHECK(gated.Allowed({}) == nullptr);
  gated.Commit(std::vector{hmm, gate, open});
  plain.Commit(std::vector{open});
  CHECK(*gated.Allowed({}) == *plain.Allowed({}));
  // A second </think> is the answer's text, which the object refuses.
  CHECK((*gated.Allowed({}))[gate] == 0);
  CHECK_FALSE(gated.complete());
  gated.Commit(std::vector{close});
  CHECK(gated.complete());
  CHECK((*gated.Allowed({}))[kEnd] == 1);
  CHECK((*gated.Allowed({}))[hmm] == 0);
}

TEST_CASE("A gate with a prefix opens only right after the prefix, and a spent budget forces both",
          "[after_token]") {
  // gpt-oss's harmony in small: "<|message|>" opens every message, and the format holds only
  // after "<|channel|>final<|message|>".
  const auto vocabulary = PieceVocabulary(
      {"<|message|>", "<|channel|>", "final", "analysis", "hmm", "<|end|>", "{", "}"});
  const int32_t message = PieceId(*vocabulary, "<|message|>");
  const int32_t channel = PieceId(*vocabulary, "<|channel|>");
  const int32_t final_name = PieceId(*vocabulary, "final");
  const int32_t analysis = PieceId(*vocabulary, "analysis");
  const int32_t hmm = PieceId(*vocabulary, "hmm");
  const int32_t end = PieceId(*vocabulary, "<|end|>");
  const int32_t open = PieceId(*vocabulary, "{");
  const int32_t close = PieceId(*vocabulary, "}");
  const std::vector<int32_t> prefix = {channel, final_name};
  JsonConstraint plain(vocabulary, {kEnd});

  AfterTokenConstraint gated(vocabulary, message,
                             std::make_unique<JsonConstraint>(vocabulary, std::vector{kEnd}),
                             /*budget=*/-1, {}, prefix);
  // The analysis message's <|message|> is no gate; nor is "final" without <|channel|>, nor
  // <|channel|>final with a token between it and <|message|>.
  CHECK(gated.Allowed(std::vector{channel, analysis, message, hmm}) == nullptr);
  CHECK(gated.Allowed(std::vector{final_name, message, hmm}) == nullptr);
  CHECK(gated.Allowed(std::vector{channel, final_name, hmm, message, hmm}) == nullptr);
  // <|channel|> again restarts the prefix.
  CHECK(*gated.Allowed(std::vector{channel, channel, final_name, message}) == *plain.Allowed({}));
  // Matched across commits, and drafts.
  gated.Commit(std::vector{channel, analysis, message, hmm, end, channel});
  CHECK(gated.Allowed({}) == nullptr);
  CHECK(*gated.Allowed(std::vector{final_name, message}) == *plain.Allowed({}));
  gated.Commit(std::vector{final_name});
  CHECK(gated.Allowed({}) == nullptr);
  gated.Commit(std::vector{message, open, close});
  CHECK(gated.complete());

  // A spent budget forces its end, then the prefix, then the gate.
  AfterTokenConstraint budget(vocabulary, message,
                              std::make_unique<JsonConstraint>(vocabulary, std::vector{kEnd}),
                              /*budget=*/4, std::vector{end}, prefix);
  budget.Commit(std::vector{channel, analysis, message, hmm});
  CHECK(OnlyAllows(budget.Allowed({}), end));
  CHECK(OnlyAllows(budget.Allowed(std::vector{end}), channel));
  CHECK(OnlyAllows(budget.Allowed(std::vector{end, channel}), final_name));
  CHECK(OnlyAllows(budget.Allowed(std::vector{end, channel, final_name}), message));
  CHECK(*budget.Allowed(std::vector{end, channel, final_name, message}) == *plain.Allowed({}));
  CHECK(budget.Forced(std::vector{end, channel})->token == final_name);
}

TEST_CASE(
    "A reasoning budget forces the token after it is spent, with a format after the token "
    "or none",
    "[after_token]") {
  const auto [vocabulary, gate, hmm, open, close] = ThinkingVocabulary();
  // (A copy: clang 14 cannot capture a structured binding.)
  const auto only_gate = [gate = gate](const std::shared_ptr<const std::vector<uint8_t>>& mask) {
    return OnlyAllows(mask, gate);
  };

  // No format: three tokens of reasoning, then </think> alone, then anything.
  AfterTokenConstraint budget(vocabulary, gate, nullptr, /*budget=*/3);
  CHECK(budget.Allowed({}) == nullptr);
  CHECK(budget.Allowed(std::vector{hmm, hmm}) == nullptr);
  // Drafts count with the committed tokens.
  CHECK(only_gate(budget.Allowed(std::vector{hmm, hmm, hmm})));
  budget.Commit(std::vector{hmm, hmm});
  CHECK(budget.Allowed({}) == nullptr);
  CHECK(only_gate(budget.Allowed(std::vector{hmm})));
  budget.Commit(std::vector{hmm});
  CHECK(only_gate(budget.Allowed({})));
  // A draft past the gate, and the answer after it: free.
  CHECK(budget.Allowed(std::vector{gate, hmm}) == nullptr);
  budget.Commit(std::vector{gate, hmm, gate});
  CHECK(budget.Allowed({}) == nullptr);
  CHECK_FALSE(budget.complete());
  CHECK_FALSE(budget.cut_by_limit());
  // The model ending its reasoning early spends no more of it.
  AfterTokenConstraint early(vocabulary, gate, nullptr, /*budget=*/3);
  early.Commit(std::vector{gate, hmm, hmm, hmm});
  CHECK(early.Allowed({}) == nullptr);
  // A budget of 0: </think> at once.
  AfterTokenConstraint none(vocabulary, gate, nullptr, /*budget=*/0);
  CHECK(only_gate(none.Allowed({})));

  // With a format: the budget, then the format from the token after the gate.
  AfterTokenConstraint formatted(vocabulary, gate,
                                 std::make_unique<JsonConstraint>(vocabulary, std::vector{kEnd}),
                                 /*budget=*/1);
  JsonConstraint plain(vocabulary, {kEnd});
  CHECK(formatted.Allowed({}) == nullptr);
  CHECK(only_gate(formatted.Allowed(std::vector{hmm})));
  CHECK(*formatted.Allowed(std::vector{hmm, gate}) == *plain.Allowed({}));
  formatted.Commit(std::vector{hmm, gate, open});
  plain.Commit(std::vector{open});
  CHECK(*formatted.Allowed({}) == *plain.Allowed({}));
}

TEST_CASE(
    "A spent budget forces its message and then the token, once the reasoning ends between "
    "characters",
    "[after_token]") {
  // "\xc3\xa9" is one character; "\xe4\xbd" the first two bytes of a three-byte one; the
  // single bytes are tokens of their own, as in a byte-level vocabulary.
  const auto vocabulary = PieceVocabulary(
      {"</think>", "hmm", " Time", "'s up.", "\xe4\xbd", "{", "}"}, "\xc3\xa9\xa0");
  const int32_t gate = PieceId(*vocabulary, "</think>");
  const int32_t hmm = PieceId(*vocabulary, "hmm");
  const int32_t time = PieceId(*vocabulary, " Time");
  const int32_t up = PieceId(*vocabulary, "'s up.");
  const int32_t begun = PieceId(*vocabulary, "\xe4\xbd");
  const int32_t lead = PieceId(*vocabulary, "\xc3");
  const int32_t tail = PieceId(*vocabulary, "\xa9");
  const int32_t special = 2;  // no bytes
  const std::vector<int32_t> message = {time, up};

  // Between characters: the message, token by token, then the gate, then the answer, free.
  AfterTokenConstraint ended(vocabulary, gate, nullptr, /*budget=*/2, message);
  CHECK(ended.Allowed(std::vector{hmm}) == nullptr);
  CHECK(OnlyAllows(ended.Allowed(std::vector{hmm, hmm}), time));
  ended.Commit(std::vector{hmm, hmm});
  CHECK(OnlyAllows(ended.Allowed({}), time));
  CHECK(OnlyAllows(ended.Allowed(std::vector{time}), up));
  CHECK(OnlyAllows(ended.Allowed(std::vector{time, up}), gate));
  CHECK(ended.Allowed(std::vector{time, up, gate}) == nullptr);
  ended.Commit(std::vector{time});
  CHECK(OnlyAllows(ended.Allowed({}), up));
  // A draft that strayed from the message is refused at its own row; past it, the gate.
  CHECK(OnlyAllows(ended.Allowed(std::vector{hmm, hmm}), gate));
  ended.Commit(std::vector{up, gate, hmm});
  CHECK(ended.Allowed({}) == nullptr);

  // The budget spent inside a character: the reasoning goes on until the character is whole.
  AfterTokenConstraint waiting(vocabulary, gate, nullptr, /*budget=*/2, message);
  waiting.Commit(std::vector{hmm, lead});
  CHECK(waiting.Allowed({}) == nullptr);
  CHECK(OnlyAllows(waiting.Allowed(std::vector{tail}), time));
  // A special token leaves no character open.
  CHECK(OnlyAllows(waiting.Allowed(std::vector{special}), time));
  // The model may end its reasoning itself meanwhile.
  CHECK(waiting.Allowed(std::vector{gate}) == nullptr);
  // A model that keeps writing parts of characters is cut kCharacterWait tokens past the
  // budget all the same: "\xe4\xbd", then lead bytes one after another.
  AfterTokenConstraint cut(vocabulary, gate, nullptr, /*budget=*/2, message);
  cut.Commit(std::vector{hmm, begun});
  CHECK(cut.Allowed(std::vector{lead}) == nullptr);
  CHECK(cut.Allowed(std::vector{lead, lead}) == nullptr);
  CHECK(OnlyAllows(cut.Allowed(std::vector{lead, lead, lead}), time));
  cut.Commit(std::vector{lead, lead, lead});
  CHECK(OnlyAllows(cut.Allowed({}), time));
  // A three-byte character begun at the budget's last token and ended past it.
  AfterTokenConstraint late(vocabulary, gate, nullptr, /*budget=*/2, message);
  late.Commit(std::vector{hmm, begun});
  CHECK(late.Allowed({}) == nullptr);
  late.Commit(std::vector{PieceId(*vocabulary, "\xa0")});
  CHECK(OnlyAllows(late.Allowed({}), time));

  // A budget of 0 forces the message at once; with a format, it holds after the gate.
  AfterTokenConstraint formatted(vocabulary, gate,
                                 std::make_unique<JsonConstraint>(vocabulary, std::vector{kEnd}),
                                 /*budget=*/0, message);
  JsonConstraint plain(vocabulary, {kEnd});
  CHECK(OnlyAllows(formatted.Allowed({}), time));
  CHECK(*formatted.Allowed(std::vector{time, up, gate}) == *plain.Allowed({}));
  formatted.Commit(std::vector{time, up, gate});
  CHECK(*formatted.Allowed({}) == *plain.Allowed({}));
}

}  // namespace
}  // namespace tophat
