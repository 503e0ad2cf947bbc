// Structural tags and an answer constrained to one (models/grammar/structural_tag_grammar.h):
// the input is a structural tag's JSON text as an app sends it ({"structures": [{"begin",
// "schema", "end"}], "triggers": [...]}), a NUL byte, then the answer's bytes. The tag is
// parsed and built or refused with a status, never a crash. When it is built, the grammar fed
// the answer's bytes must, where it stops (a byte refused, or the answer's end), take some
// byte unless it may end there: every prefix it takes can be completed. Text takes every
// byte (only a structure refuses one), the grammar is never complete, and a trigger written
// at the answer's start enters a structure. Where it stops, the constraint's mask is each
// token fed on its own (mask_check.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "fuzz/mask_check.h"
#include "models/grammar/structural_tag_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return 0;
  const auto built = tophat::StructuralTagSpec::Parse(input.substr(0, nul));
  if (!built.ok()) {
    TOPHAT_FUZZ_CHECK(built.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const tophat::StructuralTagSpec& spec = **built;
  const std::string_view answer = input.substr(nul + 1);
  tophat::StructuralTagGrammar grammar(&spec);
  size_t taken = 0;
  for (; taken < answer.size(); ++taken) {
    tophat::StructuralTagGrammar next = grammar;
    if (!next.Feed(static_cast<unsigned char>(answer[taken]))) break;
    grammar = next;
  }
  // Text takes every byte: only a structure refuses one.
  if (taken < answer.size()) TOPHAT_FUZZ_CHECK(grammar.in_structure());
  if (!grammar.can_end()) {
    bool any = false;
    for (int byte = 0; byte < 256 && !any; ++byte) {
      tophat::StructuralTagGrammar next = grammar;
      any = next.Feed(static_cast<unsigned char>(byte));
    }
    TOPHAT_FUZZ_CHECK(any);
  }
  TOPHAT_FUZZ_CHECK(!grammar.complete());
  // The text at the answer's start, with a trigger written into it, enters a structure.
  for (const std::string& trigger : spec.triggers()) {
    tophat::StructuralTagGrammar text(&spec);
    TOPHAT_FUZZ_CHECK(text.Feed(trigger));
    TOPHAT_FUZZ_CHECK(text.in_structure());
  }
  tophat::fuzz::CheckMaskAfterBytes(
      tophat::MakeStructuralTagConstraint(tophat::fuzz::MaskVocabulary(), {tophat::fuzz::kMaskEnd},
                                          *built),
      grammar, answer.substr(0, taken));
  return 0;
}
