// A JSON Schema and an answer constrained to it (models/grammar/json_schema.h,
// schema_grammar.h): the input is the schema's JSON, a NUL byte, then the answer's bytes.
// The schema compiles or is refused with a status, never a crash. When it compiles, the
// grammar fed the answer's bytes may end only where the answer is a value the schema takes
// (SchemaAccepts, the plain recursive check of the same rules), and where it stops (a byte
// refused, or the answer's end) some byte must still be taken unless it may end there: every
// prefix it takes can be completed. A number too large for the parser's double (1e999, or
// 400 digits) is JSON all the same, and such an answer is not judged. Where it stops, the
// constraint's mask is each token fed on its own (mask_check.h).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "fuzz/mask_check.h"
#include "models/grammar/json_schema.h"
#include "models/grammar/schema_grammar.h"
#include "nlohmann/json.hpp"

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
  tophat::fuzz::CheckMaskAfterBytes(
      tophat::MakeSchemaConstraint(tophat::fuzz::MaskVocabulary(), {tophat::fuzz::kMaskEnd},
                                   *compiled),
      grammar, answer.substr(0, taken));
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
