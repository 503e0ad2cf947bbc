#include "models/grammar/structural_tag_grammar.h"

#include <catch2/catch.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "models/grammar/grammar_test_util.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

using nlohmann::json;

std::shared_ptr<const CompiledSchema> Compiled(const std::string& schema) {
  return testing::CompiledSchemaOf(schema);
}

std::shared_ptr<const StructuralTagSpec> Spec(std::vector<StructuralTagStructure> structures,
                                              std::vector<std::string> triggers) {
  absl::StatusOr<std::shared_ptr<const StructuralTagSpec>> spec =
      StructuralTagSpec::Create(std::move(structures), std::move(triggers));
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return *spec;
}

constexpr char kWeather[] = R"({"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"], "additionalProperties": false})";
constexpr char kNothing[] =
    R"({"type": "object", "properties": {}, "additionalProperties": false})";

// Llama 3.1's custom tool format, as vLLM's example of structural tags gives it.
std::shared_ptr<const StructuralTagSpec> FunctionTags() {
  return Spec(
      {{.begin = "<function=get_weather>", .schema = Compiled(kWeather), .end = "</function>"},
       {.begin = "<function=get_time>", .schema = Compiled(kNothing), .end = "</function>"}},
      {"<function="});
}

// The bytes of `text` the grammar takes before it refuses one (all of them: text.size()).
size_t Taken(const StructuralTagSpec& spec, std::string_view text) {
  StructuralTagGrammar grammar(&spec);
  for (size_t i = 0; i < text.size(); ++i) {
    if (!grammar.Feed(static_cast<unsigned char>(text[i]))) return i;
  }
  return text.size();
}

// Whether the grammar takes `text` whole and the answer may end after it.
bool Takes(const StructuralTagSpec& spec, std::string_view text) {
  StructuralTagGrammar grammar(&spec);
  return grammar.Feed(text) && grammar.can_end();
}

TEST_CASE("Structural tags: free text, and each structure begun is written whole and valid",
          "[grammar][structural_tag]") {
  const auto spec = FunctionTags();
  // Text alone, anything but a trigger: the answer may end anywhere in it.
  CHECK(Takes(*spec, ""));
  CHECK(Takes(*spec, "It is sunny in Oslo. <b>function</b> = <func"));
  // Structures with text around and between them.
  const std::string weather = R"(<function=get_weather>{"city": "Oslo", "days": 2}</function>)";
  CHECK(Takes(*spec, weather));
  CHECK(Takes(*spec, "Let me look.\n" + weather + " and " + "<function=get_time>{}</function>" +
                         "\nDone."));
  CHECK(Takes(*spec, weather + weather));
  // Whitespace before the value, as a JSON value takes it.
  CHECK(Takes(*spec, "<function=get_time> {}</function>"));
  // Inside a structure the answer may not end.
  for (const std::string& cut : {std::string("<function="), std::string("<function=get_w"),
                                 std::string(R"(<function=get_weather>{"city": "Os)"),
                                 std::string(R"(<function=get_weather>{"city": "Oslo"})"),
                                 std::string(R"(<function=get_weather>{"city": "Oslo"}</func)")}) {
    INFO(cut);
    StructuralTagGrammar grammar(spec.get());
    CHECK(grammar.Feed(cut));
    CHECK_FALSE(grammar.can_end());
    CHECK(grammar.in_structure());
    CHECK_FALSE(grammar.complete());
  }
  // Refused where they go wrong: a name no structure has, a value the schema refuses, an
  // end other than the structure's.
  CHECK(Taken(*spec, "Sure: <function=get_date>{}") == std::string("Sure: <function=get_").size());
  CHECK(Taken(*spec, R"(<function=get_weather>{"town": "Oslo"})") ==
        std::string(R"(<function=get_weather>{")").size());
  CHECK(Taken(*spec, R"(<function=get_weather>{"city": "Oslo", "days": 0})") ==
        std::string(R"(<function=get_weather>{"city": "Oslo", "days": )").size());
  CHECK(Taken(*spec, "<function=get_time>{}</tool>") ==
        std::string("<function=get_time>{}</").size());
  // A trigger's bytes split by others are text.
  CHECK(Takes(*spec, "<functio n=get_weather>{oops}"));
  // Inside a value's string the value's grammar says what a string takes.
  StructuralTagGrammar grammar(spec.get());
  REQUIRE(grammar.Feed(R"(<function=get_weather>{"city": "Os)"));
  CHECK(grammar.in_string());
  CHECK(grammar.string_room() > 0);
}

TEST_CASE("Structural tags: a begin that is its trigger, an empty end, and a number before an end",
          "[grammar][structural_tag]") {
  SECTION("JSON after the reasoning, then text again") {
    const auto spec =
        Spec({{.begin = "</think>", .schema = Compiled(kWeather), .end = ""}}, {"</think>"});
    CHECK(Takes(*spec, "<think>Oslo, surely.</think>{\"city\": \"Oslo\"}"));
    CHECK(Takes(*spec, "<think>x</think>\n{\"city\": \"Oslo\"} and more text"));
    CHECK(Taken(*spec, "<think>x</think>Oslo") == std::string("<think>x</think>").size());
    StructuralTagGrammar grammar(spec.get());
    REQUIRE(grammar.Feed("<think>hm</think>"));
    CHECK_FALSE(grammar.can_end());
  }
  SECTION("An integer ends where a byte cannot go on with it") {
    const auto spec =
        Spec({{.begin = "<n>", .schema = Compiled(R"({"type": "integer"})"), .end = "</n>"},
              {.begin = "<m>", .schema = Compiled(R"({"type": "integer"})"), .end = ""}},
             {"<n>", "<m>"});
    CHECK(Takes(*spec, "<n>12</n>"));
    CHECK(Takes(*spec, "<n>-7</n> then <n>0</n>"));
    CHECK(Taken(*spec, "<n>12x") == 5);
    StructuralTagGrammar grammar(spec.get());
    REQUIRE(grammar.Feed("<n>12"));
    CHECK_FALSE(grammar.can_end());  // the end is still to come
    // With an empty end the text follows the number at once, and may be a structure again.
    CHECK(Takes(*spec, "<m>12 apples"));
    CHECK(Takes(*spec, "<m>12<m>3"));
    // There the answer may also end after the number, which is whole.
    StructuralTagGrammar after(spec.get());
    REQUIRE(after.Feed("<m>1"));
    CHECK(after.can_end());
    REQUIRE(after.Feed("-"));  // not a number's: text
    CHECK(after.can_end());
    CHECK_FALSE(after.in_structure());
  }
  SECTION("A self-overlapping trigger is found wherever the text's tail has it") {
    const auto spec =
        Spec({{.begin = "aab:", .schema = Compiled(R"({"enum": ["on"]})"), .end = ";"}}, {"aab"});
    CHECK(Takes(*spec, "aaab:\"on\";"));
    CHECK(Takes(*spec, "abaaaab:\"on\";aa"));
    CHECK(Taken(*spec, "aaaab") == 5);
    CHECK(Taken(*spec, "aaaab!") == 5);
  }
}

// What the grammar must take, worked out the slow way: in the text, the first trigger the
// text's tail completes (at the earliest byte) must go on with one of the structures its
// begins start with, value in `values`, whole; text again after it.
struct Reference {
  struct Structure {
    std::string begin;
    std::vector<std::string> values;
    std::string end;
  };
  std::vector<Structure> structures;
  std::vector<std::string> triggers;

  // Where from `from` on the first trigger occurrence ends, its start; npos if none.
  size_t FirstTrigger(std::string_view s, size_t from) const {
    for (size_t end = from + 1; end <= s.size(); ++end) {
      for (const std::string& t : triggers) {
        if (end - from >= t.size() && s.substr(end - t.size(), t.size()) == t) {
          return end - t.size();
        }
      }
    }
    return std::string_view::npos;
  }
  // Whether `s` from `from` (in the text) starts a valid answer; with `whole`, one that may end.
  bool Valid(std::string_view s, size_t from, bool whole) const {
    const size_t start = FirstTrigger(s, from);
    if (start == std::string_view::npos) return true;
    const std::string_view rest = s.substr(start);
    for (const Structure& structure : structures) {
      for (const std::string& value : structure.values) {
        const std::string full = structure.begin + value + structure.end;
        if (rest.size() < full.size() && full.starts_with(rest)) {
          if (!whole) return true;  // inside the structure, where the answer cannot end
          continue;
        }
        if (rest.starts_with(full) && Valid(s, start + full.size(), whole)) return true;
      }
    }
    return false;
  }
};

TEST_CASE("Structural tags take exactly what a slow reference takes, on random texts",
          "[grammar][structural_tag]") {
  const auto on_off = Compiled(R"({"enum": ["on", "off"]})");
  const auto spec = Spec({{.begin = "<f=x>", .schema = on_off, .end = "</f>"},
                          {.begin = "<f=yz>", .schema = on_off, .end = "</f>"},
                          {.begin = "aab", .schema = on_off, .end = "!"}},
                         {"<f=", "aab"});
  const Reference reference{.structures = {{"<f=x>", {"\"on\"", "\"off\""}, "</f>"},
                                           {"<f=yz>", {"\"on\"", "\"off\""}, "</f>"},
                                           {"aab", {"\"on\"", "\"off\""}, "!"}},
                            .triggers = {"<f=", "aab"}};
  const std::vector<std::string> pieces = {
      "<", "f", "=", "x",     ">",      "y",      "z",       "a",    "b",   "!",   "\"",
      "o", "n", "/", "<f=x>", "<f=yz>", "\"on\"", "\"off\"", "</f>", "aab", "<f=", "aa"};
  std::mt19937_64 rng(7);
  int valid = 0;
  int whole = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string text;
    const int count = std::uniform_int_distribution<int>(0, 8)(rng);
    for (int i = 0; i < count; ++i) {
      text += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
    }
    INFO(text);
    StructuralTagGrammar grammar(spec.get());
    const bool taken = grammar.Feed(text);
    REQUIRE(taken == reference.Valid(text, 0, false));
    if (taken) {
      ++valid;
      REQUIRE(grammar.can_end() == reference.Valid(text, 0, true));
      whole += grammar.can_end() ? 1 : 0;
    }
  }
  // Both kinds, and answers inside and outside structures.
  CHECK(valid > 2000);
  CHECK(valid < 19000);
  CHECK(whole > 1000);
  CHECK(valid - whole > 500);
}

TEST_CASE("Equal places in the text are equal states, and a structure's states are its own",
          "[grammar][structural_tag]") {
  const auto spec = FunctionTags();
  const auto at = [&](std::string_view text) {
    StructuralTagGrammar grammar(spec.get());
    REQUIRE(grammar.Feed(text));
    return grammar;
  };
  CHECK(at("") == at("Hello, world."));
  CHECK(at("") == at(R"(<function=get_time>{}</function>)"));
  CHECK(at("x <func") == at("<function=get_time>{}</function><func"));
  CHECK_FALSE(at("") == at("<func"));
  CHECK_FALSE(at("<function=get_time>") == at("<function=get_weather>"));
  CHECK(absl::HashOf(at("abc")) == absl::HashOf(at("")));
}

TEST_CASE("Structural tag specs that cannot be held to are refused, naming the place",
          "[grammar][structural_tag]") {
  const auto object = Compiled(kNothing);
  const auto integer = Compiled(R"({"type": "integer"})");
  const auto refused = [](std::vector<StructuralTagStructure> structures,
                          std::vector<std::string> triggers) {
    absl::StatusOr<std::shared_ptr<const StructuralTagSpec>> spec =
        StructuralTagSpec::Create(std::move(structures), std::move(triggers));
    REQUIRE_FALSE(spec.ok());
    CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(spec.status().message());
  };
  CHECK(refused({}, {"<"}) == "structures: none given");
  CHECK(refused({{.begin = "<a>", .schema = object, .end = ""}}, {}) == "triggers: none given");
  CHECK(refused({{.begin = "<a>", .schema = object, .end = ""}}, {"<", ""}) ==
        "triggers[1]: empty");
  CHECK(refused({{.begin = "<a>", .schema = object, .end = ""}}, {"<a", "x<a"}) ==
        "triggers[0]: \"<a\" occurs in triggers[1] \"x<a\", which would never be found");
  CHECK(refused({{.begin = "<a>", .schema = object, .end = ""}}, {"<a", "<a"}) ==
        "triggers[1]: \"<a\" is triggers[0] too");
  CHECK(refused({{.begin = "<a>", .schema = object, .end = ""}}, {"<a", "<b"}) ==
        "triggers[1]: \"<b\" starts no structure's begin: the text could never write it");
  CHECK(refused({{.begin = "[a]", .schema = object, .end = ""}}, {"<"}) ==
        "structures[0].begin: \"[a]\" starts with none of the triggers: the text would never "
        "lead to it");
  CHECK(refused({{.begin = "", .schema = object, .end = ""}}, {"<"}) ==
        "structures[0].begin: empty");
  CHECK(refused({{.begin = "<a>", .schema = nullptr, .end = ""}}, {"<"}) ==
        "structures[0].schema: none");
  CHECK(refused({{.begin = "<a>", .schema = object, .end = ""},
                 {.begin = "<a>x", .schema = object, .end = ""}},
                {"<"}) ==
        "structures[1].begin: \"<a>x\" and structures[0]'s \"<a>\": one starts with the other, "
        "so where one ends is ambiguous");
  CHECK(refused({{.begin = "<a>", .schema = object, .end = ""},
                 {.begin = "<a>", .schema = integer, .end = ""}},
                {"<"}) == "structures[1].begin: \"<a>\" is structures[0]'s too");
  CHECK(refused({{.begin = "<n>", .schema = integer, .end = "1</n>"}}, {"<"}) ==
        "structures[0].end: \"1</n>\" starts with a byte a number goes on with, and the schema "
        "takes numbers: the value would take it rather than end");
  CHECK(refused({{.begin = "<a>", .schema = object, .end = std::string(257, 'x')}}, {"<"}) ==
        "structures[0].end: 257 bytes, at most 256");
  // The same end after a value that is never a number is fine.
  CHECK(
      StructuralTagSpec::Create({{.begin = "<n>", .schema = object, .end = "1</n>"}}, {"<"}).ok());
}

TEST_CASE("Structural tags from vLLM's JSON: taken, or refused naming the field",
          "[grammar][structural_tag]") {
  absl::StatusOr<std::shared_ptr<const StructuralTagSpec>> parsed = StructuralTagSpec::Parse(R"({
      "type": "structural_tag",
      "structures": [{"begin": "<function=get_weather>", "schema": {"type": "object",
                      "properties": {"city": {"type": "string"}}, "required": ["city"]},
                      "end": "</function>"}],
      "triggers": ["<function="]})");
  REQUIRE(parsed.ok());
  CHECK((*parsed)->structures().size() == 1);
  CHECK(Takes(**parsed, R"(Hm. <function=get_weather>{"city": "Oslo"}</function>)"));
  CHECK_FALSE(Takes(**parsed, R"(<function=get_weather>{}</function>)"));

  const auto message = [](std::string_view text) {
    absl::StatusOr<std::shared_ptr<const StructuralTagSpec>> spec = StructuralTagSpec::Parse(text);
    REQUIRE_FALSE(spec.ok());
    return std::string(spec.status().message());
  };
  CHECK(message("[1]").starts_with("a structural tag is an object"));
  CHECK(message("{").starts_with("the structural tag is not JSON"));
  CHECK(message(R"({"type": "structural_tag", "format": {"type": "triggered_tags"}})")
            .starts_with("format: the later form of structural tags"));
  CHECK(message(R"({"structures": [], "triggers": [], "extra": 1})") ==
        "'extra' is not a field of a structural tag (structures, triggers)");
  CHECK(message(R"({"triggers": ["<"]})").starts_with("structures: missing or not an array"));
  CHECK(message(R"({"structures": [{"begin": "<a", "schema": {}, "end": ""}]})")
            .starts_with("triggers: missing or not an array"));
  CHECK(message(R"({"structures": [{"begin": "<a", "end": ""}], "triggers": ["<"]})") ==
        "structures[0].schema: missing");
  CHECK(message(R"({"structures": [{"begin": 1, "schema": {}, "end": ""}], "triggers": ["<"]})") ==
        "structures[0].begin: not a string");
  CHECK(message(R"({"structures": [{"begin": "<a", "schema": {}, "end": "", "x": 1}],
                    "triggers": ["<"]})") ==
        "structures[0].x: not a field of a structure (begin, schema, end)");
  CHECK(message(R"({"structures": [{"begin": "<a", "schema": {"type": "object",
                    "properties": {"s": {"type": "string", "uniqueItems": true}}}, "end": ""}],
                    "triggers": ["<"]})")
            .starts_with("structures[0].schema at /properties/s"));
  CHECK(message(R"({"structures": [{"begin": "<a", "schema": {}, "end": ""}], "triggers": [1]})") ==
        "triggers[0]: not a string");
  CHECK(message(R"({"structures": [{"begin": "<a", "schema": {}, "end": ""}], "triggers": ["<b"]})")
            .starts_with("structures[0].begin: \"<a\" starts with none of the triggers"));
}

// A small vocabulary with pieces across the triggers', begins' and values' boundaries, and
// the bytes a structure needs one by one (so that every state can go on).
constexpr int32_t kEnd = 2;
std::shared_ptr<const TokenVocabulary> TagVocabulary() {
  return testing::PieceVocabulary({"<function=",
                                   "<function=get_weather>",
                                   "<func",
                                   "tion=",
                                   "get_",
                                   "weather>{",
                                   "time>",
                                   "{\"city\": \"",
                                   "Oslo",
                                   "\"}",
                                   "\"}</function>",
                                   "</function>",
                                   "</",
                                   "function>",
                                   "{}",
                                   "{}</function>\n",
                                   "Hello",
                                   " <",
                                   "\n",
                                   "\xC3\xA9",
                                   ", \"days\": ",
                                   "12"},
                                  "\n {}\":,<>/=_-0123Oabcdefghijklmnopqrstuvwxyz");
}

TEST_CASE(
    "A structural tag constraint's masks are each token fed on its own: every token in the "
    "text, a structure's pieces inside one",
    "[grammar][structural_tag]") {
  const auto vocabulary = TagVocabulary();
  const auto id = [&](std::string_view piece) { return testing::PieceId(*vocabulary, piece); };
  const auto spec = FunctionTags();
  auto constraint = MakeStructuralTagConstraint(vocabulary, {kEnd}, spec);
  std::mt19937_64 rng(17);
  int structures = 0;
  int ended = 0;
  for (int walk = 0; walk < 40; ++walk) {
    std::vector<int32_t> pending;
    StructuralTagGrammar state(spec.get());
    for (int step = 0; step < 120; ++step) {
      const auto mask = constraint->Allowed(pending);
      const std::vector<int32_t> expected = testing::TokensTaken(state, *vocabulary, kEnd);
      INFO("after " << pending.size() << " tokens");
      const std::vector<int32_t> got = testing::Ids(*mask);
      REQUIRE(got == expected);
      int32_t next = got[std::uniform_int_distribution<size_t>(0, got.size() - 1)(rng)];
      if (!state.in_structure() && std::bernoulli_distribution(0.2)(rng)) {
        next = id("<function=");
      }
      // Inside a structure, mostly the pieces that go on with one, so that walks finish them.
      std::vector<int32_t> onward;
      for (const char* piece : {"get_", "weather>{", "time>", "{\"city\": \"", "Oslo", "\"}",
                                "\"}</function>", "{}</function>\n", "</function>"}) {
        if (std::find(got.begin(), got.end(), id(piece)) != got.end()) onward.push_back(id(piece));
      }
      if (state.in_structure() && !onward.empty() && std::bernoulli_distribution(0.8)(rng)) {
        next = onward[std::uniform_int_distribution<size_t>(0, onward.size() - 1)(rng)];
      }
      if (state.can_end() && std::bernoulli_distribution(0.05)(rng)) next = kEnd;
      if (next == kEnd) {
        ++ended;
        break;
      }
      const bool was_in = state.in_structure();
      REQUIRE(state.Feed(*vocabulary->bytes(next)));
      structures += was_in && !state.in_structure() ? 1 : 0;
      pending.push_back(next);
    }
  }
  CHECK(structures > 10);
  CHECK(ended > 10);

  SECTION("Text is one state whatever it says: one mask for all of it") {
    StructuralTagConstraint tags(vocabulary, {kEnd}, StructuralTagGrammar(spec.get()), spec);
    const auto count = [&](std::vector<int32_t> pending) {
      return testing::Ids(*tags.Allowed(pending)).size();
    };
    const size_t every = count({});
    // Every token but the special ones and the empty one, and the end.
    CHECK(every == static_cast<size_t>(vocabulary->size() - 3));
    const int64_t computed = tags.masks_computed();
    for (const char* piece : {"Hello", " ", "Oslo", "12", "{}", "\n", "</function>", ">", "/"}) {
      tags.Commit(std::vector<int32_t>{id(piece)});
      CHECK(count({}) == every);
    }
    CHECK(tags.masks_computed() == computed);
    // The trigger commits the answer to a structure: only its names' pieces.
    tags.Commit(std::vector<int32_t>{id("<function=")});
    std::set<std::string> pieces;
    for (const int32_t i : testing::Ids(*tags.Allowed({}))) pieces.insert(*vocabulary->bytes(i));
    CHECK(pieces == std::set<std::string>{"g", "get_"});
  }
}

}  // namespace
}  // namespace tophat
