// Decoding constrained to a JSON object (OpenAI's response_format {"type": "json_object"},
// JsonGrammar) or to a JSON Schema ({"type": "json_schema"}, SchemaGrammar): which tokens of
// the vocabulary may come next so that the answer can still be completed, and, once it is
// complete, only the end of sequence.
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
#include "models/grammar/json_schema.h"
#include "models/grammar/schema_grammar.h"
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
  // Whether a JSON string takes character c as it is: a Unicode scalar value other than '"',
  // '\\', the control characters below 0x20 and DEL (which a grammar written from JSON's, as
  // llama.cpp's json.gbnf, leaves out of its strings). A plain token is valid UTF-8 of plain
  // characters only.
  static constexpr bool IsPlainCharacter(uint32_t c) {
    return c >= 0x20 && c != '"' && c != '\\' && c != 0x7F && c <= 0x10FFFF &&
           (c < 0xD800 || c > 0xDFFF);
  }
  // nullptr for a special token (or an id outside the vocabulary).
  const std::string* bytes(int32_t id) const;

 private:
  template <typename Grammar>
  friend class GrammarConstraint;
  // Tokens in the order a walk reads them.
  struct Walk {
    std::vector<int32_t> sorted;   // by their bytes
    std::vector<uint32_t> shared;  // bytes sorted[i] shares with sorted[i - 1]
    // Each token's bytes past those it shares with the one before, back to back in the
    // walk's order: sorted[i]'s are tails[tail_ends[i - 1], tail_ends[i]) (from 0 for the
    // first). The walk reads them in order instead of each token's own string, which sits
    // wherever its id puts it: that fetch was two thirds of a walk reading every token.
    std::string tails;
    std::vector<uint32_t> tail_ends;
  };
  // `sorted`: ids sorted by their bytes.
  static Walk WalkOf(const std::vector<std::optional<std::string>>& tokens,
                     std::vector<int32_t> sorted);

  std::vector<std::optional<std::string>> tokens_;
  Walk all_;  // every token with at least one byte
  // Inside a string most tokens are plain (IsPlainCharacter), which a string takes as they
  // are (JsonGrammar::in_string, and a GBNF grammar's string: EbnfState::in_string): they are
  // allowed without a walk, and only the others are walked (0.16 ms instead of 21 ms on a
  // 128k-token vocabulary: docs/benchmarks.md, "JSON answers").
  // Sorted by their length in characters, which plain_chars_ holds: a string with room
  // for n more characters takes those up to the last of length n.
  std::vector<int32_t> plain_in_string_;
  std::vector<uint32_t> plain_chars_;
  Walk others_in_string_;
  // The plain tokens again, sorted by their bytes: in a string with a pattern they are run
  // through the pattern's automaton alone (SchemaGrammar::PatternCursor), not the grammar.
  Walk plain_by_bytes_;
  size_t longest_ = 0;
};

// A token the decoder drafts without its drafter (TokenConstraint::Forced).
struct ForcedDraft {
  int32_t token = 0;
  // The only token the format allows: the target model takes it too. Otherwise the longest
  // of a prefix chain, a guess at how the model spells a literal.
  bool only = true;
  bool operator==(const ForcedDraft&) const = default;
};

// What a sampler asks of the constraint of an answer's format.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Tokens generated since the last Commit, in order. A token the grammar refuses leaves
  // the answer invalid: every later choice may only end it.
  virtual void Commit(std::span<const int32_t> tokens) = 0;
  // allowed[id] is 1 where token id may follow the committed tokens and then `pending`,
  // [vocabulary size]; null where every token may (nothing to mask). When no token can (the
  // vocabulary cannot continue the answer, or `pending` holds a refused token), only the end
  // ids are allowed, so the answer ends rather than goes on unconstrained.
  virtual std::shared_ptr<const std::vector<uint8_t>> Allowed(
      std::span<const int32_t> pending) const = 0;
  // The token the decoder may draft after `pending` without its drafter, where the format
  // leaves one way to go (SpeculativeDecoder's jump-forward): the one token allowed (a
  // thinking budget's forced end), which the target model takes too; or, where each allowed
  // token's bytes start the longest one's (a JSON Schema's key the vocabulary spells
  // several ways: `"`, `"loc`, `"location`), that longest (`only` false), as a tokenizer
  // would spell the literal. The model may prefer a shorter one; the verification decides,
  // as for any draft (losslessly). nullopt where the ways part, where an end id is allowed
  // beside a token, on a tie, or past kMaxForcedWays allowed tokens. By default, read from
  // Allowed's mask without the vocabulary: the one token only.
  virtual std::optional<ForcedDraft> Forced(std::span<const int32_t> pending) const;
  // Allowed tokens past which Forced looks no further: a literal has few prefixes.
  static constexpr int kMaxForcedWays = 64;

  // The committed answer is complete.
  virtual bool complete() const = 0;
  // A way the format allows was not followed for one of its bounds (a GBNF grammar's call
  // depth, ways, stacks or work: EbnfWorkspace), so the answer may have ended before a match.
  virtual bool cut_by_limit() const { return false; }

 protected:
  // Forced's rule over a mask; without a vocabulary, the one token only.
  static std::optional<ForcedDraft> ForcedByMask(const std::vector<uint8_t>& mask,
                                                 const TokenVocabulary* vocabulary);
};

// One request's constraint by a byte automaton `Grammar` (JsonGrammar: any JSON object;
// SchemaGrammar: a value of a JSON Schema; ToolCallGrammar, tool_call_grammar.h: tool
// calls): the answer so far (Commit) and, for a choice past tokens not yet committed (a
// speculative round's drafts), those too. Not thread-safe; one request's thread owns it.
// Grammar is a value type with Feed(byte), Feed(bytes), complete(), can_end() (the answer
// may end here), in_string() and string_room() (where in_string, every plain token of at most
// string_room() characters is taken: TokenVocabulary::IsPlainCharacter), == and AbslHashValue.
template <typename Grammar>
class GrammarConstraint final : public TokenConstraint {
 public:
  // end_ids: the tokens that end the answer (end of sequence, stop ids), allowed only where
  // the grammar may end, and once it is complete the only ones allowed. `start`: the
  // grammar before the answer's first byte; `owner` keeps alive what it points to (a
  // SchemaGrammar's schema).
  GrammarConstraint(std::shared_ptr<const TokenVocabulary> vocabulary,
                    std::vector<int32_t> end_ids, Grammar start = Grammar(),
                    std::shared_ptr<const void> owner = nullptr);

  void Commit(std::span<const int32_t> tokens) override;
  std::shared_ptr<const std::vector<uint8_t>> Allowed(
      std::span<const int32_t> pending) const override;
  std::optional<ForcedDraft> Forced(std::span<const int32_t> pending) const override;
  bool complete() const override { return state_.has_value() && state_->complete(); }
  bool cut_by_limit() const override {
    if constexpr (requires(const Grammar& grammar) { grammar.cut_by_limit(); }) {
      return start_.cut_by_limit();
    }
    return false;
  }

  // Masks computed, and those found in the cache (for tests of the cache).
  int64_t masks_computed() const { return computed_; }

 private:
  std::shared_ptr<const std::vector<uint8_t>> Compute(const Grammar& state) const;
  // Sets allowed[id] for the tokens of `walk` that `state` (a Grammar, or a
  // SchemaGrammar::PatternCursor over plain tokens) takes; returns whether any.
  template <typename Automaton>
  bool WalkTokens(const Automaton& state, const TokenVocabulary::Walk& walk,
                  std::vector<uint8_t>& allowed) const;
  std::shared_ptr<const std::vector<uint8_t>> EndsOnly() const;

  // A state's mask depends on the state alone; strings and deep structure revisit the same
  // states, so a few recent masks are kept (cleared whole when full: a miss costs a walk).
  static constexpr size_t kCachedMasks = 16;

  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::vector<int32_t> end_ids_;
  std::shared_ptr<const void> owner_;
  Grammar start_;
  std::optional<Grammar> state_;  // nullopt once a refused token was committed
  mutable absl::flat_hash_map<Grammar, std::shared_ptr<const std::vector<uint8_t>>> cache_;
  mutable std::shared_ptr<const std::vector<uint8_t>> ends_only_;
  mutable int64_t computed_ = 0;
};

// Decoding constrained to a JSON object (response_format {"type": "json_object"}).
using JsonConstraint = GrammarConstraint<JsonGrammar>;
// Decoding constrained to a JSON Schema's values (response_format {"type": "json_schema"}).
using SchemaConstraint = GrammarConstraint<SchemaGrammar>;

// A constraint to `schema` (which it keeps alive).
std::unique_ptr<TokenConstraint> MakeSchemaConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const CompiledSchema> schema);

}  // namespace tophat
