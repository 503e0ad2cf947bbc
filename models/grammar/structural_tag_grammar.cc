#include "models/grammar/structural_tag_grammar.h"

#include <deque>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tophat {
namespace {

using nlohmann::json;

// Bytes a top-level number may go on with after a digit: an end starting with one would
// never start after a number, which takes the byte.
bool GoesOnWithNumber(unsigned char byte) {
  return (byte >= '0' && byte <= '9') || byte == '.' || byte == 'e' || byte == 'E' || byte == '+' ||
         byte == '-';
}

std::string Quoted(const std::string& text) {
  return absl::StrCat("\"", absl::CEscape(text), "\"");
}

// The place of a structure's field, for errors.
std::string Field(size_t structure, const std::string& field) {
  return absl::StrCat("structures[", structure, "].", field);
}

}  // namespace

StructuralTagSpec::StructuralTagSpec(std::vector<StructuralTagStructure> structures,
                                     std::vector<std::string> triggers, ByteTrie begins,
                                     std::vector<uint16_t> text_next,
                                     std::vector<int32_t> trigger_begin)
    : structures_(std::move(structures)),
      triggers_(std::move(triggers)),
      begins_(std::move(begins)),
      text_next_(std::move(text_next)),
      trigger_begin_(std::move(trigger_begin)) {}

absl::StatusOr<std::shared_ptr<const StructuralTagSpec>> StructuralTagSpec::Create(
    std::vector<StructuralTagStructure> structures, std::vector<std::string> triggers) {
  if (structures.empty()) return absl::InvalidArgumentError("structures: none given");
  if (structures.size() > kMaxStructures) {
    return absl::InvalidArgumentError(
        absl::StrCat("structures: ", structures.size(), " given, at most ", kMaxStructures));
  }
  if (triggers.empty()) return absl::InvalidArgumentError("triggers: none given");
  if (triggers.size() > kMaxTriggers) {
    return absl::InvalidArgumentError(
        absl::StrCat("triggers: ", triggers.size(), " given, at most ", kMaxTriggers));
  }
  size_t trigger_bytes = 0;
  for (size_t t = 0; t < triggers.size(); ++t) {
    const std::string& trigger = triggers[t];
    if (trigger.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("triggers[", t, "]: empty"));
    }
    if (trigger.size() > kMaxLiteralBytes) {
      return absl::InvalidArgumentError(absl::StrCat("triggers[", t, "]: ", trigger.size(),
                                                     " bytes, at most ", kMaxLiteralBytes));
    }
    trigger_bytes += trigger.size();
    for (size_t other = 0; other < triggers.size(); ++other) {
      if (other == t || triggers[other].find(trigger) == std::string::npos) continue;
      if (triggers[other] == trigger && other > t) continue;  // named at the later one
      return absl::InvalidArgumentError(absl::StrCat(
          "triggers[", t, "]: ", Quoted(trigger),
          triggers[other] == trigger
              ? absl::StrCat(" is triggers[", other, "] too")
              : absl::StrCat(" occurs in triggers[", other, "] ", Quoted(triggers[other]),
                             ", which would never be found")));
    }
  }
  if (trigger_bytes > kMaxTriggerBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("triggers: ", trigger_bytes, " bytes in all, at most ", kMaxTriggerBytes));
  }
  ByteTrie begins;
  std::vector<bool> trigger_used(triggers.size(), false);
  for (size_t s = 0; s < structures.size(); ++s) {
    const StructuralTagStructure& structure = structures[s];
    if (structure.begin.empty()) return absl::InvalidArgumentError(Field(s, "begin: empty"));
    for (const auto& [name, text] :
         {std::pair{"begin", &structure.begin}, {"end", &structure.end}}) {
      if (text->size() > kMaxLiteralBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(Field(s, name), ": ", text->size(), " bytes, at most ", kMaxLiteralBytes));
      }
    }
    if (structure.schema == nullptr) return absl::InvalidArgumentError(Field(s, "schema: none"));
    size_t trigger = 0;
    while (trigger < triggers.size() && !structure.begin.starts_with(triggers[trigger])) ++trigger;
    if (trigger == triggers.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(s, "begin"), ": ", Quoted(structure.begin),
                       " starts with none of the triggers: the text would never lead to it"));
    }
    trigger_used[trigger] = true;
    for (size_t other = 0; other < s; ++other) {
      const std::string& before = structures[other].begin;
      if (before.starts_with(structure.begin) || structure.begin.starts_with(before)) {
        return absl::InvalidArgumentError(absl::StrCat(
            Field(s, "begin"), ": ", Quoted(structure.begin),
            before == structure.begin
                ? absl::StrCat(" is structures[", other, "]'s too")
                : absl::StrCat(" and structures[", other, "]'s ", Quoted(before),
                               ": one starts with the other, so where one ends is ambiguous")));
      }
    }
    const CompiledSchema& schema = *structure.schema;
    if (!structure.end.empty() && GoesOnWithNumber(static_cast<unsigned char>(structure.end[0])) &&
        schema.ForType(schema.root(), kTypeNumber) != SchemaNode::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          Field(s, "end"), ": ", Quoted(structure.end),
          " starts with a byte a number goes on with, and the schema takes numbers: the value "
          "would take it rather than end"));
    }
    begins.Insert(structure.begin, static_cast<int32_t>(s));
  }
  for (size_t t = 0; t < triggers.size(); ++t) {
    if (!trigger_used[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("triggers[", t, "]: ", Quoted(triggers[t]),
                       " starts no structure's begin: the text could never write it"));
    }
  }

  // Aho-Corasick's automaton over the triggers, as a table: the trie of the triggers, each
  // node's missing edges leading where its longest proper suffix that is a trie node would
  // go. No trigger holds another, so a node completes at most its own trigger.
  ByteTrie trie;
  for (size_t t = 0; t < triggers.size(); ++t) trie.Insert(triggers[t], static_cast<int32_t>(t));
  const size_t states = trie.nodes.size();  // at most kMaxTriggerBytes + 1
  std::vector<uint16_t> next(states * 256, 0);
  std::vector<uint16_t> fail(states, 0);
  std::deque<int32_t> queue;
  for (const auto& [byte, child] : trie.nodes[0].edges) {
    next[byte] = static_cast<uint16_t>(child);
    queue.push_back(child);
  }
  while (!queue.empty()) {
    const int32_t node = queue.front();
    queue.pop_front();
    const size_t row = static_cast<size_t>(node) * 256;
    const size_t fail_row = static_cast<size_t>(fail[static_cast<size_t>(node)]) * 256;
    for (int byte = 0; byte < 256; ++byte) next[row + byte] = next[fail_row + byte];
    for (const auto& [byte, child] : trie.nodes[static_cast<size_t>(node)].edges) {
      fail[static_cast<size_t>(child)] = next[fail_row + byte];
      next[row + byte] = static_cast<uint16_t>(child);
      queue.push_back(child);
    }
  }
  std::vector<int32_t> trigger_begin(states, -1);
  for (size_t node = 0; node < states; ++node) {
    const int32_t trigger = trie.nodes[node].terminal;
    if (trigger < 0) continue;
    int32_t at = 0;
    for (const char c : triggers[static_cast<size_t>(trigger)]) {
      at = begins.Child(at, static_cast<unsigned char>(c));
    }
    trigger_begin[node] = at;  // a begin starts with the trigger: the node exists
  }
  return std::shared_ptr<const StructuralTagSpec>(
      new StructuralTagSpec(std::move(structures), std::move(triggers), std::move(begins),
                            std::move(next), std::move(trigger_begin)));
}

absl::StatusOr<std::shared_ptr<const StructuralTagSpec>> StructuralTagSpec::Parse(
    std::string_view text) {
  if (text.size() > kMaxTextBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the structural tag is ", text.size(), " bytes, more than ", kMaxTextBytes));
  }
  json tag;
  try {
    tag = json::parse(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the structural tag is not JSON: ", e.what()));
  }
  constexpr char kShape[] =
      "a structural tag is an object {\"structures\": [{\"begin\", \"schema\", \"end\"}, ...], "
      "\"triggers\": [...]}";
  if (!tag.is_object()) return absl::InvalidArgumentError(kShape);
  for (const auto& [key, value] : tag.items()) {
    if (key == "type") {
      if (value != "structural_tag") {
        return absl::InvalidArgumentError("type: must be \"structural_tag\"");
      }
    } else if (key == "format") {
      return absl::InvalidArgumentError(
          "format: the later form of structural tags (xgrammar's \"format\" of tags) is not "
          "supported; give \"structures\" and \"triggers\"");
    } else if (key != "structures" && key != "triggers") {
      return absl::InvalidArgumentError(
          absl::StrCat("'", key, "' is not a field of a structural tag (structures, triggers)"));
    }
  }
  if (!tag.contains("structures") || !tag["structures"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("structures: missing or not an array; ", kShape));
  }
  if (!tag.contains("triggers") || !tag["triggers"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("triggers: missing or not an array; ", kShape));
  }
  if (tag["structures"].size() > kMaxStructures) {
    return absl::InvalidArgumentError(
        absl::StrCat("structures: ", tag["structures"].size(), " given, at most ", kMaxStructures));
  }
  std::vector<StructuralTagStructure> structures;
  for (size_t s = 0; s < tag["structures"].size(); ++s) {
    const json& item = tag["structures"][s];
    if (!item.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("structures[", s, "]: must be an object {\"begin\", \"schema\", \"end\"}"));
    }
    StructuralTagStructure structure;
    for (const auto& [key, value] : item.items()) {
      if (key == "begin" || key == "end") {
        if (!value.is_string()) return absl::InvalidArgumentError(Field(s, key + ": not a string"));
        (key == "begin" ? structure.begin : structure.end) = value.get<std::string>();
      } else if (key == "schema") {
        if (!value.is_object() && !value.is_boolean()) {
          return absl::InvalidArgumentError(Field(s, "schema: not a JSON Schema (an object)"));
        }
        absl::StatusOr<std::shared_ptr<const CompiledSchema>> schema =
            CompiledSchema::CompileShared(value);
        if (!schema.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(Field(s, "schema"), " ", schema.status().message()));
        }
        structure.schema = *std::move(schema);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(Field(s, key), ": not a field of a structure (begin, schema, end)"));
      }
    }
    for (const char* key : {"begin", "schema", "end"}) {
      if (!item.contains(key))
        return absl::InvalidArgumentError(Field(s, absl::StrCat(key, ": missing")));
    }
    structures.push_back(std::move(structure));
  }
  if (tag["triggers"].size() > kMaxTriggers) {
    return absl::InvalidArgumentError(
        absl::StrCat("triggers: ", tag["triggers"].size(), " given, at most ", kMaxTriggers));
  }
  std::vector<std::string> triggers;
  for (size_t t = 0; t < tag["triggers"].size(); ++t) {
    const json& trigger = tag["triggers"][t];
    if (!trigger.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("triggers[", t, "]: not a string"));
    }
    triggers.push_back(trigger.get<std::string>());
  }
  return Create(std::move(structures), std::move(triggers));
}

bool StructuralTagGrammar::can_end() const {
  return phase_ == Phase::kText ||
         (phase_ == Phase::kValue && value_->can_end() &&
          spec_->structures()[static_cast<size_t>(structure_)].end.empty());
}

bool StructuralTagGrammar::Feed(std::string_view bytes) {
  for (const char c : bytes) {
    if (!Feed(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool StructuralTagGrammar::Feed(unsigned char byte) {
  switch (phase_) {
    case Phase::kText: {
      at_ = spec_->TextNext(static_cast<uint16_t>(at_), byte);
      const int32_t begin = spec_->TriggerBegin(static_cast<uint16_t>(at_));
      if (begin >= 0) {
        phase_ = Phase::kBegin;
        at_ = begin;
        // A begin that is the trigger itself is read whole already.
        if (const int32_t s = spec_->begins().nodes[static_cast<size_t>(at_)].terminal; s >= 0) {
          EnterValue(s);
        }
      }
      return true;
    }
    case Phase::kBegin: {
      const int32_t child = spec_->begins().Child(at_, byte);
      if (child < 0) return false;
      at_ = child;
      // Create refused a begin that another starts with: a terminal is a leaf.
      if (const int32_t s = spec_->begins().nodes[static_cast<size_t>(at_)].terminal; s >= 0) {
        EnterValue(s);
      }
      return true;
    }
    case Phase::kValue:
      if (value_->can_end()) {
        // A top-level number, which may go on or end here: the byte goes on with it where it
        // can (Create made sure that an end never starts with such a byte).
        SchemaGrammar on = *value_;
        if (!on.Feed(byte)) {
          EnterEnd();
          return Feed(byte);
        }
        *value_ = on;
      } else if (!value_->Feed(byte)) {
        return false;
      }
      if (value_->complete()) EnterEnd();
      return true;
    case Phase::kEnd: {
      const std::string& end = spec_->structures()[static_cast<size_t>(structure_)].end;
      if (static_cast<unsigned char>(end[static_cast<size_t>(at_)]) != byte) return false;
      if (static_cast<size_t>(++at_) == end.size()) EnterText();
      return true;
    }
  }
  return false;
}

void StructuralTagGrammar::EnterValue(int32_t structure) {
  phase_ = Phase::kValue;
  at_ = 0;
  structure_ = structure;
  value_.emplace(spec_->structures()[static_cast<size_t>(structure)].schema.get());
}

void StructuralTagGrammar::EnterEnd() {
  value_.reset();
  if (spec_->structures()[static_cast<size_t>(structure_)].end.empty()) {
    EnterText();
    return;
  }
  phase_ = Phase::kEnd;
  at_ = 0;
}

void StructuralTagGrammar::EnterText() {
  phase_ = Phase::kText;
  at_ = 0;
  structure_ = -1;
  value_.reset();
}

std::unique_ptr<TokenConstraint> MakeStructuralTagConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const StructuralTagSpec> spec) {
  StructuralTagGrammar start(spec.get());
  return std::make_unique<StructuralTagConstraint>(std::move(vocabulary), std::move(end_ids),
                                                   std::move(start), std::move(spec));
}

}  // namespace tophat
