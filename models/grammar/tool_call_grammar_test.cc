#include "models/grammar/tool_call_grammar.h"

#include <catch2/catch.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "models/grammar/grammar_test_util.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

using nlohmann::json;

// Qwen2.5's (hermes) and Llama 3.1's layouts, as their chat templates give them (recognised
// by the instructions the real templates write).
ToolCallSyntax SyntaxOf(const char* source) {
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::FromSource(source, "test");
  REQUIRE(chat.ok());
  REQUIRE(chat->tool_call_syntax().has_value());
  return *chat->tool_call_syntax();
}
ToolCallSyntax Hermes() {
  return SyntaxOf("<|im_start|>system\n<|im_end|> You may call one or more functions to assist "
                  "with the user query.");
}
ToolCallSyntax Llama() {
  return SyntaxOf("<|start_header_id|><|end_header_id|><|eot_id|> Cutting Knowledge Date "
                  "Given the following functions, please respond");
}

std::shared_ptr<const CompiledSchema> Compiled(const std::string& schema) {
  return testing::CompiledSchemaOf(schema);
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
                                         int32_t max_calls, bool text_first = false) {
  absl::StatusOr<std::shared_ptr<const ToolCallSpec>> spec =
      ToolCallSpec::Create(std::move(syntax), std::move(tools), max_calls, text_first);
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

TEST_CASE("Text first with a start tag: any text, or text and then whole calls from the tag on",
          "[grammar][tool_calls]") {
  const ToolCallSyntax syntax = Hermes();
  const auto spec = Spec(syntax, WeatherTools(), /*max_calls=*/2, /*text_first=*/true);
  REQUIRE(spec->text_first());
  const std::string paris = Call(syntax, "get_weather", R"({"city": "Paris"})");
  const std::string get = Call(syntax, "get", "{}");
  // Text alone may end, a tag's start or an end tag in it included; any byte.
  for (const std::string& text : std::vector<std::string>{
           "", "It is sunny in Paris.", "I would call <tool", "<tool_x", "<<tool_call",
           "a </tool_call> {", std::string("\xFF\x80 \0 \n", 6)}) {
    INFO(text);
    ToolCallGrammar grammar(spec.get());
    REQUIRE(grammar.Feed(text));
    CHECK(grammar.can_end());
    CHECK_FALSE(grammar.complete());
    CHECK_FALSE(grammar.in_string());
    CHECK(grammar.string_room() == 0);
    CHECK(grammar.calls() == 0);
  }
  // The tag, wherever the text writes it, begins a call; a partial tag that does not go on
  // is text, and its last byte may begin the tag anew.
  for (const auto& [text, calls] : {std::pair{paris, 1},
                                    {"Let me look.\n" + paris, 1},
                                    {"<tool_x" + paris, 1},
                                    {"<" + paris, 1},
                                    {"<tool_call" + paris, 1},
                                    {"<tool_" + get, 1},
                                    {"Two: " + paris + "\n" + get, 2}}) {
    INFO(text);
    ToolCallGrammar grammar(spec.get());
    REQUIRE(grammar.Feed(text));
    CHECK(grammar.can_end());
    CHECK(grammar.calls() == calls);
    CHECK(grammar.complete() == (calls == 2));
  }
  // Each refused at the byte the comment names: everything before it is taken.
  const std::string text = "Checking. ";
  const size_t name = text.size() + syntax.open.size();
  const size_t args = name + std::string("get_weather").size() + syntax.between.size();
  const struct {
    std::string text;
    size_t refused_at;
  } bad[] = {
      {text + Call(syntax, "set", "{}"), name},                           // no such tool
      {text + Call(syntax, "get_weather", R"({"city": 3})"), args + 9},   // not a string
      {text + Call(syntax, "get_weather", R"({"days": 3})"), args + 10},  // city is required
      {text + Call(syntax, "get_weather", R"( {"city": "P"})"), args},    // before the arguments
      {"<tool_call> {", 11},  // past the tag only open's rest
      {"<<tool_call>{", 12},  // the tag matched from its second '<'
      {"<tool_x<tool_call>x", 18},
      {paris + " Done.", paris.size()},       // no text after a call
      {paris + "\nDone.", paris.size() + 1},  // after the separator, only a call
      {paris + "\n\n" + get, paris.size() + 1},
      {paris + "\n" + get + "\n", paris.size() + 1 + get.size()},  // max_calls 2
  };
  for (const auto& [text, refused_at] : bad) {
    INFO(text);
    CHECK(Taken(*spec, text) == refused_at);
  }

  // The answer may end in the text and after each call, not inside one.
  const std::string answer = "Hi " + paris + "\n" + get;
  const size_t tag_end = 3 + syntax.start_tag.size();
  ToolCallGrammar grammar(spec.get());
  for (size_t i = 0; i < answer.size(); ++i) {
    INFO("after " << i + 1 << " bytes: " << answer.substr(0, i + 1));
    REQUIRE(grammar.Feed(static_cast<unsigned char>(answer[i])));
    const bool in_text = i + 1 < tag_end;
    const bool after_call = i + 1 == 3 + paris.size() || i + 1 == answer.size();
    CHECK(grammar.can_end() == (in_text || after_call));
    CHECK(grammar.complete() == (i + 1 == answer.size()));
  }
  CHECK_FALSE(Takes(*spec, "Hi <tool_call>"));
}

TEST_CASE("Text first: a self-overlapping start tag is matched wherever the text's tail has it",
          "[grammar][tool_calls]") {
  // "<<t>" after "<" ("<<<t>") and "<a<b>" after "<a" ("<a<a<b>"): a mismatch keeps the
  // tag's part that still matches (a restart from the mismatching byte alone misses both).
  for (const std::string& tag : std::vector<std::string>{"<<t>", "<a<b>"}) {
    const ToolCallSyntax syntax = {.open = tag + "{\"name\": \"",
                                   .between = "\", \"arguments\": ",
                                   .close = "}</t>",
                                   .separator = " ",
                                   .start_tag = tag};
    const auto spec = Spec(syntax, WeatherTools(), /*max_calls=*/2, /*text_first=*/true);
    const std::string call = Call(syntax, "get", "{}");
    for (const std::string& text : {tag.substr(0, 2) + call, tag.substr(0, 3) + call,
                                    "x" + tag.substr(0, 1) + call, call + " " + call}) {
      INFO(text);
      ToolCallGrammar grammar(spec.get());
      REQUIRE(grammar.Feed(text));
      CHECK(grammar.can_end());
      CHECK(grammar.calls() == (text.ends_with(" " + call) ? 2 : 1));
    }
    // Near misses are text.
    for (const std::string& text :
         {tag.substr(0, 2) + "x" + tag.substr(2) + "{", tag.substr(0, tag.size() - 1) + "<{"}) {
      INFO(text);
      ToolCallGrammar grammar(spec.get());
      REQUIRE(grammar.Feed(text));
      CHECK(grammar.can_end());
      CHECK(grammar.calls() == 0);
    }
  }
}

TEST_CASE("Text first without a start tag: '{' past leading whitespace is a call, else text",
          "[grammar][tool_calls]") {
  const ToolCallSyntax syntax = Llama();
  const auto spec = Spec(syntax, WeatherTools(), /*max_calls=*/1, /*text_first=*/true);
  const std::string call = Call(syntax, "get_weather", R"({"city": "Paris"})");
  const std::string spaces(ToolCallGrammar::kMaxLeadingWhitespace, ' ');
  // Text, which may end; a call after text, or after too long a run of whitespace, is text.
  for (const std::string& text :
       std::vector<std::string>{"", " \n\t\r", "The weather is fine.", "Here: " + call, "x{",
                                spaces + " " + call, spaces + "\n{"}) {
    INFO(text);
    ToolCallGrammar grammar(spec.get());
    REQUIRE(grammar.Feed(text));
    CHECK(grammar.can_end());
    CHECK_FALSE(grammar.complete());
    CHECK(grammar.calls() == 0);
  }
  for (const std::string& text : {call, " \n" + call, spaces + call}) {
    INFO(text);
    ToolCallGrammar grammar(spec.get());
    REQUIRE(grammar.Feed(text));
    CHECK(grammar.complete());
    CHECK(grammar.calls() == 1);
  }
  const size_t name = syntax.open.size();
  const size_t args = name + std::string("get").size() + syntax.between.size();
  const struct {
    std::string text;
    size_t refused_at;
  } bad[] = {
      {"\n{x", 2},                                          // '{' began a call
      {" " + Call(syntax, "set", "{}"), 1 + name},          // no such tool
      {Call(syntax, "get", "[]"), args},                    // arguments are an object
      {Call(syntax, "get", R"({"city": "P"})"), args + 1},  // get takes no properties
      {call + " ", call.size()},                            // nothing after the call
      {call + "Done.", call.size()},
  };
  for (const auto& [text, refused_at] : bad) {
    INFO(text);
    CHECK(Taken(*spec, text) == refused_at);
  }
  CHECK_FALSE(Takes(*spec, "  {"));
  // Free text is one state, however it began.
  ToolCallGrammar a(spec.get());
  ToolCallGrammar b(spec.get());
  REQUIRE(a.Feed("  Sunny, {\"name\": \"x\"}"));
  REQUIRE(b.Feed(spaces + " "));
  CHECK(a == b);
  CHECK(absl::Hash<ToolCallGrammar>{}(a) == absl::Hash<ToolCallGrammar>{}(b));
}

TEST_CASE("Text first: equal places in the text are equal states", "[grammar][tool_calls]") {
  const auto spec = Spec(Hermes(), WeatherTools(), /*max_calls=*/2, /*text_first=*/true);
  const auto state = [&](std::string_view text) {
    ToolCallGrammar grammar(spec.get());
    REQUIRE(grammar.Feed(text));
    return grammar;
  };
  for (const auto& [one, other] : {std::pair{"", "Some text."},
                                   {"<tool", "Hi <tool_x <tool"},
                                   {"<", "<<"},
                                   {"<tool_call>\n", "a<tool_call>\n"}}) {
    INFO(one << " | " << other);
    CHECK(state(one) == state(other));
    CHECK(absl::Hash<ToolCallGrammar>{}(state(one)) == absl::Hash<ToolCallGrammar>{}(state(other)));
  }
  CHECK_FALSE(state("<tool") == state("<too"));
  CHECK_FALSE(state("") == state("<"));
}

std::string Refusal(ToolCallSyntax syntax, std::vector<ToolCallTool> tools, int32_t max_calls,
                    bool text_first = false) {
  absl::StatusOr<std::shared_ptr<const ToolCallSpec>> spec =
      ToolCallSpec::Create(std::move(syntax), std::move(tools), max_calls, text_first);
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

  // Text first: a call begins where the text writes start_tag, so open must begin with it;
  // without one, leading whitespace is the text's, so open may not begin with any. Each
  // syntax is fine for calls alone.
  ToolCallSyntax other_tag = Hermes();
  other_tag.start_tag = "<call>";
  ToolCallSyntax spaced = Llama();
  spaced.open = "\n" + spaced.open;
  for (const auto& [syntax, refusal] :
       {std::pair{other_tag, R"(does not start with start_tag "<call>")"},
        {spaced, "starts with whitespace"}}) {
    CHECK_THAT(Refusal(syntax, tools({"a"}), 1, /*text_first=*/true),
               Catch::Contains("syntax: open \"") && Catch::Contains(refusal) &&
                   Catch::Contains("\\n{"));  // open's newline escaped
    const auto calls_only = ToolCallSpec::Create(syntax, tools({"a"}), 1);
    REQUIRE(calls_only.ok());
    CHECK_FALSE((*calls_only)->text_first());
  }
  CHECK_THAT(Refusal({.between = "\"", .close = "}"}, tools({"a"}), 1, /*text_first=*/true),
             Catch::Contains("syntax: open is empty"));
  for (const ToolCallSyntax& syntax : {Hermes(), Llama()}) {
    const auto text_first = ToolCallSpec::Create(syntax, tools({"a"}), 1, /*text_first=*/true);
    REQUIRE(text_first.ok());
    CHECK((*text_first)->text_first());
  }
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

// Where the calls begin in an answer a text-first grammar took (text.size(): none), as the
// grammar decides it: at the first start_tag, or without one at a first open[0] past at most
// kMaxLeadingWhitespace whitespace bytes.
size_t CallsStart(const ToolCallSyntax& syntax, std::string_view text) {
  if (!syntax.start_tag.empty()) return std::min(text.find(syntax.start_tag), text.size());
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || first > ToolCallGrammar::kMaxLeadingWhitespace ||
      text[first] != syntax.open[0]) {
    return text.size();
  }
  return first;
}

TEST_CASE(
    "Every prefix the tool call grammar takes can be completed, and what it completes "
    "are calls of the tools with arguments their schemas take, after text with text first",
    "[grammar][tool_calls]") {
  // Random walks over the printable bytes, choosing among those taken: a walk never finds a
  // state that takes none of them before it may end.
  std::string alphabet = "\n\t";
  for (int c = 0x20; c < 0x7F; ++c) alphabet += static_cast<char>(c);
  for (const bool text_first : {false, true}) {
    INFO("text first: " << text_first);
    std::mt19937_64 rng(11);
    int ended = 0;
    int many_calls = 0;
    int text_only = 0;
    int text_then_calls = 0;
    for (const ToolCallSyntax& syntax : {Hermes(), Llama()}) {
      const int32_t max_calls = syntax.separator.has_value() ? 3 : 1;
      const auto spec = Spec(syntax, RandomTestTools(), max_calls, text_first);
      std::vector<std::string> names;
      for (const ToolCallTool& tool : spec->tools()) names.push_back(tool.name);
      // What begins a call in text: its tag, or open's first byte.
      const std::string_view lead =
          syntax.start_tag.empty() ? std::string_view(syntax.open).substr(0, 1) : syntax.start_tag;
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
          // In text (no call yet, and the answer may end) it ends seldom, so that text gets
          // long; elsewhere the end where it may come, sometimes.
          const bool in_text = grammar.calls() == 0 && grammar.can_end();
          if (taken.empty() ||
              (grammar.can_end() && std::bernoulli_distribution(in_text ? 0.02 : 0.4)(rng))) {
            end = true;
            break;
          }
          char next = taken[std::uniform_int_distribution<size_t>(0, taken.size() - 1)(rng)];
          if (in_text) {
            // The next byte of what begins a call, often once it is begun.
            size_t matched = std::min(lead.size() - 1, written.size());
            while (matched > 0 && !written.ends_with(lead.substr(0, matched))) --matched;
            const double p = matched > 0 ? 0.9 : written.empty() ? 0.3 : 0.05;
            if (std::bernoulli_distribution(p)(rng)) next = lead[matched];
          } else {
            // Closing bytes more often as a call goes on, so that values end.
            const size_t since_call = written.size() - call_start;
            for (const char close : {'}', ']', '"'}) {
              if (std::find(taken.begin(), taken.end(), close) != taken.end() &&
                  std::bernoulli_distribution(std::min(0.9, static_cast<double>(since_call) / 150))(
                      rng)) {
                next = close;
              }
            }
          }
          const int32_t calls = grammar.calls();
          const bool was_in_text = in_text;
          REQUIRE(grammar.Feed(static_cast<unsigned char>(next)));
          written += next;
          if (grammar.calls() != calls || (was_in_text && !grammar.can_end())) {
            call_start = written.size();
          }
        }
        if (!end) continue;
        ++ended;
        INFO(written);
        // Split by the syntax, and read as the server reads a free answer.
        const size_t calls_start = text_first ? CallsStart(syntax, written) : 0;
        const ToolCallReading reading = ReadToolCalls(written, syntax, names);
        if (calls_start == written.size()) {
          ++text_only;
          CHECK(grammar.calls() == 0);
          CHECK(reading.calls.empty());
          CHECK(reading.content == written);
          continue;
        }
        const auto calls = SplitCalls(*spec, std::string_view(written).substr(calls_start));
        CHECK(static_cast<int32_t>(calls.size()) == grammar.calls());
        many_calls += calls.size() > 1 ? 1 : 0;
        text_then_calls += written.find_first_not_of(" \t\r\n") < calls_start ? 1 : 0;
        REQUIRE(reading.calls.size() == calls.size());
        for (size_t i = 0; i < calls.size(); ++i) {
          const auto& [tool, arguments] = calls[i];
          INFO(tool->name << ": " << arguments.dump());
          CHECK(arguments.is_object());
          CHECK(SchemaAccepts(*tool->parameters, tool->parameters->root(), arguments));
          CHECK(reading.calls[i].name == tool->name);
          CHECK(json::parse(reading.calls[i].arguments) == arguments);
        }
      }
    }
    // Most walks end, some with several calls; with text first, some as text alone and
    // some as text and then calls.
    CHECK(ended > 250);
    CHECK(many_calls > 20);
    if (text_first) {
      CHECK(text_only > 30);
      CHECK(text_then_calls > 20);
    } else {
      CHECK(text_only == 0);
      CHECK(text_then_calls == 0);
    }
  }
}

// A small vocabulary with pieces across the literals' and the arguments' boundaries, and the
// bytes a call needs one by one (so that every state can go on).
constexpr int32_t kEnd = 2;
std::shared_ptr<const TokenVocabulary> ToolVocabulary() {
  return testing::PieceVocabulary({"<tool_call>",
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
                                   "\xC3\xA9"},
                                  "\n {}\":,<>/_-0123Pabcdefghijklmnopqrstuvwxyz");
}

TEST_CASE(
    "A tool call constraint's masks are each token fed on its own, and once the calls "
    "are complete only the end; with text first, any token in the text",
    "[grammar][tool_calls]") {
  const auto vocabulary = ToolVocabulary();
  const auto id = [&](std::string_view piece) { return testing::PieceId(*vocabulary, piece); };
  std::mt19937_64 rng(13);
  for (const auto& [syntax, text_first] :
       {std::pair{Hermes(), false}, {Llama(), false}, {Hermes(), true}, {Llama(), true}}) {
    INFO("text first: " << text_first << ", start_tag " << syntax.start_tag);
    const int32_t max_calls = syntax.separator.has_value() ? 2 : 1;
    const auto spec = Spec(syntax, WeatherTools(), max_calls, text_first);
    auto constraint = MakeToolCallConstraint(vocabulary, {kEnd}, spec);
    int ended = 0;
    int ended_in_text = 0;
    for (int walk = 0; walk < 40; ++walk) {
      std::vector<int32_t> pending;
      ToolCallGrammar state(spec.get());
      for (int step = 0; step < 150; ++step) {
        const auto mask = constraint->Allowed(pending);
        const std::vector<int32_t> expected = testing::TokensTaken(state, *vocabulary, kEnd);
        INFO("after " << pending.size() << " tokens");
        const std::vector<int32_t> got = testing::Ids(*mask);
        REQUIRE(got == expected);
        if (state.complete()) CHECK(got == std::vector<int32_t>{kEnd});
        // Tokens that go on with a call more often, so that walks reach their ends.
        int32_t next = got[std::uniform_int_distribution<size_t>(0, got.size() - 1)(rng)];
        if (state.calls() == 0 && state.can_end()) {
          // In text, where every piece goes on: a call's start, sometimes (more often first:
          // without a start_tag only the first piece may begin a call).
          if (std::bernoulli_distribution(pending.empty() ? 0.4 : 0.15)(rng)) {
            next = id(syntax.start_tag.empty() ? "{\"name\": \"" : "<tool_call>\n");
          }
        } else {
          for (const char* piece : {"<tool_call>\n", "{\"name\": \"", "get_weather",
                                    "\", \"arguments\": ", "\", \"parameters\": ", "\"city\"", ": ",
                                    "\"Paris\"", "\"", "}", "}\n</tool_call>"}) {
            if (std::find(got.begin(), got.end(), id(piece)) != got.end() &&
                std::bernoulli_distribution(0.3)(rng)) {
              next = id(piece);
            }
          }
        }
        // In text, the end less often, so that calls begin.
        if (state.can_end() && std::bernoulli_distribution(state.calls() == 0 ? 0.15 : 0.5)(rng)) {
          next = kEnd;
        }
        if (next == kEnd) {
          ended += state.can_end() ? 1 : 0;
          ended_in_text += state.can_end() && state.calls() == 0 ? 1 : 0;
          break;
        }
        REQUIRE(state.Feed(*vocabulary->bytes(next)));
        pending.push_back(next);
      }
    }
    CHECK(ended > 30);
    if (text_first) {
      CHECK(ended_in_text > 5);
      CHECK(ended - ended_in_text > 5);
    } else {
      CHECK(ended_in_text == 0);
    }
  }

  SECTION("Exactly the pieces that continue a call, and the end only after a close") {
    const auto spec = Spec(Hermes(), WeatherTools(), /*max_calls=*/2);
    auto constraint = MakeToolCallConstraint(vocabulary, {kEnd}, spec);
    using Pieces = std::set<std::string>;
    const auto pieces = [&](std::vector<int32_t> pending) {
      Pieces out;
      for (const int32_t i : testing::Ids(*constraint->Allowed(pending))) {
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

  SECTION("With text first, every piece in the text, and each text state's mask computed once") {
    const auto spec = Spec(Hermes(), WeatherTools(), /*max_calls=*/2, /*text_first=*/true);
    ToolCallConstraint constraint(vocabulary, {kEnd}, ToolCallGrammar(spec.get()), spec);
    using Pieces = std::set<std::string>;
    const auto pieces = [&](std::vector<int32_t> pending) {
      Pieces out;
      for (const int32_t i : testing::Ids(*constraint.Allowed(pending))) {
        out.insert(i == kEnd ? "<end>" : *vocabulary->bytes(i));
      }
      return out;
    };
    Pieces every = {"<end>"};
    for (int32_t i = 0; i < vocabulary->size(); ++i) {
      if (vocabulary->bytes(i) != nullptr && !vocabulary->bytes(i)->empty()) {
        every.insert(*vocabulary->bytes(i));
      }
    }
    CHECK(pieces({}) == every);
    CHECK(pieces({id("<"), id("tool")}) == every);  // a partial tag is text
    // The tag commits the answer to a call.
    CHECK(pieces({id("<tool_call>")}) == Pieces{"\n"});
    CHECK(pieces({id("a"), id("<tool_call>\n")}) == Pieces{"{", "{\"name\": \"", "{\"name\":"});
    // Text that does not begin the tag is one state, whatever it says: one mask.
    const int64_t computed = constraint.masks_computed();
    for (const char* piece : {"Paris", " ", "city", "12", "}}", "\n", "get_weather", ">", "/"}) {
      constraint.Commit(std::vector<int32_t>{id(piece)});
      CHECK(pieces({}) == every);
    }
    CHECK(constraint.masks_computed() == computed);
  }
}

}  // namespace
}  // namespace tophat
