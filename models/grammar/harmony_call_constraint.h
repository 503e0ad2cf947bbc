// gpt-oss's answer held to end in one tool call (OpenAI's tool_choice "required" or a named
// function), in harmony's layout. The answer begins inside an assistant message's header (the
// prompt ends with "<|start|>assistant"); the model may reason first, as many messages as it
// likes, and then calls:
//
//   (<|channel|>analysis<|message|>REASONING<|end|><|start|>assistant)*
//   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGUMENTS<|call|>
//
// The call's layout is the one gpt-oss writes (the recipient after the channel, as OpenAI's
// harmony guide shows it and tests/harmony_model_test.py teaches it). Channel names, the
// call's header, "assistant" and "json" are text, held to those literals whatever tokens
// spell them (a ChoiceGrammar each); REASONING is any text (no control token but the <|end|>
// that closes it); ARGUMENTS a JSON object the tool's parameters take (a SchemaGrammar),
// closed by <|call|>. The final channel, a note to the user and a second call are not open
// to it: a reasoning message or the call are the only ways on from each message's start.
//
// A thinking budget (OpenAI's thinking_token_budget) counts the tokens before the call's
// <|constrain|>, the headers' included; spent, the reasoning message in progress is ended
// (once its text ends between characters: an optional message, then <|end|>) and the next
// message can only be the call.
//
// Why a constraint of its own: the control tokens are special tokens, with no bytes a text
// grammar could match, and the reasoning before the call is free where ToolCallGrammar's
// text is either all of the answer or none of it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/grammar/choice_grammar.h"
#include "models/grammar/json_constraint.h"
#include "models/grammar/partial_character.h"
#include "models/grammar/tool_call_grammar.h"

namespace tophat {

// The control tokens the layout uses (models/tokenizers/harmony.h's HarmonyTokens).
struct HarmonyCallIds {
  int32_t start = -1;      // <|start|>
  int32_t channel = -1;    // <|channel|>
  int32_t message = -1;    // <|message|>
  int32_t end = -1;        // <|end|>
  int32_t constrain = -1;  // <|constrain|>
  int32_t call = -1;       // <|call|>
};

// The calls one request may make: the control tokens, the tools and the header literals.
// Immutable; shared by the request's constraints, which point at it.
class HarmonyCallSpec {
 public:
  // The header's literals between <|channel|> and <|message|> / <|constrain|>.
  static constexpr std::string_view kAnalysis = "analysis";
  static constexpr std::string_view kCallHeaderPrefix = "commentary to=functions.";
  static constexpr std::string_view kAssistant = "assistant";
  static constexpr std::string_view kJson = "json";

  // InvalidArgument naming what is wrong: an id that is negative or given twice, no tools or
  // more than ToolCallSpec::kMaxTools, a name off ToolCallSpec's pattern or given twice.
  static absl::StatusOr<std::shared_ptr<const HarmonyCallSpec>> Create(
      HarmonyCallIds ids, std::vector<ToolCallTool> tools);

  const HarmonyCallIds& ids() const { return ids_; }
  const std::vector<ToolCallTool>& tools() const { return tools_; }
  // headers()[0] is kAnalysis; headers()[1 + t] tool t's call header, "commentary
  // to=functions.NAME " (the space before <|constrain|>).
  const std::vector<std::string>& headers() const { return headers_; }
  const std::shared_ptr<const ChoiceSpec>& header_choice() const { return header_choice_; }
  const std::string& assistant() const { return assistant_; }
  const std::string& json() const { return json_; }
  // The calls' headers alone (a spent budget's).
  const std::shared_ptr<const ChoiceSpec>& call_header_choice() const {
    return call_header_choice_;
  }
  const std::shared_ptr<const ChoiceSpec>& assistant_choice() const { return assistant_choice_; }
  const std::shared_ptr<const ChoiceSpec>& json_choice() const { return json_choice_; }

 private:
  HarmonyCallSpec() = default;

  HarmonyCallIds ids_;
  std::vector<ToolCallTool> tools_;
  std::vector<std::string> headers_;
  std::string assistant_{kAssistant};
  std::string json_{kJson};
  std::shared_ptr<const ChoiceSpec> header_choice_;
  std::shared_ptr<const ChoiceSpec> call_header_choice_;
  std::shared_ptr<const ChoiceSpec> assistant_choice_;
  std::shared_ptr<const ChoiceSpec> json_choice_;
};

class HarmonyCallConstraint final : public TokenConstraint {
 public:
  // end_ids: the request's ends (its stop ids), the only tokens allowed once a token the
  // layout refuses was committed, or after the call. budget: the most tokens before the
  // call's <|constrain|> (-1: no limit); budget_end: the tokens forced before <|end|> once it
  // is spent (a message; none of them <|end|>).
  HarmonyCallConstraint(std::shared_ptr<const TokenVocabulary> vocabulary,
                        std::vector<int32_t> end_ids, std::shared_ptr<const HarmonyCallSpec> spec,
                        int64_t budget = -1, std::vector<int32_t> budget_end = {});
  ~HarmonyCallConstraint() override;

  void Commit(std::span<const int32_t> tokens) override;
  std::shared_ptr<const std::vector<uint8_t>> Allowed(
      std::span<const int32_t> pending) const override;
  // The control token the layout needs next; in a literal or the arguments, theirs
  // (ChoiceConstraint's, SchemaConstraint's); none while reasoning.
  std::optional<ForcedDraft> Forced(std::span<const int32_t> pending) const override;
  // The call is written, its <|call|> included.
  bool complete() const override { return committed_.phase == Phase::kDone; }

 private:
  enum class Phase : uint8_t {
    kChannel,    // <|channel|> next
    kHeader,     // the channel's literal (and, for a call, its recipient)
    kReasoning,  // an analysis message's body, to its <|end|>
    kStart,      // <|start|> next
    kAssistant,  // the literal "assistant", then <|channel|>
    kJson,       // after <|constrain|>: the literal "json", then <|message|>
    kArguments,  // the call's JSON object, then <|call|>
    kDone,       // the call is written
    kRefused,    // a token the layout refuses
  };
  // Where the answer stands: the phase, and in a literal or the arguments the segment's
  // tokens and text so far.
  struct Position {
    Phase phase = Phase::kChannel;
    std::vector<int32_t> segment;
    std::string text;
    int32_t tool = -1;  // kJson and kArguments: the tool called
    // The budget: tokens counted before the call, the index of the first one forced (-1:
    // none yet), whether this header may only be a call's (the budget was spent before it
    // began), and the reasoning's unfinished character.
    int64_t counted = 0;
    int64_t forced_from = -1;
    bool calls_only = false;
    PartialCharacter partial;
  };

  void Step(Position& position, int32_t token) const;
  // Starts `phase` (a new segment).
  void Enter(Position& position, Phase phase) const;
  // In a reasoning message whose budget is spent: decides, before its next token, whether
  // the forced tokens begin there.
  void Settle(Position& position) const;
  bool Spent(const Position& position) const { return budget_ >= 0 && position.counted >= budget_; }
  // In the reasoning, the token forced next, or -1.
  int32_t ForcedInReasoning(const Position& position) const;
  // The index of the whole header literal `text` is (0: analysis; 1 + t: tool t), or -1.
  int32_t WholeHeader(const std::string& text) const;
  // A fresh constraint for `position`'s segment, before its first token.
  std::unique_ptr<TokenConstraint> SegmentConstraint(const Position& position) const;
  // The constraint of `position`'s segment with its tokens: the committed one's where the
  // position is the committed segment's (`pending`: its tokens past the committed ones),
  // else a fresh one in `fresh`.
  const TokenConstraint* Segment(const Position& position, std::span<const int32_t>& pending,
                                 std::unique_ptr<TokenConstraint>& fresh) const;
  // The one token the layout takes next where that is a control token, or -1.
  int32_t NextControl(const Position& position) const;
  std::shared_ptr<const std::vector<uint8_t>> Only(int32_t token) const;
  // Where `pending` leaves the answer, and whether it stayed in the committed segment.
  Position Locate(std::span<const int32_t> pending, bool& same_segment) const;

  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::vector<int32_t> end_ids_;
  std::shared_ptr<const HarmonyCallSpec> spec_;
  int64_t budget_;
  std::vector<int32_t> budget_end_;
  Position committed_;
  // The committed segment's constraint (a literal's or the arguments'), null elsewhere.
  std::unique_ptr<TokenConstraint> segment_;
  // Any text, and <|end|>: a reasoning message's body.
  std::shared_ptr<const std::vector<uint8_t>> reasoning_;
  std::shared_ptr<const std::vector<uint8_t>> ends_only_;
  mutable std::vector<std::pair<int32_t, std::shared_ptr<const std::vector<uint8_t>>>> only_;
};

std::unique_ptr<TokenConstraint> MakeHarmonyCallConstraint(
    std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids,
    std::shared_ptr<const HarmonyCallSpec> spec, int64_t budget = -1,
    std::vector<int32_t> budget_end = {});

}  // namespace tophat
