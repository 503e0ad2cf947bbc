// Decoding constrained to one of a list of strings (vLLM's structured_outputs "choice" and
// guided_choice): the answer's bytes walk a trie of the choices, so a token is allowed only
// where some choice still starts with the answer and it, the end only on a whole choice, and
// once no choice goes on past it only the end. A classifier's thousands of labels cost what a
// few do: a mask refuses most tokens at their first byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/json_schema.h"

namespace tophat {

// The choices of a request, as a trie. Immutable; shared by the request's grammars.
class ChoiceSpec {
 public:
  static constexpr size_t kMaxChoices = 65536;
  // The choices' bytes together, at most (what the trie holds is about 40 bytes a byte).
  static constexpr size_t kMaxChoiceBytes = kMaxJsonSchemaBytes;

  // InvalidArgument saying what: no choices, an empty one, more than kMaxChoices, more than
  // kMaxChoiceBytes in all. A choice given twice is one.
  static absl::StatusOr<std::shared_ptr<const ChoiceSpec>> Create(
      const std::vector<std::string>& choices);
  // What Create would refuse, without building the trie (a request's check before the agent
  // builds it).
  static absl::Status Check(const std::vector<std::string>& choices);

  const ByteTrie& trie() const { return trie_; }
  size_t size() const { return choices_; }

 private:
  ChoiceSpec(ByteTrie trie, size_t choices) : trie_(std::move(trie)), choices_(choices) {}

  ByteTrie trie_;
  size_t choices_;
};

// The grammar of GrammarConstraint for a choice: the trie's node after the answer's bytes.
class ChoiceGrammar {
 public:
  explicit ChoiceGrammar(const ChoiceSpec* spec) : spec_(spec) {}

  bool Feed(unsigned char byte) {
    if (node_ < 0) return false;
    node_ = spec_->trie().Child(node_, byte);
    return node_ >= 0;
  }
  bool Feed(std::string_view bytes) {
    for (const char c : bytes) {
      if (!Feed(static_cast<unsigned char>(c))) return false;
    }
    return true;
  }
  // A whole choice: the answer may end here.
  bool can_end() const { return node_ >= 0 && Node().terminal >= 0; }
  // A whole choice that no other choice goes on from: only the end may follow.
  bool complete() const { return can_end() && Node().edges.empty(); }
  bool in_string() const { return false; }
  int64_t string_room() const { return 0; }

  bool operator==(const ChoiceGrammar& other) const { return node_ == other.node_; }
  template <typename H>
  friend H AbslHashValue(H hash, const ChoiceGrammar& grammar) {
    return H::combine(std::move(hash), grammar.node_);
  }

 private:
  const ByteTrie::Node& Node() const { return spec_->trie().nodes[static_cast<size_t>(node_)]; }

  const ChoiceSpec* spec_;
  int32_t node_ = 0;  // -1 once a byte was refused
};

using ChoiceConstraint = GrammarConstraint<ChoiceGrammar>;

// A constraint to `spec`'s choices (which it keeps alive).
std::unique_ptr<TokenConstraint> MakeChoiceConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const ChoiceSpec> spec);

}  // namespace tophat
