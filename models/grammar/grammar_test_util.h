// Helpers for the tests of GrammarConstraint's vocabulary walk (json_constraint_test.cc,
// json_schema_test.cc, tool_call_grammar_test.cc): mask_reference.h's slow masks, and a
// token's id by its spelling. Header-only, for tests.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/grammar/json_constraint.h"
#include "models/grammar/mask_reference.h"

namespace tophat::testing {

// The id of the token spelled `piece`; fails the test when there is none.
inline int32_t PieceId(const TokenVocabulary& vocabulary, std::string_view piece) {
  for (int32_t i = 0; i < vocabulary.size(); ++i) {
    if (vocabulary.bytes(i) != nullptr && *vocabulary.bytes(i) == piece) return i;
  }
  FAIL("no piece " << piece);
  return -1;
}

}  // namespace tophat::testing
