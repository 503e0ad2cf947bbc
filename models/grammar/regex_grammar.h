// Decoding constrained to text a regular expression matches whole (vLLM's structured_outputs
// "regex" and "choice", SGLang's regex): the answer's UTF-8 bytes run through the pattern's
// DFA (StringPattern, the syntax JSON Schema patterns take), so a token is allowed only where
// a match can still be written, the end only on a match, and once no byte can follow a match
// only the end.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/string_pattern.h"

namespace tophat {

// The most bytes a regex format (or the alternation a choice makes) may hold.
inline constexpr size_t kMaxRegexFormatBytes = StringPattern::kMaxPatternBytes;

// `regex` compiled to match the whole answer: a leading ^ and trailing $ are allowed and
// change nothing. InvalidArgument naming what in it is not supported ("regex: ...").
absl::StatusOr<std::shared_ptr<const StringPattern>> CompileRegexFormat(std::string_view regex);

// The grammar of GrammarConstraint for a regex: the DFA's state after the answer's bytes.
class RegexGrammar {
 public:
  RegexGrammar() = default;
  explicit RegexGrammar(const StringPattern* pattern) : pattern_(pattern) {}

  bool Feed(unsigned char byte) {
    if (state_ == StringPattern::kDead) return false;
    state_ = pattern_->Next(state_, byte);
    return state_ != StringPattern::kDead;
  }
  bool Feed(std::string_view bytes) {
    for (const char c : bytes) {
      if (!Feed(static_cast<unsigned char>(c))) return false;
    }
    return true;
  }
  // A match: the answer may end here.
  bool can_end() const { return state_ != StringPattern::kDead && pattern_->Accepts(state_); }
  // A match no byte can extend: only the end may follow.
  bool complete() const {
    if (!can_end()) return false;
    for (int byte = 0; byte < 256; ++byte) {
      if (pattern_->Next(state_, static_cast<unsigned char>(byte)) != StringPattern::kDead) {
        return false;
      }
    }
    return true;
  }
  bool in_string() const { return false; }
  int64_t string_room() const { return 0; }

  bool operator==(const RegexGrammar& other) const { return state_ == other.state_; }
  template <typename H>
  friend H AbslHashValue(H hash, const RegexGrammar& grammar) {
    return H::combine(std::move(hash), grammar.state_);
  }

 private:
  const StringPattern* pattern_ = nullptr;
  int32_t state_ = StringPattern::start();
};

using RegexConstraint = GrammarConstraint<RegexGrammar>;

// A constraint to `pattern` (which it keeps alive).
std::unique_ptr<TokenConstraint> MakeRegexConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const StringPattern> pattern);

}  // namespace tophat
