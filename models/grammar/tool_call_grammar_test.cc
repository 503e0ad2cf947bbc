#include "models/grammar/tool_call_grammar.h"

#include <catch2/catch.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

using nlohmann::json;

// Qwen2.5's (hermes) and Llama 3.1's, as chat_template.h describes them.
ToolCallSyntax Hermes() {
  return {.open = "<tool_call>\n{\"name\": \"",
          .between = "\", \"arguments\": ",
          .close = "}\n</tool_call>",
          .separator = "\n"};
}
ToolCallSyntax Llama() {
  return {.open = "{\"name\": \"", .between = "\", \"parameters\": ", .close = "}"};
}

std::shared_ptr<const CompiledSchema> Compiled(const std::string& schema) {
  absl::StatusOr<std::shared_ptr<const CompiledSchema>> compiled =
      CompiledSchema::Compile(json::parse(schema));
  INFO(schema << ": " << compiled.status().ToString());
  REQUIRE(compiled.ok());
  return *compiled;
}

constexpr char kWeather[] = R"({"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"], "additionalProperties": false})";
constexpr char kNothing[] =
    R"({"type": "object", "properties": {}, "additionalProperties": false})";

// "get" is a prefix of "get_weather".
std::vector<ToolCallTool> WeatherTools() {
  return {{.name = "get_weather", .parameters = Compiled(kWeather)},
          {.name = "get", .parameters = Compiled(kNothing)}};
}

std::shared_ptr<const ToolCallSpec> Spec(ToolCallSyntax syntax, std::vector<ToolCallTool> tools,
                                         int32_t max_calls) {
  absl::StatusOr<std::shared_ptr<const ToolCallSpec>> spec =
      ToolCallSpec::Create(std::move(syntax), std::move(tools), max_calls);
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return *spec;
}

// The bytes of `text` the grammar takes before it refuses one (all of them: text.size()).
size_t Taken(const ToolCallSpec& spec, std::string_view text) {
  ToolCallGrammar grammar(&spec);
  for (size_t i = 0; i < text.size(); ++i) {
    if (!grammar.Feed(static_cast<unsigned char>(text[i]))) return i;
  }
  return text.size();
}

// Whether the grammar takes `text` whole and the answer may end after it.
bool Takes(const ToolCallSpec& spec, std::string_view text) {
  ToolCallGrammar grammar(&spec);
  return grammar.Feed(text) && grammar.can_end();
}

std::string Call(const ToolCallSyntax& syntax, const std::string& name, const std::string& args) {
  return syntax.open + name + syntax.between + args + syntax.close;
}

TEST_CASE("Hermes tool calls are taken exactly, and nothing else is", "[grammar][tool_calls]") {
  const ToolCallSyntax syntax = Hermes();
  const auto spec = Spec(syntax, WeatherTools(), /*max_calls=*/2);
  const std::string paris = Call(syntax, "get_weather", R"({"city": "Paris"})");
  const std::string get = Call(syntax, "get", "{}");
  CHECK(paris ==
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\"}}\n</tool_call>");
  for (const std::string& good : {
           paris,
           get,
           Call(syntax, "get_weather", R"({"days":3,"city":"Rome"})"),
           // Whitespace inside the arguments, as SchemaGrammar takes it.
           Call(syntax, "get_weather", "{ \"city\" :\"Oslo\" ,\n  \"days\": 1 }"),
           paris + "\n" + get,
       }) {
    INFO(good);
    CHECK(Takes(*spec, good));
  }
  // Each refused at the byte the comment names: everything before it is taken.
  const size_t name = syntax.open.size();
  const size_t args = name + std::string("get_weather").size() + syntax.between.size();
  const size_t close = args + std::string(R"({"city": "Paris"})").size();
  const struct {
    std::string text;
    size_t refused_at;
  } bad[] = {
      {Call(syntax, "set", "{}"), name},                                // no such tool
      {Call(syntax, "get_weathe", R"({"city": "Paris"})"), name + 10},  // only a prefix
      {Call(syntax, "get_weather_x", "{}"), name + 11},                 // a longer name
      {Call(syntax, "get ", "{}"), name + 3},  // whitespace in the literals
      {" " + paris, 0},
      {Call(syntax, "get_weather", R"( {"city": "Paris"})"), args},   // before the arguments
      {Call(syntax, "get_weather", R"({"city": "Paris"} )"), close},  // after them
      {Call(syntax, "get_weather", R"({"days": 3})"), args + 10},     // city is required
      {Call(syntax, "get_weather", R"({"city": 3})"), args + 9},      // not a string
      {Call(syntax, "get_weather", R"({"city": "P", "days": 0})"), args + 22},  // minimum 1
      {Call(syntax, "get_weather", R"({"city": "P", "x": 1})"), args + 15},     // undeclared
      // get takes no properties.
      {Call(syntax, "get", R"({"city": "Paris"})"), name + 3 + syntax.between.size() + 1},
      {paris + " ", paris.size()},
      {paris + "\n\n" + get, paris.size() + 1},                          // the separator is exact
      {paris + get, paris.size()},                                       // and needed
      {paris + "\n" + get + "\n" + get, paris.size() + 1 + get.size()},  // max_calls 2
  };
  for (const auto& [text, refused_at] : bad) {
    INFO(text);
    CHECK(Taken(*spec, text) == refused_at);
  }
}

TEST_CASE("Llama 3.1 tool calls are one call, taken exactly", "[grammar][tool_calls]") {
  const ToolCallSyntax syntax = Llama();
  const auto spec = Spec(syntax, WeatherTools(), /*max_calls=*/1);
  const std::string call = Call(syntax, "get_weather", R"({"city": "Paris", "days": 2})");
  CHECK(call == R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 2}})");
  ToolCallGrammar grammar(spec.get());
  REQUIRE(grammar.Feed(call));
  CHECK(grammar.complete());
  CHECK(grammar.can_end());
  CHECK(grammar.calls() == 1);
  // Nothing after the one call: no separator, no whitespace.
  for (const unsigned char next : {'\n', ' ', '{', ','}) {
    ToolCallGrammar after = grammar;
    CHECK_FALSE(after.Feed(next));
  }
  CHECK(Takes(*spec, Call(syntax, "get", "{}")));
  CHECK(Takes(*spec, Call(syntax, "get", "{ }")));
  CHECK(Taken(*spec, R"({"name":"get", "parameters": {}})") == 8);
  CHECK(Taken(*spec, Call(syntax, "get_weather", "{}")) == call.find('{', 1) + 1);
  // Where a name that is a prefix of another may end.
  CHECK(Taken(*spec, Call(syntax, "get_", "{}")) == syntax.open.size() + 4);
}

TEST_CASE("complete() and can_end() hold exactly after each call's close",
          "[grammar][tool_calls]") {
  const ToolCallSyntax syntax = Hermes();
  const auto spec = Spec(syntax, WeatherTools(), /*max_calls=*/2);
  const std::string first = Call(syntax, "get_weather", R"({"city":"A"})");
  const std::string second = Call(syntax, "get", "{}");
  const std::string text = first + *syntax.separator + second;
  ToolCallGrammar grammar(spec.get());
  CHECK_FALSE(grammar.can_end());
  for (size_t i = 0; i < text.size(); ++i) {
    INFO("after " << i + 1 << " bytes: " << text.substr(0, i + 1));
    REQUIRE(grammar.Feed(static_cast<unsigned char>(text[i])));
    const bool after_first = i + 1 == first.size();
    const bool after_second = i + 1 == text.size();
    CHECK(grammar.can_end() == (after_first || after_second));
    CHECK(grammar.complete() == after_second);
    CHECK(grammar.calls() == (after_second ? 2 : i + 1 >= first.size() ? 1 : 0));
    // In the arguments' strings only.
    const size_t quote = first.find("\"A\"");
    const bool in_city = i >= quote && i <= quote + 1;
    CHECK(grammar.in_string() == in_city);
  }
  CHECK_FALSE(grammar.Feed('\n'));
}

TEST_CASE("Equal positions are equal states, whatever led to them", "[grammar][tool_calls]") {
  const ToolCallSyntax syntax = Hermes();
  const auto spec = Spec(syntax, WeatherTools(), /*max_calls=*/3);
  // Different tools and arguments, then the same second call's start.
  ToolCallGrammar a(spec.get());
  ToolCallGrammar b(spec.get());
  REQUIRE(a.Feed(Call(syntax, "get_weather", R"({"city": "Paris", "days": 12})") + "\n<tool"));
  REQUIRE(b.Feed(Call(syntax, "get", "{ }") + "\n<tool"));
  CHECK(a == b);
  CHECK(absl::Hash<ToolCallGrammar>{}(a) == absl::Hash<ToolCallGrammar>{}(b));
  // Inside the same tool's arguments at the same place.
  REQUIRE(a.Feed(std::string("_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"")));
  REQUIRE(b.Feed(std::string("_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"")));
  CHECK(a == b);
  CHECK(absl::Hash<ToolCallGrammar>{}(a) == absl::Hash<ToolCallGrammar>{}(b));
  // A different count of calls is a different state.
  ToolCallGrammar c(spec.get());
  REQUIRE(c.Feed(Call(syntax, "get", "{}") + "\n" + Call(syntax, "get", "{}") + "\n<tool"));
  ToolCallGrammar d(spec.get());
  REQUIRE(d.Feed(Call(syntax, "get", "{}") + "\n<tool"));
  CHECK_FALSE(c == d);
}

std::string Refusal(ToolCallSyntax syntax, std::vector<ToolCallTool> tools, int32_t max_calls) {
  absl::StatusOr<std::shared_ptr<const ToolCallSpec>> spec =
      ToolCallSpec::Create(std::move(syntax), std::move(tools), max_calls);
  REQUIRE_FALSE(spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST_CASE("Tool call specs that cannot be held to are refused, naming the tool",
          "[grammar][tool_calls]") {
  const auto object = Compiled(kNothing);
  const auto tools = [&](std::vector<std::string> names) {
    std::vector<ToolCallTool> out;
    for (std::string& name : names) out.push_back({.name = std::move(name), .parameters = object});
    return out;
  };
  CHECK_THAT(Refusal(Hermes(), {}, 1), Catch::Contains("none given"));
  std::vector<std::string> many;
  for (int i = 0; i <= ToolCallSpec::kMaxTools; ++i) many.push_back("t" + std::to_string(i));
  CHECK_THAT(Refusal(Hermes(), tools(many), 1), Catch::Contains("129 given, at most 128"));
  many.pop_back();
  CHECK(ToolCallSpec::Create(Hermes(), tools(many), 1).ok());

  for (const std::string& bad : std::vector<std::string>{
           "", "get weather", "get.weather", "na\xC3\xAFve", "a\"b", std::string(65, 'a')}) {
    INFO(bad);
    CHECK_THAT(Refusal(Hermes(), tools({"ok", "fine", bad}), 1),
               Catch::Contains("tools[2]: name") && Catch::Contains("must be 1 to 64"));
  }
  CHECK(ToolCallSpec::Create(Hermes(), tools({std::string(64, 'a'), "A-z_09"}), 1).ok());
  CHECK_THAT(Refusal(Hermes(), tools({"a", "ab", "a"}), 1),
             Catch::Contains("tools[2]: name \"a\" is tools[0]'s too"));
  CHECK_THAT(Refusal(Hermes(), {{.name = "a", .parameters = object}, {.name = "b"}}, 1),
             Catch::Contains("tools[1] (\"b\"): no parameters schema"));

  // Arguments are a JSON object: a root that may be anything else is refused.
  for (const char* schema : {
           "{}",
           "true",
           R"({"type": "string"})",
           R"({"type": ["object", "null"]})",
           R"({"anyOf": [{"type": "object"}, {"type": "null"}]})",
           R"({"$ref": "#/$defs/A", "$defs": {"A": {"type": ["object", "array"]}}})",
           R"({"anyOf": [{}]})",
           R"({"enum": [{"a": 1}, 2]})",
       }) {
    INFO(schema);
    CHECK_THAT(Refusal(Hermes(),
                       {{.name = "a", .parameters = object},
                        {.name = "b", .parameters = Compiled(schema)}},
                       1),
               Catch::Contains("tools[1] (\"b\"): its parameters schema must take JSON objects "
                               "only"));
  }
  for (const char* schema : {
           kWeather,
           R"({"type": "object"})",
           R"({"properties": {"a": {}}})",
           R"({"$ref": "#/$defs/A", "$defs": {"A": {"type": "object"}}})",
           R"({"anyOf": [{"type": "object", "properties": {"a": {}}, "required": ["a"]}]})",
           R"({"enum": [{"a": 1}, {"b": 2}]})",
       }) {
    INFO(schema);
    CHECK(ToolCallSpec::Create(Hermes(), {{.name = "a", .parameters = Compiled(schema)}}, 1).ok());
  }

  CHECK_THAT(Refusal(Hermes(), tools({"a"}), 0), Catch::Contains("max_calls must be >= 1"));
  CHECK_THAT(Refusal(Llama(), tools({"a"}), 2), Catch::Contains("no separator"));
  CHECK(ToolCallSpec::Create(Hermes(), tools({"a"}), 5).ok());
  for (const auto& [part, syntax] :
       {std::pair{"open", ToolCallSyntax{.between = "\"", .close = "}"}},
        {"between", ToolCallSyntax{.open = "{", .close = "}"}},
        {"close", ToolCallSyntax{.open = "{", .between = "\""}}}) {
    CHECK_THAT(Refusal(syntax, tools({"a"}), 1),
               Catch::Contains(std::string("syntax: ") + part + " is empty"));
  }
  CHECK_THAT(Refusal({.open = "<", .between = "_args>", .close = ">"}, tools({"a"}), 1),
             Catch::Contains("starts with a character a name may have"));
}

// The schemas of the random tests: no free values and no number that may have an exponent,
// so that every value the grammar writes parses (nlohmann refuses 1e999).
constexpr char kBooking[] = R"({"type": "object", "properties": {
      "guests": {"type": "array", "items": {"type": "object", "properties": {
          "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
        "required": ["name"], "additionalProperties": false}, "maxItems": 3},
      "room": {"enum": ["single", "double", 3, null]},
      "nights": {"type": "integer", "minimum": 1, "maximum": 30},
      "price": {"type": "number", "minimum": 0, "exclusiveMaximum": 1000},
      "paid": {"type": ["boolean", "null"]}},
    "required": ["guests", "nights"], "additionalProperties": false})";
constexpr char kTree[] = R"({"$defs": {"Tree": {"type": "object", "properties": {
      "v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}},
    "required": ["v"], "additionalProperties": false}},
    "$ref": "#/$defs/Tree"})";

std::vector<ToolCallTool> RandomTestTools() {
  return {{.name = "get_weather", .parameters = Compiled(kWeather)},
          {.name = "get", .parameters = Compiled(kNothing)},
          {.name = "book", .parameters = Compiled(kBooking)},
          {.name = "book-2", .parameters = Compiled(kTree)}};
}

// `text`, calls the grammar took whole, split by the syntax alone: each call's tool and
// arguments (the shortest text that parses before a close). Fails the test where it does not
// split.
std::vector<std::pair<const ToolCallTool*, json>> SplitCalls(const ToolCallSpec& spec,
                                                             std::string_view text) {
  const ToolCallSyntax& syntax = spec.syntax();
  std::vector<std::pair<const ToolCallTool*, json>> calls;
  while (true) {
    REQUIRE(text.starts_with(syntax.open));
    text.remove_prefix(syntax.open.size());
    const size_t between = text.find(syntax.between);
    REQUIRE(between != std::string_view::npos);
    const std::string name(text.substr(0, between));
    const auto tool = std::find_if(spec.tools().begin(), spec.tools().end(),
                                   [&](const ToolCallTool& t) { return t.name == name; });
    REQUIRE(tool != spec.tools().end());
    text.remove_prefix(between + syntax.between.size());
    std::optional<json> arguments;
    size_t end = 0;
    for (end = text.find(syntax.close); end != std::string_view::npos;
         end = text.find(syntax.close, end + 1)) {
      arguments = json::parse(text.substr(0, end), nullptr, /*allow_exceptions=*/false);
      if (!arguments->is_discarded()) break;
    }
    REQUIRE(end != std::string_view::npos);
    calls.emplace_back(&*tool, *arguments);
    text.remove_prefix(end + syntax.close.size());
    if (text.empty()) return calls;
    REQUIRE(syntax.separator.has_value());
    REQUIRE(text.starts_with(*syntax.separator));
    text.remove_prefix(syntax.separator->size());
  }
}

TEST_CASE(
    "Every prefix the tool call grammar takes can be completed, and what it completes "
    "are calls of the tools with arguments their schemas take",
    "[grammar][tool_calls]") {
  // Random walks over the printable bytes, choosing among those taken: a walk never finds a
  // state that takes none of them before it may end.
  std::mt19937_64 rng(11);
  std::string alphabet = "\n\t";
  for (int c = 0x20; c < 0x7F; ++c) alphabet += static_cast<char>(c);
  int ended = 0;
  int many_calls = 0;
  for (const ToolCallSyntax& syntax : {Hermes(), Llama()}) {
    const int32_t max_calls = syntax.separator.has_value() ? 3 : 1;
    const auto spec = Spec(syntax, RandomTestTools(), max_calls);
    for (int walk = 0; walk < 150; ++walk) {
      ToolCallGrammar grammar(spec.get());
      std::string written;
      bool end = false;
      size_t call_start = 0;  // where the call being written starts
      for (int step = 0; step < 1500 && !end; ++step) {
        std::vector<char> taken;
        for (const char c : alphabet) {
          ToolCallGrammar next = grammar;
          if (next.Feed(static_cast<unsigned char>(c))) taken.push_back(c);
        }
        INFO(written);
        REQUIRE((!taken.empty() || grammar.can_end()));
        // The end where it may come, sometimes; closing bytes more often as a call goes on,
        // so that values end.
        if (taken.empty() || (grammar.can_end() && std::bernoulli_distribution(0.4)(rng))) {
          end = true;
          break;
        }
        char next = taken[std::uniform_int_distribution<size_t>(0, taken.size() - 1)(rng)];
        const size_t since_call = written.size() - call_start;
        for (const char close : {'}', ']', '"'}) {
          if (std::find(taken.begin(), taken.end(), close) != taken.end() &&
              std::bernoulli_distribution(std::min(0.9, static_cast<double>(since_call) / 150))(
                  rng)) {
            next = close;
          }
        }
        const int32_t calls = grammar.calls();
        REQUIRE(grammar.Feed(static_cast<unsigned char>(next)));
        written += next;
        if (grammar.calls() != calls) call_start = written.size();
      }
      if (!end) continue;
      ++ended;
      INFO(written);
      const auto calls = SplitCalls(*spec, written);
      CHECK(static_cast<int32_t>(calls.size()) == grammar.calls());
      many_calls += calls.size() > 1 ? 1 : 0;
      for (const auto& [tool, arguments] : calls) {
        INFO(tool->name << ": " << arguments.dump());
        CHECK(arguments.is_object());
        CHECK(SchemaAccepts(*tool->parameters, tool->parameters->root(), arguments));
      }
    }
  }
  // Most walks end, some with several calls.
  CHECK(ended > 250);
  CHECK(many_calls > 20);
}

// A small vocabulary with pieces across the literals' and the arguments' boundaries, and the
// bytes a call needs one by one (so that every state can go on).
constexpr int32_t kEnd = 2;
std::shared_ptr<const TokenVocabulary> ToolVocabulary() {
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt, ""};
  for (const char* piece : {"<tool_call>",
                            "<tool_call>\n",
                            "tool",
                            "_call",
                            "{\"name\": \"",
                            "{\"name\":",
                            " \"",
                            "get",
                            "_weather",
                            "get_weather",
                            "get_",
                            "\", \"arguments\": ",
                            "\", \"parameters\": ",
                            "\", \"arguments\": {",
                            "\",",
                            "\"city\"",
                            "city",
                            ": ",
                            "\"Paris\"",
                            "Paris",
                            "}}",
                            "}\n</tool_call>",
                            "\n</tool_call>",
                            "</tool_call>",
                            "}\n",
                            "\n<tool_call>",
                            "days",
                            "\"days\": ",
                            "12",
                            "\\n",
                            "}}\n</tool_call>\n",
                            "book",
                            "-2",
                            "\xC3\xA9"}) {
    tokens.emplace_back(piece);
  }
  for (const char byte : std::string_view("\n {}\":,<>/_-0123Pabcdefghijklmnopqrstuvwxyz")) {
    tokens.emplace_back(std::string(1, byte));
  }
  return std::make_shared<const TokenVocabulary>(std::move(tokens));
}

std::vector<int32_t> Ids(const std::vector<uint8_t>& mask) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] != 0) ids.push_back(static_cast<int32_t>(i));
  }
  return ids;
}

TEST_CASE(
    "A tool call constraint's masks are each token fed on its own, and once the calls "
    "are complete only the end",
    "[grammar][tool_calls]") {
  const auto vocabulary = ToolVocabulary();
  const auto id = [&](std::string_view piece) {
    for (int32_t i = 0; i < vocabulary->size(); ++i) {
      if (vocabulary->bytes(i) != nullptr && *vocabulary->bytes(i) == piece) return i;
    }
    FAIL("no piece " << piece);
    return -1;
  };
  std::mt19937_64 rng(13);
  for (const ToolCallSyntax& syntax : {Hermes(), Llama()}) {
    const int32_t max_calls = syntax.separator.has_value() ? 2 : 1;
    const auto spec = Spec(syntax, WeatherTools(), max_calls);
    auto constraint = MakeToolCallConstraint(vocabulary, {kEnd}, spec);
    int ended = 0;
    for (int walk = 0; walk < 40; ++walk) {
      std::vector<int32_t> pending;
      ToolCallGrammar state(spec.get());
      for (int step = 0; step < 150; ++step) {
        const auto mask = constraint->Allowed(pending);
        std::vector<int32_t> expected;
        for (int32_t i = 0; i < vocabulary->size(); ++i) {
          const std::string* bytes = vocabulary->bytes(i);
          ToolCallGrammar next = state;
          const bool allowed = i == kEnd ? state.can_end()
                                         : !state.complete() && bytes != nullptr &&
                                               !bytes->empty() && next.Feed(*bytes);
          if (allowed) expected.push_back(i);
        }
        if (expected.empty()) expected = {kEnd};
        INFO("after " << pending.size() << " tokens");
        const std::vector<int32_t> got = Ids(*mask);
        REQUIRE(got == expected);
        if (state.complete()) CHECK(got == std::vector<int32_t>{kEnd});
        // Tokens that go on with a call more often, so that walks reach their ends.
        int32_t next = got[std::uniform_int_distribution<size_t>(0, got.size() - 1)(rng)];
        for (const char* piece : {"<tool_call>\n", "{\"name\": \"", "get_weather",
                                  "\", \"arguments\": ", "\", \"parameters\": ", "\"city\"", ": ",
                                  "\"Paris\"", "\"", "}", "}\n</tool_call>"}) {
          if (std::find(got.begin(), got.end(), id(piece)) != got.end() &&
              std::bernoulli_distribution(0.3)(rng)) {
            next = id(piece);
          }
        }
        if (state.can_end() && std::bernoulli_distribution(0.5)(rng)) next = kEnd;
        if (next == kEnd) {
          ended += state.can_end() ? 1 : 0;
          break;
        }
        REQUIRE(state.Feed(*vocabulary->bytes(next)));
        pending.push_back(next);
      }
    }
    CHECK(ended > 30);
  }

  SECTION("Exactly the pieces that continue a call, and the end only after a close") {
    const auto spec = Spec(Hermes(), WeatherTools(), /*max_calls=*/2);
    auto constraint = MakeToolCallConstraint(vocabulary, {kEnd}, spec);
    using Pieces = std::set<std::string>;
    const auto pieces = [&](std::vector<int32_t> pending) {
      Pieces out;
      for (const int32_t i : Ids(*constraint->Allowed(pending))) {
        out.insert(i == kEnd ? "<end>" : *vocabulary->bytes(i));
      }
      return out;
    };
    CHECK(pieces({}) == Pieces{"<", "<tool_call>", "<tool_call>\n"});
    const std::vector<int32_t> name = {id("<tool_call>\n"), id("{\"name\": \"")};
    CHECK(pieces(name) == Pieces{"g", "get", "get_", "get_weather"});
    std::vector<int32_t> call = name;
    call.push_back(id("get"));
    CHECK(pieces(call) ==
          Pieces{"\"", "\", \"arguments\": ", "\", \"arguments\": {", "\",", "_", "_weather"});
    // The arguments {} are complete: the close follows, which begins with '}'.
    call.insert(call.end(), {id("\", \"arguments\": {"), id("}")});
    CHECK(pieces(call) == Pieces{"}", "}\n", "}\n</tool_call>"});
    call.push_back(id("}\n</tool_call>"));
    CHECK(pieces(call) == Pieces{"\n", "\n<tool_call>", "<end>"});
    call.insert(call.end(), {id("\n"), id("<tool_call>\n"), id("{\"name\": \""), id("get"),
                             id("\", \"arguments\": {")});
    // Whitespace inside the arguments, their '}' and the close's; not "}}\n</tool_call>\n",
    // which would write past the second call, the last.
    CHECK(pieces(call) == Pieces{"\n", " ", "}", "}}"});
    call.insert(call.end(), {id("}}"), id("\n</tool_call>")});
    constraint->Commit(call);
    CHECK(constraint->complete());
    CHECK(pieces({}) == Pieces{"<end>"});
  }
}

}  // namespace
}  // namespace tophat
