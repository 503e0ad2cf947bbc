#include "models/grammar/after_token_constraint.h"

#include <algorithm>
#include <utility>

namespace tophat {

AfterTokenConstraint::AfterTokenConstraint(int32_t vocabulary_size, int32_t gate,
                                           std::unique_ptr<TokenConstraint> inner)
    : gate_(gate),
      inner_(std::move(inner)),
      everything_(std::make_shared<const std::vector<uint8_t>>(
          static_cast<size_t>(std::max(vocabulary_size, 0)), uint8_t{1})) {}

void AfterTokenConstraint::Commit(std::span<const int32_t> tokens) {
  if (!open_) {
    const auto gate = std::find(tokens.begin(), tokens.end(), gate_);
    if (gate == tokens.end()) return;
    open_ = true;
    tokens = tokens.subspan(static_cast<size_t>(gate - tokens.begin()) + 1);
  }
  if (!tokens.empty()) inner_->Commit(tokens);
}

std::shared_ptr<const std::vector<uint8_t>> AfterTokenConstraint::Allowed(
    std::span<const int32_t> pending) const {
  if (open_) return inner_->Allowed(pending);
  // A draft that holds the gate opens the format for the tokens after it.
  const auto gate = std::find(pending.begin(), pending.end(), gate_);
  if (gate == pending.end()) return everything_;
  return inner_->Allowed(pending.subspan(static_cast<size_t>(gate - pending.begin()) + 1));
}

}  // namespace tophat
