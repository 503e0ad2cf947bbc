// A format that holds only after a token, and a budget for the tokens before it: a thinking
// model's answer is its reasoning, then "</think>" (one token in Qwen3's, QwQ's and
// DeepSeek-R1's vocabularies), then the answer proper, and a JSON, regex, grammar or other
// format is the answer proper's (as vLLM applies structured outputs after a reasoning
// parser's end). Before the token every token is allowed (the end of sequence too: an answer
// cut off while thinking has no answer proper) until the budget is spent, after which the
// token is the only one (vLLM's thinking_token_budget); from the token after it on, the
// inner format decides, as if the answer began there, or nothing does.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "models/grammar/json_constraint.h"

namespace tophat {

class AfterTokenConstraint final : public TokenConstraint {
 public:
  // `vocabulary_size`: the mask's length; `gate`: the token after which `inner` holds (null:
  // no format, every token allowed); `budget`: the most tokens before the gate (-1: no
  // limit), the gate forced after them.
  AfterTokenConstraint(int32_t vocabulary_size, int32_t gate,
                       std::unique_ptr<TokenConstraint> inner, int64_t budget = -1);

  void Commit(std::span<const int32_t> tokens) override;
  // Null (every token) before the gate while the budget lasts, and after it without a format.
  std::shared_ptr<const std::vector<uint8_t>> Allowed(
      std::span<const int32_t> pending) const override;
  // The answer proper is complete (never while it has not begun, nor without a format).
  bool complete() const override { return open_ && inner_ != nullptr && inner_->complete(); }
  bool cut_by_limit() const override { return inner_ != nullptr && inner_->cut_by_limit(); }

 private:
  const int32_t gate_;
  const std::unique_ptr<TokenConstraint> inner_;
  const int64_t budget_;
  const std::shared_ptr<const std::vector<uint8_t>> gate_only_;  // the gate's 1 alone
  bool open_ = false;                                            // the gate token was committed
  int64_t before_ = 0;                                           // tokens committed before it
};

}  // namespace tophat
