#include "models/grammar/json_schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <list>
#include <mutex>
#include <span>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/json_depth.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

using nlohmann::json;

// Keywords that describe and constrain nothing.
constexpr std::string_view kAnnotations[] = {
    "title",    "description", "default",  "examples",  "format",   "$schema",
    "$id",      "$comment",    "deprecated", "readOnly", "writeOnly", "$defs",
    "definitions", "discriminator"};
// Keywords that constrain, and are compiled.
constexpr std::string_view kSupported[] = {"type",
                                           "enum",
                                           "const",
                                           "properties",
                                           "required",
                                           "additionalProperties",
                                           "items",
                                           "minItems",
                                           "maxItems",
                                           "minLength",
                                           "maxLength",
                                           "minimum",
                                           "maximum",
                                           "exclusiveMinimum",
                                           "exclusiveMaximum",
                                           "anyOf",
                                           "oneOf",
                                           "allOf",
                                           "$ref",
                                           "pattern",
                                           "prefixItems",
                                           "additionalItems",
                                           "multipleOf"};
// Keywords of objects, arrays, strings and numbers: each implies its type where "type" is
// absent, and is refused on a schema whose types lack it.
constexpr std::string_view kObjectKeywords[] = {"properties", "required", "additionalProperties"};
constexpr std::string_view kArrayKeywords[] = {"items", "prefixItems", "additionalItems",
                                               "minItems", "maxItems"};
constexpr std::string_view kStringKeywords[] = {"minLength", "maxLength"};
constexpr std::string_view kPatternKeywords[] = {"pattern"};
constexpr std::string_view kMultipleKeywords[] = {"multipleOf"};
constexpr std::string_view kBoundKeywords[] = {"minimum", "maximum", "exclusiveMinimum",
                                               "exclusiveMaximum"};

template <size_t N>
bool OneOf(std::string_view key, const std::string_view (&set)[N]) {
  return std::find(std::begin(set), std::end(set), key) != std::end(set);
}

// The value classes a first byte tells apart: a number is one class whether or not it is an
// integer.
uint8_t ClassesOf(uint8_t types) {
  uint8_t classes = types & ~(kTypeInteger | kTypeNumber);
  if ((types & (kTypeInteger | kTypeNumber)) != 0) classes |= kTypeNumber;
  return classes;
}

bool IsIntegral(const json& value) {
  if (value.is_number_integer() || value.is_number_unsigned()) return true;
  if (!value.is_number_float()) return false;
  const double v = value.get<double>();
  return std::isfinite(v) && std::floor(v) == v;
}

// The JSON Schema types `value` is of: a whole number is an integer and a number.
uint8_t TypesOfValue(const json& value) {
  switch (value.type()) {
    case json::value_t::object:
      return kTypeObject;
    case json::value_t::array:
      return kTypeArray;
    case json::value_t::string:
      return kTypeString;
    case json::value_t::boolean:
      return kTypeBoolean;
    case json::value_t::null:
      return kTypeNull;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return IsIntegral(value) ? kTypeInteger | kTypeNumber : kTypeNumber;
    case json::value_t::binary:
    case json::value_t::discarded:
      return 0;
  }
  return 0;
}

// A bound from its decimal text ("-12.50", "7"): the sign, and the magnitude's integer digits
// ("0" below 1) and fraction digits without trailing zeros.
SchemaNode::DecimalBound DecimalOf(std::string_view text, double value) {
  SchemaNode::DecimalBound bound{.set = true, .value = value};
  if (text.starts_with('-')) {
    bound.negative = true;
    text.remove_prefix(1);
  }
  const size_t point = text.find('.');
  bound.integer = std::string(text.substr(0, point));
  if (point != std::string_view::npos) bound.fraction = std::string(text.substr(point + 1));
  while (!bound.fraction.empty() && bound.fraction.back() == '0') bound.fraction.pop_back();
  if (bound.integer.empty()) bound.integer = "0";
  if (bound.integer == "0" && bound.fraction.empty()) bound.negative = false;  // -0 is 0
  return bound;
}

std::string TypeNames(uint8_t classes) {
  std::string names;
  for (const auto& [bit, name] : {std::pair{kTypeObject, "objects"}, {kTypeArray, "arrays"},
                                  {kTypeString, "strings"}, {kTypeNumber, "numbers"},
                                  {kTypeBoolean, "booleans"}, {kTypeNull, "null"}}) {
    if ((classes & bit) != 0) absl::StrAppend(&names, names.empty() ? "" : ", ", name);
  }
  return names;
}

}  // namespace

uint8_t JsonTypeOfFirstByte(unsigned char byte) {
  switch (byte) {
    case '{':
      return kTypeObject;
    case '[':
      return kTypeArray;
    case '"':
      return kTypeString;
    case 't':
    case 'f':
      return kTypeBoolean;
    case 'n':
      return kTypeNull;
    case '-':
      return kTypeNumber;
    default:
      return byte >= '0' && byte <= '9' ? kTypeNumber : 0;
  }
}

int32_t ByteTrie::Child(int32_t node, unsigned char byte) const {
  const auto& edges = nodes[static_cast<size_t>(node)].edges;
  const auto it = std::lower_bound(edges.begin(), edges.end(), byte,
                                   [](const auto& edge, unsigned char b) { return edge.first < b; });
  return it != edges.end() && it->first == byte ? it->second : -1;
}

int32_t ByteTrie::Find(std::string_view bytes) const {
  int32_t node = 0;
  for (const char c : bytes) {
    node = Child(node, static_cast<unsigned char>(c));
    if (node < 0) return -1;
  }
  return nodes[static_cast<size_t>(node)].terminal;
}

void ByteTrie::Insert(std::string_view bytes, int32_t value) {
  const uint64_t bit = value >= 0 && value < 64 ? uint64_t{1} << value : 0;
  int32_t node = 0;
  nodes[0].below |= bit;
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    int32_t child = Child(node, byte);
    if (child < 0) {
      child = static_cast<int32_t>(nodes.size());
      nodes.emplace_back();
      auto& edges = nodes[static_cast<size_t>(node)].edges;
      edges.insert(std::lower_bound(edges.begin(), edges.end(), std::pair{byte, child}),
                   {byte, child});
    }
    node = child;
    nodes[static_cast<size_t>(node)].below |= bit;
  }
  nodes[static_cast<size_t>(node)].terminal = value;
}

int32_t CompiledSchema::ForType(int32_t node, uint8_t type) const {
  // A union's branches take pairwise different types, and Compile refused unions that lead
  // back to themselves: this ends.
  while (node != SchemaNode::kNone) {
    const SchemaNode& n = nodes_[static_cast<size_t>(node)];
    if (n.any) return node;
    if (n.branches.empty()) return (ClassesOf(n.types) & type) != 0 ? node : SchemaNode::kNone;
    int32_t next = SchemaNode::kNone;
    for (const int32_t branch : n.branches) {
      if ((ClassesOf(nodes_[static_cast<size_t>(branch)].types) & type) != 0 ||
          nodes_[static_cast<size_t>(branch)].any) {
        next = branch;
        break;
      }
    }
    node = next;
  }
  return SchemaNode::kNone;
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json& root) : root_(root) {}

  absl::StatusOr<int32_t> Compile(const json& schema, const std::string& pointer) {
    const int32_t index = NewNode(pointer);
    if (absl::Status bounded = PlacesWithinBounds(pointer); !bounded.ok()) return bounded;
    if (absl::Status filled = Fill(index, schema, pointer); !filled.ok()) return filled;
    return index;
  }
  // Each schema of `list` (a union's branches, a tuple's items), at here/0, here/1, ...
  absl::StatusOr<std::vector<int32_t>> CompileEach(const json& list, const std::string& here) {
    std::vector<int32_t> nodes;
    for (size_t i = 0; i < list.size(); ++i) {
      absl::StatusOr<int32_t> node = Compile(list[i], absl::StrCat(here, "/", i));
      if (!node.ok()) return node.status();
      nodes.push_back(*node);
    }
    return nodes;
  }

  absl::Status Finish(int32_t root);

  std::shared_ptr<CompiledSchema> out = std::make_shared<CompiledSchema>();

 private:
  static absl::Status Invalid(const std::string& pointer, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("at ", pointer.empty() ? "/" : pointer, ": ", what));
  }
  int32_t NewNode(const std::string& pointer) {
    out->nodes_.emplace_back();
    pointers_.push_back(pointer);
    pointer_bytes_ += pointer.size();
    return static_cast<int32_t>(out->nodes_.size() - 1);
  }
  // Each node keeps its place for errors: long names deep down would make that quadratic
  // (a 220 KB name above 10,000 schemas: 2 GB), so the places are bounded in all.
  static constexpr size_t kMaxPointerBytes = 16 << 20;
  absl::Status PlacesWithinBounds(const std::string& pointer) const {
    if (pointer_bytes_ <= kMaxPointerBytes) return absl::OkStatus();
    return Invalid(pointer, "the schema's places (JSON pointers) add up to more than 16 MiB: "
                            "names too long, nested too deep");
  }
  SchemaNode& At(int32_t index) { return out->nodes_[static_cast<size_t>(index)]; }
  int32_t AnyNode() {
    if (any_ == SchemaNode::kNone) {
      any_ = NewNode("(any value)");
      At(any_).any = true;
      At(any_).types = kAllJsonTypes;
    }
    return any_;
  }
  static constexpr int kMaxNesting = 64;
  static constexpr size_t kMaxNodes = 10000;
  // Each state is a row of 256 transitions (1 KiB): 16 MiB in all.
  static constexpr int64_t kMaxPatternStates = 16384;
  int64_t pattern_states_ = 0;
  // Patterns' length tables (PatternLengths), in bytes.
  static constexpr size_t kMaxLengthBytes = 8 << 20;
  size_t length_bytes_ = 0;

  absl::Status Fill(int32_t index, const json& schema, const std::string& pointer);
  absl::Status FillNested(int32_t index, const json& schema, const std::string& pointer);
  absl::StatusOr<int32_t> Reference(const std::string& ref, const std::string& pointer);
  absl::Status FillObject(int32_t index, const json& schema, const std::string& pointer);
  absl::Status FillArray(int32_t index, const json& schema, const std::string& pointer);
  absl::Status FillMultiple(int32_t index, const json& schema, const std::string& pointer);
  // A count (minItems, maxLength, ...): a whole number from 0 to 2^31, which the grammar
  // counts in 32 bits.
  static absl::StatusOr<int64_t> Count(const json& value, const std::string& pointer) {
    constexpr int64_t kMost = int64_t{1} << 31;
    const bool whole = value.is_number_unsigned()
                           ? value.get<uint64_t>() <= uint64_t{kMost}
                           : value.is_number_integer() && value.get<int64_t>() >= 0 &&
                                 value.get<int64_t>() <= kMost;
    if (!whole) return Invalid(pointer, absl::StrCat("must be a whole number from 0 to ", kMost));
    return value.get<int64_t>();
  }
  absl::Status FillLength(int32_t index, const json& schema, const std::string& pointer);
  absl::Status FillBounds(int32_t index, const json& schema, const std::string& pointer);
  absl::Status FillNumberBounds(int32_t index, const json& schema, const std::string& pointer);
  absl::Status FillEnum(int32_t index, const json& schema, const std::string& pointer,
                        bool typed);
  absl::Status UnionTypes(int32_t node, std::vector<uint8_t>& state);
  // A union of more than one branch, its branches finished: rewritten to one branch a JSON
  // type, an overlap node where several branches take that type.
  absl::Status Overlap(int32_t node);
  // Whether no value is of both `a` and `b` (nodes that are no unions, of one JSON type): two
  // enums with no value in common, or two objects with a required property whose enums have
  // none (a oneOf's discriminator).
  bool Disjoint(int32_t a, int32_t b);
  // Objects' discriminator: a property each of `members` requires, whose values (an enum's)
  // no two of them share; each member's index of it, or empty when there is none.
  std::vector<int32_t> Discriminator(const std::vector<int32_t>& members);
  // The values an enum node (through one-branch unions) takes, parsed and sorted (1 and 1.0
  // are one value to a validator), each node's once; nullptr for any other node.
  const std::vector<json>* EnumValues(int32_t node);
  // The node a chain of one-branch unions ($ref, allOf) leads to (the node itself when it
  // is none), once UnionTypes finished it.
  int32_t Resolved(int32_t node) const {
    const auto i = static_cast<size_t>(node);
    return i < alias_.size() && alias_[i] != SchemaNode::kNone ? alias_[i] : node;
  }
  // Whether the readings SchemaGrammar keeps alive at once stay within kMaxAlternatives.
  absl::Status AlternativesWithinBounds(int32_t root);

  const json& root_;
  std::vector<std::string> pointers_;  // each node's place, for errors
  absl::flat_hash_map<std::string, int32_t> by_reference_;
  int32_t any_ = SchemaNode::kNone;
  std::vector<uint8_t> one_of_;  // one_of_[node]: the union is a oneOf
  std::vector<int32_t> alias_;   // Resolved's, for one-branch unions
  // EnumValues'. Node-based: it hands out pointers that must outlive the next insert, and
  // callers hold two at once (ValuesApart(EnumValues(a), EnumValues(b))); a flat map's
  // rehash on the second insert left the first dangling (found by the unit tests built with
  // clang, which evaluates the arguments in the other order).
  absl::node_hash_map<int32_t, std::vector<json>> enum_values_;

  // Overlap nodes and unions, each after the nodes it holds (UnionTypes' order).
  std::vector<int32_t> union_order_;
  int nesting_ = 0;  // Fill calls in progress
  size_t pointer_bytes_ = 0;
};

absl::StatusOr<int32_t> SchemaCompiler::Reference(const std::string& ref,
                                                  const std::string& pointer) {
  std::string target;
  if (ref == "#") {
    target = "";
  } else if (ref.starts_with("#/$defs/") || ref.starts_with("#/definitions/")) {
    target = ref.substr(1);
  } else {
    return Invalid(pointer, absl::StrCat("$ref \"", ref,
                                         "\" is not supported: only \"#\", \"#/$defs/NAME\" and "
                                         "\"#/definitions/NAME\" in this schema"));
  }
  if (const auto it = by_reference_.find(target); it != by_reference_.end()) return it->second;
  const json* found = nullptr;
  try {
    found = &root_.at(json::json_pointer(target));
  } catch (const json::exception&) {
    return Invalid(pointer, absl::StrCat("$ref \"", ref, "\": no such schema"));
  }
  // Registered before it is compiled, so that a reference back to it (recursion) finds it.
  const int32_t index = NewNode(target);
  by_reference_[target] = index;
  if (absl::Status filled = Fill(index, *found, target); !filled.ok()) return filled;
  return index;
}

absl::Status SchemaCompiler::Fill(int32_t index, const json& schema, const std::string& pointer) {
  // Compiling recurses into a schema's parts: bounded, as the nodes' count is.
  if (nesting_ >= kMaxNesting) {
    return Invalid(pointer, absl::StrCat("nested more than ", kMaxNesting, " schemas deep"));
  }
  if (out->nodes_.size() > kMaxNodes) {
    return Invalid(pointer, absl::StrCat("more than ", kMaxNodes, " schemas in all"));
  }
  ++nesting_;
  absl::Status filled = FillNested(index, schema, pointer);
  --nesting_;
  return filled;
}

absl::Status SchemaCompiler::FillNested(int32_t index, const json& schema,
                                        const std::string& pointer) {
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) return Invalid(pointer, "the schema false admits no value");
    At(index).any = true;
    At(index).types = kAllJsonTypes;
    return absl::OkStatus();
  }
  if (!schema.is_object()) return Invalid(pointer, "a schema must be an object or a boolean");
  bool constrains = false;
  for (const auto& [key, value] : schema.items()) {
    if (OneOf(key, kAnnotations)) continue;
    if (!OneOf(key, kSupported)) {
      return Invalid(pointer,
                     absl::StrCat("\"", key,
                                  "\" is not supported (supported: type, enum, const, properties, "
                                  "required, additionalProperties, items, prefixItems, "
                                  "additionalItems, minItems, maxItems, minLength, maxLength, "
                                  "pattern, minimum, maximum, exclusiveMinimum, "
                                  "exclusiveMaximum, multipleOf, anyOf, oneOf, allOf of one "
                                  "schema, $ref, and annotations)"));
    }
    constrains = true;
  }
  // A reference, a union or a one-schema allOf stands alone (annotations aside).
  for (const char* alone : {"$ref", "anyOf", "oneOf", "allOf"}) {
    if (!schema.contains(alone)) continue;
    for (const auto& [key, value] : schema.items()) {
      if (key != alone && OneOf(key, kSupported)) {
        return Invalid(pointer, absl::StrCat("\"", alone, "\" beside \"", key,
                                             "\" is not supported: put the constraints in "
                                             "one place"));
      }
    }
    const std::string here = absl::StrCat(pointer, "/", alone);
    if (std::string_view(alone) == "$ref") {
      if (!schema["$ref"].is_string()) return Invalid(here, "$ref must be a string");
      absl::StatusOr<int32_t> target = Reference(schema["$ref"].get<std::string>(), here);
      if (!target.ok()) return target.status();
      At(index).branches = {*target};
      return absl::OkStatus();
    }
    const json& list = schema[alone];
    if (!list.is_array() || list.empty()) return Invalid(here, "must be a non-empty array");
    if (std::string_view(alone) == "allOf" && list.size() != 1) {
      return Invalid(here, "an allOf of more than one schema is not supported");
    }
    absl::StatusOr<std::vector<int32_t>> branches = CompileEach(list, here);
    if (!branches.ok()) return branches.status();
    At(index).branches = *std::move(branches);
    if (std::string_view(alone) == "oneOf") {
      if (one_of_.size() <= static_cast<size_t>(index)) one_of_.resize(static_cast<size_t>(index) + 1);
      one_of_[static_cast<size_t>(index)] = 1;
    }
    return absl::OkStatus();
  }
  if (!constrains) {
    At(index).any = true;
    At(index).types = kAllJsonTypes;
    return absl::OkStatus();
  }

  uint8_t types = 0;
  const bool typed = schema.contains("type");
  if (typed) {
    const json& type = schema["type"];
    std::vector<json> names = type.is_array() ? type.get<std::vector<json>>() : std::vector<json>{type};
    if (names.empty()) return Invalid(pointer + "/type", "must name at least one type");
    for (const json& name : names) {
      const std::string text = name.is_string() ? name.get<std::string>() : "";
      const uint8_t bit = text == "object"    ? kTypeObject
                          : text == "array"   ? kTypeArray
                          : text == "string"  ? kTypeString
                          : text == "integer" ? kTypeInteger
                          : text == "number"  ? kTypeNumber
                          : text == "boolean" ? kTypeBoolean
                          : text == "null"    ? kTypeNull
                                              : 0;
      if (bit == 0) {
        return Invalid(pointer + "/type",
                       absl::StrCat(name.dump(), " is not a JSON Schema type (object, array, "
                                                 "string, integer, number, boolean, null)"));
      }
      types |= bit;
    }
  } else {
    // No "type": the types its keywords are for (a schema with "properties" describes an
    // object), all of them when it has none of those.
    for (const std::string_view key : kObjectKeywords) {
      if (schema.contains(key)) types |= kTypeObject;
    }
    for (const std::string_view key : kArrayKeywords) {
      if (schema.contains(key)) types |= kTypeArray;
    }
    for (const std::string_view key : kStringKeywords) {
      if (schema.contains(key)) types |= kTypeString;
    }
    if (schema.contains("pattern")) types |= kTypeString;
    for (const std::string_view key : kBoundKeywords) {
      if (schema.contains(key)) types |= kTypeInteger | kTypeNumber;
    }
    if (schema.contains("multipleOf")) types |= kTypeInteger | kTypeNumber;
    if (types == 0) types = kAllJsonTypes;
  }
  At(index).types = types;
  if (schema.contains("enum") || schema.contains("const")) {
    return FillEnum(index, schema, pointer, typed);
  }
  if ((types & kTypeObject) != 0) {
    if (absl::Status filled = FillObject(index, schema, pointer); !filled.ok()) return filled;
  }
  if ((types & kTypeArray) != 0) {
    if (absl::Status filled = FillArray(index, schema, pointer); !filled.ok()) return filled;
  }
  if (absl::Status filled = FillLength(index, schema, pointer); !filled.ok()) return filled;
  if (absl::Status filled = FillBounds(index, schema, pointer); !filled.ok()) return filled;
  if (absl::Status filled = FillMultiple(index, schema, pointer); !filled.ok()) return filled;
  for (const std::string_view key : kObjectKeywords) {
    if ((types & kTypeObject) == 0 && schema.contains(key)) {
      return Invalid(
          pointer, absl::StrCat("\"", std::string(key), "\" on a schema whose type has no object"));
    }
  }
  for (const std::string_view key : kArrayKeywords) {
    if ((types & kTypeArray) == 0 && schema.contains(key)) {
      return Invalid(
          pointer, absl::StrCat("\"", std::string(key), "\" on a schema whose type has no array"));
    }
  }
  return absl::OkStatus();
}

absl::Status SchemaCompiler::FillObject(int32_t index, const json& schema,
                                        const std::string& pointer) {
  if (schema.contains("properties")) {
    const json& properties = schema["properties"];
    if (!properties.is_object()) return Invalid(pointer + "/properties", "must be an object");
    if (properties.size() > 64) {
      return Invalid(pointer + "/properties",
                     absl::StrCat(properties.size(), " properties: at most 64 an object"));
    }
    for (const auto& [name, property] : properties.items()) {
      // The key's place as a JSON pointer escapes '~' and '/'.
      std::string escaped;
      for (const char c : name) {
        escaped += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
      }
      absl::StatusOr<int32_t> node =
          Compile(property, absl::StrCat(pointer, "/properties/", escaped));
      if (!node.ok()) return node.status();
      SchemaNode& n = At(index);
      const auto i = static_cast<int32_t>(n.property_names.size());
      n.property_names.push_back(name);
      n.property_nodes.push_back(*node);
      // As JSON writes the name, without its quotes: what a key's bytes are matched to.
      const std::string written = json(name).dump();
      n.keys.Insert(std::string_view(written).substr(1, written.size() - 2), i);
    }
  }
  if (schema.contains("required")) {
    const json& required = schema["required"];
    if (!required.is_array()) return Invalid(pointer + "/required", "must be an array of names");
    for (const json& name : required) {
      SchemaNode& n = At(index);
      const auto it = name.is_string()
                          ? std::find(n.property_names.begin(), n.property_names.end(),
                                      name.get<std::string>())
                          : n.property_names.end();
      if (it == n.property_names.end()) {
        return Invalid(pointer + "/required",
                       absl::StrCat(name.dump(), " is not one of the declared properties"));
      }
      n.required |= uint64_t{1} << (it - n.property_names.begin());
    }
  }
  if (!schema.contains("additionalProperties") || schema["additionalProperties"] == json(true)) {
    const int32_t any = AnyNode();
    At(index).additional = any;
  } else if (schema["additionalProperties"] != json(false)) {
    absl::StatusOr<int32_t> node =
        Compile(schema["additionalProperties"], pointer + "/additionalProperties");
    if (!node.ok()) return node.status();
    At(index).additional = *node;
  }
  return absl::OkStatus();
}

absl::Status SchemaCompiler::FillArray(int32_t index, const json& schema,
                                       const std::string& pointer) {
  // A tuple: prefixItems (2020-12, what Pydantic writes for tuple[int, str]) or, in the
  // drafts before, items as an array; the items after it are then items' (2020-12) or
  // additionalItems' (the drafts). Without a tuple, additionalItems constrains nothing.
  const bool draft_tuple = schema.contains("items") && schema["items"].is_array();
  if (draft_tuple && schema.contains("prefixItems")) {
    return Invalid(pointer, "\"prefixItems\" beside \"items\" as an array: give the tuple once");
  }
  const char* tuple_key = draft_tuple                      ? "items"
                          : schema.contains("prefixItems") ? "prefixItems"
                                                           : nullptr;
  if (tuple_key != nullptr) {
    const json& tuple = schema[tuple_key];
    const std::string here = absl::StrCat(pointer, "/", tuple_key);
    if (!tuple.is_array() || tuple.empty()) {
      return Invalid(here, "must be a non-empty array of schemas");
    }
    absl::StatusOr<std::vector<int32_t>> prefix = CompileEach(tuple, here);
    if (!prefix.ok()) return prefix.status();
    At(index).prefix_items = *std::move(prefix);
  }
  const char* rest_key = draft_tuple ? "additionalItems" : "items";
  if (!schema.contains(rest_key)) {
    const int32_t any = AnyNode();
    At(index).items = any;
  } else if (schema[rest_key] == json(false)) {
    At(index).items = SchemaNode::kNone;  // nothing past the tuple (none at all without one)
  } else {
    absl::StatusOr<int32_t> node = Compile(schema[rest_key], absl::StrCat(pointer, "/", rest_key));
    if (!node.ok()) return node.status();
    At(index).items = *node;
  }
  for (const char* key : {"minItems", "maxItems"}) {
    if (!schema.contains(key)) continue;
    absl::StatusOr<int64_t> count = Count(schema[key], absl::StrCat(pointer, "/", key));
    if (!count.ok()) return count.status();
    (std::string_view(key) == "minItems" ? At(index).min_items : At(index).max_items) = *count;
  }
  const SchemaNode& n = At(index);
  if (n.max_items >= 0 && n.min_items > n.max_items) {
    return Invalid(pointer, absl::StrCat("minItems ", n.min_items, " > maxItems ", n.max_items));
  }
  return absl::OkStatus();
}

absl::Status SchemaCompiler::FillLength(int32_t index, const json& schema,
                                        const std::string& pointer) {
  SchemaNode& n = At(index);
  for (const std::string_view key : kStringKeywords) {
    if (!schema.contains(key)) continue;
    const std::string here = absl::StrCat(pointer, "/", std::string(key));
    if ((n.types & kTypeString) == 0) {
      return Invalid(pointer, absl::StrCat("\"", std::string(key), "\" on a schema whose type has no string"));
    }
    absl::StatusOr<int64_t> count = Count(schema[std::string(key)], here);
    if (!count.ok()) return count.status();
    (key == "minLength" ? n.min_length : n.max_length) = *count;
  }
  if (n.max_length >= 0 && n.min_length > n.max_length) {
    return Invalid(pointer,
                   absl::StrCat("minLength ", n.min_length, " > maxLength ", n.max_length));
  }
  std::shared_ptr<const StringPattern> pattern;
  std::string here = pointer + "/pattern";
  if (schema.contains("pattern")) {
    if ((n.types & kTypeString) == 0) {
      return Invalid(pointer, "\"pattern\" on a schema whose type has no string");
    }
    if (!schema["pattern"].is_string()) return Invalid(here, "must be a string");
    absl::StatusOr<std::shared_ptr<const StringPattern>> compiled =
        StringPattern::Compile(schema["pattern"].get<std::string>());
    if (!compiled.ok()) return Invalid(here, std::string(compiled.status().message()));
    pattern = *std::move(compiled);
  }
  // A format of strings constrains only a string; one unknown here (or of numbers, as
  // OpenAPI's "int64") stays an annotation.
  bool shared_format = false;
  const auto format = schema.find("format");
  if (format != schema.end() && format->is_string() && (n.types & kTypeString) != 0) {
    std::shared_ptr<const StringPattern> known =
        StringPattern::Format(format->get_ref<const std::string&>());
    if (known != nullptr && pattern == nullptr) {
      pattern = std::move(known);
      shared_format = true;
      here = pointer + "/format";
    } else if (known != nullptr) {
      absl::StatusOr<std::shared_ptr<const StringPattern>> both =
          StringPattern::Intersect(*pattern, *known);
      if (!both.ok()) return Invalid(pointer, std::string(both.status().message()));
      pattern = *std::move(both);
    }
  }
  if (pattern == nullptr) return absl::OkStatus();
  // A format's own automaton is compiled once for every schema: only what this schema
  // compiles counts against its budget.
  if (!shared_format) pattern_states_ += pattern->states();
  if (pattern_states_ > kMaxPatternStates) {
    return Invalid(here, absl::StrCat("the schema's patterns have more than ",
                                      kMaxPatternStates, " automaton states in all"));
  }
  if (n.limits_length()) {
    absl::StatusOr<std::shared_ptr<const PatternLengths>> lengths =
        PatternLengths::Compile(*pattern, n.min_length, n.max_length);
    if (!lengths.ok()) return Invalid(pointer, std::string(lengths.status().message()));
    length_bytes_ += (*lengths)->memory_bytes();
    if (length_bytes_ > kMaxLengthBytes) {
      return Invalid(pointer, absl::StrCat("the schema's patterns beside lengths take more than ",
                                           kMaxLengthBytes >> 20, " MiB in all"));
    }
    n.pattern_lengths = *std::move(lengths);
  }
  n.pattern = std::move(pattern);
  return absl::OkStatus();
}

absl::Status SchemaCompiler::FillBounds(int32_t index, const json& schema,
                                        const std::string& pointer) {
  SchemaNode& n = At(index);
  if ((n.types & kTypeNumber) != 0) return FillNumberBounds(index, schema, pointer);
  for (const std::string_view key : kBoundKeywords) {
    if (!schema.contains(key)) continue;
    const std::string here = absl::StrCat(pointer, "/", std::string(key));
    if ((n.types & kTypeInteger) == 0) {
      return Invalid(pointer, absl::StrCat("\"", std::string(key), "\" on a schema whose type has no integer"));
    }
    const json& value = schema[std::string(key)];
    if (!value.is_number()) return Invalid(here, "must be a number");
    // The integer next to the bound inside, as a double first: every integer a double can
    // be that lies within int64 is exact, and beyond it no bound is supported.
    const bool lower = key == "minimum" || key == "exclusiveMinimum";
    const bool exclusive = key.starts_with("exclusive");
    int64_t bound = 0;
    if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX}) {
      return Invalid(here, "must lie within 64-bit integers");
    }
    if (value.is_number_integer()) {
      bound = value.get<int64_t>();
      if (exclusive && bound == (lower ? INT64_MAX : INT64_MIN)) {
        return Invalid(here, "no 64-bit integer lies beyond it");
      }
      if (exclusive) bound += lower ? 1 : -1;
    } else {
      const double v = value.get<double>();
      const double inside = lower ? (exclusive ? std::floor(v) + 1 : std::ceil(v))
                                  : (exclusive ? std::ceil(v) - 1 : std::floor(v));
      // 2^63 is the first double past INT64_MAX.
      if (!std::isfinite(inside) || inside < -9223372036854775808.0 ||
          inside >= 9223372036854775808.0) {
        return Invalid(here, "must lie within 64-bit integers");
      }
      bound = static_cast<int64_t>(inside);
    }
    if (lower) {
      n.minimum = n.has_minimum ? std::max(n.minimum, bound) : bound;
      n.has_minimum = true;
    } else {
      n.maximum = n.has_maximum ? std::min(n.maximum, bound) : bound;
      n.has_maximum = true;
    }
  }
  if (n.has_minimum && n.has_maximum && n.minimum > n.maximum) {
    return Invalid(pointer, absl::StrCat("no integer is at least ", n.minimum, " and at most ",
                                         n.maximum));
  }
  // The grammar compares an integer's digits with these, exactly.
  if (n.has_minimum) {
    n.number_minimum = DecimalOf(absl::StrCat(n.minimum), static_cast<double>(n.minimum));
  }
  if (n.has_maximum) {
    n.number_maximum = DecimalOf(absl::StrCat(n.maximum), static_cast<double>(n.maximum));
  }
  return absl::OkStatus();
}

absl::Status SchemaCompiler::FillNumberBounds(int32_t index, const json& schema,
                                              const std::string& pointer) {
  SchemaNode& n = At(index);
  for (const std::string_view key : kBoundKeywords) {
    if (!schema.contains(key)) continue;
    const std::string here = absl::StrCat(pointer, "/", std::string(key));
    const json& given = schema[std::string(key)];
    if (!given.is_number()) return Invalid(here, "must be a number");
    const double value = given.get<double>();
    // Beyond it the fixed-point decimals grow long, and a number with an exponent is not
    // taken where bounds apply.
    constexpr double kLargest = 1e300;
    if (!std::isfinite(value) || std::abs(value) > kLargest) {
      return Invalid(here, "must lie within +-1e300");
    }
    const bool lower = key == "minimum" || key == "exclusiveMinimum";
    double inside = value;
    if (key.starts_with("exclusive")) {
      inside = std::nextafter(value, lower ? HUGE_VAL : -HUGE_VAL);
    }
    SchemaNode::DecimalBound& bound = lower ? n.number_minimum : n.number_maximum;
    if (bound.set && (lower ? inside <= bound.value : inside >= bound.value)) continue;
    // The shortest fixed-point decimal that reads back as this double: every decimal at
    // or past it reads as a double at or past it (rounding keeps order), and so does every
    // double's own shortest decimal.
    char text[400];
    const auto written = std::to_chars(text, text + sizeof(text), inside, std::chars_format::fixed);
    if (written.ec != std::errc()) return Invalid(here, "cannot be written as a decimal");
    bound = DecimalOf(std::string_view(text, static_cast<size_t>(written.ptr - text)), inside);
  }
  if (n.number_minimum.set && n.number_maximum.set &&
      n.number_minimum.value > n.number_maximum.value) {
    const auto text = [](const SchemaNode::DecimalBound& bound) {
      return absl::StrCat(bound.negative ? "-" : "", bound.integer,
                          bound.fraction.empty() ? "" : ".", bound.fraction);
    };
    return Invalid(pointer, absl::StrCat("no number is at least ", text(n.number_minimum),
                                         " and at most ", text(n.number_maximum)));
  }
  return absl::OkStatus();
}

absl::Status SchemaCompiler::FillMultiple(int32_t index, const json& schema,
                                          const std::string& pointer) {
  if (!schema.contains("multipleOf")) return absl::OkStatus();
  SchemaNode& n = At(index);
  const std::string here = pointer + "/multipleOf";
  if ((n.types & (kTypeInteger | kTypeNumber)) == 0) {
    return Invalid(pointer, "\"multipleOf\" on a schema whose type has no number");
  }
  const json& value = schema["multipleOf"];
  if (!value.is_number()) return Invalid(here, "must be a number");
  // A whole number: its multiples are integers, which the grammar reads digit by digit.
  // 2^53: every such double is exact, and within bounds of +-2^53 (below) a magnitude times
  // 10 fits 64 bits.
  constexpr double kLargest = 9007199254740992.0;
  const double k = value.get<double>();
  if (!(k > 0)) return Invalid(here, "must be greater than 0");
  if (k != std::floor(k) || k > kLargest) {
    return Invalid(here,
                   "only a whole number from 1 to 2^53 is supported (not a fraction such "
                   "as 0.01)");
  }
  if ((n.types & kTypeNumber) != 0 && n.bounds_numbers()) {
    return Invalid(pointer,
                   "\"multipleOf\" beside bounds on a \"number\" is not supported: "
                   "give \"type\": \"integer\"");
  }
  n.multiple_of = static_cast<int64_t>(k);
  // Its numbers are written within +-2^53 (RFC 7493's exact range): past it a parser reads
  // them as doubles, which need not be multiples any more (-39914045848941250377524868 is
  // one of 9; the double nearest it is not).
  constexpr int64_t kExact = int64_t{1} << 53;
  if (!n.has_minimum || n.minimum < -kExact) {
    n.has_minimum = true;
    n.minimum = -kExact;
  }
  if (!n.has_maximum || n.maximum > kExact) {
    n.has_maximum = true;
    n.maximum = kExact;
  }
  // The grammar compares the digits with these (a "number" here has no bounds of its own).
  n.number_minimum = DecimalOf(absl::StrCat(n.minimum), static_cast<double>(n.minimum));
  n.number_maximum = DecimalOf(absl::StrCat(n.maximum), static_cast<double>(n.maximum));
  {
    // The first multiple at or above the minimum (division truncates toward zero).
    const __int128 low = n.minimum;
    __int128 first = low / n.multiple_of * n.multiple_of;
    if (first < low) first += n.multiple_of;
    if (first > n.maximum) {
      return Invalid(pointer, absl::StrCat("no multiple of ", n.multiple_of, " is at least ",
                                           n.minimum, " and at most ", n.maximum));
    }
  }
  return absl::OkStatus();
}

absl::Status SchemaCompiler::FillEnum(int32_t index, const json& schema,
                                      const std::string& pointer, bool typed) {
  if (schema.contains("enum") && schema.contains("const")) {
    return Invalid(pointer, "\"enum\" beside \"const\": give one");
  }
  const std::string key = schema.contains("enum") ? "enum" : "const";
  std::vector<json> values;
  if (key == "enum") {
    if (!schema["enum"].is_array() || schema["enum"].empty()) {
      return Invalid(pointer + "/enum", "must be a non-empty array");
    }
    values = schema["enum"].get<std::vector<json>>();
  } else {
    values = {schema["const"]};
  }
  SchemaNode& n = At(index);
  const uint8_t declared = typed ? n.types : kAllJsonTypes;
  n.types = 0;
  for (const json& value : values) {
    if ((TypesOfValue(value) & declared) == 0) continue;  // of another type: never valid
    const std::string text = value.dump();
    if (n.enum_trie.Find(text) >= 0) continue;  // written twice
    n.types |= ClassesOf(TypesOfValue(value));
    n.enum_trie.Insert(text, static_cast<int32_t>(n.enum_texts.size()));
    n.enum_texts.push_back(text);
  }
  if (n.enum_texts.empty()) {
    return Invalid(absl::StrCat(pointer, "/", std::string(key)), "no value is of the schema's type");
  }
  n.enum_types = n.types;
  using Keywords = std::span<const std::string_view>;
  for (const Keywords keywords :
       {Keywords(kObjectKeywords), Keywords(kArrayKeywords), Keywords(kStringKeywords),
        Keywords(kPatternKeywords), Keywords(kBoundKeywords), Keywords(kMultipleKeywords)}) {
    for (const std::string_view other : keywords) {
      if (schema.contains(other)) {
        return Invalid(pointer, absl::StrCat("\"", std::string(other), "\" beside \"", key,
                                             "\" is not supported"));
      }
    }
  }
  return absl::OkStatus();
}

// A union's types are its branches'. Post-order, a branch finished first: a union of more
// than one branch is then rewritten by Overlap. state: 0 unvisited, 1 in progress, 2 done.
absl::Status SchemaCompiler::UnionTypes(int32_t node, std::vector<uint8_t>& state) {
  const auto at = static_cast<size_t>(node);
  if (at >= state.size() || state[at] == 2 || At(node).branches.empty()) {
    return absl::OkStatus();  // done, no union, or an overlap node made here
  }
  if (state[at] == 1) {
    return Invalid(pointers_[at], "refers back to itself with no object or array in between");
  }
  state[at] = 1;
  const std::vector<int32_t> branches = At(node).branches;
  for (const int32_t branch : branches) {
    if (absl::Status done = UnionTypes(branch, state); !done.ok()) return done;
    const SchemaNode& b = At(branch);
    At(node).types |= b.any ? kAllJsonTypes : b.types;
  }
  if (branches.size() == 1) {
    if (alias_.size() < out->nodes_.size()) alias_.resize(out->nodes_.size(), SchemaNode::kNone);
    alias_[at] = Resolved(branches[0]);
  } else if (absl::Status overlapped = Overlap(node); !overlapped.ok()) {
    return overlapped;
  }
  union_order_.push_back(node);
  state[at] = 2;
  return absl::OkStatus();
}

absl::Status SchemaCompiler::Overlap(int32_t node) {
  // A copy: NewNode below grows pointers_.
  const std::string pointer = pointers_[static_cast<size_t>(node)];
  // What a value may be of: the branches' own nodes, a union's (already rewritten) branches
  // and an overlap's members in their place, once each.
  std::vector<int32_t> candidates;
  const auto add = [&](int32_t candidate) {
    if (std::find(candidates.begin(), candidates.end(), candidate) == candidates.end()) {
      candidates.push_back(candidate);
    }
  };
  for (const int32_t branch : std::vector<int32_t>(At(node).branches)) {
    const int32_t resolved = Resolved(branch);
    const std::vector<int32_t> parts =
        At(resolved).branches.empty() ? std::vector<int32_t>{resolved} : At(resolved).branches;
    for (const int32_t part : parts) {
      if (At(part).members.empty()) {
        add(part);
      } else {
        for (const int32_t member : At(part).members) add(member);
      }
    }
  }
  for (const int32_t candidate : candidates) {
    if (At(candidate).any && candidates.size() > 1) {
      return Invalid(pointer, "a branch takes any value beside other branches: give it alone");
    }
  }
  const bool one_of = static_cast<size_t>(node) < one_of_.size() && one_of_[static_cast<size_t>(node)] != 0;
  std::vector<int32_t> overlaps;
  std::vector<int32_t> singles;
  for (const uint8_t type : {kTypeObject, kTypeArray, kTypeString, kTypeNumber, kTypeBoolean,
                             kTypeNull}) {
    std::vector<int32_t> of;
    for (const int32_t candidate : candidates) {
      if ((ClassesOf(At(candidate).types) & type) != 0) of.push_back(candidate);
    }
    if (of.empty()) continue;
    int32_t single = of.size() == 1 ? of[0] : SchemaNode::kNone;
    if (single == SchemaNode::kNone && type == kTypeNumber) {
      // A number has no byte that ends it, so two readings could end apart: only plain
      // numbers overlap, an "integer" and a "number" as the number (Pydantic's
      // Union[int, float]).
      for (const int32_t candidate : of) {
        const SchemaNode& c = At(candidate);
        if (!c.enum_texts.empty() || c.bounds_integers() || c.bounds_numbers() ||
            c.multiple_of > 0) {
          return Invalid(pointer,
                         absl::StrCat("branches take numbers both, one of them with bounds, a "
                                      "multipleOf or values (",
                                      pointers_[static_cast<size_t>(candidate)],
                                      "): only plain \"integer\" and \"number\" branches may "
                                      "overlap"));
        }
        if (single == SchemaNode::kNone || (c.types & kTypeNumber) != 0) single = candidate;
      }
    }
    if (single != SchemaNode::kNone) {
      if (std::find(singles.begin(), singles.end(), single) == singles.end()) {
        singles.push_back(single);
      }
      continue;
    }
    if (of.size() > static_cast<size_t>(CompiledSchema::kMaxAlternatives)) {
      return Invalid(pointer, absl::StrCat(of.size(), " branches take ", TypeNames(type),
                                           ": at most ", CompiledSchema::kMaxAlternatives,
                                           " of one type"));
    }
    const std::vector<int32_t> first_keys = type == kTypeObject ? Discriminator(of) : std::vector<int32_t>{};
    if (one_of && first_keys.empty()) {
      for (size_t i = 0; i < of.size(); ++i) {
        for (size_t j = i + 1; j < of.size(); ++j) {
          if (!Disjoint(of[i], of[j])) {
            return Invalid(pointer, absl::StrCat(
                "oneOf's branches ", pointers_[static_cast<size_t>(of[i])], " and ",
                pointers_[static_cast<size_t>(of[j])], " may both take a value (", TypeNames(type),
                "): tell them apart by a required property with different \"const\" "
                "values in each (a discriminator), or use anyOf"));
          }
        }
      }
    }
    const int32_t overlap = NewNode(pointer);
    At(overlap).members = std::move(of);
    At(overlap).first_keys = first_keys;
    At(overlap).types = type;
    union_order_.push_back(overlap);
    overlaps.push_back(overlap);
  }
  // Overlaps first: ForType takes the first branch of a type, and a single may take more than
  // one type (an object or null) where an overlap takes one of them.
  overlaps.insert(overlaps.end(), singles.begin(), singles.end());
  At(node).branches = std::move(overlaps);
  return absl::OkStatus();
}

const std::vector<json>* SchemaCompiler::EnumValues(int32_t node) {
  const int32_t resolved = Resolved(node);
  const SchemaNode& n = At(resolved);
  if (!n.branches.empty() || !n.members.empty() || n.enum_texts.empty()) return nullptr;
  auto [it, added] = enum_values_.try_emplace(resolved);
  if (added) {
    for (const std::string& text : n.enum_texts) it->second.push_back(json::parse(text));
    std::sort(it->second.begin(), it->second.end());
  }
  return &it->second;
}

namespace {

// Whether two enums (sorted) share no value; false where either is no enum. A merge: the
// pairs of a oneOf's members cost their values' count, not its square.
bool ValuesApart(const std::vector<json>* x, const std::vector<json>* y) {
  if (x == nullptr || y == nullptr) return false;
  auto a = x->begin();
  auto b = y->begin();
  while (a != x->end() && b != y->end()) {
    if (*a == *b) return false;
    if (*a < *b) {
      ++a;
    } else {
      ++b;
    }
  }
  return true;
}

int32_t RequiredProperty(const SchemaNode& node, const std::string& name) {
  for (size_t i = 0; i < node.property_names.size(); ++i) {
    if (node.property_names[i] == name && (node.required >> i & 1u) != 0) {
      return static_cast<int32_t>(i);
    }
  }
  return SchemaNode::kNone;
}

}  // namespace

bool SchemaCompiler::Disjoint(int32_t a, int32_t b) {
  if (ValuesApart(EnumValues(a), EnumValues(b))) return true;
  const SchemaNode& x = At(a);
  const SchemaNode& y = At(b);
  for (size_t i = 0; i < x.property_names.size(); ++i) {
    if ((x.required >> i & 1u) == 0) continue;
    const int32_t j = RequiredProperty(y, x.property_names[i]);
    if (j != SchemaNode::kNone &&
        ValuesApart(EnumValues(x.property_nodes[i]),
                    EnumValues(y.property_nodes[static_cast<size_t>(j)]))) {
      return true;
    }
  }
  return false;
}

std::vector<int32_t> SchemaCompiler::Discriminator(const std::vector<int32_t>& members) {
  const SchemaNode& first = At(members[0]);
  if (!first.enum_texts.empty()) return {};
  for (size_t p = 0; p < first.property_names.size(); ++p) {
    const std::string& name = first.property_names[p];
    std::vector<int32_t> indices;
    for (const int32_t member : members) {
      const SchemaNode& m = At(member);
      const int32_t index = m.enum_texts.empty() ? RequiredProperty(m, name) : SchemaNode::kNone;
      if (index == SchemaNode::kNone ||
          EnumValues(m.property_nodes[static_cast<size_t>(index)]) == nullptr) {
        break;
      }
      indices.push_back(index);
    }
    if (indices.size() != members.size()) continue;
    bool apart = true;
    for (size_t i = 0; i < members.size() && apart; ++i) {
      for (size_t j = i + 1; j < members.size() && apart; ++j) {
        apart = ValuesApart(
            EnumValues(At(members[i]).property_nodes[static_cast<size_t>(indices[i])]),
            EnumValues(At(members[j]).property_nodes[static_cast<size_t>(indices[j])]));
      }
    }
    if (apart) return indices;
  }
  return {};
}

absl::Status SchemaCompiler::AlternativesWithinBounds(int32_t root) {
  // The most readings a value of each node may keep alive, with d more nested objects and
  // arrays allowed: an object's or array's most of what it holds with d - 1; an overlap's
  // members' sum (with a discriminator, written first, its members' count or their most); a
  // union's most of its branches'; 1 for anything else. An overestimate (every property at
  // once, every member surviving), capped past the limit.
  constexpr int32_t kCap = CompiledSchema::kMaxAlternatives + 1;
  const size_t count = out->nodes_.size();
  std::vector<int32_t> below(count, 1);
  std::vector<int32_t> here(count, 1);
  for (int32_t d = 1; d <= CompiledSchema::kMaxDepth; ++d) {
    for (size_t i = 0; i < count; ++i) {
      const SchemaNode& n = out->nodes_[i];
      int32_t most = 1;
      if (n.branches.empty() && n.members.empty() && !n.any && n.enum_texts.empty()) {
        for (const int32_t property : n.property_nodes) {
          most = std::max(most, below[static_cast<size_t>(property)]);
        }
        if (n.additional != SchemaNode::kNone) {
          most = std::max(most, below[static_cast<size_t>(n.additional)]);
        }
        if (n.items != SchemaNode::kNone) most = std::max(most, below[static_cast<size_t>(n.items)]);
        for (const int32_t item : n.prefix_items) {
          most = std::max(most, below[static_cast<size_t>(item)]);
        }
      }
      here[i] = most;
    }
    // Overlaps and unions after what they hold.
    for (const int32_t node : union_order_) {
      const SchemaNode& n = At(node);
      int32_t most = n.members.empty() ? 1 : 0;
      for (const int32_t member : n.members) {
        most = n.first_keys.empty() ? std::min(kCap, most + here[static_cast<size_t>(member)])
                                    : std::max(most, here[static_cast<size_t>(member)]);
      }
      if (!n.first_keys.empty()) {
        most = std::min(kCap, std::max(most, static_cast<int32_t>(n.members.size())));
      }
      for (const int32_t branch : n.branches) {
        most = std::max(most, here[static_cast<size_t>(branch)]);
      }
      here[static_cast<size_t>(node)] = most;
    }
    std::swap(below, here);
  }
  if (below[static_cast<size_t>(root)] > CompiledSchema::kMaxAlternatives) {
    return Invalid("", absl::StrCat("its unions of objects (or arrays, strings) of one type, "
                                    "nested in one another, could hold more than ",
                                    CompiledSchema::kMaxAlternatives,
                                    " readings of a value at once: give fewer branches, or "
                                    "tell a union's objects apart by a property each requires, "
                                    "of different \"const\" values (a discriminator)"));
  }
  return absl::OkStatus();
}

absl::Status SchemaCompiler::Finish(int32_t root) {
  const size_t compiled = out->nodes_.size();
  std::vector<uint8_t> state(compiled, 0);
  alias_.assign(compiled, SchemaNode::kNone);
  for (size_t i = 0; i < compiled; ++i) {
    if (absl::Status done = UnionTypes(static_cast<int32_t>(i), state); !done.ok()) return done;
  }
  // The fewest nested objects and arrays each node's values need, relaxed over a worklist: a
  // node is recomputed when one it depends on gets lower. Depths past kMaxDepth are all "too
  // deep" (kTooDeep), so a node gets lower at most kTooDeep + 1 times, and a long chain of
  // $refs costs linear time (passes until nothing changed were quadratic: 0.7 s for a 256 KB
  // chain written last to first).
  constexpr int32_t kInf = SchemaNode::kUnreachable;
  constexpr int32_t kTooDeep = CompiledSchema::kMaxDepth + 1;
  const size_t count = out->nodes_.size();
  std::vector<std::vector<int32_t>> dependents(count);
  for (size_t i = 0; i < count; ++i) {
    const SchemaNode& n = out->nodes_[i];
    const auto depends_on = [&](int32_t on) {
      dependents[static_cast<size_t>(on)].push_back(static_cast<int32_t>(i));
    };
    for (const int32_t branch : n.branches) depends_on(branch);
    for (const int32_t member : n.members) depends_on(member);
    for (size_t p = 0; p < n.property_nodes.size(); ++p) {
      if ((n.required >> p & 1u) != 0) depends_on(n.property_nodes[p]);
    }
    if (n.items != SchemaNode::kNone) depends_on(n.items);
    for (const int32_t item : n.prefix_items) depends_on(item);
  }
  const auto depth_of = [&](int32_t node) { return At(node).min_depth; };
  const auto deeper = [&](int32_t depth) { return std::min(kInf, 1 + depth); };
  // Last first: a schema's parts are compiled after it, so a tree settles in one pass.
  std::vector<int32_t> work(count);
  for (size_t i = 0; i < count; ++i) work[i] = static_cast<int32_t>(i);
  std::vector<uint8_t> queued(count, 1);
  while (!work.empty()) {
    const int32_t node = work.back();
    work.pop_back();
    queued[static_cast<size_t>(node)] = 0;
    SchemaNode& n = At(node);
    int32_t depth = kInf;
    if (n.any || !n.enum_texts.empty() ||
        (n.branches.empty() && n.members.empty() &&
         (n.types & (kTypeString | kTypeInteger | kTypeNumber | kTypeBoolean | kTypeNull)) != 0)) {
      depth = 0;  // a scalar (or an enum's value, which is written whole)
    }
    if (!n.branches.empty() || !n.members.empty()) {
      for (const int32_t branch : n.branches) depth = std::min(depth, depth_of(branch));
      for (const int32_t member : n.members) depth = std::min(depth, depth_of(member));
    } else if (n.enum_texts.empty()) {
      if ((n.types & kTypeObject) != 0) {
        int32_t object = 1;
        for (size_t p = 0; p < n.property_nodes.size(); ++p) {
          if ((n.required >> p & 1u) != 0) {
            object = std::max(object, deeper(depth_of(n.property_nodes[p])));
          }
        }
        n.object_depth = object;
        depth = std::min(depth, object);
      }
      if ((n.types & kTypeArray) != 0) {
        // Its first min_items items: the tuple's, then items'.
        int32_t array = 1;
        const auto tuple = static_cast<int64_t>(n.prefix_items.size());
        for (int64_t i = 0; i < std::min(n.min_items, tuple); ++i) {
          array = std::max(array, deeper(depth_of(n.prefix_items[static_cast<size_t>(i)])));
        }
        if (n.min_items > tuple) {
          array = std::max(array, n.items == SchemaNode::kNone ? kInf : deeper(depth_of(n.items)));
        }
        n.array_depth = array;
        depth = std::min(depth, array);
      }
    }
    if (depth < kInf) depth = std::min(depth, kTooDeep);
    if (depth >= n.min_depth) continue;
    n.min_depth = depth;
    for (const int32_t dependent : dependents[static_cast<size_t>(node)]) {
      if (queued[static_cast<size_t>(dependent)] == 0) {
        queued[static_cast<size_t>(dependent)] = 1;
        work.push_back(dependent);
      }
    }
  }
  const int32_t needed = depth_of(root);
  if (needed > CompiledSchema::kMaxDepth) {
    return Invalid("", needed >= kInf
                           ? "no finite JSON value satisfies the schema (a required property, "
                             "an array's minItems or a union has no value that ends)"
                           : absl::StrCat("its smallest value nests more than the ",
                                          CompiledSchema::kMaxDepth,
                                          " objects and arrays supported"));
  }
  if (absl::Status bounded = AlternativesWithinBounds(root); !bounded.ok()) return bounded;
  out->root_ = root;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const CompiledSchema>> CompiledSchema::Compile(const json& schema) {
  // Before anything walks it recursively (an enum's values are copied and written).
  if (NestedDeeperThan(schema, kMaxJsonNesting)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "at /: nests arrays and objects more than ", kMaxJsonNesting, " deep"));
  }
  SchemaCompiler compiler(schema);
  absl::StatusOr<int32_t> root = compiler.Compile(schema, "");
  if (!root.ok()) return root.status();
  if (absl::Status finished = compiler.Finish(*root); !finished.ok()) return finished;
  return std::shared_ptr<const CompiledSchema>(std::move(compiler.out));
}

size_t CompiledSchema::memory_bytes() const {
  size_t bytes = sizeof(*this) + nodes_.size() * sizeof(SchemaNode);
  for (const SchemaNode& n : nodes_) {
    for (const std::string& name : n.property_names) bytes += name.size() * 2;  // and the trie
    for (const std::string& text : n.enum_texts) bytes += text.size() * 2;
    if (n.pattern != nullptr) bytes += static_cast<size_t>(n.pattern->states()) * 257 * 4;
    if (n.pattern_lengths != nullptr) bytes += n.pattern_lengths->memory_bytes();
    bytes += (n.property_nodes.size() + n.prefix_items.size()) * sizeof(int32_t);
  }
  return bytes;
}

namespace {

// The schemas compiled lately, the last used first.
class SchemaCache {
 public:
  std::shared_ptr<const CompiledSchema> Find(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = index_.find(text);
    if (found == index_.end()) return nullptr;
    entries_.splice(entries_.begin(), entries_, found->second);
    return found->second->schema;
  }
  void Insert(const std::string& text, std::shared_ptr<const CompiledSchema> schema) {
    const size_t bytes = schema->memory_bytes() + text.size() * 2;
    if (bytes > CompiledSchema::kCachedSchemaBytes) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (index_.contains(text)) return;  // another thread's, compiled meanwhile
    entries_.push_front({text, std::move(schema), bytes});
    index_.emplace(text, entries_.begin());
    bytes_ += bytes;
    while (entries_.size() > CompiledSchema::kCachedSchemas ||
           bytes_ > CompiledSchema::kCachedSchemaBytes) {
      bytes_ -= entries_.back().bytes;
      index_.erase(entries_.back().text);
      entries_.pop_back();
    }
  }

 private:
  struct Entry {
    std::string text;
    std::shared_ptr<const CompiledSchema> schema;
    size_t bytes;
  };
  std::mutex mutex_;
  std::list<Entry> entries_;
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
};

SchemaCache& Cache() {
  static auto* cache = new SchemaCache();  // never destroyed: threads may compile at exit
  return *cache;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledSchema>> CompiledSchema::CompileShared(
    const json& schema) {
  if (NestedDeeperThan(schema, kMaxJsonNesting)) return Compile(schema);  // refused, undumped
  const std::string text = schema.dump();
  if (std::shared_ptr<const CompiledSchema> cached = Cache().Find(text)) return cached;
  absl::StatusOr<std::shared_ptr<const CompiledSchema>> compiled = Compile(schema);
  if (compiled.ok()) Cache().Insert(text, *compiled);
  return compiled;
}

bool SchemaAccepts(const CompiledSchema& schema, int32_t node, const json& value) {
  uint8_t type = TypesOfValue(value);
  if (type == 0) return false;
  node = schema.ForType(node, ClassesOf(type));
  if (node == SchemaNode::kNone) return false;
  const SchemaNode& n = schema.node(node);
  if (n.any) return true;
  if (!n.members.empty()) {
    // An overlap: a value of any member (a oneOf's are disjoint, so of exactly one).
    return std::any_of(n.members.begin(), n.members.end(),
                       [&](int32_t member) { return SchemaAccepts(schema, member, value); });
  }
  if (!n.enum_texts.empty()) {
    return std::any_of(n.enum_texts.begin(), n.enum_texts.end(),
                       [&](const std::string& text) { return json::parse(text) == value; });
  }
  if ((type & kTypeNumber) != 0 && (n.types & kTypeNumber) == 0 && (type & kTypeInteger) == 0) {
    return false;  // an integer is wanted, and this has a fraction
  }
  if ((type & kTypeInteger) != 0 && n.bounds_integers()) {
    // Exactly where the value was written as an integer (nlohmann keeps it in 64 bits, signed
    // or not), else as a double (1e3 is an integer too).
    if (value.is_number_integer()) {
      const __int128 v = value.is_number_unsigned() ? __int128{value.get<uint64_t>()}
                                                    : __int128{value.get<int64_t>()};
      if ((n.has_minimum && v < n.minimum) || (n.has_maximum && v > n.maximum)) return false;
    } else {
      const double v = value.get<double>();
      if ((n.has_minimum && v < static_cast<double>(n.minimum)) ||
          (n.has_maximum && v > static_cast<double>(n.maximum))) {
        return false;
      }
    }
  }
  if ((type & kTypeNumber) != 0 && n.multiple_of > 0) {
    if (value.is_number_integer()) {
      const __int128 v = value.is_number_unsigned() ? __int128{value.get<uint64_t>()}
                                                    : __int128{value.get<int64_t>()};
      if (v % n.multiple_of != 0) return false;
    } else {
      const double v = value.get<double>();
      if (!std::isfinite(v) || std::fmod(v, static_cast<double>(n.multiple_of)) != 0) return false;
    }
  }
  if ((type & kTypeNumber) != 0 && (n.types & kTypeNumber) != 0 && n.bounds_numbers()) {
    const double v = value.get<double>();
    if ((n.number_minimum.set && v < n.number_minimum.value) ||
        (n.number_maximum.set && v > n.number_maximum.value)) {
      return false;
    }
  }
  if (value.is_string() && n.pattern != nullptr &&
      !n.pattern->Matches(value.get_ref<const std::string&>())) {
    return false;
  }
  if (value.is_string() && n.limits_length()) {
    const std::string& text = value.get_ref<const std::string&>();
    // Code points: the bytes that begin a UTF-8 sequence.
    const auto length = static_cast<int64_t>(std::count_if(
        text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
    if (length < n.min_length || (n.max_length >= 0 && length > n.max_length)) return false;
  }
  if (value.is_object()) {
    uint64_t seen = 0;
    for (const auto& [key, item] : value.items()) {
      const auto it = std::find(n.property_names.begin(), n.property_names.end(), key);
      if (it != n.property_names.end()) {
        const auto i = it - n.property_names.begin();
        seen |= uint64_t{1} << i;
        if (!SchemaAccepts(schema, n.property_nodes[static_cast<size_t>(i)], item)) return false;
      } else if (n.additional == SchemaNode::kNone ||
                 !SchemaAccepts(schema, n.additional, item)) {
        return false;
      }
    }
    return (n.required & ~seen) == 0;
  }
  if (value.is_array()) {
    const auto size = static_cast<int64_t>(value.size());
    if (size < n.min_items || (n.max_items >= 0 && size > n.max_items)) return false;
    for (size_t i = 0; i < value.size(); ++i) {
      const int32_t item = n.item(static_cast<int64_t>(i));
      if (item == SchemaNode::kNone || !SchemaAccepts(schema, item, value[i])) return false;
    }
    return true;
  }
  return true;
}

}  // namespace tophat
