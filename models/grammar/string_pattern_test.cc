#include "models/grammar/string_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"

namespace tophat {
namespace {

std::shared_ptr<const StringPattern> Compiled(const std::string& regex) {
  absl::StatusOr<std::shared_ptr<const StringPattern>> pattern = StringPattern::Compile(regex);
  INFO(regex << ": " << pattern.status().ToString());
  REQUIRE(pattern.ok());
  return *pattern;
}

std::string Refusal(const std::string& regex) {
  absl::StatusOr<std::shared_ptr<const StringPattern>> pattern = StringPattern::Compile(regex);
  INFO(regex);
  REQUIRE_FALSE(pattern.ok());
  CHECK(pattern.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(pattern.status().message());
}

// PCRE2 as the reference, set to read the pattern as ECMA-262 does where the tests' strings
// can tell: UTF-8, '$' only at the end, \u escapes, '.' matching neither \r nor \n (nor,
// in ECMA-262, U+2028 and U+2029, which the random strings hold only where '.' does not
// decide), \s as ECMA-262's.
class Reference {
 public:
  explicit Reference(std::string regex) {
    // PCRE2's \s is ASCII's white space; ECMA-262's has Unicode's besides.
    if (regex.find("[\\s\\S]") == std::string::npos) {
      const std::string space =
          "\\t-\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff";
      for (const auto& [escape, replacement] :
           {std::pair<std::string, std::string>{"\\s", "[" + space + "]"},
            {"\\S", "[^" + space + "]"}}) {
        for (size_t at = regex.find(escape); at != std::string::npos;
             at = regex.find(escape, at + replacement.size())) {
          regex.replace(at, escape.size(), replacement);
        }
      }
    }
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
    pcre2_set_newline(context, PCRE2_NEWLINE_ANYCRLF);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.data()), regex.size(),
                          PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX, &error, &offset,
                          context);
    pcre2_compile_context_free(context);
    REQUIRE(code_ != nullptr);
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Reference() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  bool Matches(const std::string& text) const {
    return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0,
                       data_, nullptr) >= 0;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

TEST_CASE("A pattern matches what ECMA-262 matches, anchored or anywhere in the string",
          "[grammar]") {
  struct Case {
    const char* regex;
    std::vector<std::string> matched;
    std::vector<std::string> unmatched;
  };
  const std::vector<Case> cases = {
      {R"(^[A-Z]{3}-\d{4}$)", {"ABC-1234"}, {"ABC-123", "xABC-1234", "ABC-12345", "abc-1234"}},
      {R"(\d)", {"a1b", "7"}, {"", "abc"}},
      {R"(^(cat|dog)s?$)", {"cat", "dogs"}, {"cats!", "cow", ""}},
      {R"(^\w+@\w+\.com$)", {"a_b@x.com"}, {"a@x.org", "@x.com", "a@xcom"}},
      {"^\xC3\xA9+$", {"\xC3\xA9\xC3\xA9"}, {"e", ""}},
      {"^[^a]$", {"b", "\xC3\xA9", "\xF0\x9F\x8E\xA9"}, {"a", "bb"}},
      {"^.$", {"x", "\xE2\x82\xAC"}, {"\n", "\r", ""}},
      {R"(^a{2,3}?b*$)", {"aa", "aaabbb"}, {"a", "aaaa"}},
      {R"(^[\s\S]{0,2}$)", {"", "\n\n", "ab"}, {"abc"}},
      {R"(^\u00e9\x41[\u0100-\u017f]$)", {"\xC3\xA9" "A\xC4\x80"}, {"\xC3\xA9" "AB"}},
      {R"(^[a\-z]+$)", {"a-z"}, {"b"}},
      {R"(^(?:\+1)?\(\d{3}\)$)", {"+1(555)", "(555)"}, {"+2(555)"}},
      {R"(^a{,2}$)", {"a{,2}"}, {"aa"}},  // not a quantifier: literal, as Annex B reads it
      {R"(^[]$)", {}, {"", "a"}},
      {R"(\$$)", {"5$"}, {"5"}},
  };
  for (const Case& c : cases) {
    INFO(c.regex);
    absl::StatusOr<std::shared_ptr<const StringPattern>> pattern = StringPattern::Compile(c.regex);
    if (c.matched.empty()) {  // a pattern no string matches is refused
      CHECK_FALSE(pattern.ok());
      continue;
    }
    REQUIRE(pattern.ok());
    const Reference reference(c.regex);
    for (const std::string& text : c.matched) {
      INFO(text);
      CHECK((*pattern)->Matches(text));
      CHECK(reference.Matches(text));
    }
    for (const std::string& text : c.unmatched) {
      INFO(text);
      CHECK_FALSE((*pattern)->Matches(text));
      CHECK_FALSE(reference.Matches(text));
    }
  }
}

TEST_CASE("A pattern agrees with PCRE2 on random strings", "[grammar]") {
  const std::vector<std::string> regexes = {
      R"(^[A-Z]{2,3}-\d{2}$)", R"(ab|cd)",        R"(^(a|b)*c$)",      R"(^\w+(\.\w+)*@\w+$)",
      R"(^[^-]+-?$)",          R"(^(?:ab){2,}$)",  R"(\s\S)",          "^[a\xC3\xA9]{1,3}$",
      R"(^.?.?$)",             R"(^\d*\.\d+$)",    R"(^(x|xy|xyz)z$)",  R"(a.c)",
  };
  const std::vector<std::string> alphabet = {"a", "b", "c", "d", "x", "y", "z", "A", "B", "0",
                                             "1", "-", ".", "@", " ", "\n", "_", "\xC3\xA9"};
  std::mt19937_64 rng(3);
  for (const std::string& regex : regexes) {
    INFO(regex);
    const auto pattern = Compiled(regex);
    const Reference reference(regex);
    int matched = 0;
    for (int trial = 0; trial < 3000; ++trial) {
      std::string text;
      if (trial % 2 == 0) {
        for (int i = std::uniform_int_distribution<int>(0, 7)(rng); i > 0; --i) {
          text += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
        }
      } else {
        // A walk along the automaton to a match: what it takes, PCRE2 must match.
        int32_t state = StringPattern::start();
        for (int step = 0; step < 40; ++step) {
          if (pattern->Accepts(state) && (step > 12 || std::bernoulli_distribution(0.3)(rng))) break;
          std::vector<int> bytes;
          for (int b = 0; b < 256; ++b) {
            if (pattern->Next(state, static_cast<unsigned char>(b)) >= 0) bytes.push_back(b);
          }
          if (bytes.empty()) break;
          const int b = bytes[std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng)];
          text += static_cast<char>(b);
          state = pattern->Next(state, static_cast<unsigned char>(b));
        }
        if (!pattern->Accepts(state)) continue;
      }
      std::string hex;
      for (const char c : text) hex += absl::StrFormat("%02x ", static_cast<unsigned char>(c));
      INFO(text << " (" << hex << ")");
      const bool expected = reference.Matches(text);
      REQUIRE(pattern->Matches(text) == expected);
      matched += expected ? 1 : 0;
    }
    CHECK(matched > 0);
  }
}

TEST_CASE("Every state of a pattern's automaton can still reach a match", "[grammar]") {
  const auto pattern = Compiled(R"(^[a-c]{2}(\d|x)+$)");
  for (int32_t state = 0; state < pattern->states(); ++state) {
    // Reached: some byte leads on, or it accepts.
    bool on = pattern->Accepts(state);
    for (int b = 0; b < 256 && !on; ++b) on = pattern->Next(state, static_cast<unsigned char>(b)) >= 0;
    CHECK(on);
  }
  // No byte a JSON string cannot hold as a character leads anywhere.
  CHECK(Compiled("^[\\x00-\\x7f]$")->Next(StringPattern::start(), 0x01) == StringPattern::kDead);
  CHECK(Compiled("^[\\x00-\\x7f]$")->Next(StringPattern::start(), '\n') != StringPattern::kDead);
}

TEST_CASE("Patterns a DFA cannot hold are refused, saying what", "[grammar]") {
  CHECK_THAT(Refusal("(?=a)b"), Catch::Contains("a lookaround or named group"));
  CHECK_THAT(Refusal("(?<year>\\d{4})"), Catch::Contains("a lookaround or named group"));
  CHECK_THAT(Refusal("(a)\\1"), Catch::Contains("a backreference"));
  CHECK_THAT(Refusal("\\bword"), Catch::Contains("a word boundary"));
  CHECK_THAT(Refusal("a^b"), Catch::Contains("an anchor '^' inside the pattern"));
  CHECK_THAT(Refusal("a$b"), Catch::Contains("an anchor '$' inside the pattern"));
  CHECK_THAT(Refusal("^a|b$"), Catch::Contains("group the alternatives"));
  CHECK_THAT(Refusal("a**"), Catch::Contains("a quantifier after a quantifier"));
  CHECK_THAT(Refusal("*a"), Catch::Contains("a quantifier with nothing before it"));
  CHECK_THAT(Refusal("(ab"), Catch::Contains("an unclosed '('"));
  CHECK_THAT(Refusal("ab)"), Catch::Contains("an unmatched ')'"));
  CHECK_THAT(Refusal("[ab"), Catch::Contains("an unclosed '['"));
  CHECK_THAT(Refusal("a{3,1}"), Catch::Contains("{n,m} with m < n"));
  CHECK_THAT(Refusal("a{1001}"), Catch::Contains("a count above 1000"));
  CHECK_THAT(Refusal("[z-a]"), Catch::Contains("a range out of order"));
  CHECK_THAT(Refusal("\\q"), Catch::Contains("the escape \\q"));
  CHECK_THAT(Refusal("\xFF"), Catch::Contains("not UTF-8"));
  // The classic blow-up: the 21st character from the end.
  CHECK_THAT(Refusal("(a|b)*a(a|b){20}$"), Catch::Contains("more than 8192 states"));
  CHECK_THAT(Refusal(".{1000}"), Catch::Contains("too costly to compile"));
  CHECK_THAT(Refusal("^\\x01$"), Catch::Contains("no string JSON can write matches it"));
  // Large ones are refused (or compiled) quickly: a closure costs its own size, and a class's
  // bytes are closed once.
  for (const char* large : {".{1000}", "^[\\s\\S]{0,1000}$", "^(\\w+\\s?){50}$", "^(.|\\n){999}x$"}) {
    INFO(large);
    const auto begin = std::chrono::steady_clock::now();
    (void)StringPattern::Compile(large);
    CHECK(std::chrono::steady_clock::now() - begin < std::chrono::seconds(2));
  }
}

}  // namespace
}  // namespace tophat
