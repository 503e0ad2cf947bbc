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

TEST_CASE(
    "A format after a token allows anything before it, and holds from the token after "
    "it as if the answer began there",
    "[after_token]") {
  const auto [vocabulary, gate, hmm, open, close] = ThinkingVocabulary();
  AfterTokenConstraint gated(vocabulary->size(), gate,
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

TEST_CASE(
    "A reasoning budget forces the token after it is spent, with a format after the token "
    "or none",
    "[after_token]") {
  const auto [vocabulary, gate, hmm, open, close] = ThinkingVocabulary();
  // (Copies: clang 14 cannot capture a structured binding.)
  const auto only_gate = [vocabulary = vocabulary,
                          gate = gate](const std::shared_ptr<const std::vector<uint8_t>>& mask) {
    if (mask == nullptr || mask->size() != static_cast<size_t>(vocabulary->size())) return false;
    for (int32_t id = 0; id < vocabulary->size(); ++id) {
      if ((*mask)[static_cast<size_t>(id)] != (id == gate ? 1 : 0)) return false;
    }
    return true;
  };

  // No format: three tokens of reasoning, then </think> alone, then anything.
  AfterTokenConstraint budget(vocabulary->size(), gate, nullptr, /*budget=*/3);
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
  AfterTokenConstraint early(vocabulary->size(), gate, nullptr, /*budget=*/3);
  early.Commit(std::vector{gate, hmm, hmm, hmm});
  CHECK(early.Allowed({}) == nullptr);
  // A budget of 0: </think> at once.
  AfterTokenConstraint none(vocabulary->size(), gate, nullptr, /*budget=*/0);
  CHECK(only_gate(none.Allowed({})));

  // With a format: the budget, then the format from the token after the gate.
  AfterTokenConstraint formatted(vocabulary->size(), gate,
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

}  // namespace
}  // namespace tophat
