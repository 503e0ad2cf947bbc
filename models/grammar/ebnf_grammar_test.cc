#include "models/grammar/ebnf_grammar.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "models/grammar/json_as_gbnf.h"
#include "models/grammar/mask_reference.h"
#include "models/grammar/regex_grammar.h"

namespace tophat {
namespace {

constexpr int32_t kEnd = 2;

std::shared_ptr<const EbnfGrammar> Compiled(std::string_view text) {
  auto grammar = EbnfGrammar::Compile(text);
  INFO(text);
  if (!grammar.ok()) INFO(grammar.status().message());
  REQUIRE(grammar.ok());
  return *std::move(grammar);
}

// Whether `grammar` takes `text` whole; *prefix: whether each byte was taken (the text can
// still be completed).
bool Matches(const EbnfGrammar& grammar, std::string_view text, bool* prefix = nullptr) {
  EbnfWorkspace workspace(&grammar);
  EbnfState state(&workspace);
  const bool fed = state.Feed(text);
  if (prefix != nullptr) *prefix = fed;
  return fed && state.can_end();
}

TEST_CASE("A GBNF grammar takes exactly the texts its root derives", "[grammar]") {
  const auto arithmetic = Compiled(R"g(
    # Sums of products of numbers and groups; newlines are spaces.
    root   ::= expr
    expr   ::= term (("+" | "-") term)*
    term   ::= factor ("*" factor)*
    factor ::= [0-9]+ | "(" expr ")"
  )g");
  for (const std::string_view text : {"1", "12+3", "(1+2)*3", "((4))", "1*(2-3)*(((5)))"}) {
    INFO(text);
    CHECK(Matches(*arithmetic, text));
  }
  for (const std::string_view text : {"", "+", "1+", "(1", "1)", "()", "1 + 2", "a"}) {
    INFO(text);
    CHECK_FALSE(Matches(*arithmetic, text));
  }
  bool prefix = false;
  CHECK_FALSE(Matches(*arithmetic, "((1+", &prefix));
  CHECK(prefix);  // can still be completed
  CHECK_FALSE(Matches(*arithmetic, "(1))", &prefix));
  CHECK_FALSE(prefix);

  const auto repeated = Compiled(R"g(root ::= "a"{2} "b"{1,3} "c"{2,} "d"{,1} [^a-c\n]?)g");
  CHECK(Matches(*repeated, "aabcc"));
  CHECK(Matches(*repeated, "aabbbccccdz"));
  CHECK(Matches(*repeated, "aabccd"));
  CHECK_FALSE(Matches(*repeated, "abcc"));
  CHECK_FALSE(Matches(*repeated, "aabbbbcc"));
  CHECK_FALSE(Matches(*repeated, "aabc"));
  CHECK_FALSE(Matches(*repeated, "aabccddd"));
  CHECK_FALSE(Matches(*repeated, "aabcca"));

  // Escapes, any character, and characters past ASCII.
  const auto escapes =
      Compiled("root ::= \"\\\"\\n\\t\\x41\\u00e9\\U0001F600\" . [\\]\\-\\\\] \"é\" [а-я]");
  CHECK(Matches(*escapes, "\"\n\tAé😀x-é\xD0\xB1"));
  CHECK(Matches(*escapes, "\"\n\tAé😀😀]éя"));
  CHECK_FALSE(Matches(*escapes, "\"\n\tAé😀x-éz"));

  // Ambiguous grammars are taken (every way is followed), and a rule may be empty.
  const auto ambiguous = Compiled(R"g(
    root ::= a | b | ws
    a ::= "x"* "y"?
    b ::= "x" "x"*
    ws ::= ([ \t] ws)?
  )g");
  for (const std::string_view text : {"", "xxx", "xxy", "y", " \t "}) {
    INFO(text);
    CHECK(Matches(*ambiguous, text));
  }
  CHECK_FALSE(Matches(*ambiguous, "x "));
}

TEST_CASE("A regular GBNF grammar reads byte for byte as the same regex's automaton does",
          "[grammar]") {
  // The regex DFA (tested against PCRE2) is the reference: after every byte of random texts,
  // both must agree whether the text can still be completed and whether it is a match,
  // characters cut between bytes included.
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {R"g([A-Z]{2,3}-[0-9]{2,4})g", R"g(root ::= [A-Z]{2,3} "-" [0-9]{2,4})g"},
      {"(yes|no|maybe)( (yes|no|maybe))*",
       "root ::= w (\" \" w)*\nw ::= \"yes\" | \"no\" | \"maybe\""},
      {"(é|ab)+x?", R"g(root ::= ("é" | "ab")+ "x"?)g"},
      {"[^a-c]*c", R"g(root ::= [^a-c]* "c")g"},
      {"a?b?c?(ab)*", R"g(root ::= "a"? "b"? "c"? ("ab")*)g"},
      {"[à-ÿ€]+", R"g(root ::= [à-ÿ€]+)g"},
  };
  const std::string alphabet_bytes = "abcxyABZ-19 \xC3\xA9\xA0\xBF\xE2\x82\xAC\xF0\x9F\x98";
  std::vector<std::string> alphabet;
  for (const std::string_view word : {"yes", "no", "maybe", " ", "é", "€", "ab", "AB-12"}) {
    alphabet.emplace_back(word);
  }
  for (const char c : alphabet_bytes) alphabet.emplace_back(1, c);
  std::mt19937_64 rng(11);
  for (const auto& [regex, text] : pairs) {
    const auto grammar = Compiled(text);
    auto pattern = CompileRegexFormat(regex);
    REQUIRE(pattern.ok());
    int matched = 0;
    for (int trial = 0; trial < 400; ++trial) {
      EbnfWorkspace workspace(grammar.get());
      EbnfState state(&workspace);
      RegexGrammar reference(pattern->get());
      std::string fed;
      for (int piece = 0; piece < 8; ++piece) {
        const std::string& next = alphabet[rng() % alphabet.size()];
        bool alive = true;
        for (const char c : next) {
          fed += c;
          INFO(regex << " after " << fed);
          const bool expected = reference.Feed(static_cast<unsigned char>(c));
          REQUIRE(state.Feed(static_cast<unsigned char>(c)) == expected);
          if (!expected) {
            alive = false;
            break;
          }
          REQUIRE(state.can_end() == reference.can_end());
          REQUIRE(state.complete() == reference.complete());
          matched += state.can_end() ? 1 : 0;
        }
        if (!alive) break;
      }
    }
    INFO(regex);
    CHECK(matched > 5);
  }
}

TEST_CASE("A recursive grammar's masks are exactly the tokens after which it can still end",
          "[grammar]") {
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt, ""};
  for (const char* piece :
       {"(", ")",  "((", "))", "()", "(x", "x)", "x",    "xx",   ",",         ", ",
        " ", ",(", "[",  "]",  "[]", "[x", "é",  "\xC3", "\xA9", "\xC3\xA9)", "a"}) {
    tokens.emplace_back(piece);
  }
  const auto vocabulary = std::make_shared<const TokenVocabulary>(std::move(tokens));
  const auto grammar = Compiled(R"g(
    root  ::= list
    list  ::= item (", " item)*
    item  ::= "x"+ | "é" | "(" list ")" | "[" list? "]"
  )g");
  std::mt19937_64 rng(7);
  int ended = 0;
  for (int walk = 0; walk < 200; ++walk) {
    auto constraint = MakeEbnfConstraint(vocabulary, {kEnd}, grammar);
    EbnfWorkspace workspace(grammar.get());
    EbnfState state(&workspace);
    std::string text;
    for (int step = 0; step < 40; ++step) {
      INFO("walk " << walk << " after: " << text);
      const auto allowed = constraint->Allowed({});
      const std::vector<int32_t> ids = testing::Ids(*allowed);
      REQUIRE(ids == testing::TokensTaken(state, *vocabulary, kEnd));
      int32_t next = ids[rng() % ids.size()];
      if (step >= 10 && (*allowed)[kEnd] != 0) next = kEnd;
      if (next == kEnd) {
        CHECK(Matches(*grammar, text) == state.can_end());
        ended += state.can_end() ? 1 : 0;
        break;
      }
      text += *vocabulary->bytes(next);
      REQUIRE(state.Feed(*vocabulary->bytes(next)));
      constraint->Commit(std::vector<int32_t>{next});
      CHECK(constraint->complete() == state.complete());
    }
  }
  CHECK(ended >= 100);
}

// Whether `grammar` after `text` is between characters that every plain character leads back
// to (EbnfState::in_string, where a mask allows every plain token without a walk).
bool InString(const EbnfGrammar& grammar, std::string_view text) {
  EbnfWorkspace workspace(&grammar);
  EbnfState state(&workspace);
  REQUIRE(state.Feed(text));
  return state.in_string();
}

TEST_CASE("Inside a grammar's strings plain tokens are allowed without a walk, masks exact",
          "[grammar]") {
  // JSON as a grammar (json_as_gbnf.h).
  const auto json = Compiled(kJsonAsGbnf);
  CHECK(InString(*json, "{\""));
  CHECK(InString(*json, "{\"key"));
  CHECK(InString(*json, "{\"k\": [\"a\\n\xC3\xA9"));
  CHECK_FALSE(InString(*json, "{"));
  CHECK_FALSE(InString(*json, "{\"k\":"));
  CHECK_FALSE(InString(*json, "{\"a\\"));    // an escape
  CHECK_FALSE(InString(*json, "{\"a\\u0"));  // inside \uXXXX
  CHECK_FALSE(InString(*json, "{\"a\xC3"));  // a character not yet whole
  // Every plain character must lead back: one left out ('x'), or a count, is walked instead.
  CHECK_FALSE(InString(*Compiled(R"g(root ::= "\"" [^"\\x]* "\"")g"), "\""));
  CHECK_FALSE(InString(*Compiled(R"g(root ::= "\"" [^"\\\U0001F3A9]* "\"")g"), "\""));
  CHECK_FALSE(InString(*Compiled(R"g(root ::= [a-z]*)g"), ""));
  CHECK_FALSE(InString(*Compiled(R"g(root ::= .{0,5})g"), ""));
  CHECK(InString(*Compiled(R"g(root ::= [^\n]*)g"), "abc"));
  CHECK(InString(*Compiled(R"g(root ::= .* "\n")g"), ""));
  CHECK(InString(*Compiled(R"g(root ::= "\"" ([^"\\] | "\\" .)* "\"")g"), "\"x"));

  // Masks along random answers equal the slow ones, over plain tokens and tokens with a
  // quote, a backslash, DEL, a control character or a character cut in two.
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt, ""};
  for (const char* piece :
       {"{",     "}",     "{\"",      "\"",   "\":",          "\",",  "\"}", ":",    ",",
        " ",     "\n",    "\t",       "a",    "ab",           " b",   "x y", "é",    "你好",
        "🎩",     "1",     "12",       "-3",   "true",         "null", "[",   "]",    "\x7F",
        "a\x7F", "a\"",   "\\",       "\\n",  "\\u00e9",      "\\u",  "00",  "e9",   "\xC3",
        "\xA9",  "a\xC3", "\xE2\x80", "\x94", "\xE2\x80\x94", "\x01", "}\n", "b\\\""}) {
    tokens.emplace_back(piece);
  }
  const auto vocabulary = std::make_shared<const TokenVocabulary>(std::move(tokens));
  std::mt19937_64 rng(11);
  int in_string = 0;
  int ended = 0;
  for (int walk = 0; walk < 200; ++walk) {
    auto constraint = MakeEbnfConstraint(vocabulary, {kEnd}, json);
    EbnfWorkspace workspace(json.get());
    EbnfState state(&workspace);
    std::string text;
    for (int step = 0; step < 60; ++step) {
      INFO("walk " << walk << " after: " << text);
      in_string += state.in_string() ? 1 : 0;
      const auto allowed = constraint->Allowed({});
      const std::vector<int32_t> ids = testing::Ids(*allowed);
      REQUIRE(ids == testing::TokensTaken(state, *vocabulary, kEnd));
      const int32_t next = ids[rng() % ids.size()];
      if (next == kEnd) {
        ended += 1;
        break;
      }
      text += *vocabulary->bytes(next);
      REQUIRE(state.Feed(*vocabulary->bytes(next)));
      constraint->Commit(std::vector<int32_t>{next});
    }
  }
  // The walks passed through strings often, and some ended.
  CHECK(in_string >= 1000);
  CHECK(ended >= 10);
}

TEST_CASE("Right recursion keeps no stack, and calls nested past the limit are refused",
          "[grammar]") {
  const auto right = Compiled(R"g(root ::= "a" root | "")g");
  EbnfWorkspace workspace(right.get());
  EbnfState state(&workspace);
  for (int i = 0; i < 100000; ++i) REQUIRE(state.Feed('a'));
  CHECK(state.can_end());
  CHECK(workspace.stack_nodes() <= 2);
  CHECK(workspace.configurations() <= 3);
  CHECK(state.ways() <= 2);

  const auto nested = Compiled(R"g(root ::= "(" root ")" | "x")g");
  EbnfWorkspace nested_workspace(nested.get());
  EbnfState deep(&nested_workspace);
  int taken = 0;
  while (taken < 5000 && deep.Feed('(')) ++taken;
  CHECK(taken == kMaxEbnfCallDepth);
  CHECK(nested_workspace.over_limit());
  CHECK(deep.cut_by_limit());
  CHECK_FALSE(state.cut_by_limit());
  // The constraint reports it as a TokenConstraint, for the agent's log and metric.
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt,
                                                    "(",          "x",          ")"};
  const auto vocabulary = std::make_shared<const TokenVocabulary>(std::move(tokens));
  auto constraint = MakeEbnfConstraint(vocabulary, {kEnd}, nested);
  CHECK_FALSE(constraint->cut_by_limit());
  const std::vector<int32_t> opens(kMaxEbnfCallDepth, 3);
  constraint->Commit(opens);
  CHECK_FALSE(constraint->cut_by_limit());
  CHECK(testing::Ids(*constraint->Allowed({})) == std::vector<int32_t>{4});  // only "x"
  CHECK(constraint->cut_by_limit());
  CHECK_FALSE(workspace.over_limit());
  CHECK(nested_workspace.stack_nodes() <= static_cast<size_t>(kMaxEbnfCallDepth));
  // A grammar whose ways double with each character ("(" continues a run or opens a group,
  // in which the group's "x" may follow or not) is cut at kMaxWays, not followed
  // exponentially.
  const auto ambiguous = Compiled(R"g(
    root ::= f
    f    ::= [0-9] | "("+ g ")"
    g    ::= f | f "x"
  )g");
  EbnfWorkspace ambiguous_workspace(ambiguous.get());
  EbnfState doubling(&ambiguous_workspace);
  int opened = 0;
  while (opened < 1000 && doubling.Feed('(')) ++opened;
  CHECK(opened >= 4);
  CHECK(opened < 30);
  CHECK(ambiguous_workspace.over_limit());
  CHECK(Matches(*ambiguous, "((1)x)"));
  CHECK(Matches(*ambiguous, "((((1))))"));
  // A choice among many words that share their first characters is no such doubling: 900
  // ways after "w", one per word, fewer with each character.
  std::string words = "root ::= \"wa\"";
  for (int i = 0; i < 900; ++i) words += " | \"w" + std::to_string(i) + "x\"";
  const auto choice = Compiled(words);
  CHECK(Matches(*choice, "w899x"));
  CHECK(Matches(*choice, "wa"));
  CHECK_FALSE(Matches(*choice, "w900x"));
  // Within the limit, the grammar's texts are taken.
  CHECK(Matches(*nested, std::string(500, '(') + "x" + std::string(500, ')')));
}

TEST_CASE("A GBNF grammar it cannot compile is refused, naming the place and the rule",
          "[grammar]") {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"", "no 'root' rule"},
           {"item ::= \"x\"", "no 'root' rule"},
           {"root ::= item", "rule 'item' (line 1, column 10) is not defined"},
           {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
           {"root ::= \"abc", "line 1, column 10: '\"' without its closing '\"'"},
           {"root ::= [a-", "line 1, column 10: '[' without its ']'"},
           {"root ::= [z-a]", "a range from 'z' down to 'a'"},
           {"root ::= []", "an empty character class"},
           {"root ::= (\"a\"", "line 1, column 10: '(' without its ')'"},
           {"root ::= \"a\")", "')' without its '('"},
           {"root ::= \"a\"{3,2}", "the most is less than the least"},
           {"root ::= \"a\"{99999999}", "a count above"},
           {"root ::= \"\\q\"", "unknown escape '\\q'"},
           // A character of more than one byte is named whole (the message stays UTF-8;
           // found by fuzz/openai_request_fuzzer).
           {"root ::= \"\\\xc3\xa9\"", "unknown escape: '\\' before U+00E9"},
           {"root ::= \"\\\x01\"", "unknown escape: '\\' before U+0001"},
           {"root ::= \"\\u12\"", "needs 4 hexadecimal digits"},
           {"root ::= \"\\uD800\"", "not a Unicode character"},
           {"root ::= @", "line 1, column 10: unexpected '@'"},
           {"root ::= \"a\xC3(\"", "line 1, column 12: a byte that is not UTF-8"},
           {"root ::= [\xED\xA0\x80]", "line 1, column 11: a byte that is not UTF-8"},
           {"root = \"a\"", "expected '::=' after the rule's name 'root'"},
           {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"",
            "rule 'expr' is left-recursive (expr -> expr"},
           {"root ::= a\na ::= b? \"x\"\nb ::= c\nc ::= \"\" | a \"y\"",
            "left-recursive (a -> b -> c -> a"},
           {"root ::= ((\"a\"{100}){100}){100}", "compiles to more than"},
           {"root ::= \"a\" root", "rule 'root' (line 1, column 1) never ends"},
           {"root ::= (\"a\"?){15000}", "too many ways to skip optional parts"},
           {"root ::= \"x\" | \"a\" bad\nbad ::= \"(\" bad \")\"",
            "rule 'bad' (line 2, column 1) never ends"},
           {std::string("root ::= \"") + std::string(kMaxEbnfGrammarBytes, 'a') + "\"",
            "longer than"},
       }) {
    INFO(text);
    const auto grammar = EbnfGrammar::Compile(text);
    REQUIRE_FALSE(grammar.ok());
    CHECK(grammar.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(grammar.status().message()),
               Catch::StartsWith("grammar: ") && Catch::Contains(message));
  }
}

}  // namespace
}  // namespace tophat
