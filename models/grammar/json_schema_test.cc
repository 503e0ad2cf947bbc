#include "models/grammar/json_schema.h"

#include <catch2/catch.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/grammar/grammar_test_util.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/schema_grammar.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

using nlohmann::json;
// Random values keep their properties in the order written (a discriminator first).
using ojson = nlohmann::ordered_json;

std::shared_ptr<const CompiledSchema> Compiled(const std::string& schema) {
  return testing::CompiledSchemaOf(schema);
}

std::string Refusal(const std::string& schema) {
  absl::StatusOr<std::shared_ptr<const CompiledSchema>> compiled =
      CompiledSchema::Compile(json::parse(schema));
  INFO(schema);
  REQUIRE_FALSE(compiled.ok());
  CHECK(compiled.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(compiled.status().message());
}

// Whether the grammar takes every byte of `text` and may end after it.
bool Takes(const CompiledSchema& schema, const std::string& text) {
  SchemaGrammar grammar(&schema);
  return grammar.Feed(text) && grammar.can_end();
}

// The grammar takes each of `taken` whole and may end after it, and none of `refused`.
void CheckTexts(const CompiledSchema& schema, std::initializer_list<const char*> taken,
                std::initializer_list<const char*> refused) {
  for (const char* text : taken) {
    INFO(text);
    CHECK(Takes(schema, text));
  }
  for (const char* text : refused) {
    INFO(text);
    CHECK_FALSE(Takes(schema, text));
  }
}

// A person: what Pydantic writes for a model with a nested, optional copy of itself.
constexpr char kPerson[] = R"({
  "$defs": {"Person": {
    "type": "object",
    "title": "Person",
    "properties": {
      "name": {"type": "string", "description": "the given name"},
      "age": {"type": "integer"},
      "height": {"type": "number"},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
      "kind": {"enum": ["adult", "child", 7, null]},
      "spouse": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]},
      "born": {"type": "string", "format": "date-time"}
    },
    "required": ["name", "age"],
    "additionalProperties": false
  }},
  "$ref": "#/$defs/Person"
})";

TEST_CASE("A JSON Schema's values are taken byte by byte and nothing else is", "[grammar]") {
  const auto person = Compiled(kPerson);
  for (const char* good : {
           R"({"name":"Ann","age":31})",
           R"({"age":31,"name":"Ann"})",
           "{\n  \"name\": \"Ann\",\n  \"age\": -3,\n  \"height\": 1.75e0\n}",
           R"( {"name":"\u00e9\"x","age":0,"tags":[],"kind":"child","born":"2024-01-01T09:30:00Z"})",
           R"({"name":"A","age":1,"tags":["a","b"],"kind":7,"spouse":null})",
           R"({"name":"A","age":1,"kind":null,"spouse":{"name":"B","age":2,"spouse":null}})",
       }) {
    INFO(good);
    CHECK(Takes(*person, good));
    CHECK(SchemaAccepts(*person, person->root(), json::parse(good)));
  }
  for (const char* bad : {
           R"({"name":"Ann"})",                           // age is required
           R"({"name":"Ann","age":31,"x":1})",            // no undeclared properties
           R"({"name":"Ann","age":31.5})",                // an integer
           R"({"name":"Ann","age":"31"})",                // not a string
           R"({"name":"Ann","age":31,"name":"Bo"})",      // a property twice
           R"({"name":"A","age":1,"tags":["a","b","c"]})",  // maxItems
           R"({"name":"A","age":1,"kind":"teen"})",       // not in the enum
           R"({"name":"A","age":1,"kind":7.0})",          // written otherwise than the enum
           R"({"name":"A","age":1,"spouse":{"name":"B"}})",  // the nested one's age
           R"({"name":"A","age":1} )",                    // nothing after the value
           R"(["name"])",
       }) {
    INFO(bad);
    CHECK_FALSE(Takes(*person, bad));
  }
  // Every prefix of a value is taken, and the value is complete only at its end.
  const std::string value = R"({"name":"A","age":12,"spouse":{"name":"B","age":2},"kind":"adult"})";
  SchemaGrammar grammar(person.get());
  for (size_t i = 0; i < value.size(); ++i) {
    INFO("at " << i);
    CHECK_FALSE(grammar.complete());
    REQUIRE(grammar.Feed(static_cast<unsigned char>(value[i])));
  }
  CHECK(grammar.complete());
}

TEST_CASE("A schema's top-level value may be a scalar, and a number may end or go on", "[grammar]") {
  const auto integer = Compiled(R"({"type": "integer"})");
  CHECK(Takes(*integer, "12"));
  CHECK(Takes(*integer, "-0"));
  CHECK_FALSE(Takes(*integer, "1.5"));
  CHECK_FALSE(Takes(*integer, "1e3"));
  CHECK_FALSE(Takes(*integer, "01"));
  SchemaGrammar twelve(integer.get());
  REQUIRE(twelve.Feed("1"));
  CHECK(twelve.can_end());
  CHECK_FALSE(twelve.complete());  // a digit may follow
  REQUIRE(twelve.Feed("2"));
  CHECK(twelve.can_end());

  const auto numbers = Compiled(R"({"enum": [1, 12, "x", true, 12, "x"]})");
  CHECK(numbers->node(numbers->root()).enum_texts.size() == 4);  // each value once
  CHECK(Takes(*numbers, "1"));
  CHECK(Takes(*numbers, "12"));
  CHECK(Takes(*numbers, "\"x\""));
  CHECK(Takes(*numbers, "true"));
  CHECK_FALSE(Takes(*numbers, "123"));
  CHECK_FALSE(Takes(*numbers, "2"));
  SchemaGrammar x(numbers.get());
  REQUIRE(x.Feed("\"x\""));
  CHECK(x.complete());  // a string has its own end

  // Nullable, and free values where the schema says nothing.
  const auto nullable = Compiled(R"({"type": ["string", "null"]})");
  CHECK(Takes(*nullable, "null"));
  CHECK(Takes(*nullable, "\"\""));
  CHECK_FALSE(Takes(*nullable, "0"));
  const auto free = Compiled(R"({"type": "object", "properties": {"a": {"type": "boolean"}}})");
  CHECK(Takes(*free, R"({"z":[1,{"y":null}],"a":false,"b":"\ud83c\udfa9"})"));
  CHECK_FALSE(Takes(*free, R"({"a":1})"));
  CHECK(Takes(*Compiled("true"), R"([1, "two", {"three": 3.0}])"));
}

TEST_CASE("A string's length in characters and an integer's bounds are held to", "[grammar]") {
  const auto name = Compiled(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  CHECK_FALSE(Takes(*name, R"("a")"));
  CHECK(Takes(*name, R"("ab")"));
  // Characters, not bytes: an escape, two- and four-byte characters and a surrogate pair
  // are one each.
  CHECK(Takes(*name, "\"\xC3\xA9\xF0\x9F\x8E\xA9\\n\""));
  CHECK(Takes(*name, R"("\ud83c\udfa9\u00e9")"));
  CHECK_FALSE(Takes(*name, R"("abcd")"));
  CHECK_FALSE(Takes(*name, R"("ab\u00e9\n")"));
  SchemaGrammar three(name.get());
  REQUIRE(three.Feed("\"ab"));
  CHECK(three.in_string());
  CHECK(three.string_room() == 1);
  REQUIRE(three.Feed("c"));
  CHECK(three.string_room() == 0);
  CHECK_FALSE(SchemaGrammar(three).Feed("d"));
  CHECK_FALSE(SchemaGrammar(three).Feed("\\"));
  CHECK(SchemaGrammar(three).Feed("\""));
  // Without a maxLength the count stops at minLength: longer strings are one state.
  const auto long_enough = Compiled(R"({"type": "string", "minLength": 1})");
  SchemaGrammar one(long_enough.get()), two(long_enough.get());
  REQUIRE(one.Feed("\"a"));
  REQUIRE(two.Feed("\"ab"));
  CHECK(one == two);
  CHECK_FALSE(Takes(*long_enough, R"("")"));
  CHECK(Compiled(R"({"type": "string", "maxLength": 0})") != nullptr);
  CHECK(Takes(*Compiled(R"({"type": "string", "maxLength": 0})"), R"("")"));

  const auto rating = Compiled(R"({"type": "integer", "minimum": 1, "maximum": 5})");
  CheckTexts(*rating, {"1", "3", "5"},
             {"0", "6", "-1", "10", "-0", "15"});
  SchemaGrammar digit(rating.get());
  CHECK_FALSE(SchemaGrammar(digit).Feed("-"));  // no negative rating
  CHECK_FALSE(SchemaGrammar(digit).Feed("0"));  // nor 0, and 0 takes no digit after it
  REQUIRE(digit.Feed("4"));
  CHECK(digit.can_end());
  CHECK_FALSE(SchemaGrammar(digit).Feed("0"));  // 40 is too large, and so is all that follows

  // Exclusive bounds, negative ranges, and numbers of many digits.
  const auto range = Compiled(R"({"type": "integer", "exclusiveMinimum": -120.5,
                                  "exclusiveMaximum": -99})");
  CheckTexts(*range, {"-100", "-120", "-115"},
             {"-99", "-121", "-1", "-12", "100", "-1000"});
  SchemaGrammar minus(range.get());
  REQUIRE(minus.Feed("-1"));
  CHECK_FALSE(minus.can_end());  // -1 is not in range, but -1xx is
  CHECK_FALSE(SchemaGrammar(minus).Feed("3"));  // -13x: none in range
  const auto large = Compiled(R"({"type": "integer", "minimum": 9223372036854775800})");
  CHECK(Takes(*large, "9223372036854775807"));
  CHECK(Takes(*large, "92233720368547758070"));  // no maximum: larger is fine
  CHECK_FALSE(Takes(*large, "9223372036854775799"));
  const auto wide = Compiled(R"({"type": "integer", "minimum": -9223372036854775808,
                                 "maximum": 9223372036854775807})");
  CHECK(Takes(*wide, "-9223372036854775808"));
  CHECK_FALSE(Takes(*wide, "-9223372036854775809"));
  CHECK_FALSE(Takes(*wide, "9223372036854775808"));
  CHECK_FALSE(SchemaGrammar(wide.get()).Feed("99999999999999999999"));
  // In an object, the value ends at the ',' or '}' only within bounds.
  const auto object = Compiled(R"({"type": "object", "properties": {
      "n": {"type": ["integer", "null"], "maximum": 7}}, "additionalProperties": false})");
  CHECK(Takes(*object, R"({"n": 7})"));
  CHECK(Takes(*object, R"({"n": null})"));
  CHECK_FALSE(Takes(*object, R"({"n": 8})"));
  CHECK(SchemaAccepts(*object, object->root(), json::parse(R"({"n": -70})")));
  CHECK_FALSE(SchemaAccepts(*object, object->root(), json::parse(R"({"n": 8})")));
  CHECK_FALSE(SchemaAccepts(*object, object->root(), json::parse(R"({"n": 8e0})")));
  CHECK_FALSE(SchemaAccepts(*name, name->root(), json("\xF0\x9F\x8E\xA9")));
  CHECK(SchemaAccepts(*name, name->root(), json("\xF0\x9F\x8E\xA9\xC3\xA9")));
}

TEST_CASE("A number's bounds are held to, its digits compared with theirs place by place",
          "[grammar]") {
  const auto unit = Compiled(R"({"type": "number", "minimum": 0, "maximum": 1})");
  CheckTexts(*unit, {"0", "1", "0.5", "0.999", "1.0", "1.000", "-0", "-0.0", "0.0001"},
             {"2", "1.01", "1.0001", "-0.5", "10", "-1", "0.5e0", "1e-3"});
  SchemaGrammar one(unit.get());
  REQUIRE(one.Feed("1"));
  CHECK_FALSE(SchemaGrammar(one).Feed("0"));  // 10 and past
  REQUIRE(one.Feed(".0"));
  CHECK_FALSE(SchemaGrammar(one).Feed("1"));  // 1.01
  CHECK(one.can_end());

  // Exclusive bounds are the next double inside: 0.1 is out, the shortest decimal of the
  // double after it is in, and so is every decimal past that.
  const auto open = Compiled(R"({"type": "number", "exclusiveMinimum": 0.1,
                                 "exclusiveMaximum": 2.5})");
  CheckTexts(*open, {"0.10000000000000002", "0.2", "1", "2.4999", "0.100000000000001"},
             {"0.1", "0.10000000000000001", "2.5", "0", "3", "-1", "0.09"});
  // Negative ranges: the magnitude's bounds swap.
  const auto cold = Compiled(R"({"type": "number", "minimum": -273.15, "maximum": -40.5})");
  CheckTexts(*cold, {"-273.15", "-100", "-40.5", "-41", "-273.149"},
             {"-273.151", "-40.4", "-40", "0", "-0", "-1000", "-4", "5"});
  SchemaGrammar minus(cold.get());
  CHECK_FALSE(SchemaGrammar(minus).Feed("1"));  // no positive number
  REQUIRE(minus.Feed("-4"));
  CHECK_FALSE(minus.can_end());  // -4 is above -40.5, but -4x is not
  REQUIRE(minus.Feed("1"));
  CHECK(minus.can_end());
  // A first digit below the low bound's reaches it only with more digits than the high
  // bound has.
  const auto hundreds = Compiled(R"({"type": "number", "minimum": 500, "maximum": 700.5})");
  for (const char* refused : {"4", "8", "0", "-"}) {
    INFO(refused);
    CHECK_FALSE(SchemaGrammar(hundreds.get()).Feed(refused));
  }
  CHECK(Takes(*hundreds, "500"));
  CHECK(Takes(*hundreds, "699.99"));
  CHECK(Takes(*hundreds, "700.5"));
  CHECK_FALSE(Takes(*hundreds, "700.51"));
  CHECK_FALSE(Takes(*hundreds, "70"));
  CHECK_FALSE(SchemaGrammar(hundreds.get()).Feed("71"));
  // Large and small bounds, a lower bound only, a leading 0 that cannot reach it.
  const auto big = Compiled(R"({"type": "number", "exclusiveMinimum": 1e20})");
  CHECK(Takes(*big, "100000000000000030000"));
  CHECK_FALSE(Takes(*big, "100000000000000000000"));
  CHECK_FALSE(SchemaGrammar(big.get()).Feed("0"));
  CHECK(Takes(*big, "1000000000000000000000.5"));
  const auto small = Compiled(R"({"type": ["number", "null"], "minimum": 0.00025,
                                   "maximum": 0.0003})");
  CHECK(Takes(*small, "0.00025"));
  CHECK(Takes(*small, "0.0003"));
  CHECK(Takes(*small, "null"));
  CHECK_FALSE(Takes(*small, "0.00024999"));
  CHECK_FALSE(Takes(*small, "0.00031"));
  CHECK_FALSE(SchemaGrammar(small.get()).Feed("0.001"));
  // What a parser reads as the bound's double is within it.
  CHECK(SchemaAccepts(*open, open->root(), json(0.2)));
  CHECK_FALSE(SchemaAccepts(*open, open->root(), json(0.1)));
  CHECK_FALSE(SchemaAccepts(*cold, cold->root(), json(-40)));
}

TEST_CASE("Keys are spelled as JSON writes them, so that one cannot alias another", "[grammar]") {
  const auto object = Compiled(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                   "required": ["a"], "additionalProperties": {"type": "string"}})");
  // "\u0061" is "a": after "a" it would be a second "a" holding a string, before it an "a"
  // holding a string; both break the schema, and a parser keeps one of the two.
  CHECK_FALSE(Takes(*object, R"({"a":1,"\u0061":"x"})"));
  CHECK_FALSE(Takes(*object, R"({"\u0061":"x","a":1})"));
  CHECK_FALSE(SchemaAccepts(*object, object->root(), json::parse(R"({"a":1,"\u0061":"x"})")));
  CHECK_FALSE(Takes(*object, R"({"a":1,"\/":"x"})"));
  CHECK_FALSE(Takes(*object, R"({"a":1,"\u00e9":"x"})"));
  CHECK_FALSE(Takes(*object, R"({"a":1,"\u000a":"x"})"));  // \n is how it is written
  CHECK_FALSE(Takes(*object, R"({"a":1,"\u001F":"x"})"));  // lowercase hex
  // The spellings nlohmann::json (and Python's json with ensure_ascii=False) write.
  for (const std::string key : {"\x01", "\n", "\"", "\\", "\x1f", "\xC3\xA9", "/", "\x7f"}) {
    json value = {{"a", 1}, {key, "x"}};
    INFO(value.dump());
    CHECK(Takes(*object, value.dump()));
  }
}

TEST_CASE("An object takes a key only where a property is left to write", "[grammar]") {
  // No undeclared keys and one property: after it, no ',' (nothing could follow it), and a
  // key's bytes only along a name not yet written.
  const auto one = Compiled(
      R"({"type":"object","properties":{"ab":{"type":"null"},"ac":{"type":"null"}},
          "additionalProperties":false})");
  SchemaGrammar grammar(one.get());
  REQUIRE(grammar.Feed(R"({"ab":null,)"));
  SchemaGrammar key = grammar;
  CHECK(key.Feed("\"a"));
  CHECK_FALSE(SchemaGrammar(key).Feed("b"));  // "ab" is written already
  CHECK(SchemaGrammar(key).Feed("c\":null}"));
  REQUIRE(grammar.Feed(R"("ac":null)"));
  CHECK_FALSE(SchemaGrammar(grammar).Feed(","));
  CHECK(SchemaGrammar(grammar).Feed("}"));
  // Where undeclared keys may come, a declared name is not taken twice either.
  const auto open = Compiled(R"({"type":"object","properties":{"ab":{"type":"null"}}})");
  SchemaGrammar again(open.get());
  REQUIRE(again.Feed(R"({"ab":null,"ab)"));
  CHECK_FALSE(SchemaGrammar(again).Feed("\""));
  CHECK(SchemaGrammar(again).Feed("c\":1}"));
}

TEST_CASE("Schemas that cannot be held to are refused, naming their place", "[grammar]") {
  CHECK_THAT(Refusal(R"({"type": "integer", "multipleOf": 0.5})"),
             Catch::StartsWith("at /multipleOf: only a whole number from 1 to 2^53"));
  CHECK_THAT(Refusal(R"({"type": "integer", "multipleOf": 0})"),
             Catch::StartsWith("at /multipleOf: must be greater than 0"));
  CHECK_THAT(Refusal(R"({"type": "integer", "multipleOf": -5})"),
             Catch::StartsWith("at /multipleOf: must be greater than 0"));
  CHECK_THAT(Refusal(R"({"type": "integer", "multipleOf": "5"})"),
             Catch::StartsWith("at /multipleOf: must be a number"));
  CHECK_THAT(Refusal(R"({"type": "integer", "multipleOf": 1e300})"),
             Catch::StartsWith("at /multipleOf: only a whole number from 1 to 2^53"));
  CHECK_THAT(Refusal(R"({"type": "string", "multipleOf": 5})"),
             Catch::StartsWith("at /: \"multipleOf\" on a schema whose type has no number"));
  CHECK_THAT(Refusal(R"({"type": "number", "multipleOf": 5, "maximum": 9.5})"),
             Catch::StartsWith("at /: \"multipleOf\" beside bounds on a \"number\""));
  CHECK_THAT(Refusal(R"({"type": "integer", "multipleOf": 5, "minimum": 6, "maximum": 9})"),
             Catch::StartsWith("at /: no multiple of 5 is at least 6 and at most 9"));
  CHECK_THAT(Refusal(R"({"enum": [5, 10], "multipleOf": 5})"),
             Catch::StartsWith("at /: \"multipleOf\" beside \"enum\" is not supported"));
  CHECK_THAT(Refusal(R"js({"type": "object", "properties": {"id": {"pattern": "(?=x)"}}})js"),
             Catch::StartsWith("at /properties/id/pattern: pattern: a lookaround"));
  CHECK_THAT(Refusal(R"({"type": "string", "pattern": "^a{5}$", "maxLength": 3})"),
             Catch::StartsWith("at /: no string of 0 to 3 characters matches the pattern"));
  CHECK_THAT(Refusal(R"({"type": "string", "format": "uuid", "pattern": "^x"})"),
             Catch::StartsWith("at /: pattern and format together: no string matches both"));
  CHECK_THAT(Refusal(R"({"type": "integer", "pattern": "^1$"})"),
             Catch::Contains("\"pattern\" on a schema whose type has no string"));
  CHECK_THAT(Refusal(R"({"type": "string", "pattern": 5})"),
             Catch::Contains("at /pattern: must be a string"));
  CHECK_THAT(Refusal(R"({"enum": ["a"], "pattern": "a"})"),
             Catch::Contains("\"pattern\" beside \"enum\" is not supported"));
  CHECK_THAT(Refusal(R"({"type":"object","properties":{"a/b":{"type":"number","minimum":1e301}}})"),
             Catch::StartsWith("at /properties/a~1b/minimum: must lie within +-1e300"));
  CHECK_THAT(Refusal(R"({"minimum": 0.5, "exclusiveMaximum": 0.5})"),
             Catch::Contains("no number is at least 0.5 and at most 0.49999"));
  CHECK_THAT(Refusal(R"({"type": "number", "maximum": "7"})"),
             Catch::Contains("at /maximum: must be a number"));
  CHECK_THAT(Refusal(R"({"type": "integer", "minimum": 2.5, "exclusiveMaximum": 3})"),
             Catch::Contains("no integer is at least 3 and at most 2"));
  CHECK(Takes(*Compiled(R"({"type": "integer", "minimum": 3, "exclusiveMaximum": 3.5})"), "3"));
  CHECK_THAT(Refusal(R"({"type": "integer", "minimum": 1e30})"),
             Catch::Contains("at /minimum: must lie within 64-bit integers"));
  CHECK_THAT(Refusal(R"({"type": "integer", "maximum": 18446744073709551615})"),
             Catch::Contains("at /maximum: must lie within 64-bit integers"));
  CHECK_THAT(Refusal(R"({"type": "integer", "exclusiveMinimum": true})"),
             Catch::Contains("at /exclusiveMinimum: must be a number"));
  CHECK_THAT(Refusal(R"({"type": "string", "minLength": 3, "maxLength": 2})"),
             Catch::Contains("minLength 3 > maxLength 2"));
  CHECK_THAT(Refusal(R"({"type": "string", "maxLength": -1})"),
             Catch::Contains("at /maxLength: must be a whole number from 0"));
  CHECK_THAT(Refusal(R"({"type": "integer", "maxLength": 4})"),
             Catch::Contains("\"maxLength\" on a schema whose type has no string"));
  CHECK_THAT(Refusal(R"({"enum": ["a", "bb"], "maxLength": 1})"),
             Catch::Contains("\"maxLength\" beside \"enum\" is not supported"));
  CHECK_THAT(Refusal(R"({"anyOf": [{"type": "object"}, true]})"),
             Catch::StartsWith("at /: a branch takes any value beside other branches"));
  CHECK_THAT(Refusal(R"({"$ref": "#/$defs/Missing"})"),
             Catch::Contains("$ref \"#/$defs/Missing\": no such schema"));
  CHECK_THAT(Refusal(R"({"$ref": "https://example.com/schema"})"),
             Catch::Contains("is not supported"));
  CHECK_THAT(Refusal(R"({"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]})"),
             Catch::Contains("no finite JSON value"));
  CHECK_THAT(Refusal(R"({"type": "object", "required": ["a"]})"),
             Catch::Contains("\"a\" is not one of the declared properties"));
  CHECK_THAT(Refusal(R"({"type": "text"})"), Catch::Contains("is not a JSON Schema type"));
  CHECK_THAT(Refusal("false"), Catch::Contains("admits no value"));
  CHECK_THAT(Refusal(R"({"type": "string", "enum": [1, 2]})"),
             Catch::Contains("at /enum: no value is of the schema's type"));
  CHECK_THAT(Refusal(R"({"allOf": [{"type": "string"}, {"type": "string"}]})"),
             Catch::Contains("more than one"));
  CHECK_THAT(Refusal(R"({"type": "object", "anyOf": [{"type": "object"}]})"),
             Catch::Contains("\"anyOf\" beside \"type\""));
  CHECK_THAT(Refusal(R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
                         "$ref": "#/$defs/A"})"),
             Catch::Contains("refers back to itself"));
  // Counts past what the grammar counts (they were read as negative numbers, and
  // minItems > maxItems went unseen).
  CHECK_THAT(Refusal(R"({"type": "array", "minItems": 18446744073709551615, "maxItems": 3})"),
             Catch::Contains("at /minItems: must be a whole number from 0 to 2147483648"));
  CHECK_THAT(Refusal(R"({"type": "array", "maxItems": 9223372036854775808})"),
             Catch::Contains("at /maxItems: must be a whole number from 0 to 2147483648"));
  // A value too deep to walk recursively (an enum's is copied and written), refused first.
  const std::string deep_const =
      "{\"const\": " + std::string(50000, '[') + std::string(50000, ']') + "}";
  CHECK_THAT(Refusal(deep_const), Catch::Contains("at /: nests arrays and objects more than 256"));
  // Places that add up: a 200 KB name above 100 schemas.
  json long_name = {{"type", "object"}, {"properties", json::object()}};
  json branches = json::array();
  for (int i = 0; i < 100; ++i) branches.push_back({{"type", "array"}});
  long_name["properties"][std::string(200000, 'k')] = {{"anyOf", branches}};
  CHECK_THAT(Refusal(long_name.dump()), Catch::Contains("add up to more than 16 MiB"));
  // Deeper than the stack: a value needing 40 nested arrays.
  json deep = {{"type", "integer"}};
  for (int i = 0; i < 40; ++i) deep = {{"type", "array"}, {"items", deep}, {"minItems", 1}};
  CHECK_THAT(Refusal(deep.dump()),
             Catch::Contains("nests more than the 32 objects and arrays supported"));
}

// A random string a pattern matches, within its node's lengths: a walk along its automaton,
// random for 12 bytes, then along the shortest way to a match (bytes to a match, by a
// backward search) where the lengths allow, ending at a match at times before.
std::string PatternString(const SchemaNode& node, std::mt19937_64& rng) {
  const StringPattern& pattern = *node.pattern;
  const auto reachable = [&](int32_t state, int64_t written) {
    return node.pattern_lengths == nullptr || node.pattern_lengths->Reachable(state, written);
  };
  const int32_t count = pattern.states();
  std::vector<int32_t> distance(static_cast<size_t>(count), INT32_MAX);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = 0; s < count; ++s) {
      int32_t best = pattern.Accepts(s) ? 0 : INT32_MAX;
      for (int b = 0; b < 256; ++b) {
        const int32_t t = pattern.Next(s, static_cast<unsigned char>(b));
        if (t >= 0 && distance[static_cast<size_t>(t)] != INT32_MAX) {
          best = std::min(best, distance[static_cast<size_t>(t)] + 1);
        }
      }
      if (best < distance[static_cast<size_t>(s)]) {
        distance[static_cast<size_t>(s)] = best;
        changed = true;
      }
    }
  }
  std::string text;
  int32_t state = StringPattern::start();
  int64_t written = 0;
  for (int step = 0;; ++step) {
    REQUIRE(step < 5000);
    std::vector<int> bytes;
    std::vector<int> shorter;
    for (int b = 0; b < 256; ++b) {
      const int32_t t = pattern.Next(state, static_cast<unsigned char>(b));
      if (t < 0) continue;
      const bool ends = pattern.bytes_left()[static_cast<size_t>(t)] == 0;
      if (!reachable(t, written + (ends ? 1 : 0))) continue;
      bytes.push_back(b);
      if (distance[static_cast<size_t>(t)] < distance[static_cast<size_t>(state)]) {
        shorter.push_back(b);
      }
    }
    if (step >= 12 && !shorter.empty()) bytes = shorter;
    const bool long_enough = written >= node.min_length;
    if (pattern.Accepts(state) && long_enough &&
        (step >= 12 || bytes.empty() || std::bernoulli_distribution(0.3)(rng))) {
      return text;
    }
    REQUIRE(!bytes.empty());
    const int b = bytes[std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng)];
    text += static_cast<char>(b);
    state = pattern.Next(state, static_cast<unsigned char>(b));
    if (pattern.bytes_left()[static_cast<size_t>(state)] == 0) ++written;
  }
}

// A random value of node `node`, as the schema's smallest values allow at `depth`.
// A multiple of the node's multipleOf within its bounds (around them where absent).
int64_t RandomMultiple(const SchemaNode& n, std::mt19937_64& rng) {
  const int64_t k = n.multiple_of;
  const int64_t low = n.has_minimum ? n.minimum : n.has_maximum ? n.maximum - 1000 * k : -1000 * k;
  const int64_t high = n.has_maximum ? n.maximum : low + 2000 * k;
  int64_t first = low / k;
  if (first * k < low) ++first;
  int64_t last = high / k;
  if (last * k > high) --last;
  return std::uniform_int_distribution<int64_t>(first, last)(rng) * k;
}

ojson RandomValue(const CompiledSchema& schema, int32_t node, int depth, std::mt19937_64& rng) {
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  const SchemaNode* n = &schema.node(node);
  int32_t first_key = -1;  // an overlap's discriminator, written first
  while (!n->branches.empty() || !n->members.empty()) {
    const std::vector<int32_t>& choices = n->branches.empty() ? n->members : n->branches;
    std::vector<size_t> fitting;
    for (size_t i = 0; i < choices.size(); ++i) {
      if (depth + schema.node(choices[i]).min_depth <= CompiledSchema::kMaxDepth) {
        fitting.push_back(i);
      }
    }
    const size_t chosen = fitting[std::uniform_int_distribution<size_t>(0, fitting.size() - 1)(rng)];
    first_key = n->first_keys.empty() ? -1 : n->first_keys[chosen];
    node = choices[chosen];
    n = &schema.node(node);
  }
  if (!n->enum_texts.empty()) {
    return json::parse(
        n->enum_texts[std::uniform_int_distribution<size_t>(0, n->enum_texts.size() - 1)(rng)]);
  }
  std::vector<uint8_t> types;
  const uint8_t all = n->any ? kAllJsonTypes : n->types;
  for (const uint8_t t : {kTypeString, kTypeInteger, kTypeNumber, kTypeBoolean, kTypeNull}) {
    if ((all & t) != 0) types.push_back(t);
  }
  // Containers less often deeper down (keeps free values from growing without end), unless
  // nothing else is of the node's types.
  const bool deeper = depth < 6 || chance(0.3) || types.empty();
  if ((all & kTypeObject) != 0 && deeper &&
      depth + (n->any ? 1 : n->object_depth) <= CompiledSchema::kMaxDepth) {
    types.push_back(kTypeObject);
  }
  if ((all & kTypeArray) != 0 && deeper &&
      depth + (n->any ? 1 : n->array_depth) <= CompiledSchema::kMaxDepth) {
    types.push_back(kTypeArray);
  }
  REQUIRE(!types.empty());
  const uint8_t type = types[std::uniform_int_distribution<size_t>(0, types.size() - 1)(rng)];
  switch (type) {
    case kTypeString: {
      if (!n->any && n->pattern != nullptr) return PatternString(*n, rng);
      // Characters of one code point each, as many as the node's length allows.
      const int64_t fewest = n->any ? 0 : n->min_length;
      const int64_t most = n->any || n->max_length < 0 ? fewest + 5 : n->max_length;
      std::string s;
      for (int64_t i = std::uniform_int_distribution<int64_t>(fewest, most)(rng); i > 0; --i) {
        static const std::vector<std::string> pieces = {"a", "Z", " ", "\"", "\\", "\n", "\xC3\xA9",
                                                        "\xF0\x9F\x8E\xA9", "/", "\x01"};
        s += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
      }
      return s;
    }
    case kTypeInteger: {
      if (!n->any && n->multiple_of > 0) return RandomMultiple(*n, rng);
      if (n->any || !n->bounds_integers()) {
        return std::uniform_int_distribution<int64_t>(-1000000, 1000000)(rng);
      }
      // Within the bounds, near one of them where the other is far or absent.
      const int64_t low = n->has_minimum ? n->minimum : n->maximum - 1000;
      const int64_t high = n->has_maximum && n->maximum - low <= 1000000 ? n->maximum : low + 1000;
      return std::uniform_int_distribution<int64_t>(low, high)(rng);
    }
    case kTypeNumber: {
      if (!n->any && n->multiple_of > 0) return RandomMultiple(*n, rng);
      if (n->any || !n->bounds_numbers()) {
        return chance(0.5) ? json(std::uniform_int_distribution<int>(-50, 50)(rng))
                           : json(std::uniform_real_distribution<double>(-1e6, 1e6)(rng));
      }
      // Within the bounds (the tests' bounds keep values clear of exponents); a bound itself
      // at times.
      const double low = n->number_minimum.set ? n->number_minimum.value
                                               : n->number_maximum.value - 100;
      const double high = n->number_maximum.set ? n->number_maximum.value : low + 100;
      if (chance(0.1)) return json(chance(0.5) ? low : high);
      const double value = std::uniform_real_distribution<double>(low, high)(rng);
      return chance(0.3) ? json(std::round(value)) : json(value);
    }
    case kTypeBoolean:
      return chance(0.5);
    case kTypeNull:
      return nullptr;
    case kTypeObject: {
      ojson object = ojson::object();
      if (first_key >= 0) {
        const auto p = static_cast<size_t>(first_key);
        object[n->property_names[p]] = RandomValue(schema, n->property_nodes[p], depth + 1, rng);
      }
      if (n->any) {
        for (int i = std::uniform_int_distribution<int>(0, 2)(rng); i > 0; --i) {
          object["k" + std::to_string(i)] = RandomValue(schema, node, depth + 1, rng);
        }
        return object;
      }
      for (size_t p = 0; p < n->property_nodes.size(); ++p) {
        if (static_cast<int32_t>(p) == first_key) continue;
        const bool required = (n->required >> p & 1u) != 0;
        const int32_t value = n->property_nodes[p];
        if (required || (chance(0.5) && depth + 1 + schema.node(value).min_depth <=
                                            CompiledSchema::kMaxDepth)) {
          object[n->property_names[p]] = RandomValue(schema, value, depth + 1, rng);
        }
      }
      if (n->additional != SchemaNode::kNone && chance(0.3) &&
          depth + 1 + schema.node(n->additional).min_depth <= CompiledSchema::kMaxDepth) {
        object["extra\xC3\xA9"] = RandomValue(schema, n->additional, depth + 1, rng);
      }
      return object;
    }
    case kTypeArray: {
      ojson array = ojson::array();
      if (n->any) {
        for (int i = std::uniform_int_distribution<int>(0, 2)(rng); i > 0; --i) {
          array.push_back(RandomValue(schema, node, depth + 1, rng));
        }
        return array;
      }
      // Past a tuple, no more items when items is false.
      const int64_t tuple = static_cast<int64_t>(n->prefix_items.size());
      int64_t most = n->max_items >= 0 ? n->max_items : std::max(n->min_items, tuple) + 3;
      if (n->items == SchemaNode::kNone) most = std::min(most, tuple);
      const int64_t count = std::uniform_int_distribution<int64_t>(n->min_items, most)(rng);
      for (int64_t i = 0; i < count; ++i) {
        const int32_t item = n->item(i);
        if (depth + 1 + schema.node(item).min_depth > CompiledSchema::kMaxDepth) break;
        array.push_back(RandomValue(schema, item, depth + 1, rng));
      }
      return array;
    }
    default:
      FAIL("unexpected type");
  }
  return nullptr;
}

// A value that parses, or nullopt for one a strict parser cannot hold though it is JSON (a
// number past double's range, 1e999): such a text is not judged.
std::optional<json> Parsed(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::out_of_range& overflow) {
    REQUIRE(overflow.id == 406);  // a number past double's range
  }
  return std::nullopt;
}

// Unions of objects, as Pydantic writes them: Union[Cat, Dog] with a discriminator (a oneOf)
// and without (an anyOf, here nullable), and Union[int, float]. Its models take undeclared
// properties (Pydantic's model_json_schema leaves additionalProperties out).
constexpr char kPets[] = R"({
  "$defs": {
    "Cat": {"properties": {"pet_type": {"const": "cat", "title": "Pet Type", "type": "string"},
                           "meows": {"title": "Meows", "type": "integer"}},
            "required": ["pet_type", "meows"], "title": "Cat", "type": "object"},
    "Dog": {"properties": {"pet_type": {"const": "dog", "title": "Pet Type", "type": "string"},
                           "barks": {"title": "Barks", "type": "number"}},
            "required": ["pet_type", "barks"], "title": "Dog", "type": "object"}},
  "properties": {
    "pet": {"discriminator": {"mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"},
                              "propertyName": "pet_type"},
            "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "title": "Pet"},
    "other": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"type": "null"}]},
    "n": {"anyOf": [{"type": "integer"}, {"type": "number"}], "title": "N"}},
  "required": ["pet", "other", "n"], "title": "Owner", "type": "object",
  "additionalProperties": false
})";

// A recursive union: a leaf (any properties besides its short value), a node of children
// (nothing else), a string, or one of two strings; down to the depth limit.
constexpr char kTree[] = R"({
  "$defs": {
    "Leaf": {"type": "object", "properties": {"value": {"type": "string", "maxLength": 2}},
             "required": ["value"]},
    "Node": {"type": "object", "properties": {
               "children": {"type": "array", "items": {"$ref": "#/$defs/T"}},
               "value": {"type": "integer"}},
             "required": ["children"], "additionalProperties": false},
    "T": {"anyOf": [{"$ref": "#/$defs/Leaf"}, {"$ref": "#/$defs/Node"}, {"type": "string"},
                    {"enum": ["x", "yy"]}]}},
  "$ref": "#/$defs/T"
})";

// The schemas of the random tests. The second has an enum value that is an array: written
// indented it is not the compact text an enum matches (json_schema.h, "Limits").
const char* const kSchemas[] = {
    kPerson,
    R"({"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"},
        {"type": "object", "properties": {"x": {"type": "number"}, "y": {"const": [1, 2]}},
         "required": ["x"], "additionalProperties": {"type": "boolean"}}]},
        "minItems": 1, "maxItems": 5})",
    R"({"definitions": {"Tree": {"type": "object", "properties": {
          "value": {"type": "integer"},
          "children": {"type": "array", "items": {"$ref": "#/definitions/Tree"}}},
        "required": ["value", "children"], "additionalProperties": false}},
        "allOf": [{"$ref": "#/definitions/Tree"}]})",
    R"({"type": "object", "properties": {"any": {}, "nothing": {"type": "array", "maxItems": 0},
        "n": {"type": ["number", "null", "boolean"]}}, "required": ["any", "nothing"]})",
    R"({"type": "string"})",
    R"({"type": ["integer", "array"], "items": {"type": "integer"}})",
    // What the OpenAI client writes for a Pydantic model (openai.lib._pydantic.
    // to_strict_json_schema): the root a copy of the model, which $defs holds too.
    R"({"$defs": {"Kind": {"enum": ["cat", "dog"], "title": "Kind", "type": "string"},
        "Pet": {"properties": {"kind": {"$ref": "#/$defs/Kind"},
                               "legs": {"title": "Legs", "type": "integer"}},
                "required": ["kind", "legs"], "title": "Pet", "type": "object",
                "additionalProperties": false},
        "Person": {"properties": {"name": {"title": "Name", "type": "string"},
                                  "pets": {"items": {"$ref": "#/$defs/Pet"}, "title": "Pets",
                                           "type": "array"},
                                  "friend": {"anyOf": [{"$ref": "#/$defs/Person"},
                                                       {"type": "null"}]}},
                   "required": ["name", "pets", "friend"], "title": "Person", "type": "object",
                   "additionalProperties": false}},
        "properties": {"name": {"title": "Name", "type": "string"},
                       "pets": {"items": {"$ref": "#/$defs/Pet"}, "title": "Pets", "type": "array"},
                       "friend": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]}},
        "required": ["name", "pets", "friend"], "title": "Person", "type": "object",
        "additionalProperties": false})",
    // Lengths and bounds, as Pydantic writes Field(min_length=..., ge=..., lt=...).
    R"({"type": "object", "properties": {
          "code": {"type": "string", "minLength": 2, "maxLength": 3},
          "note": {"type": "string", "minLength": 4},
          "short": {"type": ["string", "integer"], "maxLength": 1, "exclusiveMaximum": 0},
          "rating": {"type": "integer", "minimum": 1, "maximum": 5},
          "year": {"type": "integer", "minimum": 1900, "exclusiveMaximum": 2100},
          "depth": {"type": "integer", "maximum": -40},
          "count": {"type": "integer", "minimum": 10},
          "score": {"type": "number", "minimum": 0, "maximum": 1},
          "delta": {"type": ["number", "null"], "exclusiveMinimum": -2.5, "maximum": 40},
          "cold": {"type": "number", "maximum": -10.25},
          "hundreds": {"type": "number", "minimum": 500, "exclusiveMaximum": 700}},
        "required": ["code", "rating", "year", "depth"], "additionalProperties": false})",
    // Multiples, as Pydantic writes conint(multiple_of=5, ge=..., le=...): bounded on both
    // sides, on one, on none, below zero, and a "number" written as an integer.
    R"({"type": "object", "properties": {
          "step": {"type": "integer", "multipleOf": 5, "minimum": -12, "maximum": 40},
          "above": {"type": "integer", "multipleOf": 7, "minimum": 100},
          "below": {"type": "integer", "multipleOf": 9, "exclusiveMaximum": -20},
          "even": {"type": "integer", "multipleOf": 2},
          "dozens": {"type": "number", "multipleOf": 12},
          "big": {"type": "integer", "multipleOf": 1000003, "minimum": 1, "maximum": 3000010}},
        "required": ["step", "above", "below", "big"], "additionalProperties": false})",
    kPets,
    kTree,
    // Patterns, as Pydantic writes constr(pattern=...): anchored, anywhere, escapes, UTF-8.
    R"({"type": "object", "properties": {
          "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{2,3}$"},
          "note": {"type": "string", "pattern": "a\\.b"},
          "lines": {"type": ["string", "null"], "pattern": "^([\"\\\\/é]|\\n|\\t)*$"}},
        "required": ["code", "note", "lines"], "additionalProperties": false})",
    // Formats, as Pydantic writes datetime, UUID, EmailStr, AnyUrl (minLength 1, maxLength
    // 2083) and timedelta, and patterns beside lengths, as constr(pattern=..., max_length=...).
    R"({"type": "object", "properties": {
          "when": {"type": "string", "format": "date-time"},
          "day": {"type": "string", "format": "date"},
          "id": {"type": "string", "format": "uuid"},
          "mail": {"type": "string", "format": "email", "maxLength": 24},
          "url": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083},
          "ip": {"type": ["string", "null"], "format": "ipv6"},
          "wait": {"type": "string", "format": "duration"},
          "size": {"type": "integer", "format": "int64"},
          "word": {"type": "string", "pattern": "^[a-z\u00e9]+$", "minLength": 2, "maxLength": 4},
          "tagged": {"type": "string", "pattern": "x", "minLength": 3},
          "hex": {"type": "string", "format": "uuid", "pattern": "^[0-9a-f-]+$"}},
        "required": ["when", "id", "word", "tagged", "hex"], "additionalProperties": false})",
    // Tuples, as Pydantic writes tuple[float, float], tuple[str, int, bool] with a default,
    // and tuple[int, ...]; a tuple that goes on with strings; the drafts' form; unions of
    // arrays.
    R"({"type": "object", "properties": {
          "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                    "minItems": 2, "maxItems": 2},
          "row": {"type": "array", "maxItems": 3, "minItems": 3,
                  "prefixItems": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 0},
                                  {"type": "boolean"}]},
          "ints": {"type": "array", "items": {"type": "integer"}},
          "head": {"type": "array", "prefixItems": [{"const": "h"}, {"type": "object",
                    "properties": {"k": {"type": "integer"}}, "required": ["k"],
                    "additionalProperties": false}], "items": {"type": "string"}},
          "open": {"prefixItems": [{"type": "null"}]},
          "draft": {"type": "array", "items": [{"type": "integer"}, {"type": "string"}],
                    "additionalItems": false, "minItems": 1},
          "either": {"anyOf": [{"type": "array", "prefixItems": [{"type": "integer"}],
                                "items": false, "minItems": 1},
                               {"type": "array", "items": {"type": "string"}}, {"type": "null"}]}},
        "required": ["point", "row", "head", "draft", "either"], "additionalProperties": false})",
};

TEST_CASE("Random values of a schema are taken, compact or indented, and what the grammar "
          "completes the schema accepts",
          "[grammar]") {
  std::mt19937_64 rng(17);
  for (const char* text : kSchemas) {
    const auto schema = Compiled(text);
    INFO(text);
    for (int trial = 0; trial < 300; ++trial) {
      const ojson value = RandomValue(*schema, schema->root(), 0, rng);
      REQUIRE(SchemaAccepts(*schema, schema->root(), json(value)));
      const std::string compact = value.dump();
      INFO(compact);
      CHECK(Takes(*schema, compact));
      // Indented (whitespace runs stay short at these depths).
      const std::string indented = value.dump(1);
      if (text != kSchemas[1] &&
          indented.find(std::string(SchemaGrammar::kMaxWhitespaceRun, ' ')) == std::string::npos) {
        CHECK(Takes(*schema, indented));
      }
      // One byte changed: if the grammar still takes the whole text, it is a value of the
      // schema (never the other way round: a strict parser takes more ways of writing).
      std::string mutated = compact;
      const size_t at = std::uniform_int_distribution<size_t>(0, mutated.size() - 1)(rng);
      static const std::string bytes = "{}[]\",:01-.eatrufnl x\\";
      mutated[at] = bytes[std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng)];
      if (Takes(*schema, mutated)) {
        INFO(mutated);
        const std::optional<json> parsed = Parsed(mutated);
        if (parsed.has_value()) CHECK(SchemaAccepts(*schema, schema->root(), *parsed));
      }
    }
  }
}

TEST_CASE("Every prefix the grammar takes can be completed", "[grammar]") {
  // Random walks over the printable bytes, choosing among those taken: a walk never finds a
  // state that takes none of them before it may end (the bytes any value needs are there).
  std::mt19937_64 rng(5);
  std::string alphabet = "\n\t";
  for (int c = 0x20; c < 0x7F; ++c) alphabet += static_cast<char>(c);
  for (const char* text : kSchemas) {
    const auto schema = Compiled(text);
    INFO(text);
    for (int walk = 0; walk < 60; ++walk) {
      SchemaGrammar grammar(schema.get());
      std::string written;
      for (int step = 0; step < 400 && !grammar.complete(); ++step) {
        std::vector<char> taken;
        for (const char c : alphabet) {
          SchemaGrammar next = grammar;
          if (next.Feed(static_cast<unsigned char>(c))) taken.push_back(c);
        }
        INFO(written);
        REQUIRE((!taken.empty() || grammar.can_end()));
        if (taken.empty()) break;
        // Closing bytes more often as the walk goes on, so that values end.
        char next = taken[std::uniform_int_distribution<size_t>(0, taken.size() - 1)(rng)];
        for (const char close : {'}', ']', '"'}) {
          if (std::find(taken.begin(), taken.end(), close) != taken.end() &&
              std::bernoulli_distribution(std::min(0.9, step / 200.0))(rng)) {
            next = close;
          }
        }
        REQUIRE(grammar.Feed(static_cast<unsigned char>(next)));
        written += next;
      }
      if (grammar.complete()) {
        INFO(written);
        const std::optional<json> parsed = Parsed(written);
        if (parsed.has_value()) CHECK(SchemaAccepts(*schema, schema->root(), *parsed));
      }
    }
  }
}

// Random answers of `schema`, a token at a time from the vocabulary: before each, the
// constraint's mask must be each token tried on its own. Returns the masks computed between
// a pattern's characters (where the mask runs the pattern's cursor, not the grammar).
int CheckMasksAlongRandomAnswers(const std::shared_ptr<const TokenVocabulary>& vocabulary,
                                 int32_t end, const std::shared_ptr<const CompiledSchema>& schema,
                                 int answers, int steps, std::mt19937_64& rng) {
  auto constraint = MakeSchemaConstraint(vocabulary, {end}, schema);
  int inside_patterns = 0;
  for (int answer = 0; answer < answers; ++answer) {
    std::vector<int32_t> pending;
    SchemaGrammar state(schema.get());
    for (int step = 0; step < steps; ++step) {
      if (state.pattern_cursor().has_value()) ++inside_patterns;
      const auto mask = constraint->Allowed(pending);
      const std::vector<int32_t> got = testing::Ids(*mask);
      INFO("after " << pending.size() << " tokens");
      REQUIRE(got == testing::TokensTaken(state, *vocabulary, end));
      const int32_t next = got[std::uniform_int_distribution<size_t>(0, got.size() - 1)(rng)];
      if (next == end) break;
      REQUIRE(state.Feed(*vocabulary->bytes(next)));
      pending.push_back(next);
    }
  }
  return inside_patterns;
}

TEST_CASE("A schema constraint's masks are each token tried on its own, along random answers",
          "[grammar]") {
  // Pieces that cross JSON's token boundaries, as real vocabularies' do.
  constexpr int32_t kEnd = 2;
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt};
  for (const char* piece :
       {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "{\"", "\":", "\",", "\"}", "},", "]}",
        "a", "e", "n", "name", "\"name\"", "age", "pets", "kind", "legs", "friend", "tags",
        "spouse", "cat", "dog", "\"cat\"", "adult", "child", "1", "12", "0", "-", ".", "5", "E",
        "true", "false", "null", "nu", "ll", "\\", "\\n", "\\u00e9", "\xC3\xA9", "x", "y",
        "extra", "red", "green", "value", "children", "any", "nothing", "code", "note",
        "short", "rating", "year", "depth", "count", "score", "delta", "cold", "0.", ".2",
        "pet_type", "meows", "barks", "pet", "other", "\"dog\"", "\"x\"", "yy",
        "25", "-10", "19", "20", "2", "-4", "abc", "ab",
        "\xF0\x9F\x8E\xA9", "a\xC3\xA9" "bc", "\"ab\"", "ok\""}) {
    tokens.emplace_back(piece);
  }
  const auto vocabulary = std::make_shared<const TokenVocabulary>(std::move(tokens));
  std::mt19937_64 rng(9);
  for (const char* text : kSchemas) {
    const auto schema = Compiled(text);
    INFO(text);
    CheckMasksAlongRandomAnswers(vocabulary, kEnd, schema, 20, 60, rng);
  }
}

TEST_CASE(
    "Inside a string with a pattern, a mask is each token tried on its own, beside "
    "lengths and without",
    "[grammar]") {
  // The mask runs plain tokens through the pattern's automaton alone (PatternCursor), not
  // the grammar: these walks stay inside such strings, where a token of too many characters
  // or one the pattern cannot go on with must be refused as the grammar refuses it.
  constexpr int32_t kEnd = 2;
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt};
  for (const char* piece : {"\"",
                            "\\",
                            "\\n",
                            "\\\"",
                            "\\u0041",
                            "\",",
                            "\"}",
                            "a",
                            "b",
                            "ab",
                            "abab",
                            "aba",
                            "name",
                            "x",
                            "xx",
                            "xyz",
                            "A",
                            "AB",
                            "Z",
                            "-",
                            "-1",
                            "1",
                            "12",
                            "123",
                            "@",
                            "@b",
                            "b.c",
                            ".",
                            "com",
                            " ",
                            "a b",
                            "\xC3\xA9",
                            "a\xC3\xA9",
                            "\xC3\xA9\xC3\xA9\xC3\xA9",
                            "\xF0\x9F\x8E\xA9",
                            "abcdefgh",
                            "\n",
                            "{",
                            "}",
                            ":",
                            "{\"",
                            "\":",
                            "w",
                            "\"w\":"}) {
    tokens.emplace_back(piece);
  }
  const auto vocabulary = std::make_shared<const TokenVocabulary>(std::move(tokens));
  std::mt19937_64 rng(31);
  for (const char* text :
       {R"({"type": "string", "pattern": "^[a-z\u00e9]+$", "minLength": 2, "maxLength": 4})",
        R"({"type": "string", "pattern": "^(ab)+$", "minLength": 3, "maxLength": 7})",
        R"({"type": "string", "pattern": "x", "minLength": 3})",
        R"({"type": "string", "pattern": "^.{0,6}$"})",
        R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{2,3}$"})",
        R"({"type": "string", "pattern": "^[\n\"a]*$", "maxLength": 5})",
        R"({"type": "string", "format": "email", "maxLength": 9})",
        R"({"type": "object", "properties": {"w": {"type": "string", "pattern": "^a.{1,4}$"}},
               "required": ["w"], "additionalProperties": false})"}) {
    const auto schema = Compiled(text);
    INFO(text);
    CHECK(CheckMasksAlongRandomAnswers(vocabulary, kEnd, schema, 40, 12, rng) >= 40);
  }
}

TEST_CASE("A schema constraint allows the tokens that keep a value possible, and the end "
          "where the value may end",
          "[grammar]") {
  constexpr int32_t kEnd = 2;
  std::vector<std::optional<std::string>> tokens = {std::nullopt, std::nullopt, std::nullopt};
  for (const char* piece : {"{", "}", "\"", "\"a\"", ":", "1", "12", "x", "\"b\":", ",", " "}) {
    tokens.emplace_back(piece);
  }
  const auto vocabulary = std::make_shared<const TokenVocabulary>(std::move(tokens));
  auto id = [&](const std::string& piece) {
    for (int32_t i = 3; i < vocabulary->size(); ++i) {
      if (*vocabulary->bytes(i) == piece) return i;
    }
    FAIL(piece);
    return -1;
  };
  auto allowed = [&](const TokenConstraint& constraint, std::vector<int32_t> pending) {
    std::vector<std::string> out;
    const auto mask = constraint.Allowed(pending);
    for (int32_t i = 0; i < vocabulary->size(); ++i) {
      if ((*mask)[static_cast<size_t>(i)] != 0) out.push_back(i == kEnd ? "<end>" : *vocabulary->bytes(i));
    }
    return out;
  };
  const auto object = Compiled(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                   "required": ["a"], "additionalProperties": false})");
  auto constraint = MakeSchemaConstraint(vocabulary, {kEnd}, object);
  CHECK(allowed(*constraint, {}) == std::vector<std::string>{"{", " "});
  CHECK(allowed(*constraint, {id("{")}) == std::vector<std::string>{"\"", "\"a\"", " "});
  CHECK(allowed(*constraint, {id("{"), id("\"a\""), id(":")}) ==
        std::vector<std::string>{"1", "12", " "});
  CHECK(allowed(*constraint, {id("{"), id("\"a\""), id(":"), id("12")}) ==
        std::vector<std::string>{"}", "1", "12", " "});
  constraint->Commit(std::vector<int32_t>{id("{"), id("\"a\""), id(":"), id("1"), id("}")});
  CHECK(constraint->complete());
  CHECK(allowed(*constraint, {}) == std::vector<std::string>{"<end>"});
  // A top-level number: the end where it may end, digits where it may go on.
  auto number = MakeSchemaConstraint(vocabulary, {kEnd}, Compiled(R"({"type": "integer"})"));
  CHECK(allowed(*number, {}) == std::vector<std::string>{"1", "12", " "});
  CHECK(allowed(*number, {id("1")}) == std::vector<std::string>{"<end>", "1", "12"});
}

TEST_CASE("A union's branches of one type read a value side by side, each dropped where the "
          "value stops being one of its",
          "[grammar]") {
  const auto pets = Compiled(kPets);
  CheckTexts(*pets,
             {R"({"pet":{"pet_type":"cat","meows":3},"other":null,"n":1})",
              R"({"n":2.5,"other":{"pet_type":"dog","barks":2},"pet":{"pet_type":"dog","barks":1.5}})",
              // Undeclared properties, which both models take.
              R"({"pet":{"pet_type":"cat","x":[{"meows":1}],"meows":-3},"other":null,"n":-0.5})",
              R"({"pet":{"pet_type":"dog","barks":1,"meows":"no"},"other":null,"n":7})"},
             {R"({"pet":{"pet_type":"cat","barks":1.5},"other":null,"n":1})",  // a cat meows
              // The discriminator first, in the oneOf and in the anyOf alike.
              R"({"pet":{"meows":3,"pet_type":"cat"},"other":null,"n":1})",
              R"({"pet":{"pet_type":"cat","meows":3},"other":{"x":1,"pet_type":"cat","meows":3},"n":1})",
              R"({"pet":{"pet_type":"bird","meows":1},"other":null,"n":1})",
              R"({"pet":{"pet_type":"cat","meows":1.5},"other":null,"n":1})",  // an integer
              R"({"pet":{"pet_type":"dog","barks":1,"pet_type":"dog"},"other":null,"n":1})",
              R"({"pet":{},"other":null,"n":1})",
              R"({"pet":{"pet_type":"cat","meows":1},"other":null,"n":"1"})",
              R"({"pet":null,"other":null,"n":1})"});
  for (const char* value : {R"({"pet":{"pet_type":"cat","meows":3},"other":null,"n":1})",
                            R"({"pet":{"pet_type":"cat","barks":1.5},"other":null,"n":1})"}) {
    INFO(value);
    CHECK(SchemaAccepts(*pets, pets->root(), json::parse(value)) == Takes(*pets, value));
  }
  SchemaGrammar grammar(pets.get());
  REQUIRE(grammar.Feed(R"({"other":{"pet_type":"dog","meows":1)"));
  CHECK_FALSE(SchemaGrammar(grammar).Feed("}"));  // a dog barks
  CHECK(SchemaGrammar(grammar).Feed(R"(,"barks":0})"));

  // Without a discriminator the readings go on while the value could be of either, and it
  // closes only where one that is left may.
  const auto tree = Compiled(kTree);
  SchemaGrammar leaf_or_node(tree.get());
  REQUIRE(leaf_or_node.Feed(R"({"value":)"));
  SchemaGrammar node = leaf_or_node;
  REQUIRE(node.Feed("3"));  // a node's value
  CHECK_FALSE(SchemaGrammar(node).Feed("}"));  // its children are required
  CHECK(SchemaGrammar(node).Feed(R"(,"children":[]})"));
  SchemaGrammar leaf = leaf_or_node;
  REQUIRE(leaf.Feed(R"("ab")"));
  CHECK_FALSE(SchemaGrammar(leaf).Feed(R"(,"value")"));  // a property twice
  CHECK(SchemaGrammar(leaf).Feed(R"(,"children":3})"));  // a leaf's undeclared key
  CHECK(SchemaGrammar(leaf).Feed("}"));
  // The readings count the objects and arrays around them: 16 nodes and their children's
  // arrays are the 32 supported, and inside the last only strings fit (kTree's leaf would
  // take the nesting as an undeclared property's free value, which has JsonGrammar's limit).
  const auto nodes = Compiled(R"({"$defs": {"N": {"anyOf": [
      {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/N"}}},
       "required": ["children"], "additionalProperties": false},
      {"type": "object", "properties": {"d": {"type": "integer"}}, "additionalProperties": false},
      {"type": "string"}]}}, "$ref": "#/$defs/N"})");
  std::string deepest;
  for (int i = 0; i < 16; ++i) deepest += R"({"children":[)";
  SchemaGrammar at_limit(nodes.get());
  REQUIRE(at_limit.Feed(deepest));
  CHECK_FALSE(SchemaGrammar(at_limit).Feed("{"));
  CHECK_FALSE(SchemaGrammar(at_limit).Feed("["));
  CHECK(SchemaGrammar(at_limit).Feed(R"("x"]})"));
  CheckTexts(*tree,
             {R"("x")", R"("free text")", R"({"value":"ab","other":[1]})",
              R"({"children":[{"children":[]},"yy",{"value":"z"}],"value":3})"},
             {R"({"value":"abc"})", R"({"children":[],"extra":1})", R"({"children":[{}]})",
              R"({"value":3})"});

  // Plain integers and numbers overlap as the number.
  CheckTexts(*Compiled(R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})"),
             {"1", "-2.5e3"}, {"\"1\""});
  CheckTexts(*Compiled(R"({"oneOf": [{"const": "a"}, {"enum": ["b", "c"]}, {"type": "null"}]})"),
             {R"("a")", R"("c")", "null"}, {R"("d")"});
}

TEST_CASE("A string with a pattern takes only characters that can still lead to a match, "
          "and closes on one",
          "[grammar]") {
  const auto code = Compiled(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{2}\\n?$"})");
  CheckTexts(*code, {R"("AB-12")", R"("AB-12\n")"},
             {R"("AB-1")", R"("AB-123")", R"("ab-12")", R"("AB-12\u000a")", R"("AB-12\t")"});
  SchemaGrammar grammar(code.get());
  REQUIRE(grammar.Feed(R"("A)"));
  CHECK_FALSE(grammar.in_string());  // walked whole: not every character is taken
  CHECK_FALSE(SchemaGrammar(grammar).Feed("a"));
  CHECK_FALSE(SchemaGrammar(grammar).Feed("\""));  // no match yet
  // Escapes are the characters they stand for; '/' may be written either way.
  const auto slash = Compiled(R"({"type": "string", "pattern": "^/\"$"})");
  CheckTexts(*slash, {R"("/\"")", R"("\/\"")"}, {R"("/")", R"("\u002f\"")"});
  // Unanchored: anywhere in the string.
  CheckTexts(*Compiled(R"({"type": "string", "pattern": "\\d"})"), {R"("x1y")", R"("5")"},
             {R"("xy")"});
}

TEST_CASE("A format constrains a string to what it names, and a pattern holds to the lengths "
          "beside it",
          "[grammar]") {
  CheckTexts(*Compiled(R"({"type": "string", "format": "date-time"})"),
             {R"("2024-02-29T23:59:60Z")", R"("2024-01-01T09:30:00.5+05:30")"},
             {R"("2024-01-01")", R"("2024-02-30T00:00:00Z")", R"("yesterday")"});
  // Of another type, or unknown: an annotation.
  CheckTexts(*Compiled(R"({"type": ["integer", "string"], "format": "uuid"})"),
             {"12", R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("x")"});
  CheckTexts(*Compiled(R"({"type": "string", "format": "uri-reference"})"), {R"("x y")"}, {});
  // A pattern beside lengths: the string closes only at a match of an allowed length, and a
  // character is taken only where one can still follow.
  const auto word = Compiled(R"({"type": "string", "pattern": "^(ab)+$", "minLength": 3, "maxLength": 5})");
  CheckTexts(*word, {R"("abab")"}, {R"("ab")", R"("ababab")", R"("aba")"});
  SchemaGrammar grammar(word.get());
  REQUIRE(grammar.Feed(R"("abab)"));
  CHECK_FALSE(SchemaGrammar(grammar).Feed("a"));  // "ababa" could only go on to 6
  CHECK(SchemaGrammar(grammar).Feed("\""));
  // Escapes count as the one character they stand for.
  CheckTexts(*Compiled(R"({"type": "string", "pattern": "^[a\n]*$", "maxLength": 2})"),
             {R"("a\n")", R"("\n\n")"}, {R"("a\na")"});
  // A format's automaton is shared, not the schema's own: many of them fit its budget.
  json many = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 64; ++i) {
    many["properties"]["ip" + std::to_string(i)] = {{"type", "string"}, {"format", "ipv6"}};
  }
  Compiled(many.dump());
  // A uri as Pydantic's AnyUrl writes it.
  CheckTexts(*Compiled(R"({"type": "string", "format": "uri", "minLength": 1, "maxLength": 12})"),
             {R"("http://a.b/c")"}, {R"("http://a.b/cd")", R"("")", R"("a b")"});
}

TEST_CASE(
    "A multipleOf's numbers are its multiples, and a digit is taken only where one within "
    "the bounds can follow",
    "[grammar]") {
  const auto step =
      Compiled(R"({"type": "integer", "multipleOf": 5, "minimum": 3, "maximum": 42})");
  CheckTexts(*step, {"5", "10", "40"}, {"0", "3", "45", "12", "5.0", "1e1", "-5"});
  SchemaGrammar grammar(step.get());
  CHECK(SchemaGrammar(grammar).Feed("1"));         // 10 to 19 holds 10 and 15
  CHECK_FALSE(SchemaGrammar(grammar).Feed("-"));   // no negative is at least 3
  CHECK_FALSE(SchemaGrammar(grammar).Feed("0"));   // 0 is below 3, and nothing follows it
  CHECK_FALSE(SchemaGrammar(grammar).Feed("43"));  // 43 to 49 and on: past 42
  REQUIRE(grammar.Feed("4"));                      // 4, then 40 to 42
  CHECK_FALSE(grammar.can_end());
  CHECK_FALSE(SchemaGrammar(grammar).Feed("1"));
  CHECK(SchemaGrammar(grammar).Feed("0"));
  // Below zero, bounded above only: -1 is no multiple of 9 at most -21, but goes on to one
  // (-10 to -19 holds none; -100 to -199 does).
  const auto below = Compiled(R"({"type": "integer", "multipleOf": 9, "exclusiveMaximum": -20})");
  CheckTexts(*below, {"-27", "-90", "-9007199254740987"},
             {"-18", "-20", "27", "-1", "-900000000000000000000000000009"});
  SchemaGrammar negative(below.get());
  REQUIRE(negative.Feed("-1"));
  CHECK_FALSE(negative.can_end());
  CHECK(SchemaGrammar(negative).Feed("5"));  // -15, then -153
  CHECK(SchemaGrammar(negative).Feed("0"));  // -10, then -108
  // Bounded on both sides, a prefix can lead only into the bounds' multiples.
  const auto narrow =
      Compiled(R"({"type": "integer", "multipleOf": 7, "minimum": 15, "maximum": 30})");
  CheckTexts(*narrow, {"21", "28"}, {"14", "35", "20"});
  SchemaGrammar tens(narrow.get());
  REQUIRE(tens.Feed("2"));  // 21, 28
  CHECK_FALSE(SchemaGrammar(tens).Feed("0"));
  CHECK_FALSE(SchemaGrammar(tens).Feed("5"));
  CHECK(SchemaGrammar(tens).Feed("1"));
  CHECK_FALSE(SchemaGrammar(narrow.get()).Feed("3"));  // 30 is no multiple of 7
  // Unbounded: any digits can still reach a multiple; the end only at one. A "number" is
  // written as an integer.
  const auto dozens = Compiled(R"({"type": "number", "multipleOf": 12})");
  CheckTexts(*dozens, {"0", "-0", "12", "-36", "123456789012"}, {"13", "12.0", "1.2e1", "6"});
  // Within +-2^53, where a parser reads every integer exactly (-2^53 - 9 is a multiple of 9,
  // and so is 9 * 10^29 + 9, but the doubles nearest them need not be).
  const auto large = Compiled(R"({"type": "integer", "multipleOf": 9007199254740992})");
  CheckTexts(*large, {"9007199254740992", "-9007199254740992", "0"},
             {"18014398509481984", "9007199254740993", "4503599627370496"});
  CHECK_FALSE(Takes(*dozens, "-9007199254741008"));  // a multiple of 12 past -2^53
  CHECK(SchemaAccepts(*large, large->root(), json::parse("-9007199254740992")));
  CHECK_FALSE(SchemaAccepts(*large, large->root(), json::parse("18014398509481984")));
  CHECK(SchemaAccepts(*dozens, dozens->root(), json::parse("24.0")));
  CHECK_FALSE(SchemaAccepts(*dozens, dozens->root(), json::parse("24.5")));
}

TEST_CASE("A tuple's items are each of their own schema, and those past it of items",
          "[grammar]") {
  // Pydantic's tuple[int, str]: exactly two, in order.
  const auto pair = Compiled(R"({"type": "array", "prefixItems": [{"type": "integer"},
      {"type": "string"}], "minItems": 2, "maxItems": 2})");
  CheckTexts(*pair, {R"([1,"a"])", R"([ -2 , "" ])"},
             {R"(["a",1])", R"([1])", R"([1,"a","b"])", R"([1,2])", "[]"});
  // After `[1,` only a string; after `[1,"a"` only the close.
  SchemaGrammar grammar(pair.get());
  REQUIRE(grammar.Feed("[1,"));
  CHECK_FALSE(SchemaGrammar(grammar).Feed("2"));
  REQUIRE(grammar.Feed(R"("a")"));
  CHECK_FALSE(SchemaGrammar(grammar).Feed(","));
  CHECK(SchemaGrammar(grammar).Feed("]"));
  // Without minItems a tuple may stop early; past it, items (absent: anything; false: none).
  CheckTexts(*Compiled(R"({"prefixItems": [{"type": "integer"}, {"type": "string"}]})"),
             {"[]", "[1]", R"([1,"a",null,{}])"}, {R"(["a"])"});
  CheckTexts(*Compiled(R"({"prefixItems": [{"type": "integer"}], "items": {"type": "boolean"}})"),
             {"[1,true,false]"}, {"[1,2]", "[true]"});
  CheckTexts(*Compiled(R"({"prefixItems": [{"type": "integer"}], "items": false})"), {"[1]"},
             {"[1,2]"});
  CheckTexts(*Compiled(R"({"type": "array", "items": false})"), {"[]"}, {"[1]"});
  // The drafts' tuples: items as an array, additionalItems after it.
  CheckTexts(*Compiled(R"({"items": [{"type": "integer"}], "additionalItems": {"type": "null"}})"),
             {"[1,null]", "[]"}, {"[1,1]"});
  // A tuple's required items count toward the depth its smallest value needs.
  json nested = {{"type", "integer"}};
  for (int i = 0; i < 40; ++i) {
    nested = {{"prefixItems", {{{"type", "null"}}, nested}}, {"minItems", 2}};
  }
  CHECK_THAT(Refusal(nested.dump()), Catch::Contains("nests more than the 32"));
  nested["minItems"] = 1;
  Compiled(nested.dump());
  CHECK_THAT(Refusal(R"({"prefixItems": [{"type": "integer"}], "items": false, "minItems": 2})"),
             Catch::Contains("no finite JSON value satisfies the schema"));
  CHECK_THAT(Refusal(R"({"prefixItems": [], "type": "array"})"),
             Catch::StartsWith("at /prefixItems: must be a non-empty array of schemas"));
  CHECK_THAT(Refusal(R"({"prefixItems": [{"type": "x"}]})"),
             Catch::StartsWith("at /prefixItems/0/type: \"x\" is not a JSON Schema type"));
  CHECK_THAT(Refusal(R"({"prefixItems": [{}], "items": [{}]})"),
             Catch::Contains("\"prefixItems\" beside \"items\" as an array"));
  CHECK_THAT(Refusal(R"({"type": "string", "prefixItems": [{}]})"),
             Catch::Contains("\"prefixItems\" on a schema whose type has no array"));
  CHECK(SchemaAccepts(*pair, pair->root(), json::parse(R"([1,"a"])")));
  CHECK_FALSE(SchemaAccepts(*pair, pair->root(), json::parse(R"([1,1])")));
}

TEST_CASE("Compiled schemas are shared by their text, the last used kept", "[grammar]") {
  const auto compile = [](const std::string& text) {
    absl::StatusOr<std::shared_ptr<const CompiledSchema>> compiled =
        CompiledSchema::CompileShared(json::parse(text));
    REQUIRE(compiled.ok());
    return *compiled;
  };
  const auto first = compile(R"({"type": "object", "properties": {"a": {"pattern": "^x+$"}},
                                 "required": ["a"]})");
  // The same schema, its keys in another order: the same compiled one.
  CHECK(compile(R"({"required": ["a"], "properties": {"a": {"pattern": "^x+$"}},
                    "type": "object"})") == first);
  CHECK(first->memory_bytes() > sizeof(CompiledSchema));
  // Used again before others push it out, it stays; past kCachedSchemas others, it is gone.
  for (size_t i = 0; i < CompiledSchema::kCachedSchemas - 1; ++i) {
    compile(absl::StrCat(R"({"const": )", i, "}"));
  }
  CHECK(compile(R"({"type": "object", "properties": {"a": {"pattern": "^x+$"}},
                    "required": ["a"]})") == first);
  for (size_t i = 0; i < CompiledSchema::kCachedSchemas; ++i) {
    compile(absl::StrCat(R"({"const": "s)", i, "\"}"));
  }
  CHECK(compile(R"({"type": "object", "properties": {"a": {"pattern": "^x+$"}},
                    "required": ["a"]})") != first);
  // A refusal is a refusal each time.
  CHECK_FALSE(CompiledSchema::CompileShared(json::parse(R"({"type": "text"})")).ok());
  CHECK_FALSE(CompiledSchema::CompileShared(json::parse(R"({"type": "text"})")).ok());
}

TEST_CASE("Unions of one type that could not be held to, or could take too many readings, "
          "are refused",
          "[grammar]") {
  CHECK_THAT(Refusal(R"({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                                   {"type": "object", "properties": {"b": {"type": "string"}}}]})"),
             Catch::StartsWith("at /: oneOf's branches /oneOf/0 and /oneOf/1 may both take a value "
                               "(objects): tell them apart by a required property"));
  // The discriminator must be required in both and its values disjoint (as JSON values).
  CHECK_THAT(Refusal(R"({"oneOf": [
                  {"type": "object", "properties": {"t": {"const": "a"}}, "required": ["t"]},
                  {"type": "object", "properties": {"t": {"const": "b"}}}]})"),
             Catch::Contains("may both take a value (objects)"));
  CHECK_THAT(Refusal(R"({"oneOf": [
                  {"type": "object", "properties": {"t": {"const": 1}}, "required": ["t"]},
                  {"type": "object", "properties": {"t": {"enum": [2, 1.0]}}, "required": ["t"]}]})"),
             Catch::Contains("may both take a value (objects)"));
  CHECK_THAT(Refusal(R"({"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b"]}]})"),
             Catch::Contains("may both take a value (strings)"));
  CHECK_THAT(Refusal(R"({"anyOf": [{"type": "integer", "minimum": 0}, {"type": "number"}]})"),
             Catch::Contains("branches take numbers both, one of them with bounds, a multipleOf "
                             "or values (/anyOf/0)"));
  CHECK_THAT(Refusal(R"({"anyOf": [{"type": "integer", "multipleOf": 3}, {"type": "number"}]})"),
             Catch::Contains("one of them with bounds, a multipleOf or values (/anyOf/0)"));
  // Each object holds a union of two again, down a recursion: 2^31 readings at the bottom.
  CHECK_THAT(Refusal(R"({"$defs": {"T": {"anyOf": [
                  {"type": "object", "properties": {"a": {"$ref": "#/$defs/T"}}},
                  {"type": "object", "properties": {"a": {"$ref": "#/$defs/T"},
                                                    "b": {"type": "integer"}}}]}},
                  "$ref": "#/$defs/T"})"),
             Catch::Contains("could hold more than 64 readings of a value at once"));
  // A union of more objects than readings allowed is refused before its pairs are compared.
  json many = {{"anyOf", json::array()}};
  for (int i = 0; i < 65; ++i) {
    many["anyOf"].push_back({{"type", "object"},
                             {"properties", {{"k", {{"const", i}}}}},
                             {"required", {"k"}}});
  }
  CHECK_THAT(Refusal(many.dump()), Catch::Contains("65 branches take objects: at most 64"));
  many["anyOf"].erase(64);
  many["oneOf"] = many["anyOf"];
  many.erase("anyOf");
  Compiled(many.dump());  // 64, told apart by k: a oneOf
  // Discriminated, the same recursion compiles: its objects write the discriminator first,
  // so one reading goes on past it.
  Compiled(R"({"$defs": {"T": {"oneOf": [
      {"type": "object", "properties": {"k": {"const": "a"}, "a": {"$ref": "#/$defs/T"}},
       "required": ["k"]},
      {"type": "object", "properties": {"k": {"const": "b"}, "a": {"$ref": "#/$defs/T"}},
       "required": ["k"]}]}}, "$ref": "#/$defs/T"})");
}

}  // namespace
}  // namespace tophat
