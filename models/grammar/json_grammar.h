// A JSON object as a byte automaton (RFC 8259), for decoding constrained to JSON (OpenAI's
// response_format {"type": "json_object"}): fed the answer's bytes one at a time, it says
// whether each can still lead to a complete object, and when one is complete.
//
// What it accepts is exactly what a strict parser (nlohmann::json, Python's json) accepts
// with a top-level object, with two limits a strict parser lacks: nesting at most kMaxDepth
// deep, and at most kMaxWhitespaceRun whitespace bytes in a row (so a model cannot pad
// forever; pretty-printing still fits). Strings are well-formed UTF-8, escapes included:
// a \u escape of a high surrogate must be followed by one of a low surrogate.
//
// A value type, a few bytes, copied freely: JsonConstraint walks a vocabulary by copying it.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

namespace tophat {

class JsonGrammar {
 public:
  static constexpr int kMaxDepth = 64;  // one bit per level of stack_
  static constexpr int kMaxWhitespaceRun = 32;

  // An automaton for one JSON value of any type, not only an object: what SchemaGrammar
  // lexes a value with where its schema leaves it free (a string, a number, a literal, or
  // any value at all). complete() once the value is; a top-level number has no byte of its
  // own that ends it (number_could_end).
  static JsonGrammar AnyValue() {
    JsonGrammar grammar;
    grammar.mode_ = Mode::kValue;
    return grammar;
  }

  // Takes one byte. Returns false, leaving the automaton in an unspecified state (copy it
  // first to try a byte), when no JSON object starts with the bytes so far and this one.
  bool Feed(unsigned char byte);
  // Feeds every byte; false at the first that fails.
  bool Feed(std::string_view bytes);

  // The top-level object is closed: nothing more may follow.
  bool complete() const { return mode_ == Mode::kDone; }
  // The answer may end here (GrammarConstraint): only once complete.
  bool can_end() const { return complete(); }
  // Inside a string, between characters: whole characters other than '"', '\\' and the
  // control characters leave the automaton as it is.
  bool in_string() const { return mode_ == Mode::kString; }
  // In a string, the most characters it may still take: no limit.
  int64_t string_room() const { return std::numeric_limits<int64_t>::max(); }
  // A top-level value (AnyValue) that is a number which may end here: the byte after it
  // decides (one that does not continue it, NumberContinues, ends it).
  bool number_could_end() const {
    return depth_ == 0 && (mode_ == Mode::kNumberZero || mode_ == Mode::kNumberInteger ||
                           mode_ == Mode::kNumberFraction || mode_ == Mode::kNumberExponent);
  }
  // Inside a number: whether `byte` goes on with it (a digit, the point, the exponent's e)
  // rather than ending it.
  bool NumberContinues(unsigned char byte) const;

  bool operator==(const JsonGrammar&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const JsonGrammar& g) {
    return H::combine(std::move(h), g.stack_, g.depth_, g.mode_, g.key_, g.whitespace_,
                      g.literal_, g.pending_, g.low_, g.high_, g.code_unit_, g.low_surrogate_);
  }

 private:
  enum class Mode : uint8_t {
    kStart,             // before the top-level '{'
    kKeyOrClose,        // after '{': a key or '}'
    kKey,               // after ',' in an object
    kColon,             // after a key
    kValue,             // after ':' or ',' in an array
    kValueOrClose,      // after '[': a value or ']'
    kAfterValue,        // ',' or the container's close
    kString,            // inside a string (key_ says which kind)
    kUtf8,              // inside a multi-byte character: pending_ continuation bytes left
    kEscape,            // after '\'
    kHex,               // in \uXXXX: pending_ hex digits left
    kSurrogateSlash,    // after a high surrogate's escape: '\' must follow
    kSurrogateU,        // then 'u'
    kNumberMinus,       // '-'
    kNumberZero,        // a leading 0 (no more integer digits)
    kNumberInteger,     // integer digits
    kNumberPoint,       // '.': a digit must follow
    kNumberFraction,    // fraction digits
    kNumberE,           // 'e' or 'E'
    kNumberExponentSign,
    kNumberExponent,    // exponent digits
    kLiteral,           // inside true, false or null: literal_, pending_ bytes matched
    kDone,
  };

  // A value begins with `byte` where one may.
  bool StartValue(unsigned char byte);
  bool Open(bool object);
  bool Close(bool object);
  // Ends a value: back to the container, or done at the top level.
  void EndValue();
  bool StringByte(unsigned char byte);
  bool AfterValue(unsigned char byte);
  bool top_is_object() const { return (stack_ >> (depth_ - 1)) & 1u; }

  uint64_t stack_ = 0;  // bit i: level i is an object (1) or an array (0)
  uint8_t depth_ = 0;
  Mode mode_ = Mode::kStart;
  bool key_ = false;          // the string is a key
  uint8_t whitespace_ = 0;    // whitespace bytes in a row
  uint8_t literal_ = 0;       // which of true, false, null
  uint8_t pending_ = 0;       // continuation bytes, hex digits, or literal bytes matched
  uint8_t low_ = 0x80;        // the next continuation byte's range
  uint8_t high_ = 0xBF;
  uint16_t code_unit_ = 0;    // \u digits so far
  bool low_surrogate_ = false;  // this \u must be a low surrogate
};

}  // namespace tophat
