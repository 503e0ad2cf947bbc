// An answer constrained to JSON (models/grammar/json_grammar.h): any bytes fed to the
// automaton. It must take exactly the texts a strict parser accepts as an object within the
// automaton's two documented limits (nesting depth, whitespace runs) and with nothing after
// the object (models/grammar/json_reference.h). A number too large for the parser (1e999) is
// JSON all the same, and such inputs are not judged.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "models/grammar/json_grammar.h"
#include "models/grammar/json_reference.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  tophat::JsonGrammar grammar;
  size_t taken = 0;
  while (taken < size && grammar.Feed(data[taken])) ++taken;
  const bool complete = taken == size && grammar.complete();
  const std::optional<bool> strict = tophat::StrictObjectWithinLimits(text);
  if (!strict.has_value()) return 0;
  TOPHAT_FUZZ_CHECK(complete == *strict);
  return 0;
}
