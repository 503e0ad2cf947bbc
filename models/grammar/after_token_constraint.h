// A format that holds only after a token: a thinking model's answer is its reasoning, then
// "</think>" (one token in Qwen3's and QwQ's vocabularies), then the answer proper, and a
// JSON, regex, grammar or other format is the answer proper's (as vLLM applies structured
// outputs after a reasoning parser's end). Before the token every token is allowed (the
// end of sequence too: an answer cut off while thinking has no answer proper); from the
// token after it on, the inner constraint decides, as if the answer began there.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "models/grammar/json_constraint.h"

namespace tophat {

class AfterTokenConstraint final : public TokenConstraint {
 public:
  // `vocabulary_size`: the mask's length; `gate`: the token after which `inner` holds.
  AfterTokenConstraint(int32_t vocabulary_size, int32_t gate,
                       std::unique_ptr<TokenConstraint> inner);

  void Commit(std::span<const int32_t> tokens) override;
  std::shared_ptr<const std::vector<uint8_t>> Allowed(
      std::span<const int32_t> pending) const override;
  // The answer proper is complete (never while it has not begun).
  bool complete() const override { return open_ && inner_->complete(); }
  bool cut_by_limit() const override { return inner_->cut_by_limit(); }

 private:
  const int32_t gate_;
  const std::unique_ptr<TokenConstraint> inner_;
  const std::shared_ptr<const std::vector<uint8_t>> everything_;  // all ones
  bool open_ = false;                                             // the gate token was committed
};

}  // namespace tophat
