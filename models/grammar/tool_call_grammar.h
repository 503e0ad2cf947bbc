// Tool calls as a model writes them (OpenAI's tool_choice "required" or a named function),
// as a byte automaton for decoding constrained to them: every byte keeps the answer the start
// of calls `open + NAME + between + ARGUMENTS + close`, joined by the syntax's separator,
// where NAME is one of the request's tools and ARGUMENTS a JSON object its parameters schema
// takes (a SchemaGrammar). The literals are exact: no whitespace outside the arguments, and
// none before their '{'. Every prefix it takes can be completed: a name only along the names'
// trie, the arguments as SchemaGrammar takes them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/json_schema.h"
#include "models/grammar/schema_grammar.h"
#include "models/tokenizers/chat_template.h"

namespace tophat {

struct ToolCallTool {
  std::string name;                                  // ^[A-Za-z0-9_-]{1,64}$
  std::shared_ptr<const CompiledSchema> parameters;  // its root takes JSON objects only
};

// The calls an answer may make: how the model writes one, the tools, and how many. Immutable;
// shared by the requests' grammars, which point at it.
class ToolCallSpec {
 public:
  static constexpr int kMaxTools = 128;
  static constexpr int kMaxNameLength = 64;

  // InvalidArgument naming the tool ("tools[2]: ...") or the syntax's part that is wrong: no
  // tools or more than kMaxTools, a name off the pattern or given twice, parameters whose root
  // may be anything but an object, max_calls < 1 or > 1 without a separator, an empty open,
  // between or close, or a between that starts with a name's character (where a name ends
  // would be ambiguous).
  static absl::StatusOr<std::shared_ptr<const ToolCallSpec>> Create(ToolCallSyntax syntax,
                                                                    std::vector<ToolCallTool> tools,
                                                                    int32_t max_calls);

  const ToolCallSyntax& syntax() const { return syntax_; }
  const std::vector<ToolCallTool>& tools() const { return tools_; }
  int32_t max_calls() const { return max_calls_; }
  // The tools' names; a terminal is the tool's index.
  const ByteTrie& names() const { return names_; }

 private:
  ToolCallSpec(ToolCallSyntax syntax, std::vector<ToolCallTool> tools, int32_t max_calls,
               ByteTrie names)
      : syntax_(std::move(syntax)),
        tools_(std::move(tools)),
        max_calls_(max_calls),
        names_(std::move(names)) {}

  ToolCallSyntax syntax_;
  std::vector<ToolCallTool> tools_;
  int32_t max_calls_;
  ByteTrie names_;
};

// The automaton (GrammarConstraint's Grammar). A value type that points at the spec, which
// must outlive it; outside the arguments it is a few integers.
class ToolCallGrammar {
 public:
  // Before the first call's open.
  explicit ToolCallGrammar(const ToolCallSpec* spec) : spec_(spec) {}

  // Takes one byte. Returns false, leaving the automaton in an unspecified state (copy it
  // first to try a byte), when no calls start with the bytes so far and this one.
  bool Feed(unsigned char byte);
  // Feeds every byte; false at the first that fails.
  bool Feed(std::string_view bytes);

  // max_calls calls are written: nothing may follow.
  bool complete() const { return phase_ == Phase::kDone; }
  // Right after a call's close: the answer may end (or, below max_calls, a separator come).
  bool can_end() const { return phase_ == Phase::kAfterCall || phase_ == Phase::kDone; }
  // The arguments' SchemaGrammar's, inside them; false and 0 elsewhere.
  bool in_string() const { return phase_ == Phase::kArguments && arguments_->in_string(); }
  int64_t string_room() const {
    return phase_ == Phase::kArguments ? arguments_->string_room() : 0;
  }
  // Calls written whole.
  int32_t calls() const { return calls_; }

  bool operator==(const ToolCallGrammar&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const ToolCallGrammar& g) {
    h = H::combine(std::move(h), g.spec_, g.phase_, g.at_, g.node_, g.tool_, g.calls_,
                   g.arguments_.has_value());
    if (g.arguments_.has_value()) h = H::combine(std::move(h), *g.arguments_);
    return h;
  }

 private:
  enum class Phase : uint8_t {
    kOpen,           // in the open literal
    kName,           // in the name: node_ of the names' trie
    kBetween,        // in the between literal; tool_ named
    kArgumentsOpen,  // the arguments' '{' comes next
    kArguments,      // in the arguments: arguments_
    kClose,          // in the close literal
    kAfterCall,      // a call ended: the separator, or the end
    kSeparator,      // in the separator literal
    kDone,           // max_calls calls written
  };

  // The byte at_ of `literal`; once it is read whole, on to `next`.
  bool LiteralByte(std::string_view literal, unsigned char byte, Phase next);
  // Starts `phase`, resetting what it does not use, so that equal positions compare equal.
  void Enter(Phase phase);

  const ToolCallSpec* spec_;
  Phase phase_ = Phase::kOpen;
  uint32_t at_ = 0;    // in a literal: its bytes read
  int32_t node_ = 0;   // in the name: the names' trie node
  int32_t tool_ = -1;  // from the name's end to the arguments' end: the tool named
  int32_t calls_ = 0;  // calls written whole
  std::optional<SchemaGrammar> arguments_;  // in the arguments only
};

// Decoding constrained to tool calls (tool_choice "required" or a named function).
using ToolCallConstraint = GrammarConstraint<ToolCallGrammar>;

// A constraint to `spec`'s calls (which it keeps alive, and with it the tools' schemas).
std::unique_ptr<TokenConstraint> MakeToolCallConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const ToolCallSpec> spec);

}  // namespace tophat
