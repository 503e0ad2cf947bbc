// A JSON Schema compiled for decoding constrained to it (OpenAI's response_format
// {"type": "json_schema"}): the graph SchemaGrammar walks.
//
// What compiles is the part of JSON Schema that structured outputs use (OpenAI's strict
// mode, and what Pydantic writes for its models):
//   type (one, or a list), enum, const, properties, required, additionalProperties (false,
//   true, or a schema; absent: true), items (or false), prefixItems (a tuple, Pydantic's
//   tuple[int, str]; also the drafts' items as an array, with additionalItems), minItems,
//   maxItems, minLength and maxLength (in characters), pattern (string_pattern.h's part of
//   ECMA-262), format (of strings: date-time, date, time, duration, email, hostname, ipv4, ipv6,
//   uuid and uri, as StringPattern::Format writes them; beside a pattern, both hold), minimum,
//   maximum, exclusiveMinimum and exclusiveMaximum (of an "integer" within 64-bit integers; of a
//   "number" within +-1e300, which is then written without an exponent), multipleOf (a whole
//   number, of an "integer", or of a "number" without bounds: written as an integer), anyOf and
//   oneOf (a nullable field: anyOf [X, {"type": "null"}]; a union of objects, Pydantic's Union[Cat,
//   Dog]; a oneOf's branches of one type must be told apart by a required property of different
//   constant values, Pydantic's discriminator, and where all of a union's objects are, that
//   property is written first), an allOf of one schema, $ref to "#", "#/$defs/NAME" or
//   "#/definitions/NAME" (recursion included), and the annotations (title, description, default,
//   examples, format, $schema, $id, $comment, deprecated, readOnly, writeOnly, discriminator),
//   which constrain nothing; so does a format of another name or on another type (OpenAPI's
//   "int64", "binary").
// Anything else (a fractional multipleOf, patternProperties, ...) is refused naming its place,
// rather than ignored: an answer would not hold to it. So is a schema that no finite value
// satisfies, or none within kMaxDepth nested objects and arrays, and one whose unions could
// keep more than kMaxAlternatives values' readings alive at once (SchemaGrammar reads a value
// once for each branch it may still be of).
//
// Limits: 64 declared properties an object; a key is spelled as nlohmann::json writes it
// (SchemaGrammar refuses "\u0061" for "a", which would alias it); an enum value matches as
// nlohmann::json writes it compactly (strings in UTF-8, no whitespace); an integer is written
// without a fraction or an exponent; a schema nests at most kMaxJsonNesting deep, and counts
// (minItems, maxLength, ...) are at most 2^31.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/grammar/string_pattern.h"
#include "nlohmann/json_fwd.hpp"

namespace tophat {

// The longest JSON Schema a request may carry, in bytes (its text as JSON), and the deepest
// it may nest arrays and objects (Compile refuses deeper ones before walking them).
inline constexpr int64_t kMaxJsonSchemaBytes = 256 << 10;
inline constexpr int kMaxJsonNesting = 256;

// The JSON types, as a node's bit set. A value that kNumber takes may be an integer too.
enum JsonTypeBit : uint8_t {
  kTypeObject = 1,
  kTypeArray = 2,
  kTypeString = 4,
  kTypeInteger = 8,
  kTypeNumber = 16,
  kTypeBoolean = 32,
  kTypeNull = 64,
};
inline constexpr uint8_t kAllJsonTypes = 127;

// The type a value's first byte says it is: one bit of JsonTypeBit (kTypeNumber for a
// number, whether or not it will be an integer), or 0 when no value starts with it.
uint8_t JsonTypeOfFirstByte(unsigned char byte);

// A trie over byte strings (property names, enum values). Node 0 is the root.
struct ByteTrie {
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> edges;  // sorted by byte
    int32_t terminal = -1;  // >= 0: a string ends here (its value)
    uint64_t below = 0;     // bit i: a string of value i < 64 ends here or below
  };
  std::vector<Node> nodes{Node{}};

  // The child of `node` by `byte`, or -1.
  int32_t Child(int32_t node, unsigned char byte) const;
  // The value of the string `bytes`, or -1.
  int32_t Find(std::string_view bytes) const;
  void Insert(std::string_view bytes, int32_t value);
};

struct SchemaNode {
  static constexpr int32_t kNone = -1;
  static constexpr int32_t kUnreachable = 1 << 20;  // min_depth of what cannot be written

  // No constraint: any JSON value (true, {}, or a schema of annotations only).
  bool any = false;
  // A union (anyOf / oneOf, $ref, allOf): the branches. Once compiled, a union of more than
  // one branch has one branch for each JSON type it takes (a value goes to the one of its
  // type: SchemaGrammar dispatches on its first byte); where the schema gave several of one
  // type, that branch is an overlap node (below). The fields below are then unused.
  std::vector<int32_t> branches;
  // An overlap (made by Compile from a union's branches of one type, none a union): the
  // nodes a value of that type may be a value of. SchemaGrammar reads the value once for
  // each, dropping those it stops being a value of. Of objects, arrays, strings, booleans or
  // nulls, whose values end at a byte of their own, so that the readings end together.
  std::vector<int32_t> members;
  // Objects with a discriminator (a property every member requires, of "const" or "enum"
  // values no two members share): each member's index of it, which its value then writes
  // first, so that after the first key one reading goes on; empty without one.
  std::vector<int32_t> first_keys;
  uint8_t types = 0;  // JsonTypeBit set; a union's is its branches'

  // Objects.
  std::vector<std::string> property_names;  // as declared
  std::vector<int32_t> property_nodes;
  uint64_t required = 0;  // bit i: property i
  int32_t additional = kNone;  // node of undeclared properties' values; kNone: refused
  ByteTrie keys;               // the names as JSON writes them, terminals their indices

  // Arrays: item i is a value of prefix_items[i] (a tuple), and those past the tuple of
  // items (kNone: there are none).
  std::vector<int32_t> prefix_items;
  int32_t items = kNone;
  int64_t min_items = 0;
  int64_t max_items = -1;  // -1: no limit
  int32_t item(int64_t i) const {
    return i < static_cast<int64_t>(prefix_items.size()) ? prefix_items[static_cast<size_t>(i)]
                                                         : items;
  }

  // Strings (not an enum's values): length in characters, as JSON Schema counts them (code
  // points; an escape is the one character it stands for).
  int64_t min_length = 0;
  int64_t max_length = -1;  // -1: no limit
  bool limits_length() const { return min_length > 0 || max_length >= 0; }
  // "pattern", and a "format" StringPattern::Format knows: what the string's characters must
  // match (both: the strings that match both); with a length, which of its states can still
  // reach a match of an allowed length.
  std::shared_ptr<const StringPattern> pattern;
  std::shared_ptr<const PatternLengths> pattern_lengths;

  // Integers (a node whose numbers are "integer" only): bounds, inclusive; an exclusive
  // bound compiles to the integer next to it inside. SchemaAccepts compares with these; the
  // grammar with their decimals (number_minimum, number_maximum).
  bool has_minimum = false;
  bool has_maximum = false;
  int64_t minimum = 0;
  int64_t maximum = 0;
  bool bounds_integers() const { return has_minimum || has_maximum; }
  // "multipleOf" (Pydantic's conint(multiple_of=5)): a whole number from 1 to 2^53, 0 for
  // none. Its numbers are written as integers (a "number"'s too, where it has no bounds).
  int64_t multiple_of = 0;

  // Numbers: bounds, inclusive, as decimals the grammar compares a number's digits with
  // exactly. Of a node whose numbers may have a fraction, also as doubles (an exclusive
  // bound compiles to the next double inside, so that "greater than" holds for the value a
  // parser reads), and the decimals are the doubles' shortest; of an integer's, its bounds'
  // digits.
  struct DecimalBound {
    bool set = false;
    double value = 0;
    bool negative = false;
    std::string integer;   // the magnitude's integer digits: "0" below 1, no leading zeros
    std::string fraction;  // its fraction digits, no trailing zeros
  };
  DecimalBound number_minimum;
  DecimalBound number_maximum;
  bool bounds_numbers() const { return number_minimum.set || number_maximum.set; }

  // enum / const: a value of one of enum_types is one of enum_texts, compact JSON.
  uint8_t enum_types = 0;
  std::vector<std::string> enum_texts;
  ByteTrie enum_trie;  // over enum_texts

  // The fewest nested objects and arrays a value of this node needs (0: a scalar will do),
  // and an object's and an array's of its own; kUnreachable when none can be written.
  int32_t min_depth = kUnreachable;
  int32_t object_depth = kUnreachable;
  int32_t array_depth = kUnreachable;
};

class CompiledSchema {
 public:
  // Nested objects and arrays a constrained value may have (SchemaGrammar's stack); a free
  // value inside them (`any`) has JsonGrammar's own limit.
  static constexpr int32_t kMaxDepth = 32;
  // The most readings of values SchemaGrammar may keep alive at once (overlaps' members,
  // nested ones multiplying): a union of objects whose properties are unions again, down a
  // recursion, could otherwise need exponentially many.
  static constexpr int32_t kMaxAlternatives = 64;

  // Errors are InvalidArgument naming the place in the schema as a JSON pointer, e.g.
  // `at /properties/age: "minimum" is not supported (...)`.
  static absl::StatusOr<std::shared_ptr<const CompiledSchema>> Compile(const nlohmann::json& schema);
  // Compile, through a process-wide cache of the schemas compiled lately, by their compact
  // text: an app sends its schema with every request, and the OpenAI endpoint's request
  // check, its answer reader and the agent each compile it (a pattern's automaton can take
  // tens of milliseconds). At most kCachedSchemas, kCachedSchemaBytes in all (memory_bytes
  // and the text); refusals are not kept. Thread-safe.
  static constexpr size_t kCachedSchemas = 64;
  static constexpr size_t kCachedSchemaBytes = 16 << 20;
  static absl::StatusOr<std::shared_ptr<const CompiledSchema>> CompileShared(
      const nlohmann::json& schema);
  // What the compiled schema holds, roughly: its nodes, and its patterns' automata.
  size_t memory_bytes() const;

  const SchemaNode& node(int32_t index) const { return nodes_[static_cast<size_t>(index)]; }
  int32_t root() const { return root_; }
  size_t size() const { return nodes_.size(); }
  // The node that takes a value of `type` (one JsonTypeBit, kTypeNumber for any number)
  // where `node` is expected: itself, or its union's branch of that type (an overlap node
  // where several take it); kNone if none.
  int32_t ForType(int32_t node, uint8_t type) const;

 private:
  friend class SchemaCompiler;
  std::vector<SchemaNode> nodes_;
  int32_t root_ = 0;
};

// Whether `value` satisfies node `node` of `schema`: a plain recursive check of the same
// rules (the tests and the fuzz target hold SchemaGrammar to it). Enum values compare as
// JSON values (1 and 1.0 alike), so it takes a little more than the grammar writes.
bool SchemaAccepts(const CompiledSchema& schema, int32_t node, const nlohmann::json& value);

}  // namespace tophat
