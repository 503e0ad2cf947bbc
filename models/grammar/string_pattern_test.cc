#include "models/grammar/string_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <arpa/inet.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
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

// A random string the pattern matches: a walk along its automaton, ending at a match.
std::string Walk(const StringPattern& pattern, std::mt19937_64& rng, int steps) {
  std::string text;
  int32_t state = StringPattern::start();
  for (int step = 0; step < 400; ++step) {
    if (pattern.Accepts(state) && (step > steps || std::bernoulli_distribution(0.05)(rng))) break;
    std::vector<int> bytes;
    for (int b = 0; b < 256; ++b) {
      if (pattern.Next(state, static_cast<unsigned char>(b)) >= 0) bytes.push_back(b);
    }
    if (bytes.empty()) break;
    const int b = bytes[std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng)];
    text += static_cast<char>(b);
    state = pattern.Next(state, static_cast<unsigned char>(b));
  }
  return pattern.Accepts(state) ? text : std::string();
}

TEST_CASE("Formats are patterns of what their RFCs allow", "[grammar]") {
  struct Case {
    const char* format;
    std::vector<std::string> matched;
    std::vector<std::string> unmatched;
  };
  const std::vector<Case> cases = {
      {"date-time",
       {"2024-02-29T23:59:60Z", "1999-12-31t00:00:00.123+05:30", "2024-01-01T09:30:00-00:00"},
       {"2024-01-01", "2024-01-01T09:30:00", "2024-01-01 09:30:00Z", "2024-13-01T00:00:00Z",
        "2024-04-31T00:00:00Z", "2024-01-01T24:00:00Z", "2024-01-01T09:30:00+5:30"}},
      {"date", {"2024-01-31", "0001-02-29", "2024-11-30"},
       {"2024-1-01", "2024-02-30", "2024-06-31", "2024-00-10", "24-01-01", "2024-01-01Z"}},
      {"time", {"09:30:00Z", "23:59:60.5+14:00", "00:00:00z"}, {"09:30:00", "9:30:00Z", "09:60:00Z"}},
      {"duration", {"P1Y2M3DT4H5M6S", "P3W", "PT36H", "P1D", "P2MT30S", "PT5M"},
       {"P", "PT", "P1S", "P1W2D", "1D", "PT1.5S", "P1H", "PT1H1S"}},
      {"email", {"ann@example.com", "a.b+c_d@mail.example.co.uk", "o'hara!#@x-y.io"},
       {"ann@localhost", "ann@@example.com", ".ann@example.com", "ann.@example.com",
        "a..b@example.com", "ann@-example.com", "ann@example-.com", "ann example@x.com"}},
      {"hostname", {"localhost", "a-b.example.com", "x1"}, {"-a.com", "a..b", "a_b.com", "a.", ""}},
      {"ipv4", {"192.168.0.1", "0.0.0.0", "255.255.255.255"},
       {"256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.4 "}},
      {"ipv6", {"::", "::1", "fe80::1:2", "2001:db8:0:0:0:0:2:1", "::ffff:192.0.2.128", "1::2:3:4:5:6:7"},
       {":::", "1:2:3:4:5:6:7", "1::2::3", "12345::", "::ffff:192.0.2.256", "g::1"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-00000000000A"},
       {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400"}},
      {"uri", {"https://example.com/a?b=c#d", "urn:isbn:0451450523", "mailto:a@b.c", "x:%20"},
       {"example.com", "1http://x", "http://a b", "http://x/%2", "http://x/\xC3\xA9"}},
  };
  const std::vector<std::string_view> names = StringPattern::FormatNames();
  CHECK(names.size() == cases.size());
  for (const Case& c : cases) {
    INFO(c.format);
    const std::shared_ptr<const StringPattern> pattern = StringPattern::Format(c.format);
    REQUIRE(pattern != nullptr);
    CHECK(StringPattern::Format(c.format) == pattern);  // compiled once
    const Reference reference(std::string(StringPattern::FormatRegex(c.format)));
    for (const std::string& text : c.matched) {
      INFO(text);
      CHECK(pattern->Matches(text));
      CHECK(reference.Matches(text));
    }
    for (const std::string& text : c.unmatched) {
      INFO(text);
      CHECK_FALSE(pattern->Matches(text));
      CHECK_FALSE(reference.Matches(text));
    }
  }
  // Only annotations here.
  for (const char* other : {"int64", "binary", "uri-reference", "password", ""}) {
    CHECK(StringPattern::Format(other) == nullptr);
  }
}

TEST_CASE("The IP address formats agree with inet_pton", "[grammar]") {
  // glibc's parser as the reference: every address the automaton writes parses, and on
  // random strings over the addresses' characters the two agree.
  std::mt19937_64 rng(11);
  for (const auto& [format, family] : {std::pair<const char*, int>{"ipv4", AF_INET}, {"ipv6", AF_INET6}}) {
    INFO(format);
    const std::shared_ptr<const StringPattern> pattern = StringPattern::Format(format);
    REQUIRE(pattern != nullptr);
    const Reference reference(std::string(StringPattern::FormatRegex(format)));
    unsigned char address[16];
    const std::string alphabet = family == AF_INET ? "0123456789.." : "0123f::::..1";
    int parsed = 0;
    for (int trial = 0; trial < 20000; ++trial) {
      std::string text;
      if (trial % 2 == 0) {
        text = Walk(*pattern, rng, 40);
      } else {
        for (int i = std::uniform_int_distribution<int>(2, 16)(rng); i > 0; --i) {
          text += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
        }
      }
      INFO(text);
      const bool expected = inet_pton(family, text.c_str(), address) == 1;
      REQUIRE(pattern->Matches(text) == expected);
      REQUIRE(reference.Matches(text) == expected);
      parsed += expected ? 1 : 0;
    }
    CHECK(parsed > 10000);  // the walks' half and some of the random strings
  }
}

TEST_CASE("A pattern and a format together match what both match", "[grammar]") {
  const auto lower = Compiled("^[a-f0-9-]+$");
  const auto both = StringPattern::Intersect(*lower, *StringPattern::Format("uuid"));
  REQUIRE(both.ok());
  CHECK((*both)->Matches("123e4567-e89b-12d3-a456-426614174000"));
  CHECK_FALSE((*both)->Matches("123E4567-E89B-12D3-A456-426614174000"));
  CHECK_FALSE((*both)->Matches("abc"));
  const auto none = StringPattern::Intersect(*Compiled("^x"), *StringPattern::Format("uuid"));
  CHECK_THAT(std::string(none.status().message()), Catch::Contains("no string matches both"));
}

// Whether from `state`, `written` characters written, a match of min..max characters (max -1:
// any) can be reached: a search over (state, characters), as plainly as it can be written.
bool CanReach(const StringPattern& pattern, int32_t state, int64_t written, int64_t min,
              int64_t max) {
  const int64_t cap = max >= 0 ? max : min + pattern.states() + 1;
  std::vector<std::pair<int32_t, int64_t>> work = {{state, written}};
  std::map<std::pair<int32_t, int64_t>, bool> seen;
  while (!work.empty()) {
    const auto [s, n] = work.back();
    work.pop_back();
    if (seen[{s, n}]) continue;
    seen[{s, n}] = true;
    if (pattern.bytes_left()[static_cast<size_t>(s)] == 0 && pattern.Accepts(s) && n >= min &&
        (max < 0 || n <= max)) {
      return true;
    }
    for (int b = 0; b < 256; ++b) {
      const int32_t t = pattern.Next(s, static_cast<unsigned char>(b));
      if (t < 0) continue;
      const int64_t after = n + (pattern.bytes_left()[static_cast<size_t>(t)] == 0 ? 1 : 0);
      if (after <= cap) work.emplace_back(t, after);
    }
  }
  return false;
}

TEST_CASE("A pattern's lengths say exactly where a match of an allowed length can follow",
          "[grammar]") {
  struct Case {
    const char* regex;
    int64_t min;
    int64_t max;
  };
  for (const Case& c : std::vector<Case>{{"^[a-z]+$", 2, 4},
                                         {"^(ab)+$", 3, -1},
                                         {"^(ab)+$", 3, 5},
                                         {"^a(\xC3\xA9|b)*\xE2\x82\xAC?$", 2, 6},
                                         {"x", 4, -1},
                                         {"^(a|bcd)*$", 0, 7},
                                         {"^\\d{3}(-\\d{4})?$", 4, 9},
                                         {"^.{0,3}\xF0\x9F\x8E\xA9$", 1, 2}}) {
    INFO(c.regex << " " << c.min << ".." << c.max);
    const auto pattern = Compiled(c.regex);
    const auto lengths = PatternLengths::Compile(*pattern, c.min, c.max);
    REQUIRE(lengths.ok());
    for (int32_t state = 0; state < pattern->states(); ++state) {
      if (pattern->bytes_left()[static_cast<size_t>(state)] < 0) continue;
      for (int64_t written = 0; written <= (c.max >= 0 ? c.max : c.min) + 2; ++written) {
        INFO("state " << state << ", " << written << " written");
        CHECK((*lengths)->Reachable(state, written) ==
              CanReach(*pattern, state, written, c.min, c.max));
      }
    }
  }
  CHECK_THAT(std::string(PatternLengths::Compile(*Compiled("^a{5}$"), 0, 3).status().message()),
             Catch::Contains("no string of 0 to 3 characters matches the pattern"));
  CHECK_THAT(std::string(PatternLengths::Compile(*Compiled("^a{0,5}$"), 6, -1).status().message()),
             Catch::Contains("no string of 6 or more characters matches the pattern"));
  CHECK_THAT(std::string(PatternLengths::Compile(*Compiled("^[\\s\\S]{0,400}$"), 0, 1 << 30)
                             .status()
                             .message()),
             Catch::Contains("too costly to track"));
}

}  // namespace
}  // namespace tophat
