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

#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "models/grammar/json_constraint.h"

namespace tophat {

// The most bytes a grammar's text may hold, and the most automaton states it may compile to
// (repetition counts multiply what they repeat).
inline constexpr size_t kMaxEbnfGrammarBytes = 64 * 1024;
inline constexpr size_t kMaxEbnfStates = 1 << 17;
// Calls nested deeper than this are not followed (a branch that needs them is refused).
inline constexpr int32_t kMaxEbnfCallDepth = 1024;

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
  // a rule no finite text completes, left recursion, or a grammar over the limits above.
  static absl::StatusOr<std::shared_ptr<const EbnfGrammar>> Compile(std::string_view text);

  uint32_t root_start() const { return rule_starts_[root_]; }
  uint32_t rule_start(uint32_t rule) const { return rule_starts_[rule]; }
  const Closure& closure(uint32_t state) const { return closures_[state]; }
  const std::vector<Terminal>& terminals(uint32_t state) const { return terminals_[state]; }
  const CharClass& char_class(uint32_t id) const { return classes_[id]; }
  size_t state_count() const { return terminals_.size(); }

 private:
  friend class EbnfCompiler;
  uint32_t root_ = 0;
  std::vector<uint32_t> rule_starts_;
  std::vector<std::vector<Terminal>> terminals_;  // per state
  std::vector<Closure> closures_;                 // per state
  std::vector<CharClass> classes_;
};

// One request's matching of a grammar: the calls its answer has open, as interned nodes (a
// caller's resume state and its own caller), and the configurations it passes through (every
// way the text so far can be read, each a state with a terminal edge under a stack of calls;
// whether root may end here; the bytes of a character not yet whole), each interned to an id
// with its transitions by byte kept as found: a lazily built DFA, so that a mask's walk over
// the vocabulary mostly reads a table, as a regex's does. One request's thread owns it, with
// every EbnfState that points to it. Memory is bounded per request (kMaxEbnfCallDepth and the
// limits below): past them a branch is refused, not followed.
class EbnfWorkspace {
 public:
  static constexpr int32_t kDead = -1;
  // Worst case about 25 MB a request: 24 bytes a node, ~100 a configuration, 1 KiB a row.
  static constexpr size_t kMaxStackNodes = 1 << 17;
  static constexpr size_t kMaxConfigurations = 1 << 17;
  // Ways one configuration may hold (a choice among many words holds one a word at its
  // first character): what a character costs to read is linear in them.
  static constexpr size_t kMaxWays = 1024;
  // The ways and calls a request's transitions may visit in all (each transition is
  // computed once): about 2-5 s of one core, a bound on what one grammar costs the device.
  static constexpr uint64_t kMaxWork = uint64_t{1} << 28;
  // Configurations whose transitions are kept (a table of 256 each).
  static constexpr size_t kMaxKeptRows = 1 << 12;

  explicit EbnfWorkspace(const EbnfGrammar* grammar);
  // EbnfStates and its id set point into it.
  EbnfWorkspace(const EbnfWorkspace&) = delete;
  EbnfWorkspace& operator=(const EbnfWorkspace&) = delete;

  // The configuration before the answer's first byte.
  int32_t start() const { return start_; }
  // The configuration after `byte`; kDead when no way takes it.
  int32_t Next(int32_t configuration, uint8_t byte);
  bool can_end(int32_t configuration) const;
  // A match that nothing can extend.
  bool complete(int32_t configuration) const;
  // Ways the text can be read (for tests).
  size_t ways(int32_t configuration) const;
  // Whether every plain character (TokenVocabulary::IsPlainCharacter) leads from
  // `configuration` back to it, as inside a JSON string of a grammar written from JSON's or
  // in `[^\n]*`: then every plain token is allowed there without a walk (EbnfState::in_string).
  // Found once per configuration; false where finding it would pass a bound.
  bool LoopsOnPlainCharacters(int32_t configuration);
  size_t stack_nodes() const { return nodes_.size(); }
  size_t configurations() const { return configurations_.size(); }
  // Whether a branch was refused for a limit rather than by the grammar.
  bool over_limit() const { return over_limit_; }

 private:
  struct Node {
    uint32_t resume;
    int32_t depth;
    const Node* caller;
  };
  using Item = std::pair<uint32_t, const Node*>;
  struct Configuration {
    absl::InlinedVector<Item, 4> items;  // sorted
    bool accepts = false;
    uint32_t pending = 0;       // a character's leading bits while its UTF-8 is not whole
    uint8_t pending_bytes = 0;  // the bytes it still needs
    uint8_t lead = 0;           // its first byte until the second is read (which it limits)

    bool operator==(const Configuration& other) const {
      return accepts == other.accepts && pending == other.pending &&
             pending_bytes == other.pending_bytes && lead == other.lead && items == other.items;
    }
    template <typename H>
    friend H AbslHashValue(H hash, const Configuration& c) {
      return H::combine(std::move(hash), c.accepts, c.pending, c.pending_bytes, c.lead, c.items);
    }
  };

  // The node for `resume` under `caller` (nullptr: the root's caller); nullptr when over the
  // limits, in *over.
  const Node* Push(uint32_t resume, const Node* caller, bool* over);
  // Adds what `state` under `stack` leads to: ready items into `out`, and root's end into
  // *accepts.
  void Expand(uint32_t state, const Node* stack, std::vector<Item>& out, bool* accepts);
  // `from` after character `c`, into *to; false when no way takes it.
  bool Advance(const Configuration& from, uint32_t c, Configuration* to);
  // Whether some way of `c` takes a character starting with its pending bytes.
  bool Viable(const Configuration& c) const;
  // `from` after `byte`, computed; false when refused.
  bool Step(const Configuration& from, uint8_t byte, Configuration* to);
  // The id of `c`, interned; kDead past kMaxConfigurations.
  int32_t Intern(Configuration c);

  const EbnfGrammar* grammar_;
  std::deque<Node> nodes_;
  absl::flat_hash_map<std::pair<uint32_t, const Node*>, const Node*> interned_nodes_;
  std::deque<Configuration> configurations_;
  struct ConfigurationHash {
    const std::deque<Configuration>* configurations;
    size_t operator()(int32_t id) const {
      return absl::Hash<Configuration>{}((*configurations)[static_cast<size_t>(id)]);
    }
  };
  struct ConfigurationEq {
    const std::deque<Configuration>* configurations;
    bool operator()(int32_t a, int32_t b) const {
      return (*configurations)[static_cast<size_t>(a)] == (*configurations)[static_cast<size_t>(b)];
    }
  };
  absl::flat_hash_set<int32_t, ConfigurationHash, ConfigurationEq> ids_;
  // rows_[id][byte]: the next configuration, kDead, or kUnknown.
  static constexpr int32_t kUnknown = -2;
  std::vector<std::unique_ptr<std::array<int32_t, 256>>> rows_;
  // loops_[id]: LoopsOnPlainCharacters once found (1 or 0), else kUnknown.
  std::vector<int8_t> loops_;
  // The bounds of the classes LoopsOnPlainCharacters looks through, at most this many.
  static constexpr size_t kMaxLoopBounds = 4096;
  std::vector<uint32_t> bounds_;
  size_t kept_rows_ = 0;
  int32_t start_ = kDead;
  bool over_limit_ = false;
  uint64_t work_ = 0;
  // Scratch for Advance.
  absl::flat_hash_set<std::pair<uint32_t, const Node*>> visited_;
  std::vector<Item> pending_;
  std::vector<Item> advanced_;
};

// The grammar of GrammarConstraint for a GBNF grammar: a configuration of its request's
// workspace.
class EbnfState {
 public:
  EbnfState() = default;
  // The state before the answer's first byte.
  explicit EbnfState(EbnfWorkspace* workspace)
      : workspace_(workspace), configuration_(workspace->start()) {}

  bool Feed(unsigned char byte) {
    if (configuration_ == EbnfWorkspace::kDead) return false;
    configuration_ = workspace_->Next(configuration_, byte);
    return configuration_ != EbnfWorkspace::kDead;
  }
  bool Feed(std::string_view bytes) {
    for (const char c : bytes) {
      if (!Feed(static_cast<unsigned char>(c))) return false;
    }
    return true;
  }
  bool can_end() const {
    return configuration_ != EbnfWorkspace::kDead && workspace_->can_end(configuration_);
  }
  bool complete() const {
    return configuration_ != EbnfWorkspace::kDead && workspace_->complete(configuration_);
  }
  // Between characters where every plain character leads back here (inside a string of a
  // grammar written from JSON's): GrammarConstraint allows every plain token without a walk,
  // as in JsonGrammar's strings.
  bool in_string() const {
    return configuration_ != EbnfWorkspace::kDead &&
           workspace_->LoopsOnPlainCharacters(configuration_);
  }
  // Plain characters leave the configuration as it is: no limit.
  int64_t string_room() const { return std::numeric_limits<int64_t>::max(); }
  // A branch was refused for a bound of the workspace's, not by the grammar.
  bool cut_by_limit() const { return workspace_ != nullptr && workspace_->over_limit(); }
  size_t ways() const {
    return configuration_ == EbnfWorkspace::kDead ? 0 : workspace_->ways(configuration_);
  }

  bool operator==(const EbnfState& other) const { return configuration_ == other.configuration_; }
  template <typename H>
  friend H AbslHashValue(H hash, const EbnfState& state) {
    return H::combine(std::move(hash), state.configuration_);
  }

 private:
  EbnfWorkspace* workspace_ = nullptr;
  int32_t configuration_ = EbnfWorkspace::kDead;
};

using EbnfConstraint = GrammarConstraint<EbnfState>;

// A constraint to `grammar` (which it keeps alive, with the request's stacks).
std::unique_ptr<TokenConstraint> MakeEbnfConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const EbnfGrammar> grammar);

}  // namespace tophat
