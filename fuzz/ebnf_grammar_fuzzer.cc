// A GBNF grammar and an answer constrained to it (models/grammar/ebnf_grammar.h): the input is
// the grammar's text, a NUL byte, then the answer's bytes. The grammar is compiled or refused
// with a "grammar: " status in UTF-8, never a crash. When it compiles, the answer's bytes are fed
// until one is refused; where it stops, the state must take some byte unless it may end there
// (every text the matcher takes can be completed: rules that never end are refused), unless a
// branch met a documented limit; and the constraint's mask must be each token fed on its own
// (mask_check.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "fuzz/mask_check.h"
#include "models/grammar/ebnf_grammar.h"
#include "models/tokenizers/tokenizer_utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return 0;
  const auto grammar = tophat::EbnfGrammar::Compile(input.substr(0, nul));
  if (!grammar.ok()) {
    const std::string message(grammar.status().message());
    TOPHAT_FUZZ_CHECK(message.rfind("grammar: ", 0) == 0);
    // It reaches a client inside JSON: what it quotes of the grammar is quoted whole.
    TOPHAT_FUZZ_CHECK(tophat::utf8::IsValid(message));
    return 0;
  }
  const std::string_view answer = input.substr(nul + 1);
  tophat::EbnfWorkspace workspace(grammar->get());
  tophat::EbnfState state(&workspace);
  size_t taken = 0;
  for (; taken < answer.size(); ++taken) {
    tophat::EbnfState next = state;
    if (!next.Feed(static_cast<unsigned char>(answer[taken]))) break;
    state = next;
  }
  if (!state.can_end()) {
    bool any = false;
    for (int byte = 0; byte < 256 && !any; ++byte) {
      tophat::EbnfState next = state;
      any = next.Feed(static_cast<unsigned char>(byte));
    }
    TOPHAT_FUZZ_CHECK(any || workspace.over_limit());
  }
  tophat::fuzz::CheckMaskAfterBytes(tophat::MakeEbnfConstraint(tophat::fuzz::MaskVocabulary(),
                                                               {tophat::fuzz::kMaskEnd}, *grammar),
                                    state, answer.substr(0, taken));
  return 0;
}
