// Helpers for the tests of GrammarConstraint's vocabulary walk (json_constraint_test.cc,
// json_schema_test.cc, tool_call_grammar_test.cc, ...): mask_reference.h's slow masks, a
// token's id by its spelling, a small vocabulary of pieces, and a schema compiled or the test
// failed. Header-only, for tests.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/grammar/json_constraint.h"
#include "models/grammar/json_schema.h"
#include "models/grammar/mask_reference.h"
#include "nlohmann/json.hpp"

namespace tophat::testing {

// The id of the token spelled `piece`; fails the test when there is none.
inline int32_t PieceId(const TokenVocabulary& vocabulary, std::string_view piece) {
  for (int32_t i = 0; i < vocabulary.size(); ++i) {
    if (vocabulary.bytes(i) != nullptr && *vocabulary.bytes(i) == piece) return i;
  }
  FAIL("no piece " << piece);
  return -1;
}

// Ids 0-2 special (the end among them, as the tests choose), 3 the empty token (never
// allowed), then `pieces` in order, then one token for each byte of `bytes`.
inline std::shared_ptr<const TokenVocabulary> PieceVocabulary(
    std::initializer_list<std::string_view> pieces, std::string_view bytes = "") {
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt, ""};
  for (const std::string_view piece : pieces) tokens.emplace_back(std::string(piece));
  for (const char byte : bytes) tokens.emplace_back(std::string(1, byte));
  return std::make_shared<const TokenVocabulary>(std::move(tokens));
}

// `schema` (JSON text) compiled; fails the test, saying why, when it does not compile.
inline std::shared_ptr<const CompiledSchema> CompiledSchemaOf(const std::string& schema) {
  absl::StatusOr<std::shared_ptr<const CompiledSchema>> compiled =
      CompiledSchema::Compile(nlohmann::json::parse(schema));
  INFO(schema << ": " << compiled.status().ToString());
  REQUIRE(compiled.ok());
  return *compiled;
}

}  // namespace tophat::testing
