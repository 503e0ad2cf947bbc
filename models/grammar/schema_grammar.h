// A JSON value that satisfies a compiled JSON Schema (models/grammar/json_schema.h), as a byte
// automaton, for decoding constrained to it (OpenAI's response_format {"type":
// "json_schema"}): fed the answer's bytes one at a time, it says whether each can still lead
// to a value the schema takes, and when the value is complete. Every prefix it takes can be
// completed: a key only where a property is left to write, a ',' only where another item or
// property may follow, an object or array only where its smallest value still fits within
// CompiledSchema::kMaxDepth.
//
// Objects and arrays the schema describes are frames on its own stack; a scalar, or a value
// the schema leaves free, is lexed by a JsonGrammar (AnyValue); an enum's value by a walk of
// the enum's trie; a key by the trie of the object's property names beside a JsonGrammar that
// keeps it a valid string. Whitespace as JsonGrammar takes it (runs of at most
// kMaxWhitespaceRun), none after the top-level value. A value that may be of several of a
// union's branches of one type (an overlap: Union[Cat, Dog]) is read by one SchemaGrammar for
// each (alternatives), dropped when it refuses a byte; the value is taken while any reads it,
// and ends when they do (objects, arrays, strings, booleans and nulls end at a byte of their
// own, so they end together). Objects with a discriminator write it first.
//
// A value type: JsonConstraint's vocabulary walk copies it for every byte, so a copy moves
// only the frames in use (and the alternatives, in storage a copy over an earlier one
// reuses). It points at the schema, which must outlive it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "models/grammar/json_grammar.h"
#include "models/grammar/json_schema.h"

namespace tophat {

class SchemaGrammar {
 public:
  static constexpr int kMaxWhitespaceRun = JsonGrammar::kMaxWhitespaceRun;

  // At the start of a value of `schema`'s root.
  explicit SchemaGrammar(const CompiledSchema* schema);
  SchemaGrammar(const SchemaGrammar& other) { *this = other; }
  SchemaGrammar& operator=(const SchemaGrammar& other);

  // Takes one byte. Returns false, leaving the automaton in an unspecified state (copy it
  // first to try a byte), when no value the schema takes starts with the bytes so far and
  // this one.
  bool Feed(unsigned char byte);
  // Feeds every byte; false at the first that fails.
  bool Feed(std::string_view bytes);

  // The top-level value is complete and nothing may follow.
  bool complete() const { return phase_ == Phase::kDone; }
  // The answer may end here: complete, or a top-level number (or numeric enum value) that
  // may also go on.
  bool can_end() const;
  // Inside a string, between characters: whole characters other than '"', '\\' and the
  // control characters are taken, up to string_room() of them (a string with a maxLength
  // counts them; the automaton is then not left as it was).
  bool in_string() const;
  // In a string (in_string), the most characters it may still take. Reading alternatives:
  // in_string when each is, taking as many as the roomiest.
  int64_t string_room() const;

  // A string with a pattern, where it stands: plain characters (whole UTF-8 characters but
  // '"', '\\' and the control characters, which a string takes as they are) run through the
  // pattern's automaton alone, as Feed would take them, without copying the grammar.
  struct PatternCursor {
    const StringPattern* pattern = nullptr;
    const PatternLengths* lengths = nullptr;  // nullptr: no length limits
    int32_t state = 0;
    int64_t chars = 0;  // characters written whole
    // Takes one byte of a plain character; false where Feed would refuse it. Inline: the
    // mask's walk calls it for every byte of the vocabulary it reads.
    bool Feed(unsigned char byte) {
      const int32_t next = pattern->Next(state, byte);
      if (next == StringPattern::kDead) return false;
      // A byte inside a character counts it among those to come; one that ends it, as
      // written.
      const int64_t written =
          chars + (pattern->bytes_left()[static_cast<size_t>(next)] == 0 ? 1 : 0);
      // With a length, a character is taken only where a match of an allowed length can
      // follow.
      if (lengths != nullptr && !lengths->Reachable(next, written)) return false;
      state = next;
      chars = written;
      return true;
    }
  };
  // Between characters of a string with a pattern that this grammar reads itself (not as
  // alternatives); nullopt elsewhere.
  std::optional<PatternCursor> pattern_cursor() const;

  bool operator==(const SchemaGrammar& other) const;
  template <typename H>
  friend H AbslHashValue(H h, const SchemaGrammar& g) {
    h = H::combine(std::move(h), g.schema_, g.phase_, g.depth_, g.whitespace_, g.expected_,
                   g.integer_, g.trie_, g.leaf_, g.chars_, g.negative_, g.digits_, g.key_escape_,
                   g.bounded_number_, g.point_, g.leading_zero_, g.fraction_digits_, g.cmp_low_,
                   g.cmp_high_, g.multiple_, g.magnitude_, g.base_depth_, g.first_key_,
                   g.pattern_state_, g.pattern_escape_);
    h = H::combine(std::move(h), g.alternatives_);
    for (int i = 0; i < g.depth_; ++i) {
      const Frame& f = g.frames_[static_cast<size_t>(i)];
      h = H::combine(std::move(h), f.node, f.seen, f.open, f.count, f.property, f.object,
                     f.additional);
    }
    return h;
  }

 private:
  static constexpr int kMaxDepth = CompiledSchema::kMaxDepth;
  static constexpr int32_t kUndeclared = -2;  // Frame::property of an undeclared key

  enum class Phase : uint8_t {
    kValue,         // a value of expected_ comes next
    kValueOrClose,  // after '[': a value of expected_ (the items) or ']'
    kKeyOrClose,    // after '{': a key or '}'
    kKey,           // after ',' in an object: a key
    kColon,         // after a key
    kAfterValue,    // ',' or the container's close
    kKeyString,     // inside a key: trie_ over the object's names (-1: off them), leaf_
    kLeaf,          // inside a scalar or free value: leaf_ (integer_: no fraction, exponent)
    kEnum,          // inside an enum's value: trie_ over expected_'s enum_trie
    kAlternatives,  // inside a value of an overlap (expected_): alternatives_ read it
    kDone,          // the top-level value is complete
  };
  // An object or array the schema describes.
  struct Frame {
    int32_t node = 0;       // the schema node (not a union) it is a value of
    uint64_t seen = 0;      // object: declared properties written
    uint64_t open = 0;      // object: declared properties whose smallest value fits here
    int32_t count = 0;      // array: items written
    int32_t property = -1;  // object: the key just written (kUndeclared: not a declared one)
    bool object = false;
    bool additional = false;  // object: an undeclared key may come (and its value fits)
    bool operator==(const Frame&) const = default;
  };

  // At the start of a value of `node`, `base_depth` objects and arrays deep (an overlap's
  // member, read as an alternative); an object whose first key must be its property
  // `first_key` (a discriminator), or -1.
  SchemaGrammar(const CompiledSchema* schema, int32_t node, uint8_t base_depth,
                int8_t first_key);

  const SchemaNode& Node(int32_t index) const { return schema_->node(index); }
  // Objects and arrays open around the value being read, the enclosing readings' included.
  int32_t Depth() const { return base_depth_ + depth_; }
  Frame& top() { return frames_[static_cast<size_t>(depth_ - 1)]; }
  const Frame& top() const { return frames_[static_cast<size_t>(depth_ - 1)]; }
  // Whether a value of node `node` may start at the current depth (its smallest fits).
  bool Fits(int32_t node) const;
  // An object's next key may come: a declared property not yet written, or an undeclared one.
  bool KeyMayCome(const Frame& frame) const;
  // The declared properties the frame's next key may name, and whether an undeclared one
  // may come: in the top-level object before its first key, only the discriminator.
  uint64_t KeysLeft(const Frame& frame) const;
  // The frame is the top-level object, which must write first_key_ first, and no key is
  // written yet.
  bool FirstKeyPending(const Frame& frame) const;
  bool UndeclaredMayCome(const Frame& frame) const;
  // An array's next item may come.
  bool ItemMayCome(const Frame& frame) const;

  // Whether the digits so far of a number with bounds (bounded_number_: an integer or not)
  // lead to a value within them / are one; takes its sign, digits and point. Its digits are
  // compared with the bounds' decimals place by place.
  bool DecimalMayReachBounds() const;
  bool DecimalWithinBounds() const;
  void CountDecimalByte(unsigned char byte);
  // multipleOf: CountMultipleByte keeps the magnitude; MultipleMayBeReached says whether a
  // multiple within the bounds can still be written on from the digits so far,
  // MultipleHolds whether the number so far is one.
  void CountMultipleByte(unsigned char byte);
  bool MultipleMayBeReached() const;
  bool MultipleHolds() const;
  // A byte inside a string with a pattern: its characters' decoded bytes through the
  // pattern's automaton (the short escapes decoded; no \u), the close only on a match; with
  // a length, a character only where a match of an allowed length can still follow.
  bool PatternByte(const SchemaNode& node, unsigned char byte);

  bool StartValue(unsigned char byte);
  // The first byte of a value of overlap `node`: an alternative for each member it starts.
  bool StartAlternatives(int32_t node, unsigned char byte);
  bool AlternativesByte(unsigned char byte);
  bool OpenObject(int32_t node);
  bool OpenArray(int32_t node);
  bool StartKey(unsigned char byte);
  bool KeyByte(unsigned char byte);
  // Keys are spelled as JSON writes them (nlohmann's dump: the short escapes, \u00XX for the
  // other control characters, everything else as it is), so that equal keys are equal bytes:
  // "\u0061" would be the declared name "a" unseen, or a key written before. Tracks a key's
  // escape (key_escape_) and refuses any other spelling.
  bool KeyEscapeByte(unsigned char byte);
  bool AfterValue(unsigned char byte);
  bool Close(bool object);
  // A value ended: back to its container, or done at the top level.
  void EndValue();

  const CompiledSchema* schema_;
  Phase phase_ = Phase::kValue;
  uint8_t depth_ = 0;
  uint8_t base_depth_ = 0;  // objects and arrays open around the top-level value
  int8_t first_key_ = -1;   // the top-level object's first key must be this property
  uint8_t whitespace_ = 0;  // whitespace bytes in a row
  bool integer_ = false;
  int32_t expected_ = 0;  // the node of the value to come or being read
  int32_t trie_ = 0;
  JsonGrammar leaf_;
  // In a key: 0, or where in an escape (1: after '\\', 2-4: after \\u, \\u0, \\u00, 5 and 6:
  // after \\u000 and \\u001).
  uint8_t key_escape_ = 0;
  // A string with a length limit: characters so far (without a maxLength, counted only up
  // to its minLength, so that longer strings are one state).
  uint32_t chars_ = 0;
  // A number with bounds (an integer or not): its sign, its integer digits so far, whether
  // the point was read, whether the integer part is a lone 0, the fraction digits so far,
  // and the digits' order against the low and the high bound of the magnitude
  // (DecimalMagnitudes) at the same places: -1, 0 (equal so far) or 1; once the point is
  // read, against the whole of each bound's integer part. Zero for any other value, so that
  // equal positions compare equal.
  bool bounded_number_ = false;
  bool negative_ = false;
  uint16_t digits_ = 0;
  bool point_ = false;
  bool leading_zero_ = false;
  uint16_t fraction_digits_ = 0;
  int8_t cmp_low_ = 0;
  int8_t cmp_high_ = 0;
  // A number with a multipleOf (written as an integer, within +-2^53): its magnitude so far.
  // Zero for any other value.
  bool multiple_ = false;
  uint64_t magnitude_ = 0;
  // A string with a pattern: its automaton's state (-1: none), and whether after a '\\'.
  int32_t pattern_state_ = -1;
  bool pattern_escape_ = false;
  std::array<Frame, kMaxDepth> frames_{};
  // Reading an overlap's value: a reading for each member it may still be of, in the
  // members' order; empty elsewhere.
  std::vector<SchemaGrammar> alternatives_;
};

}  // namespace tophat
