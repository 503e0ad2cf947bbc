// A JSON Schema and an answer constrained to it (models/grammar/json_schema.h,
// schema_grammar.h): the input is the schema's JSON, a NUL byte, then the answer's bytes.
// The schema compiles or is refused with a status, never a crash. When it compiles, the
// grammar fed the answer's bytes may end only where the answer is a value the schema takes
// (SchemaAccepts, the plain recursive check of the same rules), and where it stops (a byte
// refused, or the answer's end) some byte must still be taken unless it may end there: every
// prefix it takes can be completed. A number too large for the parser's double (1e999, or
// 400 digits) is JSON all the same, and such an answer is not judged. Where it stops, the
// constraint's mask over a small vocabulary (every byte, and pieces that cross JSON's token
// boundaries, whole characters and runs a pattern may take) is each token tried on its own:
// the sorted walk, its shared prefixes and a pattern's cursor against the grammar itself.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/json_schema.h"
#include "models/grammar/schema_grammar.h"
#include "nlohmann/json.hpp"

namespace {

constexpr int32_t kEnd = 256;  // the end of sequence: the token after the bytes

const std::shared_ptr<const tophat::TokenVocabulary>& Vocabulary() {
  static const auto vocabulary = [] {
    std::vector<std::optional<std::string>> tokens;
    for (int byte = 0; byte < 256; ++byte) {
      tokens.emplace_back(std::string(1, static_cast<char>(byte)));
    }
    tokens.emplace_back(std::nullopt);  // kEnd

    // clang-format off
    for (const char* piece :
         {"\"", "\",", "\":", "{\"", "\"}", "},", "]}", ", ", ": ", "\\n", "\\\"", "\\u00e9",
          "a", "ab", "abc", "abab", "aaaa", "aaaaaaaa", "name", "x", "xx", "A", "AB", "-",
          "0", "1", "12", "123", "1.5", "-4", "e5", "true", "false", "null", "nu", "@", "a@b.c",
          ".", "com", "2024-01-01", "T09:30:00Z", ":", "-12-", " ", "\n", "a b",
          "\xC3\xA9", "a\xC3\xA9", "\xC3\xA9\xC3\xA9\xC3\xA9", "\xF0\x9F\x8E\xA9",
          "\xE2\x82\xAC" "5", "P1D", "abcdefghijklmnop"}) {
      // clang-format on
      tokens.emplace_back(piece);
    }
    return std::make_shared<const tophat::TokenVocabulary>(std::move(tokens));
  }();
  return vocabulary;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return 0;
  const nlohmann::json schema =
      nlohmann::json::parse(input.substr(0, nul), nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  const auto compiled = tophat::CompiledSchema::Compile(schema);
  if (!compiled.ok()) return 0;
  const std::string_view answer = input.substr(nul + 1);
  tophat::SchemaGrammar grammar(compiled->get());
  size_t taken = 0;
  for (; taken < answer.size(); ++taken) {
    tophat::SchemaGrammar next = grammar;
    if (!next.Feed(static_cast<unsigned char>(answer[taken]))) break;
    grammar = next;
  }
  if (!grammar.can_end()) {
    bool any = false;
    for (int byte = 0; byte < 256 && !any; ++byte) {
      tophat::SchemaGrammar next = grammar;
      any = next.Feed(static_cast<unsigned char>(byte));
    }
    TOPHAT_FUZZ_CHECK(any);
  }
  {
    // The answer's taken bytes as single-byte tokens, then the mask where they end.
    const auto& vocabulary = Vocabulary();
    auto constraint = tophat::MakeSchemaConstraint(vocabulary, {kEnd}, *compiled);
    std::vector<int32_t> pending;
    for (size_t i = 0; i < taken; ++i) pending.push_back(static_cast<unsigned char>(answer[i]));
    const auto mask = constraint->Allowed(pending);
    for (int32_t id = 0; id < vocabulary->size(); ++id) {
      if (id == kEnd) continue;
      tophat::SchemaGrammar next = grammar;
      const bool expected = !grammar.complete() && next.Feed(*vocabulary->bytes(id));
      TOPHAT_FUZZ_CHECK(((*mask)[static_cast<size_t>(id)] != 0) == expected);
    }
  }
  if (taken == answer.size() && grammar.can_end()) {
    std::optional<nlohmann::json> value;
    try {
      value = nlohmann::json::parse(answer);
    } catch (const nlohmann::json::out_of_range& overflow) {
      // 406: a number beyond double's range. Any other error is a text the grammar took wrongly.
      TOPHAT_FUZZ_CHECK(overflow.id == 406);
    } catch (const nlohmann::json::exception&) {
      TOPHAT_FUZZ_CHECK(false);
    }
    if (value) TOPHAT_FUZZ_CHECK(tophat::SchemaAccepts(**compiled, (*compiled)->root(), *value));
  }
  return 0;
}
