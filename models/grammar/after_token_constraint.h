// A format that holds only after a token, and a budget for the tokens before it: a thinking
// model's answer is its reasoning, then "</think>" (one token in Qwen3's, QwQ's and
// DeepSeek-R1's vocabularies), then the answer proper, and a JSON, regex, grammar or other
// format is the answer proper's (as vLLM applies structured outputs after a reasoning
// parser's end). Before the token every token is allowed (the end of sequence too: an answer
// cut off while thinking has no answer proper) until the budget is spent; then the reasoning
// is ended for the model (vLLM's thinking_token_budget, llama.cpp's reasoning budget): once
// its text is whole characters, an optional message (Qwen's "Considering the limited
// time...") and the token are the only choices, one after the other. From the token after
// it on, the inner format decides, as if the answer began there, or nothing does.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "models/grammar/json_constraint.h"
#include "models/grammar/partial_character.h"

namespace tophat {

class AfterTokenConstraint final : public TokenConstraint {
 public:
  // Tokens the reasoning may go on for past its budget while its text ends inside a
  // character (PartialCharacter): forcing the message there would leave a broken character
  // in the reasoning.
  static constexpr int64_t kCharacterWait = PartialCharacter::kWait;

  // `vocabulary`: the tokens' bytes (for where characters end) and the masks' length; `gate`:
  // the token after which `inner` holds (null: no format, every token allowed); `budget`:
  // the most tokens before the gate (-1: no limit); `budget_end`: the tokens forced before
  // the gate once the budget is spent (none: the gate alone; the gate must not be among
  // them); `gate_prefix`: the tokens that must come right before the gate for it to be one
  // (gpt-oss's "<|channel|>final" before "<|message|>"; its first token not repeated in it,
  // so that a suffix of the tokens is matched without backtracking), forced after
  // `budget_end`.
  AfterTokenConstraint(std::shared_ptr<const TokenVocabulary> vocabulary, int32_t gate,
                       std::unique_ptr<TokenConstraint> inner, int64_t budget = -1,
                       std::vector<int32_t> budget_end = {}, std::vector<int32_t> gate_prefix = {});

  void Commit(std::span<const int32_t> tokens) override;
  // Null (every token) before the gate while the budget lasts, and after it without a format;
  // once it is spent, the next forced token alone.
  std::shared_ptr<const std::vector<uint8_t>> Allowed(
      std::span<const int32_t> pending) const override;
  // The next forced token, without a mask; after the gate, the inner format's.
  std::optional<ForcedDraft> Forced(std::span<const int32_t> pending) const override;
  // The answer proper is complete (never while it has not begun, nor without a format).
  bool complete() const override { return open_ && inner_ != nullptr && inner_->complete(); }
  bool cut_by_limit() const override { return inner_ != nullptr && inner_->cut_by_limit(); }

 private:
  // Where the reasoning stands, the gate not yet among its tokens.
  struct Reasoning {
    int64_t tokens = 0;        // generated so far
    int64_t forced_from = -1;  // the index of the first forced token; -1: not yet
    PartialCharacter partial;  // the reasoning's text, while it ends inside a character
    size_t prefix_matched = 0;  // how many of gate_prefix_ the last tokens are
  };
  // Where `pending` leaves the answer: past the gate (`after_gate`: the pending tokens after
  // it), or before it, with the token forced next (-1: none).
  struct Next {
    bool open = false;
    std::span<const int32_t> after_gate;
    int32_t forced = -1;
  };
  Next Locate(std::span<const int32_t> pending) const;
  // Decides, before the reasoning's next token, whether the forced tokens begin there.
  void Settle(Reasoning& reasoning) const;
  // The reasoning after one more token (not an open gate).
  void Step(Reasoning& reasoning, int32_t token) const;
  // Whether `token` after `reasoning` opens the format.
  bool Opens(const Reasoning& reasoning, int32_t token) const {
    return token == gate_ && reasoning.prefix_matched == gate_prefix_.size();
  }
  // The mask allowing `token` alone.
  std::shared_ptr<const std::vector<uint8_t>> Only(int32_t token) const;

  const std::shared_ptr<const TokenVocabulary> vocabulary_;
  const int32_t gate_;
  const std::unique_ptr<TokenConstraint> inner_;
  const int64_t budget_;
  const std::vector<int32_t> budget_end_;
  const std::vector<int32_t> gate_prefix_;
  const std::vector<int32_t> forced_;  // once the budget is spent: budget_end_, gate_prefix_
  const std::shared_ptr<const std::vector<uint8_t>> gate_only_;  // the gate's 1 alone
  // The last mask made for one of budget_end_ (a verification row asks for the same one
  // again; a new one costs a vocabulary-sized fill).
  mutable int32_t last_only_token_ = -1;
  mutable std::shared_ptr<const std::vector<uint8_t>> last_only_;
  bool open_ = false;  // the gate token was committed
  Reasoning committed_;
};

}  // namespace tophat
