// A strict parser's verdict on a JSON text, within JsonGrammar's documented limits: what the
// automaton must agree with (json_grammar_test.cc, fuzz/json_grammar_fuzzer.cc). Header-only,
// for tests: it uses nlohmann::json, which the daemons do not link for this.
#pragma once

#include <algorithm>
#include <optional>
#include <string_view>

#include "models/grammar/json_grammar.h"
#include "nlohmann/json.hpp"

namespace tophat {

// true: a JSON object (RFC 8259, as nlohmann::json parses it) with nesting at most
// JsonGrammar::kMaxDepth, whitespace runs outside strings at most kMaxWhitespaceRun, and no
// whitespace after it (an answer ends with its object). false: anything else. nullopt: a
// number too large for the parser (1e999), which JSON's grammar allows: not judged.
inline std::optional<bool> StrictObjectWithinLimits(std::string_view text) {
  // The parser reads a NUL as the end of its input; JSON has no raw NUL anywhere.
  if (text.find('\0') != std::string_view::npos) return false;
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::out_of_range&) {
    return std::nullopt;
  } catch (const nlohmann::json::parse_error&) {
    return false;
  }
  if (!value.is_object()) return false;
  int run = 0;
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
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
    run = c == ' ' || c == '\n' || c == '\t' || c == '\r' ? run + 1 : 0;
    if (run > JsonGrammar::kMaxWhitespaceRun) return false;
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') deepest = std::max(deepest, ++depth);
    if (c == '}' || c == ']') --depth;
  }
  return run == 0 && deepest <= JsonGrammar::kMaxDepth;
}

}  // namespace tophat
