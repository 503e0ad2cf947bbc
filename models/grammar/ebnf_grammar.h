// Decoding constrained to a context-free grammar written in GBNF, the EBNF of llama.cpp's
// `grammar` that vLLM's structured_outputs "grammar" and SGLang's "ebnf" also take:
//
//   root   ::= answer ("\n" answer)*
//   answer ::= "yes" | "no" | [0-9]+ ("." [0-9]{1,2})?   # comments run to the line's end
//
// Rules are `name ::= alternatives`; an element is a "literal" (escapes \n \r \t \\ \" \[ \]
// \xHH \uHHHH \UHHHHHHHH), a [character class] (ranges, ^ to negate), `.` (any character), a
// rule's name or a ( group ), each optionally followed by *, +, ?, {m}, {m,}, {m,n} or {,n}.
// Newlines are spaces: a rule runs until the next `name ::=`. Terminals are Unicode
// characters; the answer is their UTF-8. `root` is the whole answer.
//
// Each rule compiles into an automaton whose edges are character classes and calls of other
// rules; the answer is matched by following every way through it at once (the stacks of
// calls kept as shared, interned nodes), so any grammar without left recursion is taken,
// ambiguous ones included. Left recursion is refused, naming the rules of its cycle.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "models/grammar/json_constraint.h"

namespace tophat {

// The most bytes a grammar's text may hold, and the most automaton states it may compile to
// (repetition counts multiply what they repeat).
inline constexpr size_t kMaxEbnfGrammarBytes = 64 * 1024;
inline constexpr size_t kMaxEbnfStates = 1 << 17;
// Calls nested deeper than this are not followed (a branch that needs them is refused), and a
// request keeps at most kMaxEbnfStackNodes distinct calls: memory bounded per request.
inline constexpr int32_t kMaxEbnfCallDepth = 1024;
inline constexpr size_t kMaxEbnfStackNodes = 1 << 20;

// A compiled grammar: immutable, shared by the requests that use it.
class EbnfGrammar {
 public:
  struct Range {
    uint32_t lo;
    uint32_t hi;  // inclusive
  };
  struct CharClass {
    std::vector<Range> ranges;  // sorted, disjoint
    bool Contains(uint32_t c) const;
    bool Intersects(uint32_t lo, uint32_t hi) const;
  };
  struct Terminal {
    uint32_t char_class;
    uint32_t target;
  };
  struct Call {
    uint32_t rule;
    uint32_t target;  // where the caller resumes
  };
  // What a state leads to before reading a character (its closure over empty moves): the
  // states with terminal edges, the calls, and whether the rule may end here.
  struct Closure {
    std::vector<uint32_t> ready;
    std::vector<Call> calls;
    bool ends = false;
    // Only the rule's end is reachable: a call resuming here returns at once, so it is not
    // kept on the stack (right recursion in constant space).
    bool ends_only = false;
  };

  // Compiles `text`. InvalidArgument "grammar: line L, column C: ..." for a syntax error;
  // "grammar: ..." naming the rule for an undefined or twice-defined rule, a missing root,
  // left recursion, or a grammar over the limits above.
  static absl::StatusOr<std::shared_ptr<const EbnfGrammar>> Compile(std::string_view text);

  uint32_t root_start() const { return rule_starts_[root_]; }
  uint32_t rule_start(uint32_t rule) const { return rule_starts_[rule]; }
  const Closure& closure(uint32_t state) const { return closures_[state]; }
  const std::vector<Terminal>& terminals(uint32_t state) const { return terminals_[state]; }
  const CharClass& char_class(uint32_t id) const { return classes_[id]; }
  size_t state_count() const { return terminals_.size(); }
  size_t rule_count() const { return rule_starts_.size(); }

 private:
  friend class EbnfCompiler;
  uint32_t root_ = 0;
  std::vector<uint32_t> rule_starts_;
  std::vector<std::vector<Terminal>> terminals_;  // per state
  std::vector<Closure> closures_;                 // per state
  std::vector<CharClass> classes_;
};

// The calls a request's answer has open: interned nodes (a caller's resume state and its own
// caller), so that equal stacks are one pointer. One request's thread owns it, with every
// EbnfState that points to it.
class EbnfStacks {
 public:
  struct Node {
    uint32_t resume;
    int32_t depth;
    const Node* caller;
  };
  // The node for `resume` under `caller` (nullptr: the root's caller); nullptr when over the
  // limits (kMaxEbnfCallDepth, kMaxEbnfStackNodes), in *over.
  const Node* Push(uint32_t resume, const Node* caller, bool* over);
  size_t size() const { return nodes_.size(); }

  // Scratch for EbnfState::Advance (one request's thread).
  absl::flat_hash_set<std::pair<uint32_t, const Node*>> visited;
  std::vector<std::pair<uint32_t, const Node*>> pending;
  std::vector<std::pair<uint32_t, const Node*>> advanced;

 private:
  std::deque<Node> nodes_;
  absl::flat_hash_map<std::pair<uint32_t, const Node*>, const Node*> interned_;
};

// The grammar of GrammarConstraint for a GBNF grammar: every way the answer's characters so
// far can be read (a state with a terminal edge, and its stack of calls), whether root may
// end here, and the bytes of a character not yet whole.
class EbnfState {
 public:
  EbnfState() = default;
  // The state before the answer's first byte.
  EbnfState(const EbnfGrammar* grammar, EbnfStacks* stacks);

  bool Feed(unsigned char byte);
  bool Feed(std::string_view bytes) {
    for (const char c : bytes) {
      if (!Feed(static_cast<unsigned char>(c))) return false;
    }
    return true;
  }
  bool can_end() const { return accepts_ && pending_bytes_ == 0; }
  bool complete() const { return can_end() && items_.empty(); }
  bool in_string() const { return false; }
  int64_t string_room() const { return 0; }
  // Ways the answer can be read (for tests and limits).
  size_t ways() const { return items_.size(); }

  bool operator==(const EbnfState& other) const {
    return accepts_ == other.accepts_ && pending_ == other.pending_ &&
           pending_bytes_ == other.pending_bytes_ && lead_ == other.lead_ &&
           items_ == other.items_;
  }
  template <typename H>
  friend H AbslHashValue(H hash, const EbnfState& state) {
    return H::combine(std::move(hash), state.accepts_, state.pending_, state.pending_bytes_,
                      state.lead_, state.items_);
  }

 private:
  using Item = std::pair<uint32_t, const EbnfStacks::Node*>;
  // Reads character `c`: false when no way takes it.
  bool Advance(uint32_t c);
  // Adds what state `state` under `stack` leads to (ready items, and accepts_ at root's end).
  void Expand(uint32_t state, const EbnfStacks::Node* stack, std::vector<Item>& out);
  // Whether some way takes a character starting with the pending bytes.
  bool Viable() const;

  const EbnfGrammar* grammar_ = nullptr;
  EbnfStacks* stacks_ = nullptr;
  absl::InlinedVector<Item, 4> items_;  // sorted
  bool accepts_ = false;
  // A character's leading bits while its UTF-8 is not whole, and the bytes it still needs.
  uint32_t pending_ = 0;
  uint8_t pending_bytes_ = 0;
  uint8_t lead_ = 0;  // its first byte until the second is read (which the first limits)
};

using EbnfConstraint = GrammarConstraint<EbnfState>;

// A constraint to `grammar` (which it keeps alive, with the request's stacks).
std::unique_ptr<TokenConstraint> MakeEbnfConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const EbnfGrammar> grammar);

}  // namespace tophat
