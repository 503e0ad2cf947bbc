// The mask check the grammar fuzz targets share: where an answer stops, a constraint's
// allowed tokens over a small vocabulary must be each token fed to the grammar on its own.
// The vocabulary is every byte (so any answer is a list of tokens) and pieces that cross
// JSON's token boundaries, whole characters and runs a pattern may take, so the sorted walk,
// its shared prefixes and a pattern's cursor are checked against the grammar itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/mask_reference.h"

namespace tophat::fuzz {

inline constexpr int32_t kMaskEnd = 256;  // the end of sequence: the token after the bytes

inline const std::shared_ptr<const TokenVocabulary>& MaskVocabulary() {
  static const auto vocabulary = [] {
    std::vector<std::optional<std::string>> tokens;
    for (int byte = 0; byte < 256; ++byte) {
      tokens.emplace_back(std::string(1, static_cast<char>(byte)));
    }
    tokens.emplace_back(std::nullopt);  // kMaskEnd

    // clang-format off
    for (const char* piece :
         {"\"", "\",", "\":", "{\"", "\"}", "},", "]}", ", ", ": ", "\\n", "\\\"", "\\u00e9",
          "a", "ab", "abc", "abab", "aaaa", "aaaaaaaa", "name", "x", "xx", "A", "AB", "-",
          "0", "1", "12", "123", "1.5", "-4", "e5", "true", "false", "null", "nu", "@", "a@b.c",
          ".", "com", "2024-01-01", "T09:30:00Z", ":", "-12-", " ", "\n", "a b",
          "\xC3\xA9", "a\xC3\xA9", "\xC3\xA9\xC3\xA9\xC3\xA9", "\xF0\x9F\x8E\xA9",
          "\xE2\x82\xAC" "5", "P1D", "abcdefghijklmnop", "<tool_call>", "<tool", "_call>",
          "\n</tool_call>", "{\"name\": \"", "\", \"arguments\": ", "<|python_tag|>"}) {
      // clang-format on
      tokens.emplace_back(piece);
    }
    return std::make_shared<const TokenVocabulary>(std::move(tokens));
  }();
  return vocabulary;
}

// `grammar` has read `taken`; `constraint` starts where the grammar started. Its mask must be
// the slow one (mask_reference.h), the end of sequence included.
template <typename Grammar>
void CheckMaskAfterBytes(std::unique_ptr<TokenConstraint> constraint, const Grammar& grammar,
                         std::string_view taken) {
  std::vector<int32_t> pending;
  pending.reserve(taken.size());
  for (const char c : taken) pending.push_back(static_cast<unsigned char>(c));
  const auto mask = constraint->Allowed(pending);
  TOPHAT_FUZZ_CHECK(mask != nullptr);  // a grammar always masks
  TOPHAT_FUZZ_CHECK(testing::Ids(*mask) ==
                    testing::TokensTaken(grammar, *MaskVocabulary(), kMaskEnd));
}

}  // namespace tophat::fuzz
