#include "models/grammar/after_token_constraint.h"

#include <catch2/catch.hpp>

#include "models/grammar/grammar_test_util.h"

namespace tophat {
namespace {

using testing::PieceId;
using testing::PieceVocabulary;

constexpr int32_t kEnd = 1;

TEST_CASE(
    "A format after a token allows anything before it, and holds from the token after "
    "it as if the answer began there",
    "[after_token]") {
  const auto vocabulary = PieceVocabulary({"</think>", "hmm", "{", "}", "{}", " "});
  const int32_t gate = PieceId(*vocabulary, "</think>");
  const int32_t hmm = PieceId(*vocabulary, "hmm");
  const int32_t open = PieceId(*vocabulary, "{");
  const int32_t close = PieceId(*vocabulary, "}");
  AfterTokenConstraint gated(vocabulary->size(), gate,
                             std::make_unique<JsonConstraint>(vocabulary, std::vector{kEnd}));
  JsonConstraint plain(vocabulary, {kEnd});

  // Reasoning: every token, the end of sequence included (an answer cut off while thinking).
  const auto free = gated.Allowed({});
  REQUIRE(free->size() == static_cast<size_t>(vocabulary->size()));
  CHECK(std::all_of(free->begin(), free->end(), [](uint8_t a) { return a == 1; }));
  CHECK_FALSE(gated.complete());
  // A draft that holds the gate: the object's first token after it.
  CHECK(*gated.Allowed(std::vector{hmm, gate}) == *plain.Allowed({}));
  CHECK((*gated.Allowed(std::vector{hmm, gate}))[hmm] == 0);
  CHECK(*gated.Allowed(std::vector{gate, open}) == *plain.Allowed(std::vector{open}));

  // Committed in pieces across the gate.
  gated.Commit(std::vector{hmm, hmm});
  CHECK(std::all_of(gated.Allowed({})->begin(), gated.Allowed({})->end(),
                    [](uint8_t a) { return a == 1; }));
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

}  // namespace
}  // namespace tophat
