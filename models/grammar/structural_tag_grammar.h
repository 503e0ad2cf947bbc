// Structural tags (vLLM's and SGLang's response_format {"type": "structural_tag"}, xgrammar's
// first form): free text, in which each structure the model starts is held to its layout.
// A structure is begin + a JSON value its schema takes + end; the text is any bytes until they
// end with one of the triggers, each a prefix of one or more begins, and from there the
// answer must go on with one of those begins, a value of that structure's schema and its end,
// then free text again. So a model writes `<function=get_weather>{"city": "Oslo"}</function>`
// whole and valid wherever it starts one, and says what it likes around it (reasoning before
// an answer, text between calls); a trigger never appears in the text but as a structure's
// start. The answer may end anywhere in the text, never inside a structure.
//
// Matching the triggers in the text is Aho-Corasick's automaton as a table (Create refuses a
// trigger that holds another, so at most one completes at a byte); the begins are a trie; the
// value is a SchemaGrammar, as tool calls' arguments are.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/json_schema.h"
#include "models/grammar/schema_grammar.h"

namespace tophat {

struct StructuralTagStructure {
  std::string begin;  // starts with one of the triggers
  std::shared_ptr<const CompiledSchema> schema;
  std::string end;  // may be empty: the text goes on right after the value
};

// The structures and triggers of a request. Immutable; shared by the request's grammars,
// which point at it.
class StructuralTagSpec {
 public:
  static constexpr int kMaxStructures = 128;
  static constexpr int kMaxTriggers = 64;
  static constexpr size_t kMaxLiteralBytes = 256;   // a begin, an end or a trigger
  static constexpr size_t kMaxTriggerBytes = 1024;  // the triggers together
  // The JSON text Parse takes, at most (the schemas in it included).
  static constexpr size_t kMaxTextBytes = kMaxJsonSchemaBytes;

  // InvalidArgument naming the structure or trigger ("structures[2].begin: ..."): no
  // structures or triggers, or more than the limits; an empty trigger or begin, or one
  // longer than kMaxLiteralBytes (an end too); a trigger that holds another (the shorter
  // would always be found first) or starts no begin (the text could never write it); a
  // begin that starts with no trigger, or that another begin starts with (two structures
  // would be one until the longer's end); an end that starts with a byte a number goes on
  // with (a digit, '.', 'e', 'E', '+', '-') where the schema's value may be a number, which
  // would take that byte rather than end.
  static absl::StatusOr<std::shared_ptr<const StructuralTagSpec>> Create(
      std::vector<StructuralTagStructure> structures, std::vector<std::string> triggers);
  // From JSON text, as vLLM takes it: {"structures": [{"begin", "schema", "end"}, ...],
  // "triggers": [...]}, with "type": "structural_tag" allowed beside them. Each schema is
  // compiled (CompiledSchema::CompileShared); its errors are named by its place
  // ("structures[1].schema at /properties/x: ..."). Anything else is refused, xgrammar's
  // later form ({"format": ...}) by name.
  static absl::StatusOr<std::shared_ptr<const StructuralTagSpec>> Parse(std::string_view text);

  const std::vector<StructuralTagStructure>& structures() const { return structures_; }
  const std::vector<std::string>& triggers() const { return triggers_; }

  // In the text, the state of the trigger automaton after `byte` when it was `node` (0 at the
  // text's start and after a structure).
  uint16_t TextNext(uint16_t node, unsigned char byte) const {
    return text_next_[static_cast<size_t>(node) * 256 + byte];
  }
  // Where in the begins' trie a trigger the text's tail has just completed leads: the node
  // of its bytes, or -1 where `node` completes none.
  int32_t TriggerBegin(uint16_t node) const { return trigger_begin_[node]; }
  // The begins, a terminal being the structure's index.
  const ByteTrie& begins() const { return begins_; }

 private:
  StructuralTagSpec(std::vector<StructuralTagStructure> structures,
                    std::vector<std::string> triggers, ByteTrie begins,
                    std::vector<uint16_t> text_next, std::vector<int32_t> trigger_begin);

  std::vector<StructuralTagStructure> structures_;
  std::vector<std::string> triggers_;
  ByteTrie begins_;
  std::vector<uint16_t> text_next_;     // [trigger automaton states x 256]
  std::vector<int32_t> trigger_begin_;  // [trigger automaton states]
};

// The automaton (GrammarConstraint's Grammar). A value type that points at the spec, which
// must outlive it; outside a structure's value it is a few integers.
class StructuralTagGrammar {
 public:
  // At the start of the answer: text.
  explicit StructuralTagGrammar(const StructuralTagSpec* spec) : spec_(spec) {}

  // Takes one byte. Returns false, leaving the automaton in an unspecified state (copy it
  // first to try a byte), when the bytes so far and this one cannot go on to a valid answer.
  bool Feed(unsigned char byte);
  // Feeds every byte; false at the first that fails.
  bool Feed(std::string_view bytes);

  // Text can always go on.
  bool complete() const { return false; }
  // In the text (outside every structure), or where a value that may end (a top-level
  // number) is followed by an empty end: the answer may end.
  bool can_end() const;
  // Inside a structure: its begin, value or end.
  bool in_structure() const { return phase_ != Phase::kText; }
  // The value's SchemaGrammar's, inside one; false and 0 elsewhere.
  bool in_string() const { return phase_ == Phase::kValue && value_->in_string(); }
  std::optional<SchemaGrammar::PatternCursor> pattern_cursor() const {
    return phase_ == Phase::kValue ? value_->pattern_cursor() : std::nullopt;
  }
  int64_t string_room() const { return phase_ == Phase::kValue ? value_->string_room() : 0; }

  bool operator==(const StructuralTagGrammar&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const StructuralTagGrammar& g) {
    h = H::combine(std::move(h), g.spec_, g.phase_, g.at_, g.structure_, g.value_.has_value());
    if (g.value_.has_value()) h = H::combine(std::move(h), *g.value_);
    return h;
  }

 private:
  enum class Phase : uint8_t {
    kText,   // free text: at_ is the trigger automaton's state
    kBegin,  // past a trigger, in the begins' trie: at_ is its node
    kValue,  // the value of structure_'s schema: value_
    kEnd,    // structure_'s end: at_ of its bytes read
  };

  // The begin of structure `structure` is read whole: its value comes next.
  void EnterValue(int32_t structure);
  // The value is read whole: the end, or with an empty one the text.
  void EnterEnd();
  void EnterText();

  const StructuralTagSpec* spec_;
  Phase phase_ = Phase::kText;
  int32_t at_ = 0;
  int32_t structure_ = -1;  // in the value and the end
  std::optional<SchemaGrammar> value_;
};

// Decoding constrained to a structural tag.
using StructuralTagConstraint = GrammarConstraint<StructuralTagGrammar>;

// A constraint to `spec`'s structures (which it keeps alive, and with it their schemas).
std::unique_ptr<TokenConstraint> MakeStructuralTagConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const StructuralTagSpec> spec);

}  // namespace tophat
