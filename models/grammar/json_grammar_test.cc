#include "models/grammar/json_grammar.h"

#include "models/grammar/json_reference.h"

#include <catch2/catch.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tophat {
namespace {

using Json = nlohmann::json;

// Feeds `text`; returns how many bytes were taken before the first refused one.
size_t Taken(std::string_view text, JsonGrammar* end = nullptr) {
  JsonGrammar grammar;
  size_t i = 0;
  while (i < text.size() && grammar.Feed(static_cast<unsigned char>(text[i]))) ++i;
  if (end != nullptr) *end = grammar;
  return i;
}

bool Accepts(std::string_view text) {
  JsonGrammar grammar;
  return grammar.Feed(text) && grammar.complete();
}

// Every prefix of `text` is taken, and only the whole is complete.
void CheckValid(const std::string& text) {
  INFO(text);
  JsonGrammar grammar;
  for (size_t i = 0; i < text.size(); ++i) {
    CHECK_FALSE(grammar.complete());
    INFO("byte " << i);
    REQUIRE(grammar.Feed(static_cast<unsigned char>(text[i])));
  }
  CHECK(grammar.complete());
  // Nothing may follow, not even whitespace: the answer ends there.
  JsonGrammar after = grammar;
  CHECK_FALSE(after.Feed(' '));
}

std::optional<bool> StrictlyValid(const std::string& text) {
  return StrictObjectWithinLimits(text);
}

Json RandomValue(std::mt19937_64& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 3 ? 4 : 6);
  switch (kind(rng)) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:
      return static_cast<int64_t>(rng() % 2000) - 1000;
    case 3:
      return std::ldexp(static_cast<double>(rng() % 100000) - 50000, static_cast<int>(rng() % 80) - 40);
    case 4: {
      // Code points from every UTF-8 length, controls and quotes included.
      static const char32_t kPoints[] = {'a', ' ', '"', '\\', '/', 0x01, 0x1F, 0x7F, 0xE9,
                                         0x7FF, 0x800, 0x4F60, 0xFFFD, 0x10000, 0x1F3A9, 0x10FFFF};
      std::u32string points;
      for (size_t n = rng() % 6; n > 0; --n) points += kPoints[rng() % std::size(kPoints)];
      std::string utf8;
      for (const char32_t cp : points) {
        if (cp < 0x80) {
          utf8 += static_cast<char>(cp);
        } else if (cp < 0x800) {
          utf8 += static_cast<char>(0xC0 | cp >> 6);
          utf8 += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          utf8 += static_cast<char>(0xE0 | cp >> 12);
          utf8 += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
          utf8 += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          utf8 += static_cast<char>(0xF0 | cp >> 18);
          utf8 += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
          utf8 += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
          utf8 += static_cast<char>(0x80 | (cp & 0x3F));
        }
      }
      return utf8;
    }
    case 5: {
      Json array = Json::array();
      for (size_t n = rng() % 4; n > 0; --n) array.push_back(RandomValue(rng, depth + 1));
      return array;
    }
    default: {
      Json object = Json::object();
      for (size_t n = rng() % 4; n > 0; --n) {
        object[RandomValue(rng, 4).dump()] = RandomValue(rng, depth + 1);
      }
      return object;
    }
  }
}

TEST_CASE("JsonGrammar takes every prefix of a JSON object and completes at its end",
          "[grammar]") {
  for (const std::string text : {
           "{}", " \n{ }", R"({"a":1})", R"({"a": [1, -2.5e+3, 0, 0.125, -0, 1E9, 2e-1]})",
           R"({"nested": {"x": [[], {}, [{"y": null}]], "t": true, "f": false}})",
           R"({"esc": "\" \\ \/ \b \f \n \r \t \u00e9 \uD83C\uDFA9 \u0000"})",
           "{\"utf8\": \"h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x8E\xA9 \xEF\xBF\xBD\"}",
           "{\n  \"pretty\": {\n    \"list\": [\n      1,\n      2\n    ]\n  }\n}",
           R"({"": "", "k": ""})"}) {
    CheckValid(text);
    CHECK(StrictlyValid(text) == true);
  }
  // Random objects, dumped compact, indented and ASCII-escaped (\u escapes with surrogate
  // pairs), each of them taken whole.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    Json object = Json::object();
    for (size_t n = rng() % 5; n > 0; --n) object[RandomValue(rng, 4).dump()] = RandomValue(rng, 0);
    for (const int indent : {-1, 2}) {
      for (const bool ascii : {false, true}) {
        CheckValid(object.dump(indent, ' ', ascii));
      }
    }
  }
}

TEST_CASE("JsonGrammar refuses the first byte no JSON object can continue with", "[grammar]") {
  struct Case {
    std::string text;
    size_t taken;  // bytes taken before the refused one
  };
  for (const Case& c : std::vector<Case>{
           {"[1]", 0},                        // an object, not any value, at the top
           {"\"a\"", 0},
           {R"({"a":01})", 6},                // no leading zeros
           {R"({"a":1.})", 7},                // a digit after the point
           {R"({"a":-})", 6},
           {R"({"a":1e})", 7},
           {R"({"a":tru})", 8},
           {R"({"a":nul )", 8},
           {R"({"a" 1})", 5},
           {R"({'a':1})", 1},
           {R"({"a":1,})", 7},
           {R"({"a":[1,]})", 8},
           {R"({"a":1]})", 6},
           {R"({"a":[1}})", 7},
           {R"({"a"})", 4},
           {"{\"a\":\"\x01\"}", 6},           // a raw control character
           {R"({"a":"\q"})", 7},
           {R"({"a":"\u12G4"})", 10},
           {R"({"a":"\uDC00"})", 9},          // a low surrogate alone (known at "DC")
           {R"({"a":"\uD800x"})", 12},        // a high surrogate alone
           {R"({"a":"\uD800\u0041"})", 14},   // followed by no low surrogate
           {R"({"a":"\uD800\uE"})", 14},      // nor one that could not become one
           {"{\"a\":\"\xC0\x80\"}", 6},       // an overlong form
           {"{\"a\":\"\xED\xA0\x80\"}", 7},   // a surrogate in UTF-8
           {"{\"a\":\"\xF4\x90\x80\x80\"}", 7},  // past U+10FFFF
           {"{\"a\":\"\xC3x\"}", 7},          // a character cut short
           {"{\"a\":\"\x80\"}", 6},           // a continuation byte alone
           {R"({"a":1}})", 7},                // nothing after the object
           {R"({"a":1} )", 7},
       }) {
    INFO(c.text);
    CHECK(Taken(c.text) == c.taken);
    CHECK(StrictlyValid(c.text) == false);
  }

  SECTION("Whitespace runs and nesting have limits") {
    const std::string spaces(JsonGrammar::kMaxWhitespaceRun, ' ');
    CheckValid("{" + spaces + "}");
    CHECK(Taken("{" + spaces + " }") == 1 + spaces.size());
    std::string deep = "{\"a\":";
    for (int i = 1; i < JsonGrammar::kMaxDepth; ++i) deep += "[";
    CHECK(Taken(deep + "[") == deep.size());
    std::string closed = deep;
    for (int i = 1; i < JsonGrammar::kMaxDepth; ++i) closed += "]";
    CheckValid(closed + "}");
  }
}

// Random edits of valid objects (bytes a JSON text is made of, and a few others) against a
// strict parser: the automaton accepts exactly what the parser does within its limits.
TEST_CASE("JsonGrammar agrees with a strict parser on mutated objects", "[grammar]") {
  static const std::string kBytes = "{}[]\":,.-+0123456789eEtrufalsn \\/u\n\t\x01\xC3\xA9\xED\xF0\x80";
  std::mt19937_64 rng(11);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    Json object = Json::object();
    for (size_t n = 1 + rng() % 3; n > 0; --n) object[RandomValue(rng, 4).dump()] = RandomValue(rng, 1);
    std::string text = object.dump(rng() % 2 == 0 ? -1 : 1, ' ', rng() % 2 == 0);
    for (size_t edits = rng() % 3; edits > 0 && !text.empty(); --edits) {
      const size_t at = rng() % text.size();
      const char byte = kBytes[rng() % kBytes.size()];
      switch (rng() % 3) {
        case 0: text[at] = byte; break;
        case 1: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), byte); break;
        default: text.erase(at, 1); break;
      }
    }
    INFO(text);
    const std::optional<bool> strict = StrictlyValid(text);
    if (!strict.has_value()) continue;
    REQUIRE(Accepts(text) == *strict);
    accepted += *strict ? 1 : 0;
  }
  // Both kinds were met.
  CHECK(accepted > 1000);
  CHECK(accepted < 19000);
}

}  // namespace
}  // namespace tophat
