// Tool calls as a model writes them (OpenAI's tool_choice "required" or a named function),
// as a byte automaton for decoding constrained to them: every byte keeps the answer the start
// of calls `open + NAME + between + ARGUMENTS + close`, joined by the syntax's separator,
// where NAME is one of the request's tools and ARGUMENTS a JSON object its parameters schema
// takes (a SchemaGrammar). The literals are exact: no whitespace outside the arguments, and
// none before their '{'. Every prefix it takes can be completed: a name only along the names'
// trie, the arguments as SchemaGrammar takes them.
//
// With text first (tool_choice "auto") the answer may be text instead, but a call it starts
// is held to the same: with a start_tag, text is any bytes until they end with start_tag,
// which begins the calls (and nothing but calls follows them); without one (the whole answer
// is one call), the first byte past leading whitespace decides: open's first begins the
// call, any other makes the answer text.
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
#include "models/grammar/json_grammar.h"
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
  // would be ambiguous); with text_first, an open that does not start with start_tag, or,
  // without a start_tag, one that starts with whitespace (which the text's leading
  // whitespace would take).
  static absl::StatusOr<std::shared_ptr<const ToolCallSpec>> Create(ToolCallSyntax syntax,
                                                                    std::vector<ToolCallTool> tools,
                                                                    int32_t max_calls,
                                                                    bool text_first = false);

  const ToolCallSyntax& syntax() const { return syntax_; }
  const std::vector<ToolCallTool>& tools() const { return tools_; }
  int32_t max_calls() const { return max_calls_; }
  // The answer may be text instead of calls (tool_choice "auto").
  bool text_first() const { return text_first_; }
  // The tools' names; a terminal is the tool's index.
  const ByteTrie& names() const { return names_; }

  // Text first with a start_tag: how much of start_tag the text's tail matches after `byte`,
  // when before it the tail matched `matched` (< start_tag's size) of it.
  uint32_t TagMatch(uint32_t matched, unsigned char byte) const;

 private:
  ToolCallSpec(ToolCallSyntax syntax, std::vector<ToolCallTool> tools, int32_t max_calls,
               bool text_first, ByteTrie names);

  ToolCallSyntax syntax_;
  std::vector<ToolCallTool> tools_;
  int32_t max_calls_;
  bool text_first_;
  ByteTrie names_;
  // tag_borders_[k]: the longest proper suffix of start_tag's first k bytes that is also a
  // prefix of it (KMP's failure function), so that a mismatch keeps what still matches.
  std::vector<uint32_t> tag_borders_;
};

// The automaton (GrammarConstraint's Grammar). A value type that points at the spec, which
// must outlive it; outside the arguments it is a few integers.
class ToolCallGrammar {
 public:
  // Text first without a start_tag: the leading whitespace's bound, past which a whitespace
  // byte is text (so that the states before the first call are few).
  static constexpr int kMaxLeadingWhitespace = JsonGrammar::kMaxWhitespaceRun;

  // Before the answer's first byte: the first call's open, or with text first its text.
  explicit ToolCallGrammar(const ToolCallSpec* spec);

  // Takes one byte. Returns false, leaving the automaton in an unspecified state (copy it
  // first to try a byte), when no calls start with the bytes so far and this one.
  bool Feed(unsigned char byte);
  // Feeds every byte; false at the first that fails.
  bool Feed(std::string_view bytes);

  // max_calls calls are written: nothing may follow.
  bool complete() const { return phase_ == Phase::kDone; }
  // In text before any call, or right after a call's close: the answer may end (or, below
  // max_calls, a separator come).
  bool can_end() const;
  // The arguments' SchemaGrammar's, inside them; false and 0 elsewhere.
  bool in_string() const { return phase_ == Phase::kArguments && arguments_->in_string(); }
  std::optional<SchemaGrammar::PatternCursor> pattern_cursor() const {
    return phase_ == Phase::kArguments ? arguments_->pattern_cursor() : std::nullopt;
  }
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
    kText,           // text first, with a start_tag: text; its tail matches at_ of the tag
    kLeadingSpace,   // text first, without one: at_ bytes of whitespace
    kFreeText,       // text first, without one: text, to the end
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
  // The open literal, its first `at` bytes read.
  void EnterOpenAt(uint32_t at);

  const ToolCallSpec* spec_;
  Phase phase_ = Phase::kOpen;
  uint32_t at_ = 0;    // in a literal: its bytes read; in text: as Phase says
  int32_t node_ = 0;   // in the name: the names' trie node
  int32_t tool_ = -1;  // from the name's end to the arguments' end: the tool named
  int32_t calls_ = 0;  // calls written whole
  std::optional<SchemaGrammar> arguments_;  // in the arguments only
};

// Decoding constrained to tool calls (tool_choice "required" or a named function; "auto"
// with text first).
using ToolCallConstraint = GrammarConstraint<ToolCallGrammar>;

// A constraint to `spec`'s calls (which it keeps alive, and with it the tools' schemas).
std::unique_ptr<TokenConstraint> MakeToolCallConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const ToolCallSpec> spec);

}  // namespace tophat
