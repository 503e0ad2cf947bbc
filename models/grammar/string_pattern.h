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

 private:
  std::vector<int32_t> next_;  // [states x 256]
  std::vector<uint8_t> accepting_;
};

}  // namespace tophat
