// An answer constrained to JSON (models/grammar/json_grammar.h): any bytes fed to the
// automaton. What it calls a complete object a strict parser must accept as an object, and
// a text the parser accepts as an object the automaton must take whole unless it passes one
// of the automaton's two documented limits (nesting depth, whitespace runs) or ends in
// whitespace (nothing may follow an answer's object). A number too large for the parser
// (1e999) is JSON all the same, and such inputs are not judged.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "models/grammar/json_grammar.h"
#include "nlohmann/json.hpp"

namespace {

// Whether `text` stays within the automaton's limits, counted outside strings.
bool WithinLimits(std::string_view text) {
  int run = 0, depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    run = space ? run + 1 : 0;
    if (run > tophat::JsonGrammar::kMaxWhitespaceRun) return false;
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') deepest = std::max(deepest, ++depth);
    if (c == '}' || c == ']') --depth;
  }
  return deepest <= tophat::JsonGrammar::kMaxDepth && run == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  tophat::JsonGrammar grammar;
  size_t taken = 0;
  while (taken < size && grammar.Feed(data[taken])) ++taken;
  const bool complete = taken == size && grammar.complete();
  bool object = false;
  try {
    object = nlohmann::json::parse(text).is_object();
  } catch (const nlohmann::json::out_of_range&) {
    return 0;  // a number the parser cannot hold (1e999): JSON's grammar allows it
  } catch (const nlohmann::json::parse_error&) {
  }
  if (complete) TOPHAT_FUZZ_CHECK(object);
  if (object && WithinLimits(text)) TOPHAT_FUZZ_CHECK(complete);
  return 0;
}
