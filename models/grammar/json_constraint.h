// Decoding constrained to a JSON object (OpenAI's response_format {"type": "json_object"}):
// which tokens of the vocabulary may come next so that the answer can still be completed
// into a JSON object (JsonGrammar), and, once it is complete, only the end of sequence.
// Everything happens on the device, where the token ids are: the cloud never learns that a
// request is constrained.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "models/grammar/json_grammar.h"
#include "models/tokenizers/tokenizer.h"

namespace tophat {

// The bytes each token adds to the text, sorted so that tokens sharing a prefix are walked
// once for it. Built once per tokenizer (0.11 s for 128k tokens on an EPYC core) and shared
// by every request; immutable.
class TokenVocabulary {
 public:
  // tokens[id]: the bytes token id adds to the text; nullopt for a special token, which no
  // grammar allows (the end of sequence is named separately).
  explicit TokenVocabulary(std::vector<std::optional<std::string>> tokens);
  // From a tokenizer's TokenBytes.
  static std::shared_ptr<const TokenVocabulary> FromTokenizer(const Tokenizer& tokenizer);

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  // nullptr for a special token (or an id outside the vocabulary).
  const std::string* bytes(int32_t id) const;

 private:
  friend class JsonConstraint;
  // Tokens in the order a walk reads them.
  struct Walk {
    std::vector<int32_t> sorted;   // by their bytes
    std::vector<uint32_t> shared;  // bytes sorted[i] shares with sorted[i - 1]
  };
  static Walk Sorted(const std::vector<std::optional<std::string>>& tokens,
                     std::vector<int32_t> ids);

  std::vector<std::optional<std::string>> tokens_;
  Walk all_;  // every token with at least one byte
  // Inside a string most tokens are whole characters without '"', '\\' or control
  // characters, which a string takes as they are (JsonGrammar::in_string): they are allowed
  // without a walk, and only the others are walked (0.16 ms instead of 21 ms on a 128k-token
  // vocabulary: docs/benchmarks.md, "JSON answers").
  std::vector<int32_t> plain_in_string_;
  Walk others_in_string_;
  size_t longest_ = 0;
};

// One request's constraint: the answer so far (Commit) and, for a choice past tokens not yet
// committed (a speculative round's drafts), those too. Not thread-safe; one request's
// thread owns it.
class JsonConstraint {
 public:
  // end_ids: the tokens that end the answer (end of sequence, stop ids), allowed only once
  // the object is complete, and then the only ones allowed.
  JsonConstraint(std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids);

  // Tokens generated since the last Commit, in order. A token the grammar refuses leaves
  // the answer invalid: every later choice may only end it.
  void Commit(std::span<const int32_t> tokens);

  // allowed[id] is 1 where token id may follow the committed tokens and then `pending`,
  // [vocabulary size]. When no token can (the vocabulary cannot continue the object, or
  // `pending` holds a refused token), only the end ids are allowed, so the answer ends
  // rather than goes on unconstrained.
  std::shared_ptr<const std::vector<uint8_t>> Allowed(std::span<const int32_t> pending) const;

  // The committed answer is a complete object.
  bool complete() const { return state_.has_value() && state_->complete(); }

  // Masks computed, and those found in the cache (for tests of the cache).
  int64_t masks_computed() const { return computed_; }

 private:
  std::shared_ptr<const std::vector<uint8_t>> Compute(const JsonGrammar& state) const;
  // Sets allowed[id] for the tokens of `walk` that `state` takes; returns whether any.
  bool WalkTokens(const JsonGrammar& state, const TokenVocabulary::Walk& walk,
                  std::vector<uint8_t>& allowed) const;
  std::shared_ptr<const std::vector<uint8_t>> EndsOnly() const;

  // A state's mask depends on the state alone; strings and deep structure revisit the same
  // states, so a few recent masks are kept (cleared whole when full: a miss costs a walk).
  static constexpr size_t kCachedMasks = 16;

  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::vector<int32_t> end_ids_;
  std::optional<JsonGrammar> state_;  // nullopt once a refused token was committed
  mutable absl::flat_hash_map<JsonGrammar, std::shared_ptr<const std::vector<uint8_t>>> cache_;
  mutable std::shared_ptr<const std::vector<uint8_t>> ends_only_;
  mutable int64_t computed_ = 0;
};

}  // namespace tophat
