// A JSON Schema "pattern" (an ECMA-262 regular expression) compiled for decoding constrained
// to it: a DFA over the UTF-8 bytes of a string's characters, as JSON decodes them, in which
// every state can still reach a match (SchemaGrammar takes a character only where the string
// can still match, and closes it only on a match).
//
// The part of the syntax structured outputs use: literals (UTF-8), `.`, classes `[a-z]`,
// `[^...]`, the escapes \d \D \w \W \s \S \n \r \t \f \v \0 \xHH \uHHHH and the syntax
// characters escaped, groups `(...)` and `(?:...)`, `|`, and the quantifiers * + ? {n} {n,}
// {n,m} (lazy ones too: the language is the same). `^` only at the start and `$` only at the
// end: without them a pattern matches anywhere in the string, as JSON Schema says. Refused,
// with what it is: backreferences, lookarounds, named groups, \b and \B, and a pattern whose
// DFA would exceed kMaxStates or cost too much to build (counted repetitions of large
// classes grow it: ^.{0,200}$ has 4,801 states and compiles in 12 ms, .{100} is refused).
//
// The characters JSON writes as \u escapes only (the control characters but \b \f \n \r \t)
// are outside the DFA's alphabet: SchemaGrammar takes the short escapes and no \u in a
// string with a pattern.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tophat {

class StringPattern {
 public:
  static constexpr int32_t kMaxStates = 8192;
  static constexpr int32_t kDead = -1;
  static constexpr size_t kMaxPatternBytes = 4096;

  // InvalidArgument saying what in the pattern is not supported, or that no string JSON can
  // write matches it.
  static absl::StatusOr<std::shared_ptr<const StringPattern>> Compile(std::string_view regex);
  // The strings both match (a "pattern" beside a "format"); InvalidArgument when none is, or
  // when the product has more than kMaxStates states.
  static absl::StatusOr<std::shared_ptr<const StringPattern>> Intersect(const StringPattern& a,
                                                                      const StringPattern& b);
  // The pattern a JSON Schema "format" stands for, compiled once; nullptr for a format that
  // is only an annotation here. See kFormats in string_pattern.cc for what each allows.
  static std::shared_ptr<const StringPattern> Format(std::string_view name);
  // The formats Format knows, for documentation and tests.
  static std::vector<std::string_view> FormatNames();
  // The regular expression Format(name) compiles ("" for an unknown name).
  static std::string_view FormatRegex(std::string_view name);

  static constexpr int32_t start() { return 0; }
  // The state after `byte` of a character, or kDead where no match can follow.
  int32_t Next(int32_t state, unsigned char byte) const {
    return next_[static_cast<size_t>(state) * 256 + byte];
  }
  // The bytes so far are a string the pattern matches.
  bool Accepts(int32_t state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  // Whether the pattern matches the string `utf8` (its characters' bytes, decoded).
  bool Matches(std::string_view utf8) const;
  int32_t states() const { return static_cast<int32_t>(accepting_.size()); }
  // Of each state, the bytes left of the character it is inside (0 between characters, 1 to
  // 3 inside a UTF-8 sequence; -1 for a state no string reaches). Every state is one or the
  // other: the automaton reads whole UTF-8 sequences from its start.
  const std::vector<int8_t>& bytes_left() const { return bytes_left_; }

 private:
  // Fills bytes_left_ from the transitions (after pruning).
  void MarkCharacters();
  std::vector<int32_t> next_;  // [states x 256]
  std::vector<uint8_t> accepting_;
  std::vector<int8_t> bytes_left_;
};

// A pattern under a string's length limits (minLength and maxLength, in characters as JSON
// Schema counts them): which of the pattern's states can still reach a match of an allowed
// length, for SchemaGrammar to take a character only where a string within both can still be
// written. With a maxLength, each state keeps the character counts (0 to maxLength) with
// which a match can be reached from it; with only a minLength, whether a match of k or more
// characters can be, for k up to the minLength or until that stops changing. A state inside a
// character counts that character among those still to come.
class PatternLengths {
 public:
  // States times lengths tracked, and distinct moves times lengths: the tables' bits and
  // the work of filling them (^.{0,200}$ beside maxLength 100: 4,801 states x 101).
  static constexpr int64_t kMaxBits = int64_t{1} << 24;
  static constexpr int64_t kMaxWork = int64_t{1} << 24;

  // max_length -1: none. InvalidArgument when no string within the limits matches, or when
  // the tables exceed the bounds above.
  static absl::StatusOr<std::shared_ptr<const PatternLengths>> Compile(
      const StringPattern& pattern, int64_t min_length, int64_t max_length);

  // Whether a match within the limits can still be written from `state` of the pattern,
  // `written` characters having been written whole.
  bool Reachable(int32_t state, int64_t written) const;
  size_t memory_bytes() const { return bits_.size() * sizeof(uint64_t); }

 private:
  bool Bit(int32_t state, int64_t n) const {
    const uint64_t word = bits_[static_cast<size_t>(state) * words_ + static_cast<size_t>(n / 64)];
    return ((word >> (n % 64)) & 1) != 0;
  }

  int64_t min_length_ = 0;
  int64_t max_length_ = -1;
  int64_t tracked_ = 0;  // lengths kept a state: 0 to tracked_ - 1
  size_t words_ = 0;     // 64-bit words a state
  // [state x words_]. With a maximum, bit n: a match n characters on can be reached. Without,
  // bit k: a match k or more characters on can be, the last bit standing for all k beyond.
  std::vector<uint64_t> bits_;
};

}  // namespace tophat
